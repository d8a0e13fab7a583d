// Over 400 lines (453): the engine's state and its entry points stay together; its actions, store
// and account work already live in SessionEngine+Actions/+Store/+Accounts.swift.
import LoopFlow
import Logging

/// Receives a token or the reason there is none. Always called on the loop thread, and
/// never inside the call that asked.
public typealias TokenCompletion = @Sendable (Result<Secret, SessionError>) -> Void

/// The session's storage: it holds the two pure state machines — `SessionStateMachine`
/// (who is signed in) and `RefreshStateMachine` (keeping the tokens fresh) — and performs
/// the actions they return: timers, authority requests, the store, the flows.
///
/// Loop-confined: every entry point runs on the loop thread (`SessionManager` posts to it)
/// and checks so in debug builds; nothing here needs a lock. Each entry point ends by
/// publishing the `snapshot` other threads read (`isLoggedIn`, `memberID`, `timing`).
final class SessionEngine: @unchecked Sendable {
    /// What any thread may read without waiting for the loop.
    struct Snapshot: Sendable {
        var hasAccessToken = false
        /// The tokens are bound to the session's DPoP key (RFC 9449): the access token's type is
        /// `DPoP`, not `Bearer`.
        var dpopBound = false
        var memberID: String?
        var state = SessionState.loggedOut
        /// The account key of its record, in a store of several accounts.
        var account: String?
        /// Loop-clock instants, for status displays.
        var expiresAt: Duration?
        var nextRefreshAt: Duration?
        /// The scope granted to the access token, when known.
        var scope: String?
        /// Who minted the tokens (issuer, client, scopes), when known; granted scope: the live one.
        var profile: SessionProfile?
        /// The store has not answered the session's first read yet: `loggedOut` then means
        /// "not known yet", not signed out.
        var awaitingStore = false
        /// The access token a `.fresh` request would be answered with at once, without a
        /// refresh or any other action, while the loop clock is before `freshUntil` (nil: a
        /// request must go to the loop). `SessionManager.freshAccessToken()`'s fast path.
        var freshToken: Secret?
        var freshUntil: Duration?
        /// The two above, as the manager's surface keeps them (`SessionOutput.fresh`).
        var fresh: FreshToken { FreshToken(token: freshToken, until: freshUntil) }

        /// Signed out, knowingly: its record was read (a session whose record is still being
        /// read, or cannot be read yet, is loggedOut without being signed out).
        var isSignedOut: Bool { state == .loggedOut && !awaitingStore }
    }

    /// The snapshot published at the end of the last entry point: all its manager reads of it
    /// (the manager never looks at the machines inside).
    var published: Snapshot { snapshot.withLockedValue { $0 } }

    /// Any thread: the current access token if a `.fresh` request would be answered with it
    /// at once (valid, not due for a refresh, none in flight, the session open); else nil.
    func freshTokenWithoutWaiting() -> Secret? {
        let now = loop.now
        return snapshot.withLockedValue { $0.fresh.answer(at: now) }
    }

    typealias Refresh = RefreshStateMachine<TokenCompletion>

    let loop: EventLoop
    let authority: any SessionAuthority
    let configuration: SessionConfiguration
    var policy: RefreshPolicy { configuration.policy }
    var logger: Logger { configuration.logger }
    /// The only way to the store: its worker (never a store call on the loop thread).
    let worker: StoreWorker

    /// Where the session publishes: its own flows, or — the active account of a manager with
    /// several (`attach`) — the manager's. Loop-confined after init.
    var output: SessionOutput
    var state: MutableStateFlow<SessionState> { output.state }
    var events: MutableSharedFlow<SessionEvent> { output.events }
    var storeStatus: MutableStateFlow<StoreStatus> { output.storeStatus }
    let snapshot = LockedBox(Snapshot())
    /// The store of several accounts this session keeps one record of (nil: a store with one
    /// session). Its record is `accountKey`'s (nil: none yet — the session follows the
    /// store's active account until it signs in).
    let accountStore: (any AccountCredentialStore)?
    var accountKey: String?
    /// Whether this session drives its manager's flows. Loop-confined; set by the manager.
    var isActive = true
    /// Called on the loop thread after each state change (the manager's account list).
    var onStateChange: (() -> Void)?
    /// Called on the loop thread when another process changed the shared store (the
    /// manager's account list: accounts signed in elsewhere join it).
    var onStoreChanged: (() -> Void)?
    /// Called on the loop thread when the store took one of this session's writes (the
    /// manager records the active account again if that failed before).
    var onWriteLanded: (() -> Void)?
    /// Asked on the loop thread before this session, signed out, follows another process's
    /// sign-in of an account: true if the manager has that account's session and takes over.
    /// With the mark of the read that found the sign-in (`changeReadPointerMark`).
    var onFollowSignIn: ((String, AccountsMachine.PointerMark) -> Bool)?
    /// Asked on the loop thread as this session submits a read of the store for another
    /// process's change: where the manager's active-account pointer writes stand.
    var onStoreReadSubmitted: (() -> AccountsMachine.PointerMark)?
    /// That mark, for the change read last submitted (one is on the worker at a time, and
    /// its answer is followed as it arrives); `unknown` while no manager asks.
    var changeReadPointerMark = AccountsMachine.PointerMark.unknown
    /// Records whose clear failed, cleared again with the store's retries (`clearRecord`).
    var recordsToClear: Set<String> = []

    // Loop-confined (after init). Not `private` only because the engine's actions live in
    // SessionEngine+Actions.swift and +Store.swift; nothing outside the engine's files touches
    // them.
    var machine: SessionStateMachine
    var refresh: Refresh
    var memberID: String?
    /// Issuer, client, scopes as signed in or read from the store (nil: not known); follows `memberID`.
    var profile: SessionProfile?
    var timers: [RefreshTimer: LoopTimer] = [:]
    /// The request of the attempt in flight, until it answers (so it can be cancelled).
    var requestInFlight: RequestInFlight?
    /// Where the store stands against the session (`StoreSyncMachine`), and its retry timer.
    var storeMachine = StoreSyncMachine()
    var retryTimer: LoopTimer?
    /// The store other processes share, if it is one (this session's record of it).
    var shared: (any SharedCredentialStore)? { worker.store as? any SharedCredentialStore }
    var storeWatch: DirectoryWatch?
    var closed = false

    /// - Parameters:
    ///   - store: the session's store. In a store of several accounts, the session keeps the
    ///     record of `account` (nil: the active account's, whichever it is — and none once it
    ///     signs out until it signs in again).
    ///   - active: whether it starts as its manager's active account.
    ///   - onStateChange: set here, before the start job is queued: the loop reads it (a
    ///     session made off the loop thread would race with its own start otherwise).
    ///   - startsLater: its start job is not queued here but by `queueStart()` (a session made
    ///     for the account list starts once it is in the list: one retired as a duplicate
    ///     before never starts, so never refreshes with the account's refresh token).
    init(
        loop: EventLoop, authority: any SessionAuthority, store: any CredentialStore,
        configuration: SessionConfiguration, account: String? = nil, active: Bool = true,
        onStateChange: (() -> Void)? = nil, startsLater: Bool = false
    ) throws(SessionError) {
        if let problem = configuration.policy.problem {
            throw SessionError(.invalidArgument, "unusable refresh policy: \(problem)")
        }
        self.loop = loop
        self.authority = authority
        self.configuration = configuration
        let accounts = store as? any AccountCredentialStore
        self.accountStore = accounts
        self.accountKey = account
        self.isActive = active
        self.onStateChange = onStateChange
        let target: any CredentialStore =
            if let accounts {
                account.map { accounts.account($0, isActive: active) } ?? ActiveAccountRecord(accounts)
            } else {
                store
            }
        self.worker = StoreWorker(store: target, loop: loop)
        self.machine = SessionStateMachine()
        self.refresh = Refresh(policy: configuration.policy, usesRefreshLock: store is any SharedCredentialStore)
        self.output = try SessionOutput(loop: loop, configuration: configuration, state: .loggedOut, storeStatus: .reading)
        if worker.inline || !loop.inEventLoop {
            // Restore before anyone can observe, so the first state seen is the stored one:
            // a store that never blocks is read inline; off the loop thread, this thread
            // waits for the worker's read (the loop does not).
            let read = worker.readAndWait()
            // Off the loop thread here: the event's only effect is the machine's (no action).
            _ = storeMachine.firstReadHeld(read)
            if case .unavailable(let error) = read {
                storeStatus.value = .unavailable(error)
            } else {
                restore(from: read)
                storeStatus.value = .available
            }
        } else {
            // On the loop thread, which never waits for the store: start `loggedOut` with
            // the store `reading`; the stored session is restored when the read answers.
            storeEvent { $0.initialReadOnWorker() }
            worker.read { [weak self] read in self?.storeAnswered(.initialRead(read)) }
        }
        state.value = machine.state
        publishSnapshot()
        if !startsLater { try queueStart() }
        // When the loop goes, waiters are answered and timers stopped.
        guard loop.addTeardownHook({ [weak self] in self?.close() }) else {
            throw SessionError(.shutDown, "the event loop is shut down")
        }
    }

    /// Queues the start, unless the host starts the session itself (`startsAutomatically` off).
    func queueStart() throws(SessionError) {
        guard configuration.startsAutomatically else { return }
        do {
            try loop.execute { [self] in start() }
        } catch {
            throw SessionError(.shutDown, "the event loop is shut down")
        }
    }

    // MARK: - Entry points (loop thread)

    /// Every entry point: on the loop thread, started, and the snapshot published at the end.
    func entry<T, Failure: Error>(_ body: () throws(Failure) -> T) throws(Failure) -> T {
        loop.assertInEventLoop()
        start()
        return try answerEntry(body)
    }

    /// The entry of an answer (the store worker's): like `entry`, but an answer never starts
    /// the session (the request it answers did, or it belongs to the creation).
    func answerEntry<T, Failure: Error>(_ body: () throws(Failure) -> T) throws(Failure) -> T {
        loop.assertInEventLoop()
        defer {
            publishSnapshot()
            assert(refresh.checkInvariants() == nil, "refresh state machine: \(refresh.checkInvariants() ?? "")")
        }
        return try body()
    }

    /// Emits the start-up events (`initialSession`, a start-up `storeError`) and resumes a
    /// restored session. Runs once: on the loop's first turn after creation, or — with
    /// `startsAutomatically` off — when the host calls `start()` (or makes any request),
    /// so that it can subscribe first and miss nothing.
    func start() {
        loop.assertInEventLoop()
        storeEvent { $0.startRequested() }
    }

    /// The start, from the first read (`StoreSyncMachine.Action.startUp`).
    func start(from read: StoreRead) {
        if !configuration.startsAutomatically {
            // The host chose when to start: the store may have changed since it was read
            // at creation (another process logged out or refreshed).
            if worker.inline {
                // Nothing has happened to this session yet (any request starts it first),
                // so start from what the store holds now.
                let now = worker.readAndWait()
                if now != read {
                    machine = SessionStateMachine()
                    (memberID, profile) = (nil, nil)
                    refresh = Refresh(policy: configuration.policy, usesRefreshLock: shared != nil)
                    if case .unavailable = now {} else {
                        restore(from: now)
                        // A first read held unavailable is answered by this one.
                        storeEvent { $0.initialReadAnswered() }
                    }
                    publish(machine.state)
                    startUp(with: now)
                    return
                }
            } else {
                // The loop does not wait for the store: start from what was read at creation,
                // then read again and follow what changed since, as another process's change.
                startUp(with: read)
                readAndFollowStore()
                return
            }
        }
        startUp(with: read)
    }

    /// Watches the shared store's directory (found on the worker: it may have to be made).
    func watchSharedStore() {
        guard shared != nil else { return }
        worker.submit({ store -> String? in (store as? any SharedCredentialStore)?.directoryToWatch() }) { [weak self] found in
            self?.storeAnswered(.directoryFound(found))
        }
    }

    /// Signs in. While the store has not answered the initial read (`storeStatus` `.reading`
    /// or `.unavailable` since the start), the session does not know what is stored: a
    /// sign-in is refused (`storeUnavailable`) — nothing stored may be lost without the host
    /// asking — unless `replacingUnreadableStore`: then it goes on in memory and its session
    /// replaces whatever the store holds once the store takes the write (when the initial read
    /// answers later, what it found is not restored: the host chose this sign-in over it).
    func signIn(_ tokens: SessionTokens, replacingUnreadableStore: Bool = false) throws(SessionError) {
        try entry { () throws(SessionError) in
            guard !tokens.accessToken.isBlank else {
                throw SessionError(.invalidArgument, "the access token is blank")
            }
            try checkOpen()
            var next = machine
            try next.apply(.signIn)
            if storeMachine.awaitingInitialRead, !replacingUnreadableStore {
                throw storeUnknownError()
            }
            machine = next
            let abandoned = endSession()
            takeRecord(for: tokens)
            #if DEBUG
            Self.afterTakingRecordInSignIn.withLockedValue { $0 }?(self)
            #endif
            let lifetime = policy.clampedLifetime(tokens.expiresIn)
            refresh.sessionBegan(LiveSession(
                accessToken: tokens.accessToken, refreshToken: tokens.refreshToken,
                expiresAt: loop.now + lifetime, lifetime: lifetime, externalUserID: tokens.externalUserID,
                scope: tokens.scope, dpopKey: tokens.dpopKey))
            memberID = tokens.memberID
            profile = tokens.profile
            persist()
            publish(.loggedIn)
            emit(.signedIn(memberID: memberID))
            perform(refresh.scheduleProactive(now: loop.now, unitRandom: configuration.random()))
            fail(abandoned, SessionError(.sessionEnded, "a new session was signed in"))
        }
    }

    /// Why a sign-in is refused while the stored session is not known (no token in it: a store
    /// error's message names paths and reasons only).
    private func storeUnknownError() -> SessionError {
        if case .unavailable(let error) = storeStatus.value {
            return SessionError(
                .storeUnavailable,
                "the credential store cannot be read, so the stored session is not known (\(error.message)); "
                    + "signing in now would replace it: wait until the store is readable, or sign in replacing the store")
        }
        return SessionError(
            .storeUnavailable,
            "the stored session is still being read: wait for the store status to leave reading, "
                + "or sign in replacing the store")
    }

    /// Clears the store first, then cancels every timer, then revokes best effort.
    func logout() throws(SessionError) {
        try entry { () throws(SessionError) in
            try checkOpen()
            try machine.apply(.logout)
            let ended = refresh.live
            let endedProfile = profile
            (memberID, profile) = (nil, nil)
            forgetRecord()
            let abandoned = endSession()
            publish(.loggedOut)
            emit(.signedOut(reason: .userRequested))
            fail(abandoned, SessionError(.sessionEnded, "logged out"))
            if let ended, authority.canRevoke {
                authority.revoke(
                    refreshToken: ended.refreshToken, accessToken: ended.accessToken, profile: endedProfile,
                    completion: completion { [logger] (result: Result<Void, AuthorityError>, _) in
                        if case .failure(let error) = result {
                            logger.info("revocation failed (the session is logged out locally)", metadata: ["error": "\(error)"])
                        }
                    })
            }
        }
    }

    func reconfigure() throws(SessionError) {
        try entry { () throws(SessionError) in
            try checkOpen()
            try machine.apply(.reconfigure)
            (memberID, profile) = (nil, nil)
            forgetRecord()
            let abandoned = endSession()
            publish(.loggedOut)
            emit(.signedOut(reason: .reconfigured))
            fail(abandoned, SessionError(.sessionEnded, "reconfigured"))
        }
    }

    /// The current token, or a refreshed one when within the margin of expiry.
    func freshAccessToken(_ completion: @escaping TokenCompletion) {
        // A request runs as a job of its own, between entries, when the published snapshot is
        // current: a token it calls fresh is what the machine would answer, with no action —
        // so no entry, no second publication (the valid-token path of the C API).
        if let token = freshTokenWithoutWaiting() {
            completion(.success(token))
            return
        }
        requestToken(.fresh, completion)
    }

    /// Refreshes now, whatever the margin says (joins a refresh already in flight; a
    /// scheduled retry is brought forward).
    func refreshNow(_ completion: @escaping TokenCompletion) {
        requestToken(.refreshNow, completion)
    }

    /// A request failed with 401 using `token`: refresh only if it is still the current
    /// token (compare-and-refresh); otherwise hand back the current one.
    func handleUnauthorized(token: Secret, _ completion: @escaping TokenCompletion) {
        requestToken(.unauthorized(token), completion)
    }

    private func requestToken(_ request: Refresh.TokenRequest, _ completion: @escaping TokenCompletion) {
        entry {
            guard refresh.live != nil, machine.state == .loggedIn, !closed else {
                completion(.failure(notUsableError()))
                return
            }
            perform(refresh.tokenRequested(request, waiter: completion, now: loop.now))
        }
    }

    /// The host came back from the background: validate, coalesced with a refresh already
    /// due or in flight.
    func resume() {
        entry {
            guard machine.state == .loggedIn, !closed else { return }
            perform(refresh.resumeRequested(now: loop.now, canValidate: authority.canValidate))
        }
    }

    /// Stops everything: waiters fail, timers stop, the flows complete.
    func close() {
        loop.assertInEventLoop()
        guard !closed else { return }
        defer { publishSnapshot() }
        let abandoned = endSession(keepTokens: true)
        storeWatch?.cancel()
        storeWatch = nil
        // The retry stops; a store that missed a write, or a clear, gets one last try.
        storeEvent { $0.close(owesClears: !recordsToClear.isEmpty) }
        closed = true
        fail(abandoned, SessionError(.shutDown, "the session manager was closed"))
        output.finish()
    }

    // MARK: - Entry points for answers, timers and the store

    func authorityAnswered(_ identity: AttemptIdentity, _ result: Result<TokenGrant, AuthorityError>, at receivedAt: Duration) {
        entry {
            perform(refresh.answerArrived(
                identity, result, receivedAt: receivedAt, now: loop.now, unitRandom: configuration.random(),
                canReauthenticate: authority.canReauthenticate))
        }
    }

    func validationAnswered(generation: UInt64, token: Secret, result: Result<Bool, AuthorityError>) {
        entry {
            perform(refresh.validationAnswered(generation: generation, token: token, result: result, now: loop.now))
        }
    }

    func timerFired(_ timer: RefreshTimer) {
        entry {
            timers[timer] = nil
            perform(refresh.timerFired(
                timer, now: loop.now, unitRandom: configuration.random(),
                requestCancellable: requestInFlight?.completion.isCancellable ?? false,
                answerArrivingBy: requestInFlight?.completion.answerArrivingBy))
        }
    }

    /// Another process changed the shared store: follow it.
    func storeChanged() {
        logger.debug("store directory changed")
        entry { readAndFollowStore() }
        onStoreChanged?()
    }
}

/// The request an attempt sent, and the completion that can cancel it.
struct RequestInFlight {
    let attempt: UInt64
    let completion: AuthorityCompletion<TokenGrant>
}
