#!/usr/bin/env bash
# Builds the benchmark (release) and runs it: SessionFlow against the raw libuv floor and the
# Swift peers, in one run. Arguments go to loopflow-bench (--json, --smoke, --only ...).
# Usage: bash scripts/bench.sh [ARGS...]
source "$(dirname "$0")/setup.sh"
# Build output to stderr: stdout carries only the report (so --json stays parseable).
swift build -c release --product sessionflow >&2
swift build -c release --product loopflow-allocs >&2
swift build -c release --product loopflow-bench >&2
exec .build/release/loopflow-bench "$@"
