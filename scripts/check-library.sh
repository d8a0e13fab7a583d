#!/usr/bin/env bash
# Checks an installed libsessionflow the way a C developer's release checklist would, and
# prints what it measured:
#   bash scripts/check-library.sh LIB [--unstripped FILE] [--header HEADER]
# LIB: the installed library (libsessionflow.so, .so.MAJOR or the real file) or its libdir.
# --unstripped: the linked library before stripping (install.sh's build output), to print
#   its size too. --header: the header the exports must match (default
#   Bindings/include/sessionflow.h).
# Prints: the file and its symlinks, its size stripped, the size of its separate debug
# info (found as gdb finds it: .gnu_debuglink in the library's directory, its .debug/ or
# /usr/lib/debug/…) and, if given, of the unstripped library, the largest sections, the
# SONAME, the NEEDED list, the RUNPATH, the symbols the dynamic symbol table defines.
# Fails (after printing everything) if:
#   - the stripped library is larger than the budget, 20 MiB (20*1024*1024 bytes);
#   - a NEEDED entry is not one of libc, libm, libstdc++, libgcc_s, libuv, libcurl, or the
#     other parts of glibc a link may name (the dynamic loader ld-linux*, libpthread, libdl,
#     librt, libutil: since glibc 2.34 stubs inside libc, still separate names on older
#     systems);
#   - the SONAME is not libsessionflow.so.MAJOR (SF_VERSION_MAJOR of the header), the file
#     is not libsessionflow.so.MAJOR.MINOR.PATCH, or libsessionflow.so.MAJOR beside it is
#     not that file;
#   - the symbols the dynamic symbol table defines (all of them, `nm -D --defined-only`: local
#     and data entries too) are not exactly the functions the header declares, each a global
#     function (nothing missing, nothing extra);
#   - it needs a glibc newer than 2.34 (a GLIBC_ symbol version above GLIBC_2.34);
#   - its debug info names the store's test fault injection (FileIO.injected…: debug builds
#     only);
#   - the library is not stripped (a .symtab or .debug_* section), or it has an RPATH or
#     RUNPATH (a shipped library does not choose where its dependencies come from), or
#     one of its dependencies cannot be found, or it cannot be loaded with every symbol bound.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
budget=$((20 * 1024 * 1024))

lib=
unstripped=
header="$root/Bindings/include/sessionflow.h"
while [ $# -gt 0 ]; do
    case "$1" in
    --unstripped) unstripped=$2; shift 2 ;;
    --header) header=$2; shift 2 ;;
    -*) echo "usage: $0 LIB [--unstripped FILE] [--header HEADER]" >&2; exit 2 ;;
    *) lib=$1; shift ;;
    esac
done
if [ -z "$lib" ]; then
    echo "usage: $0 LIB [--unstripped FILE] [--header HEADER]" >&2
    exit 2
fi
[ -d "$lib" ] && lib="$lib/libsessionflow.so"
if [ ! -e "$lib" ]; then
    echo "check-library: no such library: $lib" >&2
    exit 2
fi

failures=()
fail() { failures+=("$1"); }
size_of() { stat -L -c %s "$1"; }
human() { awk -v b="$1" 'BEGIN { printf "%d bytes (%.1f MiB)", b, b / 1048576 }'; }

macro() { awk -v name="SF_VERSION_$1" '$1 == "#define" && $2 == name { print $3 }' "$header"; }
major=$(macro MAJOR)
version="$major.$(macro MINOR).$(macro PATCH)"
file=$(readlink -f "$lib")
dir=$(dirname "$file")

echo "library:    $file"
for link in "$dir/libsessionflow.so" "$dir/libsessionflow.so.$major"; do
    if [ -L "$link" ]; then echo "            $(basename "$link") -> $(readlink "$link")"; fi
done
[ "$(basename "$file")" = "libsessionflow.so.$version" ] ||
    fail "the file is $(basename "$file"), not libsessionflow.so.$version"
[ "$(readlink -f "$dir/libsessionflow.so.$major" 2>/dev/null)" = "$file" ] ||
    fail "$dir/libsessionflow.so.$major (what programs load) is not $(basename "$file")"

# ---- Size
size=$(size_of "$file")
echo "size:       $(human "$size") stripped; budget $(human "$budget")"
debuglink=$(readelf -p .gnu_debuglink "$file" 2>/dev/null | awk '/\]/ { print $3; exit }')
if [ -n "$debuglink" ]; then
    debugfile=
    for candidate in "$dir/$debuglink" "$dir/.debug/$debuglink" "/usr/lib/debug$dir/$debuglink"; do
        if [ -f "$candidate" ]; then debugfile=$candidate; break; fi
    done
    if [ -n "$debugfile" ]; then
        echo "debug info: $(human "$(size_of "$debugfile")") in $debugfile"
        # Test support stays out of what ships: the fault injection of the store's file I/O
        # (FileIO.injected…) exists in debug builds only. Its symbols would be in the debug info.
        symbols=$(nm "$debugfile" 2>/dev/null || true)
        store=$(grep -c 'SessionFileStore' <<<"$symbols" || true)
        injected=$(grep -cE 'injected(WriteErrors|TemporarySuffixes|ExchangeErrors|PausesAfterOpen|WriteFailuresLeft|DirectorySyncErrors)' <<<"$symbols" || true)
        echo "test hooks: $injected symbols of the fault tables (FileIO.injected…) in the debug info, among $store of SessionFileStore"
        # No symbol table to look in would find nothing whatever the library holds.
        [ "$store" -gt 0 ] || fail "the debug info has no symbols of SessionFileStore: the test-hook check cannot look"
        [ "$injected" -eq 0 ] || fail "the library carries the store's test fault injection (FileIO.injected…): $injected symbols"
    else
        echo "debug info: $debuglink (.gnu_debuglink) not found beside the library"
    fi
else
    echo "debug info: no .gnu_debuglink"
fi
if [ -n "$unstripped" ]; then
    echo "unstripped: $(human "$(size_of "$unstripped")") ($unstripped)"
fi
echo "largest sections:"
readelf -S -W "$file" | sed -n 's/^ *\[ *[0-9]*\] //p' | awk '$2 != "NOBITS" { print $1, $5 }' |
    while read -r name hex; do echo "$((16#$hex)) $name"; done | sort -n -r | head -5 |
    while read -r bytes name; do printf '            %-24s %s\n' "$name" "$(human "$bytes")"; done
if [ "$size" -gt "$budget" ]; then
    fail "stripped size $(human "$size") is over the budget of $(human "$budget")"
fi
if readelf -S -W "$file" | grep -E '\] (\.symtab|\.debug_[a-z_]+) ' >/dev/null; then
    fail "not stripped: it has a .symtab or .debug_* section"
fi

# ---- Dynamic section
dynamic=$(readelf -d "$file")
soname=$(sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p' <<<"$dynamic")
needed=$(sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' <<<"$dynamic")
runpath=$(sed -n 's/.*(\(RPATH\|RUNPATH\)).*\[\(.*\)\]/\1 \2/p' <<<"$dynamic")
echo "SONAME:     ${soname:-(none)}"
echo "NEEDED:     $(echo $needed)"
echo "RUNPATH:    ${runpath:-(none)}"
[ "$soname" = "libsessionflow.so.$major" ] || fail "SONAME is '${soname}', not libsessionflow.so.$major"
allowed='^(libc|libm|libstdc\+\+|libgcc_s|libuv|libcurl|libpthread|libdl|librt|libutil)\.so(\.[0-9]+)*$|^ld-linux[-a-z0-9_.]*\.so\.[0-9]+$'
unexpected=$(grep -vE "$allowed" <<<"$needed" || true)
[ -z "$unexpected" ] || fail "NEEDED outside libc/libm/libstdc++/libgcc_s/libuv/libcurl (and glibc's parts): $(echo $unexpected)"
[ -z "$runpath" ] || fail "it has $runpath"
# The oldest glibc it runs on: the newest GLIBC_ version it needs (link_shims.c keeps it at
# 2.34, the wheel's manylinux tag; an archive linked in — libstdc++.a — could raise it).
glibc=$(objdump -T "$file" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n 1)
echo "glibc:      ${glibc:-?} or later"
[ -n "$glibc" ] && [ "$(printf '%s\n2.34\n' "$glibc" | sort -V | tail -n 1)" = 2.34 ] ||
    fail "it needs glibc $glibc: newer than 2.34"
notfound=$(ldd "$file" | grep 'not found' || true)
[ -z "$notfound" ] || fail "dependencies not found: $(echo $notfound)"
# Loaded for real (every symbol bound now: a reference nothing defines fails here).
if ! loaderror=$(LD_BIND_NOW=1 python3 -c 'import ctypes, sys; ctypes.CDLL(sys.argv[1])' "$file" 2>&1); then
    fail "it cannot be loaded: $(tail -n 1 <<<"$loaderror")"
fi

# ---- Exports
# The whole dynamic symbol table's definitions, whatever their binding: a local or data entry
# there (gold leaves Swift metadata such as $s11SessionCore…N in it) is as much outside the
# header as a global one. Every one must be a global function (T) the header declares.
declared=$(bash "$root/Bindings/header-functions.sh" "$header")
table=$(nm -D --defined-only "$file" | awk '{ sub(/@.*/, "", $3); print $2, $3 }' | sort -k2)
exported=$(awk '{ print $2 }' <<<"$table" | sort -u)
kinds=$(awk '{ print $1 }' <<<"$table" | sort | uniq -c | awk '{ printf "%s%s %s", sep, $1, $2; sep = ", " }')
echo "exported:   $(grep -c . <<<"$exported") symbols defined in the dynamic symbol table ($kinds); the header declares $(grep -c . <<<"$declared") functions"
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
extra=$(comm -13 <(echo "$declared") <(echo "$exported"))
[ -z "$missing" ] || fail "declared in $(basename "$header") but not exported: $(echo $missing)"
if [ -n "$extra" ]; then
    fail "in the dynamic symbol table but not declared in $(basename "$header"): $(grep -c . <<<"$extra") symbols, e.g. $(head -5 <<<"$extra" | tr '\n' ' ')"
fi
not_functions=$(awk '$1 != "T" { print $2 " (" $1 ")" }' <<<"$table")
[ -z "$not_functions" ] || fail "dynamic symbols that are not global functions: $(head -5 <<<"$not_functions" | tr '\n' ' ')"

if [ ${#failures[@]} -gt 0 ]; then
    printf 'FAIL: %s\n' "${failures[@]}" >&2
    exit 1
fi
echo "library checks: all passed"
