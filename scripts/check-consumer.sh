#!/usr/bin/env bash
# A package a Swift user would write: it depends on this one by path and uses the SessionCore
# product only. Checks that SwiftPM resolves it without the tools' dependencies (OpenCombine,
# malloc-interposer: they belong to Tools/Package.swift), prints what it resolved, and plans its
# build with no flags of ours: SwiftPM loads the whole graph and writes every command of the
# build (swift build --print-manifest-job-graph compiles nothing), and the commands that compile
# SessionFlow's modules carry no -warnings-as-errors (the root forces none on its users). Its
# modules are compiled as a dependency by the tools package (Tools/, also a package that depends
# on this one by path), so compiling them once more here would prove nothing new.
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
echo "== planning its build (no -warnings-as-errors given)"
swift build --print-manifest-job-graph >/dev/null
python3 - .build/debug.yaml <<'PLAN'
import re, sys
manifest = open(sys.argv[1]).read()
modules = ["LoopFlow", "SessionCore"]
for module in modules:
    commands = [line for line in manifest.splitlines() if f'"-module-name","{module}"' in line]
    if not commands:
        sys.exit(f"the consumer's build plan compiles no {module}")
    if any("warnings-as-errors" in command for command in commands):
        sys.exit(f"the consumer's build plan compiles {module} with -warnings-as-errors: the root forces it on its users")
print("consumer plan: " + ", ".join(modules) + " compiled as dependencies, without -warnings-as-errors")
PLAN
echo "consumer check: resolves without OpenCombine or malloc-interposer, and plans its build"
