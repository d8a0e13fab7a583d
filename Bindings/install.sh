#!/usr/bin/env bash
# Builds a self-contained libsessionflow.so (release, Swift runtime linked in statically)
# and installs it with its header and a pkg-config file:
#   bash Bindings/install.sh [PREFIX]        (default /usr/local)
# Then a host builds with:  cc host.c $(pkg-config --cflags --libs sessionflow)
set -euo pipefail
prefix=${1:-/usr/local}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

swift build -c release --product sessionflow -Xswiftc -static-stdlib --scratch-path .build-release-static
lib=.build-release-static/release/libsessionflow.so

header=Bindings/include/sessionflow.h
version=$(awk '/#define SF_VERSION_(MAJOR|MINOR|PATCH) /{print $3}' "$header" | paste -sd.)

install -d "$prefix/lib" "$prefix/include" "$prefix/lib/pkgconfig"
install -m 0755 "$lib" "$prefix/lib/libsessionflow.so"
install -m 0644 "$header" "$prefix/include/sessionflow.h"
cat >"$prefix/lib/pkgconfig/sessionflow.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: sessionflow
Description: An authenticated session that keeps itself alive, observable from C on a libuv loop
Version: $version
Requires.private: libuv libcurl
Libs: -L\${libdir} -lsessionflow -Wl,-rpath,\${libdir}
Cflags: -I\${includedir}
PC
echo "installed libsessionflow $version into $prefix"
