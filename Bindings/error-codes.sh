#!/usr/bin/env bash
# Checks that every SessionError.Code has a C code. SessionError.Code is a struct of static
# lets (it grows without breaking Swift callers), so Swift cannot make a switch over it
# exhaustive; Sources/SessionFlowC/Errors.swift maps codes through MappedSessionErrorCode, an
# enum whose switch the compiler does check, by the code's name (`MappedSessionErrorCode(
# rawValue: code.name)`). Code's initializer is private, so every code is a static member of
# Code's body in SessionError.swift, made from a literal name, however it is spelled: this
# compares those names with the enum's cases — a code added to SessionCore and not mapped
# fails here instead of turning into SF_EINVAL — and refuses a code made from anything but
# one literal name. Run by run-tests.sh; prints the difference and exits 1 on one.
set -euo pipefail
cd "$(dirname "$0")/.."
source=Sources/SessionCore/Manager/SessionError.swift
# Every static let/var of the Code struct's body, comments dropped: each must be made from one
# literal name (Code("x"), Code.init("x"), .init("x"), Self("x")...). No extension of Code may
# add codes elsewhere (this check would not see them).
codes=$(python3 - "$source" <<'PY'
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
if re.search(r"extension\s+(SessionError\.)?Code\b", text):
    sys.exit("an extension of SessionError.Code: codes must be declared in its body")
start = re.search(r"struct Code\b[^{]*\{", text)
if not start:
    sys.exit("no `struct Code` in " + sys.argv[1])
depth, index = 1, start.end()
while depth:
    depth += {"{": 1, "}": -1}.get(text[index], 0)
    index += 1
body = "\n".join(line.split("//", 1)[0] for line in text[start.end():index - 1].splitlines())
declarations = re.split(r"(?=\bstatic\s+(?:let|var)\b)", body)[1:]
names = []
for declaration in declarations:
    literals = re.findall(r'"([A-Za-z0-9_]+)"', declaration)
    if len(literals) != 1 or not re.search(r"\b(Code|Self|init)\b", declaration):
        sys.exit("a code not made from one literal name: " + " ".join(declaration.split())[:120])
    names.append(literals[0])
print("\n".join(sorted(names)))
PY
) || { echo "Bindings/error-codes.sh: $source" >&2; exit 1; }
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
