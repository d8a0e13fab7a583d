// The façade (over 400 lines, a third of them doc comments: it is the public API). Its parts
// stand apart already: accounts (SessionManager+Accounts), sign-in (+SignIn), authorizing
// requests (+Authorize); the work is the engine's (SessionEngine*), the bookkeeping of several
// accounts the pure AccountsMachine's.
import LoopFlow
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// An authenticated session that keeps itself alive, on an `EventLoop`.
///
/// - `state` is a `StateFlow<SessionState>` (current value first, distinct, conflated);
///   `events` a `SharedFlow<SessionEvent>`. Every callback runs on the loop thread.
/// - Tokens are refreshed before they expire (proactive timer with jitter), one refresh
///   at a time however many callers want a token, with backoff on transient failures.
///   Only the authority's terminal answer ends the session (SESSION_EXPIRED).
/// - At creation the stored session is restored (LOGGED_IN, refreshed if it expired).
/// - The store is never called on the loop thread: its work runs on the session's store
///   worker, one thread, in order (`CredentialStore`); `storeStatus` says whether the store
///   has answered. Made on a thread other than the loop's, the manager waits for the stored
///   session; made on the loop thread (a borrowed loop's host, a loop job), it starts
///   `loggedOut` with `storeStatus` `.reading` and restores the stored session when the read
///   answers (with the `initialSession` event).
///
/// Threading: every method is safe from any thread. The session's own work happens on
/// the loop thread; the `async` methods return once it is done, and the completion forms
/// call back on the loop thread, never inside the call.
public final class SessionManager: Sendable {
    public let loop: EventLoop
    let authority: any SessionAuthority
    let configuration: SessionConfiguration
    /// The flows the active account's session publishes into (`state`, `events`,
    /// `storeStatus`): the first session's own, kept for the manager's whole life.
    let surface: SessionOutput
    /// `surface.fresh`, reached without a retain on the valid-token path: `surface` keeps it
    /// (so `surface` and `SessionOutput.fresh` must stay `let`s that nothing replaces). Not `unowned(unsafe)`: loading one of
    /// those makes a strong reference, and the disassembly showed a retain and a release of the
    /// cell per token.
    let freshCell: Unmanaged<FreshTokenCell>
    /// A store of several accounts: one session per account (nil: one session).
    let accountStore: (any AccountCredentialStore)?
    /// Records the store's active account, one change after the other (nil: one session).
    let pointerWorker: StoreWorker?
    /// The sessions: changed on the loop thread only; read (under the lock) from any thread.
    let sessions: LockedBox<Sessions>
    /// Token requests accepted and not yet answered (posted, or waiting for a refresh): at
    /// most `configuration.tokenRequestLimit`.
    let tokenRequestsPending = Atomic<Int>(0)

    struct Sessions {
        /// The active account's session (or a signed-out one, with no account).
        var active: SessionEngine
        /// The other accounts' sessions, by account key: each refreshes on its own.
        var background: [String: SessionEngine] = [:]
        /// The account list and the active-account pointer (`AccountsMachine`): changed only
        /// through its events (`accountsEvent`), under this box's lock.
        var accounts = AccountsMachine()
        /// The accounts machine's `readListLater` (cancelled at close).
        var listRetry: LoopTimer?
        /// Sessions let go of (`retire`) whose store work has not landed yet — a background
        /// account's logout clears its record there: waited for like the others' (closed with
        /// them, if the manager closes first).
        var retired: [ObjectIdentifier: SessionEngine] = [:]
        /// Accounts whose background session is being made (`addBackgroundSessions`): made once.
        var making: Set<String> = []
        /// Told each time a retired session leaves: `waitForStoreWork` waits on it, not on a timer.
        let retiredLeft = Condition()
        /// How many retired sessions have left so far (what a waiter compares).
        private(set) var departures = 0

        /// The retired session `id` leaves (its store work landed, or the loop is gone).
        mutating func leave(_ id: ObjectIdentifier) {
            guard retired.removeValue(forKey: id) != nil else { return }
            departures &+= 1
            retiredLeft.broadcast()
        }

        var all: [SessionEngine] { Array(background.values) + [active] }
    }

    /// The active account's session.
    var engine: SessionEngine { sessions.withLockedValue { $0.active } }

    /// - Parameters:
    ///   - loop: the loop the session lives on: every callback runs on its thread.
    ///   - authority: refreshes, validates and revokes the tokens (yours, or SessionOAuth's).
    ///   - store: where the session is kept. A store of several accounts
    ///     (`AccountCredentialStore`, like the file store) gets a session per stored
    ///     account; the store's active account drives `state`.
    ///   - configuration: the refresh policy, limits, logger and start-up behaviour.
    /// - Throws: `shutDown` if the loop is shut down; `invalidArgument` for an unusable
    ///   configuration.
    public init(
        loop: EventLoop,
        authority: any SessionAuthority,
        store: any CredentialStore = MemoryCredentialStore(),
        configuration: SessionConfiguration = SessionConfiguration()
    ) throws(SessionError) {
        guard configuration.tokenRequestLimit >= 1 else {
            throw SessionError(
                .invalidArgument, "tokenRequestLimit must be at least 1, got \(configuration.tokenRequestLimit)")
        }
        self.loop = loop
        self.authority = authority
        self.configuration = configuration
        let accountStore = store as? any AccountCredentialStore
        // With several accounts the session starts only once its callbacks are set: the loop
        // reads them, and made off the loop thread, a start queued at once would race this
        // thread's writes of them.
        let first = try SessionEngine(
            loop: loop, authority: authority, store: store, configuration: configuration,
            startsLater: accountStore != nil)
        self.surface = first.output
        self.freshCell = Unmanaged.passUnretained(surface.fresh)
        self.accountStore = accountStore
        self.pointerWorker = accountStore.map { StoreWorker(store: $0, loop: loop) }
        self.sessions = LockedBox(Sessions(active: first))
        guard accountStore != nil else { return }
        #if DEBUG
        Self.beforeFirstSessionCallbacks?(first)
        #endif
        first.onStateChange = { [weak self] in self?.accountsChanged() }
        hookActive(first)
        try first.queueStart()
        if loop.inEventLoop {
            // Never waits for the store: the list arrives on the loop, after the active
            // account's read (the same worker, in order).
            accountsEvent { $0.listWanted() }
        } else {
            try listAccountsNow(on: first.worker)
        }
    }

    /// Starts the session: reads the store again (it was read when the manager was made,
    /// so that the first state observed is the stored one; another process may have
    /// changed it since) and starts from what it holds, emits the start-up events
    /// (`initialSession`, a start-up `storeError`) and resumes a restored session. Needed
    /// only with `SessionConfiguration.startsAutomatically` off — subscribe to `events`
    /// first, then call this, and no start-up event can be missed. Calling it again, or
    /// on a session that started by itself, does nothing. Any thread; the work runs on the
    /// loop thread, never inside this call.
    /// - Throws: `shutDown` if the loop is shut down.
    public func start() throws(SessionError) {
        try admit { [self] in
            for engine in sessions.withLockedValue({ $0.all }) { engine.start() }
        }
    }

    /// The session state (the active account's), observable.
    public var state: StateFlow<SessionState> { surface.state }

    /// Whether the store has answered: `.reading` until the stored session is read (a manager
    /// made on its loop thread), `.unavailable` while it cannot be read or missed a write,
    /// `.available` otherwise. With `state`, it tells "no session" from "cannot read the
    /// session yet".
    public var storeStatus: StateFlow<StoreStatus> { surface.storeStatus }

    /// Returns once the stored session has been read (`storeStatus` is no longer `.reading`):
    /// at once for a manager made off its loop thread. A host that acts on what the store
    /// held (a logout key, a sign-in screen) waits for it first.
    public func storeRead() async {
        for await status in storeStatus.values where status != .reading { return }
    }

    /// Returns once the store work the session submitted so far has landed and its answers
    /// (a `storeError`, say) were handled on the loop.
    public func storeWorkDone() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            do {
                try loop.execute { [self] in
                    afterStoreWork(of: sessions.withLockedValue { $0.all }) { continuation.resume() }
                }
            } catch {
                continuation.resume()
            }
        }
    }

    /// Calls `body` once the store work every one of `engines` (and the active-account
    /// pointer's worker) submitted so far has landed.
    /// Retired sessions (`retire`) are waited for until they leave: each is closed once its
    /// work answered, and its close may submit more (a failed clear's last try).
    func afterStoreWork(of engines: [SessionEngine], _ body: @escaping @Sendable () -> Void) {
        let retired = sessions.withLockedValue { $0.retired.values.map(\.worker) }
        // True until this call returns: an answer inside it came from stores called inline.
        let inThisCall = LockedBox(true)
        afterWork(of: engines.map(\.worker) + retired + [pointerWorker].compactMap { $0 }) { [self] in
            if retired.isEmpty || sessions.withLockedValue({ $0.retired.isEmpty }) {
                body()
            } else if inThisCall.withLockedValue({ $0 }) {
                // A retired session leaves in a job of the loop's (`retire`), never inside this
                // turn: waiting again at once would find it again, without end. A later turn.
                // (The loop shutting down: nothing more lands on it.)
                do {
                    try loop.execute { [self] in afterStoreWork(of: [], body) }
                } catch {
                    body()
                }
            } else {
                afterStoreWork(of: [], body)
            }
        }
        inThisCall.withLockedValue { $0 = false }
    }

    private func afterWork(of workers: [StoreWorker], _ body: @escaping @Sendable () -> Void) {
        guard let first = workers.first else {
            body()
            return
        }
        let rest = Array(workers.dropFirst())
        first.afterPendingWork { [self] in afterWork(of: rest, body) }
    }

    /// Blocks until the store work the session submitted so far has run. Never on the loop
    /// thread. For hosts that let go of the session and may exit next (the C API's destroy).
    /// Retired sessions (`retire`) are waited for until they leave: each is closed once its work
    /// answered (on the loop, or at once if the loop is gone), and its close may submit more.
    package func waitForStoreWork() {
        precondition(!loop.inEventLoop, "waitForStoreWork on the loop thread")
        while true {
            let (engines, departures) = sessions.withLockedValue { ($0.all + $0.retired.values, $0.departures) }
            for engine in engines { engine.worker.waitUntilIdle() }
            pointerWorker?.waitUntilIdle()
            // One is being closed on the loop (its next step is a job away): wait until one
            // leaves, then wait for the work its close may have submitted.
            let done = sessions.wait(on: sessions.withLockedValue { $0.retiredLeft }) {
                $0.retired.isEmpty || $0.departures != departures
            }
            if done.retired.isEmpty { return }
        }
    }

    /// What happens to the session (the active account's), observable.
    public var events: SharedFlow<SessionEvent> { surface.events }

    /// The mobile SDKs' shape: the current state first, then each change, on the loop thread.
    public func subscribeToSessionState(
        onState: @escaping @Sendable (SessionState) -> Void,
        onError: (@Sendable (any Error) -> Void)? = nil,
        onComplete: (@Sendable () -> Void)? = nil
    ) throws(LoopFlowError) -> FlowSubscription {
        try surface.state.subscribe(onState: onState, onError: onError, onComplete: onComplete)
    }

    /// Whether a non-blank access token is held. A local check: no network, any thread.
    public func isLoggedIn() -> Bool {
        engine.snapshot.withLockedValue { $0.hasAccessToken }
    }

    /// How long the access token has left and when the next refresh is due (a retry after
    /// a failure, or the proactive one), for status displays. Any thread.
    public var timing: (expiresIn: Duration?, nextRefreshIn: Duration?) {
        let snapshot = engine.snapshot.withLockedValue { $0 }
        let now = loop.now
        return (snapshot.expiresAt.map { $0 - now }, snapshot.nextRefreshAt.map { max($0 - now, .zero) })
    }

    /// The access token's details — type, granted scope, expiry — for status displays and
    /// hosts that check what they may ask for; nil when there is no access token (signed out,
    /// or the session expired). Any thread, a point-in-time reading; no token in it.
    public var tokenInfo: TokenInfo? {
        let engine = self.engine
        let snapshot = engine.snapshot.withLockedValue { $0 }
        guard snapshot.hasAccessToken else { return nil }
        let expiresIn = snapshot.expiresAt.map { $0 - loop.now }
        let expiresAt = expiresIn.map { engine.configuration.wallClock() + $0 }
        return TokenInfo(
            tokenType: snapshot.dpopBound ? "DPoP" : "Bearer", scope: snapshot.scope, expiresIn: expiresIn,
            expiresAtUnixMilliseconds: expiresAt.map(TokenInfo.milliseconds))
    }

    /// Who is signed in (kept through SESSION_EXPIRED; cleared by logout and reconfigure).
    public var memberID: String? {
        engine.snapshot.withLockedValue { $0.memberID }
    }

    /// LOGGED_OUT or SESSION_EXPIRED → LOGGED_IN with `tokens`, stored. Returns once the
    /// store has answered the write (a failure is a `storeError` event, never an error here:
    /// the session goes on in memory).
    ///
    /// It first waits for the stored session to be read (`storeRead()`). While the store
    /// cannot be read (`storeStatus` `.unavailable` since the start), the stored session is not
    /// known and a sign-in would replace it: refused, unless `replacingUnreadableStore` — then
    /// the session goes on in memory and replaces what the store holds once the store takes
    /// the write (what it held is not restored when it becomes readable).
    ///
    /// With a store of several accounts: the session of `tokens`' account (its member id)
    /// becomes the active one; an account signed in already in the background is not signed
    /// in twice (`illegalTransition`: switch to it). A session of another account that expired
    /// here gives its place (and its record) to the new one; to keep a signed-in account,
    /// use `addAccount`.
    /// - Throws: `illegalTransition` when already signed in (log out first);
    ///   `storeUnavailable` while the store cannot be read (and not `replacingUnreadableStore`).
    public func signIn(_ tokens: SessionTokens, replacingUnreadableStore: Bool = false) async throws(SessionError) {
        if storeStatus.value == .reading { await storeRead() }
        try await onLoop(thenStore: true) { manager throws(SessionError) in
            try manager.signInOnLoop(tokens, replacingUnreadableStore: replacingUnreadableStore)
        }
    }

    /// → LOGGED_OUT: the store's clear is submitted first (before anything stored after it),
    /// every timer and retry stops, a refresh in flight is discarded, then the tokens are
    /// revoked best effort (offline is fine). Returns once the store has answered the clear.
    /// With several accounts: the active one is logged out (its record removed); the others
    /// stay signed in, in the background (`switchAccount(to:)`).
    public func logout() async throws(SessionError) {
        try await onLoop(thenStore: true) { manager throws(SessionError) in try manager.engine.logout() }
    }

    /// SESSION_EXPIRED → LOGGED_OUT, forgetting the member id too (returns as `logout`).
    public func reconfigure() async throws(SessionError) {
        try await onLoop(thenStore: true) { manager throws(SessionError) in try manager.engine.reconfigure() }
    }

    /// The current access token, refreshed first if it is within the margin of expiry.
    /// Concurrent callers share one refresh and all get its result or its error.
    ///
    /// A token that is valid and not due for a refresh is answered without a hop to the loop
    /// (the active session's last published snapshot says so: one lock, `SessionOutput.fresh`);
    /// any other request goes to the loop.
    ///
    /// Inlinable, so that the valid-token answer is a synchronous call in the caller's own
    /// frame: only a request that goes to the loop makes an async call (measured: the call
    /// frame was a third of the valid-token path).
    @inlinable
    public func freshAccessToken() async throws(SessionError) -> Secret {
        if let token = freshTokenWithoutWaiting() { return token }
        return try await freshAccessTokenFromLoop()
    }

    /// `freshAccessToken()` when the token is not answered at once: through the loop.
    @usableFromInline
    func freshAccessTokenFromLoop() async throws(SessionError) -> Secret {
        try await awaitToken { engine, completion in engine.freshAccessToken(completion) }
    }

    /// Any thread: the active session's token if `freshAccessToken()` would answer it at once
    /// (valid, not due for a refresh, none in flight, the session open); else nil.
    @usableFromInline
    func freshTokenWithoutWaiting() -> Secret? {
        let now = loop.nowNanoseconds
        return freshCell._withUnsafeGuaranteedRef { $0.answer(atNanoseconds: now) }
    }

    /// The same, answered on the loop thread (usable from inside a flow callback).
    public func freshAccessToken(_ completion: @escaping TokenCompletion) throws(SessionError) {
        try postTokenRequest(completion) { engine, answer in engine.freshAccessToken(answer) }
    }

    /// Refreshes now, whatever the margin says (shares a refresh already in flight).
    public func refreshNow() async throws(SessionError) -> Secret {
        try await awaitToken { engine, completion in engine.refreshNow(completion) }
    }

    /// The same, answered on the loop thread (never inside this call; not at all when it
    /// throws).
    public func refreshNow(_ completion: @escaping TokenCompletion) throws(SessionError) {
        try postTokenRequest(completion) { engine, answer in engine.refreshNow(answer) }
    }

    /// A request failed with 401 using `token`. If it is still the current token, it is
    /// refreshed (once, shared by every caller); otherwise the current one is returned.
    /// Retry your request once with the answer — a token fresh from such a refresh that is
    /// refused again yields `unauthorized`, never another refresh.
    public func handleUnauthorized(token: Secret) async throws(SessionError) -> Secret {
        try await awaitToken { engine, completion in engine.handleUnauthorized(token: token, completion) }
    }

    /// The same, answered on the loop thread.
    public func handleUnauthorized(token: Secret, _ completion: @escaping TokenCompletion) throws(SessionError) {
        try postTokenRequest(completion) { engine, answer in engine.handleUnauthorized(token: token, answer) }
    }

    /// The host is back from the background: validate the session (through the authority
    /// when it can, else by expiry), coalesced with a refresh already due.
    public func resume() throws(SessionError) {
        try post { engine in engine.resume() }
    }

    /// Stops the session: waiters fail with `shutDown`, timers stop, the flows complete.
    /// The store keeps the session for the next start. Returns once the store work submitted
    /// before has landed.
    public func close() async {
        try? await onLoop(thenStore: true) { manager throws(SessionError) in manager.closeOnLoop() }
    }

    // MARK: - Synchronous forms (for the C API)

    /// `signIn`, answered before returning: inline on the loop thread, otherwise posted and
    /// waited for. Do not call from a thread the loop thread is waiting on. Returns once the
    /// session changed in memory; the store's write lands later, on the store's worker.
    /// Unlike `signIn`, it does not wait for the stored session to be read: while it is
    /// (`storeStatus` `.reading`, only for a manager made on its loop thread), it is refused
    /// with `storeUnavailable` like an unreadable store, unless `replacingUnreadableStore`.
    package func signInAndWait(_ tokens: SessionTokens, replacingUnreadableStore: Bool = false) throws(SessionError) {
        try performAndWait { manager throws(SessionError) in
            try manager.signInOnLoop(tokens, replacingUnreadableStore: replacingUnreadableStore)
        }
    }

    /// `logout`, answered before returning (see `signInAndWait`).
    package func logoutAndWait() throws(SessionError) {
        try performAndWait { manager throws(SessionError) in try manager.engine.logout() }
    }

    /// `reconfigure`, answered before returning (see `signInAndWait`).
    package func reconfigureAndWait() throws(SessionError) {
        try performAndWait { manager throws(SessionError) in try manager.engine.reconfigure() }
    }

    /// `addAccount`, answered before returning (see `signInAndWait`).
    package func addAccountAndWait(_ tokens: SessionTokens) throws(SessionError) {
        try performAndWait { manager throws(SessionError) in try manager.addAccountOnLoop(tokens) }
    }

    /// `switchAccount(to:)`, answered before returning (see `signInAndWait`).
    package func switchAccountAndWait(to key: String) throws(SessionError) {
        try performAndWait { manager throws(SessionError) in try manager.switchAccountOnLoop(to: key) }
    }

    /// `logout(account:)`, answered before returning (see `signInAndWait`).
    package func logoutAndWait(account key: String) throws(SessionError) {
        try performAndWait { manager throws(SessionError) in try manager.logoutOnLoop(account: key) }
    }

    /// `logoutAll`, answered before returning (see `signInAndWait`).
    package func logoutAllAndWait() throws(SessionError) {
        try performAndWait { manager throws(SessionError) in try manager.logoutAllOnLoop() }
    }

    private func performAndWait(
        _ body: @escaping @Sendable (SessionManager) throws(SessionError) -> Void
    ) throws(SessionError) {
        if loop.inEventLoop {
            try body(self)
            return
        }
        let done = Latch()
        let outcome = LockedBox<Result<Void, SessionError>>(.success(()))
        try admit { [self] in
            outcome.withLockedValue { $0 = Result { () throws(SessionError) in try body(self) } }
            done.signal()
        }
        done.wait()
        try outcome.withLockedValue { $0 }.get()
    }

    // MARK: - Hops to the loop

    private func post(_ body: @escaping @Sendable (SessionEngine) -> Void) throws(SessionError) {
        try admit { [self] in body(engine) }
    }

    /// Queues a caller's request for the loop, under the loop's limit of waiting requests
    /// (`EventLoop.executeBounded`): a loop stuck in a callback, or far behind, refuses new
    /// requests with `busy` instead of piling them up.
    func admit(_ body: @escaping @Sendable () -> Void) throws(SessionError) {
        do {
            try loop.executeBounded(body)
        } catch {
            throw Self.sessionError(error)
        }
    }

    static func sessionError(_ error: LoopFlowError) -> SessionError {
        if error.code == .overloaded { return SessionError(.busy, error.message) }
        return SessionError(.shutDown, "the event loop is shut down")
    }

    /// Counts a token request against `tokenRequestLimit`, or refuses it with `busy`
    /// (nothing queued). The completion returned gives the place back when it is called
    /// (exactly once, as every token completion is).
    private func admitTokenRequest(_ completion: @escaping TokenCompletion) throws(SessionError) -> TokenCompletion {
        let limit = configuration.tokenRequestLimit
        guard tokenRequestsPending.wrappingAdd(1, ordering: .relaxed).oldValue < limit else {
            tokenRequestsPending.wrappingSubtract(1, ordering: .relaxed)
            throw SessionError(
                .busy, "\(limit) token requests are waiting for an answer already (is a callback blocking the loop?); nothing was queued")
        }
        return { [self] result in
            tokenRequestsPending.wrappingSubtract(1, ordering: .relaxed)
            completion(result)
        }
    }

    /// A token request from a caller: counted, then posted (the count given back if the
    /// post is refused).
    func postTokenRequest(
        _ completion: @escaping TokenCompletion,
        _ body: @escaping @Sendable (SessionEngine, @escaping TokenCompletion) -> Void
    ) throws(SessionError) {
        let answer = try admitTokenRequest(completion)
        do {
            try post { engine in body(engine, answer) }
        } catch {
            tokenRequestsPending.wrappingSubtract(1, ordering: .relaxed)
            throw error
        }
    }

    /// Runs `body` on the loop; with `thenStore`, resumes only once the store work submitted
    /// until then has landed (see `StoreWorker.afterPendingWork`).
    private func onLoop(
        thenStore: Bool = false, _ body: @escaping @Sendable (SessionManager) throws(SessionError) -> Void
    ) async throws(SessionError) {
        let result: Result<Void, SessionError> = await withCheckedContinuation { continuation in
            do throws(SessionError) {
                try admit { [self] in
                    // Every session's store work: a switch or a sign-out may involve several
                    // (those there before, and those made by the call).
                    let before = sessions.withLockedValue { $0.all }
                    let result = Result { () throws(SessionError) in try body(self) }
                    if thenStore {
                        var engines = before
                        for engine in sessions.withLockedValue({ $0.all }) where !engines.contains(where: { $0 === engine }) {
                            engines.append(engine)
                        }
                        afterStoreWork(of: engines) { continuation.resume(returning: result) }
                    } else {
                        continuation.resume(returning: result)
                    }
                }
            } catch {
                continuation.resume(returning: .failure(error))
            }
        }
        try result.get()
    }

    /// `onLoop(thenStore: true)`, for the account calls.
    func runOnLoopThenStore(
        _ body: @escaping @Sendable (SessionManager) throws(SessionError) -> Void
    ) async throws(SessionError) {
        try await onLoop(thenStore: true, body)
    }

    func awaitToken(
        _ body: @escaping @Sendable (SessionEngine, @escaping TokenCompletion) -> Void
    ) async throws(SessionError) -> Secret {
        let result: Result<Secret, SessionError> = await withCheckedContinuation { continuation in
            do throws(SessionError) {
                try postTokenRequest({ continuation.resume(returning: $0) }, body)
            } catch {
                continuation.resume(returning: .failure(error))
            }
        }
        return try result.get()
    }
}
