import LoopFlow

/// The flows a session publishes to: its own, or — for the active account of a manager with
/// several accounts — the manager's (`SessionEngine.attach`).
final class SessionOutput: Sendable {
    let state: MutableStateFlow<SessionState>
    let events: MutableSharedFlow<SessionEvent>
    let storeStatus: MutableStateFlow<StoreStatus>
    /// The token a `.fresh` request would be answered with at once, and until when: written by
    /// the session publishing here with each snapshot, read with one lock from any thread by
    /// `SessionManager.freshAccessToken()` (the valid-token path: no look-up of the active
    /// session, no second lock).
    let fresh = FreshTokenCell()

    init(
        loop: EventLoop, configuration: SessionConfiguration, state: SessionState, storeStatus: StoreStatus
    ) throws(SessionError) {
        self.state = MutableStateFlow(state, on: loop)
        self.storeStatus = MutableStateFlow(storeStatus, on: loop)
        do {
            self.events = try MutableSharedFlow(
                on: loop, replay: 0, bufferCapacity: max(1, configuration.eventBufferCapacity), overflow: .dropOldest)
        } catch {
            throw SessionError(.invalidArgument, error.message)
        }
    }

    /// Completes every flow (the session is closed).
    func finish() {
        state.finish()
        events.finish()
        storeStatus.finish()
    }
}

/// `SessionOutput.fresh`: a `FreshToken` behind a lock of its own. Not a `LockedBox`: the
/// valid-token path is this one lock and a compare, and the generic box from another module
/// was called unspecialized (a metadata look-up and a closure per token).
/// Its until-when is kept in the loop clock's nanoseconds (`EventLoop.nowNanoseconds`): the
/// check is an integer compare.
final class FreshTokenCell: @unchecked Sendable {
    private let lock = Lock(spinning: true)
    private var token: Secret?
    /// `Int64.min`: no token is fresh.
    private var until = Int64.min

    func store(_ fresh: FreshToken) {
        let until = fresh.token == nil ? Int64.min : fresh.until.map(EventLoop.nanoseconds) ?? .min
        lock.lock()
        token = fresh.token
        self.until = until
        lock.unlock()
    }

    /// The token, if `now` (the loop clock's nanoseconds) is before its until-when.
    @inline(__always)
    func answer(atNanoseconds now: Int64) -> Secret? {
        lock.lock()
        defer { lock.unlock() }
        return now < until ? token : nil
    }
}

/// A copy of the publishing session's snapshot's `freshToken` and `freshUntil` (the same
/// `Secret`, not a copy of its bytes).
struct FreshToken {
    var token: Secret?
    var until: Duration?

    /// The token, if `now` (the loop clock) is before `until`.
    func answer(at now: Duration) -> Secret? {
        guard let until, now < until else { return nil }
        return token
    }
}

/// The store's active account, whichever it is, for a session that has no record of its own
/// yet (signed out): it reads the active account's record (a session another process signed
/// in is followed; `StoredSession.account` says whose it is), clears nothing and writes
/// nothing — the session takes a record of its own (`SessionEngine.bind`) before it stores.
final class ActiveAccountRecord: SharedCredentialStore, Sendable {
    let accounts: any AccountCredentialStore

    init(_ accounts: any AccountCredentialStore) {
        self.accounts = accounts
    }

    var callsMayBlock: Bool { accounts.callsMayBlock }

    func read() -> StoreRead {
        accounts.read()
    }

    func write(_ session: StoredSession) throws(StoreError) {
        throw StoreError("a session without an account of the store cannot be written")
    }

    func clear() throws(StoreError) {}

    func tryAcquireRefreshLease(for duration: Duration) -> RefreshLeaseResult {
        .acquired
    }

    func releaseRefreshLease() {}

    func directoryToWatch() -> String? {
        (accounts as? any SharedCredentialStore)?.directoryToWatch()
    }
}

extension SessionEngine {
    /// The account key a session signed in with `memberID` keeps its record under.
    static func accountKey(for memberID: String?) -> String {
        guard let memberID, !memberID.isEmpty else { return defaultAccount }
        return memberID
    }

    /// Gives the session the record of `key` (nil: none — it follows the store's active
    /// account): store work submitted from now on goes there; work already submitted keeps
    /// the record it was submitted for. Nothing to do for a store of one session.
    func bind(_ key: String?) {
        guard let accountStore, key != accountKey else { return }
        accountKey = key
        worker.retarget(key.map { accountStore.account($0, isActive: isActive) } ?? ActiveAccountRecord(accountStore))
    }

    /// Makes this session its manager's active one: it publishes into `surface` (which takes
    /// its state and store status now). (The manager records the store's active account.)
    func attach(_ surface: SessionOutput) {
        loop.assertInEventLoop()
        isActive = true
        if let accountStore, let key = accountKey {
            worker.retarget(accountStore.account(key, isActive: true))
        }
        surface.storeStatus.value = output.storeStatus.value
        surface.state.value = machine.state
        let fresh = published.fresh
        surface.fresh.store(fresh)
        output = surface
    }

    /// The session goes to the background: it publishes into flows of its own from now on
    /// (nobody else's state follows it).
    func detach() throws(SessionError) {
        loop.assertInEventLoop()
        isActive = false
        output.fresh.store(FreshToken())  // the next active session's, once attached
        output = try SessionOutput(
            loop: loop, configuration: configuration, state: machine.state, storeStatus: output.storeStatus.value)
        if let accountStore, let key = accountKey {
            worker.retarget(accountStore.account(key, isActive: false))
        }
    }

    /// Before signing in with `tokens`: the record the new session is kept in. A session of
    /// another account that ended here (expired: only its member id was stored) gives its
    /// record up: it is cleared first.
    func takeRecord(for tokens: SessionTokens) {
        guard accountStore != nil else { return }
        let key = Self.accountKey(for: tokens.memberID)
        if let old = accountKey, old != key {
            clearRecord(old)
        }
        recordsToClear.remove(key)  // written anew: a clear still owed must not wipe it
        bind(key)
    }

    /// Removes the record of `key` (a logout, or a record given up) on the worker. One that
    /// fails is owed: cleared again with the store's retries until it lands (unless the
    /// account signs in here again first) — a logout never leaves its tokens on disk because
    /// the disk was full or gone for a while.
    func clearRecord(_ key: String) {
        guard let accountStore else { return }
        recordsToClear.insert(key)
        save(nil, to: accountStore.account(key, isActive: false), kind: .clear)
        // After the clear's own answer (the same worker, in order).
        worker.afterPendingWork { [weak self] in self?.storeAnswered(.clearSettled(key: key)) }
    }

    /// The session ended here (logout, reconfigure): its record goes — or, with a store of one
    /// session, the store is cleared — and it follows the store's active account from now on.
    func forgetRecord() {
        if let key = accountKey {
            clearRecord(key)
            bind(nil)
        } else {
            persist()
        }
    }

    /// The store's retry: every clear still owed, before the session's own write.
    func retryOwedClears() {
        for key in recordsToClear.sorted() { clearRecord(key) }
    }

    /// After following another process's sign-in, or restoring: the record it came from.
    func takeRecord(of stored: StoredSession) {
        guard accountStore != nil, accountKey == nil else { return }
        bind(stored.account ?? Self.accountKey(for: stored.memberID))
    }
}
