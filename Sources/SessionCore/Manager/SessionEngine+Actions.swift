import LoopFlow
import Logging

/// What `SessionEngine` does on behalf of its state machines: the actions of the refresh
/// machine, the transitions the session makes by itself (expiry, following another
/// process), the store and the flows. Loop thread only, like the whole engine.
extension SessionEngine {
    // MARK: - Actions

    /// Runs what the refresh state machine decided, in order.
    ///
    /// Waiters are user code run inline (a C host's token callback may call back into the
    /// session), so the machine puts `.answer` last — only `.releaseLock` may follow it —
    /// and the snapshot is published first, so a waiter that looks sees what its answer
    /// speaks of.
    func perform(_ actions: [Refresh.Action]) {
        assert(Self.answersComeLast(actions), "an action other than releaseLock follows answer: \(actions)")
        for action in actions {
            switch action {
            case .arm(let timer, let delay):
                arm(timer, after: delay)
            case .cancel(let timer):
                cancel(timer)
            case .acquireLock:
                acquireLock()
            case .releaseLock:
                // On the worker, after every save submitted before (the one that stored the
                // rotated tokens): the next holder must find them.
                worker.submit({ store in (store as? any SharedCredentialStore)?.releaseRefreshLease() }, done: { _ in })
            case .sendRefresh(let identity):
                guard let refreshToken = identity.refreshToken else { continue }
                let answer = attemptCompletion(identity)
                authority.refresh(
                    RefreshRequest(
                        refreshToken: refreshToken, memberID: memberID, reason: identity.reason, timeout: policy.timeout,
                        dpopKey: refresh.live?.dpopKey, profile: profile),
                    completion: answer)
            case .sendReauthentication(let identity, let externalUserID):
                authority.reauthenticate(externalUserID: externalUserID, completion: attemptCompletion(identity))
            case .cancelRequest(let identity):
                if let call = requestInFlight, call.attempt == identity.id {
                    requestInFlight = nil
                    if identity.generation != refresh.generation {
                        // The session ended (its generation moved): the answer is discarded.
                        call.completion.abandon()
                    } else {
                        call.completion.requestCancellation()
                    }
                }
            case .validate(let token, let generation):
                authority.validate(
                    accessToken: token,
                    completion: completion { [self] (result: Result<Bool, AuthorityError>, _) in
                        validationAnswered(generation: generation, token: token, result: result)
                    })
            case .answer(let waiters, let result):
                publishSnapshot()
                answer(waiters, result)
            case .setMemberID(let member):
                memberID = member
            case .persist:
                persist()
            case .emit(let event):
                emit(event)
            case .expire(let reason):
                expire(reason: reason)
            case .log(let level, let message, let metadata):
                logger.log(level: level, "\(message)", metadata: metadata.mapValues { .string($0) })
            }
        }
    }

    func arm(_ timer: RefreshTimer, after delay: Duration) {
        timers.removeValue(forKey: timer)?.cancel()
        do {
            timers[timer] = try loop.scheduleTimer(after: delay) { [self] in timerFired(timer) }
        } catch {
            // Only between shutdown() and teardown, which closes the session next.
            logger.debug("a refresh timer was not armed: the loop is shutting down", metadata: ["timer": "\(timer)"])
        }
    }

    func cancel(_ timer: RefreshTimer) {
        timers.removeValue(forKey: timer)?.cancel()
    }

    /// Before sending a refresh with a shared store: tokens another process already
    /// refreshed are adopted instead; otherwise the cross-process refresh lease is taken if
    /// free, and the store read again under it (the other process may have just finished).
    /// The looking is the worker's; its answer enters as `lockAttempted` for this attempt (the
    /// machine ignores it, giving back a lease it took, if the attempt has ended meanwhile).
    func acquireLock() {
        guard let attempt = refresh.attemptInFlight else { return }
        guard shared != nil else {
            perform(refresh.lockAttempted(.acquired, attempt: attempt.id, now: loop.now, unitRandom: configuration.random()))
            return
        }
        let held = refresh.live
        let wallNow = configuration.wallClock()
        let look = LockLook.Question(
            memberID: memberID, refreshTokenInFlight: attempt.refreshToken, accessTokenHeld: held?.accessToken,
            heldExpiresAt: held.map { wallNow + ($0.expiresAt - loop.now) }, askedAt: wallNow,
            leaseDuration: refreshLeaseDuration)
        let attemptID = attempt.id
        worker.submit({ store in LockLook.look(look, in: store) }) { [weak self] answer in
            self?.storeAnswered(.lockLooked(answer, attempt: attemptID))
        }
    }

    /// The worker's look before a refresh answered (`storeAnswered`).
    func lockLooked(_ answer: LockLook, attempt: UInt64) {
        guard !closed else {
            if answer.tookLease { worker.submit({ ($0 as? any SharedCredentialStore)?.releaseRefreshLease() }, done: { _ in }) }
            return
        }
        if case .newerStored(let stored, _) = answer, stored.accessToken != nil {
            // The tokens another process stored come with their profile (who minted them: a
            // sign-in elsewhere may be at another issuer), as when the store's watch brings
            // them (`adoptTokens`); the next refresh is judged by it.
            profile = stored.profile ?? profile
        }
        perform(refresh.lockAttempted(
            outcome(of: answer), attempt: attempt, now: loop.now, unitRandom: configuration.random()))
    }

    /// What the worker's look means for the refresh machine (on the loop: the expiry moves to
    /// the loop clock).
    private func outcome(of answer: LockLook) -> Refresh.LockOutcome {
        switch answer {
        case .acquired: return .acquired
        case .busy(let holder): return .busy(holder)
        case .newerStored(let stored, let lockHeld):
            guard let access = stored.accessToken else { return lockHeld ? .acquired : .busy(nil) }
            return .newerStored(liveSession(from: stored, access: access, lastRefresh: loop.now), lockHeld: lockHeld)
        }
    }

    /// How long a refresh lease lasts unless released: six refresh timeouts. The attempt's
    /// request starts after the lease is taken and ends within one timeout (answered, or
    /// cancelled when the timeout fires) — unless its answer is arriving (a 2xx: the server
    /// rotated the token), which only a stall or the cap of four timeouts from its start ends
    /// (`OAuthAuthority.answerCapFactor`); an authority that broke that word gets one timeout
    /// more before it is cancelled and one more to end. Past the deadline another process may
    /// refresh with the same refresh token, so the lease must not end while a request that may
    /// rotate it can still be answered. The deadline matters only for a holder that cannot
    /// release: one stopped or hung; a live holder releases as soon as its answer is stored,
    /// and a dead one frees it at once.
    var refreshLeaseDuration: Duration { policy.timeout * 6 }

    /// Ends the refresh generation and stops its timers; returns the waiters to fail once
    /// the new state is published.
    func endSession(keepTokens: Bool = false) -> [TokenCompletion] {
        let ended = refresh.endSession(keepTokens: keepTokens)
        perform(ended.actions)
        return ended.abandoned
    }

    func fail(_ waiters: [TokenCompletion], _ error: SessionError) {
        guard !waiters.isEmpty else { return }
        publishSnapshot()
        answer(waiters, .failure(error))
    }

    /// Answers waiters one after another. Each is user code that may end the session from
    /// inside its answer (log out, switch account, close): every waiter answered after that
    /// gets the error a new request would get then, never the token of a session that has
    /// ended (the refresh generation tells: every end of a session moves it).
    func answer(_ waiters: [TokenCompletion], _ result: Result<Secret, SessionError>) {
        let generation = refresh.generation
        for waiter in waiters {
            if refresh.generation == generation && !closed {
                waiter(result)
            } else {
                waiter(.failure(notUsableError()))
            }
        }
    }

    /// The rule `perform` relies on for re-entrancy: after `.answer`, only `.releaseLock`.
    static func answersComeLast(_ actions: [Refresh.Action]) -> Bool {
        guard let answer = actions.firstIndex(where: { if case .answer = $0 { true } else { false } }) else { return true }
        return actions[(answer + 1)...].allSatisfy { if case .releaseLock = $0 { true } else { false } }
    }

    // MARK: - Transitions the session makes by itself

    /// IN → EXPIRED: tokens gone, member id kept, the store remembers the expiry.
    func expire(reason: String) {
        guard (try? machine.apply(.expire)) != nil else { return }
        let abandoned = endSession()
        persist()
        publish(.sessionExpired)
        logger.notice("session expired", metadata: ["reason": "\(reason)"])
        emit(.sessionExpired(reason: reason))
        fail(abandoned, Refresh.expiredError)
    }

    func followLogout() {
        guard (try? machine.apply(.logout)) != nil else { return }
        memberID = nil
        profile = nil
        bind(nil)
        let abandoned = endSession()
        publish(.loggedOut)
        emit(.signedOut(reason: .otherProcess))
        fail(abandoned, SessionError(.sessionEnded, "logged out in another process"))
    }

    func followSignIn(_ stored: StoredSession, access: Secret) {
        if accountStore != nil, accountKey == nil {
            // Unbound and no longer active: retired by a switch, it follows nothing.
            guard isActive else { return }
            // That account has its session here: the manager switches to it.
            let key = stored.account ?? Self.accountKey(for: stored.memberID)
            if onFollowSignIn?(key, changeReadPointerMark) == true { return }
        }
        guard (try? machine.apply(.signIn)) != nil else { return }
        let abandoned = endSession()
        memberID = stored.memberID
        profile = stored.profile
        takeRecord(of: stored)
        refresh.sessionBegan(liveSession(from: stored, access: access))
        publish(.loggedIn)
        emit(.signedIn(memberID: memberID))
        perform(refresh.scheduleProactive(now: loop.now, unitRandom: configuration.random()))
        fail(abandoned, SessionError(.sessionEnded, "another session was signed in elsewhere"))
    }

    // MARK: - Store

    /// Adopts what the store holds, as the starting state (not a transition).
    func restore(from read: StoreRead) {
        guard case .present(let stored) = read else { return }
        if stored.expired {
            machine = SessionStateMachine(state: .sessionExpired)
            memberID = stored.memberID
            profile = stored.profile
            takeRecord(of: stored)
        } else if let access = stored.accessToken, !access.isBlank {
            machine = SessionStateMachine(state: .loggedIn)
            memberID = stored.memberID
            profile = stored.profile
            takeRecord(of: stored)
            refresh.sessionBegan(liveSession(from: stored, access: access))
        }
    }

    /// A stored session in memory: its expiry moves from the wall clock (stored) to the
    /// monotonic loop clock (used).
    func liveSession(from stored: StoredSession, access: Secret, lastRefresh: Duration? = nil) -> LiveSession {
        let remaining = policy.clampedLifetime((stored.accessTokenExpiresAt ?? .zero) - configuration.wallClock())
        return LiveSession(
            accessToken: access, refreshToken: stored.refreshToken, expiresAt: loop.now + remaining,
            lifetime: remaining, externalUserID: stored.externalUserID ?? refresh.live?.externalUserID,
            lastRefresh: lastRefresh, scope: stored.grantedScope ?? refresh.live?.scope, dpopKey: stored.dpopKey)
    }

    /// What the store should hold now (nil: nothing).
    func storedForm() -> StoredSession? {
        switch machine.state {
        case .loggedOut:
            return nil
        case .sessionExpired:
            return StoredSession(memberID: memberID, expired: true)
        case .loggedIn:
            guard let live = refresh.live else { return nil }
            let remaining = live.expiresAt - loop.now
            return StoredSession(
                accessToken: live.accessToken, refreshToken: live.refreshToken,
                accessTokenExpiresAt: configuration.wallClock() + remaining,
                memberID: memberID, externalUserID: live.externalUserID, profile: currentProfile,
                grantedScope: live.scope, dpopKey: live.dpopKey)
        }
    }

    /// Writes the current session (or clears, when there is none) on the store's worker; a
    /// failure is reported when it answers, and retried, never a logout. A write the store
    /// takes makes it `available` again — unless the initial read has not answered yet (the
    /// stored session is still unknown: `unavailable` until that read answers).
    func persist() {
        // Signed out with a store of several accounts: no record of its own, nothing to write
        // (a clear still owed is `retryOwedClears`'; a no-op here would pass for it).
        if accountStore != nil && accountKey == nil { return }
        save(storedForm(), kind: .session)
    }

    // MARK: - Helpers

    func checkOpen() throws(SessionError) {
        if closed { throw SessionError(.shutDown, "the session manager was closed") }
    }

    func notUsableError() -> SessionError {
        if closed { return SessionError(.shutDown, "the session manager was closed") }
        switch machine.state {
        case .sessionExpired: return Refresh.expiredError
        default: return SessionError(.notLoggedIn, "no one is signed in")
        }
    }

    /// The completion of an attempt's request, remembered so the attempt can cancel it.
    func attemptCompletion(_ identity: AttemptIdentity) -> AuthorityCompletion<TokenGrant> {
        let answer: AuthorityCompletion<TokenGrant> = completion { [self] result, receivedAt in
            if requestInFlight?.attempt == identity.id { requestInFlight = nil }
            authorityAnswered(identity, result, at: receivedAt)
        }
        requestInFlight = RequestInFlight(attempt: identity.id, completion: answer)
        return answer
    }

    /// An authority completion whose answer runs on this loop thread, never inline.
    ///
    /// Posted to the next loop turn even when completed on the loop thread: re-entrancy
    /// requires it. Completing is public API — a Swift host's `succeed`/`fail`, the C
    /// `sf_refresh_request_succeed`/`_fail` — and handled inline, the answer would call the
    /// host's token callbacks inside that call (threading contract, rule 1); an authority that
    /// completes or cancels synchronously inside `refresh`, `revoke` or a cancellation would
    /// run the machine's actions in the middle of the ones that sent the request. Nothing tells
    /// a completion from the library's own HTTP client from a host's, so every one takes the
    /// turn. (The store's answers need no such rule: they come from the worker thread, or
    /// inline from a store that never blocks, where the engine expects them.)
    func completion<Output: Sendable>(
        _ handle: @escaping @Sendable (Result<Output, AuthorityError>, Duration) -> Void
    ) -> AuthorityCompletion<Output> {
        AuthorityCompletion(clock: { [loop] in loop.now }) { [loop] result, receivedAt in
            try? loop.execute { handle(result, receivedAt) }
        }
    }

    /// The snapshot first, then the state: a thread that sees the new state never reads
    /// an older snapshot.
    func publish(_ newState: SessionState) {
        publishSnapshot()
        state.value = newState
        onStateChange?()
    }

    /// The profile as it stands: its granted scope is the live session's (a refresh whose
    /// answer named a scope replaced it), else the one it was signed in with.
    var currentProfile: SessionProfile? {
        guard var current = profile else { return nil }
        if let scope = refresh.live?.scope { current.grantedScope = scope }
        return current
    }

    func publishSnapshot() {
        let live = refresh.live
        let freshUntil = !closed && machine.state == .loggedIn && !storeMachine.awaitingInitialRead
            ? refresh.answersFreshUntil : nil
        let current = Snapshot(
            hasAccessToken: live.map { !$0.accessToken.isBlank } ?? false, dpopBound: live?.dpopKey != nil,
            memberID: memberID,
            state: machine.state, account: accountKey,
            expiresAt: live?.expiresAt, nextRefreshAt: refresh.nextRefreshAt, scope: live?.scope,
            profile: currentProfile, awaitingStore: storeMachine.awaitingInitialRead,
            freshToken: freshUntil == nil ? nil : live?.accessToken, freshUntil: freshUntil)
        snapshot.withLockedValue { $0 = current }
        output.fresh.store(current.fresh)
    }

    func emit(_ event: SessionEvent) {
        logger.debug("session event", metadata: ["event": "\(event)"])
        events.emit(event)
    }
}
