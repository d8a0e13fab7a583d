import Logging

#if canImport(Glibc)
import Glibc
#endif

/// How a `SessionManager` behaves. The defaults suit a production client.
public struct SessionConfiguration: Sendable {
    /// Margin, jitter, minimum interval, backoff and timeout of refreshes.
    public var policy = RefreshPolicy()
    /// How often an unavailable store is tried again.
    public var storeRetryInterval: Duration = .seconds(5)
    /// Events that may wait for delivery to an observer before the oldest is dropped.
    public var eventBufferCapacity = 64
    /// Token requests (`freshAccessToken`, `refreshNow`, `handleUnauthorized`) that may be
    /// accepted and not yet answered at once; beyond it a request fails with `busy` at once
    /// and nothing is queued. A refresh answers all its waiters together, so only a stuck
    /// loop or a hung authority with thousands of callers reaches it.
    public var tokenRequestLimit = 10_000
    /// A number in [0, 1) for jitter. Tests pin it.
    public var random: @Sendable () -> Double = { Double.random(in: 0..<1) }
    /// The wall clock, as time since the Unix epoch. Used only to store an expiry that
    /// survives a restart; in a running process expiry follows the monotonic clock.
    public var wallClock: @Sendable () -> Duration = SessionConfiguration.realtime
    /// Whether the session starts by itself on the loop's first turn after it is made
    /// (the default), emitting its start-up events (`initialSession`, a start-up
    /// `storeError`) then. Turn it off to subscribe first and call `SessionManager.start()`
    /// after: an observer then sees every start-up event without racing the loop. Any
    /// request (sign in, a token...) made before `start()` starts the session first.
    public var startsAutomatically = true
    /// Where the session logs (never a token).
    public var logger = Logger(label: "sessionflow.session")

    public init() {}

    @Sendable
    public static func realtime() -> Duration {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return .seconds(Int64(now.tv_sec)) + .nanoseconds(Int64(now.tv_nsec))
    }
}
