@_spi(Testing) import LoopFlow
import SessionFlowTestSupport
import Testing

@testable import SessionCore

@Suite("SessionManager: sign in, logout, reconfigure")
struct SessionManagerTests {
    @Test func signInStoresTheSessionAndAnnouncesIt() async throws {
        let h = try await Harness()
        try await h.settle()
        #expect(h.recordedEvents == [.initialSession(.loggedOut)])
        #expect(!h.manager.isLoggedIn())
        try await h.signIn(1, member: "m-42")
        #expect(h.manager.state.value == .loggedIn)
        #expect(h.recordedStates == [.loggedOut, .loggedIn])
        #expect(h.recordedEvents.last == .signedIn(memberID: "m-42"))
        #expect(h.manager.isLoggedIn())
        #expect(h.manager.memberID == "m-42")
        #expect(h.store.session?.accessToken == Sentinel.access(1))
        #expect(h.store.session?.refreshToken == Sentinel.refresh(1))
        #expect(h.store.session?.memberID == "m-42")
        h.expectNoSecretsInOutput()
    }

    @Test func signingInTwiceIsAnIllegalTransitionThatChangesNothing() async throws {
        let h = try await Harness()
        try await h.signIn(1, member: "first")
        let error = await #expect(throws: SessionError.self) {
            try await h.manager.signIn(SessionTokens(
                accessToken: Sentinel.access(2), refreshToken: Sentinel.refresh(2), expiresIn: .seconds(60), memberID: "second"))
        }
        #expect(error?.code == .illegalTransition)
        #expect(h.manager.memberID == "first")
        #expect(h.store.session?.accessToken == Sentinel.access(1))
        #expect(!"\(error!)".contains(Sentinel.access))
    }

    @Test func aBlankAccessTokenIsRefused() async throws {
        let h = try await Harness()
        let error = await #expect(throws: SessionError.self) {
            try await h.manager.signIn(SessionTokens(accessToken: Secret("  "), refreshToken: nil, expiresIn: .seconds(60)))
        }
        #expect(error?.code == .invalidArgument)
        #expect(h.manager.state.value == .loggedOut)
    }

    @Test func logoutClearsTheStoreFirstThenStopsTimersThenRevokes() async throws {
        let h = try await Harness()
        h.authority.storeToCheckAtRevocation = h.store
        try await h.signIn(1)
        #expect(h.clock.armedTimerCount == 1)  // the proactive refresh
        try await h.manager.logout()
        try await h.settle()
        #expect(h.manager.state.value == .loggedOut)
        #expect(h.store.session == nil)
        #expect(h.manager.memberID == nil)
        #expect(!h.manager.isLoggedIn())
        #expect(h.clock.armedTimerCount == 0)
        #expect(h.recordedEvents.last == .signedOut(reason: .userRequested))
        // Revoked with the refresh token, after the store was already empty
        #expect(h.authority.revocations.count == 1)
        #expect(h.authority.revocations.first?.refresh == Sentinel.refresh(1))
        #expect(h.authority.revocations.first?.storeWasEmpty == true)
        // Nothing refreshes afterwards
        try await h.advance(by: .seconds(7200))
        #expect(h.authority.refreshCount == 0)
        h.expectNoSecretsInOutput()
    }

    @Test func anOfflineLogoutStillLogsOutLocally() async throws {
        let h = try await Harness()
        h.authority.revocationFails = true
        try await h.signIn(1)
        try await h.manager.logout()
        try await h.settle()
        #expect(h.manager.state.value == .loggedOut)
        #expect(h.store.session == nil)
        h.expectNoSecretsInOutput()
    }

    @Test func logoutWhenLoggedOutIsIllegal() async throws {
        let h = try await Harness()
        let error = await #expect(throws: SessionError.self) { try await h.manager.logout() }
        #expect(error?.code == .illegalTransition)
    }

    @Test func reconfigureForgetsTheMemberAfterExpiryOnly() async throws {
        let h = try await Harness()
        try await h.signIn(1, member: "m-1")
        let refused = await #expect(throws: SessionError.self) { try await h.manager.reconfigure() }
        #expect(refused?.code == .illegalTransition)
        h.authority.enqueue(.fail(.terminal()))
        try await h.advance(by: .seconds(3300))
        #expect(h.manager.state.value == .sessionExpired)
        #expect(h.manager.memberID == "m-1")
        try await h.manager.reconfigure()
        try await h.settle()
        #expect(h.manager.state.value == .loggedOut)
        #expect(h.manager.memberID == nil)
        #expect(h.store.session == nil)
        #expect(h.recordedEvents.last == .signedOut(reason: .reconfigured))
    }

    @Test func aListenerMayAskForATokenFromInsideItsCallback() async throws {
        let h = try await Harness()
        let answers = LockedBox<[Result<Secret, SessionError>]>([])
        let manager = h.manager
        let subscription = try manager.subscribeToSessionState(onState: { state in
            guard state == .loggedIn else { return }
            try? manager.freshAccessToken { result in answers.withLockedValue { $0.append(result) } }
        })
        try await h.signIn(1)
        try await h.settle()
        #expect(answers.withLockedValue { $0.count } == 1)
        #expect(try answers.withLockedValue { $0.first }?.get() == Sentinel.access(1))
        subscription.close()
    }

    @Test func callsAfterTheLoopIsGoneFailCleanlyAndWaitersAreAnswered() async throws {
        let h = try await Harness()
        try await h.signIn(1, lifetime: .zero)
        h.authority.enqueue(.hang)
        let waiter = Task { try await h.manager.freshAccessToken() }
        #expect(await eventually(timeout: .seconds(10)) { (try? await h.waitingCallers()) == 1 })
        try h.loop.shutdown()
        let result = await waiter.result
        #expect(result.failureCode == .shutDown)
        let error = await #expect(throws: SessionError.self) { try await h.manager.logout() }
        #expect(error?.code == .shutDown)
    }
}
