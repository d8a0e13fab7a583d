import Synchronization

/// The subscription machinery every flow shares: its lock, the pending delivery, arrivals,
/// the terminal state, the subscriber slots and the observable subscription count.
///
/// A flow keeps its own data (a value, a ring of events) under `lock` too, so that one
/// critical section snapshots the data *and* the arrivals: a subscriber admitted before a
/// snapshot is registered before that snapshot is delivered, so it misses nothing.
///
/// Every flow delivers through the one `deliver()` here (lock → snapshot, arrivals and
/// terminal → unlock → register arrivals → walk → terminal); a flow supplies only its
/// snapshot and its broadcast (`DeliverySource`).
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
    /// The flow while a delivery is pending (claimed, not yet taken by `deliver()`), strong:
    /// it keeps the flow, and so this core, alive for the unretained delivery job. Non-nil
    /// exactly when a delivery is scheduled.
    @exclusivity(unchecked) private var pendingSource: (any DeliverySource)?
    @exclusivity(unchecked) private var arrivals: [FlowSubscription] = []
    @exclusivity(unchecked) private(set) var terminal: FlowTerminal?
    /// `terminal != nil`, without copying the terminal (and its error) on every set.
    @exclusivity(unchecked) private(set) var isFinished = false
    /// Set by teardown's sweep (or at birth on a shut-down loop): no one is admitted again
    /// and no delivery is claimed.
    @exclusivity(unchecked) private var tornDown = false

    /// The flow, set once at its birth. Unowned: the flow owns the core. Read only by the
    /// flow's own calls (a claim), so it is alive whenever it is read; the existential is
    /// made once here instead of at every post (a generic conformance's witness table is
    /// looked up in the runtime's cache each time it is made).
    unowned(unsafe) var source: (any DeliverySource)?
    /// The loop's walk gate (one load less per walk than through `loop`).
    let gate: WalkGate

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
        self.gate = loop.walkGate
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
    /// flow's own bookkeeping) and queues it for registration by the next delivery. On
    /// failure nothing is counted and none of its callbacks will ever run.
    func admit(
        _ subscription: FlowSubscription,
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
        if post { postDelivery() }
    }

    /// Caller holds `lock` and is a call of the flow (so `source` is alive). Returns whether
    /// the caller must post a delivery job (`postDelivery()`, after unlocking).
    func claimDeliveryLocked() -> Bool {
        guard pendingSource == nil, !tornDown else { return false }
        assert(source != nil, "a flow claimed a delivery before it was born")
        pendingSource = source
        return true
    }

    /// Caller holds `lock`. Records the terminal state; nil if the flow had finished already.
    func finishLocked(error: (any Error)?) -> Bool? {
        guard terminal == nil else { return nil }
        terminal = FlowTerminal(error: error)
        isFinished = true
        return claimDeliveryLocked()
    }

    /// Posts a delivery claimed under the lock. Refused only once teardown has begun, and
    /// then its sweep makes the delivery still pending, so a refusal needs no handling.
    func postDelivery() {
        try? loop.enqueue(.deliver(Unmanaged.passUnretained(self)), isInternal: true)
    }

    // MARK: Loop thread

    /// The one delivery of every flow: under the lock, the flow's snapshot, the arrivals
    /// and the terminal state; then, without it, the arrivals registered, the flow's
    /// broadcast and the terminal callbacks, inside one walk over the slots.
    ///
    /// Returns the flow it delivered for, for the caller to let go of after this call
    /// (it may be the last reference to the flow, which owns this core). Nil if no delivery
    /// was pending.
    func deliver() -> (any DeliverySource)? {
        loop.assertInEventLoop()
        lock.lock()
        guard let source = pendingSource.take() else {
            lock.unlock()
            return nil
        }
        swap(&arrivals, &arrivalBatch)
        let terminal = self.terminal
        source.takeSnapshotLocked()
        lock.unlock()

        registerArrivals()
        gate.begin(ObjectIdentifier(self))
        source.broadcast()
        arrivalBatch.removeAll(keepingCapacity: true)
        if let terminal {
            terminateAll(with: terminal.error)
        }
        gate.end()
        return source
    }

    /// In a delivery, without the lock: registers the arrivals still open.
    /// One closed before it got here is released now (no callback of it has run); its
    /// retire job, if it still comes, finds it released already.
    private func registerArrivals() {
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
        assert(!gate.isWalking(ObjectIdentifier(self)), "subscriber slots changed during a walk over them")
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
        // From here nothing is admitted or claimed. A delivery still pending (its job was
        // refused, or is being refused) runs last: arrivals that rode on it get their first
        // value (or replay) and, if the flow finished, its own terminal callback. With none
        // pending there are no arrivals, and the flow's subscribers have had everything.
        lock.withLock { tornDown = true }
        let source = deliver()
        gate.begin(ObjectIdentifier(self))
        terminateAll(with: nil)
        gate.end()
        withExtendedLifetime(source) {}
        // Everyone completed here was still open: whether by the flow's own terminal (a
        // layer finishing its flows at teardown) or by this sweep.
        return terminatedTotal - before
    }

    func subscriptionEnded() {
        changeCount(by: -1)
    }
}
