#!/usr/bin/env bash
# Runs a command beside a Secret Service of its own: a gnome-keyring-daemon with a fresh
# keyring (in HOME_DIR, unlocked with a password on stdin) on a private session bus
# (dbus-run-session) — never the desktop's. The daemon is registered on the bus before the
# command starts and is stopped after it, so nothing outlives the run. Exits with the
# command's status; "FAIL gnome-keyring-daemon never registered" and 1 if the daemon does not
# come up within 20 s. Used by StoreKeyTests (the Secret Service, for real) and by the
# benchmark's Secret Service start-up row.
# Usage: bash scripts/with-private-keyring.sh HOME_DIR COMMAND [ARGS...]
# Needs (Debian): dbus, gnome-keyring, libsecret-1-0.
set -euo pipefail

if [ "${1:-}" = "--inside" ]; then
    shift
    printf pw | gnome-keyring-daemon --unlock --components=secrets --foreground >/dev/null 2>&1 &
    daemon=$!
    tries=0
    until dbus-send --session --print-reply --dest=org.freedesktop.DBus /org/freedesktop/DBus \
        org.freedesktop.DBus.NameHasOwner string:org.freedesktop.secrets 2>/dev/null | grep -q 'boolean true'; do
        tries=$((tries + 1))
        if [ $tries -gt 400 ]; then
            echo "FAIL gnome-keyring-daemon never registered"
            kill "$daemon" 2>/dev/null || true
            exit 1
        fi
        sleep 0.05
    done
    status=0
    "$@" || status=$?
    # The daemon may be gone already (the command's status must come back all the same).
    kill -9 "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
    exit $status
fi

home=${1:?usage: bash scripts/with-private-keyring.sh HOME_DIR COMMAND [ARGS...]}
shift
[ $# -gt 0 ] || { echo "usage: bash scripts/with-private-keyring.sh HOME_DIR COMMAND [ARGS...]" >&2; exit 64; }
mkdir -p -m 0700 "$home"
exec env -u DBUS_SESSION_BUS_ADDRESS -u XDG_RUNTIME_DIR -u DISPLAY -u WAYLAND_DISPLAY \
    HOME="$home" XDG_DATA_HOME="$home/data" \
    dbus-run-session -- bash "$0" --inside "$@"
