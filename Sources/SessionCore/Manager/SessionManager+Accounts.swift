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
            listed.append(SessionAccount(key: key, memberID: snapshot.memberID, state: snapshot.state, isActive: isActive))
        }
        return listed.sorted { $0.key < $1.key }
    }

    /// Makes `key`'s session the active one (see the type's notes). Returns once the store
    /// recorded it as the active account.
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
            guard other.machine.state != .loggedIn else {
                throw SessionError(.illegalTransition, "that account is signed in already: switch to it")
            }
            try switchAccountOnLoop(to: key)
        }
        try engine.signIn(tokens, replacingUnreadableStore: replacingUnreadableStore)
        recordActive(engine.accountKey)
    }

    func addAccountOnLoop(_ tokens: SessionTokens) throws(SessionError) {
        loop.assertInEventLoop()
        let active = engine
        guard let accountStore, active.machine.state != .loggedOut else {
            try signInOnLoop(tokens)
            return
        }
        let key = SessionEngine.accountKey(for: tokens.memberID)
        if active.accountKey == key || sessions.withLockedValue({ $0.background[key] }) != nil {
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
            account: key, active: false)
        added.onStateChange = { [weak self] in self?.accountsChanged() }
        try makeActive(added)
        // Its record is being read (made on the loop): a new account's record, replaced by
        // this sign-in whatever the read finds (at most the same account's older tokens).
        try added.signIn(tokens, replacingUnreadableStore: true)
        recordActive(key)
    }

    func switchAccountOnLoop(to key: String) throws(SessionError) {
        loop.assertInEventLoop()
        try engine.checkOpen()
        if engine.accountKey == key, engine.machine.state != .loggedOut { return }
        guard let target = sessions.withLockedValue({ $0.background[key] }), target.machine.state != .loggedOut else {
            throw SessionError(.invalidArgument, "no account \"\(key)\" is signed in here")
        }
        try makeActive(target)
        recordActive(key)
        target.emit(.accountSwitched(account: key))
    }

    /// The store remembers `key` as the active account (for the next start), on the pointer's
    /// worker: changes of the pointer land in the order they were made.
    private func recordActive(_ key: String?) {
        guard let accountStore, let pointerWorker, let key else { return }
        sessions.withLockedValue { $0.pointerOwed = false }
        pointerWorker.submit({ _ -> StoreError? in
            do throws(StoreError) {
                try accountStore.setActiveAccount(key)
                return nil
            } catch {
                return error
            }
        }) { [weak self, logger = configuration.logger] failure in
            guard let failure else { return }
            logger.warning("the store did not record the active account yet (it is recorded with the next write it takes)",
                metadata: ["error": "\(failure.message)"])
            self?.sessions.withLockedValue { $0.pointerOwed = true }
        }
    }

    /// The store took a write of the active session: if it missed the last change of the
    /// active account, that change is made again now.
    func activeWriteLanded() {
        guard sessions.withLockedValue({ $0.pointerOwed }) else { return }
        recordActive(engine.accountKey)
    }

    func logoutOnLoop(account key: String) throws(SessionError) {
        loop.assertInEventLoop()
        if engine.accountKey == key || (accountStore == nil && engine.machine.state != .loggedOut
            && SessionEngine.accountKey(for: engine.memberID) == key)
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
        for target in sessions.withLockedValue({ Array($0.background.values) }) where target.machine.state != .loggedOut {
            try target.logout()
        }
        if engine.machine.state != .loggedOut {
            try engine.logout()
        }
    }

    func closeOnLoop() {
        loop.assertInEventLoop()
        let (active, background) = sessions.withLockedValue { ($0.active, Array($0.background.values)) }
        for engine in background { engine.close() }
        // Last: it completes the manager's flows.
        active.close()
    }

    /// Another process changed the store (the active session saw it): accounts it signed in
    /// join the list, each with a session of its own in the background.
    func storeChanged() {
        loop.assertInEventLoop()
        sessions.withLockedValue { $0.listed = false }
        listAccountsLater()
    }

    /// `engine` becomes the active session; the one before goes to the background (or, signed
    /// out, away).
    private func makeActive(_ next: SessionEngine) throws(SessionError) {
        let previous = engine
        guard previous !== next else { return }
        try previous.detach()
        if let key = next.accountKey {
            sessions.withLockedValue { $0.background[key] = nil }
        }
        previous.onStoreChanged = nil
        previous.onWriteLanded = nil
        next.onStoreChanged = { [weak self] in self?.storeChanged() }
        next.onWriteLanded = { [weak self] in self?.activeWriteLanded() }
        next.attach(surface)
        sessions.withLockedValue { sessions in
            sessions.active = next
            if let key = previous.accountKey, previous.machine.state != .loggedOut {
                sessions.background[key] = previous
            }
        }
        if previous.machine.state == .loggedOut || previous.accountKey == nil {
            retire(previous)
        }
        accountsChanged()
    }

    /// A session that is no longer anyone's: closed on a later turn (never inside its own
    /// entry point), its store work finishing on its worker.
    func retire(_ engine: SessionEngine) {
        engine.onStateChange = nil
        try? loop.execute { engine.close() }
    }

    /// A session's state changed: a background account signed out leaves; the list is read
    /// once the store answers.
    func accountsChanged() {
        loop.assertInEventLoop()
        let leaving = sessions.withLockedValue { sessions -> [SessionEngine] in
            let gone = sessions.background.filter { $0.value.isSignedOut }
            for key in gone.keys { sessions.background[key] = nil }
            return Array(gone.values)
        }
        for engine in leaving { retire(engine) }
        if !sessions.withLockedValue({ $0.listed }), engine.storeStatus.value != .reading {
            listAccountsLater()
        }
    }

    /// Reads the store's account list on the worker; a session is made for each account
    /// that has none (on the loop, when the answer arrives).
    func listAccountsLater() {
        guard let accountStore else { return }
        let generation = sessions.withLockedValue { sessions -> UInt64 in
            sessions.listGeneration &+= 1
            return sessions.listGeneration
        }
        engine.worker.submit({ _ in accountStore.readAccounts() }) { [weak self] answer in
            guard let self else { return }
            do {
                try addBackgroundSessions(answer, generation: generation)
            } catch {
                configuration.logger.warning("cannot start the sessions of the other accounts", metadata: ["error": "\(error)"])
            }
        }
    }

    /// A session for each listed account that has none yet (in the background). The answer of
    /// a read of `generation` (`listAccountsLater`) is taken only if no later read was asked for.
    func addBackgroundSessions(_ answer: AccountsRead, generation: UInt64? = nil) throws(SessionError) {
        guard let accountStore, case .present(let list) = answer else { return }
        let (known, listed, latest) = sessions.withLockedValue { sessions in
            (Set(sessions.background.keys).union([sessions.active.accountKey].compactMap { $0 }), sessions.listed,
             sessions.listGeneration)
        }
        guard !listed, generation == nil || generation == latest else { return }
        // The active account's own read tells which account it took (the same worker, earlier).
        let activeKey = sessions.withLockedValue { $0.active.accountKey } ?? list.active
        var made: [String: SessionEngine] = [:]
        for key in list.keys where !known.contains(key) && key != activeKey {
            let engine = try SessionEngine(
                loop: loop, authority: authority, store: accountStore, configuration: configuration,
                account: key, active: false)
            guard loop.inEventLoop || engine.snapshot.withLockedValue({ $0.state }) != .loggedOut else {
                // Read at creation (off the loop): the record went meanwhile.
                retire(engine)
                continue
            }
            engine.onStateChange = { [weak self] in self?.accountsChanged() }
            made[key] = engine
        }
        sessions.withLockedValue { sessions in
            sessions.listed = true
            sessions.background.merge(made) { old, _ in old }
        }
    }
}
