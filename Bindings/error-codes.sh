#!/usr/bin/env bash
# Checks that every SessionError.Code has a C code. SessionError.Code is a struct of static
# lets (it grows without breaking Swift callers), so Swift cannot make a switch over it
# exhaustive; Sources/SessionFlowC/Errors.swift maps codes through MappedSessionErrorCode, an
# enum whose switch the compiler does check, by the code's name (`MappedSessionErrorCode(
# rawValue: code.name)`). Code's initializer is private, so every code is a `Code("name")`
# in SessionError.swift, however it is declared: this compares those names with the enum's
# cases — a code added to SessionCore and not mapped fails here instead of turning into
# SF_EINVAL — and refuses a Code(...) made from anything but a literal name. Run by
# run-tests.sh; prints the difference and exits 1 on one.
set -euo pipefail
cd "$(dirname "$0")/.."
source=Sources/SessionCore/Manager/SessionError.swift
made=$(grep -oE '(^|[^A-Za-z0-9_.])Code\([^)]*\)' "$source" | sed -E 's/^[^C]*//' | grep -v '^Code(_ name' || true)
if unnamed=$(grep -vE '^Code\("[A-Za-z0-9_]+"\)$' <<<"$made"); then
    echo "SessionError.Code made from something else than a literal name ($source): $unnamed" >&2
    exit 1
fi
codes=$(sed -E 's/^Code\("(.*)"\)$/\1/' <<<"$made" | sort)
mapped=$(awk '
    /^enum MappedSessionErrorCode/ { inside = 1; next }
    inside && /^[[:space:]]*case / { listing = 1 }
    inside && listing {
        if ($0 !~ /^[[:space:]]*(case )?[A-Za-z0-9_, ]+$/) exit
        line = $0; sub(/^[[:space:]]*(case )?/, "", line); gsub(/[, ]+/, "\n", line); print line
    }' Sources/SessionFlowC/Errors.swift | sed '/^$/d' | sort)
if [ -z "$codes" ] || [ "$codes" != "$mapped" ]; then
    echo "SessionError.Code and MappedSessionErrorCode (Sources/SessionFlowC/Errors.swift) differ:" >&2
    diff <(echo "$codes") <(echo "$mapped") >&2 || true
    exit 1
fi
