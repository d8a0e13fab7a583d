/// What a flow supplies to the one delivery `FlowCore.deliver()` runs for every flow:
/// the part of a delivery that depends on the flow's data. Non-generic, so the core calls
/// it through the witness table it was handed once, at the flow's birth.
protocol DeliverySource: AnyObject, Sendable {
    /// Loop thread, while the flow's lock (`core.lock`) is held: move what this delivery
    /// hands out into loop-confined storage of the flow (a value, a batch of events). It
    /// is stored, not returned, so that no generic value crosses the protocol.
    func takeSnapshotLocked()
    /// Loop thread, inside the walk over the flow's subscribers, after the arrivals were
    /// registered: hand the snapshot to the registered subscribers (`core.slots`) and the
    /// newcomers (`core.forEachNewcomer`).
    func broadcast()
}

/// Something that holds subscriptions the loop must complete at teardown.
protocol SubscriptionOwner: AnyObject, Sendable {
    /// Loop thread only, at teardown: completes every subscription still open,
    /// retires every subscription still registered, and returns how many it completed.
    func sweepForTeardown() -> Int
    /// Any thread: subscriptions admitted and neither closed nor completed.
    func openSubscriptionCount() -> Int
}

/// One unit of work in the loop's queue. Flow deliveries carry only an unretained class
/// reference, so marking a flow dirty allocates nothing in steady state.
enum Job {
    case run(@Sendable () -> Void)
    /// A job admitted under the loop's limit of pending bounded jobs
    /// (`EventLoop.executeBounded`): counted until it has run.
    case bounded(@Sendable () -> Void)
    /// Unretained: the core keeps its flow (and the flow its core) while a delivery is
    /// pending; see `FlowCore.claimDeliveryLocked`.
    case deliver(Unmanaged<FlowCore>)
    /// Releases the subscriptions of the core closed since its last retire job (one job
    /// for all of them). Retained: a closed subscription's handle may be gone already.
    case retire(FlowCore)
}
