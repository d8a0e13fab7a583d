import Synchronization

/// The handle `subscribe` returns. Close it when you no longer want callbacks.
///
/// The contract (docs/ARCHITECTURE.md, "The threading and lifetime contract"):
/// - every callback runs on the loop thread, never inside the call that caused it and
///   never while a library lock is held;
/// - `close()` is safe from any thread, any number of times. When it returns, no callback
///   of this subscription is running or will start — except when called from inside this
///   subscription's own callback: that callback finishes and nothing follows it. (Off the
///   loop thread it waits for the loop to finish the walk over this flow's subscribers it
///   may be in: one flag check per callback instead of a lock or two atomic updates.);
/// - `onRelease` runs exactly once, on the loop thread, after the last callback;
/// - `onError` / `onComplete` are terminal: at most one of them, once.
///
/// The one way to deadlock: calling `close()` from a thread that a running callback of the
/// same flow is itself waiting for (the callback blocks on that thread, the thread blocks
/// in `close()` until the walk over the flow's subscribers ends).
///
/// Dropping the handle does not close the subscription (as with a Kotlin
/// `FlowSubscription`): it stays open until `close()` or loop teardown, which reports it
/// as never closed. The `values` async sequences close for you.
public class FlowSubscription: @unchecked Sendable, CustomStringConvertible {
    private static let nextID = Atomic<UInt64>(1)

    /// Unique within the process; never reused.
    public let id: UInt64
    /// The flow's core (the only owner there is: a concrete reference is 8 bytes, an
    /// existential 16 — the layout below keeps a subscription within 128 bytes).
    let owner: FlowCore
    var loop: EventLoop { owner.loop }

    // Closed by `close()` (any thread) or by a terminal callback (loop thread). The loop
    // checks it before each callback; a closer then waits for the walk it may have raced.
    private static let closed: UInt32 = 2
    private let gate = Atomic<UInt32>(0)

    // Loop-confined (packed beside the gate).
    /// Index in the owner's subscriber array, or -1 when not registered.
    @exclusivity(unchecked) var slot: Int32 = -1
    @exclusivity(unchecked) private var released = false
    /// The state broadcast this subscriber last received (StateFlow's distinct check).
    @exclusivity(unchecked) final var seenEpoch: UInt64 = 0

    /// The optional callbacks, in one box made only when one of them is given: most
    /// subscribers have only their value callback.
    private final class Extras: Sendable {
        let onError: (@Sendable (any Error) -> Void)?
        let onComplete: (@Sendable () -> Void)?
        let onRelease: (@Sendable () -> Void)?

        init(
            onError: (@Sendable (any Error) -> Void)?, onComplete: (@Sendable () -> Void)?,
            onRelease: (@Sendable () -> Void)?
        ) {
            self.onError = onError
            self.onComplete = onComplete
            self.onRelease = onRelease
        }
    }
    @exclusivity(unchecked) private var extras: Extras?

    init(
        owner: FlowCore,
        onError: (@Sendable (any Error) -> Void)?,
        onComplete: (@Sendable () -> Void)?,
        onRelease: (@Sendable () -> Void)?
    ) {
        self.id = Self.nextID.add(1, ordering: .relaxed).oldValue
        self.owner = owner
        if onError == nil && onComplete == nil && onRelease == nil {
            self.extras = nil
        } else {
            self.extras = Extras(onError: onError, onComplete: onComplete, onRelease: onRelease)
        }
    }

    public var description: String { "FlowSubscription(\(id)\(isClosed ? ", closed" : ""))" }

    /// Whether `close()` was called or a terminal callback was delivered.
    public var isClosed: Bool { gate.load(ordering: .acquiring) & Self.closed != 0 }

    /// Ends the subscription. Returns `true` if this call closed it, `false` if it was
    /// already closed (by an earlier `close()` or a terminal callback).
    ///
    /// Threading: any thread. Off the loop thread, it returns only once the loop is not in
    /// the middle of calling this flow's subscribers, so no callback of this subscription
    /// is running; the loop sees the closed gate before any later callback.
    @discardableResult
    public func close() -> Bool {
        let previous = gate.bitwiseOr(Self.closed, ordering: .sequentiallyConsistent).oldValue
        if !loop.inEventLoop {
            owner.gate.waitWhileWalking(ObjectIdentifier(owner))
        }
        guard previous & Self.closed == 0 else { return false }
        ended()
        do {
            try loop.enqueue(.retire(self), isInternal: true)
        } catch {
            // Teardown has begun: its sweep retires every subscription still registered.
        }
        return true
    }

    private func ended() {
        loop.openSubscriptions.subtract(1, ordering: .relaxed)
        owner.subscriptionEnded()
    }

    // MARK: Loop thread

    /// Whether the next callback may run. Loop thread, inside a walk: a sequentially
    /// consistent load (a plain load on x86) pairs with the walk's store and the closer's
    /// read-modify-write, so a closer either sees the walk or the walk sees it closed.
    @inline(__always)
    final var isOpen: Bool {
        gate.load(ordering: .sequentiallyConsistent) & Self.closed == 0
    }

    /// Delivers the terminal callback (error if given, else complete) unless the
    /// subscription is already closed. Returns whether it delivered. Call inside a walk;
    /// the caller retires it.
    final func terminate(with error: (any Error)?) -> Bool {
        guard gate.compareExchange(expected: 0, desired: Self.closed, ordering: .sequentiallyConsistent).exchanged
        else { return false }
        ended()
        if let error {
            extras?.onError?(error)
        } else {
            extras?.onComplete?()
        }
        return true
    }

    /// Runs `onRelease` the first time only.
    /// Then lets go of every callback: none can run any more, and a callback that captured
    /// its own subscription (a cycle through the handle) must not keep both alive forever.
    final func release() {
        loop.assertInEventLoop()
        guard !released else { return }
        released = true
        let extras = self.extras
        self.extras = nil
        dropCallbacks()
        extras?.onRelease?()
    }

    /// Loop thread, after the last callback: subclasses drop their value callback.
    func dropCallbacks() {}
}

/// A subscriber's value callback, held so that a walk calls it without reference counting:
/// the subscription keeps the box through an unmanaged reference it retained itself, and the
/// walk borrows it. A `var` closure would be retained and released around every call — about
/// 9 ns of a fan-out's 13 — and a `let` one could not be dropped at release, where a callback
/// that captured its own subscription (a cycle) must let go.
///
/// Made through a metatype the flow keeps (`ValueCallback<Value>.self`, as for the
/// subscription type), and released without generic helpers: naming `ValueCallback<Value>`
/// in the (unspecialized) generic subscription code looks its metadata up in the runtime's
/// cache on every subscribe and close — 17 % of a subscribe+close pair, by perf.
final class ValueCallback<Value>: @unchecked Sendable {
    let body: @Sendable (Value) -> Void

    init(_ body: @escaping @Sendable (Value) -> Void) { self.body = body }
}

/// A loop-confined contiguous array of subscriptions with O(1) insert and remove
/// (removal swaps the last element into the hole and fixes its `slot`).
///
/// The array holds unmanaged references it retains itself (on insert, released on
/// removal), so that a walk can call each subscriber through a guaranteed reference:
/// no retain/release pair per callback (callgrind counted 40 of the ~100 instructions a
/// callback cost with a managed array).
struct SubscriberSlots {
    private var elements = ContiguousArray<Unmanaged<FlowSubscription>>()

    var count: Int { elements.count }
    var isEmpty: Bool { elements.isEmpty }

    subscript(index: Int) -> FlowSubscription { elements[index].takeUnretainedValue() }

    /// Calls `body` with each registered subscription, in order, without retaining them.
    /// The slots must not change meanwhile (they do not during a walk: removals happen in
    /// retire jobs, arrivals register before the walk).
    @inline(__always)
    func forEach(_ body: (FlowSubscription) -> Void) {
        elements.withUnsafeBufferPointer { references in
            for reference in references {
                reference._withUnsafeGuaranteedRef(body)
            }
        }
    }

    mutating func insert(_ subscription: FlowSubscription) {
        precondition(subscription.slot == -1, "subscription registered twice")
        subscription.slot = Int32(elements.count)
        elements.append(Unmanaged.passRetained(subscription))
    }

    /// Removes `subscription` if registered; returns whether it was.
    @discardableResult
    mutating func remove(_ subscription: FlowSubscription) -> Bool {
        let index = Int(subscription.slot)
        guard index >= 0 else { return false }
        precondition(elements[index].toOpaque() == Unmanaged.passUnretained(subscription).toOpaque(),
                     "subscriber slot out of sync")
        let last = elements.removeLast()
        if index < elements.count {
            elements[index] = last
            last.takeUnretainedValue().slot = Int32(index)
        }
        subscription.slot = -1
        Unmanaged.passUnretained(subscription).release()
        return true
    }

    /// Removes and returns everything.
    mutating func removeAll() -> [FlowSubscription] {
        let all = elements.map { $0.takeRetainedValue() }
        elements = []
        for subscription in all { subscription.slot = -1 }
        return all
    }
}
