#!/usr/bin/env bash
# Builds libsessionflow and runs the C suite against it.
#   bash Bindings/run-tests.sh [plain|asan|tsan]
# plain: gcc -Wall -Wextra -Werror against the debug library.
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
    echo "usage: $0 [plain|asan|tsan]" >&2
    exit 2
    ;;
esac

out="$root/.build-c/$mode"
mkdir -p "$out"

# Every function the header declares must be exported by the library.
exported=$(nm -D --defined-only "$libdir/libsessionflow.so" | awk '{print $3}')
missing=$(grep -oE '\bsf_[a-z0-9_]+[[:space:]]*\(' Bindings/include/sessionflow.h | tr -d '( ' | sort -u |
    while read -r name; do grep -qxF "$name" <<<"$exported" || echo "$name"; done)
if [ -n "$missing" ]; then
    echo "declared in sessionflow.h but not exported by libsessionflow.so: $missing" >&2
    exit 1
fi

# The header alone, strictly, in C99, C11 and C++.
for std in c99 c11; do
    $cc -std=$std -Wall -Wextra -Werror -pedantic -fsyntax-only -x c Bindings/include/sessionflow.h
done
g++ -std=c++11 -Wall -Wextra -Werror -pedantic -fsyntax-only -x c++ Bindings/include/sessionflow.h

$cc -std=gnu11 -Wall -Wextra -Werror "${sanitize[@]}" -I Bindings/include \
    Bindings/tests/*.c -o "$out/sessionflow-tests" \
    -L "$libdir" -lsessionflow -luv -lpthread -Wl,-rpath,"$libdir"

echo "== C suite ($mode)"
case "$mode" in
asan) export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1" ;;
tsan) export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ;;
esac
"$out/sessionflow-tests"

if [ "$mode" = plain ]; then
    echo "== C examples"
    for example in owned_host borrowed_host; do
        $cc -std=gnu11 -Wall -Wextra -Werror -I Bindings/include "Bindings/examples/$example.c" \
            -o "$out/$example" -L "$libdir" -lsessionflow -luv -Wl,-rpath,"$libdir"
        echo "-- $example"
        "$out/$example"
    done
fi
