#!/usr/bin/env python3
"""Aggregates several runs of the benchmark table (loopflow-bench --json, one file per run):
per row, the median value, floor and ratio, and how many runs met the row's target.
Usage: python3 scripts/bench-runs.py RUN1.json RUN2.json ...   (scripts/bench.sh --runs N)"""
import json
import statistics
import sys


def main(paths):
    runs = [json.load(open(path)) for path in paths]
    names = []
    for run in runs:
        for row in run:
            if row["name"] not in names:
                names.append(row["name"])
    width = max(len(name) for name in names) + 2
    print(f"{len(runs)} runs of the whole table; per row: median value, median floor, median ratio, "
          "runs meeting the target")
    print("measure".ljust(width) + "value".ljust(14) + "floor".ljust(14) + "ratio".ljust(9) + "target")
    missed = 0
    for name in names:
        rows = [row for run in runs for row in run if row["name"] == name]

        def middle(key):
            values = [row[key] for row in rows if isinstance(row.get(key), (int, float))]
            return statistics.median(values) if values else None

        value, floor, ratio = middle("value"), middle("baseline"), middle("ratio")
        unit = rows[0].get("unit", "")
        target = rows[0].get("target")
        verdict = ""
        if target:
            met = sum(1 for row in rows if row.get("met") is True)
            verdict = f"{target}: {met}/{len(runs)}"
            if met < len(runs):
                missed += 1
                verdict += " MISSED in some runs"

        def show(number):
            return "n/a" if number is None else (f"{number:.1f}" if abs(number) < 100 else f"{number:.0f}") + (
                f" {unit}" if unit else "")

        print(name.ljust(width) + show(value).ljust(14) + show(floor).ljust(14)
              + ("—" if ratio is None else f"{ratio:.2f}×").ljust(9) + verdict)
    print(f"rows with a target missed in at least one run: {missed}")


if __name__ == "__main__":
    main(sys.argv[1:])
