/// Everything a loop must finish at teardown, in one place: the flows made on it (weakly),
/// the teardown hooks of the layers above, the directory watches and the timers.
///
/// `tearDown()` walks them in one defined order:
/// 1. hooks (a layer finishes its own waiters, timers and flows first),
/// 2. flows (every open subscription completed, then released),
/// 3. directory watches (stopped, handles closed),
/// 4. timers (stopped, handles closed).
///
/// Flows and hooks register from any thread until `close()` (teardown's start); watches
/// register on the loop thread at any time, since a watch whose start was accepted before
/// the shutdown must still be stopped.
final class LoopResources: @unchecked Sendable {
    private let lock = Lock()
    let timers: any TimerBackend

    // Guarded by lock.
    private var closed = false
    /// Every flow made on this loop, weakly, so teardown can complete their subscribers.
    private var flows: [WeakOwner] = []
    private var flowCompactionThreshold = 64
    private var hooks: [(id: UInt64, hook: @Sendable () -> Void)] = []
    private var nextHookID: UInt64 = 1

    // Loop-confined.
    private var watches: [ObjectIdentifier: DirectoryWatch] = [:]

    init(timers: any TimerBackend) {
        self.timers = timers
    }

    /// Records a new flow. Returns false once teardown has begun.
    func adopt(_ owner: any SubscriptionOwner) -> Bool {
        lock.withLock {
            guard !closed else { return false }
            if flows.count >= flowCompactionThreshold {
                flows.removeAll { $0.owner == nil }
                flowCompactionThreshold = max(64, flows.count * 2)
            }
            flows.append(WeakOwner(owner: owner))
            return true
        }
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

        let owners: [any SubscriptionOwner] = lock.withLock {
            defer { flows.removeAll() }
            return flows.compactMap(\.owner)
        }
        var completed = 0
        for owner in owners {
            completed += owner.sweepForTeardown()
        }

        for watch in Array(watches.values) { watch.stopOnLoop() }
        timers.stopAll()
        return completed
    }
}

private struct WeakOwner {
    weak var owner: (any SubscriptionOwner)?
}
