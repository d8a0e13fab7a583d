import Testing

@testable import SessionCore

@Suite("SessionStateMachine")
struct SessionStateMachineTests {
    static let legal: [SessionState: [SessionRequest: SessionState]] = [
        .loggedOut: [.signIn: .loggedIn],
        .loggedIn: [.logout: .loggedOut, .expire: .sessionExpired],
        .sessionExpired: [.signIn: .loggedIn, .logout: .loggedOut, .reconfigure: .loggedOut],
    ]

    @Test(arguments: SessionState.allCases)
    func onlyTheLegalTransitionsHappen(from state: SessionState) {
        for request in [SessionRequest.signIn, .logout, .expire, .reconfigure] {
            var machine = SessionStateMachine(state: state)
            if let expected = Self.legal[state]?[request] {
                #expect((try? machine.apply(request)) == expected, "\(state) --\(request)-->")
                #expect(machine.state == expected)
            } else {
                // An illegal request is an error that changes nothing
                let error = #expect(throws: SessionError.self) { try machine.apply(request) }
                #expect(error?.code == .illegalTransition)
                #expect(machine.state == state)
            }
        }
    }
}

@Suite("RefreshPolicy")
struct RefreshPolicyTests {
    @Test func backoffDoublesFromOneSecondToAThirtySecondCap() {
        let policy = RefreshPolicy()
        let bases = (1...8).map { policy.baseBackoff(failures: $0) }
        #expect(bases == [1, 2, 4, 8, 16, 30, 30, 30].map { Duration.seconds($0) })
    }

    @Test func jitterOnlyShortensTheDelayWithinItsBounds() {
        let policy = RefreshPolicy()
        for failures in 1...7 {
            let base = policy.baseBackoff(failures: failures)
            let shortest = policy.backoffDelay(failures: failures, retryAfter: nil, unitRandom: 0.999_999)
            let longest = policy.backoffDelay(failures: failures, retryAfter: nil, unitRandom: 0)
            #expect(longest == base)
            #expect(shortest >= base * 0.9 && shortest < base)
        }
    }

    @Test func anAbsurdRetryAfterIsCappedAndAHugeLifetimeClamped() {
        // A 429 saying "retry in 10¹⁶ s" would have parked the session for ever (and trapped
        // a C host converting it to milliseconds): at most an hour is honoured.
        let policy = RefreshPolicy()
        #expect(policy.backoffDelay(failures: 1, retryAfter: .seconds(10_000_000_000_000_000), unitRandom: 0)
            == policy.maximumRetryAfter)
        #expect(policy.maximumRetryAfter == .seconds(3600))
        #expect(policy.clampedLifetime(.seconds(Int64.max)) == policy.maximumLifetime)
        #expect(policy.clampedLifetime(.seconds(-5)) == .zero)
    }

    @Test func unusableSettingsAreNamed() {
        #expect(RefreshPolicy().problem == nil)
        var policy = RefreshPolicy()
        policy.timeout = .zero
        #expect(policy.problem?.contains("timeout") == true)
        policy = RefreshPolicy()
        policy.maximumLifetime = .seconds(-1)
        #expect(policy.problem?.contains("maximumLifetime") == true)
        policy = RefreshPolicy()
        policy.maximumBackoff = .milliseconds(1)
        #expect(policy.problem?.contains("backoff") == true)
        policy = RefreshPolicy()
        policy.proactiveJitter = 1.5
        #expect(policy.problem?.contains("jitter") == true)
    }

    @Test func retryAfterIsAFloor() {
        let policy = RefreshPolicy()
        #expect(policy.backoffDelay(failures: 1, retryAfter: .seconds(20), unitRandom: 0.5) == .seconds(20))
        #expect(policy.backoffDelay(failures: 6, retryAfter: .seconds(2), unitRandom: 0) == .seconds(30))
    }

    @Test func theProactiveRefreshNeverComesSoonerThanTheMinimumInterval() {
        let policy = RefreshPolicy()
        let delay = policy.proactiveDelay(
            now: .seconds(100), expiresAt: .seconds(100), lifetime: .zero, lastRefresh: .seconds(100), unitRandom: 0)
        #expect(delay == policy.minimumInterval)
    }

    @Test func aShortLivedTokenIsRefreshedAtHalfLifeNotEveryMinimumInterval() {
        let policy = RefreshPolicy()
        // 5-minute token: margin capped at 150 s
        #expect(policy.effectiveMargin(lifetime: .seconds(300)) == .seconds(150))
        #expect(policy.effectiveMargin(lifetime: .seconds(3600)) == .seconds(300))
        let delay = policy.proactiveDelay(
            now: .zero, expiresAt: .seconds(300), lifetime: .seconds(300), lastRefresh: .zero, unitRandom: 0)
        #expect(delay == .seconds(150))
        #expect(!policy.needsRefresh(now: .seconds(149), expiresAt: .seconds(300), lifetime: .seconds(300)))
        #expect(policy.needsRefresh(now: .seconds(150), expiresAt: .seconds(300), lifetime: .seconds(300)))
    }

    @Test func proactiveJitterIsAtMostTenPercentOfTheMarginEarlier() {
        let policy = RefreshPolicy()
        let earliest = policy.proactiveDelay(
            now: .zero, expiresAt: .seconds(3600), lifetime: .seconds(3600), lastRefresh: nil, unitRandom: 0.999_999)
        let latest = policy.proactiveDelay(
            now: .zero, expiresAt: .seconds(3600), lifetime: .seconds(3600), lastRefresh: nil, unitRandom: 0)
        #expect(latest == .seconds(3300))
        #expect(earliest > .seconds(3270) && earliest < .seconds(3271))
    }
}

@Suite("Secret")
struct SecretTests {
    @Test func aSecretPrintsRedactedEverywhere() {
        let secret = Secret(Sentinel.access)
        var dumped = ""
        dump(secret, to: &dumped)
        let tokens = SessionTokens(accessToken: secret, refreshToken: Secret(Sentinel.refresh), expiresIn: .seconds(1))
        var dumpedTokens = ""
        dump(tokens, to: &dumpedTokens)
        for text in [
            "\(secret)", String(describing: secret), String(reflecting: secret), dumped,
            "\(tokens)", String(reflecting: tokens), dumpedTokens,
            "\(TokenGrant(accessToken: secret, refreshToken: secret, expiresIn: .seconds(1)))",
            "\(StoredSession(accessToken: secret, refreshToken: secret))",
            "\(RefreshRequest(refreshToken: secret, memberID: nil, reason: .proactive))",
        ] {
            #expect(!text.contains(Sentinel.access))
            #expect(!text.contains(Sentinel.refresh))
        }
        #expect(secret.reveal() == Sentinel.access)
    }
}
