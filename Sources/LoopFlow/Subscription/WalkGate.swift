import Synchronization

/// The close contract's half on the loop side: which flow's subscribers the loop thread is
/// calling right now, so that a `close()` from another thread can wait for that walk to end
/// (docs/ARCHITECTURE.md, "The threading and lifetime contract", 3). One per loop.
///
/// A walk costs one sequentially consistent store at its start and one at its end; each
/// callback then only loads its own subscription's gate (`FlowSubscription.isOpen`). A
/// closer sets that gate first, then looks here: either it sees the walk and waits for it,
/// or the walk sees the gate closed and skips the callback.
final class WalkGate: Sendable {
    /// The flow (its `FlowCore`'s identity) whose subscribers the loop thread is calling, or 0.
    private let walking = Atomic<UInt>(0)
    /// Walks finished so far (a waiter waits for the walk it saw, not for later ones).
    private let walksFinished = Atomic<UInt64>(0)
    /// Threads waiting in `waitWhileWalking`.
    private let waiters = Atomic<Int>(0)
    /// Where those threads sleep.
    private let lock = Lock()
    private let condition = Condition()

    /// Loop thread: the subscribers of `owner` are about to be called.
    @inline(__always)
    func begin(_ owner: ObjectIdentifier) {
        walking.store(UInt(bitPattern: owner), ordering: .sequentiallyConsistent)
    }

    /// Loop thread: the walk is over; wake the threads waiting for it, if any.
    @inline(__always)
    func end() {
        walksFinished.wrappingAdd(1, ordering: .releasing)
        walking.store(0, ordering: .sequentiallyConsistent)
        if waiters.load(ordering: .sequentiallyConsistent) > 0 {
            lock.withLock {}
            condition.broadcast()
        }
    }

    /// Any thread but the loop's: returns once the loop is not walking `owner`'s subscribers
    /// (or has finished the walk it was in when this was called).
    func waitWhileWalking(_ owner: ObjectIdentifier) {
        let id = UInt(bitPattern: owner)
        guard walking.load(ordering: .sequentiallyConsistent) == id else { return }
        let walk = walksFinished.load(ordering: .acquiring)
        lock.lock()
        waiters.wrappingAdd(1, ordering: .sequentiallyConsistent)
        while walking.load(ordering: .sequentiallyConsistent) == id && walksFinished.load(ordering: .acquiring) == walk {
            condition.wait(lock)
        }
        waiters.wrappingSubtract(1, ordering: .sequentiallyConsistent)
        lock.unlock()
    }

    /// Loop thread, for assertions: whether a walk over `owner`'s subscribers is under way.
    func isWalking(_ owner: ObjectIdentifier) -> Bool {
        walking.load(ordering: .relaxed) == UInt(bitPattern: owner)
    }
}
