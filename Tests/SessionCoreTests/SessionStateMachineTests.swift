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
        // Uniform within the upper half of [1 s, base]: never past the base, never sooner
        // than (1 s + base) / 2, never sooner than 1 s.
        let policy = RefreshPolicy()
        for failures in 1...7 {
            let base = policy.baseBackoff(failures: failures)
            let shortest = policy.backoffDelay(failures: failures, retryAfter: nil, unitRandom: 0.999_999)
            let longest = policy.backoffDelay(failures: failures, retryAfter: nil, unitRandom: 0)
            #expect(longest == base)
            #expect(shortest >= (base + policy.initialBackoff) / 2 && shortest <= base)
            #expect(shortest >= .seconds(1))
            if failures > 1 { #expect(shortest < base) }
        }
    }

    @Test func backoffJitterIsExactWithTheRandomNumberPinned() {
        let policy = RefreshPolicy()
        #expect(policy.backoffJitter == 0.5)
        // base − (base − 1 s) × 0.5 × u
        #expect(policy.backoffDelay(failures: 6, retryAfter: nil, unitRandom: 0) == .seconds(30))
        #expect(policy.backoffDelay(failures: 6, retryAfter: nil, unitRandom: 0.5) == .milliseconds(22_750))
        #expect(policy.backoffDelay(failures: 3, retryAfter: nil, unitRandom: 0.5) == .milliseconds(3_250))
        // The first retry waits the initial backoff whatever the draw: never sooner than 1 s.
        #expect(policy.backoffDelay(failures: 1, retryAfter: nil, unitRandom: 0.999_999) == .seconds(1))
        // Full jitter (backoffJitter 1): uniform over [1 s, base].
        var full = RefreshPolicy()
        full.backoffJitter = 1
        #expect(full.problem == nil)
        #expect(full.backoffDelay(failures: 6, retryAfter: nil, unitRandom: 0.5) == .milliseconds(15_500))
        let shortest = full.backoffDelay(failures: 6, retryAfter: nil, unitRandom: 0.999_999)
        #expect(shortest >= .seconds(1) && shortest < .milliseconds(1_001))
        // A unit random number out of range is clamped, not trusted.
        #expect(full.backoffDelay(failures: 6, retryAfter: nil, unitRandom: 7) == .seconds(1))
        #expect(full.backoffDelay(failures: 6, retryAfter: nil, unitRandom: -1) == .seconds(30))
        #expect(full.backoffDelay(failures: 6, retryAfter: nil, unitRandom: .nan) == .seconds(30))
        full.backoffJitter = 1.01
        #expect(full.problem?.contains("jitter") == true)
    }

    @Test func retryAfterIsHonouredWhateverTheJitter() {
        let policy = RefreshPolicy()
        for u in [0, 0.5, 0.999_999] {
            #expect(policy.backoffDelay(failures: 6, retryAfter: .seconds(45), unitRandom: u) == .seconds(45))
            #expect(policy.backoffDelay(failures: 6, retryAfter: .seconds(25), unitRandom: u)
                == max(.seconds(25), policy.backoffDelay(failures: 6, retryAfter: nil, unitRandom: u)))
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
        // At most 10 minutes: the lease lasts six timeouts, a lease record at most an hour.
        policy.timeout = .seconds(600)
        #expect(policy.problem == nil)
        policy.timeout = .seconds(601)
        #expect(policy.problem?.contains("at most 10 minutes") == true)
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

    @Test func theProactiveRefreshFallsInItsWindowExactlyWithTheRandomNumberPinned() {
        // A 1-hour token: the window ends at expiry − 5 min (3300 s) and reaches back 46 % of
        // the way from issue to there (1518 s), the lead being 1518 s × (1 − √(1 − u)).
        let policy = RefreshPolicy()
        func due(_ u: Double) -> Duration {
            policy.proactiveDelay(
                now: .zero, expiresAt: .seconds(3600), lifetime: .seconds(3600), lastRefresh: nil, unitRandom: u)
        }
        #expect(policy.proactiveSpread(lifetime: .seconds(3600)) == .seconds(1518))
        #expect(due(0) == .seconds(3300))
        #expect(due(0.75) == .seconds(3300 - 759))
        let earliest = due(0.999_999)
        #expect(earliest > .seconds(1782) && earliest < .seconds(1784))
        // Always before expiry − margin, never earlier than the window.
        for u in stride(from: 0.0, to: 1.0, by: 0.01) {
            #expect(due(u) <= .seconds(3300) && due(u) >= .seconds(1782))
        }
        // Zero jitter: the latest point, as before.
        var pinned = policy
        pinned.proactiveJitter = 0
        #expect(pinned.proactiveDelay(
            now: .zero, expiresAt: .seconds(3600), lifetime: .seconds(3600), lastRefresh: nil, unitRandom: 0.999_999)
            == .seconds(3300))
    }

    @Test func theProactiveLawCostsAtMostAThirdMoreRefreshesThanOnePerLifetime() {
        // The mean of the draw (a fine midpoint sum over u) of a 1-hour token: 3300 − 1518 / 3
        // = 2794 s, i.e. 1.288 refreshes per lifetime (the fleet simulation holds it to 1.3).
        let policy = RefreshPolicy()
        let steps = 10_000
        var total = 0.0
        for i in 0..<steps {
            let u = (Double(i) + 0.5) / Double(steps)
            let delay = policy.proactiveDelay(
                now: .zero, expiresAt: .seconds(3600), lifetime: .seconds(3600), lastRefresh: nil, unitRandom: u)
            total += Double(delay.components.seconds) + Double(delay.components.attoseconds) * 1e-18
        }
        let mean = total / Double(steps)
        #expect(abs(mean - 2794) < 1)
        #expect(3600 / mean <= 1.3)
    }

    @Test func aLongLivedTokenIsNotRefreshedLongBeforeItsExpiry() {
        // A 1-year token: the window is capped at an hour, so at most 1 h 5 min early.
        let policy = RefreshPolicy()
        let year = Duration.seconds(365 * 24 * 3600)
        #expect(policy.proactiveSpread(lifetime: year) == .seconds(3600))
        let earliest = policy.proactiveDelay(now: .zero, expiresAt: year, lifetime: year, lastRefresh: nil, unitRandom: 0.999_999)
        let latest = policy.proactiveDelay(now: .zero, expiresAt: year, lifetime: year, lastRefresh: nil, unitRandom: 0)
        #expect(latest == year - .seconds(300))
        #expect(earliest >= year - .seconds(300 + 3600) && earliest < year - .seconds(300 + 3590))
    }

    @Test func theProactiveWindowNeverReachesBeforeTheTokenWasIssued() {
        // A 5-minute token (margin capped at half) with a 99 % spread: the window stops short
        // of the issue time, and the minimum interval still holds after a refresh.
        var policy = RefreshPolicy()
        policy.proactiveJitter = 0.99
        #expect(policy.proactiveSpread(lifetime: .seconds(300)) == .milliseconds(148_500))
        #expect(RefreshPolicy().proactiveSpread(lifetime: .seconds(300)) == .seconds(69))
        #expect(policy.proactiveDelay(
            now: .seconds(1000), expiresAt: .seconds(1300), lifetime: .seconds(300), lastRefresh: nil, unitRandom: 0.999_999)
            > .seconds(1))
        #expect(policy.proactiveDelay(
            now: .seconds(1000), expiresAt: .seconds(1300), lifetime: .seconds(300), lastRefresh: .seconds(1000),
            unitRandom: 0.999_999) == policy.minimumInterval)
        #expect(policy.proactiveSpread(lifetime: .zero) == .zero)
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
