@_spi(Testing) import LoopFlow
import SessionFlowTestSupport
import Testing

@testable import SessionCore

/// `SessionManager.tokenInfo`: the granted scope kept through refreshes (RFC 6749 §6), stored
/// and restored; the expiry on both clocks.
@Suite("Token info")
struct TokenInfoTests {
    /// A wall clock that stands still: the reported wall-clock expiry is exact.
    static let wall: Duration = .seconds(1_700_000_000)
    static let wallMilliseconds: Int64 = 1_700_000_000_000

    static func harness(store: MemoryCredentialStore = MemoryCredentialStore()) async throws -> Harness {
        try await Harness(store: store) { $0.wallClock = { TokenInfoTests.wall } }
    }

    static func signIn(_ h: Harness, scope: String?, lifetime: Duration = .seconds(3600)) async throws {
        try await h.manager.signIn(SessionTokens(
            accessToken: Sentinel.access(1), refreshToken: Sentinel.refresh(1), expiresIn: lifetime,
            memberID: "member-1", scope: scope))
        try await h.settle()
    }

    @Test func nilWithoutAnAccessTokenAndTheDetailsAfterASignIn() async throws {
        let h = try await Self.harness()
        #expect(h.manager.tokenInfo == nil)
        try await Self.signIn(h, scope: "read write")
        #expect(h.manager.tokenInfo == TokenInfo(
            tokenType: "Bearer", scope: "read write", expiresIn: .seconds(3600),
            expiresAtUnixMilliseconds: Self.wallMilliseconds + 3_600_000))
        #expect(h.manager.tokenInfo?.scopes == ["read", "write"])
        try await h.advance(by: .seconds(100))
        #expect(h.manager.tokenInfo?.expiresIn == .seconds(3500))
        #expect(h.manager.tokenInfo?.expiresAtUnixMilliseconds == Self.wallMilliseconds + 3_500_000)
        try await h.manager.logout()
        try await h.settle()
        #expect(h.manager.tokenInfo == nil)
        h.expectNoSecretsInOutput()
    }

    @Test func aSignInWithoutAScopeReportsNone() async throws {
        let h = try await Self.harness()
        try await Self.signIn(h, scope: nil)
        #expect(h.manager.tokenInfo?.scope == nil)
        #expect(h.manager.tokenInfo?.scopes == [])
        #expect(h.store.session?.grantedScope == nil)
    }

    @Test func aRefreshThatSaysReplacesTheScopeOneThatDoesNotKeepsIt() async throws {
        let h = try await Self.harness()
        try await Self.signIn(h, scope: "read write")
        #expect(h.store.session?.grantedScope == "read write")
        // A refresh answer narrowing the scope: reported and stored.
        var narrowed = h.authority.nextGrant()
        narrowed.scope = "read"
        h.authority.enqueue(.grant(narrowed))
        #expect(try await h.manager.refreshNow() == narrowed.accessToken)
        try await h.settle()
        #expect(h.manager.tokenInfo?.scope == "read")
        #expect(h.store.session?.grantedScope == "read")
        // A refresh answer without scope: the scope granted before stays (RFC 6749 §6).
        let silent = h.authority.nextGrant(lifetime: .seconds(600))
        #expect(silent.scope == nil)
        h.authority.enqueue(.grant(silent))
        #expect(try await h.manager.refreshNow() == silent.accessToken)
        try await h.settle()
        #expect(h.manager.tokenInfo?.scope == "read")
        #expect(h.manager.tokenInfo?.expiresIn == .seconds(600))
        #expect(h.manager.tokenInfo?.expiresAtUnixMilliseconds == Self.wallMilliseconds + 600_000)
        #expect(h.store.session?.grantedScope == "read")
        h.expectNoSecretsInOutput()
    }

    @Test func theStoredScopeIsRestored() async throws {
        let stored = StoredSession(
            accessToken: Sentinel.access(9), refreshToken: Sentinel.refresh(9),
            accessTokenExpiresAt: Self.wall + .seconds(1200), memberID: "m", grantedScope: "profile email")
        let h = try await Self.harness(store: MemoryCredentialStore(stored))
        try await h.settle()
        #expect(h.manager.tokenInfo == TokenInfo(
            tokenType: "Bearer", scope: "profile email", expiresIn: .seconds(1200),
            expiresAtUnixMilliseconds: Self.wallMilliseconds + 1_200_000))
    }

    @Test func anExpiredTokenReportsNegativeTimeLeft() async throws {
        let h = try await Self.harness()
        try await Self.signIn(h, scope: "read", lifetime: .seconds(60))
        try await h.loop.submit { h.manager.engine.cancelProactiveRefreshForTesting() }
        try await h.advance(by: .seconds(90))
        let info = try #require(h.manager.tokenInfo)
        #expect(info.expiresIn == .seconds(-30))
        #expect(info.expiresAtUnixMilliseconds == Self.wallMilliseconds - 30_000)
        #expect(info.scope == "read")
    }

    @Test func millisecondsRoundTowardNegativeInfinity() {
        #expect(TokenInfo.milliseconds(.milliseconds(1500)) == 1500)
        #expect(TokenInfo.milliseconds(.microseconds(1999)) == 1)
        #expect(TokenInfo.milliseconds(.microseconds(-1)) == -1)
        #expect(TokenInfo.milliseconds(.seconds(-30)) == -30_000)
    }
}
