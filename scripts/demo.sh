#!/usr/bin/env bash
# Runs the demo. Usage: bash scripts/demo.sh
source "$(dirname "$0")/setup.sh"
swift build --product loopflow-demo
exec .build/debug/loopflow-demo "$@"
