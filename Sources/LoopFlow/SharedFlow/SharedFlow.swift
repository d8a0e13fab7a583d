import DequeModule

/// What an event flow does when its buffer is full.
public enum BufferOverflow: Sendable, Equatable {
    /// Drop the oldest buffered event to make room for the new one.
    case dropOldest
    /// Drop the new event; the buffered ones stay.
    case dropLatest
}

/// A read-only view of an event bus whose observers receive every event emitted after
/// they subscribed (Kotlin's `SharedFlow`), delivered on the loop thread.
///
/// - `replay`: a new subscriber first receives up to this many of the latest events.
/// - `bufferCapacity`: how many emitted events may wait for delivery to an observer.
///   Every observer of a flow is served in the same loop turn, so the wait is the same for
///   all of them: the buffer is kept once (one ring, a start position per observer), not
///   once per observer. When it is full, `overflow` decides which event is lost, and
///   `droppedEvents` counts it. Emitting never blocks.
/// - With no observers, events are only kept for replay; nothing is counted as dropped.
///   (A closed observer counts until the loop has released it, within a loop turn.)
/// - A newcomer's replay waits in its buffer like any event, as in kotlinx.coroutines
///   (where the replay cache is the head of the one buffer): until its first delivery, the
///   replayed events it has not received and the events emitted since it subscribed share
///   `bufferCapacity` (or `replay`, if larger: a replay is never cut by itself). When they
///   would exceed it, `.dropOldest` drops the oldest of them for
///   that newcomer — the replayed ones first — and `.dropLatest` refuses the new event (for
///   everyone, as a full buffer does). So `replay: 1, bufferCapacity: 1, .dropOldest` hands a
///   subscriber that joins just before an emit only the new event; with `bufferCapacity: 2`,
///   the replayed one and the new one. Each event lost so is counted in `droppedEvents`.
public class SharedFlow<Event: Sendable>: @unchecked Sendable {
    public let loop: EventLoop
    public let replay: Int
    public let bufferCapacity: Int
    public let overflow: BufferOverflow
    let core: FlowCore
    var lock: Lock { core.lock }

    struct Sequenced {
        let sequence: UInt64
        let event: Event
    }

    // Guarded by lock.
    @exclusivity(unchecked) var pending = Deque<Sequenced>()
    @exclusivity(unchecked) var replayBuffer = Deque<Sequenced>()
    @exclusivity(unchecked) var nextSequence: UInt64 = 0
    @exclusivity(unchecked) var dropped = 0
    /// The replay each subscriber admitted since the last snapshot gets first, by id (only
    /// when there is one), with the sequence the subscriber's live events start at.
    @exclusivity(unchecked) var backlogs: [UInt64: Backlog] = [:]

    struct Backlog {
        var events: Deque<Event>
        let start: UInt64
    }

    // Loop-confined.
    @exclusivity(unchecked) private var delivering = Deque<Sequenced>()
    @exclusivity(unchecked) private var deliveringBacklogs: [UInt64: Backlog] = [:]

    init(loop: EventLoop, replay: Int, bufferCapacity: Int, overflow: BufferOverflow) throws(LoopFlowError) {
        guard replay >= 0 else {
            throw LoopFlowError(.invalidConfiguration, "replay must not be negative, got \(replay)")
        }
        guard bufferCapacity >= 0 else {
            throw LoopFlowError(.invalidConfiguration, "bufferCapacity must not be negative, got \(bufferCapacity)")
        }
        guard bufferCapacity > 0 else {
            throw LoopFlowError(
                .invalidConfiguration,
                "overflow policy \(overflow) needs a buffer to drop from: bufferCapacity must be at least 1")
        }
        self.loop = loop
        self.replay = replay
        self.bufferCapacity = bufferCapacity
        self.overflow = overflow
        self.core = FlowCore(loop: loop, keepsCursors: true)
        core.source = self
        pending.reserveCapacity(bufferCapacity)
        delivering.reserveCapacity(bufferCapacity)
    }

    /// The events a new subscriber would be replayed, oldest first.
    public var replayCache: [Event] {
        lock.withLock { replayBuffer.map(\.event) }
    }

    /// Events lost to a full buffer since the flow was made.
    public var droppedEvents: Int {
        lock.withLock { dropped }
    }

    /// How many subscriptions are live, itself observable. Rises when `subscribe` returns;
    /// a closed subscription still counts until the loop has released it (within a loop
    /// turn of the close: retirement is batched).
    public var subscriptionCount: StateFlow<Int> { core.subscriptionCount() }

    /// Subscribes. `onEvent` receives the replayed events, then every event emitted after
    /// this call; `onError` / `onComplete` are terminal; `onRelease` runs exactly once after
    /// the last callback. All on the loop thread, never inside this call.
    ///
    /// - Throws: `loopShutDown` once the loop is shut down; none of the closures will run.
    public func subscribe(
        onEvent: @escaping @Sendable (Event) -> Void,
        onError: (@Sendable (any Error) -> Void)? = nil,
        onComplete: (@Sendable () -> Void)? = nil,
        onRelease: (@Sendable () -> Void)? = nil
    ) throws(LoopFlowError) -> FlowSubscription {
        try core.admit(
            .swift(onEvent), onError: onError, onComplete: onComplete, onRelease: onRelease,
            prepareLocked: prepareArrivalLocked)
    }

    /// Subscribes a C (FFI) observer: `callback` calls `function` with each event and
    /// `userdata`, as `onEvent` would be called. One `callback` serves every subscriber of
    /// its kind. The terminal and release closures are as for `subscribe(onEvent:...)`.
    public func subscribe(
        foreign callback: ForeignCallback<Event>,
        function: UnsafeRawPointer,
        userdata: UnsafeMutableRawPointer?,
        onError: (@Sendable (any Error) -> Void)? = nil,
        onComplete: (@Sendable () -> Void)? = nil,
        onRelease: (@Sendable () -> Void)? = nil
    ) throws(LoopFlowError) -> FlowSubscription {
        try core.admit(
            .foreign(callback, function: function, userdata: userdata),
            onError: onError, onComplete: onComplete, onRelease: onRelease, prepareLocked: prepareArrivalLocked)
    }

    /// Under the lock that orders emits, at admission: every event from here on is for the
    /// new subscriber, after the replay it gets first.
    private func prepareArrivalLocked(_ entry: SubscriberEntry, _ id: UInt64) {
        entry.cursor = nextSequence
        if !replayBuffer.isEmpty {
            // The replay waits in the subscriber's buffer like any event.
            backlogs[id] = Backlog(events: Deque(replayBuffer.map(\.event)), start: nextSequence)
        }
    }

    /// The events as an `AsyncSequence`. The consumer has a buffer of its own with this
    /// flow's capacity and overflow policy. Cancelling the task or dropping the iterator
    /// closes the subscription. A terminal error ends the sequence just as completion does:
    /// to tell them apart, iterate `throwingValues`.
    public var values: FlowValues<Event> {
        FlowValues(.bounded(bufferCapacity, overflow)) { [self] buffer in
            try subscribe(
                onEvent: { [weak buffer] in buffer?.push($0) },
                onError: { [weak buffer] in buffer?.finish(throwing: $0) },
                onComplete: { [weak buffer] in buffer?.finish() })
        }
    }

    /// `values`, but a terminal error is thrown (after the events before it); completion and
    /// cancellation end it without one.
    public var throwingValues: ThrowingFlowValues<Event> { ThrowingFlowValues(values: values) }

}

extension SharedFlow: DeliverySource {
    func takeSnapshotLocked() {
        swap(&pending, &delivering)
        if !backlogs.isEmpty {
            swap(&backlogs, &deliveringBacklogs)
        }
    }

    func broadcast() {
        // Newcomers first get their replay, then the live events from their start on.
        let usual = core.usualInvoker
        if !deliveringBacklogs.isEmpty {
            core.forEachNewcomer { newcomer in
                guard let backlog = deliveringBacklogs[newcomer.id] else { return }
                for event in backlog.events where newcomer.isOpen {
                    withValueAddress(event) { callSubscriber(newcomer, event, at: $0, usualInvoker: usual) }
                }
            }
            deliveringBacklogs.removeAll()
        }
        for item in delivering {
            withValueAddress(item.event) { address in
                var walk = core.live(stride: SubscriberEntry.sequencedStride)
                while let subscriber = walk.next() {
                    if item.sequence >= subscriber.cursor {
                        callSubscriber(subscriber, item.event, at: address, usualInvoker: usual)
                    }
                }
            }
        }
        delivering.removeAll(keepingCapacity: true)
    }
}

/// The event bus you emit into.
public final class MutableSharedFlow<Event: Sendable>: SharedFlow<Event>, @unchecked Sendable {
    /// - Parameters:
    ///   - loop: the loop whose thread delivers the events.
    ///   - replay: how many of the latest events a new subscriber receives first (≥ 0).
    ///   - bufferCapacity: how many events may wait for delivery (≥ 1).
    ///   - overflow: which event is lost when the buffer is full.
    /// - Throws: `invalidConfiguration` for a negative size or a buffer of 0.
    public init(
        on loop: EventLoop,
        replay: Int = 0,
        bufferCapacity: Int = 64,
        overflow: BufferOverflow = .dropOldest
    ) throws(LoopFlowError) {
        try super.init(loop: loop, replay: replay, bufferCapacity: bufferCapacity, overflow: overflow)
    }

    /// Emits `event` to every current observer, from any thread, without waiting.
    /// Returns false if the event was dropped (`.dropLatest` with a full buffer) or the
    /// flow has finished.
    @discardableResult
    public func emit(_ event: Event) -> Bool {
        var evicted: (Sequenced?, Sequenced?) = (nil, nil)  // released after unlocking
        let (accepted, post): (Bool, Bool) = core.lock.withLock {
            guard !core.isFinished else { return (false, false) }
            let listening = core.liveCount > 0
            if listening && pending.count >= bufferCapacity {
                dropped += 1
                switch overflow {
                case .dropOldest:
                    evicted.0 = pending.removeFirst()
                case .dropLatest:
                    return (false, false)
                }
            }
            if listening && !backlogs.isEmpty && !makeRoomInBacklogsLocked() { return (false, false) }
            let item = Sequenced(sequence: nextSequence, event: event)
            nextSequence += 1
            if replay > 0 {
                if replayBuffer.count == replay { evicted.1 = replayBuffer.removeFirst() }
                replayBuffer.append(item)
            }
            guard listening else { return (true, false) }
            pending.append(item)
            return (true, core.claimDeliveryLocked())
        }
        withExtendedLifetime(evicted) {}
        if post { core.postDelivery() }
        return accepted
    }

    /// Under the lock, before an event is added: newcomers whose replay and live events would
    /// exceed `bufferCapacity` with it. `.dropOldest` drops their oldest replayed event;
    /// `.dropLatest` refuses the new one (false). Only while a newcomer waits for its first
    /// delivery (`backlogs` is empty otherwise).
    private func makeRoomInBacklogsLocked() -> Bool {
        for id in backlogs.keys {
            guard let backlog = backlogs[id], !backlog.events.isEmpty else { continue }
            let live = min(pending.count, Int(nextSequence - backlog.start))
            guard backlog.events.count + live + 1 > max(bufferCapacity, replay) else { continue }
            switch overflow {
            case .dropOldest:
                backlogs[id]!.events.removeFirst()
                dropped += 1
            case .dropLatest:
                dropped += 1
                return false
            }
        }
        return true
    }

    /// Ends the flow: observers receive the events still buffered, then `onComplete`, or
    /// `onError(error)`. Later subscribers receive the replay and the same terminal
    /// callback. Later emits are refused. Returns false if already finished.
    @discardableResult
    public func finish(throwing error: (any Error)? = nil) -> Bool {
        let post = lock.withLock { core.finishLocked(error: error) }
        guard let post else { return false }
        if post { core.postDelivery() }
        return true
    }

    /// This flow, read-only.
    public func asSharedFlow() -> SharedFlow<Event> { self }
}
