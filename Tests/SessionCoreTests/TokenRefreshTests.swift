@_spi(Testing) import LoopFlow
import SessionFlowTestSupport
import Testing

@testable import SessionCore

@Suite("Token refresh")
struct TokenRefreshTests {
    @Test func fiftyConcurrentCallersOnAnExpiredTokenShareOneRefresh() async throws {
        let h = try await Harness()
        try await h.signIn(1, lifetime: .seconds(3600))
        try await h.loop.submit { h.manager.engine.cancelProactiveRefreshForTesting() }
        try await h.advance(by: .seconds(3601))  // expired, never refreshed
        #expect(h.authority.refreshCount == 0)
        h.authority.enqueue(.hang)
        // When 50 callers ask at once
        let callers = (0..<50).map { _ in Task { try await h.manager.freshAccessToken() } }
        #expect(await eventually(timeout: .seconds(10)) { (try? await h.waitingCallers()) == 50 })
        let grant = h.authority.nextGrant()
        h.authority.release(.grant(grant))
        // Then one refresh served them all, with its result
        for caller in callers {
            #expect(try await caller.value == grant.accessToken)
        }
        #expect(h.authority.refreshCount == 1)
        h.expectNoSecretsInOutput()
    }

    @Test func everyWaiterGetsTheSharedRefreshsError() async throws {
        let h = try await Harness()
        try await h.signIn(1, lifetime: .zero)  // due at once
        h.authority.enqueue(.hang)
        let callers = (0..<5).map { _ in Task { try await h.manager.freshAccessToken() } }
        #expect(await eventually(timeout: .seconds(10)) { (try? await h.waitingCallers()) == 5 })
        h.authority.release(.fail(.transient("503 from upstream", retryAfter: nil)))
        for caller in callers {
            #expect(await caller.result.failureCode == .transient)
        }
        #expect(h.authority.refreshCount == 1)
    }

    @Test func fourFiftyNineBeforeExpiryRefreshesFiveOhOneDoesNot() async throws {
        let h = try await Harness { $0.policy.proactiveJitter = 0 }
        try await h.signIn(1, lifetime: .seconds(3600))
        // 5:01 before expiry: the current token comes back, no refresh
        await h.clock.advance(by: .seconds(3600 - 301))
        let early = try await h.manager.freshAccessToken()
        #expect(early == Sentinel.access(1))
        #expect(h.authority.refreshCount == 0)
        // 4:59 before expiry: the proactive timer (at 5:00) has refreshed; an on-demand call
        // at 4:59 of a token that never got its proactive refresh does too
        let h2 = try await Harness { $0.policy.proactiveJitter = 0 }
        try await h2.signIn(1, lifetime: .seconds(3600))
        try await h2.loop.submit { h2.manager.engine.cancelProactiveRefreshForTesting() }
        await h2.clock.advance(by: .seconds(3600 - 299))
        let due = try await h2.manager.freshAccessToken()
        #expect(h2.authority.refreshCount == 1)
        #expect(h2.authority.refreshRequests.first?.reason == .onDemand)
        #expect(due != Sentinel.access(1))
    }

    @Test func theProactiveTimerFiresAtExpiryMinusMarginAndFollowsEachNewLifetime() async throws {
        let h = try await Harness()
        try await h.signIn(1, lifetime: .seconds(3600))
        try await h.advance(by: .seconds(3299))
        #expect(h.authority.refreshCount == 0)
        h.authority.enqueue(.grant(h.authority.nextGrant(lifetime: .seconds(1800))))
        try await h.advance(by: .seconds(1))
        #expect(h.authority.refreshCount == 1)
        #expect(h.authority.refreshTimes == [.seconds(3300)])
        #expect(h.authority.refreshRequests.first?.reason == .proactive)
        // Rescheduled from the new expires_in: 1800 − 300 after the refresh
        try await h.advance(by: .seconds(1499))
        #expect(h.authority.refreshCount == 1)
        try await h.advance(by: .seconds(1))
        #expect(h.authority.refreshTimes == [.seconds(3300), .seconds(4800)])
        #expect(h.recordedEvents.contains(.tokenRefreshed(expiresIn: .seconds(1800), reason: .proactive)))
    }

    @Test func proactiveJitterOnlyMakesTheRefreshEarlierWithinItsBound() async throws {
        let h = try await Harness { $0.random = { 0.999_999 } }
        try await h.signIn(1, lifetime: .seconds(3600))
        // draw 0.999999 of a window of 46% of the 3300 s to expiry − 5 min (1518 s) before it:
        // lead 1518 × (1 − √0.000001) = 1516.482 s, due at 1783.518 s, not 3300 s
        try await h.advance(by: .seconds(1783))
        #expect(h.authority.refreshCount == 0)
        try await h.advance(by: .seconds(1))
        #expect(h.authority.refreshCount == 1)
        #expect(h.authority.refreshTimes.first! < .seconds(3300))
    }

    @Test func theProactiveDrawLandsWhereThePolicySays() async throws {
        // u = 0.75: half the 1518 s window before expiry − 5 min, exactly 2541 s
        let h = try await Harness { $0.random = { 0.75 } }
        try await h.signIn(1, lifetime: .seconds(3600))
        try await h.advance(by: .seconds(2540))
        #expect(h.authority.refreshCount == 0)
        try await h.advance(by: .seconds(1))
        #expect(h.authority.refreshTimes == [.seconds(2541)])
    }

    @Test func aWallClockAnHourFastRefreshesNothingEarly() async throws {
        let h = try await Harness { configuration in
            configuration.wallClock = { SessionConfiguration.realtime() + .seconds(3600) }
        }
        try await h.signIn(1, lifetime: .seconds(3600))
        try await h.advance(by: .seconds(3000))
        let token = try await h.manager.freshAccessToken()
        #expect(token == Sentinel.access(1))
        #expect(h.authority.refreshCount == 0)
    }

    @Test func aWallClockAnHourFastAtStoreAndRestoreRefreshesNothingEarly() async throws {
        // The skew is the same when the expiry was stored and when it is read back
        let fast: @Sendable () -> Duration = { SessionConfiguration.realtime() + .seconds(3600) }
        let stored = StoredSession(
            accessToken: Sentinel.access(9), refreshToken: Sentinel.refresh(9),
            accessTokenExpiresAt: fast() + .seconds(3600), memberID: "m")
        let h = try await Harness(store: MemoryCredentialStore(stored)) { $0.wallClock = fast }
        try await h.advance(by: .seconds(3000))
        #expect(try await h.manager.freshAccessToken() == Sentinel.access(9))
        #expect(h.authority.refreshCount == 0)
        try await h.advance(by: .seconds(300))
        #expect(h.authority.refreshCount == 1)
    }

    @Test func expiresInZeroCannotSpin() async throws {
        let h = try await Harness()
        h.authority.defaultLifetime = .zero
        try await h.signIn(1, lifetime: .zero)
        try await h.advance(by: .seconds(60))
        // immediately, then at most once per minimum interval (10 s)
        #expect((6...7).contains(h.authority.refreshCount))
        for _ in 0..<20 { _ = try await h.manager.freshAccessToken() }
        #expect((6...7).contains(h.authority.refreshCount))
    }

    @Test func transientFailuresBackOffOneTwoFourEightSixteenThirtyThirtyAndSuccessResets() async throws {
        let h = try await Harness()
        try await h.signIn(1, lifetime: .seconds(3600))
        for _ in 0..<7 { h.authority.enqueue(.fail(.transient("connection refused"))) }
        h.authority.enqueue(.grant(h.authority.nextGrant()))
        let total: Int64 = 3300 + 91
        try await h.advance(by: .seconds(total))
        let start = Duration.seconds(3300)
        let times: [Duration] = h.authority.refreshTimes.map { $0 - start }
        let expected: [Duration] = [0, 1, 3, 7, 15, 31, 61, 91].map { Duration.seconds($0) }
        #expect(times == expected)
        // tokens and state were kept throughout
        #expect(h.manager.state.value == .loggedIn)
        #expect(h.recordedStates == [.loggedOut, .loggedIn])
        let failures = h.recordedEvents.compactMap { event -> Int? in
            if case .refreshFailed(let attempt, _, _) = event { return attempt }
            return nil
        }
        #expect(failures == [1, 2, 3, 4, 5, 6, 7])
        #expect(h.recordedEvents.contains(.refreshFailed(attempt: 6, retryIn: .seconds(30), error: .transient("connection refused"))))
        // A success reset the backoff: the next failure waits 1 s again
        h.authority.enqueue(.fail(.transient("connection refused")))
        try await h.advance(by: .seconds(3300))
        try await h.advance(by: .seconds(1))
        let last = h.authority.refreshTimes.suffix(2)
        #expect(last.last! - last.first! == .seconds(1))
    }

    @Test func backoffJitterStaysWithinItsBounds() async throws {
        let h = try await Harness { $0.random = { 0.999_999 } }
        try await h.signIn(1, lifetime: .seconds(3600))
        for _ in 0..<7 { h.authority.enqueue(.fail(.transient("timeout"))) }
        try await h.advance(by: .seconds(3600))
        let times = h.authority.refreshTimes
        let gaps = zip(times.dropFirst(), times).map { $0 - $1 }
        let bases: [Duration] = [1, 2, 4, 8, 16, 30, 30].map { .seconds($0) }
        #expect(gaps.count == 7)
        for (gap, base) in zip(gaps, bases) {
            // libuv-free virtual time is exact; only the jitter moves the gap, never past the
            // base, never below the upper half of [1 s, base], never below 1 s
            #expect(gap >= (base + .seconds(1)) / 2 && gap <= base, "gap \(gap) for base \(base)")
            #expect(gap >= .seconds(1))
            if base > .seconds(1) { #expect(gap < base, "gap \(gap) for base \(base)") }
        }
        #expect(gaps.first == .seconds(1))
    }

    @Test func aTooManyRequestsAnswerWithRetryAfterTwentyWaitsAtLeastTwentySeconds() async throws {
        let h = try await Harness()
        try await h.signIn(1, lifetime: .seconds(3600))
        h.authority.enqueue(.fail(AuthorityError(.transient, code: "429", message: "too many requests", retryAfter: .seconds(20))))
        try await h.advance(by: .seconds(3300))
        try await h.advance(by: .seconds(19))
        #expect(h.authority.refreshCount == 1)
        try await h.advance(by: .seconds(1))
        #expect(h.authority.refreshCount == 2)
        #expect(h.authority.refreshTimes[1] - h.authority.refreshTimes[0] >= .seconds(20))
        #expect(h.authority.refreshRequests[1].reason == .retry)
    }

    @Test func aTerminalAnswerExpiresTheSessionAndKeepsOnlyTheMember() async throws {
        let h = try await Harness()
        try await h.signIn(1, lifetime: .zero, member: "m-7")
        h.authority.enqueue(.fail(.terminal("invalid_grant", "refresh token revoked")))
        let caller = Task { try await h.manager.freshAccessToken() }
        let result = await caller.result
        try await h.settle()
        #expect(result.failureCode == .sessionExpired)
        #expect(h.manager.state.value == .sessionExpired)
        #expect(!h.manager.isLoggedIn())
        #expect(h.manager.memberID == "m-7")
        #expect(h.store.session == StoredSession(memberID: "m-7", expired: true))
        #expect(h.recordedEvents.last == .sessionExpired(reason: "terminal invalid_grant: refresh token revoked"))
        #expect(h.clock.armedTimerCount == 0)
        // and a new sign-in works
        try await h.signIn(2)
        #expect(h.manager.state.value == .loggedIn)
        h.expectNoSecretsInOutput()
    }

    @Test func reAuthenticationIsTriedOnceBeforeExpiring() async throws {
        let h = try await Harness()
        h.authority.reauthentication = [.grant(h.authority.nextGrant())]
        try await h.signIn(1, lifetime: .seconds(3600), external: "ext-1")
        h.authority.enqueue(.fail(.terminal()))
        try await h.advance(by: .seconds(3300))
        #expect(h.authority.reauthentications == 1)
        #expect(h.manager.state.value == .loggedIn)
        #expect(h.recordedEvents.contains { if case .tokenRefreshed(_, .reauthentication) = $0 { true } else { false } })
        // The next terminal answer: re-authentication refused → expired, no second try loop
        h.authority.enqueue(.fail(.terminal()))
        try await h.advance(by: .seconds(3300))
        #expect(h.authority.reauthentications == 2)
        #expect(h.manager.state.value == .sessionExpired)
    }

    @Test func aConfigurationErrorIsNeverRetriedAutomatically() async throws {
        let h = try await Harness()
        try await h.signIn(1, lifetime: .seconds(3600))
        h.authority.enqueue(.fail(.configuration("invalid_client", "unknown client")))
        try await h.advance(by: .seconds(3300))
        try await h.advance(by: .seconds(600))
        #expect(h.authority.refreshCount == 1)
        #expect(h.manager.state.value == .loggedIn)
        #expect(h.recordedEvents.last == .refreshFailed(
            attempt: 1, retryIn: nil, error: .configuration("invalid_client", "unknown client")))
    }

    @Test func aHungRefreshTimesOutAndFreesTheSlot() async throws {
        let h = try await Harness()
        try await h.signIn(1, lifetime: .zero)
        h.authority.enqueue(.hang)
        let caller = Task { try await h.manager.freshAccessToken() }
        #expect(await eventually(timeout: .seconds(10)) { (try? await h.waitingCallers()) == 1 })
        try await h.advance(by: .seconds(30))
        #expect(await caller.result.failureCode == .transient)
        // The slot is free: the backoff retry (1 s later) goes out and succeeds
        try await h.advance(by: .seconds(1))
        #expect(h.authority.refreshCount == 2)
        let token = try await h.manager.freshAccessToken()
        #expect(token != Sentinel.access(1))
        // The hung answer arriving late changes nothing
        h.authority.release(.fail(.terminal()))
        try await h.settle()
        #expect(h.manager.state.value == .loggedIn)
    }

    @Test func aRotatedRefreshTokenIsStoredBeforeAnyWaiterResumesAndAMissingOneKeepsTheOld() async throws {
        let h = try await Harness()
        try await h.signIn(1, lifetime: .zero)
        let rotated = h.authority.nextGrant()
        h.authority.enqueue(.grant(rotated))
        let store = h.store
        let storedAtResume = LockedBox<Secret?>(nil)
        try h.manager.freshAccessToken { _ in storedAtResume.withLockedValue { $0 = store.session?.refreshToken } }
        try await h.settle()
        #expect(storedAtResume.withLockedValue { $0 } == rotated.refreshToken)
        // No refresh token in the answer: the old one stays, and is the one sent next
        let unrotated = h.authority.nextGrant(rotate: false)
        h.authority.enqueue(.grant(unrotated))
        try await h.advance(by: .seconds(3300))
        #expect(h.authority.refreshCount == 2)
        #expect(h.store.session?.accessToken == unrotated.accessToken)
        #expect(h.store.session?.refreshToken == rotated.refreshToken)
        try await h.advance(by: .seconds(3300))
        #expect(h.authority.refreshRequests.last?.refreshToken == rotated.refreshToken)
    }
}
