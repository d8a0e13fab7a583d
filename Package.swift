// swift-tools-version: 6.2
import PackageDescription

let package = Package(
    name: "SessionFlow",
    products: [
        .library(name: "LoopFlow", targets: ["LoopFlow"]),
        .library(name: "SessionCore", targets: ["SessionCore"]),
        .library(name: "SessionFileStore", targets: ["SessionFileStore"]),
        .library(name: "SessionOAuth", targets: ["SessionOAuth"]),
        // libsessionflow.so: the C API of Bindings/include/sessionflow.h.
        .library(name: "sessionflow", type: .dynamic, targets: ["SessionFlowC"]),
        .executable(name: "loopflow-demo", targets: ["LoopFlowDemo"]),
        .executable(name: "loopflow-bench", targets: ["LoopFlowBench"]),
        .executable(name: "loopflow-allocs", targets: ["LoopFlowAllocs"]),
        .executable(name: "session-probe", targets: ["SessionProbe"]),
        .executable(name: "session-soak", targets: ["SessionSoak"]),
        .executable(name: "watch-session", targets: ["WatchSession"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-collections", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-crypto", from: "4.5.2"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        // Benchmark only: a peer to measure against, and the malloc counter.
        .package(url: "https://github.com/OpenCombine/OpenCombine", from: "0.14.0"),
        .package(url: "https://github.com/ordo-one/malloc-interposer", from: "1.6.1"),
    ],
    targets: [
        // libuv from the system (Debian: libuv1-dev), found through pkg-config.
        .systemLibrary(
            name: "CLibUV",
            pkgConfig: "libuv",
            providers: [.apt(["libuv1-dev"])]
        ),
        // The loop host, StateFlow, SharedFlow and FlowSubscription. Knows nothing about sessions.
        .target(
            name: "LoopFlow",
            dependencies: [
                "CLibUV",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "DequeModule", package: "swift-collections"),
            ]
        ),
        // The session: state machine, manager, token refresh, authority and store seams.
        .target(
            name: "SessionCore",
            dependencies: [
                "LoopFlow",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The encrypted, atomic, account-keyed file store.
        .target(
            name: "SessionFileStore",
            dependencies: [
                "SessionCore",
                "LoopFlow",
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        // The OAuth 2.0 authority (RFC 6749 refresh, 7009 revocation, 7662 introspection).
        .target(
            name: "SessionOAuth",
            dependencies: ["SessionCore"]
        ),
        // The C header, seen from Swift.
        .systemLibrary(name: "CSessionFlow"),
        // sf_strerror / sf_err_name, expanded in C from the header's SF_ERRNO_MAP (the one
        // table of codes, names and texts); linked into libsessionflow.so via SessionFlowC.
        .target(
            name: "SessionFlowErrors",
            cSettings: [.headerSearchPath("../../Bindings/include")]
        ),
        // The C ABI: one thin file per area, each function checked against the header.
        .target(
            name: "SessionFlowC",
            dependencies: [
                "CSessionFlow",
                "SessionFlowErrors",
                "CLibUV",
                "LoopFlow",
                "SessionCore",
                "SessionFileStore",
                "SessionOAuth",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "LoopFlowDemo",
            dependencies: ["LoopFlow"]
        ),
        // The CLI that shows a session live (and plays the demo).
        .executableTarget(
            name: "WatchSession",
            dependencies: [
                "LoopFlow", "SessionCore", "SessionFileStore", "SessionOAuth",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        // A second process for the multi-process tests.
        .executableTarget(
            name: "SessionProbe",
            dependencies: [
                "LoopFlow", "SessionCore", "SessionFileStore", "SessionOAuth",
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        // The raw libuv floor the benchmark compares against (C, in the same process).
        .target(
            name: "CBaseline",
            dependencies: ["CLibUV"],
            // sessionflow.h only for its types: the library itself is loaded with dlopen.
            cSettings: [.headerSearchPath("../../Bindings/include")],
            linkerSettings: [.linkedLibrary("uv"), .linkedLibrary("pthread"), .linkedLibrary("dl")]
        ),
        .executableTarget(
            name: "LoopFlowBench",
            dependencies: [
                "LoopFlow", "SessionCore", "CBaseline",
                .product(name: "OpenCombine", package: "OpenCombine"),
                .product(name: "OpenCombineDispatch", package: "OpenCombine"),
            ]
        ),
        // The soak: many threads, a flaky authority, the contract checked on every callback.
        .executableTarget(
            name: "SessionSoak",
            dependencies: ["LoopFlow", "SessionCore", .product(name: "Logging", package: "swift-log")]
        ),
        // Counts allocations per update; loopflow-bench runs it with the interposer preloaded.
        .executableTarget(
            name: "LoopFlowAllocs",
            dependencies: [
                "LoopFlow", "CBaseline",
                .product(name: "MallocInterposerSwift", package: "malloc-interposer"),
            ]
        ),
        .testTarget(
            name: "LoopFlowTests",
            dependencies: [
                "LoopFlow",
                "CLibUV",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "InMemoryLogging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "SessionOAuthTests",
            dependencies: [
                "SessionOAuth", "SessionFileStore", "SessionCore", "LoopFlow",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "InMemoryLogging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "WatchSessionTests",
            dependencies: ["WatchSession", "SessionCore", "SessionFileStore"]
        ),
        .testTarget(
            name: "SessionFileStoreTests",
            dependencies: ["SessionFileStore", "SessionCore", "LoopFlow"]
        ),
        .testTarget(
            name: "SessionCoreTests",
            dependencies: [
                "SessionCore",
                "LoopFlow",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "InMemoryLogging", package: "swift-log"),
            ]
        ),
    ]
)

// Fuzz targets (libFuzzer; Fuzz/README.md, scripts/fuzz.sh). Each is one file that is not
// main.swift, with `@_cdecl("LLVMFuzzerTestOneInput")` and no top-level code: built with
// `--sanitize=fuzzer` SwiftPM compiles it as a library and libFuzzer's `main` runs it; in a
// plain build the lone file is the entry point, so the executable still links (and does
// nothing). No unsafe flags. They get the package-wide strictness below like every target.
package.products += [
    .executable(name: "fuzz-token-response", targets: ["FuzzTokenResponse"]),
    .executable(name: "fuzz-store-decoder", targets: ["FuzzStoreDecoder"]),
]
package.targets += [
    .executableTarget(name: "FuzzTokenResponse", dependencies: ["SessionOAuth", "SessionCore"]),
    .executableTarget(
        name: "FuzzStoreDecoder",
        dependencies: ["SessionFileStore", "SessionCore", .product(name: "Crypto", package: "swift-crypto")]
    ),
]

// Package-wide strictness: Swift 6 mode everywhere, and every warning is an error.
for target in package.targets where target.type != .system {
    var settings = target.swiftSettings ?? []
    settings.append(.swiftLanguageMode(.v6))
    settings.append(.enableUpcomingFeature("ExistentialAny"))
    settings.append(.treatAllWarnings(as: .error))
    target.swiftSettings = settings
}
