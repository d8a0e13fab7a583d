/// What the store worker found when a refresh attempt looked for the cross-process refresh
/// lease of a shared store (`SessionEngine.acquireLock`): the raw answers, turned into the
/// refresh machine's `LockOutcome` on the loop.
enum LockLook: Sendable, Equatable {
    /// What the attempt looks for: tokens of `memberID` refreshed with a refresh token other
    /// than the one in flight.
    struct Question: Sendable {
        var memberID: String?
        var refreshTokenInFlight: Secret?
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

    /// The stored session if it holds this member's tokens refreshed with a refresh token
    /// other than the one the attempt would send.
    static func refreshedElsewhere(_ read: StoreRead, _ question: Question) -> StoredSession? {
        guard case .present(let stored) = read, !stored.expired,
            stored.memberID == question.memberID, let access = stored.accessToken, !access.isBlank,
            let rotated = stored.refreshToken, rotated != question.refreshTokenInFlight
        else { return nil }
        return stored
    }
}
