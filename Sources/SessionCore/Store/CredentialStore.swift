/// What the store keeps of a session. Expiry is a wall-clock instant (it must survive a
/// restart); inside a running process expiry always follows the monotonic clock.
public struct StoredSession: Sendable, Equatable, CustomStringConvertible {
    public var accessToken: Secret?
    public var refreshToken: Secret?
    /// When the access token expires, as time since the Unix epoch.
    public var accessTokenExpiresAt: Duration?
    public var memberID: String?
    public var externalUserID: String?
    /// The session expired: tokens are gone, the member id is kept.
    public var expired: Bool

    public init(
        accessToken: Secret? = nil, refreshToken: Secret? = nil, accessTokenExpiresAt: Duration? = nil,
        memberID: String? = nil, externalUserID: String? = nil, expired: Bool = false
    ) {
        self.accessToken = accessToken
        self.refreshToken = refreshToken
        self.accessTokenExpiresAt = accessTokenExpiresAt
        self.memberID = memberID
        self.externalUserID = externalUserID
        self.expired = expired
    }

    public var description: String {
        "StoredSession(accessToken: \(accessToken == nil ? "nil" : "<redacted>"), "
            + "refreshToken: \(refreshToken == nil ? "nil" : "<redacted>"), memberID: \(memberID ?? "nil"), "
            + "expired: \(expired))"
    }
}

/// A store failure. The message never contains a token.
public struct StoreError: Error, Sendable, Hashable, CustomStringConvertible {
    public let message: String
    public init(_ message: String) { self.message = message }
    public var description: String { "store error: \(message)" }
}

/// The answers to a read. "Unavailable" never logs anyone out.
public enum StoreRead: Sendable, Equatable {
    case present(StoredSession)
    case absent
    /// Out of reach for now (permissions, I/O, a locked keyring): try again later.
    case unavailable(StoreError)
    /// What was stored was damaged or tampered with: it was moved aside (never deleted)
    /// and reads as absent. The session reports it as `storeError`.
    case damaged(StoreError)
}

/// Where the session is kept. Called on the session's loop thread; keep each call short
/// (the file store's atomic write is a few milliseconds of fsync, a few times an hour).
public protocol CredentialStore: AnyObject, Sendable {
    func read() -> StoreRead
    func write(_ session: StoredSession) throws(StoreError)
    func clear() throws(StoreError)
}

/// A store that several processes share: they refresh one at a time (a cross-process
/// lock) and follow each other's changes (a directory watch).
public protocol SharedCredentialStore: CredentialStore {
    /// Takes the cross-process refresh lock if it is free; never waits.
    func tryLockRefresh() -> Bool
    /// Releases the refresh lock taken by `tryLockRefresh`.
    func unlockRefresh()
    /// Makes sure the store's directory exists and returns it, for a directory watch
    /// (nil: no watch).
    func directoryToWatch() -> String?
}
