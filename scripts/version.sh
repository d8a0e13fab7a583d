#!/usr/bin/env bash
# The project's version, MAJOR.MINOR.PATCH: SF_VERSION_MAJOR/MINOR/PATCH of
# Bindings/include/sessionflow.h, the one place it is written. Everything else derives from it:
# the library's file name and SONAME (Bindings/install.sh), sf_version() and
# SessionFlowVersion.string (compiled from the header's macros), the Python package
# (Bindings/python/setup.py), the Debian packages, the wheel and the archive (scripts/package.sh).
#   bash scripts/version.sh [HEADER]
set -euo pipefail
header=${1:-"$(cd "$(dirname "$0")/.." && pwd)/Bindings/include/sessionflow.h"}
macro() { awk -v name="SF_VERSION_$1" '$1 == "#define" && $2 == name { print $3 }' "$header"; }
version="$(macro MAJOR).$(macro MINOR).$(macro PATCH)"
if ! [[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
    echo "version.sh: cannot read SF_VERSION_MAJOR/MINOR/PATCH from $header (got '$version')" >&2
    exit 1
fi
echo "$version"
