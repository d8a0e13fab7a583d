/// When to refresh and how long to wait after a failure: pure arithmetic, no clock and
/// no randomness of its own (the caller passes a unit random number), so tests pin it.
public struct RefreshPolicy: Sendable, Equatable {
    /// Refresh when the access token has less than this left (default 5 minutes)...
    public var margin: Duration = .seconds(300)
    /// ...but never more than this fraction of the token's lifetime (default half), so a
    /// 5-minute token is refreshed at half-life rather than every `minimumInterval`.
    public var maximumMarginFraction: Double = 0.5
    /// The proactive timer fires up to this fraction of the margin earlier, at random,
    /// so that many clients do not refresh in step (default 10%).
    public var proactiveJitter: Double = 0.1
    /// Never refresh again sooner than this after a refresh, so `expires_in: 0` cannot spin.
    public var minimumInterval: Duration = .seconds(10)
    /// First backoff delay after a transient failure (default 1 s), doubled each time...
    public var initialBackoff: Duration = .seconds(1)
    /// ...up to this cap (default 30 s).
    public var maximumBackoff: Duration = .seconds(30)
    /// Each backoff delay is shortened by up to this fraction, at random (default 10%):
    /// the delay for failure n lies in [base × (1 − jitter), base], base = min(1 s × 2ⁿ⁻¹, 30 s).
    public var backoffJitter: Double = 0.1
    /// A refresh that has not answered after this long counts as a transient failure.
    public var timeout: Duration = .seconds(30)
    /// A server's Retry-After above this counts as this (default 1 hour): a 429 saying
    /// "retry in 10¹⁶ seconds" must not park the session for ever.
    public var maximumRetryAfter: Duration = .seconds(3600)
    /// Token lifetimes above this count as this (default 10 years): an `expires_in` of
    /// 10¹⁸ must not overflow the expiry arithmetic, the stored expiry or a timer.
    public var maximumLifetime: Duration = .seconds(10 * 365 * 24 * 3600)

    /// What is wrong with these settings, or nil when they are usable.
    public var problem: String? {
        let century = Duration.seconds(100 * 365 * 24 * 3600)
        if margin < .zero { return "the refresh margin is negative (\(margin))" }
        if !(0...1).contains(maximumMarginFraction) { return "maximumMarginFraction must be within 0...1" }
        if !(0..<1).contains(proactiveJitter) || !(0..<1).contains(backoffJitter) {
            return "jitter fractions must be within 0..<1"
        }
        if minimumInterval < .zero { return "the minimum refresh interval is negative (\(minimumInterval))" }
        if initialBackoff <= .zero || maximumBackoff < initialBackoff {
            return "the backoff must start above zero and cap at or above its start"
        }
        if timeout <= .zero { return "the refresh timeout must be above zero (\(timeout))" }
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
    public func needsRefresh(now: Duration, expiresAt: Duration, lifetime: Duration) -> Bool {
        now >= expiresAt - effectiveMargin(lifetime: lifetime)
    }

    /// Delay before the proactive refresh, from `now`.
    /// - Parameter unitRandom: a number in [0, 1).
    public func proactiveDelay(
        now: Duration, expiresAt: Duration, lifetime: Duration, lastRefresh: Duration?, unitRandom: Double
    ) -> Duration {
        let margin = effectiveMargin(lifetime: lifetime)
        let jitter = margin * (proactiveJitter * unitRandom)
        var due = expiresAt - margin - jitter
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

    /// The delay before retrying after the `failures`-th consecutive failure, honouring
    /// the server's `Retry-After` (never retried sooner than that).
    public func backoffDelay(failures: Int, retryAfter: Duration?, unitRandom: Double) -> Duration {
        let base = baseBackoff(failures: failures)
        let jittered = base - base * (backoffJitter * unitRandom)
        return max(jittered, min(retryAfter ?? .zero, maximumRetryAfter))
    }
}
