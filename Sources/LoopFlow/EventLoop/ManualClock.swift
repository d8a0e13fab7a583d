/// Virtual time for tests: a loop created with `.manual(clock)` fires its timers only
/// when the test advances the clock (swift-nio's `EmbeddedEventLoop.advanceTime` shape).
///
/// Timers fire on the loop thread, in deadline order (ties in scheduling order), each
/// with `now` equal to its deadline. Time moves only when the loop's queue is empty, so
/// the work a timer or job posts (and the work that work posts) runs at the time it was
/// posted, before the next timer fires: a chain of timers and jobs plays out as it would
/// in real time. (Work that arrives from other threads while time moves is not waited for.)
public final class ManualClock: TimerBackend, @unchecked Sendable {
    private let lock = Lock()
    private var current: Duration                 // guarded
    private var pending: [LoopTimer] = []         // guarded, sorted by (deadline, sequence)
    private var nextSequence: UInt64 = 0          // guarded
    private weak var loop: EventLoop?             // set once by attach

    public init(now: Duration = .zero) {
        current = now
    }

    /// The virtual now.
    public var now: Duration { lock.withLock { current } }

    /// How many timers are armed.
    public var armedTimerCount: Int { lock.withLock { pending.count } }

    /// The deadline of the next timer to fire, if any.
    public var nextDeadline: Duration? { lock.withLock { pending.first?.deadline } }

    /// Moves time forward by `duration`, firing every timer that falls due on the way, and
    /// returns once they and the jobs they posted have run.
    public func advance(by duration: Duration) async {
        precondition(duration >= .zero, "time does not go backwards")
        let target = lock.withLock { current + duration }
        guard let loop = lock.withLock({ self.loop }) else {
            lock.withLock { current = target }
            return
        }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            step(loop: loop, until: target, continuation)
        }
    }

    /// Posts one step. A step first lets every queued job run (so all work due at the
    /// current time is done before time moves), then fires the earliest timer due by
    /// `target`, or finishes at `target`.
    private func step(loop: EventLoop, until target: Duration, _ continuation: CheckedContinuation<Void, Never>) {
        do {
            try loop.enqueue(.run { [self] in
                if loop.hasQueuedJobs {
                    step(loop: loop, until: target, continuation)
                    return
                }
                let due: LoopTimer? = lock.withLock {
                    guard let first = pending.first, first.deadline <= target else {
                        current = max(current, target)
                        return nil
                    }
                    pending.removeFirst()
                    current = max(current, first.deadline)
                    return first
                }
                guard let due else {
                    continuation.resume()
                    return
                }
                due.fire()
                step(loop: loop, until: target, continuation)
            }, isInternal: true)
        } catch {
            lock.withLock { current = max(current, target) }
            continuation.resume()
        }
    }

    // MARK: TimerBackend

    private var claimed = false                   // guarded

    func claim() throws(LoopFlowError) {
        try lock.withLock { () throws(LoopFlowError) in
            guard !claimed else {
                throw LoopFlowError(.invalidConfiguration, "a ManualClock drives one event loop only")
            }
            claimed = true
        }
    }

    func attach(to loop: EventLoop) {
        lock.withLock { self.loop = loop }
    }

    func currentTime() -> Duration { now }

    func start(_ timer: LoopTimer) {
        lock.withLock {
            timer.deadline = current + timer.delay
            insert(timer)
        }
    }

    func fired(_ timer: LoopTimer) {
        guard let interval = timer.interval, !timer.isCancelled else { return }
        lock.withLock {
            timer.deadline += interval
            insert(timer)
        }
    }

    func stop(_ timer: LoopTimer) {
        lock.withLock {
            pending.removeAll { $0 === timer }
        }
    }

    func stopAll() {
        lock.withLock { pending.removeAll() }
    }

    /// Caller holds the lock.
    private func insert(_ timer: LoopTimer) {
        timer.sequence = nextSequence
        nextSequence += 1
        let index = pending.firstIndex {
            ($0.deadline, $0.sequence) > (timer.deadline, timer.sequence)
        } ?? pending.endIndex
        pending.insert(timer, at: index)
    }
}
