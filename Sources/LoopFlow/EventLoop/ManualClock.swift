/// Virtual time for tests: a loop created with `.manual(clock)` fires its timers only
/// when the test advances the clock (swift-nio's `EmbeddedEventLoop.advanceTime` shape).
///
/// Timers fire on the loop thread, in deadline order (ties in scheduling order), each
/// with `now` equal to its deadline. Time moves only when the loop's queue is empty, so
/// the work a timer or job posts (and the work that work posts) runs at the time it was
/// posted, before the next timer fires: a chain of timers and jobs plays out as it would
/// in real time. (Work that arrives from other threads while time moves is not waited for.)
///
/// Test support, so not part of LoopFlow's API: it is `@_spi(Testing)` (import LoopFlow with
/// `@_spi(Testing) import LoopFlow` in a test target), as swift-nio keeps its
/// `EmbeddedEventLoop` apart from the loops it ships.
@_spi(Testing) public final class ManualClock: TimerBackend, @unchecked Sendable {
    private let lock = Lock()
    private var current: Duration                 // guarded
    private var pending: [LoopTimer] = []         // guarded, sorted by (deadline, sequence)
    private var nextSequence: UInt64 = 0          // guarded
    private weak var loop: EventLoop?             // set once by attach
    private var advances: [(target: Duration, continuation: CheckedContinuation<Void, Never>)] = []  // guarded
    private var stepping = false                  // guarded
    private var deferrals = 0                     // loop-confined

    public init(now: Duration = .zero) {
        current = now
    }

    /// The virtual now.
    public var now: Duration { lock.withLock { current } }

    /// How many timers are armed.
    public var armedTimerCount: Int { lock.withLock { pending.count } }

    /// How many `advance(by:)` calls are waiting for time to reach their target.
    public var waitingAdvances: Int { lock.withLock { advances.count } }

    /// The deadline of the next timer to fire, if any.
    public var nextDeadline: Duration? { lock.withLock { pending.first?.deadline } }

    /// Moves time forward by `duration`, firing every timer that falls due on the way, and
    /// returns once they and the jobs they posted have run. Concurrent calls share one
    /// stepper: each returns when time has reached its own target.
    public func advance(by duration: Duration) async {
        precondition(duration >= .zero, "time does not go backwards")
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let startStepper: Bool = lock.withLock {
                advances.append((current + duration, continuation))
                guard !stepping else { return false }
                stepping = true
                return true
            }
            if startStepper { postStep() }
        }
    }

    /// How many times in a row a step waits for queued jobs before moving on anyway (work
    /// posted without pause by other threads must not stall virtual time forever).
    private static let maximumDeferrals = 10_000

    private func postStep() {
        guard let loop = lock.withLock({ self.loop }) else {
            finishAll()
            return
        }
        do {
            try loop.enqueue(.run { [self] in step(loop) }, isInternal: true)
        } catch {
            finishAll()
        }
    }

    /// One step on the loop thread: let queued work at the current time run first; then
    /// fire the next timer due by the nearest target, or, with none left, move to that
    /// target and return to every advance that reached it.
    private func step(_ loop: EventLoop) {
        if loop.hasQueuedJobs && deferrals < Self.maximumDeferrals {
            deferrals += 1
            postStep()
            return
        }
        deferrals = 0
        let (reached, due, more): ([CheckedContinuation<Void, Never>], LoopTimer?, Bool) = lock.withLock {
            guard let nearest = advances.map(\.target).min() else {
                stepping = false
                return ([], nil, false)
            }
            if let first = pending.first, first.deadline <= nearest {
                pending.removeFirst()
                current = max(current, first.deadline)
                return ([], first, true)
            }
            // Nothing left to fire before the nearest target: time reaches it.
            current = max(current, nearest)
            let reached = advances.filter { $0.target <= current }.map(\.continuation)
            advances.removeAll { $0.target <= current }
            if advances.isEmpty { stepping = false }
            return (reached, nil, !advances.isEmpty)
        }
        for continuation in reached { continuation.resume() }
        due?.fire()
        if more { postStep() }
    }

    /// The loop is gone: time jumps to every target and every advance returns.
    private func finishAll() {
        let all: [CheckedContinuation<Void, Never>] = lock.withLock {
            if let last = advances.map(\.target).max() { current = max(current, last) }
            defer { advances.removeAll(); stepping = false }
            return advances.map(\.continuation)
        }
        for continuation in all { continuation.resume() }
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
