/// The tokens of a signed-in session, as the refresh logic keeps them in memory.
struct LiveSession: Sendable, Equatable {
    var accessToken: Secret
    var refreshToken: Secret?
    /// Monotonic (loop clock) instant of expiry: receipt time + `expires_in`.
    var expiresAt: Duration
    /// The access token's whole lifetime (`expires_in`), for the margin cap.
    var lifetime: Duration
    var externalUserID: String?
    /// When the last successful refresh was received (loop clock).
    var lastRefresh: Duration?
    /// The scope granted (sign-in; a refresh that says replaces it); nil: not known.
    var scope: String? = nil
    /// The DPoP key the tokens are bound to (nil: bearer tokens). A refresh keeps it.
    var dpopKey: DPoPKey? = nil

    /// Whether there is a refresh token to send.
    var canRefresh: Bool {
        guard let refreshToken else { return false }
        return !refreshToken.isBlank
    }
}

/// Which refresh attempt an answer belongs to. Travels with the request to the authority
/// and back, so an answer is matched to its attempt (and its generation) without looking
/// at anything else.
struct AttemptIdentity: Sendable, Equatable {
    let id: UInt64
    /// The session generation the attempt was started in: an answer from an earlier one
    /// changes nothing.
    let generation: UInt64
    let reason: RefreshReason
    /// The refresh token sent (nil for re-authentication).
    let refreshToken: Secret?
}

/// The timers the refresh logic arms. At most one of each runs at a time: arming one
/// replaces the previous.
enum RefreshTimer: Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// Refresh before expiry (margin and jitter).
    case proactive
    /// Retry after a transient failure.
    case backoff
    /// The attempt in flight has not answered in time.
    case attemptTimeout
    /// Look again for the cross-process refresh lock another process holds.
    case lockRetry

    var description: String {
        switch self {
        case .proactive: "proactive"
        case .backoff: "backoff"
        case .attemptTimeout: "attemptTimeout"
        case .lockRetry: "lockRetry"
        }
    }
}
