import Synchronization

/// The subscriptions of one flow: registration, retirement, teardown and the
/// observable subscription count. Shared by `StateFlow` and `SharedFlow`.
///
/// `slots` is loop-confined. Registrations made off the loop thread are posted to it;
/// removals always happen in a retire job, never in the middle of a delivery walk, so a
/// walk can index the array while callbacks subscribe (append) or close (flag only).
final class SubscriberRegistry<Subscription: FlowSubscription>: SubscriptionOwner, @unchecked Sendable {
    let loop: EventLoop
    /// Loop-confined.
    private(set) var slots = SubscriberSlots<Subscription>()

    /// Live subscriptions (subscribed, not yet closed or completed). Read by emitters.
    private let live = Atomic<Int>(0)
    private let countLock = Lock()
    private var countFlow: MutableStateFlow<Int>?   // guarded by countLock, made on first use

    init(loop: EventLoop) {
        self.loop = loop
    }

    var liveCount: Int { live.load(ordering: .acquiring) }

    /// The number of live subscriptions, as a flow.
    func subscriptionCount() -> StateFlow<Int> {
        countLock.withLock {
            if let countFlow { return countFlow }
            let flow = MutableStateFlow(live.load(ordering: .acquiring), on: loop)
            countFlow = flow
            return flow
        }
    }

    private func changeCount(by delta: Int) {
        countLock.withLock {
            let now = live.add(delta, ordering: .acquiringAndReleasing).newValue
            countFlow?.value = now
        }
    }

    /// Counts `subscription` as live, runs `prepare` (synchronously, on the caller's
    /// thread), then registers it on the loop, where `onRegistered` runs after insertion.
    /// On failure nothing is counted and nothing of the subscription will ever be called.
    func register(
        _ subscription: Subscription,
        prepare: (Subscription) -> Void = { _ in },
        onRegistered: @escaping @Sendable (Subscription) -> Void
    ) throws(LoopFlowError) {
        changeCount(by: 1)
        loop.openSubscriptions.add(1, ordering: .relaxed)
        prepare(subscription)
        let insert: @Sendable () -> Void = { [self] in
            // Closed before it got here: the retire job that close() posted releases it.
            guard !subscription.isClosed else { return }
            if slots.isEmpty { loop.registerOwner(self) }
            slots.insert(subscription)
            onRegistered(subscription)
        }
        do throws(LoopFlowError) {
            if loop.inEventLoop {
                guard loop.acceptsWork else {
                    throw LoopFlowError(.loopShutDown, "the event loop '\(loop.name)' is shut down")
                }
                insert()
            } else {
                try loop.enqueue(.run(insert), isInternal: false)
            }
        } catch {
            loop.openSubscriptions.subtract(1, ordering: .relaxed)
            changeCount(by: -1)
            throw error
        }
    }

    /// Loop thread: terminal callback to every registered subscription still open, then
    /// release for all of them. Returns how many got the terminal callback.
    @discardableResult
    func terminateAll(with error: (any Error)?) -> Int {
        loop.assertInEventLoop()
        let all = slots.removeAll()
        loop.unregisterOwner(self)
        var terminated = 0
        for subscription in all {
            if subscription.terminate(with: error) { terminated += 1 }
            subscription.release()
        }
        return terminated
    }

    // MARK: SubscriptionOwner

    func retire(_ subscription: FlowSubscription) {
        loop.assertInEventLoop()
        let subscription = subscription as! Subscription
        if slots.remove(subscription), slots.isEmpty {
            loop.unregisterOwner(self)
        }
        subscription.release()
    }

    func sweepForTeardown() -> Int {
        terminateAll(with: nil)
    }

    func subscriptionEnded() {
        changeCount(by: -1)
    }
}
