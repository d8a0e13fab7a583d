#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A small mutex over `pthread_mutex_t`.
///
/// Not `Synchronization.Mutex`: on Linux that contends through PI futexes, which
/// ThreadSanitizer cannot see, so every TSan run would report false races.
/// The lock is never held while user code runs (contract rule 1).
@usableFromInline
package final class Lock: @unchecked Sendable {
    @usableFromInline let mutex: UnsafeMutablePointer<pthread_mutex_t>

    /// `spinning`: glibc's adaptive mutex (`PTHREAD_MUTEX_ADAPTIVE_NP`), which spins a little
    /// before it sleeps in the kernel — for a lock held a few nanoseconds that many threads
    /// take at once (the valid-token path), where sleeping costs far more than the wait. Such a
    /// lock gets a cache line of its own: no other block's writes take the line from a waiter.
    package init(spinning: Bool = false) {
        let line = 64
        mutex = UnsafeMutableRawPointer.allocate(
            byteCount: spinning ? max(line, MemoryLayout<pthread_mutex_t>.size) : MemoryLayout<pthread_mutex_t>.size,
            alignment: spinning ? line : MemoryLayout<pthread_mutex_t>.alignment
        ).bindMemory(to: pthread_mutex_t.self, capacity: 1)
        mutex.initialize(to: pthread_mutex_t())
        var attributes = pthread_mutexattr_t()
        pthread_mutexattr_init(&attributes)
        defer { pthread_mutexattr_destroy(&attributes) }
        #if canImport(Glibc)
        if spinning {
            pthread_mutexattr_settype(&attributes, Int32(PTHREAD_MUTEX_ADAPTIVE_NP))
        }
        #endif
        let rc = pthread_mutex_init(mutex, &attributes)
        precondition(rc == 0, "pthread_mutex_init failed: \(rc)")
    }

    deinit {
        let rc = pthread_mutex_destroy(mutex)
        precondition(rc == 0, "pthread_mutex_destroy failed (lock still held?): \(rc)")
        mutex.deinitialize(count: 1)
        mutex.deallocate()
    }

    @inlinable
    package func lock() {
        let rc = pthread_mutex_lock(mutex)
        precondition(rc == 0, "pthread_mutex_lock failed: \(rc)")
    }

    @inlinable
    package func unlock() {
        let rc = pthread_mutex_unlock(mutex)
        precondition(rc == 0, "pthread_mutex_unlock failed: \(rc)")
    }

    @inline(__always)
    package func withLock<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
        lock()
        defer { unlock() }
        return try body()
    }

    fileprivate var raw: UnsafeMutablePointer<pthread_mutex_t> { mutex }
}

/// A condition variable paired with a `Lock`.
package final class Condition: @unchecked Sendable {
    private let cond: UnsafeMutablePointer<pthread_cond_t>

    package init() {
        cond = .allocate(capacity: 1)
        cond.initialize(to: pthread_cond_t())
        let rc = pthread_cond_init(cond, nil)
        precondition(rc == 0, "pthread_cond_init failed: \(rc)")
    }

    deinit {
        pthread_cond_destroy(cond)
        cond.deinitialize(count: 1)
        cond.deallocate()
    }

    /// Waits; `lock` must be held by the caller and is held again on return.
    package func wait(_ lock: Lock) {
        let rc = pthread_cond_wait(cond, lock.raw)
        precondition(rc == 0, "pthread_cond_wait failed: \(rc)")
    }

    package func broadcast() {
        pthread_cond_broadcast(cond)
    }
}

/// A value that is only ever reached through its lock (swift-nio's `NIOLockedValueBox` shape).
/// Inlinable, so that another module's use is specialized for its value and closure (a session's
/// valid-token path is one lock on one).
package final class LockedBox<Value>: @unchecked Sendable {
    @usableFromInline let lock = Lock()
    @usableFromInline var value: Value

    package init(_ value: Value) { self.value = value }

    @inlinable
    package func withLockedValue<T, E: Error>(_ body: (inout Value) throws(E) -> T) throws(E) -> T {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }

    /// Waits, asleep with the lock released, until `ready` holds for the value; checked under
    /// the lock first and again after each broadcast of `condition` (a writer's, after its
    /// change). Returns the value that was ready. Never on a loop thread.
    package func wait(on condition: Condition, until ready: (Value) -> Bool) -> Value {
        lock.lock()
        defer { lock.unlock() }
        while !ready(value) { condition.wait(lock) }
        return value
    }
}

/// A one-shot gate a thread can block on until another opens it (used for joins and tests).
package final class Latch: @unchecked Sendable {
    private let lock = Lock()
    private let condition = Condition()
    private var open = false

    package init() {}

    package func signal() {
        lock.withLock { open = true }
        condition.broadcast()
    }

    package func wait() {
        lock.lock()
        while !open { condition.wait(lock) }
        lock.unlock()
    }
}
