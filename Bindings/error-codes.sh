#!/usr/bin/env bash
# Checks that every SessionError.Code has a C code. SessionError.Code is a struct of static
# lets (it grows without breaking Swift callers), so Swift cannot make a switch over it
# exhaustive; Sources/SessionFlowC/Errors.swift maps codes through MappedSessionErrorCode, an
# enum whose switch the compiler does check. This compares the enum's cases with the static
# lets by name: a code added to SessionCore and not mapped fails here instead of turning
# into SF_EINVAL. Run by run-tests.sh; prints the difference and exits 1 on one.
set -euo pipefail
cd "$(dirname "$0")/.."
codes=$(sed -nE 's/^[[:space:]]*public static let ([A-Za-z0-9_]+) = Code\(.*/\1/p' \
    Sources/SessionCore/Manager/SessionError.swift | sort)
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
