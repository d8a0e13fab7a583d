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
    @usableFromInline let core: FlowCore
    var lock: Lock { core.lock }

    /// Guarded by `lock`.
    @usableFromInline @exclusivity(unchecked) var current: Value

    // Loop-confined. `lastBroadcast` means something once `epoch` > 0. (Not an Optional:
    // in this unspecialized generic code every Optional<Value> costs a metadata lookup.)
    /// The value the delivery under way hands out (taken under the lock).
    @exclusivity(unchecked) private var snapshot: Value
    @exclusivity(unchecked) private var lastBroadcast: Value
    @exclusivity(unchecked) private var epoch: UInt64 = 0

    init(_ initial: Value, on loop: EventLoop) {
        self.loop = loop
        self.current = initial
        self.snapshot = initial
        self.lastBroadcast = initial
        self.core = FlowCore(loop: loop, admitsLocally: true)
        core.source = self
    }

    /// The current value. Any thread.
    public var value: Value {
        core.lock.withLock { current }
    }

    /// How many subscriptions are live, itself observable. Rises when `subscribe` returns;
    /// a closed subscription still counts until the loop has released it (within a loop
    /// turn of the close: retirement is batched).
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
        let callback = AdmittedCallback.swift(onState)
        if onError == nil && onComplete == nil && onRelease == nil,
            let subscription = core.admitIntoSpare(words: callback.words)
        {
            return subscription
        }
        return try core.admit(callback, onError: onError, onComplete: onComplete, onRelease: onRelease)
    }

    /// Subscribes a C (FFI) observer: `callback` calls `function` with each value and
    /// `userdata`, as `onState` would be called (the current value first, then each distinct
    /// change, on the loop thread). One `callback` serves every subscriber of its kind: the
    /// subscriber itself costs no Swift closure. The terminal and release closures are as
    /// for `subscribe(onState:...)`.
    public func subscribe(
        foreign callback: ForeignCallback<Value>,
        function: UnsafeRawPointer,
        userdata: UnsafeMutableRawPointer?,
        onError: (@Sendable (any Error) -> Void)? = nil,
        onComplete: (@Sendable () -> Void)? = nil,
        onRelease: (@Sendable () -> Void)? = nil
    ) throws(LoopFlowError) -> FlowSubscription {
        try core.admit(
            .foreign(callback, function: function, userdata: userdata),
            onError: onError, onComplete: onComplete, onRelease: onRelease)
    }

    /// The values as an `AsyncSequence`: the current one first, then each distinct change,
    /// conflated to the latest for a consumer that falls behind. Cancelling the task or
    /// dropping the iterator closes the subscription. A terminal error ends the sequence just
    /// as completion does: to tell them apart, iterate `throwingValues`.
    public var values: FlowValues<Value> {
        FlowValues(.latestDistinct, isEqual: { $0 == $1 }) { [self] buffer in
            try subscribe(
                onState: { [weak buffer] in buffer?.push($0) },
                onError: { [weak buffer] in buffer?.finish(throwing: $0) },
                onComplete: { [weak buffer] in buffer?.finish() })
        }
    }

    /// `values`, but a terminal error is thrown (after the values before it); completion and
    /// cancellation end it without one.
    public var throwingValues: ThrowingFlowValues<Value> { ThrowingFlowValues(values: values) }
}

extension StateFlow: DeliverySource {
    func takeSnapshotLocked() {
        snapshot = current
    }

    func broadcast() {
        let value = snapshot
        if epoch == 0 || lastBroadcast != value {
            // A new value: everyone registered gets it, newcomers included.
            epoch &+= 1
            lastBroadcast = value
            // Records are not released during a walk (arrivals register before it, releases
            // happen in retire jobs), so they are walked in place, read-only: a walk over a
            // million records writes none of their cache lines.
            let usual = core.usualInvoker
            withValueAddress(value) { address in
                var walk = core.live(stride: SubscriberEntry.valueStride)
                while let subscriber = walk.next() {
                    callSubscriber(subscriber, value, at: address, usualInvoker: usual)
                }
            }
        } else {
            // The value everyone already has: only newcomers get it (each is a newcomer in
            // exactly one delivery, so none of them has it yet).
            let usual = core.usualInvoker
            withValueAddress(value) { address in
                core.forEachNewcomer { subscriber in
                    callSubscriber(subscriber, value, at: address, usualInvoker: usual)
                }
            }
        }
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
    ///
    /// Inlinable, like `compareAndSet` and `update`: specialized for `Value` in the caller, a
    /// set costs what the lock costs (unspecialized, its compare, copy and swap of a generic
    /// value went through the type's witnesses: ~40 ns of a ~70 ns set, by perf).
    @inlinable
    public override var value: Value {
        get {
            core.lock.lock()
            defer { core.lock.unlock() }
            return current
        }
        set { _ = set(newValue, ifCurrentIs: newValue, compare: false) }
    }

    /// Sets `update` if the current value equals `expect`, atomically. Returns whether the
    /// current value was `expect` (an equal `update` then changes nothing and notifies no
    /// one). False once the flow has finished.
    ///
    /// `Value`'s `==` runs under the flow's lock (as in Kotlin): it must not use this flow.
    @inlinable @discardableResult
    public func compareAndSet(expect: Value, update: Value) -> Bool {
        set(update, ifCurrentIs: expect, compare: true) == .set
    }

    /// One short critical section (compare, store, mark dirty once), then at most one post.
    /// Written without Optionals, tuples or nested types of `Value`: where it runs
    /// unspecialized, each of those costs a runtime metadata lookup on every set.
    @inlinable
    final func set(_ update: Value, ifCurrentIs expect: Value, compare: Bool) -> SetOutcome {
        // `core.lock` each time, not a local: a local copy of the reference is a retain and a
        // release per set, on a count every producer thread shares.
        core.lock.lock()
        guard !core.isFinished else {
            core.lock.unlock()
            return .finished
        }
        if compare && current != expect {
            core.lock.unlock()
            return .mismatch
        }
        guard current != update else {
            core.lock.unlock()
            return .set
        }
        // The replaced value leaves the critical section in `replaced`, so its deinit (user
        // code) never runs under the lock.
        var replaced = update
        swap(&current, &replaced)
        // No one to tell: a later subscriber's own delivery hands it the value.
        let post = core.liveCount > 0 && core.claimDeliveryLocked()
        core.lock.unlock()
        withExtendedLifetime(replaced) {}
        if post { core.postDelivery() }
        return .set
    }

    /// Replaces the value with `transform(value)`, atomically: under contention the
    /// transform may run more than once (like Kotlin's `update`), so keep it pure.
    /// Returns the value it set; once the flow has finished, changes nothing and returns
    /// the final value.
    @inlinable @discardableResult
    public func update(_ transform: (Value) throws -> Value) rethrows -> Value {
        while true {
            let previous = value
            let next = try transform(previous)
            switch set(next, ifCurrentIs: previous, compare: true) {
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
        if post { core.postDelivery() }
        return true
    }

    /// This flow, read-only.
    public func asStateFlow() -> StateFlow<Value> { self }
}

/// What a set did (outside the generic class: a nested type would be generic too).
@usableFromInline
enum SetOutcome {
    case set, mismatch, finished
}

/// How a flow ended.
struct FlowTerminal: @unchecked Sendable {
    /// nil: completed normally.
    let error: (any Error)?
}
