#!/usr/bin/env bash
# Runs the C suite (and, plain and installed, the two example hosts) against libsessionflow.
#   bash Bindings/run-tests.sh [plain|installed|asan|tsan]
# plain: gcc -Wall -Wextra -Werror against the debug library, built here.
# installed: the same against the library install.sh installed, found the way a host finds
#   it: pkg-config (set PKG_CONFIG_PATH to $libdir/pkgconfig for a non-system prefix), the
#   installed header, no rpath (run with LD_LIBRARY_PATH=$libdir); the exports must be
#   exactly the header's functions. This is what scripts/test.sh runs.
# asan / tsan: the library built with that sanitizer (its own scratch path) and the suite
# built with the Swift toolchain's clang and the same sanitizer runtime.
set -euo pipefail
mode=${1:-plain}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

case "$mode" in
plain)
    swift build --product sessionflow
    libdir="$root/.build/debug"
    cc=gcc
    sanitize=()
    ;;
installed)
    if ! pkg-config --exists sessionflow; then
        echo "run-tests.sh installed: pkg-config finds no sessionflow (PKG_CONFIG_PATH?)" >&2
        exit 1
    fi
    libdir=$(pkg-config --variable=libdir sessionflow)
    # The suite compiles against the installed header: it must be this tree's.
    cmp Bindings/include/sessionflow.h "$(pkg-config --variable=includedir sessionflow)/sessionflow.h"
    cc=gcc
    sanitize=()
    ;;
asan | tsan)
    flag=$([ "$mode" = asan ] && echo address || echo thread)
    swift build --product sessionflow --sanitize="$flag" --scratch-path ".build-$mode"
    libdir="$root/.build-$mode/debug"
    toolchain="$(dirname "$(readlink -f "$(command -v swift)")")"
    cc="$toolchain/clang"
    sanitize=(-fsanitize="$flag" -g -fno-omit-frame-pointer)
    if [ "$mode" = tsan ]; then
        # The toolchain's TSan runtime intercepts libdispatch: link it and its blocks runtime.
        swiftlib="$toolchain/../lib/swift/linux"
        sanitize+=(-L "$swiftlib" -ldispatch -lBlocksRuntime -Wl,-rpath,"$swiftlib")
    fi
    ;;
*)
    echo "usage: $0 [plain|installed|asan|tsan]" >&2
    exit 2
    ;;
esac

out="$root/.build-c/$mode"
mkdir -p "$out"

# Every function the header declares must be exported by the library (debug and sanitizer
# builds export every public Swift symbol too; the installed library exactly those functions,
# and its dynamic symbol table defines nothing else).
declared=$(bash Bindings/header-functions.sh)
exported=$(nm -D --defined-only --extern-only "$libdir/libsessionflow.so" | awk '{print $3}' | sed 's/@.*//' | sort -u)
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
if [ -n "$missing" ]; then
    echo "declared in sessionflow.h but not exported by libsessionflow.so:" $missing >&2
    exit 1
fi
if [ "$mode" = installed ]; then
    # The whole dynamic symbol table, local and data entries too (scripts/check-library.sh).
    exported=$(nm -D --defined-only "$libdir/libsessionflow.so" | awk '{print $3}' | sed 's/@.*//' | sort -u)
    extra=$(comm -13 <(echo "$declared") <(echo "$exported"))
    if [ -n "$extra" ]; then
        echo "exported by the installed libsessionflow.so but not declared in sessionflow.h:" $extra >&2
        exit 1
    fi
fi

# Every SessionError.Code has a C code of its own (no silent SF_EINVAL).
bash Bindings/error-codes.sh

# The header alone, strictly, in C99, C11 and C++.
for std in c99 c11; do
    $cc -std=$std -Wall -Wextra -Werror -pedantic -fsyntax-only -x c Bindings/include/sessionflow.h
done
g++ -std=c++11 -Wall -Wextra -Werror -pedantic -fsyntax-only -x c++ Bindings/include/sessionflow.h

# How the suite and the examples find the library: the installed one through pkg-config,
# without rpath (LD_LIBRARY_PATH when they run); a build tree's through -L and an rpath.
if [ "$mode" = installed ]; then
    read -r -a link <<<"$(pkg-config --cflags --libs sessionflow libuv)"
    export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
    link=(-I Bindings/include -L "$libdir" -lsessionflow -luv -Wl,-rpath,"$libdir")
fi

$cc -std=gnu11 -Wall -Wextra -Werror "${sanitize[@]}" \
    Bindings/tests/*.c -o "$out/sessionflow-tests" "${link[@]}" -lpthread

# The libcurl example host: the suite runs it against the test server (test_authorize.c).
$cc -std=gnu11 -Wall -Wextra -Werror "${sanitize[@]}" Bindings/examples/curl_client.c \
    -o "$out/curl_client" "${link[@]}" $(pkg-config --libs libcurl) -lpthread
export SF_TEST_CURL_CLIENT="$out/curl_client"

echo "== C suite ($mode)"
case "$mode" in
asan) export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1" ;;
tsan) export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ;;
esac
"$out/sessionflow-tests"

if [ "$mode" = plain ] || [ "$mode" = installed ]; then
    echo "== C examples"
    for example in quickstart owned_host borrowed_host; do
        $cc -std=gnu11 -Wall -Wextra -Werror "Bindings/examples/$example.c" \
            -o "$out/$example" "${link[@]}"
        echo "-- $example"
        "$out/$example"
    done
fi
