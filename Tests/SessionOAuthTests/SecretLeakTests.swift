import Foundation
import InMemoryLogging
import Logging
import LoopFlow
import SessionCore
import SessionFileStore
import Testing

@_spi(Fuzzing) @testable import SessionOAuth

/// Secrets (the header's threading rule 7: tokens never in logs or errors): one session through every layer — the real OAuth server, the
/// encrypted file store, refreshes, failures of every kind, a damaged store, expiry and
/// logout — with everything it prints captured at trace level and scanned for every token it
/// ever held. Sentinel tokens where the test chooses them, the server's own where it issues
/// them; both must appear nowhere.
@Suite("Secrets never leak", .serialized)
struct SecretLeakTests {
    static let sentinelAccess = "SENTINEL-ACCESS-5b8e21"
    static let sentinelRefresh = "SENTINEL-REFRESH-c04f77"

    /// Everything printable about `value`: description, debug description, dump (Mirror).
    func printed(_ value: Any) -> String {
        var dumped = ""
        dump(value, to: &dumped)
        return "\(value)\n\(String(reflecting: value))\n\(dumped)"
    }

    @Test func aWholeSessionPrintsNoTokenAnywhere() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("secrets-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = FileCredentialStore(directory: directory)
        let logs = InMemoryLogHandler()
        var handler = logs
        handler.logLevel = .trace
        var configuration = SessionConfiguration()
        configuration.logger = Logger(label: "secrets", factory: { _ in handler })
        configuration.policy.initialBackoff = .milliseconds(100)
        configuration.policy.minimumInterval = .milliseconds(100)
        let loopLogger = Logger(label: "secrets-loop", factory: { _ in handler })
        let loop = try EventLoop(name: "secrets", logger: loopLogger)
        let authority = try OAuthAuthority(server.configuration(introspection: true), loop: loop)
        let made = configuration
        let events = LockedBox<[SessionEvent]>([])
        let (manager, subscription) = try await loop.submit {
            let manager = try SessionManager(loop: loop, authority: authority, store: store, configuration: made)
            let subscription = try manager.events.subscribe(onEvent: { event in events.withLockedValue { $0.append(event) } })
            return (manager, subscription)
        }
        var tokens: [String] = [Self.sentinelAccess, Self.sentinelRefresh]
        var printedValues: [String] = []
        var errors: [String] = []

        // 1. Sentinel tokens the server does not know: the refresh is refused (invalid_grant,
        //    the server's error text echoing nothing), the session expires.
        let sentinel = SessionTokens(
            accessToken: Secret(Self.sentinelAccess), refreshToken: Secret(Self.sentinelRefresh),
            expiresIn: .seconds(3600), memberID: "alice", externalUserID: "ext-alice")
        printedValues.append(printed(sentinel))
        try await manager.signIn(sentinel)
        do { _ = try await manager.refreshNow() } catch { errors.append(printed(error)) }
        #expect(manager.state.value == .sessionExpired)
        printedValues.append(printed(store.read()))

        // 2. Real tokens: sign in, refresh (rotation), failures of every kind, resume.
        let real = try await server.signIn()
        tokens += [real.accessToken.reveal(), real.refreshToken!.reveal()]
        try await manager.signIn(real)
        for fault in ["status:500", "html", "truncated", "missing", "invalid_client", "huge"] {
            try await server.fault(fault)
            do {
                let token = try await manager.refreshNow()
                tokens.append(token.reveal())
            } catch {
                errors.append(printed(error))
            }
            try await Task.sleep(for: .milliseconds(150))
        }
        let fresh = try await manager.refreshNow()
        tokens.append(fresh.reveal())
        if case .present(let stored) = store.read(), let rotated = stored.refreshToken {
            tokens.append(rotated.reveal())
            printedValues.append(printed(rotated))
        }
        try manager.resume()
        try await Task.sleep(for: .milliseconds(300))
        printedValues.append(printed(store.read()))
        printedValues.append(printed(RefreshRequest(refreshToken: fresh, memberID: "alice", reason: .onDemand)))
        printedValues.append(printed(TokenGrant(accessToken: fresh, refreshToken: fresh, expiresIn: .seconds(1))))

        // 3. A server that echoes the refresh token it was sent in its error text.
        let echoed = TokenResponse.error(from: HTTPAnswer(
            status: 400, retryAfter: nil,
            body: Data("{\"error\":\"invalid_grant\",\"error_description\":\"\(real.refreshToken!.reveal()) is dead\"}".utf8),
            redactions: [real.refreshToken!]))
        errors.append(printed(echoed))

        // 4. The store file is damaged under the running session, then the session logs out.
        let bytes = try Data(contentsOf: URL(fileURLWithPath: store.path))
        try Data(bytes.prefix(bytes.count / 2)).write(to: URL(fileURLWithPath: store.path))
        printedValues.append(printed(store.read()))
        try await manager.logout()
        do { _ = try await manager.freshAccessToken() } catch { errors.append(printed(error)) }

        subscription.close()
        await manager.close()
        _ = try loop.shutdown()

        // Everything the session printed, said or threw.
        let everything = logs.entries.map { "\($0.level) \($0.message) \($0.metadata)" }
            + events.withLockedValue { $0 }.map { printed($0) } + errors + printedValues
        #expect(logs.entries.count > 10 && events.withLockedValue { $0.count } > 10, "too little was captured to mean anything")
        for token in Set(tokens) {
            let hits = everything.filter { $0.contains(token) }
            #expect(hits.isEmpty, "a token (\(token.prefix(4))…) appeared in: \(hits.map { String($0.prefix(200)) })")
        }
        // The store: private, and not plaintext (whatever it holds now, and the damaged copy).
        var isDirectory: ObjCBool = false
        #expect(FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory) && isDirectory.boolValue)
        let files = try FileManager.default.contentsOfDirectory(atPath: directory)
        #expect(try FileManager.default.attributesOfItem(atPath: directory)[.posixPermissions] as? Int == 0o700)
        for file in files where !file.hasSuffix(".lock") && !file.hasSuffix(".wlock") {
            let path = directory + "/" + file
            #expect(try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int == 0o600, "\(file)")
            let content = String(decoding: try Data(contentsOf: URL(fileURLWithPath: path)), as: UTF8.self)
            for token in Set(tokens) {
                #expect(!content.contains(token), "\(file) holds a token in plaintext")
            }
        }
    }
}
