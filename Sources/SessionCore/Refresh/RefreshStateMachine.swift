// One file on purpose (739 lines, 167 of them comments): the phase, the tokens, the generation
// and the failure count are `private(set)`, so only the event functions in this file can move
// the machine. Splitting it across files would open its state to the whole module.

import Logging

/// The token refresh of one session as a pure value: single-flight, proactive timer,
/// backoff, timeout, the cross-process lock, re-authentication and the generation that
/// makes late answers harmless.
///
/// Every `mutating` event function returns the actions the caller must perform, in order
/// (send a request, arm or cancel a timer, answer waiters, persist, emit, expire). Nothing
/// here does I/O, reads a clock or draws a random number: the time (`now`) and a unit
/// random number come in as arguments, so the same inputs always give the same actions and
/// the whole state space is tested without a loop (`RefreshStateMachineTests`).
/// `SessionEngine` is the storage that runs the actions on the loop thread.
///
/// Invariants (checked in debug builds by `checkInvariants`):
/// - `live == nil` exactly when the phase is `inactive` (no one is signed in);
/// - at most one attempt exists (single-flight): every token request made while it runs
///   joins its waiters;
/// - the timers armed match the phase: `proactive` only in `idle(due)`, `backoff` only in
///   `backingOff`, `attemptTimeout` only while `refreshing`, `lockRetry` only while an
///   attempt waits for the lock.
struct RefreshStateMachine<Waiter> {
    /// Where the refresh stands.
    enum Phase {
        /// No session: nothing is refreshed.
        case inactive
        /// Signed in, nothing in flight; the proactive refresh is due at `proactiveDue`
        /// (loop clock), or never (no refresh token, or a configuration failure).
        case idle(proactiveDue: Duration?)
        /// One attempt is in flight (or waiting for the cross-process lock).
        case refreshing(Attempt)
        /// A transient failure: the next attempt starts at `due` (loop clock).
        case backingOff(due: Duration)
    }

    /// The one refresh in flight.
    struct Attempt {
        let identity: AttemptIdentity
        /// Everyone waiting for its result.
        var waiters: [Waiter]
        var lock: LockHold
        /// The timeout passed and the request was asked to end: the attempt now waits for
        /// it to *end* (its answer, or the cancellation's), because the request may have
        /// rotated the refresh token, which must then not be sent again meanwhile.
        var cancelling = false
        /// The timeout passed while the authority said its answer was arriving (a 2xx: the
        /// refresh token is rotated): the attempt waits for that answer instead of cancelling.
        var arriving = false
        /// Who held the refresh lease when this attempt last looked (while `lock == .waiting`).
        var leaseHolder: RefreshLeaseHolder? = nil
    }

    /// The attempt's hold on the cross-process refresh lock of a shared store.
    enum LockHold: Sendable, Equatable {
        /// The store is not shared (or this is a re-authentication): no lock.
        case notNeeded
        /// Another process holds it; `lockRetry` looks again.
        case waiting
        /// Held: released only after the answer is stored.
        case held
    }

    /// What a caller wants from `tokenRequested`.
    enum TokenRequest: Sendable, Equatable {
        /// The current token, refreshed first when within the margin of expiry.
        case fresh
        /// A refresh now, whatever the margin says.
        case refreshNow
        /// A request failed with 401 using this token (compare-and-refresh).
        case unauthorized(Secret)
    }

    /// What `acquireLock` found.
    enum LockOutcome: Sendable, Equatable {
        /// Another process holds the lease (nil: the store could not tell who).
        case busy(RefreshLeaseHolder?)
        /// The lock is this process's now, and the store holds nothing newer.
        case acquired
        /// The shared store holds tokens another process refreshed (a refresh token other
        /// than the one this attempt would send): adopt them, send nothing. `lockHeld`:
        /// whether the lock was taken before this was seen (it is then released).
        case newerStored(LiveSession, lockHeld: Bool)
    }

    /// What the storage does, in order.
    enum Action {
        case arm(RefreshTimer, after: Duration)
        case cancel(RefreshTimer)
        /// Look in the shared store for tokens refreshed elsewhere, else try the lock, and
        /// report with `lockAttempted`. Never waits.
        case acquireLock
        case releaseLock
        /// Ask the authority to refresh with `identity.refreshToken`; answer with
        /// `answerArrived(identity, ...)`.
        case sendRefresh(AttemptIdentity)
        /// Ask the authority to end the request of `identity` (it still answers, with
        /// whatever arrived or `AuthorityError.cancelled`).
        case cancelRequest(AttemptIdentity)
        /// The fallback after a terminal refusal; answer with `answerArrived(identity, ...)`.
        case sendReauthentication(AttemptIdentity, externalUserID: String)
        /// Ask the authority whether `accessToken` is still active; answer with
        /// `validationAnswered`.
        case validate(accessToken: Secret, generation: UInt64)
        case answer([Waiter], Result<Secret, SessionError>)
        /// The authority reported who the tokens belong to.
        case setMemberID(String)
        /// Store the session as it is now.
        case persist
        case emit(SessionEvent)
        /// IN → EXPIRED. The storage ends the session (`endSession`) and tells everyone.
        case expire(reason: String)
        case log(Logger.Level, String, [String: String])
    }

    let policy: RefreshPolicy
    /// The store is shared with other processes: refresh only under its lock.
    let usesRefreshLock: Bool

    private(set) var phase: Phase = .inactive
    private(set) var live: LiveSession?
    /// Bumped by every end of a session (sign-in, logout, expiry, reconfigure, close): an
    /// answer that belongs to an earlier generation changes nothing.
    private(set) var generation: UInt64 = 0
    private(set) var consecutiveFailures = 0
    private var nextAttemptID: UInt64 = 0
    /// The token a 401-triggered refresh produced: a 401 for it again is not refreshed.
    private var tokenFromUnauthorizedRefresh: Secret?
    /// A lost answer (`AuthorityError.isAnswerLost`) was retried at once; until new tokens
    /// arrive, another lost answer waits for the backoff like any transient failure.
    private var lostAnswerRetried = false
    /// What the last transient failure said (no secret: the authority's words, already
    /// scrubbed): a caller told the refresh is backing off is told why, too.
    private var lastTransientFailure: String?

    init(policy: RefreshPolicy, usesRefreshLock: Bool) {
        self.policy = policy
        self.usesRefreshLock = usesRefreshLock
    }

    static var expiredError: SessionError {
        SessionError(.sessionExpired, "Your session has expired. Please sign in again.")
    }

    /// Callers waiting on the attempt in flight.
    var waiterCount: Int {
        if case .refreshing(let attempt) = phase { return attempt.waiters.count }
        return 0
    }

    /// When the next refresh is due (a retry, or the proactive one), for status displays.
    var nextRefreshAt: Duration? {
        switch phase {
        case .idle(let due): due
        case .backingOff(let due): due
        case .inactive, .refreshing: nil
        }
    }

    /// Until when (loop clock) a `.fresh` token request is answered with the current access
    /// token at once — no refresh, no other action (nil: not now). The fast path of
    /// `SessionManager.freshAccessToken()` reads it from the published snapshot.
    var answersFreshUntil: Duration? {
        guard let live, !live.accessToken.isBlank else { return nil }
        switch phase {
        case .idle, .backingOff: return live.expiresAt - policy.effectiveMargin(lifetime: live.lifetime)
        case .inactive, .refreshing: return nil
        }
    }

    var isRefreshing: Bool {
        if case .refreshing = phase { return true }
        return false
    }

    /// The attempt in flight, if any.
    var attemptInFlight: AttemptIdentity? { currentAttemptIdentity }

    var isBackingOff: Bool {
        if case .backingOff = phase { return true }
        return false
    }

    // MARK: - Session boundaries

    /// A session starts (sign-in, restore, another process's sign-in): its tokens are kept,
    /// nothing is scheduled yet (`scheduleProactive` or `resumeRestored` does that).
    mutating func sessionBegan(_ session: LiveSession) {
        precondition(live == nil, "a session began while another is live: end it first")
        live = session
        phase = .idle(proactiveDue: nil)
    }

    /// The session ends (logout, expiry, reconfigure, a new sign-in, close), or only its
    /// generation (so answers in flight become no-ops): the attempt in flight is abandoned
    /// and its waiters handed back (the caller fails them once the new state is published),
    /// every timer stops and the lock is released.
    mutating func endSession(keepTokens: Bool = false) -> (abandoned: [Waiter], actions: [Action]) {
        generation += 1
        var abandoned: [Waiter] = []
        var actions: [Action] = []
        if case .refreshing(let attempt) = phase {
            abandoned = attempt.waiters
            // Its answer would be discarded (another generation): the request ends now.
            if attempt.lock != .waiting { actions.append(.cancelRequest(attempt.identity)) }
            actions += endAttemptActions(attempt, releasingLock: true)
        }
        actions += [.cancel(.proactive), .cancel(.backoff)]
        consecutiveFailures = 0
        tokenFromUnauthorizedRefresh = nil
        lostAnswerRetried = false
        lastTransientFailure = nil
        if !keepTokens { live = nil }
        phase = live == nil ? .inactive : .idle(proactiveDue: nil)
        return (abandoned, actions)
    }

    /// Arms the proactive refresh for the tokens held (none without a refresh token).
    mutating func scheduleProactive(now: Duration, unitRandom: Double) -> [Action] {
        var actions: [Action] = [.cancel(.proactive)]
        guard let live else { return actions }
        guard live.refreshToken != nil else {
            if case .idle = phase { phase = .idle(proactiveDue: nil) }
            return actions
        }
        let delay = policy.proactiveDelay(
            now: now, expiresAt: live.expiresAt, lifetime: live.lifetime, lastRefresh: live.lastRefresh,
            unitRandom: unitRandom)
        switch phase {
        case .idle:
            phase = .idle(proactiveDue: now + delay)
            actions.append(.arm(.proactive, after: delay))
        case .refreshing, .backingOff, .inactive:
            // The attempt's end, or the retry, schedules what comes next.
            break
        }
        return actions
    }

    /// A restored session: refreshed now if due, else on its proactive timer. (A failure
    /// then only schedules a retry: it never logs anyone out.)
    mutating func resumeRestored(now: Duration, unitRandom: Double) -> [Action] {
        guard let live else { return [] }
        if policy.needsRefresh(now: now, expiresAt: live.expiresAt, lifetime: live.lifetime) {
            return startRefresh(reason: .restore, waiters: [], now: now)
        }
        return scheduleProactive(now: now, unitRandom: unitRandom)
    }

    /// The proactive timer was cancelled from outside (tests play a token whose proactive
    /// refresh never happened).
    mutating func proactiveCancelled() -> [Action] {
        if case .idle = phase { phase = .idle(proactiveDue: nil) }
        return [.cancel(.proactive)]
    }

    // MARK: - Requests

    /// A caller wants a token. The caller has checked that someone is signed in (`live`).
    mutating func tokenRequested(_ request: TokenRequest, waiter: Waiter, now: Duration) -> [Action] {
        guard let live else {
            return [.answer([waiter], .failure(SessionError(.notLoggedIn, "no one is signed in")))]
        }
        if case .unauthorized(let token) = request {
            guard token == live.accessToken else {
                return [.answer([waiter], .success(live.accessToken))]
            }
            if let tokenFromUnauthorizedRefresh, tokenFromUnauthorizedRefresh == token {
                return [.answer([waiter], .failure(SessionError(
                    .unauthorized, "a token fresh from a refresh was refused again; not refreshing in a loop")))]
            }
        }
        if case .refreshing(var attempt) = phase {
            // Out of the phase first, so the append does not copy every waiter (the phase
            // would otherwise still share the array): 10 000 joiners stay O(n), not O(n²).
            phase = .inactive
            attempt.waiters.append(waiter)
            phase = .refreshing(attempt)
            return []
        }
        switch request {
        case .refreshNow:
            return startRefresh(reason: .onDemand, waiters: [waiter], now: now)
        case .unauthorized:
            if case .backingOff(let due) = phase {
                return [.answer([waiter], .failure(backingOffError(due: due, now: now)))]
            }
            return startRefresh(reason: .unauthorized, waiters: [waiter], now: now)
        case .fresh:
            let recentlyRefreshed = live.lastRefresh.map { now < $0 + policy.minimumInterval } ?? false
            guard policy.needsRefresh(now: now, expiresAt: live.expiresAt, lifetime: live.lifetime),
                !recentlyRefreshed
            else {
                return [.answer([waiter], .success(live.accessToken))]
            }
            if case .backingOff(let due) = phase {
                // A retry is already scheduled: a token that still works is better than waiting.
                if now < live.expiresAt { return [.answer([waiter], .success(live.accessToken))] }
                return [.answer([waiter], .failure(backingOffError(due: due, now: now)))]
            }
            return startRefresh(reason: .onDemand, waiters: [waiter], now: now)
        }
    }

    /// The host came back from the background: validate, unless a refresh is already due,
    /// in flight or scheduled after a failure. `canValidate`: whether the authority can
    /// answer `validate` (else the session counts as valid while its token has not expired).
    mutating func resumeRequested(now: Duration, canValidate: Bool) -> [Action] {
        guard let live, case .idle = phase else { return [] }
        if policy.needsRefresh(now: now, expiresAt: live.expiresAt, lifetime: live.lifetime) {
            return startRefresh(reason: .resume, waiters: [], now: now)
        }
        guard canValidate else { return [.emit(.validated)] }
        return [.validate(accessToken: live.accessToken, generation: generation)]
    }

    /// The authority answered `validate`.
    mutating func validationAnswered(
        generation: UInt64, token: Secret, result: Result<Bool, AuthorityError>, now: Duration
    ) -> [Action] {
        guard generation == self.generation, live?.accessToken == token, case .idle = phase else { return [] }
        switch result {
        case .success(true):
            return [.emit(.validated)]
        case .success(false):
            return startRefresh(reason: .resume, waiters: [], now: now)
        case .failure(let error) where error.kind == .terminal:
            return startRefresh(reason: .resume, waiters: [], now: now)
        case .failure(let error):
            return [.log(.info, "validation failed; keeping the session", ["error": "\(error)"])]
        }
    }

    // MARK: - Timers and the lock

    /// A timer armed by an earlier action fired. One that no longer fits the phase (a
    /// cancellation raced it) does nothing. `requestCancellable`: whether the request in
    /// flight can be cancelled (its authority said how, and it has not answered yet).
    /// `answerArrivingBy`: the authority said the request's answer is arriving and ends by
    /// itself by then (`AuthorityCompletion.answerArriving(within:)`).
    mutating func timerFired(
        _ timer: RefreshTimer, now: Duration, unitRandom: Double, requestCancellable: Bool = false,
        answerArrivingBy: Duration? = nil
    ) -> [Action] {
        switch (timer, phase) {
        case (.proactive, .idle(.some)):
            phase = .idle(proactiveDue: nil)
            return startRefresh(reason: .proactive, waiters: [], now: now)
        case (.backoff, .backingOff):
            phase = .idle(proactiveDue: nil)
            return startRefresh(reason: .retry, waiters: [], now: now)
        case (.attemptTimeout, .refreshing(var attempt)):
            if attempt.lock == .waiting { return leaseWaitTimedOut(attempt, now: now, unitRandom: unitRandom) }
            if let endsBy = answerArrivingBy, !attempt.arriving, !attempt.cancelling {
                // The server accepted the refresh and rotated its token: cancelling now would
                // lose the only valid tokens. The request ends by itself (a stall, its cap);
                // one more timeout after that bounds an authority that breaks its word.
                attempt.arriving = true
                phase = .refreshing(attempt)
                let left = max(endsBy - now, .zero)
                return [
                    .log(.info, "refresh timed out while its answer was arriving (the server accepted it); "
                        + "waiting for that answer instead of cancelling",
                         ["attempt": "\(attempt.identity.id)", "endsWithin": "\(left)"]),
                    .arm(.attemptTimeout, after: left + policy.timeout),
                ]
            }
            if !attempt.cancelling && requestCancellable {
                // The request may have rotated the refresh token: it is cancelled, and the
                // attempt (with the lock) lasts until it has really ended. A grace of one
                // more timeout bounds an authority that never ends it.
                attempt.cancelling = true
                phase = .inactive
                phase = .refreshing(attempt)
                return [
                    .log(.info, "refresh timed out; cancelling its request and waiting for it to end",
                         ["attempt": "\(attempt.identity.id)", "timeout": "\(policy.timeout)"]),
                    .cancelRequest(attempt.identity),
                    .arm(.attemptTimeout, after: policy.timeout),
                ]
            }
            var message = "the authority did not answer within \(policy.timeout)"
            if attempt.cancelling {
                message += "; its request was cancelled but did not end within \(policy.timeout) more"
            }
            // A transient failure: re-authentication is never reached from it.
            var actions: [Action] = []
            if attempt.cancelling {
                actions.append(.log(.error, "the authority did not end a cancelled refresh; giving up on it "
                    + "(its refresh token may be sent again while that request is still running)",
                    ["attempt": "\(attempt.identity.id)"]))
            }
            return actions + answerArrived(
                attempt.identity, .failure(.transient(message)),
                receivedAt: now, now: now, unitRandom: unitRandom, canReauthenticate: false)
        case (.lockRetry, .refreshing(let attempt)) where attempt.lock == .waiting:
            return [.acquireLock]
        default:
            return []
        }
    }

    /// What `acquireLock` found. The storage looks off the loop and answers later: `attempt`
    /// names the attempt that asked (nil: whichever waits), so an answer that arrives after
    /// that attempt ended — even while a newer attempt waits for the lock — never counts for
    /// another attempt.
    mutating func lockAttempted(
        _ outcome: LockOutcome, attempt attemptID: UInt64? = nil, now: Duration, unitRandom: Double
    ) -> [Action] {
        guard case .refreshing(var attempt) = phase, attempt.lock == .waiting,
            attemptID.map({ $0 == attempt.identity.id }) ?? true
        else {
            // No attempt waits for this answer (it ended while the storage looked): give back
            // a lock it took — unless the attempt in flight holds it (the same lock).
            if case .refreshing(let current) = phase, current.lock == .held { return [] }
            if case .newerStored(_, lockHeld: true) = outcome { return [.releaseLock] }
            if outcome == .acquired { return [.releaseLock] }
            return []
        }
        switch outcome {
        case .busy(let holder):
            // Another process is refreshing: look again shortly (the timeout still runs). Not
            // at the lease's deadline: that bounds a holder that cannot release (stopped, hung);
            // a live one releases as soon as its answer is stored, usually within a round trip.
            // A look is a small file's open, flock, read and close plus a store read, 20 a
            // second and only while another process refreshes; the directory watch often brings
            // the new tokens sooner still.
            if let holder { attempt.leaseHolder = holder }
            phase = .refreshing(attempt)
            return [.arm(.lockRetry, after: .milliseconds(50))]
        case .acquired:
            attempt.lock = .held
            phase = .refreshing(attempt)
            // The request gets a whole timeout of its own: the one armed at the attempt's start
            // may be nearly spent by the wait for the lease, and cancelling a request the server
            // has already answered loses the rotated tokens (the stress tier's lost rounds: the
            // second process got the lease 0.9 s into its 1 s timeout and cancelled its refresh
            // as the answer came). The lease lasts six timeouts, so it still outlives it.
            return [.arm(.attemptTimeout, after: policy.timeout), .sendRefresh(attempt.identity)]
        case .newerStored(let stored, let lockHeld):
            if lockHeld {
                attempt.lock = .held
                phase = .refreshing(attempt)
            }
            return adoptRefreshedElsewhere(stored, now: now, unitRandom: unitRandom)
        }
    }

    /// Another process stored new tokens for this session (seen by the directory watch).
    mutating func storedTokensChanged(_ stored: LiveSession, now: Duration, unitRandom: Double) -> [Action] {
        guard let live, live.accessToken != stored.accessToken else { return [] }  // our own write
        switch phase {
        case .inactive:
            return []
        case .refreshing(let attempt):
            // Adopt only tokens refreshed elsewhere: with a refresh token other than the one in
            // flight, or (not rotated) another valid access token expiring later than ours —
            // that only while waiting for the lease: with it held, our request is on its way,
            // and letting the lease go would let another process send the same refresh token.
            guard let refreshToken = stored.refreshToken,
                refreshToken != attempt.identity.refreshToken
                    || (attempt.lock == .waiting && LiveSession.refreshedElsewhere(
                        refreshToken: refreshToken, accessToken: stored.accessToken, expiresAt: stored.expiresAt,
                        inFlight: attempt.identity.refreshToken, held: live.accessToken,
                        heldExpiresAt: live.expiresAt, now: now))
            else { return [] }
            return adoptRefreshedElsewhere(stored, now: now, unitRandom: unitRandom)
        case .idle, .backingOff:
            return adopt(stored, now: now, unitRandom: unitRandom)
        }
    }

    // MARK: - Answers

    /// The authority answered (or the attempt's timeout fired, as a transient failure).
    /// `canReauthenticate`: whether the authority offers the fallback after a terminal
    /// refusal (tried once, for a session with an external user id).
    mutating func answerArrived(
        _ identity: AttemptIdentity, _ result: Result<TokenGrant, AuthorityError>,
        receivedAt: Duration, now: Duration, unitRandom: Double, canReauthenticate: Bool
    ) -> [Action] {
        guard identity.generation == generation, let live else {
            // The session changed hands (logout, new sign-in): a no-op by design.
            return [.log(.debug, "a refresh answer for an ended session was discarded", ["attempt": "\(identity.id)"])]
        }
        guard case .refreshing(let attempt) = phase, attempt.identity.id == identity.id else {
            // An attempt that timed out answered after all. A success for the refresh token
            // still held is adopted: the authority may have rotated (consumed) that token,
            // and sending it again would get the session expired.
            if case .success(let grant) = result, let used = identity.refreshToken, used == live.refreshToken {
                var actions: [Action] = [
                    .log(.info, "a refresh answered after its timeout; adopting its tokens", ["attempt": "\(identity.id)"])
                ]
                if case .backingOff = phase {
                    actions.append(.cancel(.backoff))
                    phase = .idle(proactiveDue: nil)
                }
                actions += apply(grant, receivedAt: receivedAt, reason: identity.reason, now: now, unitRandom: unitRandom).actions
                return actions
            }
            return [.log(.debug, "a late refresh answer was discarded", ["attempt": "\(identity.id)"])]
        }

        // A cancelled request's end is the timeout it was cancelled for.
        var result = result
        if attempt.cancelling, case .failure(let error) = result, error.isCancellation {
            result = .failure(.transient("the authority did not answer within \(policy.timeout) (the request was cancelled)"))
        }

        // The attempt ends here. Its lock is released only after the answer is stored, so
        // that the next process to take it finds the rotated tokens.
        var actions = endAttemptActions(attempt, releasingLock: false)
        phase = .idle(proactiveDue: nil)
        let waiters = attempt.waiters
        /// The waiters of an attempt whose answer was lost: they join the retry sent at once.
        var retryingAtOnce: [Waiter]?
        switch result {
        case .success(let grant):
            let applied = apply(grant, receivedAt: receivedAt, reason: identity.reason, now: now, unitRandom: unitRandom)
            actions += applied.actions
            actions.append(.answer(waiters, .success(applied.token)))

        case .failure(let error) where identity.reason == .reauthentication:
            // The fallback is tried once: whatever it answers short of tokens ends the session.
            actions.append(.expire(reason: "re-authentication failed: \(error.description)"))
            actions.append(.answer(waiters, .failure(Self.expiredError)))

        case .failure(let error) where error.kind == .terminal && identity.refreshToken != live.refreshToken:
            // A refused token that is no longer ours (a late answer rotated it meanwhile).
            actions.append(.log(.debug, "a refusal of a replaced refresh token was ignored", ["error": "\(error)"]))
            actions += scheduleProactive(now: now, unitRandom: unitRandom)
            actions.append(.answer(waiters, .success(live.accessToken)))

        case .failure(let error) where error.isAnswerLost && !lostAnswerRetried
            && identity.reason != .reauthentication && identity.refreshToken == live.refreshToken:
            // The server rotated the refresh token, and the answer carrying the new one was lost.
            // The old one is all there is: sent again at once, it is accepted by a server with a
            // reuse grace period; waiting for the backoff would only outlast that grace.
            consecutiveFailures += 1
            lostAnswerRetried = true
            actions.append(.log(.warning, "a refresh answer was lost after the server accepted it; "
                + "sending the same refresh token once more at once (servers allow that within a grace period)",
                ["attempt": "\(identity.id)", "error": "\(error)"]))
            actions.append(.emit(.refreshFailed(attempt: consecutiveFailures, retryIn: .zero, error: error)))
            retryingAtOnce = waiters

        case .failure(let error) where error.kind == .transient:
            consecutiveFailures += 1
            lastTransientFailure = error.message
            let delay = policy.backoffDelay(
                failures: consecutiveFailures, retryAfter: error.retryAfter, unitRandom: unitRandom)
            phase = .backingOff(due: now + delay)
            actions.append(.arm(.backoff, after: delay))
            actions.append(.log(.info, "refresh failed, retrying", [
                "attempt": "\(consecutiveFailures)", "retryIn": "\(delay)", "error": "\(error)",
            ]))
            actions.append(.emit(.refreshFailed(attempt: consecutiveFailures, retryIn: delay, error: error)))
            actions.append(.answer(waiters, .failure(SessionError(.transient, error.message, retryAfter: delay))))

        case .failure(let error) where error.kind == .configuration:
            consecutiveFailures += 1
            actions.append(.log(.error, "refresh refused: the client is misconfigured", ["error": "\(error)"]))
            actions.append(.emit(.refreshFailed(attempt: consecutiveFailures, retryIn: nil, error: error)))
            actions.append(.answer(waiters, .failure(SessionError(.configuration, error.description))))

        case .failure(let error):
            if canReauthenticate, let externalUserID = live.externalUserID {
                actions.append(.log(.info, "refresh token refused; trying re-authentication once", [:]))
                actions += beginAttempt(reason: .reauthentication, refreshToken: nil, waiters: waiters)
                let reauthentication = currentAttemptIdentity!
                actions.append(.sendReauthentication(reauthentication, externalUserID: externalUserID))
            } else {
                actions.append(.expire(reason: error.description))
                actions.append(.answer(waiters, .failure(Self.expiredError)))
            }
        }
        if attempt.lock == .held { actions.append(.releaseLock) }
        if let retryingAtOnce { actions += startRefresh(reason: .retry, waiters: retryingAtOnce, now: now) }
        return actions
    }

    // MARK: - Internals

    private var currentAttemptIdentity: AttemptIdentity? {
        if case .refreshing(let attempt) = phase { return attempt.identity }
        return nil
    }

    private func backingOffError(due: Duration, now: Duration) -> SessionError {
        let why = lastTransientFailure.map { ": \($0)" } ?? ""
        return SessionError(.transient, "the refresh is backing off after a failure\(why)", retryAfter: due - now)
    }

    /// Starts the one refresh (the caller made sure none is in flight).
    private mutating func startRefresh(reason: RefreshReason, waiters: [Waiter], now: Duration) -> [Action] {
        guard let live else { return [] }
        guard live.canRefresh else {
            // Nothing to refresh with: the access token is all there is until it expires.
            if reason == .unauthorized {
                // The server just refused it: handing it back would invite a retry loop.
                return [.answer(waiters, .failure(SessionError(
                    .unauthorized, "the token was refused and there is no refresh token")))]
            }
            if now >= live.expiresAt {
                return [
                    .expire(reason: "the access token expired and there is no refresh token"),
                    .answer(waiters, .failure(Self.expiredError)),
                ]
            }
            return [.answer(waiters, .success(live.accessToken))]
        }
        var actions = beginAttempt(reason: reason, refreshToken: live.refreshToken, waiters: waiters)
        guard case .refreshing(let attempt) = phase else { return actions }
        actions.append(attempt.lock == .waiting ? .acquireLock : .sendRefresh(attempt.identity))
        return actions
    }

    /// The attempt's timeout fired while it still waited for another process's refresh lease:
    /// a transient failure that says so (no request was sent, so the authority is not to blame).
    /// The backoff retries; a holder that never releases loses the lease at its deadline.
    private mutating func leaseWaitTimedOut(_ attempt: Attempt, now: Duration, unitRandom: Double) -> [Action] {
        let message: String
        switch attempt.leaseHolder {
        case .some(let holder) where holder.isThisProcess:
            message = "another session of this process is refreshing through the same store (its lease runs "
                + "\(holder.remaining.secondsToTheMillisecond) more); no refresh was sent after waiting \(policy.timeout)"
        case .some(let holder):
            message = "another process (pid \(holder.pid)) is refreshing the session (its lease runs "
                + "\(holder.remaining.secondsToTheMillisecond) more); no refresh was sent after waiting \(policy.timeout)"
        case .none:
            message = "another process is refreshing the session (the store's refresh lease stayed busy); "
                + "no refresh was sent after waiting \(policy.timeout)"
        }
        return answerArrived(
            attempt.identity, .failure(.transient(message)), receivedAt: now, now: now, unitRandom: unitRandom,
            canReauthenticate: false)
    }

    /// Takes the single-flight slot; arms the timeout that ends it if the authority hangs.
    private mutating func beginAttempt(reason: RefreshReason, refreshToken: Secret?, waiters: [Waiter]) -> [Action] {
        precondition(!isRefreshing, "a refresh is already in flight")
        nextAttemptID += 1
        let identity = AttemptIdentity(
            id: nextAttemptID, generation: generation, reason: reason, refreshToken: refreshToken)
        let lock: LockHold = usesRefreshLock && refreshToken != nil ? .waiting : .notNeeded
        var actions: [Action] = []
        switch phase {
        case .idle(.some):
            actions.append(.cancel(.proactive))
        case .backingOff:
            actions.append(.cancel(.backoff))
        case .idle(nil), .inactive, .refreshing:
            break
        }
        phase = .refreshing(Attempt(identity: identity, waiters: waiters, lock: lock))
        actions.append(.arm(.attemptTimeout, after: policy.timeout))
        actions.append(.log(.debug, "refresh started", ["reason": "\(reason)", "attempt": "\(identity.id)"]))
        return actions
    }

    /// Frees what an attempt held: its timers, and the lock if `releasingLock`.
    private func endAttemptActions(_ attempt: Attempt, releasingLock: Bool) -> [Action] {
        var actions: [Action] = [.cancel(.attemptTimeout)]
        if attempt.lock == .waiting { actions.append(.cancel(.lockRetry)) }
        if releasingLock && attempt.lock == .held { actions.append(.releaseLock) }
        return actions
    }

    /// The shared store holds tokens another process refreshed while this attempt waited:
    /// adopt them instead of sending a stale refresh token, and answer the attempt's waiters.
    private mutating func adoptRefreshedElsewhere(_ stored: LiveSession, now: Duration, unitRandom: Double) -> [Action] {
        guard case .refreshing(let attempt) = phase else { return [] }
        var actions = adopt(stored, now: now, unitRandom: unitRandom, endingAttempt: true)
        actions += endAttemptActions(attempt, releasingLock: true)
        actions.append(.answer(attempt.waiters, .success(stored.accessToken)))
        return actions
    }

    /// Takes tokens another process stored (their expiry already on the loop clock).
    private mutating func adopt(
        _ stored: LiveSession, now: Duration, unitRandom: Double, endingAttempt: Bool = false
    ) -> [Action] {
        var actions: [Action] = []
        live = stored
        consecutiveFailures = 0
        if case .backingOff = phase { actions.append(.cancel(.backoff)) }
        if endingAttempt || !isRefreshing { phase = .idle(proactiveDue: nil) }
        actions.append(.log(.info, "adopted tokens another process refreshed", [:]))
        actions.append(.emit(.tokenRefreshed(expiresIn: stored.lifetime, reason: .sharedStore)))
        actions += scheduleProactive(now: now, unitRandom: unitRandom)
        return actions
    }

    /// New tokens: kept (a missing refresh token keeps the old one), stored before any
    /// waiter is answered, announced, and the next proactive refresh scheduled.
    private mutating func apply(
        _ grant: TokenGrant, receivedAt: Duration, reason: RefreshReason, now: Duration, unitRandom: Double
    ) -> (token: Secret, actions: [Action]) {
        guard var session = live else { return (grant.accessToken, []) }
        let lifetime = policy.clampedLifetime(grant.expiresIn)
        session.accessToken = grant.accessToken
        if let rotated = grant.refreshToken { session.refreshToken = rotated }
        // RFC 6749 §6: a refresh answer without `scope` keeps the scope granted before.
        if let scope = grant.scope { session.scope = scope }
        session.expiresAt = receivedAt + lifetime
        session.lifetime = lifetime
        session.lastRefresh = receivedAt
        live = session
        consecutiveFailures = 0
        lostAnswerRetried = false
        lastTransientFailure = nil
        tokenFromUnauthorizedRefresh = reason == .unauthorized ? grant.accessToken : nil
        var actions: [Action] = []
        if let member = grant.memberID { actions.append(.setMemberID(member)) }
        actions.append(.persist)
        actions.append(.emit(.tokenRefreshed(expiresIn: lifetime, reason: reason)))
        actions += scheduleProactive(now: now, unitRandom: unitRandom)
        return (grant.accessToken, actions)
    }

    /// The invariants above; for tests and debug builds.
    func checkInvariants() -> String? {
        switch phase {
        case .inactive:
            if live != nil { return "inactive with tokens" }
        case .idle, .backingOff:
            if live == nil { return "\(phase) without tokens" }
        case .refreshing(let attempt):
            if live == nil { return "refreshing without tokens" }
            if attempt.identity.generation != generation { return "an attempt of an earlier generation" }
            if attempt.identity.refreshToken == nil && attempt.identity.reason != .reauthentication {
                return "a refresh attempt without a refresh token"
            }
        }
        return nil
    }
}
