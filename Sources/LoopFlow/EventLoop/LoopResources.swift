/// Everything a loop must finish at teardown, in one place: the flows with subscribers, the
/// teardown hooks of the layers above, the directory watches and the timers.
///
/// `tearDown()` walks them in one defined order:
/// 1. hooks (a layer finishes its own waiters, timers and flows first),
/// 2. flows (every open subscription completed, then released),
/// 3. directory watches (stopped, handles closed),
/// 4. timers (stopped, handles closed).
///
/// A flow's core is held (strongly) while it has subscription records in use, and only then:
/// a flow without subscribers has nothing to finish, and holding every flow weakly instead
/// put each core's reference count in a side table, which made every retain and release of
/// it (one per subscription handle) take the slow path — a quarter of a subscribe+close.
///
/// Flows and hooks register from any thread until `close()` (teardown's start); watches
/// register on the loop thread at any time, since a watch whose start was accepted before
/// the shutdown must still be stopped.
final class LoopResources: @unchecked Sendable {
    private let lock = Lock()
    let timers: any TimerBackend

    // Guarded by lock.
    private var closed = false
    /// The flows with subscription records in use, so teardown can complete their subscribers.
    private var owners: [ObjectIdentifier: any SubscriptionOwner] = [:]
    private var hooks: [(id: UInt64, hook: @Sendable () -> Void)] = []
    private var nextHookID: UInt64 = 1

    // Loop-confined.
    private var watches: [ObjectIdentifier: DirectoryWatch] = [:]

    init(timers: any TimerBackend) {
        self.timers = timers
    }

    /// Holds `owner` until `letGo` (it has subscribers). Returns false once teardown has
    /// begun. Called under the owner's lock (lock order: owner, then resources).
    func hold(_ owner: any SubscriptionOwner) -> Bool {
        lock.withLock {
            guard !closed else { return false }
            owners[ObjectIdentifier(owner)] = owner
            return true
        }
    }

    /// `owner` has no subscribers any more. Under the owner's lock.
    func letGo(_ owner: any SubscriptionOwner) -> (any SubscriptionOwner)? {
        lock.withLock { owners.removeValue(forKey: ObjectIdentifier(owner)) }
    }

    /// Subscriptions open on this loop's flows (admitted, neither closed nor completed).
    func openSubscriptionCount() -> Int {
        let owners: [any SubscriptionOwner] = lock.withLock { Array(self.owners.values) }
        return owners.reduce(0) { $0 + $1.openSubscriptionCount() }
    }

    /// Records a teardown hook: its id (for `removeTeardownHook`), or nil once teardown has begun.
    func addTeardownHook(_ hook: @escaping @Sendable () -> Void) -> UInt64? {
        lock.withLock {
            guard !closed else { return nil }
            let id = nextHookID
            nextHookID += 1
            hooks.append((id, hook))
            return id
        }
    }

    /// Forgets a hook that is no longer needed (its owner went away first). Any thread.
    func removeTeardownHook(_ id: UInt64) {
        lock.withLock { hooks.removeAll { $0.id == id } }
    }

    /// Hooks recorded and not yet run or removed (tests).
    var teardownHookCount: Int { lock.withLock { hooks.count } }

    /// Loop thread.
    func rememberWatch(_ watch: DirectoryWatch) {
        watches[ObjectIdentifier(watch)] = watch
    }

    /// Loop thread.
    func forgetWatch(_ watch: DirectoryWatch) {
        watches.removeValue(forKey: ObjectIdentifier(watch))
    }

    /// Teardown has begun: flows and hooks are refused from here on.
    func close() {
        lock.withLock { closed = true }
    }

    /// Loop thread, once, after `close()`: finishes everything in the order above. Returns
    /// how many subscriptions were still open (each got `onComplete`, then `release`).
    func tearDown() -> Int {
        let hooks = lock.withLock { () -> [@Sendable () -> Void] in
            precondition(closed, "resources torn down before they were closed")
            defer { self.hooks.removeAll() }
            return self.hooks.map(\.hook)
        }
        for hook in hooks { hook() }

        // Held strongly here while they are swept (a sweep lets each one go).
        let owners: [any SubscriptionOwner] = lock.withLock { Array(self.owners.values) }
        var completed = 0
        for owner in owners {
            completed += owner.sweepForTeardown()
        }

        for watch in Array(watches.values) { watch.stopOnLoop() }
        timers.stopAll()
        return completed
    }
}
