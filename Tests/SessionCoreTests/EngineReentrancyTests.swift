import LoopFlow
import SessionFlowTestSupport
import Testing

@testable import SessionCore

/// What a waiter sees and may do when its answer runs: waiters are user code run inline on
/// the loop thread (a C host's token callback), so they may read the session or call back
/// into it synchronously.
@Suite("Engine: waiters that look and act")
struct EngineReentrancyTests {
    /// Signed in with a token now within its refresh margin, the proactive refresh skipped.
    private func dueSession() async throws -> Harness {
        let h = try await Harness()
        try await h.signIn(1, lifetime: .seconds(120), member: "member-old")
        try await h.loop.submit { h.manager.engine.cancelProactiveRefreshForTesting() }
        try await h.advance(by: .seconds(70))
        return h
    }

    @Test func aWaiterSeesTheMemberAndExpiryItsAnswerSpeaksOf() async throws {
        let h = try await dueSession()
        var grant = h.authority.nextGrant(lifetime: .seconds(3600))
        grant.memberID = "member-new"
        h.authority.enqueue(.grant(grant))
        let seen = LockedBox<(member: String?, expiresIn: Duration?, nextRefreshIn: Duration?)?>(nil)
        let manager = h.manager
        // When a refresh is due and a waiter reads the session inside its answer,
        try manager.freshAccessToken { _ in
            let timing = manager.timing
            seen.withLockedValue { $0 = (manager.memberID, timing.expiresIn, timing.nextRefreshIn) }
        }
        try await h.settle()
        // then it sees the refreshed session, not the one before it.
        let observed = try #require(seen.withLockedValue { $0 })
        #expect(observed.member == "member-new")
        #expect(observed.expiresIn == .seconds(3600))
        #expect(observed.nextRefreshIn == .seconds(3300))
    }

    @Test func aWaiterSeesTheBackoffItsFailureScheduled() async throws {
        let h = try await dueSession()
        h.authority.enqueue(.fail(.transient("HTTP 503")))
        let seen = LockedBox<Duration?>(nil)
        let manager = h.manager
        try manager.freshAccessToken { _ in seen.withLockedValue { $0 = manager.timing.nextRefreshIn } }
        try await h.settle()
        #expect(seen.withLockedValue { $0 } == .seconds(1))
    }

    @Test(arguments: ["success", "transient", "terminal"])
    func aWaiterThatLogsOutInlineLeavesNoTimerAndALoggedOutSession(outcome: String) async throws {
        let h = try await dueSession()
        switch outcome {
        case "success": h.authority.enqueue(.grant(h.authority.nextGrant()))
        case "transient": h.authority.enqueue(.fail(.transient("HTTP 503")))
        default: h.authority.enqueue(.fail(.terminal()))
        }
        let manager = h.manager
        let loggedOutInline = LockedBox<Bool>(false)
        // Given a waiter that logs out synchronously from inside its answer (as a C host may),
        try manager.freshAccessToken { _ in
            if (try? manager.logoutAndWait()) != nil { loggedOutInline.withLockedValue { $0 = true } }
        }
        try await h.settle()
        // then nothing of the refresh lingers: no timer, no attempt, the state is what the
        // waiter made it (or the expiry the terminal answer made first).
        let (timers, waiting) = try await h.loop.submit { (manager.engine.timers.count, manager.engine.waitingCallers) }
        #expect(timers == 0)
        #expect(waiting == 0)
        if outcome == "terminal" {
            // Expired before the waiter ran: its logout (EXPIRED → OUT) is legal too.
            #expect(loggedOutInline.withLockedValue { $0 })
        }
        #expect(h.manager.state.value == .loggedOut)
        #expect(!h.manager.isLoggedIn())
        #expect(h.store.session == nil)
        // Time moving on starts nothing.
        try await h.advance(by: .seconds(7200))
        #expect(h.authority.refreshCount == 1)
    }

    /// Issue 17, point 3: waiters of one refresh were answered one after another with the
    /// token the refresh brought, even after an earlier waiter had logged out inline.
    @Test(arguments: ["logout", "shutdown"])
    func afterAnEarlierWaiterEndsTheSessionNoLaterWaiterGetsAToken(action: String) async throws {
        let h = try await dueSession()
        h.authority.enqueue(.grant(h.authority.nextGrant()))
        let manager = h.manager
        let answers = LockedBox<[Result<Secret, SessionError>]>([])
        // Given three callers waiting for one refresh, the first of which ends the session
        // from inside its answer (as a C host's token callback may),
        try manager.freshAccessToken { result in
            answers.withLockedValue { $0.append(result) }
            if action == "logout" { _ = try? manager.logoutAndWait() } else { manager.engine.close() }
        }
        for _ in 0..<2 {
            try manager.freshAccessToken { result in answers.withLockedValue { $0.append(result) } }
        }
        try await h.settle()
        let seen = answers.withLockedValue { $0 }
        try #require(seen.count == 3)
        // then the first got the token, and the others an error, not the token of a session
        // that no longer exists.
        #expect((try? seen[0].get()) != nil)
        for later in seen.dropFirst() {
            #expect(throws: SessionError.self) { try later.get() }
        }
        if action == "logout" { #expect(h.manager.state.value == .loggedOut) }
    }

    @Test func aManualStartStartsFromWhatTheStoreHoldsThenNotWhatItHeldAtCreation() async throws {
        let store = MemoryCredentialStore(StoredSession(
            accessToken: Sentinel.access(1), refreshToken: Sentinel.refresh(1),
            accessTokenExpiresAt: SessionConfiguration.realtime() + .seconds(3600), memberID: "m"))
        let h = try await Harness(store: store) { $0.startsAutomatically = false }
        #expect(h.manager.state.value == .loggedIn)
        // Another process logs out before this one starts.
        try store.clear()
        try h.manager.start()
        try await h.settle()
        #expect(h.manager.state.value == .loggedOut)
        #expect(h.recordedEvents == [.initialSession(.loggedOut)])
        #expect(!h.manager.isLoggedIn())
    }

    /// The store could not be read at creation, and can by the manual start: the start's own
    /// read answers the first read. (It stayed "awaiting" for good: the status said available,
    /// yet a sign-in was refused as if the store could not be read.)
    @Test func aManualStartAfterAnUnreadableCreationReadTakesTheStartsRead() async throws {
        let store = MemoryCredentialStore()
        store.failure = StoreError("locked for now")
        let h = try await Harness(store: store) { $0.startsAutomatically = false }
        store.failure = nil
        try h.manager.start()
        try await h.settle()
        #expect(h.manager.storeStatus.value == .available)
        try await h.manager.signIn(SessionTokens(
            accessToken: Sentinel.access(2), refreshToken: Sentinel.refresh(2), expiresIn: .seconds(3600), memberID: "m"))
        #expect(h.manager.state.value == .loggedIn)
    }

    @Test func aManualStartOnAShutDownLoopIsRefusedAtCreation() async throws {
        let loop = try EventLoop(name: "shut-down")
        try loop.shutdown()
        var configuration = SessionConfiguration()
        configuration.startsAutomatically = false
        #expect(throws: SessionError.self) {
            _ = try SessionManager(loop: loop, authority: ScriptedAuthority(), configuration: configuration)
        }
    }
}
