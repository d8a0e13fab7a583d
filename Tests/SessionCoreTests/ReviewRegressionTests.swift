@_spi(Testing) import LoopFlow
import SessionFlowTestSupport
import Testing

@testable import SessionCore

@Suite("Regressions found in review")
struct ReviewRegressionTests {
    // a 401 on the current token with no refresh token hands the refused token back as success.
    @Test func a401WithoutARefreshTokenNeverHandsBackTheRefusedToken() async throws {
        let h = try await Harness()
        try await h.manager.signIn(SessionTokens(
            accessToken: Sentinel.access(1), refreshToken: nil, expiresIn: .seconds(3600), memberID: "m"))
        try await h.settle()
        var answers: [Result<Secret, SessionError>] = []
        for _ in 0..<3 {
            let r: Result<Secret, SessionError>
            do { r = .success(try await h.manager.handleUnauthorized(token: Sentinel.access(1))) }
            catch { r = .failure(error) }
            answers.append(r)
        }
        // every call "succeeds" with the very token the server just refused
        #expect(answers.allSatisfy { (try? $0.get()) != Sentinel.access(1) }, "\(answers.map { $0.failureCode?.name ?? "success(same token)" })")
    }

    // terminal refresh + re-authentication answering `configuration` → stays LOGGED_IN forever.
    @Test func aReauthenticationConfigurationErrorStillExpiresTheSession() async throws {
        let h = try await Harness()
        h.authority.reauthentication = [.fail(.configuration("invalid_client", "nope"))]
        try await h.signIn(1, lifetime: .seconds(3600), external: "ext-1")
        h.authority.enqueue(.fail(.terminal()))
        try await h.advance(by: .seconds(3300))
        try await h.advance(by: .seconds(600))
        #expect(h.authority.reauthentications == 1)
        #expect(h.manager.state.value == .sessionExpired, "state is \(h.manager.state.value); armed timers \(h.clock.armedTimerCount)")
    }

    // terminal refresh + transient re-authentication failure → the dead refresh token is
    // re-sent on backoff and re-authentication is tried again and again.
    @Test func aTransientReauthenticationFailureIsNotRetriedWithTheDeadToken() async throws {
        let h = try await Harness()
        h.authority.reauthentication = [.fail(.transient("offline")), .fail(.transient("offline")), .fail(.transient("offline"))]
        try await h.signIn(1, lifetime: .seconds(3600), external: "ext-1")
        h.authority.enqueue(.fail(.terminal()), .fail(.terminal()), .fail(.terminal()))
        try await h.advance(by: .seconds(3300))
        try await h.advance(by: .seconds(10))
        #expect(h.authority.refreshCount == 1, "refreshes with the refused token: \(h.authority.refreshRequests.map(\.reason))")
        #expect(h.authority.reauthentications == 1, "re-authentications: \(h.authority.reauthentications)")
    }

    // A refresh that answers just after its timeout is for the current session: if it was
    // dropped, the retry would re-send the refresh token the server already rotated.
    @Test func aSuccessArrivingAfterItsTimeoutIsAdoptedSoTheRotatedTokenIsKept() async throws {
        let h = try await Harness()
        try await h.signIn(1, lifetime: .zero)
        h.authority.enqueue(.hang)
        let caller = Task { try await h.manager.freshAccessToken() }
        #expect(await eventually(timeout: .seconds(10)) { (try? await h.waitingCallers()) == 1 })
        try await h.advance(by: .seconds(30))  // timeout → backoff 1 s
        _ = await caller.result
        let rotated = h.authority.nextGrant()
        h.authority.release(.grant(rotated))     // the server did rotate: answer arrives at 30 s
        try await h.settle()
        // Adopted: stored, and the pending retry is no longer needed
        #expect(h.store.session?.refreshToken == rotated.refreshToken)
        #expect(try await h.manager.freshAccessToken() == rotated.accessToken)
        try await h.advance(by: .seconds(1))
        #expect(h.authority.refreshCount == 1)
        // The next refresh sends the rotated token, never the consumed one
        try await h.advance(by: .seconds(3300))
        #expect(h.authority.refreshCount == 2)
        #expect(h.authority.refreshRequests.last?.refreshToken == rotated.refreshToken)
    }

    // a 5-minute access token (Keycloak's default) is refreshed every minimumInterval forever.
    @Test func aFiveMinuteTokenIsRefreshedAtHalfLifeNotEveryTenSeconds() async throws {
        let h = try await Harness()
        h.authority.defaultLifetime = .seconds(300)
        try await h.signIn(1, lifetime: .seconds(300))
        try await h.advance(by: .seconds(120))
        #expect(h.authority.refreshCount <= 2, "\(h.authority.refreshCount) refreshes in 2 minutes")
    }

    // a waiter failed by logout runs before the state/snapshot say logged out.
    @Test func waitersAbandonedByLogoutSeeTheLoggedOutState() async throws {
        let h = try await Harness()
        try await h.signIn(1, lifetime: .zero)
        h.authority.enqueue(.hang)
        let seen = LockedBox<(SessionError.Code?, Bool, SessionState)?>(nil)
        let manager = h.manager
        try manager.freshAccessToken { result in
            seen.withLockedValue { $0 = (result.failureCode, manager.isLoggedIn(), manager.state.value) }
        }
        #expect(await eventually(timeout: .seconds(10)) { (try? await h.waitingCallers()) == 1 })
        try await h.manager.logout()
        try await h.settle()
        let s = seen.withLockedValue { $0 }
        #expect(s?.0 == .sessionEnded)
        #expect(s?.1 == false && s?.2 == .loggedOut, "waiter saw isLoggedIn=\(String(describing: s?.1)) state=\(String(describing: s?.2))")
    }

    // a logout the store missed is dropped by close(): the next start restores the session.
    @Test func aLogoutTheStoreMissedIsWrittenAtCloseAndNotRestoredNextStart() async throws {
        let store = MemoryCredentialStore()
        do {
            let h = try await Harness(store: store)
            try await h.signIn(1, member: "alice")
            store.failure = StoreError("io error")
            try await h.manager.logout()
            try await h.settle()
            store.failure = nil              // the store is back...
            await h.manager.close()          // ...but close() before the 5 s retry never clears it
            try await h.settle()
        }
        let next = try await Harness(store: store)
        #expect(next.manager.state.value == .loggedOut, "restored \(next.manager.state.value) for \(next.manager.memberID ?? "nil")")
    }
}

final class HeldValidationAuthority: SessionAuthority, @unchecked Sendable {
    let lock = Lock()
    var refreshes = 0
    var heldValidation: AuthorityCompletion<Bool>?
    func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
        lock.withLock { refreshes += 1 }
        completion.fail(AuthorityError(.transient, code: "429", message: "slow down", retryAfter: .seconds(600)))
    }
    var canValidate: Bool { true }
    func validate(accessToken: Secret, completion: AuthorityCompletion<Bool>) {
        lock.withLock { heldValidation = completion }
    }
}

@Suite("Regressions found in review: validation")
struct ReviewValidationRegressionTests {
    @Test func aLateValidationAnswerRespectsAPendingRetryAfter() async throws {
        let clock = ManualClock()
        let loop = try EventLoop(name: "g", clock: .manual(clock))
        defer { _ = try? loop.shutdown() }
        let authority = HeldValidationAuthority()
        var configuration = SessionConfiguration()
        configuration.random = { 0 }
        let manager = try SessionManager(loop: loop, authority: authority, configuration: configuration)
        try await manager.signIn(SessionTokens(accessToken: Sentinel.access(1), refreshToken: Sentinel.refresh(1), expiresIn: .seconds(3600)))
        try manager.resume()
        try await loop.submit {}
        #expect(authority.lock.withLock { authority.heldValidation != nil })
        await clock.advance(by: .seconds(3300))   // proactive refresh → 429, Retry-After 600 s
        try await loop.submit {}
        #expect(authority.lock.withLock { authority.refreshes } == 1)
        authority.lock.withLock { authority.heldValidation }?.succeed(false)   // "inactive"
        for _ in 0..<3 { try await loop.submit {} }
        #expect(authority.lock.withLock { authority.refreshes } == 1, "refreshed again 0 s into a 600 s Retry-After")
    }
}
