import Synchronization

/// The subscription machinery every flow shares: its lock, the delivery flag, arrivals,
/// the terminal state, the subscriber slots and the observable subscription count.
///
/// A flow keeps its own data (a value, a ring of events) under `lock` too, so that one
/// critical section snapshots the data *and* the arrivals: a subscriber admitted before a
/// snapshot is registered before that snapshot is delivered, so it misses nothing.
///
/// Subscribing never touches the slots directly: it appends to `arrivals` and marks the
/// flow dirty; the next delivery registers the arrivals, then walks the slots. Removals
/// happen only in retire jobs, never during a walk, so a walk indexes the array while
/// callbacks subscribe or close (which only flags the subscription).
///
/// Hot state is `@exclusivity(unchecked)`: it is guarded by `lock` or confined to the loop
/// thread (ThreadSanitizer checks both), and the dynamic exclusivity check the compiler would
/// otherwise make on every access cost more than the delivery itself (measured with callgrind).
final class FlowCore: SubscriptionOwner, @unchecked Sendable {
    let loop: EventLoop
    let lock = Lock()

    // Guarded by lock.
    @exclusivity(unchecked) private var deliveryScheduled = false
    @exclusivity(unchecked) private var arrivals: [FlowSubscription] = []
    @exclusivity(unchecked) private(set) var terminal: FlowTerminal?
    /// `terminal != nil`, without copying the terminal (and its error) on every set.
    @exclusivity(unchecked) private(set) var isFinished = false
    /// Set by teardown's sweep (or at birth on a shut-down loop): no one is admitted again.
    @exclusivity(unchecked) private var tornDown = false

    /// The flow, for teardown's last delivery. Weak: the flow owns the core.
    weak var source: (any DeliverySource)?

    // Loop-confined.
    @exclusivity(unchecked) private(set) var slots = SubscriberSlots()
    @exclusivity(unchecked) private var arrivalBatch: [FlowSubscription] = []
    /// How many subscriptions got a terminal callback from this flow, ever.
    private var terminatedTotal = 0

    /// Live subscriptions (admitted, not yet closed or completed).
    private let live = Atomic<Int>(0)
    private let countLock = Lock()
    private var countFlow: MutableStateFlow<Int>?   // guarded by countLock, made on first use
    private let countObserved = Atomic<Bool>(false)

    init(loop: EventLoop) {
        self.loop = loop
        if !loop.adopt(self) {
            tornDown = true
        }
    }

    var liveCount: Int { live.load(ordering: .acquiring) }

    // MARK: Subscription count

    func subscriptionCount() -> StateFlow<Int> {
        countLock.withLock {
            if let countFlow { return countFlow }
            // Announce the flow before reading the count: a change that does not see the
            // announcement happened before this read (both sequentially consistent).
            countObserved.store(true, ordering: .sequentiallyConsistent)
            let flow = MutableStateFlow(live.load(ordering: .sequentiallyConsistent), on: loop)
            countFlow = flow
            return flow
        }
    }

    /// Lock-free until someone asks for `subscriptionCount`; then each change publishes
    /// the latest count under `countLock` (so publications never go backwards).
    private func changeCount(by delta: Int) {
        live.add(delta, ordering: .sequentiallyConsistent)
        guard countObserved.load(ordering: .sequentiallyConsistent) else { return }
        countLock.withLock {
            countFlow?.value = live.load(ordering: .sequentiallyConsistent)
        }
    }

    // MARK: Any thread

    /// Admits `subscription`: counts it live, then under `lock` runs `prepare` (for the
    /// flow's own bookkeeping) and queues it for registration by the next delivery of
    /// `source`. On failure nothing is counted and none of its callbacks will ever run.
    func admit(
        _ subscription: FlowSubscription,
        deliveringWith source: any DeliverySource,
        prepareLocked: (FlowSubscription) -> Void = { _ in }
    ) throws(LoopFlowError) {
        guard loop.acceptsWork else {
            throw LoopFlowError(.loopShutDown, "the event loop '\(loop.name)' is shut down")
        }
        changeCount(by: 1)
        loop.openSubscriptions.add(1, ordering: .relaxed)
        let post: Bool? = lock.withLock {
            guard !tornDown else { return nil }
            prepareLocked(subscription)
            arrivals.append(subscription)
            return claimDeliveryLocked()
        }
        guard let post else {
            loop.openSubscriptions.subtract(1, ordering: .relaxed)
            changeCount(by: -1)
            throw LoopFlowError(.loopShutDown, "the event loop '\(loop.name)' is shut down")
        }
        if post { postDelivery(source) }
    }

    /// Caller holds `lock`. Returns whether the caller must post a delivery job.
    func claimDeliveryLocked() -> Bool {
        guard !deliveryScheduled else { return false }
        deliveryScheduled = true
        return true
    }

    /// Caller holds `lock`. Records the terminal state; nil if the flow had finished already.
    func finishLocked(error: (any Error)?) -> Bool? {
        guard terminal == nil else { return nil }
        terminal = FlowTerminal(error: error)
        isFinished = true
        return claimDeliveryLocked()
    }

    /// Posts a delivery claimed under the lock. Refused only once teardown has begun,
    /// and then the sweep completes everyone, so a refusal needs no handling.
    func postDelivery(_ source: any DeliverySource) {
        try? loop.enqueue(.deliver(source), isInternal: true)
    }

    // MARK: Loop thread

    /// Caller holds `lock`, at the start of a delivery: takes the arrivals and the
    /// terminal state along with the flow's own snapshot.
    func beginDeliveryLocked() -> FlowTerminal? {
        deliveryScheduled = false
        swap(&arrivals, &arrivalBatch)
        return terminal
    }

    /// After `beginDeliveryLocked`, without the lock: registers the arrivals still open.
    /// One closed before it got here is released now (no callback of it has run); its
    /// retire job, if it still comes, finds it released already.
    func registerArrivals() {
        loop.assertInEventLoop()
        for subscription in arrivalBatch {
            if subscription.isClosed {
                subscription.release()
            } else {
                assertNotWalking()
                slots.insert(subscription)
            }
        }
    }

    /// The subscriptions `registerArrivals` just registered (still registered now).
    @inline(__always)
    func forEachNewcomer(_ body: (FlowSubscription) -> Void) {
        for subscription in arrivalBatch where subscription.slot >= 0 {
            body(subscription)
        }
    }

    /// Ends a delivery: forgets the arrivals and, if the flow finished, completes everyone.
    func endDelivery(terminal: FlowTerminal?) {
        arrivalBatch.removeAll(keepingCapacity: true)
        if let terminal {
            terminateAll(with: terminal.error)
        }
    }

    /// Terminal callback to every registered subscription still open, then release for
    /// all of them. Returns how many got the terminal callback. Call inside a walk of this
    /// flow (closers wait for it).
    @discardableResult
    private func terminateAll(with error: (any Error)?) -> Int {
        loop.assertInEventLoop()
        var terminated = 0
        for subscription in slots.removeAll() {
            if subscription.terminate(with: error) { terminated += 1 }
            subscription.release()
        }
        terminatedTotal += terminated
        return terminated
    }

    /// Walks call subscribers through unretained references into `slots`: adding or
    /// removing one during a walk over this flow would be a use-after-free, not a trap.
    /// (No path does; this keeps a future one from doing it silently in debug builds.)
    @inline(__always)
    private func assertNotWalking() {
        assert(loop.walking.load(ordering: .relaxed) != UInt(bitPattern: ObjectIdentifier(self)),
               "subscriber slots changed during a walk over them")
    }

    // MARK: SubscriptionOwner

    func retire(_ subscription: FlowSubscription) {
        loop.assertInEventLoop()
        assertNotWalking()
        slots.remove(subscription)
        subscription.release()
    }

    func sweepForTeardown() -> Int {
        let before = terminatedTotal
        lock.withLock { tornDown = true }
        // A last delivery: arrivals that rode on a delivery teardown refused get their
        // first value (or replay) and, if the flow finished, its own terminal callback.
        if let source {
            source.deliver()
        } else {
            let late: [FlowSubscription] = lock.withLock {
                defer { arrivals.removeAll() }
                return arrivals
            }
            for subscription in late {
                if subscription.isClosed { subscription.release() } else { slots.insert(subscription) }
            }
        }
        loop.beginWalk(ObjectIdentifier(self))
        terminateAll(with: nil)
        loop.endWalk()
        // Everyone completed here was still open: whether by the flow's own terminal (a
        // layer finishing its flows at teardown) or by this sweep.
        return terminatedTotal - before
    }

    func subscriptionEnded() {
        changeCount(by: -1)
    }
}
