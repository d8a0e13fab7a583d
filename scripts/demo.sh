#!/usr/bin/env bash
# Runs the demo: watch-session on its embedded demo authority (about a minute).
# Usage: bash scripts/demo.sh [demo options, e.g. --speed 5 or --json] (watch-session demo)
source "$(dirname "$0")/setup.sh"
swift build --product watch-session
exec .build/debug/watch-session demo "$@"
