#!/usr/bin/env bash
# Builds libsessionflow as a C library is shipped, and installs it with its header, its
# pkg-config file and its debug info:
#   bash Bindings/install.sh [PREFIX]                       (default /usr/local)
#   bash Bindings/install.sh [--prefix DIR] [--libdir DIR] [--includedir DIR]
#                            [--pkgconfigdir DIR] [--debugdir DIR]
#   DESTDIR=/tmp/stage bash Bindings/install.sh --prefix /usr --libdir /usr/lib/x86_64-linux-gnu
# PREFIX, LIBDIR, INCLUDEDIR, PKGCONFIGDIR, DEBUGDIR and DESTDIR may also come from the
# environment (options win). A relative --libdir / --includedir is taken under the prefix.
# DESTDIR (staging, for packagers) is put in front of every path written to, never into the
# installed files: sessionflow.pc names the final prefix.
#
# The library: release build, the Swift runtime (and Foundation, swift-crypto's BoringSSL…)
# linked in statically; the linker exports exactly the functions sessionflow.h declares (a
# version script generated from the header by header-functions.sh, `local: *` for the rest;
# the link fails if the header declares a function that is not implemented); SONAME
# libsessionflow.so.MAJOR; no RUNPATH; stripped, with the debug info kept beside it.
# Installed:
#   $libdir/libsessionflow.so.MAJOR.MINOR.PATCH       the library (SF_VERSION_* of the header)
#   $libdir/libsessionflow.so.MAJOR -> …MAJOR.MINOR.PATCH   what programs load (their NEEDED)
#   $libdir/libsessionflow.so -> libsessionflow.so.MAJOR     what `-lsessionflow` finds
#   $debugdir/libsessionflow.so.MAJOR.MINOR.PATCH.debug      (default $libdir/.debug, where
#                                    gdb looks for the library's .gnu_debuglink by itself)
#   $includedir/sessionflow.h, $pkgconfigdir/sessionflow.pc (default $libdir/pkgconfig)
# A host then builds with:  cc host.c $(pkg-config --cflags --libs sessionflow)
# and, for a prefix the dynamic loader does not search, runs with LD_LIBRARY_PATH=$libdir
# (or links with its own -Wl,-rpath,$libdir): the .pc file sets no rpath.
set -euo pipefail

usage() { # the comment on top, up to its first empty line
    awk 'NR > 1 { if ($0 == "#") exit; sub(/^# ?/, ""); print }' "$0" >&2
    exit "${1:-2}"
}

prefix=${PREFIX:-}
libdir=${LIBDIR:-}
includedir=${INCLUDEDIR:-}
pkgconfigdir=${PKGCONFIGDIR:-}
debugdir=${DEBUGDIR:-}
destdir=${DESTDIR:-}
positional=()
while [ $# -gt 0 ]; do
    case "$1" in
    --prefix | --libdir | --includedir | --pkgconfigdir | --debugdir)
        [ $# -ge 2 ] || usage
        declare "${1#--}=$2"
        shift 2
        ;;
    --prefix=* | --libdir=* | --includedir=* | --pkgconfigdir=* | --debugdir=*)
        option=${1%%=*}
        declare "${option#--}=${1#*=}"
        shift
        ;;
    -h | --help) usage 0 ;;
    -*)
        echo "install.sh: unknown option $1" >&2
        usage
        ;;
    *)
        positional+=("$1")
        shift
        ;;
    esac
done
[ ${#positional[@]} -le 1 ] || usage
# The positional PREFIX of the first version of this script.
[ ${#positional[@]} -eq 0 ] || prefix=${positional[0]}
prefix=${prefix:-/usr/local}
case "$prefix" in
/*) ;;
*) prefix="$(pwd)/$prefix" ;;
esac
prefix=${prefix%/}
case "$destdir" in
"" | /*) ;;
*) destdir="$(pwd)/$destdir" ;;
esac
under_prefix() { # a relative directory is taken under the prefix
    case "$1" in
    /*) echo "${1%/}" ;;
    *) echo "$prefix/${1%/}" ;;
    esac
}
libdir=$(under_prefix "${libdir:-lib}")
includedir=$(under_prefix "${includedir:-include}")
pkgconfigdir=$(under_prefix "${pkgconfigdir:-$libdir/pkgconfig}")
debugdir=$(under_prefix "${debugdir:-$libdir/.debug}")

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
header=Bindings/include/sessionflow.h
macro() { awk -v name="SF_VERSION_$1" '$1 == "#define" && $2 == name { print $3 }' "$header"; }
major=$(macro MAJOR)
minor=$(macro MINOR)
patch=$(macro PATCH)
version="$major.$minor.$patch"
if ! [[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
    echo "install.sh: cannot read SF_VERSION_MAJOR/MINOR/PATCH from $header (got '$version')" >&2
    exit 1
fi
soname="libsessionflow.so.$major"
realname="libsessionflow.so.$version"

# The exports: generated from the header on every run. Its name carries a hash of its
# content, so that a change of the header changes the linker flags and SwiftPM relinks.
scratch=.build-release-static
mkdir -p "$scratch"
script=$(bash Bindings/header-functions.sh --version-script)
map="$root/$scratch/sessionflow-$(sha256sum <<<"$script" | cut -c1-16).map"
[ -f "$map" ] || printf '%s\n' "$script" >"$map"
find "$scratch" -maxdepth 1 -name 'sessionflow-*.map' ! -name "$(basename "$map")" -delete

# --disable-local-rpath: no RUNPATH $ORIGIN (SwiftPM's default) in a library for others.
# --no-undefined-version: a name in the version script that nothing defines fails the link.
# (--gc-sections is SwiftPM's default for release builds.)
swift build -c release --product sessionflow --scratch-path "$scratch" \
    -Xswiftc -static-stdlib --disable-local-rpath \
    -Xlinker --version-script="$map" -Xlinker --no-undefined-version \
    -Xlinker -soname -Xlinker "$soname"
built="$scratch/release/libsessionflow.so"

# Stripped library + debug info in a file of its own, linked by .gnu_debuglink (name + CRC).
objcopy=${OBJCOPY:-objcopy}
stage=$(mktemp -d "$root/$scratch/install.XXXXXX")
trap 'rm -rf "$stage"' EXIT
"$objcopy" --only-keep-debug "$built" "$stage/$realname.debug"
"$objcopy" --strip-unneeded "$built" "$stage/$realname"
"$objcopy" --add-gnu-debuglink="$stage/$realname.debug" "$stage/$realname"

install -d "$destdir$libdir" "$destdir$includedir" "$destdir$pkgconfigdir" "$destdir$debugdir"
install -m 0755 "$stage/$realname" "$destdir$libdir/$realname"
ln -sfn "$realname" "$destdir$libdir/$soname"
ln -sfn "$soname" "$destdir$libdir/libsessionflow.so"
install -m 0644 "$stage/$realname.debug" "$destdir$debugdir/$realname.debug"
install -m 0644 "$header" "$destdir$includedir/sessionflow.h"

# Paths under the prefix are written relative to it (the usual form: relocatable by
# pkg-config --define-prefix); others as they are.
pc_path() {
    case "$1" in
    "$prefix") echo "\${prefix}" ;;
    "$prefix"/*) echo "\${prefix}${1#"$prefix"}" ;;
    *) echo "$1" ;;
    esac
}
cat >"$stage/sessionflow.pc" <<PC
prefix=$prefix
libdir=$(pc_path "$libdir")
includedir=$(pc_path "$includedir")

Name: sessionflow
Description: An authenticated session that keeps itself alive, observable from C on a libuv loop
Version: $version
Requires.private: libuv libcurl
Libs: -L\${libdir} -lsessionflow
Cflags: -I\${includedir}
PC
install -m 0644 "$stage/sessionflow.pc" "$destdir$pkgconfigdir/sessionflow.pc"
echo "installed libsessionflow $version (SONAME $soname) into ${destdir}$libdir, header into ${destdir}$includedir"
