import CLibUV
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The loop's cross-thread work: one locked queue, the wake-up that announces it, and the
/// batches the loop thread runs from it. What to accept and when to wake is decided by a
/// `RunState` held under the lock; the wake-up is sent after unlocking (so the woken loop
/// never finds the lock held by a sender inside `write`).
///
/// Each wake-up takes the whole queue as one batch, so many posts cost one wake-up.
///
/// Hot state is `@exclusivity(unchecked)`: guarded by `lock` or confined to the loop thread
/// (see FlowCore for the measured reason).
final class JobQueue: @unchecked Sendable {
    private let lock = Lock()
    /// The loop's `uv_async_t`, made and closed by `EventLoop`; only sent here.
    private let wakeHandle: UnsafeMutablePointer<uv_async_t>

    // Guarded by lock.
    @exclusivity(unchecked) private var queue: [Job] = []
    @exclusivity(unchecked) private var state = RunState()
    /// `state.acceptsWork`, readable without the lock (subscribe's early check).
    private let accepting = Atomic<Bool>(true)
    /// Bounded jobs (`Job.bounded`) queued or in the batch being run, not yet run; at most
    /// `boundedLimit` (checked and raised under the lock, lowered by the loop as each runs).
    private let boundedPending = Atomic<Int>(0)
    /// The most bounded jobs that may be pending at once.
    let boundedLimit: Int
    /// Senders that claimed the wake-up under the lock and send it after releasing it.
    /// Teardown waits for them before the handle is closed.
    private let wakeSenders = Atomic<Int>(0)

    // Loop-confined.
    @exclusivity(unchecked) private var batch: [Job] = []
    @exclusivity(unchecked) private var batchIndex = 0

    init(wakeHandle: UnsafeMutablePointer<uv_async_t>, boundedLimit: Int) {
        self.wakeHandle = wakeHandle
        self.boundedLimit = boundedLimit
    }

    /// What became of a bounded job.
    enum BoundedOutcome {
        case accepted
        /// The run state refuses work (shut down).
        case refused
        /// `boundedLimit` bounded jobs are pending already.
        case full
    }

    /// Bounded jobs pending now (queued or in the batch being run).
    var boundedPendingCount: Int { boundedPending.load(ordering: .relaxed) }

    /// Whether public work is still accepted.
    var acceptsWork: Bool { accepting.load(ordering: .acquiring) }

    // MARK: Any thread

    /// Appends `job` and wakes the loop once per batch. Returns false if the run state
    /// refuses it (the job is then dropped unrun).
    func enqueue(_ job: Job, isInternal: Bool) -> Bool {
        lock.lock()
        switch state.enqueue(isInternal: isInternal) {
        case .refuse:
            lock.unlock()
            return false
        case .append(let wake):
            queue.append(job)
            if wake { wakeSenders.wrappingAdd(1, ordering: .relaxed) }
            lock.unlock()
            if wake { sendWake() }
            return true
        }
    }

    /// Appends `body` as a bounded job unless `boundedLimit` of them are pending: the check
    /// and the count are made under the lock, so the limit is never passed.
    func enqueueBounded(_ body: @escaping @Sendable () -> Void) -> BoundedOutcome {
        lock.lock()
        guard boundedPending.load(ordering: .relaxed) < boundedLimit else {
            // Only a running queue can be full; a refusing one says so first.
            let refusing = !accepting.load(ordering: .relaxed)
            lock.unlock()
            return refusing ? .refused : .full
        }
        switch state.enqueue(isInternal: false) {
        case .refuse:
            lock.unlock()
            return .refused
        case .append(let wake):
            boundedPending.wrappingAdd(1, ordering: .relaxed)
            queue.append(.bounded(body))
            if wake { wakeSenders.wrappingAdd(1, ordering: .relaxed) }
            lock.unlock()
            if wake { sendWake() }
            return .accepted
        }
    }

    /// Records a stop request and wakes the loop to act on it. Returns false if one was
    /// recorded before.
    func requestStop() -> Bool {
        lock.lock()
        switch state.requestStop() {
        case .alreadyStopping:
            lock.unlock()
            return false
        case .stop(let wake):
            accepting.store(false, ordering: .releasing)
            if wake { wakeSenders.wrappingAdd(1, ordering: .relaxed) }
            lock.unlock()
            if wake { sendWake() }
            return true
        }
    }

    /// After a claim, without the lock.
    private func sendWake() {
        uv_async_send(wakeHandle)
        wakeSenders.wrappingSubtract(1, ordering: .releasing)
    }

    // MARK: Loop thread

    /// Runs everything queued as one batch. Returns whether the loop must now tear down.
    func runNextBatch() -> Bool {
        lock.lock()
        swap(&queue, &batch)
        let action = state.takeBatch()
        lock.unlock()
        runBatch()
        return action == .runThenTearDown
    }

    /// Teardown begins: nothing is accepted from here on. Takes what was accepted before
    /// as the last batch, for `runLastBatch()`.
    func stop() {
        lock.lock()
        let began = state.beginTeardown()
        accepting.store(false, ordering: .releasing)
        swap(&queue, &batch)
        lock.unlock()
        precondition(began, "teardown without a stop request")
    }

    /// After `stop()`: runs the work accepted before it.
    func runLastBatch() {
        runBatch()
    }

    /// After `stop()`: returns once no sender is between its claim and its
    /// `uv_async_send` (none can claim any more), so the wake-up handle can be closed.
    func waitForWakeSenders() {
        while wakeSenders.load(ordering: .acquiring) > 0 { sched_yield() }
    }

    /// Runs `body` under the queue's lock (closing the handle orders after the last send).
    func withLock<T>(_ body: () -> T) -> T {
        lock.withLock(body)
    }

    /// Whether jobs are waiting to run — later in the batch being run, or queued for the
    /// next one. (Virtual time lets them run before it moves on.)
    var hasQueuedJobs: Bool {
        batchIndex + 1 < batch.count || lock.withLock { !queue.isEmpty }
    }

    private func runBatch() {
        batchIndex = 0
        while batchIndex < batch.count {
            switch batch[batchIndex] {
            case .run(let body):
                body()
            case .bounded(let body):
                body()
                boundedPending.wrappingSubtract(1, ordering: .relaxed)
            case .deliver(let core):
                // The core holds its flow (which holds the core) until the delivery is
                // over; the flow is let go after the call, not inside it.
                let flow = core._withUnsafeGuaranteedRef { $0.deliver() }
                withExtendedLifetime(flow) {}
            case .retire(let core):
                core.retireClosed()
            }
            batchIndex += 1
        }
        batch.removeAll(keepingCapacity: true)
    }
}
