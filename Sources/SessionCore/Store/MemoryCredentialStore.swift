import LoopFlow

/// A store in memory: for tests and for sessions that must not outlive the process.
/// `failure` makes every call fail (reads answer `unavailable`), to play a store that is
/// out of reach.
///
/// Its calls never wait (a lock held for a dictionary's worth of work), so a session calls
/// them inline on its loop thread (`callsMayBlock` is false): tests on virtual time see every
/// store effect at once, in order, as before store work moved to a worker.
public final class MemoryCredentialStore: CredentialStore, @unchecked Sendable {
    private let lock = Lock()
    private var stored: StoredSession?
    private var _failure: StoreError?
    private var _writes = 0

    public init(_ session: StoredSession? = nil) {
        stored = session
    }

    public var callsMayBlock: Bool { false }

    /// When set, reads answer `unavailable` and writes throw.
    public var failure: StoreError? {
        get { lock.withLock { _failure } }
        set { lock.withLock { _failure = newValue } }
    }

    /// What is stored now.
    public var session: StoredSession? { lock.withLock { stored } }

    /// How many successful writes and clears there were.
    public var writes: Int { lock.withLock { _writes } }

    public func read() -> StoreRead {
        lock.withLock {
            if let _failure { return .unavailable(_failure) }
            return stored.map(StoreRead.present) ?? .absent
        }
    }

    public func write(_ session: StoredSession) throws(StoreError) {
        try lock.withLock { () throws(StoreError) in
            if let _failure { throw _failure }
            stored = session
            _writes += 1
        }
    }

    public func clear() throws(StoreError) {
        try lock.withLock { () throws(StoreError) in
            if let _failure { throw _failure }
            stored = nil
            _writes += 1
        }
    }
}
