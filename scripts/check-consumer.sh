#!/usr/bin/env bash
# A package a Swift user would write: it depends on this one by path and uses the SessionCore
# product only. Checks that SwiftPM resolves it without the tools' dependencies (OpenCombine,
# malloc-interposer: they belong to Tools/Package.swift), prints what it resolved, and builds
# it with no flags of ours (the root forces no warnings-as-errors on its users).
# Usage: bash scripts/check-consumer.sh
source "$(dirname "$0")/setup.sh"
root=$PWD

consumer=$(mktemp -d)
trap 'rm -rf "$consumer"' EXIT
mkdir -p "$consumer/Sources/Consumer"
cat >"$consumer/Package.swift" <<MANIFEST
// swift-tools-version: 6.2
import PackageDescription

let package = Package(
    name: "Consumer",
    dependencies: [.package(name: "SessionFlow", path: "$root")],
    targets: [
        .executableTarget(
            name: "Consumer",
            dependencies: [.product(name: "SessionCore", package: "SessionFlow")]
        ),
    ]
)
MANIFEST
cat >"$consumer/Sources/Consumer/main.swift" <<'SOURCE'
import SessionCore

print("consumer: \(SessionState.loggedOut)")
SOURCE

cd "$consumer"
swift package resolve
echo "== dependencies of a package that uses SessionCore only"
swift package show-dependencies --format flatlist | tee dependencies.txt
forbidden=$( (cat dependencies.txt; cat Package.resolved 2>/dev/null) | grep -io 'opencombine\|malloc-interposer' | sort -uf || true)
if [ -n "$forbidden" ]; then
    echo "a consumer of SessionCore resolves the tools' dependencies: $(echo "$forbidden" | tr '\n' ' ')" >&2
    exit 1
fi
echo "== building it (no -warnings-as-errors given)"
swift build 2>&1 | tail -3
.build/debug/Consumer
echo "consumer check: resolves without OpenCombine or malloc-interposer, and builds"
