/// A read-only view of a value that always exists and that observers follow on the
/// loop thread (Kotlin's `StateFlow`).
///
/// - `value` is readable from any thread.
/// - A new subscriber first receives the current value, then each change.
/// - Observers are conflated: one that cannot keep up skips intermediate values but
///   always ends on the latest one.
/// - Distinct: an observer is never handed a value equal to the last one it received
///   (A→B→A set before it runs delivers nothing).
public class StateFlow<Value: Sendable & Equatable>: @unchecked Sendable {
    public let loop: EventLoop
    let core: FlowCore<StateSubscription<Value>>
    var lock: Lock { core.lock }

    /// Guarded by `lock`.
    var current: Value

    // Loop-confined.
    private var lastBroadcast: Value?
    private var epoch: UInt64 = 0

    init(_ initial: Value, on loop: EventLoop) {
        self.loop = loop
        self.current = initial
        self.core = FlowCore(loop: loop)
        core.source = self
    }

    /// The current value. Any thread.
    public var value: Value {
        lock.withLock { current }
    }

    /// How many subscriptions are live, itself observable.
    public var subscriptionCount: StateFlow<Int> { core.subscriptionCount() }

    /// Subscribes. `onState` first receives the current value, then each distinct change;
    /// `onError` / `onComplete` are terminal (at most one, once); `onRelease` runs exactly
    /// once after the last callback. All of them run on the loop thread, never inside
    /// this call.
    ///
    /// - Throws: `loopShutDown` once the loop is shut down; none of the closures will run.
    public func subscribe(
        onState: @escaping @Sendable (Value) -> Void,
        onError: (@Sendable (any Error) -> Void)? = nil,
        onComplete: (@Sendable () -> Void)? = nil,
        onRelease: (@Sendable () -> Void)? = nil
    ) throws(LoopFlowError) -> FlowSubscription {
        let subscription = StateSubscription(
            loop: loop, owner: core, onState: onState,
            onError: onError, onComplete: onComplete, onRelease: onRelease)
        try core.admit(subscription, deliveringWith: self)
        return subscription
    }

    /// The values as an `AsyncSequence`: the current one first, then each distinct change,
    /// conflated to the latest for a consumer that falls behind. Cancelling the task or
    /// dropping the iterator closes the subscription. A terminal error ends the sequence.
    public var values: FlowValues<Value> {
        FlowValues(.latestDistinct, isEqual: { $0 == $1 }) { [self] buffer in
            try subscribe(
                onState: { [weak buffer] in buffer?.push($0) },
                onError: { [weak buffer] _ in buffer?.finish() },
                onComplete: { [weak buffer] in buffer?.finish() })
        }
    }
}

extension StateFlow: DeliverySource {
    func deliver() {
        loop.assertInEventLoop()
        lock.lock()
        let value = current
        let terminal = core.beginDeliveryLocked()
        lock.unlock()

        core.registerArrivals()
        loop.beginWalk(ObjectIdentifier(core))
        defer { loop.endWalk() }
        if epoch == 0 || lastBroadcast != value {
            // A new value: everyone registered gets it, newcomers included.
            epoch &+= 1
            lastBroadcast = value
            // The slots do not change during a walk (arrivals register before it, removals
            // happen in retire jobs), so the buffer can be walked without retaining each one.
            let epoch = self.epoch
            core.slots.elements.withUnsafeBufferPointer { subscriptions in
                for subscription in subscriptions {
                    subscription.seenEpoch = epoch
                    subscription.deliver(value)
                }
            }
        } else {
            // The value everyone already has: only newcomers get it.
            core.forEachNewcomer { subscription in
                guard subscription.seenEpoch != epoch else { return }
                subscription.seenEpoch = epoch
                subscription.deliver(value)
            }
        }
        core.endDelivery(terminal: terminal)
    }
}

/// The read-write state flow.
public final class MutableStateFlow<Value: Sendable & Equatable>: StateFlow<Value>, @unchecked Sendable {
    /// A flow holding `initial`, delivering on `loop`.
    public override init(_ initial: Value, on loop: EventLoop) {
        super.init(initial, on: loop)
    }

    /// The current value. Setting is safe from any thread and never waits for observers;
    /// setting a value equal to the current one does nothing. Ignored once finished.
    public override var value: Value {
        get { lock.withLock { current } }
        set { _ = set(newValue, ifCurrentIs: nil) }
    }

    /// Sets `update` if the current value equals `expect`, atomically. Returns whether the
    /// current value was `expect` (an equal `update` then changes nothing and notifies no
    /// one). False once the flow has finished.
    ///
    /// `Value`'s `==` runs under the flow's lock (as in Kotlin): it must not use this flow.
    @discardableResult
    public func compareAndSet(expect: Value, update: Value) -> Bool {
        set(update, ifCurrentIs: expect) == .set
    }

    private enum SetOutcome {
        case set, mismatch, finished
    }

    /// One short critical section (compare, store, mark dirty once), then at most one post.
    private func set(_ update: Value, ifCurrentIs expect: Value?) -> SetOutcome {
        // The replaced value is handed out of the critical section, so its deinit (user
        // code) never runs under the lock.
        let (outcome, post, replaced): (SetOutcome, Bool, Value?) = lock.withLock {
            guard core.terminal == nil else { return (.finished, false, nil) }
            if let expect, current != expect { return (.mismatch, false, nil) }
            guard current != update else { return (.set, false, nil) }
            let replaced = current
            current = update
            // No one to tell: a later subscriber's own delivery hands it the value.
            guard core.liveCount > 0 else { return (.set, false, replaced) }
            return (.set, core.claimDeliveryLocked(), replaced)
        }
        withExtendedLifetime(replaced) {}
        if post { core.postDelivery(self) }
        return outcome
    }

    /// Replaces the value with `transform(value)`, atomically: under contention the
    /// transform may run more than once (like Kotlin's `update`), so keep it pure.
    /// Returns the value it set; once the flow has finished, changes nothing and returns
    /// the final value.
    @discardableResult
    public func update(_ transform: (Value) throws -> Value) rethrows -> Value {
        while true {
            let previous = value
            let next = try transform(previous)
            switch set(next, ifCurrentIs: previous) {
            case .set: return next
            case .finished: return value
            case .mismatch: continue
            }
        }
    }

    /// Ends the flow: every subscriber receives the latest value (if it had not yet),
    /// then `onComplete`, or `onError(error)` when an error is given. Later subscribers
    /// receive the last value and the same terminal callback. Later sets are ignored.
    /// Returns false if the flow had already finished.
    @discardableResult
    public func finish(throwing error: (any Error)? = nil) -> Bool {
        let post = lock.withLock { core.finishLocked(error: error) }
        guard let post else { return false }
        if post { core.postDelivery(self) }
        return true
    }

    /// This flow, read-only.
    public func asStateFlow() -> StateFlow<Value> { self }
}

/// How a flow ended.
struct FlowTerminal: @unchecked Sendable {
    /// nil: completed normally.
    let error: (any Error)?
}

/// A `StateFlow` subscriber.
final class StateSubscription<Value: Sendable>: FlowSubscription, @unchecked Sendable {
    private let onState: @Sendable (Value) -> Void
    /// Loop-confined: the broadcast this subscriber last received.
    var seenEpoch: UInt64 = 0

    init(
        loop: EventLoop, owner: any SubscriptionOwner,
        onState: @escaping @Sendable (Value) -> Void,
        onError: (@Sendable (any Error) -> Void)?,
        onComplete: (@Sendable () -> Void)?,
        onRelease: (@Sendable () -> Void)?
    ) {
        self.onState = onState
        super.init(loop: loop, owner: owner, onError: onError, onComplete: onComplete, onRelease: onRelease)
    }

    @inline(__always)
    func deliver(_ value: Value) {
        if isOpen {
            onState(value)
        }
    }
}
