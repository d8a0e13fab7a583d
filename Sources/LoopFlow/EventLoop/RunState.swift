/// Whether a loop takes work, and whether a wake-up is on its way: a pure value with no
/// locks and no IO (swift-async-algorithms' `ChannelStateMachine` shape). `JobQueue` holds
/// it under its lock; each `mutating` transition returns what the queue must do, and the
/// queue does it after unlocking.
///
/// Phases, in the only order they come:
/// - `running`: everything is accepted;
/// - `stopRequested`: `shutdown()` was called; public work is refused, internal
///   bookkeeping (a flow's delivery, a subscription's retirement) still lands, and the loop
///   tears down after the batch that sees the request;
/// - `stopped`: teardown has begun; nothing is accepted from anyone.
struct RunState: Equatable, Sendable {
    enum Phase: Equatable, Sendable {
        case running
        case stopRequested
        case stopped
    }

    private(set) var phase: Phase
    /// A wake-up was claimed and the loop has not yet taken the batch it announces: later
    /// posts ride on it (many posts, one `uv_async_send`).
    private(set) var wakePending: Bool

    init(phase: Phase = .running, wakePending: Bool = false) {
        self.phase = phase
        self.wakePending = wakePending
    }

    /// Public work (execute, subscribe, timers) is accepted.
    var acceptsWork: Bool { phase == .running }

    /// What a post must do.
    enum EnqueueAction: Equatable, Sendable {
        /// Append the job; if `wake`, send the wake-up after unlocking.
        case append(wake: Bool)
        /// Refuse: the loop is shut down.
        case refuse
    }

    /// A job is posted. `internal` jobs are still taken after a stop request.
    mutating func enqueue(isInternal: Bool) -> EnqueueAction {
        switch phase {
        case .running:
            break
        case .stopRequested where isInternal:
            break
        case .stopRequested, .stopped:
            return .refuse
        }
        return .append(wake: claimWake())
    }

    /// What `shutdown()` must do.
    enum StopAction: Equatable, Sendable {
        /// The request is recorded; if `wake`, wake the loop so that it tears down.
        case stop(wake: Bool)
        /// `shutdown()` was called before.
        case alreadyStopping
    }

    /// `shutdown()` was called.
    mutating func requestStop() -> StopAction {
        guard phase == .running else { return .alreadyStopping }
        phase = .stopRequested
        return .stop(wake: claimWake())
    }

    /// What the loop does with the batch it takes.
    enum BatchAction: Equatable, Sendable {
        case run
        /// Run it, then tear down (a stop was requested).
        case runThenTearDown
    }

    /// The loop woke up and takes everything queued: the next post needs a new wake-up.
    mutating func takeBatch() -> BatchAction {
        wakePending = false
        return phase == .stopRequested ? .runThenTearDown : .run
    }

    /// Teardown begins: from here nothing is accepted. Returns false (and changes nothing)
    /// unless a stop was requested and teardown had not begun.
    mutating func beginTeardown() -> Bool {
        guard phase == .stopRequested else { return false }
        phase = .stopped
        return true
    }

    /// Whether the caller must send the wake-up: once per batch.
    private mutating func claimWake() -> Bool {
        guard !wakePending else { return false }
        wakePending = true
        return true
    }
}
