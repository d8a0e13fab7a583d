import Foundation

/// A value behind a lock, for the soak's bookkeeping. LoopFlow's own `LockedBox` is `package`
/// (not visible from this package). NSLock is a pthread mutex, which ThreadSanitizer sees
/// (Synchronization.Mutex contends through futexes it cannot see).
final class LockedBox<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value

    init(_ value: Value) { self.value = value }

    func withLockedValue<T>(_ body: (inout Value) throws -> T) rethrows -> T {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}
