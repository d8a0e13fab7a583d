import CLibUV
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A libuv event loop that hosts flows, timers and work.
///
/// Two modes:
/// - **owned** (`init(name:clock:logger:)`): the loop creates a `uv_loop_t` and runs it on
///   a thread of its own until `shutdown()`;
/// - **borrowed** (`init(borrowing:clock:logger:)`): the loop attaches to a host's
///   `uv_loop_t` and the host runs it. Create and shut down on the thread that runs that
///   loop. The loop keeps one handle of its own active (its wake-up), so the host's
///   `uv_run` keeps running until `shutdown()`, after which it returns (if the host has
///   nothing else active) and `uv_loop_close` gives 0. The host's own handles are never
///   touched.
///
/// Cross-thread work goes into one locked queue plus one `uv_async_t`; each wake-up
/// drains the whole batch, so many posts cost one wake-up. Every job, timer body and
/// flow callback runs on the loop thread, never inside the call that scheduled it, and
/// never while a library lock is held.
///
/// Threading: every method is safe from any thread unless its documentation says
/// otherwise.
public final class EventLoop: @unchecked Sendable {
    /// Who runs the `uv_loop_t`.
    public enum Mode: Sendable, Equatable {
        case owned
        case borrowed
    }

    /// What teardown found.
    public struct ShutdownReport: Sendable, Equatable, CustomStringConvertible {
        /// Subscriptions that were still open at teardown: each received `onComplete`
        /// and then its `release`. Anything above zero is a leak in the host program.
        public var unclosedSubscriptions: Int

        public var description: String { "ShutdownReport(unclosedSubscriptions: \(unclosedSubscriptions))" }
    }

    private enum RunState {
        case running
        /// `shutdown()` was called; the loop thread will tear down on its next wake-up.
        /// Public work is refused; internal bookkeeping (retire, delivery) still lands.
        case stopRequested
        /// Teardown has started: nothing is accepted from anyone.
        case stopped
    }

    public let mode: Mode
    public let name: String
    let logger: Logger
    let timers: any TimerBackend
    package let uvLoop: UnsafeMutablePointer<uv_loop_t>
    private let wakeHandle: UnsafeMutablePointer<uv_async_t>

    // Guarded by queueLock.
    private let queueLock = Lock()
    @exclusivity(unchecked) private var queue: [Job] = []
    @exclusivity(unchecked) private var wakePending = false
    /// Senders that claimed the wake-up under `queueLock` and send it after releasing the
    /// lock (so the woken loop never finds the lock held by a sender inside `write`).
    /// Teardown waits for them before it closes the handle.
    private let wakeSenders = Atomic<Int>(0)
    @exclusivity(unchecked) private var runState = RunState.running
    /// `runState == .running`, readable without the lock (subscribe's early check).
    private let running = Atomic<Bool>(true)
    /// Every flow made on this loop, weakly, so teardown can complete their subscribers.
    private var adopted: [WeakOwner] = []
    private var adoptedCompactionThreshold = 64
    /// Run on the loop thread at teardown, before subscriptions are completed.
    private var teardownHooks: [@Sendable () -> Void] = []
    /// Loop-confined: directory watches to stop at teardown.
    private var watches: [ObjectIdentifier: DirectoryWatch] = [:]

    // Loop-confined.
    @exclusivity(unchecked) private var batch: [Job] = []
    @exclusivity(unchecked) private var batchIndex = 0
    private var report = ShutdownReport(unclosedSubscriptions: 0)

    private let loopThread = Atomic<UInt>(0)
    /// Threads that `close()` a subscription while the loop calls its flow's subscribers
    /// wait here for that walk to end.
    let closeMonitor = CloseMonitor()
    /// The flow (its `FlowCore`'s identity) whose subscribers the loop thread is calling, or 0.
    let walking = Atomic<UInt>(0)
    /// Walks finished so far (a waiter waits for the walk it saw, not for later ones).
    let walksFinished = Atomic<UInt64>(0)
    /// Threads waiting in `close()` for a walk to end.
    let walkWaiters = Atomic<Int>(0)
    /// Successful subscribes minus closes and completions, across every flow of this loop.
    let openSubscriptions = Atomic<Int>(0)
    /// How many times the wake-up callback ran (coalescing is observable in tests).
    package let wakeups = Atomic<Int>(0)
    /// What `uv_loop_close` returned when the owned loop finished (nil before that, and
    /// always nil in borrowed mode, where the host closes its own loop).
    package var loopCloseResult: Int32? { closeResult.withLockedValue { $0 } }
    private let closeResult = LockedBox<Int32?>(nil)

    private var thread = pthread_t()
    private let started = Latch()
    private let finished = Latch()
    /// Borrowed mode: the loop keeps itself alive until its handles are closed.
    private var selfRetain: Unmanaged<EventLoop>?

    // MARK: - Creation

    /// Creates a loop that runs on a thread of its own (owned mode).
    ///
    /// - Parameters:
    ///   - name: the thread's name (first 15 bytes), for debuggers and logs.
    ///   - clock: `.system` (libuv timers on the monotonic clock) or `.manual(clock)` for
    ///     tests that drive timers in virtual time.
    /// - Throws: `LoopFlowError.libuv` if libuv cannot create the loop.
    public convenience init(
        name: String = "loopflow",
        clock: LoopClock = .system,
        logger: Logger = Logger(label: "sessionflow.loopflow")
    ) throws(LoopFlowError) {
        try clock.claim()
        let loop = UnsafeMutablePointer<uv_loop_t>.allocate(capacity: 1)
        let rc = uv_loop_init(loop)
        guard rc == 0 else {
            loop.deallocate()
            throw LoopFlowError(.libuv, "uv_loop_init: \(String(cString: uv_strerror(rc)))")
        }
        try self.init(mode: .owned, name: name, uvLoop: loop, clock: clock, logger: logger)
        let context = Unmanaged.passRetained(self).toOpaque()
        let created = pthread_create(&thread, nil, eventLoopThreadMain, context)
        precondition(created == 0, "pthread_create failed: \(created)")
        started.wait()
    }

    /// Attaches to a host's `uv_loop_t` (borrowed mode). Call on the thread that runs
    /// `loop`; the host keeps running it with `uv_run`.
    ///
    /// - Throws: `LoopFlowError.libuv` if libuv refuses the wake-up handle.
    public convenience init(
        borrowing loop: UnsafeMutablePointer<uv_loop_t>,
        clock: LoopClock = .system,
        logger: Logger = Logger(label: "sessionflow.loopflow")
    ) throws(LoopFlowError) {
        try clock.claim()
        try self.init(mode: .borrowed, name: "borrowed", uvLoop: loop, clock: clock, logger: logger)
        loopThread.store(UInt(pthread_self()), ordering: .releasing)
        selfRetain = Unmanaged.passRetained(self)
    }

    private init(
        mode: Mode, name: String, uvLoop: UnsafeMutablePointer<uv_loop_t>,
        clock: LoopClock, logger: Logger
    ) throws(LoopFlowError) {
        self.mode = mode
        self.name = name
        self.uvLoop = uvLoop
        self.logger = logger
        self.timers = clock.makeBackend()
        self.wakeHandle = .allocate(capacity: 1)
        let rc = uv_async_init(uvLoop, wakeHandle, eventLoopWakeCallback)
        guard rc == 0 else {
            // deinit (which runs for a throwing init once every property is set) frees
            // the memory; an owned loop with no handle closes cleanly.
            if mode == .owned { uv_loop_close(uvLoop) }
            throw LoopFlowError(.libuv, "uv_async_init: \(String(cString: uv_strerror(rc)))")
        }
        wakeHandle.pointee.data = Unmanaged.passUnretained(self).toOpaque()
        timers.attach(to: self)
    }

    deinit {
        // Reached only after teardown: an owned loop's thread and a borrowed loop's
        // self-retain keep it alive until its handles are closed.
        wakeHandle.deallocate()
        if mode == .owned {
            uvLoop.deallocate()
        }
    }

    fileprivate func runOwnedLoop() {
        loopThread.store(UInt(pthread_self()), ordering: .releasing)
        var threadName = Array(name.utf8.prefix(15)).map { CChar(bitPattern: $0) }
        threadName.append(0)
        pthread_setname_np(pthread_self(), threadName)
        started.signal()
        uv_run(uvLoop, UV_RUN_DEFAULT)
        let rc = uv_loop_close(uvLoop)
        closeResult.withLockedValue { $0 = rc }
        if rc != 0 {
            logger.error("uv_loop_close failed", metadata: ["error": "\(String(cString: uv_err_name(rc)))"])
        }
        loopThread.store(0, ordering: .releasing)
        finished.signal()
    }

    // MARK: - Threads

    /// Whether the caller is running on this loop's thread.
    public var inEventLoop: Bool {
        loopThread.load(ordering: .acquiring) == UInt(pthread_self())
    }

    /// Stops the program if called off the loop thread (in every build configuration).
    public func preconditionInEventLoop(file: StaticString = #fileID, line: UInt = #line) {
        precondition(inEventLoop, "must be called on the loop thread of '\(name)'", file: file, line: line)
    }

    /// Stops the program if called off the loop thread (debug builds only).
    @inlinable
    public func assertInEventLoop(file: StaticString = #fileID, line: UInt = #line) {
        assert(inEventLoop, "must be called on the loop thread of '\(name)'", file: file, line: line)
    }

    // MARK: - Work

    /// Runs `body` on the loop thread, later — never inside this call, even when called
    /// from the loop thread. Jobs posted from one thread run in the order they were posted.
    ///
    /// - Throws: `LoopFlowError.loopShutDown` once `shutdown()` has been called; `body` is
    ///   then never run.
    public func execute(_ body: @escaping @Sendable () -> Void) throws(LoopFlowError) {
        try enqueue(.run(body), isInternal: false)
    }

    /// Runs `body` on the loop thread and returns its result.
    @discardableResult
    public func submit<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            do {
                try execute {
                    continuation.resume(with: Result { try body() })
                }
            } catch {
                continuation.resume(throwing: error)
            }
        }
    }

    /// Appends to the queue and wakes the loop once per batch.
    ///
    /// `internal` jobs (a flow's delivery, a subscription's retirement) are still accepted
    /// after `shutdown()` was called, until teardown begins, so that bookkeeping started
    /// before the shutdown completes.
    func enqueue(_ job: Job, isInternal: Bool) throws(LoopFlowError) {
        queueLock.lock()
        switch runState {
        case .running:
            break
        case .stopRequested where isInternal:
            break
        case .stopRequested, .stopped:
            queueLock.unlock()
            throw LoopFlowError(.loopShutDown, "the event loop '\(name)' is shut down")
        }
        queue.append(job)
        let wake = claimWakeLocked()
        queueLock.unlock()
        if wake { sendWake() }
    }

    /// Caller holds `queueLock`: whether it must wake the loop (once per batch).
    private func claimWakeLocked() -> Bool {
        guard !wakePending else { return false }
        wakePending = true
        wakeSenders.add(1, ordering: .relaxed)
        return true
    }

    /// After `claimWakeLocked` returned true, without the lock. Teardown closes the handle
    /// only once no sender is between the claim and here.
    private func sendWake() {
        uv_async_send(wakeHandle)
        wakeSenders.subtract(1, ordering: .releasing)
    }

    /// Loop thread: whether jobs are waiting to run — later in the batch being run, or
    /// queued for the next one. (Virtual time lets them run before it moves on.)
    var hasQueuedJobs: Bool {
        assertInEventLoop()
        return batchIndex + 1 < batch.count || queueLock.withLock { !queue.isEmpty }
    }

    /// Whether public work (execute, subscribe, timers) is still accepted.
    var acceptsWork: Bool {
        running.load(ordering: .acquiring)
    }

    /// Loop thread: runs one batch of jobs, then tears down if a shutdown was requested.
    fileprivate func drain() {
        wakeups.add(1, ordering: .relaxed)
        queueLock.lock()
        swap(&queue, &batch)
        wakePending = false
        let stopping = runState == .stopRequested
        queueLock.unlock()
        runBatch()
        if stopping {
            teardown()
        }
    }

    private func runBatch() {
        batchIndex = 0
        while batchIndex < batch.count {
            let job = batch[batchIndex]
            switch job {
            case .run(let body):
                body()
            case .deliver(let source):
                source.deliver()
            case .retire(let subscription):
                subscription.owner.retire(subscription)
            }
            batchIndex += 1
        }
        batch.removeAll(keepingCapacity: true)
    }

    // MARK: - Walks (the close contract)

    /// Loop thread: the subscribers of `owner` are about to be called. One sequentially
    /// consistent store per walk; each callback then only loads its subscription's gate.
    @inline(__always)
    func beginWalk(_ owner: ObjectIdentifier) {
        walking.store(UInt(bitPattern: owner), ordering: .sequentiallyConsistent)
    }

    /// Loop thread: the walk is over; wake the threads waiting in `close()`, if any.
    @inline(__always)
    func endWalk() {
        walksFinished.add(1, ordering: .releasing)
        walking.store(0, ordering: .sequentiallyConsistent)
        if walkWaiters.load(ordering: .sequentiallyConsistent) > 0 {
            closeMonitor.lock.withLock {}
            closeMonitor.condition.broadcast()
        }
    }

    /// Any thread but the loop's: returns once the loop is not walking `owner`'s subscribers
    /// (or has finished the walk it was in when this was called).
    func waitWhileWalking(_ owner: ObjectIdentifier) {
        let id = UInt(bitPattern: owner)
        guard walking.load(ordering: .sequentiallyConsistent) == id else { return }
        let walk = walksFinished.load(ordering: .acquiring)
        closeMonitor.lock.lock()
        walkWaiters.add(1, ordering: .sequentiallyConsistent)
        while walking.load(ordering: .sequentiallyConsistent) == id && walksFinished.load(ordering: .acquiring) == walk {
            closeMonitor.condition.wait(closeMonitor.lock)
        }
        walkWaiters.subtract(1, ordering: .sequentiallyConsistent)
        closeMonitor.lock.unlock()
    }

    // MARK: - Subscription owners

    /// Records a new flow for teardown. Returns false if teardown has begun (the flow is
    /// then born finished: it admits no one).
    func adopt(_ owner: any SubscriptionOwner) -> Bool {
        queueLock.withLock {
            guard runState != .stopped else { return false }
            if adopted.count >= adoptedCompactionThreshold {
                adopted.removeAll { $0.owner == nil }
                adoptedCompactionThreshold = max(64, adopted.count * 2)
            }
            adopted.append(WeakOwner(owner: owner))
            return true
        }
    }

    /// Runs `hook` on the loop thread when the loop is torn down, after the last accepted
    /// job and before open subscriptions are completed — for layers that hold waiters or
    /// timers of their own. Returns false (and never runs it) if teardown has begun.
    @discardableResult
    package func addTeardownHook(_ hook: @escaping @Sendable () -> Void) -> Bool {
        queueLock.withLock {
            guard runState != .stopped else { return false }
            teardownHooks.append(hook)
            return true
        }
    }

    func rememberWatch(_ watch: DirectoryWatch) {
        watches[ObjectIdentifier(watch)] = watch
    }

    func forgetWatch(_ watch: DirectoryWatch) {
        watches.removeValue(forKey: ObjectIdentifier(watch))
    }

    // MARK: - Time

    /// Monotonic time of this loop's clock (virtual with a `ManualClock`).
    public var now: Duration { timers.currentTime() }

    /// Schedules `body` on the loop thread after `delay`, then every `interval` if given.
    ///
    /// Cancel with `LoopTimer.cancel()`. Teardown cancels every timer.
    /// - Throws: `loopShutDown` after `shutdown()`; `invalidConfiguration` for an
    ///   interval that is not positive.
    @discardableResult
    public func scheduleTimer(
        after delay: Duration,
        repeating interval: Duration? = nil,
        _ body: @escaping @Sendable () -> Void
    ) throws(LoopFlowError) -> LoopTimer {
        if let interval, interval <= .zero {
            throw LoopFlowError(.invalidConfiguration, "a repeating timer needs a positive interval, got \(interval)")
        }
        let timer = LoopTimer(loop: self, delay: max(delay, .zero), interval: interval, body: body)
        if inEventLoop {
            guard acceptsWork else {
                throw LoopFlowError(.loopShutDown, "the event loop '\(name)' is shut down")
            }
            timers.start(timer)
        } else {
            try enqueue(.run { [timers] in
                if !timer.isCancelled { timers.start(timer) }
            }, isInternal: false)
        }
        return timer
    }

    // MARK: - Shutdown

    /// Tears the loop down: runs the work already accepted, completes every open
    /// subscription (`onComplete`, then `release`), cancels every timer and closes every
    /// handle of its own.
    ///
    /// - Owned mode: call from any thread but the loop's; returns when the loop thread has
    ///   finished and `uv_loop_close` has run.
    /// - Borrowed mode: call on the loop thread; the teardown runs on the host's next loop
    ///   iteration, after which its `uv_run` can return. The report counts the
    ///   subscriptions open at the time of the call.
    ///
    /// - Throws: `busy` from an owned loop's own thread (it would wait for itself),
    ///   `wrongThread` for a borrowed loop off its thread, `alreadyShutDown` the second time.
    @discardableResult
    public func shutdown() throws(LoopFlowError) -> ShutdownReport {
        switch mode {
        case .owned:
            guard !inEventLoop else {
                throw LoopFlowError(.busy, "an owned loop cannot be shut down from its own thread")
            }
        case .borrowed:
            guard inEventLoop else {
                throw LoopFlowError(.wrongThread, "a borrowed loop is shut down on the thread that runs it")
            }
        }
        queueLock.lock()
        guard runState == .running else {
            queueLock.unlock()
            throw LoopFlowError(.alreadyShutDown, "shutdown() was already called on '\(name)'")
        }
        runState = .stopRequested
        running.store(false, ordering: .releasing)
        let wake = claimWakeLocked()
        queueLock.unlock()
        if wake { sendWake() }

        switch mode {
        case .owned:
            finished.wait()
            pthread_join(thread, nil)
            return report
        case .borrowed:
            return ShutdownReport(unclosedSubscriptions: openSubscriptions.load(ordering: .acquiring))
        }
    }

    /// Loop thread, once, after the batch that saw the stop request.
    private func teardown() {
        // From here nothing is accepted; what was accepted before still runs.
        queueLock.lock()
        runState = .stopped
        running.store(false, ordering: .releasing)
        swap(&queue, &batch)
        queueLock.unlock()
        runBatch()

        let hooks = queueLock.withLock { () -> [@Sendable () -> Void] in
            defer { teardownHooks.removeAll() }
            return teardownHooks
        }
        for hook in hooks { hook() }

        let owners: [any SubscriptionOwner] = queueLock.withLock {
            defer { adopted.removeAll() }
            return adopted.compactMap(\.owner)
        }
        var completed = 0
        for owner in owners {
            completed += owner.sweepForTeardown()
        }
        report = ShutdownReport(unclosedSubscriptions: completed)
        if completed > 0 {
            logger.warning(
                "event loop torn down with subscriptions that were never closed",
                metadata: ["loop": "\(name)", "unclosed": "\(completed)"])
        }

        for watch in Array(watches.values) { watch.stopOnLoop() }
        timers.stopAll()
        // No sender claims a wake-up any more (the run state is .stopped); wait out the
        // ones that claimed it before and are about to send.
        while wakeSenders.load(ordering: .acquiring) > 0 { sched_yield() }
        queueLock.withLock {
            uv_close(UnsafeMutableRawPointer(wakeHandle).assumingMemoryBound(to: uv_handle_t.self), eventLoopWakeClosed)
        }
    }

    fileprivate func wakeHandleClosed() {
        if mode == .borrowed {
            let retain = selfRetain
            selfRetain = nil
            retain?.release()
        }
    }
}

private struct WeakOwner {
    weak var owner: (any SubscriptionOwner)?
}

/// Where threads that close a running subscription wait for its callback to return.
final class CloseMonitor: Sendable {
    let lock = Lock()
    let condition = Condition()
}

// MARK: - C callbacks

private func eventLoopThreadMain(_ context: UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? {
    let loop = Unmanaged<EventLoop>.fromOpaque(context!).takeRetainedValue()
    loop.runOwnedLoop()
    return nil
}

private func eventLoopWakeCallback(_ handle: UnsafeMutablePointer<uv_async_t>?) {
    guard let data = handle?.pointee.data else { return }
    Unmanaged<EventLoop>.fromOpaque(data).takeUnretainedValue().drain()
}

private func eventLoopWakeClosed(_ handle: UnsafeMutablePointer<uv_handle_t>?) {
    guard let data = handle?.pointee.data else { return }
    Unmanaged<EventLoop>.fromOpaque(data).takeUnretainedValue().wakeHandleClosed()
}
