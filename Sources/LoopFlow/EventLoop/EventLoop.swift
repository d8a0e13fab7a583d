// One type in one file (over 400 lines): creation, the work queue, hooks, timers and shutdown share
// the uv handles and the run state, and teardown's order across them is the point. Its parts
// already stand apart: JobQueue, LoopResources, LoopTimer, RunState, DirectoryWatch.

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
///
/// This type is the façade and the libuv host (the `uv_loop_t`, its thread, the wake-up
/// handle). The work itself lives in three parts it owns: `JobQueue` (the locked queue, the
/// wake-up claims, the batches; its `RunState` decides what is accepted), `LoopResources`
/// (what teardown finishes: flows, hooks, directory watches, timers) and `WalkGate` (the
/// close contract's wait for a running callback).
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

    public let mode: Mode
    public let name: String
    let logger: Logger
    package let uvLoop: UnsafeMutablePointer<uv_loop_t>
    private let wakeHandle: UnsafeMutablePointer<uv_async_t>
    let jobs: JobQueue
    let resources: LoopResources
    /// The timers' backend (libuv or a `ManualClock`), kept with the other resources.
    var timers: any TimerBackend { resources.timers }
    /// The clock is the system's (`CLOCK_BOOTTIME`, as `UVTimerBackend` reads it), not a
    /// `ManualClock`: `now` reads it directly instead of through the backend.
    @usableFromInline let onSystemClock: Bool
    /// Threads that `close()` a subscription while the loop calls its flow's subscribers
    /// wait here for that walk to end.
    let walkGate = WalkGate()

    // Loop-confined.
    private var report = ShutdownReport(unclosedSubscriptions: 0)
    /// `addFinalHook`'s hooks; nil once they ran.
    private let finalHooks = Mutex<[@Sendable () -> Void]?>([])

    private let loopThread = Atomic<UInt>(0)
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
    ///   - boundedJobLimit: how many jobs of `executeBounded` may wait at once (beyond it:
    ///     `overloaded`, nothing queued).
    ///   - logger: where the loop logs (teardown with subscriptions never closed, libuv errors).
    /// - Throws: `LoopFlowError.libuv` if libuv cannot create the loop.
    public convenience init(
        name: String = "loopflow",
        clock: LoopClock = .system,
        boundedJobLimit: Int = EventLoop.defaultBoundedJobLimit,
        logger: Logger = Logger(label: "sessionflow.loopflow")
    ) throws(LoopFlowError) {
        try Self.check(boundedJobLimit: boundedJobLimit)
        try clock.claim()
        let loop = UnsafeMutablePointer<uv_loop_t>.allocate(capacity: 1)
        let rc = uv_loop_init(loop)
        guard rc == 0 else {
            loop.deallocate()
            throw LoopFlowError(.libuv, "uv_loop_init: \(String(cString: uv_strerror(rc)))")
        }
        try self.init(
            mode: .owned, name: name, uvLoop: loop, clock: clock, boundedJobLimit: boundedJobLimit, logger: logger)
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
        boundedJobLimit: Int = EventLoop.defaultBoundedJobLimit,
        logger: Logger = Logger(label: "sessionflow.loopflow")
    ) throws(LoopFlowError) {
        try Self.check(boundedJobLimit: boundedJobLimit)
        try clock.claim()
        try self.init(
            mode: .borrowed, name: "borrowed", uvLoop: loop, clock: clock, boundedJobLimit: boundedJobLimit,
            logger: logger)
        loopThread.store(UInt(sf_thread_identity()), ordering: .releasing)
        selfRetain = Unmanaged.passRetained(self)
    }

    /// How many bounded jobs (`executeBounded`) may wait at once unless a loop is made with
    /// another limit.
    public static let defaultBoundedJobLimit = 65_536

    private static func check(boundedJobLimit: Int) throws(LoopFlowError) {
        guard boundedJobLimit >= 1 else {
            throw LoopFlowError(.invalidConfiguration, "boundedJobLimit must be at least 1, got \(boundedJobLimit)")
        }
    }

    private init(
        mode: Mode, name: String, uvLoop: UnsafeMutablePointer<uv_loop_t>,
        clock: LoopClock, boundedJobLimit: Int, logger: Logger
    ) throws(LoopFlowError) {
        self.mode = mode
        self.name = name
        self.uvLoop = uvLoop
        self.logger = logger
        self.wakeHandle = .allocate(capacity: 1)
        self.jobs = JobQueue(wakeHandle: wakeHandle, boundedLimit: boundedJobLimit)
        let timers = clock.makeBackend()
        self.resources = LoopResources(timers: timers)
        self.onSystemClock = timers is UVTimerBackend
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
        loopThread.store(UInt(sf_thread_identity()), ordering: .releasing)
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
        loopThread.load(ordering: .acquiring) == UInt(sf_thread_identity())
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

    /// Runs `body` on the loop thread, later, like `execute` — unless `boundedJobLimit` jobs
    /// posted this way are already waiting (queued, or in the batch the loop is running):
    /// then nothing is queued and `overloaded` is thrown. For new work from outside (a
    /// caller's request), so that a loop stuck in a callback, or far behind, cannot be
    /// buried under requests; the answers of work already admitted (a worker's or the
    /// network's) use `execute`, which is never refused while the loop runs, so that no
    /// admitted work loses its answer.
    ///
    /// - Throws: `LoopFlowError.overloaded` when the limit is reached,
    ///   `LoopFlowError.loopShutDown` once `shutdown()` has been called; `body` is then
    ///   never run.
    public func executeBounded(_ body: @escaping @Sendable () -> Void) throws(LoopFlowError) {
        switch jobs.enqueueBounded(body) {
        case .accepted:
            return
        case .refused:
            throw LoopFlowError(.loopShutDown, "the event loop '\(name)' is shut down")
        case .full:
            throw LoopFlowError(
                .overloaded,
                "the event loop '\(name)' has \(jobs.boundedLimit) requests waiting (is a callback blocking it?); nothing was queued")
        }
    }

    /// The limit of `executeBounded`.
    public var boundedJobLimit: Int { jobs.boundedLimit }

    /// Bounded jobs waiting now (queued, or in the batch the loop is running).
    public var boundedJobsPending: Int { jobs.boundedPendingCount }

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
        guard jobs.enqueue(job, isInternal: isInternal) else {
            throw LoopFlowError(.loopShutDown, "the event loop '\(name)' is shut down")
        }
    }

    /// Loop thread: whether jobs are waiting to run — later in the batch being run, or
    /// queued for the next one. (Virtual time lets them run before it moves on.)
    var hasQueuedJobs: Bool {
        assertInEventLoop()
        return jobs.hasQueuedJobs
    }

    /// Whether public work (execute, subscribe, timers) is still accepted.
    var acceptsWork: Bool {
        jobs.acceptsWork
    }

    /// Loop thread: runs one batch of jobs, then tears down if a shutdown was requested.
    fileprivate func drain() {
        wakeups.wrappingAdd(1, ordering: .relaxed)
        if jobs.runNextBatch() {
            teardown()
        }
    }

    // MARK: - Resources

    /// Holds a flow with subscribers until `letGo`, for teardown to complete them. Returns
    /// false if teardown has begun (the flow then admits no one).
    func hold(_ owner: any SubscriptionOwner) -> Bool {
        resources.hold(owner)
    }

    /// The flow has no subscribers any more; returns the reference held (for the caller to
    /// drop outside its lock).
    func letGo(_ owner: any SubscriptionOwner) -> (any SubscriptionOwner)? {
        resources.letGo(owner)
    }

    /// Runs `hook` on the loop thread when the loop is torn down, after the last accepted
    /// job and before open subscriptions are completed — for layers that hold waiters or
    /// timers of their own. Returns false (and never runs it) if teardown has begun.
    @discardableResult
    package func addTeardownHook(_ hook: @escaping @Sendable () -> Void) -> Bool {
        resources.addTeardownHook(hook) != nil
    }

    /// Runs `hook` on the loop thread at the very end of the teardown, after open
    /// subscriptions were completed and the unclosed ones reported (in the log): the last
    /// moment the loop logs. For a logger's owner that must know when nothing more comes.
    /// Returns false (and never runs it) once the final hooks have run.
    @discardableResult
    package func addFinalHook(_ hook: @escaping @Sendable () -> Void) -> Bool {
        finalHooks.withLock { hooks in
            guard var list = hooks else { return false }
            list.append(hook)
            hooks = list
            return true
        }
    }

    /// `addTeardownHook` for an owner that may go away before the loop does: the hook's id,
    /// to hand to `removeTeardownHook` then (so short-lived owners leave nothing behind), or
    /// nil if teardown has begun (the hook will never run).
    package func addRemovableTeardownHook(_ hook: @escaping @Sendable () -> Void) -> UInt64? {
        resources.addTeardownHook(hook)
    }

    /// Forgets a hook of `addRemovableTeardownHook` (any thread; nothing if it ran already).
    package func removeTeardownHook(_ id: UInt64) {
        resources.removeTeardownHook(id)
    }

    /// Teardown hooks recorded and not yet run or removed (tests).
    package var teardownHookCount: Int { resources.teardownHookCount }

    // MARK: - Time

    /// Monotonic time of this loop's clock (virtual with a `ManualClock`).
    @inlinable
    public var now: Duration {
        guard onSystemClock else { return manualNow }
        var now = timespec()
        clock_gettime(CLOCK_BOOTTIME, &now)
        // Nanoseconds in an Int64 last 292 years of uptime.
        return .nanoseconds(Int64(now.tv_sec) &* 1_000_000_000 &+ Int64(now.tv_nsec))
    }

    @usableFromInline var manualNow: Duration { timers.currentTime() }

    /// `now` in nanoseconds (what a hot path compares against a deadline it stored the same way).
    @inlinable
    package var nowNanoseconds: Int64 {
        guard onSystemClock else { return Self.nanoseconds(manualNow) }
        var now = timespec()
        clock_gettime(CLOCK_BOOTTIME, &now)
        return Int64(now.tv_sec) &* 1_000_000_000 &+ Int64(now.tv_nsec)
    }

    /// `duration` in nanoseconds (clamped to `Int64`; below a nanosecond dropped).
    @usableFromInline
    package static func nanoseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        let (whole, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return seconds < 0 ? .min : .max }
        let (total, overflowAgain) = whole.addingReportingOverflow(attoseconds / 1_000_000_000)
        if overflowAgain { return seconds < 0 ? .min : .max }
        return total
    }

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
        guard jobs.requestStop() else {
            throw LoopFlowError(.alreadyShutDown, "shutdown() was already called on '\(name)'")
        }

        switch mode {
        case .owned:
            finished.wait()
            pthread_join(thread, nil)
            return report
        case .borrowed:
            return ShutdownReport(unclosedSubscriptions: resources.openSubscriptionCount())
        }
    }

    /// Loop thread, once, after the batch that saw the stop request.
    private func teardown() {
        // From here nothing is accepted; what was accepted before still runs.
        jobs.stop()
        resources.close()
        jobs.runLastBatch()

        let completed = resources.tearDown()
        report = ShutdownReport(unclosedSubscriptions: completed)
        if completed > 0 {
            logger.warning(
                "event loop torn down with subscriptions that were never closed",
                metadata: ["loop": "\(name)", "unclosed": "\(completed)"])
        }
        for hook in finalHooks.withLock({ hooks in defer { hooks = nil }; return hooks ?? [] }) {
            hook()
        }

        // No sender claims a wake-up any more (teardown has begun); wait out the ones that
        // claimed it before and are about to send.
        jobs.waitForWakeSenders()
        jobs.withLock {
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
