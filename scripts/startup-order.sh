#!/usr/bin/env bash
# Regenerates Bindings/startup-order.txt: the functions of the code pages a C host touches from
# sf_runtime_create through a sign-in and a few seconds idle, for the linker to put together
# (Bindings/install.sh passes it to lld as --symbol-ordering-file).
#
# Why: the kernel maps 16 neighbours of every code page a process faults in (fault-around), so
# start-up code scattered over the library's 11 MiB of text made an idle C host carry ~6 MiB
# of it; packed, the same path touches fewer 64 KiB windows (issue 32: idle RSS, the shipped
# library 11.3 -> 9.5 MiB). Only where code is in sections of its own can it move: ours, the
# Swift runtime's and BoringSSL's functions (-ffunction-sections); the static standard
# library's and Foundation's objects come whole.
#
# Rounds (default 3): install with the current list, trace (Tools/CHost/trace_pages.c drives
# the library, Tools/CHost/trace_audit.c as LD_AUDIT makes its code mapping inaccessible from
# the moment it is mapped and records each first touch), add the functions on the touched
# pages; names the library no longer defines leave the list. A stale list only packs less
# well. Run it after a change that moves start-up work; commit the file.
# Usage: bash scripts/startup-order.sh [ROUNDS]      (needs cc, python3, nm, libcurl)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
order=Bindings/startup-order.txt
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc=${CC:-cc}
"$cc" -O1 -Wall -Wextra -Werror -IBindings/include -o "$work/trace_pages" Tools/CHost/trace_pages.c -ldl
# The tracing itself: an LD_AUDIT library, so that the load-time code (the library's
# initializers) is recorded too.
"$cc" -O1 -Wall -Wextra -Werror -shared -fPIC -o "$work/trace_audit.so" Tools/CHost/trace_audit.c
[ -f "$order" ] || : >"$order"
for round in $(seq 1 "$rounds"); do
    bash Bindings/install.sh --prefix "$work/prefix" >&2
    # The unstripped library install.sh linked (same code, with its symbol table).
    library=.build-release-static/release/libsessionflow.so
    rm -rf "$work/store"
    SWIFT_BACKTRACE=enable=no SF_TRACE_OUTPUT="$work/pages.txt" LD_AUDIT="$work/trace_audit.so" \
        "$work/trace_pages" "$library" "$work/store" 5
    python3 - "$library" "$work/pages.txt" "$order" <<'PY'
import subprocess, sys
library, pages_file, order_file = sys.argv[1:4]
pages = {int(line, 16) for line in open(pages_file)}
symbols = subprocess.run(["nm", "-S", "--defined-only", library], capture_output=True, text=True, check=True).stdout
code = {fields[3].strip() for fields in (line.split(None, 3) for line in symbols.splitlines())
        if len(fields) == 4 and fields[2] in ("t", "T")}
# Names the library no longer defines (renamed, removed) leave the list.
kept = [line.strip() for line in open(order_file) if line.strip()]
listed = [name for name in kept if name in code]
seen = set(listed)
found = []
for line in symbols.splitlines():
    fields = line.split(None, 3)
    if len(fields) != 4 or fields[2] not in ("t", "T"):
        continue
    address, size, name = int(fields[0], 16), int(fields[1], 16), fields[3].strip()
    if size == 0 or name in seen:
        continue
    first, last = address >> 12 << 12, (address + size - 1) >> 12 << 12
    if any(page in pages for page in range(first, last + 4096, 4096)):
        found.append((address, name))
        seen.add(name)
with open(order_file, "w") as out:
    for name in listed + [name for _, name in sorted(found)]:
        out.write(name + "\n")
windows = {page >> 16 for page in pages}
print(f"startup-order: {len(pages)} code pages touched, in {len(windows)} 64 KiB windows; "
      f"{len(listed)} functions listed, {len(found)} added, {len(kept) - len(listed)} no longer defined")
PY
done
