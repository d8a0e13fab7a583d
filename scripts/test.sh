#!/usr/bin/env bash
# Runs the whole test suite: the Swift tests, then the same tests under ThreadSanitizer.
# Usage: bash scripts/test.sh
source "$(dirname "$0")/setup.sh"

echo "== swift test"
swift build --build-tests
swift test --skip-build

echo "== swift test under ThreadSanitizer"
# Its own scratch path, so it does not overwrite the normal build.
swift build --build-tests --sanitize=thread --scratch-path .build-tsan
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    swift test --skip-build --sanitize=thread --scratch-path .build-tsan

echo "== all test passes finished"
