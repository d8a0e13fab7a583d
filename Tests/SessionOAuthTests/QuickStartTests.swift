import Foundation
import SessionFlowTestSupport
import Synchronization
import Testing

/// The README's quick starts are code that runs: the Swift one (QuickStart.swift) here against
/// the real Authlib server, the C one (Bindings/examples/quickstart.c) in the C suite.
@Suite("The README's quick start", .serialized)
struct QuickStartTests {
    /// The repository's root (this file is Tests/SessionOAuthTests/QuickStartTests.swift).
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    /// The lines of `text` between `// README begin` and `// README end`, unindented, or the
    /// README's fenced block that follows `<!-- quickstart: NAME -->`.
    static func block(in text: String, after marker: String, until end: String) -> [String] {
        let lines = text.components(separatedBy: "\n")
        guard let start = lines.firstIndex(where: { $0.trimmingCharacters(in: .whitespaces) == marker }) else {
            return []
        }
        var body = lines[(start + 1)...].prefix { $0.trimmingCharacters(in: .whitespaces) != end }
        if body.first?.hasPrefix("```") == true { body = body.dropFirst() }
        let indent = body.filter { !$0.isEmpty }.map { $0.prefix { $0 == " " }.count }.min() ?? 0
        return body.map { String($0.dropFirst(min(indent, $0.count))) }
    }

    @Test func theReadmeShowsThisCode() throws {
        let readme = try String(contentsOf: Self.root.appendingPathComponent("README.md"), encoding: .utf8)
        let swift = try String(
            contentsOf: Self.root.appendingPathComponent("Tests/SessionOAuthTests/QuickStart.swift"), encoding: .utf8)
        let c = try String(contentsOf: Self.root.appendingPathComponent("Bindings/examples/quickstart.c"), encoding: .utf8)
        let code = Self.block(in: swift, after: "// README begin", until: "// README end")
        #expect(code.count > 10)
        #expect(Self.block(in: readme, after: "<!-- quickstart: swift -->", until: "```") == code)
        let cFile = Array(c.components(separatedBy: "\n").drop { !$0.hasPrefix("#include") }.dropLast())
        #expect(cFile.count > 15)
        #expect(Self.block(in: readme, after: "<!-- quickstart: c -->", until: "```") == cFile)
    }

    @Test func theSwiftQuickStartSignsInRefreshesAndLogsOutAgainstARealServer() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        try await server.device(["interval": "1", "expires_in": "60"])
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("quickstart-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: directory) }
        let shown = Mutex<[String]>([])
        let run = Task {
            try await quickStart(
                issuer: server.base, clientID: "sessionflow-public", storeDirectory: directory.path, api: server.resourceURL
            ) {
                line in shown.withLock { $0.append(line) }
            }
        }
        var code: String?
        _ = await eventually(timeout: .seconds(30), every: .milliseconds(20)) {
            code = shown.withLock { $0.first { $0.hasPrefix("Open ") } }?.components(separatedBy: " ").last
            return code != nil
        }
        try await server.approve(try #require(code))
        try await run.value
        let lines = shown.withLock { $0 }
        #expect(lines.first == "session: loggedOut")
        #expect(lines.contains("session: loggedIn"))
        #expect(lines.last == "session: loggedOut")
        #expect(lines.contains { $0.hasPrefix("the API answered with ") })
        let stats = try await server.stats()
        #expect(stats["revocations"] == 1)
        #expect(try await server.resourceStats().counts["ok"] == 1)
    }
}
