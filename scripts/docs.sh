#!/usr/bin/env bash
# Builds the DocC documentation of LoopFlow and SessionCore with the toolchain's docc, warnings
# as errors (a broken symbol link or a missing article fails it: the test command runs this so
# that the catalogs cannot rot). Output: .build/docs/LoopFlow.doccarchive and
# .build/docs/SessionCore.doccarchive (open with `docc preview`, or serve a static copy:
# `bash scripts/docs.sh --static` transforms them for static hosting).
# The symbol graphs are extracted (swift-symbolgraph-extract, public symbols) from the modules of
# the normal debug build, with the test command's flags: after the test command, nothing is
# compiled again (a build with symbol-graph flags of its own would compile everything once more).
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
swift build --target SessionCore -Xswiftc -warnings-as-errors
bin=$(swift build --show-bin-path)
graphs="$PWD/.build/docs/symbol-graphs"
rm -rf "$graphs"
mkdir -p "$graphs"
extract=(-target "$(uname -m)-unknown-linux-gnu" -I "$bin/Modules" -minimum-access-level public
    -output-dir "$graphs")
# The C modules the Swift ones import: SwiftPM's generated module maps and the package's own.
for map in "$bin"/*.build/module.modulemap Sources/*/module.modulemap; do
    [ -f "$map" ] && extract+=(-Xcc -fmodule-map-file="$PWD/${map#"$PWD"/}")
done
for include in Sources/*/include; do extract+=(-Xcc -I"$PWD/$include"); done
extractor=$(dirname "$(readlink -f "$(command -v swift)")")/swift-symbolgraph-extract
for module in LoopFlow SessionCore; do
    "$extractor" -module-name "$module" "${extract[@]}"
done

for module in LoopFlow SessionCore; do
    # Only the module's own graphs (and its extensions of others'), not its dependencies'.
    own="$PWD/.build/docs/graphs-$module"
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
