# Sourced by the other scripts: installs what the build needs on a fresh Debian machine
# with the Swift toolchain. Idempotent, and quick when everything is already there.
set -euo pipefail

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_updated=0
apt_install() {
    if [ "$apt_updated" -eq 0 ]; then
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        apt_updated=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# libuv (the loop), pkg-config (how SwiftPM finds it), and libcurl's development files
# (the OAuth client is libcurl driven by the loop: Sources/CLoopHTTP).
if ! command -v pkg-config >/dev/null 2>&1 || ! pkg-config --exists libuv || ! pkg-config --exists libcurl; then
    echo "setup: installing libuv1-dev, libcurl4-openssl-dev and pkg-config" >&2
    apt_install libuv1-dev libcurl4-openssl-dev pkg-config
fi

cd "$(dirname "${BASH_SOURCE[0]}")/.."
