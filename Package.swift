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
        .executable(name: "watch-session", targets: ["WatchSession"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-collections", from: "1.6.0"),
        .package(url: "https://github.com/apple/swift-crypto", from: "4.5.2"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
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
        // The version as text, made from the header's SF_VERSION_* macros (the one place it
        // is written); SessionCore's SessionFlowVersion.string.
        .target(
            name: "CSessionFlowVersion",
            cSettings: [.headerSearchPath("../../Bindings/include")]
        ),
        // The session: state machine, manager, token refresh, authority and store seams.
        .target(
            name: "SessionCore",
            dependencies: [
                "LoopFlow",
                "CSessionFlowVersion",
                .product(name: "Logging", package: "swift-log"),
                // P-256 signatures and SHA-256 for DPoP proofs (RFC 9449).
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        // The desktop Secret Service through libsecret, loaded at run time with dlopen (C: its
        // calls take a GHashTable and a SecretSchema): no link-time dependency on libsecret or
        // glib. dlopen is in glibc itself (2.34+).
        .target(name: "CSecretService"),
        // renameat2(RENAME_EXCHANGE) for the store's replace through a spare file.
        .target(name: "CRenameExchange"),
        // The encrypted, atomic, account-keyed file store.
        .target(
            name: "SessionFileStore",
            dependencies: [
                "SessionCore",
                "LoopFlow",
                "CSecretService",
                "CRenameExchange",
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        // libcurl from the system (Debian: libcurl4-openssl-dev), found through pkg-config.
        .systemLibrary(
            name: "CCurl",
            pkgConfig: "libcurl",
            providers: [.apt(["libcurl4-openssl-dev"])]
        ),
        // The HTTP client on the loop: libcurl's multi interface driven by libuv (C: curl's
        // setopt is variadic, which Swift cannot call).
        .target(
            name: "CLoopHTTP",
            dependencies: ["CLibUV", "CCurl"]
        ),
        // The OAuth 2.0 authority (RFC 6749 refresh, 7009 revocation, 7662 introspection),
        // on the loop's HTTP client.
        .target(
            name: "SessionOAuth",
            dependencies: [
                "SessionCore", "LoopFlow", "CLoopHTTP",
                // SHA-256 for the PKCE code challenge (RFC 7636 S256).
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        // The C header, seen from Swift.
        .systemLibrary(name: "CSessionFlow"),
        // sf_strerror / sf_err_name, expanded in C from the header's SF_ERRNO_MAP (the one
        // table of codes, names and texts); linked into libsessionflow.so via SessionFlowC.
        .target(
            name: "SessionFlowErrors",
            cSettings: [.headerSearchPath("../../Bindings/include")]
        ),
        // What the shipped library's link and load need from C: the old hypotf behind
        // --wrap=hypotf (Bindings/install.sh), so that the library runs on glibc 2.34; its
        // relocation tables released once applied (relocation_release.c).
        .target(name: "CLinkShims"),
        // The C ABI: the functions of one area per file (translation only: types, ownership, threads), each checked against the header.
        .target(
            name: "SessionFlowC",
            dependencies: [
                "CSessionFlow",
                "SessionFlowErrors",
                "CLinkShims",
                "CLibUV",
                "LoopFlow",
                "SessionCore",
                "SessionFileStore",
                "SessionOAuth",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The CLI that shows a session live (and plays the demo).
        .executableTarget(
            name: "WatchSession",
            dependencies: [
                "CLibUV", "LoopFlow", "SessionCore", "SessionFileStore", "SessionOAuth",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // What the test targets share: polling, the session harness (not a product: only this
        // package's tests depend on it).
        .target(
            name: "SessionFlowTestSupport",
            dependencies: [
                "LoopFlow",
                "SessionCore",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "InMemoryLogging", package: "swift-log"),
            ],
            path: "Tests/SessionFlowTestSupport"
        ),
        .testTarget(
            name: "LoopFlowTests",
            dependencies: [
                "SessionFlowTestSupport",
                "LoopFlow",
                "CLibUV",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "InMemoryLogging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "SessionOAuthTests",
            dependencies: [
                "SessionFlowTestSupport",
                "SessionOAuth", "SessionFileStore", "SessionCore", "LoopFlow",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "InMemoryLogging", package: "swift-log"),
                .product(name: "Crypto", package: "swift-crypto"),
            ]
        ),
        .testTarget(
            name: "WatchSessionTests",
            dependencies: ["WatchSession", "SessionCore", "SessionFileStore", "SessionFlowTestSupport"]
        ),
        .testTarget(
            name: "SessionFileStoreTests",
            dependencies: ["SessionFileStore", "CSecretService", "SessionCore", "LoopFlow", "CLibUV", "SessionFlowTestSupport"]
        ),
        .testTarget(
            name: "SessionCoreTests",
            dependencies: [
                "SessionFlowTestSupport",
                "SessionCore",
                "LoopFlow",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "InMemoryLogging", package: "swift-log"),
            ]
        ),
    ]
)

// Package-wide strictness: Swift 6 mode and `any` spelled out, for every target.
// Warnings are errors in the test command (scripts/test.sh builds with
// `-Xswiftc -warnings-as-errors`), not here: a setting in the manifest would be forced on every
// package that depends on this one, and a new compiler's new warning would break its build.
// (SwiftPM 6.3 gives that flag to local packages' targets only: remote dependencies such as
// swift-crypto are compiled with -suppress-warnings and without it.)
for target in package.targets where target.type != .system {
    var settings = target.swiftSettings ?? []
    settings.append(.swiftLanguageMode(.v6))
    settings.append(.enableUpcomingFeature("ExistentialAny"))
    target.swiftSettings = settings
}
