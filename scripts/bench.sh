#!/usr/bin/env bash
# Builds the benchmark (release) and runs it: SessionFlow against the raw libuv floor and the
# Swift peers, in one run. Arguments go to loopflow-bench (--json, --smoke, --only ...).
# Usage: bash scripts/bench.sh [ARGS...]
source "$(dirname "$0")/setup.sh"
swift build -c release --product sessionflow
swift build -c release --product loopflow-allocs
swift build -c release --product loopflow-bench
exec .build/release/loopflow-bench "$@"
