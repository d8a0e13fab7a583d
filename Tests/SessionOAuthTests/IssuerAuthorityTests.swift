import Foundation
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import Testing

@testable import SessionOAuth

/// The authority of a host that knows only the issuer: discovery on first use, against the
/// real Authlib server's metadata.
@Suite("Issuer authority: endpoints discovered on first use", .serialized)
struct IssuerAuthorityTests {
    typealias IssuerSession = SessionHarness<IssuerAuthority, MemoryCredentialStore>

    static func session(_ server: OAuthServer, timeout: Duration = .seconds(30)) async throws -> IssuerSession {
        try await IssuerSession(
            loopName: "issuer-test",
            makeAuthority: { loop in
                try IssuerAuthority(
                    issuer: server.base,
                    template: OAuthConfiguration(tokenEndpoint: server.base, clientID: "sessionflow-public"), loop: loop)
            },
            store: MemoryCredentialStore()
        ) { configuration in
            configuration.policy.minimumInterval = .milliseconds(300)
            configuration.policy.timeout = timeout
        }
    }

    @Test func refreshesAndRevokesThroughTheDiscoveredEndpointsDiscoveringOnce() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await Self.session(server)
        try await session.manager.signIn(try await server.signIn())
        #expect(try await server.stats()["metadata_requests"] == 0)  // nothing before it is needed
        let first = try await session.manager.refreshNow()
        let second = try await session.manager.refreshNow()
        #expect(first != second)
        #expect(try await server.me(second) == 200)
        let stats = try await server.stats()
        #expect(stats["metadata_requests"] == 1 && stats["refresh_grants"] == 2)
        try await session.manager.logout()
        // (The revocation is sent by the logout and answered after it returned.)
        #expect(await eventually(timeout: .seconds(10)) { (try? await server.stats())?["revocations"] == 1 })
        await session.stop()
    }

    @Test func aFailingDiscoveryIsTransientAndRetried() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await Self.session(server)
        try await session.manager.signIn(try await server.signIn())
        try await server.fault("status:503", endpoint: "metadata")
        let error = await #expect(throws: SessionError.self) { try await session.manager.refreshNow() }
        #expect(error?.code == .transient)
        #expect(error?.message.contains("HTTP 503") == true)
        #expect(session.manager.state.value == .loggedIn)  // tokens kept
        // The next call discovers again, and refreshes.
        let token = try await session.manager.refreshNow()
        #expect(try await server.me(token) == 200)
        #expect(try await server.stats()["metadata_requests"] == 2)
        await session.stop()
    }

    @Test func aRefreshCancelledWhileDiscoveringSendsNoRefreshToken() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        // The refresh times out (1 s) while the metadata answer is held (until released).
        let session = try await Self.session(server, timeout: .seconds(1))
        let tokens = try await server.signIn()
        try await session.manager.signIn(tokens)
        try await server.fault("hold", endpoint: "metadata")
        let error = await #expect(throws: SessionError.self) { try await session.manager.refreshNow() }
        #expect(error?.code == .transient)
        // The session retries with backoff (a new discovery, answered at once) and refreshes:
        // waited for, not assumed done after a pause.
        func sentWithTheFirstToken() async throws -> Int {
            try await server.requests().filter { $0.form["refresh_token"] == tokens.refreshToken?.reveal() }.count
        }
        let retried = try await eventually(timeout: .seconds(20), every: .milliseconds(20)) {
            // the held discovery, then the retry's
            let discoveries = try await server.stats()["metadata_requests"]
            return try await sentWithTheFirstToken() == 1 && discoveries == 2
        }
        #expect(retried, "no retry refreshed")
        // Then the held discovery ends: the given-up attempt must never send the refresh token
        // now — two requests with one refresh token would be reuse, and the second would expire
        // the session. (A window to look in: a slow machine can only make this pass.)
        #expect(try await server.call("POST", "__release", form: [:]).status == 200)
        try await Task.sleep(for: .milliseconds(1000))
        #expect(try await sentWithTheFirstToken() == 1)
        #expect(session.manager.state.value == .loggedIn)
        await session.stop()
    }

    @Test func anIssuerThatBreaksTheRuleIsRefusedAtOnce() throws {
        let loop = try EventLoop(name: "issuer-rule")
        defer { _ = try? loop.shutdown() }
        let template = OAuthConfiguration(tokenEndpoint: URL(string: "https://a.example/t")!, clientID: "c")
        let error = #expect(throws: OAuthConfigurationError.self) {
            try IssuerAuthority(issuer: URL(string: "http://auth.example.com")!, template: template, loop: loop)
        }
        #expect(error?.field == "issuer")
    }
}
