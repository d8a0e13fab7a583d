#!/usr/bin/env bash
# Runs the whole test suite, installing what it needs first:
#   1. the Swift tests (swift test), the OAuth ones against a real Authlib server on loopback
#   2. the C suite against libsessionflow.so (gcc -Werror), and both C example hosts
#   3. the Python (ctypes) host's pytest suite
#   4. the installed, self-contained library used through pkg-config
#   5. a 30-second soak (8 threads, a flaky authority, the contract checked on every callback)
#   6. the Swift tests under ThreadSanitizer, the C suite under AddressSanitizer and
#      ThreadSanitizer (each sanitizer with its own scratch path)
#   7. a consumer package that depends on SessionCore only: resolves without the tools'
#      dependencies, and builds
# Warnings are errors for this package's own code here (-Xswiftc -warnings-as-errors), not in
# Package.swift, which would force them on every package that depends on it.
# The benchmark, soak, probe and fuzzers are the tools package Tools/ (scratch path
# Tools/.build; the sanitizer builds have their own).
# Usage: bash scripts/test.sh
source "$(dirname "$0")/setup.sh"

# The C and Python hosts' tools.
command -v gcc >/dev/null 2>&1 || apt_install gcc
command -v g++ >/dev/null 2>&1 || apt_install g++
python3 -m pytest --version >/dev/null 2>&1 || python3 -m pip install --quiet pytest
# The real OAuth 2.0 server the Swift tests start on loopback (Tests/Fixtures/oauth_server.py).
python3 -c "import authlib, flask" >/dev/null 2>&1 || python3 -m pip install --quiet authlib flask

strict=(-Xswiftc -warnings-as-errors)

echo "== swift test"
swift build --build-tests "${strict[@]}"
# The tools (debug): the probe the multi-process tests spawn, the soak, and every other tool
# (so that none rots).
swift build --package-path Tools "${strict[@]}"
export SESSIONFLOW_PROBE="$PWD/Tools/.build/debug/session-probe"
swift test --skip-build

echo "== C suite and examples"
bash Bindings/run-tests.sh plain

echo "== Python host (ctypes)"
SESSIONFLOW_LIB="$PWD/.build/debug/libsessionflow.so" python3 -m pytest -q Bindings/python/tests

echo "== installed library through pkg-config"
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
bash Bindings/install.sh "$prefix"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
if ldd "$prefix/lib/libsessionflow.so" | grep -q libswift; then
    echo "the installed library depends on the Swift runtime: not self-contained" >&2
    exit 1
fi
cc Bindings/examples/owned_host.c $(pkg-config --cflags --libs sessionflow) -o "$prefix/owned_host"
cc -std=gnu11 Bindings/examples/borrowed_host.c $(pkg-config --cflags --libs sessionflow libuv) -o "$prefix/borrowed_host"
"$prefix/owned_host" >/dev/null && "$prefix/borrowed_host" >/dev/null
echo "pkg-config hosts: 2 passed, 0 failed"

echo "== benchmark smoke run (tiny sizes, release; figures not judged, but every one must be measured)"
swift build -c release --package-path Tools --product loopflow-allocs "${strict[@]}"
swift build -c release --package-path Tools --product loopflow-bench "${strict[@]}"
# The C fan-out goes through the libsessionflow.so the C suite used (the debug build).
bench=(Tools/.build/release/loopflow-bench --smoke --sessionflow-lib "$PWD/.build/debug/libsessionflow.so")
"${bench[@]}"
"${bench[@]}" --json | python3 -c '
import json, sys
rows = json.load(sys.stdin)
missing = [row["name"] for row in rows if row["value"] is None]
if missing:
    sys.exit("benchmark rows without a figure: " + ", ".join(missing))
print(f"benchmark json: {len(rows)} rows, every one measured")'

echo "== soak (short: 30 s; the full run is --seconds 600)"
Tools/.build/debug/session-soak --seconds 30

echo "== fuzzing (short)"
bash scripts/fuzz.sh 15

echo "== swift test under ThreadSanitizer"
swift build --build-tests --sanitize=thread --scratch-path .build-tsan
# The probe and the soak under TSan too (the tools package, a scratch path of its own).
swift build --package-path Tools --sanitize=thread --scratch-path .build-tsan-tools --product session-probe
swift build --package-path Tools --sanitize=thread --scratch-path .build-tsan-tools --product session-soak
SESSIONFLOW_PROBE="$PWD/.build-tsan-tools/debug/session-probe" TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    swift test --skip-build --sanitize=thread --scratch-path .build-tsan

echo "== soak under ThreadSanitizer (20 s)"
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" .build-tsan-tools/debug/session-soak --seconds 20

echo "== C suite under AddressSanitizer"
bash Bindings/run-tests.sh asan
echo "== C suite under ThreadSanitizer"
bash Bindings/run-tests.sh tsan

echo "== a package that depends on SessionCore only"
bash scripts/check-consumer.sh

echo "== all test passes finished"
