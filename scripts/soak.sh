#!/usr/bin/env bash
# The soak tier (optional; the whole suite runs a 30-second soak): the soak for SECONDS, then
# the same under ThreadSanitizer (the tools package built with it, a scratch path of its own),
# 8 threads and a flaky authority, the contract checked on every callback.
# Usage: bash scripts/soak.sh [SECONDS]      (default 600; bash scripts/test.sh --soak runs it)
source "$(dirname "$0")/setup.sh"
seconds=${1:-600}
swift build --package-path Tools --product session-soak -Xswiftc -warnings-as-errors
Tools/.build/debug/session-soak --seconds "$seconds"
swift build --package-path Tools --sanitize=thread --scratch-path .build-tsan-tools --product session-soak
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" .build-tsan-tools/debug/session-soak --seconds "$seconds"
