import LoopFlow
import Logging

/// Receives a token or the reason there is none. Always called on the loop thread, and
/// never inside the call that asked.
public typealias TokenCompletion = @Sendable (Result<Secret, SessionError>) -> Void

/// The session itself: state machine, tokens, refresh, timers, store. Loop-confined —
/// every method runs on the loop thread (the façade, `SessionManager`, posts to it), so
/// nothing here needs a lock; `snapshot` is the one thing other threads read.
final class SessionEngine: @unchecked Sendable {
    /// What any thread may read without waiting for the loop.
    struct Snapshot: Sendable {
        var hasAccessToken = false
        var memberID: String?
        /// Loop-clock instants, for status displays.
        var expiresAt: Duration?
        var nextRefreshAt: Duration?
    }

    /// The tokens of a signed-in session.
    struct LiveSession {
        var accessToken: Secret
        var refreshToken: Secret?
        /// Monotonic (loop clock) instant of expiry: receipt time + `expires_in`.
        var expiresAt: Duration
        /// The access token's whole lifetime (`expires_in`), for the margin cap.
        var lifetime: Duration
        var externalUserID: String?
        /// When the last successful refresh was received (loop clock).
        var lastRefresh: Duration?
    }

    /// Waiters of a refresh abandoned by a new generation, answered once the new state is
    /// published (so a waiter that looks sees the state its answer speaks of).
    struct AbandonedWaiters {
        var waiters: [TokenCompletion] = []
        func fail(_ error: SessionError) {
            for waiter in waiters { waiter(.failure(error)) }
        }
    }

    /// The one refresh in flight (single-flight: everyone who needs it waits on it).
    /// Which attempt an answer belongs to.
    struct AttemptIdentity: Sendable {
        let id: UInt64
        let generation: UInt64
        let reason: RefreshReason
        /// The refresh token sent (nil for re-authentication).
        let refreshToken: Secret?

        func answer(_ result: Result<TokenGrant, AuthorityError>, at receivedAt: Duration) -> RefreshAnswer {
            RefreshAnswer(identity: self, result: result, receivedAt: receivedAt)
        }
    }

    /// An authority's answer (or the timeout), with the attempt it belongs to.
    struct RefreshAnswer: Sendable {
        let identity: AttemptIdentity
        let result: Result<TokenGrant, AuthorityError>
        let receivedAt: Duration
    }

    final class Attempt {
        let identity: AttemptIdentity
        var waiters: [TokenCompletion]
        var timeout: LoopTimer?
        /// Holds the cross-process refresh lock of a shared store.
        var holdsLock = false
        /// Looks again for the lock another process holds.
        var lockRetry: LoopTimer?

        init(identity: AttemptIdentity, waiters: [TokenCompletion]) {
            self.identity = identity
            self.waiters = waiters
        }

        var id: UInt64 { identity.id }
        var reason: RefreshReason { identity.reason }
        var refreshToken: Secret? { identity.refreshToken }
    }

    let loop: EventLoop
    let authority: any SessionAuthority
    let store: any CredentialStore
    let configuration: SessionConfiguration
    var policy: RefreshPolicy { configuration.policy }
    var logger: Logger { configuration.logger }

    let state: MutableStateFlow<SessionState>
    let events: MutableSharedFlow<SessionEvent>
    let snapshot = LockedBox(Snapshot())

    // Loop-confined.
    private var machine: SessionStateMachine
    private var live: LiveSession?
    private var memberID: String?
    /// Bumped by every sign-in, logout, expiry and reconfigure: an answer that belongs to
    /// an earlier generation changes nothing.
    private var generation: UInt64 = 0
    private var attempt: Attempt?
    private var nextAttemptID: UInt64 = 0
    private var consecutiveFailures = 0
    private var proactiveTimer: LoopTimer?
    private var backoff: (timer: LoopTimer, due: Duration)?
    /// The token a 401-triggered refresh produced: a 401 for it again is not refreshed.
    private var tokenFromUnauthorizedRefresh: Secret?
    /// The store has not answered a read yet (it was unavailable at start).
    private var awaitingInitialRead = false
    /// The store missed a write or clear; it is brought up to date when it answers again.
    private var storeBehind = false
    private var storeRetryTimer: LoopTimer?
    private var closed = false
    /// The store other processes share, if it is one.
    private var shared: (any SharedCredentialStore)? { store as? any SharedCredentialStore }
    private var storeWatch: DirectoryWatch?

    init(
        loop: EventLoop, authority: any SessionAuthority, store: any CredentialStore,
        configuration: SessionConfiguration
    ) throws(SessionError) {
        if let problem = configuration.policy.problem {
            throw SessionError(.invalidArgument, "unusable refresh policy: \(problem)")
        }
        self.loop = loop
        self.authority = authority
        self.store = store
        self.configuration = configuration
        self.machine = SessionStateMachine()
        self.state = MutableStateFlow(.loggedOut, on: loop)
        do {
            self.events = try MutableSharedFlow(
                on: loop, replay: 0, bufferCapacity: max(1, configuration.eventBufferCapacity), overflow: .dropOldest)
        } catch {
            throw SessionError(.invalidArgument, error.message)
        }
        // Restore before anyone can observe, so the first state seen is the stored one.
        let read = store.read()
        switch read {
        case .unavailable:
            awaitingInitialRead = true
        case .present, .absent, .damaged:
            restore(from: read)
        }
        state.value = machine.state
        publishSnapshot()
        do {
            try loop.execute { [self] in start(initialRead: read) }
        } catch {
            throw SessionError(.shutDown, "the event loop is shut down")
        }
        // When the loop goes, waiters are answered and timers stopped.
        loop.addTeardownHook { [weak self] in self?.close() }
    }

    /// For tests: callers waiting on the refresh in flight.
    var waitingCallers: Int { attempt?.waiters.count ?? 0 }

    /// For tests: play a token whose proactive refresh never happened.
    func cancelProactiveRefreshForTesting() {
        proactiveTimer?.cancel()
        proactiveTimer = nil
    }

    // MARK: - Start and restore

    /// Adopts what the store holds, as the starting state (not a transition).
    private func restore(from read: StoreRead) {
        guard case .present(let stored) = read else { return }
        if stored.expired {
            machine = SessionStateMachine(state: .sessionExpired)
            memberID = stored.memberID
        } else if let access = stored.accessToken, !access.isBlank {
            machine = SessionStateMachine(state: .loggedIn)
            memberID = stored.memberID
            live = liveSession(from: stored, access: access)
        }
    }

    /// A stored session in memory: its expiry moves from the wall clock (stored) to the
    /// monotonic loop clock (used).
    private func liveSession(from stored: StoredSession, access: Secret, lastRefresh: Duration? = nil) -> LiveSession {
        let remaining = policy.clampedLifetime((stored.accessTokenExpiresAt ?? .zero) - configuration.wallClock())
        return LiveSession(
            accessToken: access, refreshToken: stored.refreshToken, expiresAt: loop.now + remaining,
            lifetime: remaining, externalUserID: stored.externalUserID ?? live?.externalUserID, lastRefresh: lastRefresh)
    }

    private func start(initialRead: StoreRead) {
        guard !closed else { return }
        if let directory = shared?.directoryToWatch() {
            do {
                storeWatch = try loop.watchDirectoryNow(directory) { [weak self] in self?.storeChanged() }
            } catch {
                logger.warning("cannot watch the shared store; other processes' changes will be seen at the next refresh",
                    metadata: ["error": "\(error.message)"])
            }
        }
        switch initialRead {
        case .unavailable(let error):
            logger.warning("credential store unavailable at start", metadata: ["error": "\(error.message)"])
            emit(.storeError(error))
            scheduleStoreRetry()
            return
        case .damaged(let error):
            logger.error("credential store was damaged; moved aside, starting logged out", metadata: ["error": "\(error.message)"])
            emit(.storeError(error))
        case .present, .absent:
            break
        }
        emit(.initialSession(machine.state))
        resumeRestoredSession()
    }

    /// A restored session is refreshed now if due, else on its proactive timer. A network
    /// failure here only schedules a retry: it never logs anyone out.
    private func resumeRestoredSession() {
        guard machine.state == .loggedIn, let live else { return }
        if policy.needsRefresh(now: loop.now, expiresAt: live.expiresAt, lifetime: live.lifetime) {
            startRefresh(reason: .restore, waiters: [])
        } else {
            scheduleProactiveRefresh()
        }
    }

    // MARK: - Requests from the façade

    func signIn(_ tokens: SessionTokens) throws(SessionError) {
        guard !tokens.accessToken.isBlank else {
            throw SessionError(.invalidArgument, "the access token is blank")
        }
        try checkOpen()
        try machine.apply(.signIn)
        let abandoned = beginGeneration()
        live = LiveSession(
            accessToken: tokens.accessToken, refreshToken: tokens.refreshToken,
            expiresAt: loop.now + policy.clampedLifetime(tokens.expiresIn),
            lifetime: policy.clampedLifetime(tokens.expiresIn),
            externalUserID: tokens.externalUserID)
        memberID = tokens.memberID
        writeStore()
        publish(.loggedIn)
        emit(.signedIn(memberID: memberID))
        scheduleProactiveRefresh()
        abandoned.fail(SessionError(.sessionEnded, "a new session was signed in"))
    }

    /// Clears the store first, then cancels every timer, then revokes best effort.
    func logout() throws(SessionError) {
        try checkOpen()
        try machine.apply(.logout)
        let ended = live
        live = nil
        memberID = nil
        clearStore()
        let abandoned = beginGeneration()
        publish(.loggedOut)
        emit(.signedOut(reason: .userRequested))
        abandoned.fail(SessionError(.sessionEnded, "logged out"))
        if let ended, authority.canRevoke {
            authority.revoke(
                refreshToken: ended.refreshToken, accessToken: ended.accessToken,
                completion: completion { [logger] (result: Result<Void, AuthorityError>, _) in
                    if case .failure(let error) = result {
                        logger.info("revocation failed (the session is logged out locally)", metadata: ["error": "\(error)"])
                    }
                })
        }
    }

    func reconfigure() throws(SessionError) {
        try checkOpen()
        try machine.apply(.reconfigure)
        live = nil
        memberID = nil
        clearStore()
        let abandoned = beginGeneration()
        publish(.loggedOut)
        emit(.signedOut(reason: .reconfigured))
        abandoned.fail(SessionError(.sessionEnded, "reconfigured"))
    }

    /// The current token, or a refreshed one when within the margin of expiry.
    func freshAccessToken(_ completion: @escaping TokenCompletion) {
        guard let live, machine.state == .loggedIn, !closed else {
            completion(.failure(notUsableError()))
            return
        }
        if let attempt {
            attempt.waiters.append(completion)
            return
        }
        let now = loop.now
        let recentlyRefreshed = live.lastRefresh.map { now < $0 + policy.minimumInterval } ?? false
        guard policy.needsRefresh(now: now, expiresAt: live.expiresAt, lifetime: live.lifetime), !recentlyRefreshed else {
            completion(.success(live.accessToken))
            return
        }
        if let backoff {
            // A retry is already scheduled: a token that still works is better than waiting.
            if now < live.expiresAt {
                completion(.success(live.accessToken))
            } else {
                completion(.failure(SessionError(
                    .transient, "the refresh is backing off after a failure", retryAfter: backoff.due - now)))
            }
            return
        }
        startRefresh(reason: .onDemand, waiters: [completion])
    }

    /// Refreshes now, whatever the margin says (joins a refresh already in flight; a
    /// scheduled retry is brought forward).
    func refreshNow(_ completion: @escaping TokenCompletion) {
        guard live != nil, machine.state == .loggedIn, !closed else {
            completion(.failure(notUsableError()))
            return
        }
        if let attempt {
            attempt.waiters.append(completion)
            return
        }
        startRefresh(reason: .onDemand, waiters: [completion])
    }

    /// A request failed with 401 using `token`: refresh only if it is still the current
    /// token (compare-and-refresh); otherwise hand back the current one.
    func handleUnauthorized(token: Secret, _ completion: @escaping TokenCompletion) {
        guard let live, machine.state == .loggedIn, !closed else {
            completion(.failure(notUsableError()))
            return
        }
        guard token == live.accessToken else {
            completion(.success(live.accessToken))
            return
        }
        if let tokenFromUnauthorizedRefresh, tokenFromUnauthorizedRefresh == token {
            completion(.failure(SessionError(
                .unauthorized, "a token fresh from a refresh was refused again; not refreshing in a loop")))
            return
        }
        if let attempt {
            attempt.waiters.append(completion)
            return
        }
        if let backoff {
            completion(.failure(SessionError(
                .transient, "the refresh is backing off after a failure", retryAfter: backoff.due - loop.now)))
            return
        }
        startRefresh(reason: .unauthorized, waiters: [completion])
    }

    /// The host came back from the background: validate, coalesced with a refresh already
    /// due or in flight.
    func resume() {
        guard let live, machine.state == .loggedIn, !closed, attempt == nil, backoff == nil else { return }
        if policy.needsRefresh(now: loop.now, expiresAt: live.expiresAt, lifetime: live.lifetime) {
            startRefresh(reason: .resume, waiters: [])
            return
        }
        guard authority.canValidate else {
            emit(.validated)
            return
        }
        let generation = self.generation
        let token = live.accessToken
        authority.validate(
            accessToken: token,
            completion: completion { [self] (result: Result<Bool, AuthorityError>, _) in
                finishValidation(generation: generation, token: token, result: result)
            })
    }

    /// Stops everything: waiters fail, timers stop, the flows complete.
    func close() {
        guard !closed else { return }
        let abandoned = beginGeneration()
        storeWatch?.cancel()
        storeWatch = nil
        storeRetryTimer?.cancel()
        storeRetryTimer = nil
        // One last try to bring a store that missed a write up to date (a logout the
        // store missed must not come back at the next start).
        if storeBehind, !awaitingInitialRead {
            writeStore()
            storeRetryTimer?.cancel()
            storeRetryTimer = nil
        }
        closed = true
        abandoned.fail(SessionError(.shutDown, "the session manager was closed"))
        state.finish()
        events.finish()
    }

    // MARK: - Refresh

    private func startRefresh(reason: RefreshReason, waiters: [TokenCompletion]) {
        guard let live else { return }
        guard let refreshToken = live.refreshToken, !refreshToken.isBlank else {
            // Nothing to refresh with: the access token is all there is until it expires.
            if reason == .unauthorized {
                // The server just refused it: handing it back would invite a retry loop.
                let refused = SessionError(.unauthorized, "the token was refused and there is no refresh token")
                for waiter in waiters { waiter(.failure(refused)) }
            } else if loop.now >= live.expiresAt {
                expire(reason: "the access token expired and there is no refresh token")
                for waiter in waiters { waiter(.failure(Self.expiredError)) }
            } else {
                for waiter in waiters { waiter(.success(live.accessToken)) }
            }
            return
        }
        let attempt = beginAttempt(reason: reason, refreshToken: refreshToken, waiters: waiters)
        proceed(attempt)
    }

    /// Sends the refresh — with a shared store, only under the cross-process lock, and
    /// only if the store does not already hold tokens another process refreshed.
    private func proceed(_ attempt: Attempt) {
        guard self.attempt === attempt, let refreshToken = attempt.refreshToken else { return }
        attempt.lockRetry = nil
        if let shared {
            if adoptRefreshedElsewhere(attempt) { return }
            if !attempt.holdsLock {
                guard shared.tryLockRefresh() else {
                    // Another process is refreshing: look again shortly (the timeout still runs).
                    let id = attempt.id
                    attempt.lockRetry = try? loop.scheduleTimer(after: .milliseconds(50)) { [self] in
                        if let current = self.attempt, current.id == id { proceed(current) }
                    }
                    return
                }
                attempt.holdsLock = true
                // Re-read under the lock: the other process may have just finished.
                if adoptRefreshedElsewhere(attempt) { return }
            }
        }
        authority.refresh(
            RefreshRequest(refreshToken: refreshToken, memberID: memberID, reason: attempt.reason),
            completion: refreshCompletion(for: attempt))
    }

    /// If the shared store holds this session with a refresh token other than the one
    /// this attempt would send, another process rotated it: adopt its tokens instead of
    /// sending a stale one, and answer the attempt's waiters.
    private func adoptRefreshedElsewhere(_ attempt: Attempt) -> Bool {
        guard case .present(let stored) = store.read(), !stored.expired,
            stored.memberID == memberID, let access = stored.accessToken, !access.isBlank,
            let rotated = stored.refreshToken, rotated != attempt.refreshToken
        else { return false }
        adopt(stored, access: access)
        endAttempt(attempt)
        guard let live else { return true }
        for waiter in attempt.waiters { waiter(.success(live.accessToken)) }
        return true
    }

    /// Takes tokens another process stored (expiry from the stored wall-clock instant).
    private func adopt(_ stored: StoredSession, access: Secret) {
        let adopted = liveSession(from: stored, access: access, lastRefresh: loop.now)
        live = adopted
        consecutiveFailures = 0
        backoff?.timer.cancel()
        backoff = nil
        publishSnapshot()
        logger.info("adopted tokens another process refreshed")
        emit(.tokenRefreshed(expiresIn: adopted.lifetime, reason: .sharedStore))
        scheduleProactiveRefresh()
    }

    /// Frees what an attempt held: its timers and the cross-process lock.
    private func endAttempt(_ attempt: Attempt) {
        if self.attempt === attempt { self.attempt = nil }
        attempt.timeout?.cancel()
        attempt.lockRetry?.cancel()
        attempt.lockRetry = nil
        if attempt.holdsLock {
            attempt.holdsLock = false
            shared?.unlockRefresh()
        }
    }

    /// Another process changed the shared store: follow it.
    private func storeChanged() {
        // While the store misses one of our writes (or our logout's clear), it is behind us:
        // what it says is older than what we know, and following it would undo our change.
        guard !closed, !awaitingInitialRead, !storeBehind else { return }
        switch store.read() {
        case .unavailable:
            return
        case .damaged(let error):
            emit(.storeError(error))
            storeBehind = true
            writeStore()
        case .absent:
            guard machine.state != .loggedOut else { return }
            // Logged out elsewhere: log out here too (the store is clear; it revoked).
            followLogout()
        case .present(let stored):
            if stored.expired {
                if machine.state == .loggedIn, stored.memberID == memberID {
                    expire(reason: "the session expired in another process")
                }
                return
            }
            guard let access = stored.accessToken, !access.isBlank else { return }
            switch machine.state {
            case .loggedIn where stored.memberID == memberID:
                guard live?.accessToken != access else { return }  // our own write
                if let attempt, attempt.refreshToken != stored.refreshToken {
                    _ = adoptRefreshedElsewhere(attempt)
                } else if attempt == nil {
                    adopt(stored, access: access)
                }
            case .loggedIn:
                followLogout()
                followSignIn(stored, access: access)
            case .loggedOut, .sessionExpired:
                followSignIn(stored, access: access)
            }
        }
    }

    private func followLogout() {
        guard (try? machine.apply(.logout)) != nil else { return }
        live = nil
        memberID = nil
        let abandoned = beginGeneration()
        publish(.loggedOut)
        emit(.signedOut(reason: .otherProcess))
        abandoned.fail(SessionError(.sessionEnded, "logged out in another process"))
    }

    private func followSignIn(_ stored: StoredSession, access: Secret) {
        guard (try? machine.apply(.signIn)) != nil else { return }
        let abandoned = beginGeneration()
        memberID = stored.memberID
        adoptSignIn(stored, access: access)
        publish(.loggedIn)
        emit(.signedIn(memberID: memberID))
        scheduleProactiveRefresh()
        abandoned.fail(SessionError(.sessionEnded, "another session was signed in elsewhere"))
    }

    private func adoptSignIn(_ stored: StoredSession, access: Secret) {
        live = liveSession(from: stored, access: access)
    }

    private func startReauthentication(externalUserID: String, waiters: [TokenCompletion]) {
        let attempt = beginAttempt(reason: .reauthentication, refreshToken: nil, waiters: waiters)
        authority.reauthenticate(externalUserID: externalUserID, completion: refreshCompletion(for: attempt))
    }

    /// Takes the single-flight slot; arms the timeout that frees it if the authority hangs.
    private func beginAttempt(reason: RefreshReason, refreshToken: Secret?, waiters: [TokenCompletion]) -> Attempt {
        precondition(attempt == nil, "a refresh is already in flight")
        nextAttemptID += 1
        let identity = AttemptIdentity(
            id: nextAttemptID, generation: generation, reason: reason, refreshToken: refreshToken)
        let attempt = Attempt(identity: identity, waiters: waiters)
        self.attempt = attempt
        proactiveTimer?.cancel()
        proactiveTimer = nil
        proactiveDue = nil
        backoff?.timer.cancel()
        backoff = nil
        let timeout = policy.timeout
        attempt.timeout = try? loop.scheduleTimer(after: timeout) { [self] in
            finishRefresh(identity.answer(.failure(.transient("the authority did not answer within \(timeout)")), at: loop.now))
        }
        logger.debug("refresh started", metadata: ["reason": "\(reason)", "attempt": "\(attempt.id)"])
        return attempt
    }

    private func refreshCompletion(for attempt: Attempt) -> AuthorityCompletion<TokenGrant> {
        let identity = attempt.identity
        return completion { [self] result, receivedAt in
            finishRefresh(identity.answer(result, at: receivedAt))
        }
    }

    private func finishRefresh(_ answer: RefreshAnswer) {
        let identity = answer.identity
        guard identity.generation == generation, let live else {
            // The session changed hands (logout, new sign-in): a no-op by design.
            logger.debug("a refresh answer for an ended session was discarded", metadata: ["attempt": "\(identity.id)"])
            return
        }
        guard let attempt, attempt.id == identity.id else {
            // An attempt that timed out answered after all. A success for the refresh token
            // still held is adopted: the authority may have rotated (consumed) that token,
            // and sending it again would get the session expired.
            if case .success(let grant) = answer.result, let used = identity.refreshToken, used == live.refreshToken {
                logger.info("a refresh answered after its timeout; adopting its tokens", metadata: ["attempt": "\(identity.id)"])
                backoff?.timer.cancel()
                backoff = nil
                _ = apply(grant, receivedAt: answer.receivedAt, reason: identity.reason)
            } else {
                logger.debug("a late refresh answer was discarded", metadata: ["attempt": "\(identity.id)"])
            }
            return
        }
        // The cross-process lock is released only after the answer is stored, so that the
        // next process to take it finds the rotated tokens.
        let heldLock = attempt.holdsLock
        attempt.holdsLock = false
        endAttempt(attempt)
        defer { if heldLock { shared?.unlockRefresh() } }
        switch answer.result {
        case .success(let grant):
            let token = apply(grant, receivedAt: answer.receivedAt, reason: attempt.reason)
            for waiter in attempt.waiters { waiter(.success(token)) }

        case .failure(let error) where attempt.reason == .reauthentication:
            // The fallback is tried once: whatever it answers short of tokens ends the session.
            expire(reason: "re-authentication failed: \(error.description)")
            for waiter in attempt.waiters { waiter(.failure(Self.expiredError)) }

        case .failure(let error) where error.kind == .terminal && attempt.refreshToken != live.refreshToken:
            // A refused token that is no longer ours (a late answer rotated it meanwhile).
            logger.debug("a refusal of a replaced refresh token was ignored", metadata: ["error": "\(error)"])
            scheduleProactiveRefresh()
            for waiter in attempt.waiters { waiter(.success(live.accessToken)) }

        case .failure(let error) where error.kind == .transient:
            consecutiveFailures += 1
            let delay = policy.backoffDelay(
                failures: consecutiveFailures, retryAfter: error.retryAfter, unitRandom: configuration.random())
            scheduleBackoff(after: delay)
            logger.info("refresh failed, retrying", metadata: [
                "attempt": "\(consecutiveFailures)", "retryIn": "\(delay)", "error": "\(error)",
            ])
            emit(.refreshFailed(attempt: consecutiveFailures, retryIn: delay, error: error))
            let failure = SessionError(.transient, error.message, retryAfter: delay)
            for waiter in attempt.waiters { waiter(.failure(failure)) }

        case .failure(let error) where error.kind == .configuration:
            consecutiveFailures += 1
            logger.error("refresh refused: the client is misconfigured", metadata: ["error": "\(error)"])
            emit(.refreshFailed(attempt: consecutiveFailures, retryIn: nil, error: error))
            let failure = SessionError(.configuration, error.description)
            for waiter in attempt.waiters { waiter(.failure(failure)) }

        case .failure(let error):
            if authority.canReauthenticate, let externalUserID = live.externalUserID {
                logger.info("refresh token refused; trying re-authentication once")
                startReauthentication(externalUserID: externalUserID, waiters: attempt.waiters)
                return
            }
            expire(reason: error.description)
            for waiter in attempt.waiters { waiter(.failure(Self.expiredError)) }
        }
    }

    /// New tokens: kept (a missing refresh token keeps the old one), stored before any
    /// waiter resumes, announced, and the next proactive refresh scheduled.
    private func apply(_ grant: TokenGrant, receivedAt: Duration, reason: RefreshReason) -> Secret {
        guard var live else { return grant.accessToken }
        let lifetime = policy.clampedLifetime(grant.expiresIn)
        live.accessToken = grant.accessToken
        if let rotated = grant.refreshToken { live.refreshToken = rotated }
        live.expiresAt = receivedAt + lifetime
        live.lifetime = lifetime
        live.lastRefresh = receivedAt
        self.live = live
        if let member = grant.memberID { memberID = member }
        consecutiveFailures = 0
        tokenFromUnauthorizedRefresh = reason == .unauthorized ? grant.accessToken : nil
        writeStore()
        publishSnapshot()
        emit(.tokenRefreshed(expiresIn: lifetime, reason: reason))
        scheduleProactiveRefresh()
        return grant.accessToken
    }

    private func finishValidation(generation: UInt64, token: Secret, result: Result<Bool, AuthorityError>) {
        guard generation == self.generation, live?.accessToken == token, attempt == nil, backoff == nil else { return }
        switch result {
        case .success(true):
            emit(.validated)
        case .success(false):
            startRefresh(reason: .resume, waiters: [])
        case .failure(let error) where error.kind == .terminal:
            startRefresh(reason: .resume, waiters: [])
        case .failure(let error):
            logger.info("validation failed; keeping the session", metadata: ["error": "\(error)"])
        }
    }

    /// IN → EXPIRED: tokens gone, member id kept, the store remembers the expiry.
    private func expire(reason: String) {
        guard (try? machine.apply(.expire)) != nil else { return }
        live = nil
        let abandoned = beginGeneration()
        writeStore()
        publish(.sessionExpired)
        logger.notice("session expired", metadata: ["reason": "\(reason)"])
        emit(.sessionExpired(reason: reason))
        abandoned.fail(Self.expiredError)
    }

    // MARK: - Timers

    private func scheduleProactiveRefresh() {
        proactiveTimer?.cancel()
        proactiveTimer = nil
        guard machine.state == .loggedIn, let live, live.refreshToken != nil else { return }
        let delay = policy.proactiveDelay(
            now: loop.now, expiresAt: live.expiresAt, lifetime: live.lifetime, lastRefresh: live.lastRefresh,
            unitRandom: configuration.random())
        proactiveDue = loop.now + delay
        defer { publishSnapshot() }
        proactiveTimer = try? loop.scheduleTimer(after: delay) { [self] in
            proactiveTimer = nil
            guard attempt == nil, backoff == nil, machine.state == .loggedIn else { return }
            startRefresh(reason: .proactive, waiters: [])
        }
    }

    private func scheduleBackoff(after delay: Duration) {
        guard let timer = try? loop.scheduleTimer(after: delay, { [self] in
            backoff = nil
            guard attempt == nil, machine.state == .loggedIn else { return }
            startRefresh(reason: .retry, waiters: [])
        }) else { return }
        backoff = (timer, loop.now + delay)
        publishSnapshot()
    }

    /// A new generation: the refresh in flight (if any) is abandoned and its waiters told
    /// why; every timer and the backoff stop.
    @discardableResult
    private func beginGeneration() -> AbandonedWaiters {
        generation += 1
        var abandoned = AbandonedWaiters()
        if let attempt {
            endAttempt(attempt)
            abandoned.waiters = attempt.waiters
        }
        proactiveTimer?.cancel()
        proactiveTimer = nil
        backoff?.timer.cancel()
        backoff = nil
        consecutiveFailures = 0
        tokenFromUnauthorizedRefresh = nil
        return abandoned
    }

    // MARK: - Store

    private func storedForm() -> StoredSession? {
        switch machine.state {
        case .loggedOut:
            return nil
        case .sessionExpired:
            return StoredSession(memberID: memberID, expired: true)
        case .loggedIn:
            guard let live else { return nil }
            let remaining = live.expiresAt - loop.now
            return StoredSession(
                accessToken: live.accessToken, refreshToken: live.refreshToken,
                accessTokenExpiresAt: configuration.wallClock() + remaining,
                memberID: memberID, externalUserID: live.externalUserID)
        }
    }

    /// Writes the current session (or clears, when there is none).
    private func writeStore() {
        guard let stored = storedForm() else {
            clearStore()
            return
        }
        do {
            try store.write(stored)
            storeBehind = false
        } catch {
            storeFailed(error)
        }
    }

    private func clearStore() {
        do {
            try store.clear()
            storeBehind = false
        } catch {
            storeFailed(error)
        }
    }

    /// A failed write never logs anyone out: the session goes on in memory, the failure is
    /// reported, and the store is brought up to date when it answers again.
    private func storeFailed(_ error: StoreError) {
        storeBehind = true
        logger.warning("credential store write failed", metadata: ["error": "\(error.message)"])
        emit(.storeError(error))
        scheduleStoreRetry()
    }

    private func scheduleStoreRetry() {
        guard storeRetryTimer == nil, !closed else { return }
        storeRetryTimer = try? loop.scheduleTimer(after: configuration.storeRetryInterval) { [self] in
            storeRetryTimer = nil
            retryStore()
        }
    }

    private func retryStore() {
        if awaitingInitialRead {
            let read = store.read()
            if case .unavailable = read {
                scheduleStoreRetry()
                return
            }
            awaitingInitialRead = false
            if case .damaged(let error) = read {
                emit(.storeError(error))
            }
            if machine.state == .loggedOut, generation == 0 {
                // Nothing happened meanwhile: the stored session is the starting point.
                restore(from: read)
                publish(machine.state)
                emit(.initialSession(machine.state))
                resumeRestoredSession()
            } else {
                // The user acted meanwhile: what they did wins over what was stored.
                emit(.initialSession(machine.state))
                storeBehind = true
            }
        }
        if storeBehind {
            writeStore()
        }
    }

    // MARK: - Helpers

    static let expiredError = SessionError(.sessionExpired, "Your session has expired. Please sign in again.")

    private func checkOpen() throws(SessionError) {
        if closed { throw SessionError(.shutDown, "the session manager was closed") }
    }

    private func notUsableError() -> SessionError {
        if closed { return SessionError(.shutDown, "the session manager was closed") }
        switch machine.state {
        case .sessionExpired: return Self.expiredError
        default: return SessionError(.notLoggedIn, "no one is signed in")
        }
    }

    /// An authority completion whose answer runs on this loop thread, never inline.
    private func completion<Output: Sendable>(
        _ handle: @escaping @Sendable (Result<Output, AuthorityError>, Duration) -> Void
    ) -> AuthorityCompletion<Output> {
        AuthorityCompletion(clock: { [loop] in loop.now }) { [loop] result, receivedAt in
            try? loop.execute { handle(result, receivedAt) }
        }
    }

    private func publish(_ newState: SessionState) {
        state.value = newState
        publishSnapshot()
    }

    private func publishSnapshot() {
        let current = Snapshot(
            hasAccessToken: live.map { !$0.accessToken.isBlank } ?? false, memberID: memberID,
            expiresAt: live?.expiresAt, nextRefreshAt: backoff?.due ?? proactiveDue)
        snapshot.withLockedValue { $0 = current }
    }

    /// When the proactive timer is due (loop clock), for status displays.
    private var proactiveDue: Duration?

    private func emit(_ event: SessionEvent) {
        logger.debug("session event", metadata: ["event": "\(event)"])
        events.emit(event)
    }
}
