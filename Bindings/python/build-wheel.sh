#!/usr/bin/env bash
# Builds a wheel of the Python bindings that bundles libsessionflow.so, so that
# `import sessionflow` finds its library without SESSIONFLOW_LIB:
#   bash Bindings/python/build-wheel.sh LIBRARY OUTDIR
# LIBRARY  the library to bundle: e.g. .build/debug/libsessionflow.so, or an installed
#          $libdir/libsessionflow.so.0 (symlinks are followed). Its version (sf_version_string)
#          must be the binding's (the header's SF_VERSION_*: scripts/version.sh).
# OUTDIR   where the wheel is written (created if missing). The wheel's path is printed last.
# The wheel is a platform wheel (py3-none-<platform>, e.g. py3-none-linux_x86_64): it holds a
# native library, for this platform only; the library's own dependencies (libuv, libcurl, and
# for a debug build the Swift runtime) must be on the machine that installs it. The wheel to
# hand to others is scripts/package.sh's: this one repaired by auditwheel into a manylinux
# wheel that bundles libuv and libcurl too.
# Offline: built with the setuptools already installed (pip wheel --no-index
# --no-build-isolation --no-deps); `python3 -m pip install "setuptools>=77"` if missing.
# Nothing is written into the source tree: the package is copied to a staging directory,
# the library put into the copy (sessionflow/_lib/libsessionflow.so), the wheel built there.
set -euo pipefail
if [ $# -ne 2 ]; then
    awk 'NR > 1 { if ($0 !~ /^#/) exit; sub(/^# ?/, ""); print }' "$0" >&2
    exit 2
fi
library=$1
outdir=$2
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}

if [ ! -f "$library" ]; then
    echo "build-wheel.sh: no library at $library" >&2
    exit 1
fi
if ! "$python" -c 'import setuptools, sys
import setuptools.command.bdist_wheel
sys.exit(int(setuptools.__version__.split(".")[0]) < 77)' >/dev/null 2>&1; then
    echo "build-wheel.sh: $python has no setuptools 77 or later (an SPDX license): $python -m pip install \"setuptools>=77\"" >&2
    exit 1
fi

binding=$(bash "$here/../../scripts/version.sh" "$here/../include/sessionflow.h")
found=$("$python" -c 'import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.sf_version_string.restype = ctypes.c_char_p
print(lib.sf_version_string().decode())' "$library") || {
    echo "build-wheel.sh: $library cannot be loaded (see above)" >&2
    exit 1
}
if [ "$found" != "$binding" ]; then
    echo "build-wheel.sh: $library is version $found, the binding is $binding (the header's SF_VERSION_*)" >&2
    exit 1
fi

stage=$(mktemp -d "${TMPDIR:-/tmp}/sessionflow-wheel.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/package" "$stage/include"
cp "$here/pyproject.toml" "$here/setup.py" "$here/README.md" "$here/../../LICENSE" "$stage/package/"
# setup.py takes the version from ../include/sessionflow.h, as in the repository.
cp "$here/../include/sessionflow.h" "$stage/include/"
cp -r "$here/src" "$stage/package/src"
find "$stage/package" \( -name __pycache__ -o -name '*.egg-info' \) -prune -exec rm -rf {} +
rm -rf "$stage/package/src/sessionflow/_lib"
mkdir -p "$stage/package/src/sessionflow/_lib"
cp -L "$library" "$stage/package/src/sessionflow/_lib/libsessionflow.so"
chmod 0755 "$stage/package/src/sessionflow/_lib/libsessionflow.so"

"$python" -m pip wheel --quiet --no-deps --no-build-isolation --no-index --wheel-dir "$stage/dist" "$stage/package" >&2
wheels=("$stage"/dist/sessionflow-*.whl)
if [ ${#wheels[@]} -ne 1 ] || [ ! -f "${wheels[0]}" ]; then
    echo "build-wheel.sh: expected one wheel in $stage/dist, found: ${wheels[*]}" >&2
    exit 1
fi
wheel=${wheels[0]}
case "$wheel" in
*-none-any.whl)
    echo "build-wheel.sh: $wheel is tagged pure (none-any) although it bundles a native library" >&2
    exit 1
    ;;
esac
"$python" -c 'import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for needed in ("sessionflow/_lib/libsessionflow.so", "sessionflow/py.typed", "sessionflow/__init__.py"):
    if needed not in names:
        sys.exit(f"build-wheel.sh: {needed} is missing from {sys.argv[1]}")' "$wheel"
mkdir -p "$outdir"
cp "$wheel" "$outdir/"
echo "$(cd "$outdir" && pwd)/$(basename "$wheel")"
