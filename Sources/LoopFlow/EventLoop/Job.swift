/// Something a flow does on the loop thread when it has news for its observers.
/// Implemented by the flows; the loop only calls `deliver()` from its drain.
protocol DeliverySource: AnyObject, Sendable {
    /// Loop thread only. Hands pending values or events to the subscribers.
    func deliver()
}

/// Something that holds subscriptions the loop must complete at teardown.
protocol SubscriptionOwner: AnyObject, Sendable {
    /// Loop thread only, called once when the subscription's first `close` is
    /// processed: forget it and run its `release`.
    func retire(_ subscription: FlowSubscription)
    /// Loop thread only, at teardown: completes every subscription still open,
    /// retires every subscription still registered, and returns how many it completed.
    func sweepForTeardown() -> Int
    /// Any thread: the number of live subscriptions went down by one.
    func subscriptionEnded()
}

/// One unit of work in the loop's queue. Flow deliveries carry only a class
/// reference, so marking a flow dirty allocates nothing in steady state.
enum Job {
    case run(@Sendable () -> Void)
    case deliver(any DeliverySource)
    case retire(FlowSubscription)
}
