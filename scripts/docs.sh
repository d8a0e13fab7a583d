#!/usr/bin/env bash
# Builds the DocC documentation of LoopFlow and SessionCore with the toolchain's docc, warnings
# as errors (a broken symbol link or a missing article fails it: the test command runs this so
# that the catalogs cannot rot). Output: .build/docs/LoopFlow.doccarchive and
# .build/docs/SessionCore.doccarchive (open with `docc preview`, or serve a static copy:
# `bash scripts/docs.sh --static` transforms them for static hosting).
# The symbol graphs come from a build of their own (scratch path .build-docs), so the normal
# debug build keeps its flags.
# Usage: bash scripts/docs.sh [--static]
source "$(dirname "$0")/setup.sh"

static=()
case "${1:-}" in
"") ;;
--static) static=(--transform-for-static-hosting) ;;
*)
    echo "usage: bash scripts/docs.sh [--static]" >&2
    exit 64
    ;;
esac

docc=$(command -v docc || true)
if [ -z "$docc" ]; then
    docc="$(dirname "$(readlink -f "$(command -v swift)")")/docc"
fi
# (Kept between runs: a build with nothing to compile writes no graph, and the ones there are
# then still the sources'.)
graphs="$PWD/.build-docs/symbol-graphs"
mkdir -p "$graphs" .build/docs
swift build --scratch-path .build-docs --target SessionCore \
    -Xswiftc -emit-symbol-graph -Xswiftc -emit-symbol-graph-dir -Xswiftc "$graphs" \
    -Xswiftc -symbol-graph-minimum-access-level -Xswiftc public

for module in LoopFlow SessionCore; do
    # Only the module's own graphs (and its extensions of others'), not its dependencies'.
    own="$PWD/.build-docs/graphs-$module"
    rm -rf "$own"
    mkdir -p "$own"
    cp "$graphs/$module.symbols.json" "$own/"
    cp "$graphs/$module"@*.symbols.json "$own/" 2>/dev/null || true
    rm -rf ".build/docs/$module.doccarchive"
    "$docc" convert "Sources/$module/$module.docc" \
        --additional-symbol-graph-dir "$own" \
        --fallback-display-name "$module" \
        --fallback-bundle-identifier "org.sessionflow.$module" \
        --output-path ".build/docs/$module.doccarchive" \
        --warnings-as-errors "${static[@]}"
    echo "docs: .build/docs/$module.doccarchive"
done
