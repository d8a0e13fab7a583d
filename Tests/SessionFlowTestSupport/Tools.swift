import Foundation

/// Why a test could not run what it needs: the test fails with this (it is never skipped).
package struct MissingTool: Error, CustomStringConvertible {
    package let description: String
}

/// The `session-probe` executable the multi-process tests spawn. It is a product of the tools
/// package (Tools/Package.swift), which this package's build does not make: the path is
/// `SESSIONFLOW_PROBE` when set (scripts/test.sh sets it), else the tools package's default
/// debug build, `Tools/.build/debug/session-probe`. Throws, saying how to build it, when there
/// is no executable there.
package func sessionProbeExecutable() throws(MissingTool) -> String {
    let path = ProcessInfo.processInfo.environment["SESSIONFLOW_PROBE"] ?? defaultProbePath
    guard access(path, X_OK) == 0 else {
        throw MissingTool(description: """
            session-probe is missing at \(path): build it with \
            `swift build --package-path Tools --product session-probe` from the repository root \
            (or point SESSIONFLOW_PROBE at one)
            """)
    }
    return path
}

/// `relative` (e.g. "scripts/with-private-keyring.sh") in the repository these tests are in.
public func repositoryPath(_ relative: String) -> String {
    URL(fileURLWithPath: #filePath)  // Tests/SessionFlowTestSupport/Tools.swift
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent(relative).path
}

/// Tools/.build/debug/session-probe beside this package's sources.
private var defaultProbePath: String { repositoryPath("Tools/.build/debug/session-probe") }
