#!/usr/bin/env bash
# Builds the benchmark (release, tools package Tools/, scratch path Tools/.build) and runs it:
# SessionFlow against the raw libuv floor, the Swift peers and, when `node` is installed (Debian:
# nodejs; not installed here), Node.js's EventEmitter, in one run. Arguments go to loopflow-bench
# (--json, --smoke, --no-peers, --only, --node PATH ...).
# Usage: bash scripts/bench.sh [ARGS...]
#        bash scripts/bench.sh --runs 5 [ARGS...]    the table 5 times: per row the median ratio
#                                                    and how many runs met its target
source "$(dirname "$0")/setup.sh"
# Build output to stderr: stdout carries only the report (so --json stays parseable).
# libsessionflow.so for the C fan-out comes from the root package's release build; the library
# as it is shipped (idle rows of its own) and watch-session for the cli rows (token vs
# --version, stripped size) are what Bindings/install.sh --cli installs.
swift build -c release --product sessionflow >&2
shipped=$(mktemp -d)
trap 'rm -rf "$shipped"' EXIT
bash Bindings/install.sh --cli --prefix "$shipped" >&2
swift build -c release --package-path Tools --product loopflow-allocs >&2
swift build -c release --package-path Tools --product loopflow-bench >&2
# loopflow-bench takes the first --sessionflow-lib (--node-script) it is given: one in ARGS wins.
bench() {
    Tools/.build/release/loopflow-bench "$@" --sessionflow-lib "$PWD/.build/release/libsessionflow.so" \
        --shipped-lib "$shipped/lib/libsessionflow.so" \
        --node-script "$PWD/Tools/node/eventemitter-bench.js" --watch-session "$shipped/bin/watch-session"
}
# --runs N: the whole table N times (JSON each), then per row the median and the runs that met
# the target (scripts/bench-runs.py).
if [ "${1:-}" = "--runs" ]; then
    runs=${2:?usage: bash scripts/bench.sh --runs N [ARGS...]}
    shift 2
    results=$(mktemp -d)
    trap 'rm -rf "$results" "$shipped"' EXIT
    for run in $(seq 1 "$runs"); do
        echo "run $run of $runs…" >&2
        bench --json "$@" >"$results/run-$run.json"
    done
    python3 scripts/bench-runs.py "$results"/run-*.json
    exit 0
fi
bench "$@"
