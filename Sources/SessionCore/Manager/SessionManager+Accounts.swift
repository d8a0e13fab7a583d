// Over 400 lines (507): the accounts' entry points, the making of their sessions and the
// switches between them stay together (one lock order, one place to read it).
import LoopFlow

/// Several accounts (a store that keeps several: `AccountCredentialStore`).
///
/// The manager keeps a session per stored account. Each refreshes on its own (its own
/// timers, refresh token, store record and refresh lease); the active one drives `state`,
/// `events` and `storeStatus`, and is the one the store restores at the next start. A
/// switch changes which session the flows follow (`state` takes the new account's state:
/// `loggedIn` with its tokens, or `sessionExpired`) and emits `accountSwitched`; nothing is
/// refreshed, cancelled or signed out by it. An account that is signed out — here, or in
/// another process sharing the store — leaves the list.
///
/// With a store of one session these calls see one account at most.
extension SessionManager {
    /// The accounts with a session (signed in or expired), sorted by key; the active one
    /// says so. Any thread; a snapshot.
    public var accounts: [SessionAccount] {
        let (active, background) = sessions.withLockedValue { ($0.active, Array($0.background.values)) }
        var listed: [SessionAccount] = []
        for (engine, isActive) in background.map({ ($0, false) }) + [(active, true)] {
            let snapshot = engine.snapshot.withLockedValue { $0 }
            guard snapshot.state != .loggedOut else { continue }
            let key = snapshot.account ?? SessionEngine.accountKey(for: snapshot.memberID)
            listed.append(SessionAccount(
                key: key, memberID: snapshot.memberID, state: snapshot.state, isActive: isActive,
                profile: snapshot.profile))
        }
        return listed.sorted { $0.key < $1.key }
    }

    /// Makes `key`'s session the active one (see the type's notes). Returns once the store
    /// recorded it as the active account — also when `key` is active already: nothing is
    /// switched, and the store, which another process may have pointed elsewhere, names it.
    /// - Throws: `invalidArgument` if no such account has a session.
    public func switchAccount(to key: String) async throws(SessionError) {
        try await onLoopForAccounts { manager throws(SessionError) in try manager.switchAccountOnLoop(to: key) }
    }

    /// Signs in another account, keeping the active one signed in, in the background; the new
    /// one becomes active. Like `signIn` when no account is signed in.
    /// - Throws: `illegalTransition` if that account is signed in already.
    public func addAccount(_ tokens: SessionTokens) async throws(SessionError) {
        try await onLoopForAccounts { manager throws(SessionError) in try manager.addAccountOnLoop(tokens) }
    }

    /// Logs `key`'s account out (its record removed, its tokens revoked best effort); the
    /// others are untouched. The active account: as `logout()`.
    /// - Throws: `invalidArgument` if no such account has a session.
    public func logout(account key: String) async throws(SessionError) {
        try await onLoopForAccounts { manager throws(SessionError) in try manager.logoutOnLoop(account: key) }
    }

    /// Logs every account out.
    public func logoutAll() async throws(SessionError) {
        try await onLoopForAccounts { manager throws(SessionError) in try manager.logoutAllOnLoop() }
    }

    private func onLoopForAccounts(
        _ body: @escaping @Sendable (SessionManager) throws(SessionError) -> Void
    ) async throws(SessionError) {
        // Declared in SessionManager.swift (private there): reached through a package hop.
        try await runOnLoopThenStore(body)
    }

    // MARK: - On the loop thread

    func signInOnLoop(_ tokens: SessionTokens, replacingUnreadableStore: Bool = false) throws(SessionError) {
        loop.assertInEventLoop()
        guard accountStore != nil else {
            try engine.signIn(tokens, replacingUnreadableStore: replacingUnreadableStore)
            return
        }
        let key = SessionEngine.accountKey(for: tokens.memberID)
        if let other = sessions.withLockedValue({ $0.background[key] }) {
            guard other.published.state != .loggedIn else {
                throw SessionError(.illegalTransition, "that account is signed in already: switch to it")
            }
            try switchAccountOnLoop(to: key)
        }
        try engine.signIn(tokens, replacingUnreadableStore: replacingUnreadableStore)
        recordActive(engine.published.account)
    }

    func addAccountOnLoop(_ tokens: SessionTokens) throws(SessionError) {
        loop.assertInEventLoop()
        let active = engine
        guard let accountStore, active.published.state != .loggedOut else {
            try signInOnLoop(tokens)
            return
        }
        let key = SessionEngine.accountKey(for: tokens.memberID)
        if active.published.account == key || sessions.withLockedValue({ $0.background[key] }) != nil {
            // That account has a session here: sign in there (refused if signed in).
            try signInOnLoop(tokens)
            return
        }
        guard !tokens.accessToken.isBlank else {
            throw SessionError(.invalidArgument, "the access token is blank")
        }
        try active.checkOpen()
        let added = try SessionEngine(
            loop: loop, authority: authority, store: accountStore, configuration: configuration,
            account: key, active: false, onStateChange: { [weak self] in self?.accountsChanged() })
        try makeActive(added)
        // Its record is being read (made on the loop): a new account's record, replaced by
        // this sign-in whatever the read finds (at most the same account's older tokens).
        try added.signIn(tokens, replacingUnreadableStore: true)
        recordActive(key)
    }

    /// `followingReadAt`: the switch follows another process's sign-in of `key`, found by a
    /// read of the store submitted at that mark (`AccountsMachine.activeFollowed`); nil for a
    /// switch of this process's own.
    func switchAccountOnLoop(
        to key: String, followingReadAt mark: AccountsMachine.PointerMark? = nil
    ) throws(SessionError) {
        loop.assertInEventLoop()
        try engine.checkOpen()
        let active = engine.published
        if active.account == key, active.state != .loggedOut {
            // Nothing to switch. An explicit switch still records `key`: the store may name
            // another account (another process chose it since this one took `key`), and the
            // call returns once the store names `key`. A followed switch found it named there.
            if mark == nil { recordActive(key) }
            return
        }
        guard let target = sessions.withLockedValue({ $0.background[key] }), target.published.state != .loggedOut else {
            throw SessionError(.invalidArgument, "no account \"\(key)\" is signed in here")
        }
        try makeActive(target)
        recordActive(key, followingReadAt: mark)
        target.emit(.accountSwitched(account: key))
    }

    /// The store remembers `key` as the active account (for the next start) — unless the
    /// change follows another process's, found by a read at `mark`, and needs no write.
    private func recordActive(_ key: String?, followingReadAt mark: AccountsMachine.PointerMark? = nil) {
        guard accountStore != nil, let key else { return }
        if let mark {
            accountsEvent { $0.activeFollowed(to: key, readAt: mark) }
            return
        }
        accountsEvent { $0.activeChanged(to: key) }
    }

    /// The store took a write of the active session: if it missed the last change of the
    /// active account, that change is made again now.
    func activeWriteLanded() {
        accountsEvent { $0.activeWriteLanded() }
    }

    /// Runs an event of the accounts machine under the lock, then performs its actions
    /// after releasing it (they submit store work and make sessions, which take the lock).
    func accountsEvent(_ event: (inout AccountsMachine) -> [AccountsMachine.Action]) {
        let actions = sessions.withLockedValue { sessions in
            let actions = event(&sessions.accounts)
            assert(sessions.accounts.checkInvariants() == nil, "accounts machine: \(sessions.accounts.checkInvariants() ?? "")")
            return actions
        }
        for action in actions { perform(action) }
    }

    private func perform(_ action: AccountsMachine.Action) {
        guard let accountStore else { return }
        switch action {
        case .readList(let request):
            // On the active session's worker: after its own read, so its account is known.
            engine.worker.submit({ _ in accountStore.readAccounts() }) { [weak self] answer in
                self?.accountsEvent { $0.listAnswered(answer, request: request) }
            }
        case .addSessions(let list):
            do {
                try addBackgroundSessions(list)
            } catch {
                configuration.logger.warning("cannot start the sessions of the other accounts", metadata: ["error": "\(error)"])
                accountsEvent { $0.sessionsNotMade() }
            }
        case .readListLater:
            let timer = try? loop.scheduleTimer(after: configuration.storeRetryInterval) { [weak self] in
                guard let self else { return }
                sessions.withLockedValue { $0.listRetry = nil }
                accountsEvent { $0.listRetryFired() }
            }
            sessions.withLockedValue { $0.listRetry = timer }
        case .writePointer(let key, let request):
            // One worker for the pointer: its writes land in the order they were made.
            pointerWorker?.submit({ _ -> StoreError? in
                do throws(StoreError) {
                    try accountStore.setActiveAccount(key)
                    return nil
                } catch {
                    return error
                }
            }) { [weak self, logger = configuration.logger] failure in
                if let failure {
                    logger.warning("the store did not record the active account yet (it is recorded with the next write it takes)",
                        metadata: ["error": "\(failure.message)"])
                }
                self?.accountsEvent { $0.pointerAnswered(request: request, failed: failure != nil) }
            }
        }
    }

    func logoutOnLoop(account key: String) throws(SessionError) {
        loop.assertInEventLoop()
        let active = engine.published
        if active.account == key || (accountStore == nil && active.state != .loggedOut
            && SessionEngine.accountKey(for: active.memberID) == key)
        {
            try engine.logout()
            return
        }
        guard let target = sessions.withLockedValue({ $0.background[key] }) else {
            throw SessionError(.invalidArgument, "no account \"\(key)\" is signed in here")
        }
        try target.logout()
    }

    func logoutAllOnLoop() throws(SessionError) {
        loop.assertInEventLoop()
        try engine.checkOpen()
        for target in sessions.withLockedValue({ Array($0.background.values) }) where target.published.state != .loggedOut {
            try target.logout()
        }
        if engine.published.state != .loggedOut {
            try engine.logout()
        }
    }

    func closeOnLoop() {
        loop.assertInEventLoop()
        let (active, background, listRetry) = sessions.withLockedValue {
            _ = $0.accounts.close()
            return ($0.active, Array($0.background.values) + $0.retired.values, $0.listRetry.take())
        }
        listRetry?.cancel()
        for engine in background { engine.close() }
        // Last: it completes the manager's flows.
        active.close()
    }

    /// What the active session tells the manager (`makeActive` unhooks the one before).
    func hookActive(_ engine: SessionEngine) {
        engine.onStoreChanged = { [weak self] in self?.storeChanged() }
        engine.onWriteLanded = { [weak self] in self?.activeWriteLanded() }
        engine.onFollowSignIn = { [weak self] key, mark in self?.followingSignIn(to: key, readAt: mark) ?? false }
        engine.onStoreReadSubmitted = { [weak self] in
            self?.sessions.withLockedValue { $0.accounts.pointerMark } ?? .unknown
        }
    }

    /// The active session, signed out, is about to follow another process's sign-in of `key`:
    /// if `key` has a session here (in the background), that session becomes the active one
    /// instead, and the active session does not take the record (one session per account).
    /// The switch waits for the background session's store work (its first read may still be
    /// on its worker: until it answers the session is signed out) and never runs inside the
    /// active session's store answer; it is dropped if the asking session is no longer the
    /// active one or signed in meanwhile (a sign-in here wins). `mark`: where this manager's
    /// pointer writes stood when the read that found the sign-in was submitted (the switch
    /// writes the pointer only if one of ours may have landed after that read).
    func followingSignIn(to key: String, readAt mark: AccountsMachine.PointerMark) -> Bool {
        loop.assertInEventLoop()
        guard let target = sessions.withLockedValue({ $0.background[key] }) else { return false }
        let asking = engine
        // Posted although on the loop: an inline store's worker runs `afterPendingWork`'s body
        // at once, which would switch inside the asking session's store answer.
        try? loop.execute { [weak self] in
            target.worker.afterPendingWork { [weak self] in
                guard let self, loop.inEventLoop, engine === asking, asking.published.state == .loggedOut else {
                    return
                }
                try? switchAccountOnLoop(to: key, followingReadAt: mark)
            }
        }
        return true
    }

    /// Another process changed the store (the active session saw it): accounts it signed in
    /// join the list, each with a session of its own in the background.
    func storeChanged() {
        loop.assertInEventLoop()
        accountsEvent { $0.storeChanged() }
    }

    /// `engine` becomes the active session; the one before goes to the background (or, signed
    /// out, away).
    private func makeActive(_ next: SessionEngine) throws(SessionError) {
        let previous = engine
        guard previous !== next else { return }
        try previous.detach()
        let (previousState, nextState) = (previous.published, next.published)
        if let key = nextState.account {
            sessions.withLockedValue { $0.background[key] = nil }
        }
        previous.onStoreChanged = nil
        previous.onWriteLanded = nil
        previous.onFollowSignIn = nil
        previous.onStoreReadSubmitted = nil
        hookActive(next)
        next.attach(surface)
        let leaves = previousState.state == .loggedOut || previousState.account == nil
        sessions.withLockedValue { sessions in
            sessions.active = next
            if leaves {
                // In the same step: a wait for the store work never misses it.
                sessions.retired[ObjectIdentifier(previous)] = previous
            } else if let key = previousState.account {
                sessions.background[key] = previous
            }
        }
        if leaves { retire(previous) }
        accountsChanged()
    }

    /// A session that is no longer anyone's. It stays among the `retired` — its store work
    /// waited for by `waitForStoreWork` and `afterStoreWork` (a background account's logout
    /// clears its record there: a host that destroys its runtime next must find it gone) —
    /// and is closed on a later turn (never inside its own entry point) once the store work it
    /// submitted so far has answered: a logout's clear that failed then gets the last try a
    /// closing session gives a store that missed a write (`StoreSyncMachine.close`; closed
    /// before the answer, nothing would try it again). Let go of once its worker has run
    /// everything it was given, the close's work included.
    func retire(_ engine: SessionEngine) {
        // The loop reads it: cleared there (a change before then finds it no longer listed).
        if loop.inEventLoop { engine.onStateChange = nil }
        let id = ObjectIdentifier(engine)
        sessions.withLockedValue { $0.retired[id] = engine }
        let (loop, sessions) = (self.loop, self.sessions)
        engine.worker.afterPendingWork {
            do {
                try loop.execute {
                    engine.onStateChange = nil
                    engine.close()
                    Self.forget(engine, in: sessions, loop: loop)
                }
            } catch {
                // The loop is shutting down: the session's own teardown hook closes it (it
                // holds the session weakly). Held here until the loop's last hook, so that
                // the close happens and its store work is waited for; then it leaves.
                let leave: @Sendable () -> Void = {
                    engine.worker.afterPendingWork { sessions.withLockedValue { $0.leave(id) } }
                }
                if !loop.addFinalHook(leave) { leave() }
            }
        }
    }

    /// Drops a closed retired session once its worker has run all it was given: an answer
    /// delivered after the close may submit more (a refresh lease released), so the marker
    /// is queued again while anything was submitted after it. On the loop thread, where the
    /// session submits (or on the worker, the loop gone).
    private static func forget(_ engine: SessionEngine, in sessions: LockedBox<Sessions>, loop: EventLoop) {
        let worker = engine.worker
        let before = worker.jobsQueued
        worker.afterPendingWork {
            // More than the marker itself queued since (an inline store queues nothing).
            if loop.inEventLoop && worker.jobsQueued > before + 1 {
                forget(engine, in: sessions, loop: loop)
                return
            }
            sessions.withLockedValue { $0.leave(ObjectIdentifier(engine)) }
        }
    }

    /// A session's state changed: a background account signed out leaves; the list is read
    /// once the store answers.
    func accountsChanged() {
        loop.assertInEventLoop()
        let leaving = sessions.withLockedValue { sessions -> [SessionEngine] in
            let gone = sessions.background.filter { $0.value.published.isSignedOut }
            for (key, engine) in gone {
                sessions.background[key] = nil
                // In the same step: a wait for the store work never misses it.
                sessions.retired[ObjectIdentifier(engine)] = engine
            }
            return Array(gone.values)
        }
        for engine in leaving { retire(engine) }
        let storeReading = engine.storeStatus.value == .reading
        accountsEvent { $0.sessionStateChanged(storeReading: storeReading) }
    }

    /// Reads the list on `worker` and waits for it: the manager's creation off the loop thread
    /// (which may wait; the loop never does).
    func listAccountsNow(on worker: StoreWorker) throws(SessionError) {
        guard let accountStore else { return }
        for case .readList(let request) in sessions.withLockedValue({ $0.accounts.listWanted() }) {
            let answer = worker.performAndWait { _ in accountStore.readAccounts() }
            for action in sessions.withLockedValue({ $0.accounts.listAnswered(answer, request: request) }) {
                guard case .addSessions(let list) = action else {
                    perform(action)  // an unavailable store: read again on the timer
                    continue
                }
                do {
                    try addBackgroundSessions(list)
                } catch {
                    _ = sessions.withLockedValue { $0.accounts.sessionsNotMade() }
                    throw error
                }
            }
        }
    }

    /// A session for each listed account that has none yet (in the background): the list
    /// the accounts machine took (`AccountsMachine.listAnswered`).
    func addBackgroundSessions(_ list: StoredAccounts) throws(SessionError) {
        guard let accountStore else { return }
        // The active engine's snapshot is read after the box's lock is released (the insertion
        // below reads it under the lock, in the order sessions → snapshot).
        let active = sessions.withLockedValue { $0.active }
        // The active account's own read tells which account it took (the same worker, earlier).
        let activeKey = active.published.account ?? list.active
        // Each account's session is made once: its key is reserved under the lock before it is
        // made, so a second list read meanwhile (a manager made off the loop thread, against
        // one on it) makes none again — a second session of an account would start, and could
        // refresh with the same refresh token as the first.
        let keys = sessions.withLockedValue { sessions -> [String] in
            let keys = list.keys.filter {
                sessions.background[$0] == nil && !sessions.making.contains($0) && $0 != activeKey
            }
            sessions.making.formUnion(keys)
            return keys
        }
        var made: [String: SessionEngine] = [:]
        do throws(SessionError) {
            for key in keys {
                let engine = try SessionEngine(
                    loop: loop, authority: authority, store: accountStore, configuration: configuration,
                    account: key, active: false, onStateChange: { [weak self] in self?.accountsChanged() },
                    startsLater: true)
                guard loop.inEventLoop || !engine.snapshot.withLockedValue({ $0.isSignedOut }) else {
                    // Read at creation (off the loop): the record went meanwhile. (A store that
                    // could not be read is not that: the session reads it again once started.)
                    retire(engine)
                    continue
                }
                made[key] = engine
            }
        } catch {
            sessions.withLockedValue { $0.making.subtract(keys) }
            for engine in made.values { retire(engine) }
            throw error
        }
        #if DEBUG
        Self.beforeBackgroundInsertion?(self)
        #endif
        // A session another path listed for the account meanwhile stays, and so does the active
        // one if it took the account (it followed another process's sign-in; read under the
        // box's lock, as `accountsChanged` does): this one is retired, never just dropped.
        let (inserted, duplicates) = sessions.withLockedValue { sessions -> ([SessionEngine], [SessionEngine]) in
            sessions.making.subtract(keys)
            let activeNow = sessions.active.published.account
            var (inserted, duplicates): ([SessionEngine], [SessionEngine]) = ([], [])
            for (key, engine) in made {
                if sessions.background[key] == nil && key != activeNow {
                    sessions.background[key] = engine
                    inserted.append(engine)
                } else {
                    duplicates.append(engine)
                }
            }
            return (inserted, duplicates)
        }
        for engine in duplicates { retire(engine) }
        // Started once listed (a duplicate never starts); a loop shut down meanwhile closes them.
        guard !loop.inEventLoop else {
            for engine in inserted { try? engine.queueStart() }
            return
        }
        // Nothing listed here: nothing to start or to retire (and no job: a manager made off the
        // loop with one account, a C host's, starts up without it — measured, the job cost
        // start-up 1.5–2 ms).
        guard !inserted.isEmpty else { return }
        // Off the loop thread the active session's published account can lag its own: a sign-in
        // running on the loop now binds the account, then publishes at its end. One loop job,
        // after it, looks again and starts the sessions not retired meanwhile: those still
        // listed, and one a switch made active since (a followed sign-in of its account).
        try? loop.execute { [weak self] in
            guard let self else { return }
            retireBackgroundSessionOfTheActiveAccount()
            guard configuration.startsAutomatically else { return }
            let kept = sessions.withLockedValue { sessions in
                inserted.filter { engine in
                    sessions.active === engine || sessions.background.values.contains { $0 === engine }
                }
            }
            for engine in kept { engine.start() }
        }
    }

    /// A background session of the active session's account (listed off the loop thread while
    /// a sign-in into that account was running on it) is retired: the account keeps one
    /// session, the active one. Loop thread.
    func retireBackgroundSessionOfTheActiveAccount() {
        loop.assertInEventLoop()
        let duplicate = sessions.withLockedValue { sessions -> SessionEngine? in
            guard let key = sessions.active.published.account,
                  let duplicate = sessions.background.removeValue(forKey: key)
            else { return nil }
            // In the same step: a wait for the store work never misses it.
            sessions.retired[ObjectIdentifier(duplicate)] = duplicate
            return duplicate
        }
        if let duplicate { retire(duplicate) }
    }
}
