import Synchronization

/// Which clock a loop's timers follow.
public struct LoopClock: Sendable {
    enum Kind: Sendable {
        case system
        case manual(ManualClock)
    }

    let kind: Kind

    /// libuv timers on the monotonic clock.
    public static let system = LoopClock(kind: .system)

    /// Virtual time: timers fire only when the test advances `clock` (test support:
    /// `@_spi(Testing)`, as `ManualClock`).
    @_spi(Testing) public static func manual(_ clock: ManualClock) -> LoopClock {
        LoopClock(kind: .manual(clock))
    }

    /// A manual clock drives one loop only: claim it before making the loop.
    func claim() throws(LoopFlowError) {
        if case .manual(let clock) = kind {
            try clock.claim()
        }
    }

    func makeBackend() -> any TimerBackend {
        switch kind {
        case .system: UVTimerBackend()
        case .manual(let clock): clock
        }
    }
}

/// The seam between the loop and time. Implemented by libuv timers and by `ManualClock`.
protocol TimerBackend: AnyObject, Sendable {
    /// Called once from the loop's initializer.
    func attach(to loop: EventLoop)
    /// Any thread: monotonic now.
    func currentTime() -> Duration
    /// Loop thread: arm `timer` for `timer.delay` from now.
    func start(_ timer: LoopTimer)
    /// Loop thread: `timer` has run its body; re-arm or forget it.
    func fired(_ timer: LoopTimer)
    /// Loop thread: disarm and forget `timer` (idempotent).
    func stop(_ timer: LoopTimer)
    /// Loop thread, at teardown: stop every timer.
    func stopAll()
}

/// A one-shot or repeating timer on an `EventLoop`. Its body runs on the loop thread.
public final class LoopTimer: @unchecked Sendable {
    /// Strong: a timer kept by its owner can always be cancelled. The cycle through the
    /// backend's armed set ends when the timer fires (one-shot), is cancelled, or at teardown.
    let loop: EventLoop
    let delay: Duration
    let interval: Duration?
    private let body: @Sendable () -> Void
    private let cancelled = Atomic<Bool>(false)

    // Loop-confined state kept here for the backends.
    var uvHandle: UnsafeMutableRawPointer?
    var deadline: Duration = .zero
    var sequence: UInt64 = 0

    init(loop: EventLoop, delay: Duration, interval: Duration?, body: @escaping @Sendable () -> Void) {
        self.loop = loop
        self.delay = delay
        self.interval = interval
        self.body = body
    }

    /// Whether `cancel()` was called, or a one-shot timer has fired.
    public var isCancelled: Bool { cancelled.load(ordering: .acquiring) }

    /// Stops the timer. From the loop thread, the body will not run again after this
    /// returns. From another thread, a body that has already started finishes.
    /// Safe to call any number of times, from any thread.
    public func cancel() {
        guard !cancelled.exchange(true, ordering: .acquiringAndReleasing) else { return }
        if loop.inEventLoop {
            loop.timers.stop(self)
        } else {
            // After teardown the loop has already stopped every timer.
            try? loop.enqueue(.run { [self] in loop.timers.stop(self) }, isInternal: true)
        }
    }

    /// Loop thread: run the body unless cancelled, then let the backend re-arm or forget.
    func fire() {
        guard !isCancelled else { return }
        body()
        if interval == nil {
            cancelled.store(true, ordering: .releasing)
        }
        loop.timers.fired(self)
    }
}

extension Duration {
    /// Whole milliseconds, rounded up, for libuv (never negative).
    var roundedUpMilliseconds: UInt64 {
        let (seconds, attoseconds) = components
        guard seconds >= 0, self > .zero else { return 0 }
        let attosPerMilli: Int64 = 1_000_000_000_000_000
        // Saturating: a delay of centuries is "never" to libuv (which clamps the sum itself).
        guard seconds < Int64(UInt64.max / 1000) - 1 else { return UInt64.max / 2 }
        let millis = UInt64(seconds) * 1000 + UInt64(attoseconds / attosPerMilli)
        return attoseconds % attosPerMilli == 0 ? millis : millis + 1
    }
}
