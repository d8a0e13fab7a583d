@_spi(Testing) import LoopFlow
import SessionFlowTestSupport
import Testing

@testable import SessionCore

@Suite("Generations, 401s and resume")
struct GenerationAndUnauthorizedTests {
    @Test func logoutDuringARefreshDiscardsItsResult() async throws {
        let h = try await Harness()
        try await h.signIn(1, lifetime: .zero)
        h.authority.enqueue(.hang)
        let caller = Task { try await h.manager.freshAccessToken() }
        #expect(await eventually(timeout: .seconds(10)) { (try? await h.waitingCallers()) == 1 })
        try await h.manager.logout()
        #expect(await caller.result.failureCode == .sessionEnded)
        let writesAfterLogout = h.store.writes
        let eventsAfterLogout = h.recordedEvents.count
        // When the refresh answers after the logout
        h.authority.release(.grant(h.authority.nextGrant()))
        try await h.settle()
        // Then nothing is re-saved, no event, still logged out
        #expect(h.store.session == nil)
        #expect(h.store.writes == writesAfterLogout)
        #expect(h.recordedEvents.count == eventsAfterLogout)
        #expect(h.manager.state.value == .loggedOut)
        #expect(h.clock.armedTimerCount == 0)
    }

    @Test func aLateInvalidGrantForThePreviousUserLeavesTheNewSessionUntouched() async throws {
        let h = try await Harness()
        try await h.signIn(1, lifetime: .zero, member: "alice")
        h.authority.enqueue(.hang)
        try h.manager.resume()  // due: refresh for alice goes out and hangs
        #expect(await eventually(timeout: .seconds(10)) { h.authority.heldCount == 1 })
        try await h.manager.logout()
        try await h.signIn(2, lifetime: .seconds(3600), member: "bob")
        h.authority.release(.fail(.terminal()))
        try await h.settle()
        #expect(h.manager.state.value == .loggedIn)
        #expect(h.manager.memberID == "bob")
        #expect(h.store.session?.accessToken == Sentinel.access(2))
        #expect(!h.recordedEvents.contains { if case .sessionExpired = $0 { true } else { false } })
        #expect(try await h.manager.freshAccessToken() == Sentinel.access(2))
    }

    @Test func fiveParallel401sWithTheSameTokenCauseOneRefresh() async throws {
        let h = try await Harness()
        try await h.signIn(1, lifetime: .seconds(3600))
        h.authority.enqueue(.hang)
        let callers = (0..<5).map { _ in Task { try await h.manager.handleUnauthorized(token: Sentinel.access(1)) } }
        #expect(await eventually(timeout: .seconds(10)) { (try? await h.waitingCallers()) == 5 })
        let grant = h.authority.nextGrant()
        h.authority.release(.grant(grant))
        for caller in callers { #expect(try await caller.value == grant.accessToken) }
        #expect(h.authority.refreshCount == 1)
        #expect(h.authority.refreshRequests.first?.reason == .unauthorized)
        // A straggler with the old token gets the new one, no refresh
        #expect(try await h.manager.handleUnauthorized(token: Sentinel.access(1)) == grant.accessToken)
        #expect(h.authority.refreshCount == 1)
    }

    @Test func a401WithAnAlreadyReplacedTokenDoesNotRefresh() async throws {
        let h = try await Harness()
        try await h.signIn(1, lifetime: .seconds(3600))
        let current = try await h.manager.handleUnauthorized(token: Secret("an older token"))
        #expect(current == Sentinel.access(1))
        #expect(h.authority.refreshCount == 0)
    }

    @Test func a401ForATokenFreshFromA401RefreshIsNeverALoop() async throws {
        let h = try await Harness()
        try await h.signIn(1, lifetime: .seconds(3600))
        let fresh = try await h.manager.handleUnauthorized(token: Sentinel.access(1))
        let error = await #expect(throws: SessionError.self) {
            try await h.manager.handleUnauthorized(token: fresh)
        }
        #expect(error?.code == .unauthorized)
        #expect(h.authority.refreshCount == 1)
    }

    @Test func resumeValidatesThroughTheAuthority() async throws {
        let h = try await Harness()
        h.authority.validation = .success(true)
        try await h.signIn(1, lifetime: .seconds(3600))
        try h.manager.resume()
        try await h.settle()
        #expect(h.authority.validations == 1)
        #expect(h.recordedEvents.last == .validated)
        #expect(h.authority.refreshCount == 0)
        // Inactive → refreshed
        h.authority.validation = .success(false)
        try h.manager.resume()
        try await h.settle()
        #expect(h.authority.refreshCount == 1)
        #expect(h.authority.refreshRequests.last?.reason == .resume)
    }

    @Test func resumeIsCoalescedWithARefreshAlreadyDue() async throws {
        let h = try await Harness()
        h.authority.validation = .success(true)
        try await h.signIn(1, lifetime: .zero)  // due at once
        h.authority.enqueue(.hang)
        try h.manager.resume()
        try h.manager.resume()
        try h.manager.resume()
        try await h.settle()
        #expect(h.authority.validations == 0)
        #expect(h.authority.refreshCount == 1)
    }

    @Test func resumeWithoutValidationChecksExpiry() async throws {
        let h = try await Harness()
        try await h.signIn(1, lifetime: .seconds(3600))
        try h.manager.resume()
        try await h.settle()
        #expect(h.recordedEvents.last == .validated)
        #expect(h.authority.refreshCount == 0)
    }
}

@Suite("Start, restore and store")
struct StartAndStoreTests {
    static func stored(expiresInFromNow: Duration, member: String = "m-1") -> StoredSession {
        StoredSession(
            accessToken: Sentinel.access(9), refreshToken: Sentinel.refresh(9),
            accessTokenExpiresAt: SessionConfiguration.realtime() + expiresInFromNow, memberID: member)
    }

    @Test func aStoredSessionIsRestoredLoggedIn() async throws {
        let h = try await Harness(store: MemoryCredentialStore(Self.stored(expiresInFromNow: .seconds(3600))))
        #expect(h.manager.state.value == .loggedIn)
        #expect(h.manager.isLoggedIn())
        #expect(h.manager.memberID == "m-1")
        try await h.settle()
        #expect(h.recordedEvents.first == .initialSession(.loggedIn))
        #expect(h.recordedStates == [.loggedIn])
        #expect(try await h.manager.freshAccessToken() == Sentinel.access(9))
        #expect(h.authority.refreshCount == 0)
        try await h.advance(by: .seconds(3300))
        #expect(h.authority.refreshCount == 1)
    }

    @Test func anExpiredStoredSessionIsRefreshedAtStart() async throws {
        let h = try await Harness(store: MemoryCredentialStore(Self.stored(expiresInFromNow: .seconds(-60))))
        try await h.settle()
        #expect(h.authority.refreshCount == 1)
        #expect(h.authority.refreshRequests.first?.reason == .restore)
        #expect(h.authority.refreshRequests.first?.refreshToken == Sentinel.refresh(9))
        #expect(h.manager.state.value == .loggedIn)
    }

    @Test func aNetworkFailureAtStartNeverLogsAnyoneOut() async throws {
        let authority = ScriptedAuthority()
        authority.enqueue(.fail(.transient("network unreachable")), .fail(.transient("network unreachable")))
        let h = try await Harness(authority: authority, store: MemoryCredentialStore(Self.stored(expiresInFromNow: .seconds(-60))))
        try await h.advance(by: .seconds(5))
        #expect(h.manager.state.value == .loggedIn)
        #expect(h.recordedStates == [.loggedIn])
        #expect(h.authority.refreshCount == 3)  // 0 s, +1 s, +2 s
        // the stored tokens were kept through the failures: every attempt sent them
        #expect(h.authority.refreshRequests.allSatisfy { $0.refreshToken == Sentinel.refresh(9) })
        #expect(h.recordedEvents.filter { if case .tokenRefreshed = $0 { true } else { false } }.count == 1)
    }

    @Test func anExpiredSessionIsRestoredAsExpired() async throws {
        let h = try await Harness(store: MemoryCredentialStore(StoredSession(memberID: "m-3", expired: true)))
        #expect(h.manager.state.value == .sessionExpired)
        #expect(h.manager.memberID == "m-3")
        #expect(!h.manager.isLoggedIn())
    }

    @Test func anUnavailableStoreLogsNoOneOutAndIsReadWhenItComesBack() async throws {
        let store = MemoryCredentialStore(Self.stored(expiresInFromNow: .seconds(3600)))
        store.failure = StoreError("keyring locked")
        let h = try await Harness(store: store)
        try await h.settle()
        #expect(h.manager.state.value == .loggedOut)
        #expect(h.recordedEvents == [.storeError(StoreError("keyring locked"))])
        #expect(store.session != nil)  // nothing was cleared
        try await h.advance(by: .seconds(5))
        #expect(h.manager.state.value == .loggedOut)
        store.failure = nil
        try await h.advance(by: .seconds(5))
        #expect(h.manager.state.value == .loggedIn)
        #expect(h.recordedEvents.last == .initialSession(.loggedIn))
        #expect(h.manager.memberID == "m-1")
    }

    @Test func aFailedWriteKeepsTheSessionAndCatchesUpLater() async throws {
        let h = try await Harness()
        try await h.signIn(1)
        h.store.failure = StoreError("disk full")
        let rotated = h.authority.nextGrant()
        h.authority.enqueue(.grant(rotated))
        try await h.advance(by: .seconds(3300))
        #expect(h.manager.state.value == .loggedIn)
        #expect(h.recordedEvents.contains(.storeError(StoreError("disk full"))))
        #expect(h.store.failure != nil)
        h.store.failure = nil
        try await h.advance(by: .seconds(5))
        #expect(h.store.session?.refreshToken == rotated.refreshToken)
    }

    @Test func aLogoutTheStoreMissedIsCompletedWhenItComesBack() async throws {
        let h = try await Harness()
        try await h.signIn(1)
        h.store.failure = StoreError("io error")
        try await h.manager.logout()
        try await h.settle()
        #expect(h.manager.state.value == .loggedOut)
        h.store.failure = nil
        #expect(h.store.session != nil)
        try await h.advance(by: .seconds(5))
        #expect(h.store.session == nil)
    }
}

@Suite("Secrets")
struct SessionSecretTests {
    @Test func noSentinelTokenReachesAnyLogEventOrError() async throws {
        // A session that goes through everything, with trace logging captured
        let h = try await Harness()
        h.authority.validation = .success(true)
        try await h.signIn(1, lifetime: .seconds(3600), external: "ext")
        h.authority.enqueue(.fail(.transient("reset")), .fail(.configuration("invalid_client", "bad")))
        try await h.advance(by: .seconds(3301))
        var errors: [String] = []
        do { _ = try await h.manager.freshAccessToken() } catch { errors.append("\(error)") }
        do { _ = try await h.manager.handleUnauthorized(token: Sentinel.access(1)) } catch { errors.append("\(error)") }
        try h.manager.resume()
        h.authority.enqueue(.fail(.terminal()))
        try await h.advance(by: .seconds(7200))
        do { _ = try await h.manager.freshAccessToken() } catch { errors.append("\(error)") }
        do { _ = try await h.manager.handleUnauthorized(token: Sentinel.access(1)) } catch { errors.append("\(error)") }
        do {
            try await h.manager.signIn(SessionTokens(
                accessToken: Sentinel.access(5), refreshToken: Sentinel.refresh(5), expiresIn: .seconds(60)))
            try await h.manager.signIn(SessionTokens(
                accessToken: Sentinel.access(6), refreshToken: Sentinel.refresh(6), expiresIn: .seconds(60)))
        } catch { errors.append("\(error)") }
        try await h.manager.logout()
        try await h.settle()
        #expect(errors.count >= 3)
        for text in errors {
            #expect(!text.contains(Sentinel.access) && !text.contains(Sentinel.refresh))
        }
        #expect(!h.logs.entries.isEmpty)
        #expect(h.logs.entries.contains { $0.level == .trace || $0.level == .debug })
        h.expectNoSecretsInOutput()
        // and the output does carry the events, so the scan looked at real text
        #expect(h.output.contains("tokenRefreshed"))
    }
}
