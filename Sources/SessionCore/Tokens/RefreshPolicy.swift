/// When to refresh and how long to wait after a failure: pure arithmetic, no clock and
/// no randomness of its own (the caller passes a unit random number), so tests pin it.
///
/// The two jitter laws are chosen so that a fleet of clients never stampedes the
/// authorization server (measured with `fleet-sim` in Tools/, docs/reliability.md, "Fleet simulation"):
///
/// - **Proactive refresh**: due at a random point of a window that *ends* at expiry − margin
///   (the latest point, where a zero jitter puts it) and reaches back `proactiveJitter` (46 % by
///   default) of the time from the token's issue to that point, at most
///   `maximumProactiveSpread` (1 hour, so a one-year token is refreshed at most 1 h 5 min
///   early, never months). Within the window the density falls linearly from the latest point
///   to zero at the earliest: with `u` the unit random number, the lead before the latest point
///   is `spread × (1 − √(1 − u))` (u = 0: the latest point; u = 0.75: half the spread; u → 1:
///   the whole spread), a third of the spread on average. So every token is refreshed on
///   average at (1 − 0.46 / 3) = 0.847 of the way to its latest point, 1.18 × as often as at
///   the latest point; a 1-hour token between 29.7 and 55 min, on average at 46.6 min, 1.29
///   refreshes per lifetime. Why not uniform (kubelet's 70–90 %): the n-th refresh of a fleet
///   issued in one second is the sum of n delays, and the sum of two uniform delays peaks as
///   high as one, so the second wave is as sharp as the first; a falling density spreads the
///   fleet within two cycles (second-wave peak ≈ 2× the mean rate instead of 4×) at the same
///   cost in refreshes. `minimumInterval` still applies.
/// - **Backoff**: uniform within the upper `backoffJitter` share of `[initialBackoff, base]`,
///   base = min(1 s × 2ⁿ⁻¹, 30 s) for the n-th consecutive failure:
///   `base − (base − initialBackoff) × backoffJitter × u`. The default share is half (at the
///   cap: 15.5–30 s, "equal jitter"); 1 is full jitter over `[initialBackoff, base]`. Why not
///   full jitter by default: a whole fleet in backoff retries at N / (mean delay) per second,
///   and full jitter's mean at the cap is 15.5 s, so a recovering server sees ≈ 1.94 × N / 30 s;
///   half jitter's 22.75 s gives ≈ 1.32 × N / 30 s, within the 1.5 × N / cap the fleet
///   simulation holds it to, while one draw still spreads a synchronised fleet over 14.5 s
///   (the old law: 3 s). The first retry is never sooner than `initialBackoff`, none later than
///   the cap, and none sooner than the server's `Retry-After` (at most `maximumRetryAfter`).
public struct RefreshPolicy: Sendable, Equatable {
    /// Refresh when the access token has less than this left (default 5 minutes)...
    public var margin: Duration = .seconds(300)
    /// ...but never more than this fraction of the token's lifetime (default half), so a
    /// 5-minute token is refreshed at half-life rather than every `minimumInterval`.
    public var maximumMarginFraction: Double = 0.5
    /// How far back from the latest point (expiry − margin) the proactive refresh may fall, at
    /// random, as a fraction of the time from the token's issue to that point (default 46%;
    /// 0 = always the latest point), at most `maximumProactiveSpread`. The density falls
    /// linearly towards the earliest point: see the type's documentation.
    public var proactiveJitter: Double = 0.46
    /// The proactive window is never wider than this (default 1 hour), so a long-lived token is
    /// not refreshed long before its expiry.
    public var maximumProactiveSpread: Duration = .seconds(3600)
    /// Never refresh again sooner than this after a refresh, so `expires_in: 0` cannot spin.
    public var minimumInterval: Duration = .seconds(10)
    /// First backoff delay after a transient failure (default 1 s), doubled each time...
    public var initialBackoff: Duration = .seconds(1)
    /// ...up to this cap (default 30 s).
    public var maximumBackoff: Duration = .seconds(30)
    /// How much of the window `[initialBackoff, base]` each backoff delay is spread over, at
    /// random (default 0.5, the upper half; 1 = full jitter). The delay for failure n lies in
    /// `[base − jitter × (base − initialBackoff), base]`, base = min(1 s × 2ⁿ⁻¹, 30 s).
    public var backoffJitter: Double = 0.5
    /// A refresh that has not answered after this long counts as a transient failure. At most
    /// 10 minutes: the refresh lease lasts six of these (`SessionEngine.refreshLeaseDuration`),
    /// and a lease record at most an hour.
    public var timeout: Duration = .seconds(30)
    /// A server's Retry-After above this counts as this (default 1 hour): a 429 saying
    /// "retry in 10¹⁶ seconds" must not park the session for ever.
    public var maximumRetryAfter: Duration = .seconds(3600)
    /// Token lifetimes above this count as this (default 10 years): an `expires_in` of
    /// 10¹⁸ must not overflow the expiry arithmetic, the stored expiry or a timer.
    public var maximumLifetime: Duration = .seconds(10 * 365 * 24 * 3600)

    /// The longest refresh timeout (`timeout`).
    public static let maximumTimeout = Duration.seconds(600)

    /// What is wrong with these settings, or nil when they are usable.
    public var problem: String? {
        let century = Duration.seconds(100 * 365 * 24 * 3600)
        if margin < .zero { return "the refresh margin is negative (\(margin))" }
        if !(0...1).contains(maximumMarginFraction) { return "maximumMarginFraction must be within 0...1" }
        if !(0..<1).contains(proactiveJitter) || !(0...1).contains(backoffJitter) {
            return "jitter fractions must be within 0..<1 (proactive) and 0...1 (backoff)"
        }
        if maximumProactiveSpread < .zero { return "maximumProactiveSpread is negative" }
        if minimumInterval < .zero { return "the minimum refresh interval is negative (\(minimumInterval))" }
        if initialBackoff <= .zero || maximumBackoff < initialBackoff {
            return "the backoff must start above zero and cap at or above its start"
        }
        if timeout <= .zero || timeout > Self.maximumTimeout {
            return "the refresh timeout must be above zero and at most 10 minutes (\(timeout))"
        }
        if maximumRetryAfter < .zero { return "maximumRetryAfter is negative" }
        if maximumLifetime <= .zero || maximumLifetime > century {
            return "maximumLifetime must be above zero and at most 100 years"
        }
        return nil
    }

    /// `lifetime` within [0, maximumLifetime].
    public func clampedLifetime(_ lifetime: Duration) -> Duration {
        min(max(lifetime, .zero), maximumLifetime)
    }

    public init() {}

    /// The margin for a token that lives `lifetime`.
    public func effectiveMargin(lifetime: Duration) -> Duration {
        min(margin, lifetime * maximumMarginFraction)
    }

    /// Whether a token expiring at `expiresAt` (living `lifetime`) should be refreshed at `now`.
    /// - Parameters:
    ///   - now: the current time on the session's monotonic clock.
    ///   - expiresAt: when the token expires, on the same clock.
    ///   - lifetime: how long the token lives in all (from its issue to `expiresAt`).
    public func needsRefresh(now: Duration, expiresAt: Duration, lifetime: Duration) -> Bool {
        now >= expiresAt - effectiveMargin(lifetime: lifetime)
    }

    /// How far before the latest point (expiry − margin) a proactive refresh may fall: the
    /// `proactiveJitter` fraction of the time from issue to that point (so never before the
    /// token was issued), at most `maximumProactiveSpread`, in whole milliseconds.
    public func proactiveSpread(lifetime: Duration) -> Duration {
        let lifetime = clampedLifetime(lifetime)
        let toLatest = lifetime - effectiveMargin(lifetime: lifetime)
        let spread = min(toLatest * proactiveJitter, maximumProactiveSpread, toLatest)
        return Self.wholeMilliseconds(max(spread, .zero))
    }

    /// `duration` rounded down to whole milliseconds (the loop's timer resolution), so that a
    /// fraction such as 0.42 of an hour is exactly 1512 s and pinned draws are exact.
    static func wholeMilliseconds(_ duration: Duration) -> Duration {
        let (seconds, attoseconds) = duration.components
        return .seconds(seconds) + .milliseconds(attoseconds / 1_000_000_000_000_000)
    }

    /// How long before the latest point the proactive refresh falls for this unit random
    /// number: `spread × (1 − √(1 − u))` (a density falling linearly from the latest point).
    public func proactiveLead(lifetime: Duration, unitRandom: Double) -> Duration {
        let u = unitRandom.isNaN ? 0 : min(max(unitRandom, 0), 1)
        return Self.wholeMilliseconds(proactiveSpread(lifetime: lifetime) * (1 - (1 - u).squareRoot()))
    }

    /// Delay before the proactive refresh, from `now`: at `expiresAt − margin − lead` (see the
    /// type's documentation), never sooner than `minimumInterval` after the last refresh.
    /// - Parameters:
    ///   - now: the current time on the session's monotonic clock.
    ///   - expiresAt: when the token expires, on the same clock.
    ///   - lifetime: how long the token lives in all.
    ///   - lastRefresh: when the last refresh happened, if one did.
    ///   - unitRandom: a number in [0, 1).
    public func proactiveDelay(
        now: Duration, expiresAt: Duration, lifetime: Duration, lastRefresh: Duration?, unitRandom: Double
    ) -> Duration {
        let latest = expiresAt - effectiveMargin(lifetime: lifetime)
        var due = latest - proactiveLead(lifetime: lifetime, unitRandom: unitRandom)
        if let lastRefresh {
            due = max(due, lastRefresh + minimumInterval)
        }
        return max(due - now, .zero)
    }

    /// The un-jittered backoff for the `failures`-th consecutive failure (1-based).
    public func baseBackoff(failures: Int) -> Duration {
        var delay = initialBackoff
        var step = 1
        while step < failures && delay < maximumBackoff {
            delay = delay * 2
            step += 1
        }
        return min(delay, maximumBackoff)
    }

    /// The delay before retrying after the `failures`-th consecutive failure:
    /// `base − (base − initialBackoff) × backoffJitter × u`, so within
    /// `[initialBackoff, base]` (u = 0: the base), honouring the server's `Retry-After` (never
    /// retried sooner than that, up to `maximumRetryAfter`).
    /// - Parameters:
    ///   - failures: how many attempts in a row failed (1 for the first failure).
    ///   - retryAfter: the server's `Retry-After`, if it sent one.
    ///   - unitRandom: a number in [0, 1).
    public func backoffDelay(failures: Int, retryAfter: Duration?, unitRandom: Double) -> Duration {
        let base = baseBackoff(failures: failures)
        let u = unitRandom.isNaN ? 0 : min(max(unitRandom, 0), 1)
        let jittered = max(base - (base - initialBackoff) * (backoffJitter * u), initialBackoff)
        return max(jittered, min(retryAfter ?? .zero, maximumRetryAfter))
    }
}
