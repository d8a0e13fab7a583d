import LoopFlow

#if canImport(Glibc)
import Glibc
#endif

/// The session's store I/O worker: the only way the session reaches its `CredentialStore`.
///
/// - **One serial thread per session**, of its own (not libuv's threadpool: that pool has four
///   threads shared by every loop and every `uv_fs_*`/DNS job of the process, so a store call
///   waiting seconds for another process's write lock would hold one of them, and jobs on the
///   pool are not ordered). The thread is started when work arrives and exits when the queue
///   is empty: an idle session has no thread, and a session that is dropped leaves none.
/// - **In order**: jobs run one at a time in the order they were submitted, so writes land in
///   the order the session made them, a lease is released after the write that stored the
///   rotated tokens, and a read sees every write submitted before it.
/// - **Coalescing**: a save that would follow a save still waiting in the queue *for the same
///   account* replaces it (only the last state matters), and a clear replaces a waiting
///   clear. Nothing else is merged: a clear and a write are never merged or reordered (the
///   file store keys records by account: a write cannot stand for the clear of the account
///   before it), nor is a save merged past a read or a lease job.
/// - **Answers on the loop**: each job's result is handed to `done` on the loop thread, as a
///   job of its own (`EventLoop.execute`). If the loop is gone, the answer is dropped.
/// - A store whose `callsMayBlock` is false (`MemoryCredentialStore`) is called inline on the
///   submitting (loop) thread and answers inline: no thread, and virtual-time tests stay
///   deterministic.
///
/// In debug builds every call of a blocking store checks that it is not on the loop thread.
/// Submitting is loop-confined except `readAndWait` (off the loop).
final class StoreWorker: @unchecked Sendable {
    let loop: EventLoop
    /// The store is called inline (it never blocks).
    let inline: Bool

    private enum Job {
        /// Write (or clear, when nil) to the store that was the target when it was submitted.
        case save(StoredSession?, any CredentialStore, done: @Sendable (StoreError?) -> Void)
        case other(@Sendable () -> Void)
    }

    private let lock = Lock()
    /// Where jobs go: the session's store, or — in a store of several accounts — the record of
    /// the account the session is signed in to (`retarget`). Each job keeps the target it was
    /// submitted with: a clear submitted before a retarget clears the old account's record.
    private var target: any CredentialStore
    private var queue: [Job] = []
    private var running = false
    /// Every job ever queued (a count): whether any was submitted since a moment.
    private var queued: UInt64 = 0
    /// For tests: how many saves were merged into one still waiting.
    private var coalescedSaves = 0

    init(store: any CredentialStore, loop: EventLoop) {
        self.target = store
        self.loop = loop
        self.inline = !store.callsMayBlock
    }

    /// The store jobs submitted from now on go to.
    var store: any CredentialStore { lock.withLock { target } }

    /// Sends the jobs submitted from now on to `store` (jobs already waiting keep theirs).
    /// Loop thread.
    func retarget(_ store: any CredentialStore) {
        lock.withLock { target = store }
    }

    /// For tests: how many saves were merged into a save still waiting.
    var coalesced: Int { lock.withLock { coalescedSaves } }

    /// How many jobs were ever queued (merged saves not counted): compared before and after,
    /// whether anything was submitted in between.
    var jobsQueued: UInt64 { lock.withLock { queued } }

    // MARK: - Jobs

    /// Writes `session` (or clears the store, for nil); `done` gets the failure, if any.
    /// Returns false when the save was merged into one still waiting (whose `done` it takes
    /// over: the merged save's own `done` is never called).
    /// - Parameter explicitTarget: the store to save to instead of the current target (a
    ///   record the session no longer keeps, cleared again after a failed clear).
    @discardableResult
    func save(
        _ session: StoredSession?, to explicitTarget: (any CredentialStore)? = nil,
        done: @escaping @Sendable (StoreError?) -> Void
    ) -> Bool {
        if inline {
            done(Self.save(session, to: explicitTarget ?? store))
            return true
        }
        let merged = lock.withLock { () -> Bool in
            let target = explicitTarget ?? target
            guard case .save(let waiting, let waitingTarget, _) = queue.last, waitingTarget === target,
                Self.supersedes(session, waiting)
            else { return false }
            queue[queue.count - 1] = .save(session, target, done: done)
            coalescedSaves += 1
            return true
        }
        if merged { return false }
        enqueue { .save(session, explicitTarget ?? $0, done: done) }
        return true
    }

    /// Runs `work` with the store on the worker, then `done` with its result on the loop.
    func submit<T: Sendable>(
        _ work: @escaping @Sendable (any CredentialStore) -> T, done: @escaping @Sendable (T) -> Void
    ) {
        if inline {
            done(work(store))
            return
        }
        enqueue { store in
            .other { [self] in
                checkOffLoop()
                let result = work(store)
                deliver { done(result) }
            }
        }
    }

    /// Reads the store on the worker, then `done` on the loop.
    func read(done: @escaping @Sendable (StoreRead) -> Void) {
        submit({ $0.read() }, done: done)
    }

    /// Calls `body` once every job submitted before has run and delivered its answer: on the
    /// loop thread, or — when the loop is gone — on the worker thread (so a caller waiting
    /// for it is never left waiting).
    func afterPendingWork(_ body: @escaping @Sendable () -> Void) {
        if inline {
            body()
            return
        }
        enqueue { _ in
            .other { [self] in
                do {
                    try loop.execute(body)
                } catch {
                    body()
                }
            }
        }
    }

    /// Waits until every job submitted before has run (its answer may still be on its way to
    /// the loop). Off the loop thread only: for a host that lets go of the session (an owned
    /// runtime's destroy) and must know its last write landed before the process exits.
    func waitUntilIdle() {
        if inline { return }
        precondition(!loop.inEventLoop, "waitUntilIdle on the loop thread")
        let done = Latch()
        enqueue { _ in .other { done.signal() } }
        done.wait()
    }

    /// Reads the store on the worker and waits for the answer. Off the loop thread only (the
    /// session's creation on a thread other than the loop's).
    func readAndWait() -> StoreRead {
        performAndWait { $0.read() }
    }

    /// Runs `work` with the store on the worker and waits for its result. Off the loop thread
    /// only (a session made on a thread other than the loop's).
    func performAndWait<T: Sendable>(_ work: @escaping @Sendable (any CredentialStore) -> T) -> T {
        if inline { return work(store) }
        precondition(!loop.inEventLoop, "a store call waited for on the loop thread")
        let done = Latch()
        let answer = LockedBox<T?>(nil)
        enqueue { store in
            .other { [self] in
                checkOffLoop()
                let result = work(store)
                answer.withLockedValue { $0 = result }
                done.signal()
            }
        }
        done.wait()
        return answer.withLockedValue { $0 }!
    }

    // MARK: - The thread

    /// Queues the job made for the current target.
    private func enqueue(_ job: (any CredentialStore) -> Job) {
        let start = lock.withLock { () -> Bool in
            queue.append(job(target))
            queued += 1
            if running { return false }
            running = true
            return true
        }
        if start { startThread() }
    }

    private func startThread() {
        let context = Unmanaged.passRetained(self).toOpaque()
        var thread = pthread_t()
        let created = pthread_create(&thread, nil, storeWorkerMain, context)
        precondition(created == 0, "pthread_create failed: \(created)")
        pthread_detach(thread)
    }

    fileprivate func runJobs() {
        while true {
            let job = lock.withLock { () -> Job? in
                guard !queue.isEmpty else {
                    running = false
                    return nil
                }
                return queue.removeFirst()
            }
            switch job {
            case nil:
                return
            case .save(let session, let store, let done):
                checkOffLoop()
                let failure = Self.save(session, to: store)
                deliver { done(failure) }
            case .other(let work):
                work()
            }
            // The job's frames held tokens and keys (the store's plaintext, its cipher):
            // gone from this thread's stack before the next job, or the thread's end.
            scrubStack(bytes: 128 * 1024)
        }
    }

    private func deliver(_ answer: @escaping @Sendable () -> Void) {
        // The loop is gone: the session is closed and wants no answer.
        try? loop.execute(answer)
    }

    /// The rule this whole type exists for.
    private func checkOffLoop() {
        assert(!loop.inEventLoop, "a blocking store call on the loop thread of '\(loop.name)'")
    }

    private static func save(_ session: StoredSession?, to store: any CredentialStore) -> StoreError? {
        do {
            if let session {
                try store.write(session)
            } else {
                try store.clear()
            }
            return nil
        } catch {
            return error
        }
    }

    /// Whether saving `next` right after `waiting` makes `waiting` pointless: two clears, or
    /// two writes of the same account (the file store keys its records by member id).
    static func supersedes(_ next: StoredSession?, _ waiting: StoredSession?) -> Bool {
        switch (next, waiting) {
        case (nil, nil): true
        case (let next?, let waiting?): next.memberID == waiting.memberID
        default: false
        }
    }
}

private func storeWorkerMain(_ context: UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? {
    let worker = Unmanaged<StoreWorker>.fromOpaque(context!).takeRetainedValue()
    worker.runJobs()
    return nil
}
