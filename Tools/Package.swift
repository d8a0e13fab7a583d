// swift-tools-version: 6.2
import PackageDescription

// SessionFlow's developer tools: the benchmark, the soak, the probe the multi-process tests
// spawn, the libFuzzer targets and the LoopFlow demo. A package of their own, depending on the
// root by path (as swift-nio's Benchmarks/ does), so that a package depending on SessionFlow
// never fetches, pins or builds what only these need (OpenCombine, malloc-interposer).
// Build from the repository root with `--package-path Tools` (scratch path Tools/.build);
// scripts/bench.sh, scripts/fuzz.sh and scripts/test.sh do.
let package = Package(
    name: "SessionFlowTools",
    products: [
        .executable(name: "loopflow-bench", targets: ["LoopFlowBench"]),
        .executable(name: "loopflow-allocs", targets: ["LoopFlowAllocs"]),
        .executable(name: "session-soak", targets: ["SessionSoak"]),
        .executable(name: "session-probe", targets: ["SessionProbe"]),
        .executable(name: "loopflow-demo", targets: ["LoopFlowDemo"]),
        .executable(name: "fleet-sim", targets: ["FleetSim"]),
    ],
    dependencies: [
        // The root package. Named, so that products are found whatever the checkout's folder is called.
        .package(name: "SessionFlow", path: ".."),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-crypto", from: "4.5.2"),
        // Benchmark only: a peer to measure against, and the malloc counter.
        .package(url: "https://github.com/OpenCombine/OpenCombine", from: "0.14.0"),
        .package(url: "https://github.com/ordo-one/malloc-interposer", from: "1.6.1"),
    ],
    targets: [
        // The raw libuv floor the benchmark compares against (C, in the same process).
        .target(
            name: "CBaseline",
            // sessionflow.h only for its types (the library itself is loaded with dlopen): included
            // by its relative path, as SwiftPM takes no header search path outside the package.
            linkerSettings: [.linkedLibrary("uv"), .linkedLibrary("pthread"), .linkedLibrary("dl")]
        ),
        .executableTarget(
            name: "LoopFlowBench",
            dependencies: [
                "CBaseline",
                .product(name: "LoopFlow", package: "SessionFlow"),
                .product(name: "SessionCore", package: "SessionFlow"),
                .product(name: "SessionOAuth", package: "SessionFlow"),
                .product(name: "SessionFileStore", package: "SessionFlow"),
                .product(name: "OpenCombine", package: "OpenCombine"),
                .product(name: "OpenCombineDispatch", package: "OpenCombine"),
                // A bare P-256 signature: the floor of the DPoP proof row.
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        // Counts allocations per update; loopflow-bench runs it with the interposer preloaded.
        .executableTarget(
            name: "LoopFlowAllocs",
            dependencies: [
                "CBaseline",
                .product(name: "LoopFlow", package: "SessionFlow"),
                .product(name: "MallocInterposerSwift", package: "malloc-interposer"),
            ]
        ),
        // The soak: many threads, a flaky authority, the contract checked on every callback.
        .executableTarget(
            name: "SessionSoak",
            dependencies: [
                .product(name: "LoopFlow", package: "SessionFlow"),
                .product(name: "SessionCore", package: "SessionFlow"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // A second process for the multi-process tests (they find it through SESSIONFLOW_PROBE,
        // or at Tools/.build/debug/session-probe).
        .executableTarget(
            name: "SessionProbe",
            dependencies: [
                .product(name: "LoopFlow", package: "SessionFlow"),
                .product(name: "SessionCore", package: "SessionFlow"),
                .product(name: "SessionFileStore", package: "SessionFlow"),
                .product(name: "SessionOAuth", package: "SessionFlow"),
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        // The refresh policy at scale: 100 000 clients in virtual time against one server.
        .executableTarget(
            name: "FleetSim",
            dependencies: [.product(name: "SessionCore", package: "SessionFlow")]
        ),
        // A LoopFlow tour: the flows on their own, without sessions.
        .executableTarget(
            name: "LoopFlowDemo",
            dependencies: [.product(name: "LoopFlow", package: "SessionFlow")]
        ),
    ]
)

// Fuzz targets (libFuzzer; Fuzz/README.md, scripts/fuzz.sh). Each is one file that is not
// main.swift, with `@_cdecl("LLVMFuzzerTestOneInput")` and one global, initialized by
// `replay(...)`: built with `--sanitize=fuzzer` SwiftPM compiles it as a library (the global
// never runs) and libFuzzer's `main` runs it; in a plain build the lone file is the entry point
// and replays the inputs it is given (FuzzReplay). They reach the parsers through `@_spi(Fuzzing)`
// (not public API).
package.products += [
    .executable(name: "fuzz-token-response", targets: ["FuzzTokenResponse"]),
    .executable(name: "fuzz-store-decoder", targets: ["FuzzStoreDecoder"]),
    .executable(name: "fuzz-error-text", targets: ["FuzzErrorText"]),
    .executable(name: "fuzz-loopback-request", targets: ["FuzzLoopbackRequest"]),
]
package.targets += [
    .target(name: "FuzzReplay"),
    .executableTarget(
        name: "FuzzTokenResponse",
        dependencies: [
            .product(name: "SessionOAuth", package: "SessionFlow"),
            .product(name: "SessionCore", package: "SessionFlow"),
            "FuzzReplay",
        ]
    ),
    .executableTarget(
        name: "FuzzErrorText",
        dependencies: [
            .product(name: "SessionOAuth", package: "SessionFlow"),
            .product(name: "SessionCore", package: "SessionFlow"),
            "FuzzReplay",
        ]
    ),
    .executableTarget(
        name: "FuzzLoopbackRequest",
        dependencies: [.product(name: "SessionOAuth", package: "SessionFlow"), "FuzzReplay"]
    ),
    .executableTarget(
        name: "FuzzStoreDecoder",
        dependencies: [
            .product(name: "SessionFileStore", package: "SessionFlow"),
            .product(name: "SessionCore", package: "SessionFlow"),
            .product(name: "Crypto", package: "swift-crypto"),
            "FuzzReplay",
        ]
    ),
]

// The root's strictness (Swift 6 mode, `any` spelled out); warnings are errors where
// scripts/test.sh builds with `-Xswiftc -warnings-as-errors`.
for target in package.targets where target.type != .system {
    var settings = target.swiftSettings ?? []
    settings.append(.swiftLanguageMode(.v6))
    settings.append(.enableUpcomingFeature("ExistentialAny"))
    target.swiftSettings = settings
}
