/// Why a session ended without expiring.
public enum SignOutReason: String, Sendable, Hashable, CustomStringConvertible {
    /// `logout()`.
    case userRequested
    /// `reconfigure()` after expiry.
    case reconfigured
    /// Another process sharing the store logged out (or signed in as someone else).
    case otherProcess
    public var description: String { rawValue }
}

/// What happened to the session, for observers of `SessionManager.events`.
/// Nothing here carries a token.
public enum SessionEvent: Sendable, Hashable, CustomStringConvertible {
    /// The state read from the store at start, emitted once when the session starts and the
    /// store answers. The session starts on the loop's first turn after the manager is
    /// made, or — with `SessionConfiguration.startsAutomatically` off — at
    /// `SessionManager.start()`, so an observer that subscribes before it cannot miss this
    /// (events are not replayed; `state` always has the current state).
    case initialSession(SessionState)
    case signedIn(memberID: String?)
    case signedOut(reason: SignOutReason)
    /// New tokens arrived; the access token lives `expiresIn`.
    case tokenRefreshed(expiresIn: Duration, reason: RefreshReason)
    /// A refresh failed; `retryIn` is when the next attempt comes (nil: none scheduled).
    case refreshFailed(attempt: Int, retryIn: Duration?, error: AuthorityError)
    /// The session is over; the user must sign in again.
    case sessionExpired(reason: String)
    /// `resume()` confirmed the session.
    case validated
    /// The store failed; nothing was logged out because of it.
    case storeError(StoreError)
    /// The manager's active account changed (`SessionManager.switchAccount(to:)`, or — signed
    /// out here — another process signed in and made active an account this manager has in the
    /// background): `state` is that account's from now on.
    case accountSwitched(account: String)

    public var description: String {
        switch self {
        case .initialSession(let state): "initialSession(\(state))"
        case .signedIn(let memberID): "signedIn(memberID: \(memberID ?? "nil"))"
        case .signedOut(let reason): "signedOut(\(reason))"
        case .tokenRefreshed(let expiresIn, let reason): "tokenRefreshed(expiresIn: \(expiresIn), reason: \(reason))"
        case .refreshFailed(let attempt, let retryIn, let error):
            "refreshFailed(attempt: \(attempt), retryIn: \(retryIn.map { "\($0)" } ?? "nil"), \(error))"
        case .sessionExpired(let reason): "sessionExpired(\(reason))"
        case .validated: "validated"
        case .storeError(let error): "storeError(\(error.message))"
        case .accountSwitched(let account): "accountSwitched(\(account))"
        }
    }
}
