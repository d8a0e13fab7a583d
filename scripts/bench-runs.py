#!/usr/bin/env python3
"""Aggregates several runs of the benchmark table (loopflow-bench --json, one file per run):
per row, the median value, floor and ratio, and how many runs met the row's target.
Usage: python3 scripts/bench-runs.py RUN1.json RUN2.json ...   (scripts/bench.sh --runs N)"""
import json
import statistics
import sys


def keyed(run):
    """The run's rows by key: an indented row ("  … from C through libsessionflow") is named by
    the row above it that is not, so that the same sub-row of each size stays apart."""
    parent = ""
    for row in run:
        name = row["name"]
        if not name.startswith(" "):
            parent = name
            yield name, row
        else:
            yield parent + "\n" + name, row


def main(paths):
    runs = [list(keyed(json.load(open(path)))) for path in paths]
    names = []
    for run in runs:
        for key, _ in run:
            if key not in names:
                names.append(key)
    width = max(len(name.split("\n")[-1]) for name in names) + 2
    print(f"{len(runs)} runs of the whole table; per row: median value, median floor, median ratio, "
          "runs meeting the target")
    print("measure".ljust(width) + "value".ljust(14) + "floor".ljust(14) + "ratio".ljust(9) + "target")
    missed = 0
    for key in names:
        rows = [row for run in runs for other, row in run if other == key]
        name = key.split("\n")[-1]

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
