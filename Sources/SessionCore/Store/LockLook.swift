/// What the store worker found when a refresh attempt looked for the cross-process refresh
/// lease of a shared store (`SessionEngine.acquireLock`): the raw answers, turned into the
/// refresh machine's `LockOutcome` on the loop.
enum LockLook: Sendable, Equatable {
    /// What the attempt looks for: tokens of `memberID` another process refreshed — with a
    /// refresh token other than the one in flight, or (a server that keeps refresh tokens)
    /// another access token than the one held here, expiring later (`refreshedElsewhere`).
    struct Question: Sendable {
        var memberID: String?
        var refreshTokenInFlight: Secret?
        /// The access token this session holds, and when it expires (wall clock, as stored).
        var accessTokenHeld: Secret? = nil
        var heldExpiresAt: Duration? = nil
        /// When the question was asked (wall clock): a stored token expired by then is no
        /// refresh of another process's to take.
        var askedAt: Duration? = nil
        var leaseDuration: Duration
    }

    case busy(RefreshLeaseHolder?)
    case acquired
    /// The store holds tokens another process refreshed; `lockHeld`: the lease was taken
    /// before they were seen.
    case newerStored(StoredSession, lockHeld: Bool)

    /// Whether this look left the lease with the caller.
    var tookLease: Bool {
        switch self {
        case .acquired, .newerStored(_, lockHeld: true): true
        case .busy, .newerStored(_, lockHeld: false): false
        }
    }

    /// On the worker: the store first (another process may have refreshed already), then the
    /// lease if free, then the store again under it. Never waits for the lease's holder.
    static func look(_ question: Question, in store: any CredentialStore) -> LockLook {
        guard let shared = store as? any SharedCredentialStore else { return .acquired }
        if let newer = refreshedElsewhere(store.read(), question) { return .newerStored(newer, lockHeld: false) }
        if case .busy(let holder) = shared.tryAcquireRefreshLease(for: question.leaseDuration) { return .busy(holder) }
        if let newer = refreshedElsewhere(store.read(), question) { return .newerStored(newer, lockHeld: true) }
        return .acquired
    }

    /// The stored session if it holds this member's tokens refreshed elsewhere
    /// (`LiveSession.refreshedElsewhere`).
    static func refreshedElsewhere(_ read: StoreRead, _ question: Question) -> StoredSession? {
        guard case .present(let stored) = read, !stored.expired,
            stored.memberID == question.memberID, let access = stored.accessToken, !access.isBlank,
            let refreshToken = stored.refreshToken,
            LiveSession.refreshedElsewhere(
                refreshToken: refreshToken, accessToken: access, expiresAt: stored.accessTokenExpiresAt,
                inFlight: question.refreshTokenInFlight, held: question.accessTokenHeld,
                heldExpiresAt: question.heldExpiresAt, now: question.askedAt)
        else { return nil }
        return stored
    }
}

extension LiveSession {
    /// Whether tokens found in the store were refreshed by another process while this one
    /// was about to send `inFlight`, holding the access token `held`: their refresh token is
    /// another (the server rotates them: the one in flight may be spent) — or, a server that
    /// keeps its refresh tokens, their access token is another one that expires later than
    /// `held` (a refresh after the one that gave `held`; an older record, a write of ours the
    /// store missed, expires earlier) and is still valid `now` (the one held may have expired
    /// long ago: any older record would expire "later"). `expiresAt`, `heldExpiresAt` and
    /// `now` on one clock.
    static func refreshedElsewhere(
        refreshToken: Secret, accessToken: Secret, expiresAt: Duration?,
        inFlight: Secret?, held: Secret?, heldExpiresAt: Duration?, now: Duration?
    ) -> Bool {
        if refreshToken != inFlight { return true }
        guard let held, accessToken != held, let expiresAt, let heldExpiresAt, let now else { return false }
        return expiresAt > heldExpiresAt && expiresAt > now
    }
}
