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
    /// The key of the record it was read from, in a store of several accounts
    /// (`AccountCredentialStore`); nil otherwise. Writes ignore it.
    public var account: String?
    /// Who the session belongs to at the server (issuer, client, scope), sealed in the same
    /// record; nil in records written before profiles existed, and in the sessions a manager
    /// writes when it knows none (signed in with bare tokens: a store keeps the record's
    /// profile through them, `SessionProfile`).
    public var profile: SessionProfile?
    /// The scope granted to the access token (RFC 6749 §5.1), when known; nil in records
    /// written before it was kept.
    public var grantedScope: String?
    /// The DPoP key the tokens are bound to (RFC 9449), sealed with them; nil for bearer
    /// tokens and in records written before DPoP existed (they still open).
    public var dpopKey: DPoPKey?

    public init(
        accessToken: Secret? = nil, refreshToken: Secret? = nil, accessTokenExpiresAt: Duration? = nil,
        memberID: String? = nil, externalUserID: String? = nil, expired: Bool = false, account: String? = nil,
        profile: SessionProfile? = nil, grantedScope: String? = nil, dpopKey: DPoPKey? = nil
    ) {
        self.dpopKey = dpopKey
        self.profile = profile
        self.grantedScope = grantedScope
        self.accessToken = accessToken
        self.refreshToken = refreshToken
        self.accessTokenExpiresAt = accessTokenExpiresAt
        self.memberID = memberID
        self.externalUserID = externalUserID
        self.expired = expired
        self.account = account
    }

    /// Equal sessions hold the same tokens, DPoP key, expiry, member, granted scope and expiry flag,
    /// wherever they were read from (`account` is not compared, nor is `profile`: it travels
    /// beside the tokens).
    public static func == (lhs: StoredSession, rhs: StoredSession) -> Bool {
        lhs.accessToken == rhs.accessToken && lhs.refreshToken == rhs.refreshToken
            && lhs.accessTokenExpiresAt == rhs.accessTokenExpiresAt && lhs.memberID == rhs.memberID
            && lhs.externalUserID == rhs.externalUserID && lhs.expired == rhs.expired
            && lhs.grantedScope == rhs.grantedScope && lhs.dpopKey == rhs.dpopKey
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

/// Where the session is kept: a simple, synchronous contract for implementers.
///
/// A session never calls its store on its loop thread. Every call runs on the session's store
/// worker (`StoreWorker`): one thread of its own per session, started when there is store work
/// and gone when there is none, that runs the calls one at a time in the order the session
/// made them; the answers come back to the session as events on its loop. So a call **may
/// block** — wait for another process's write lock, fsync, rename — without holding up the
/// loop; only the session's later store work waits behind it.
///
/// The one exception is a store that says `callsMayBlock == false` (`MemoryCredentialStore`):
/// its calls run inline on the loop thread, in the same order, and their answers arrive
/// inline. Such a store must never wait for anything but a short lock of its own.
public protocol CredentialStore: AnyObject, Sendable {
    func read() -> StoreRead
    func write(_ session: StoredSession) throws(StoreError)
    func clear() throws(StoreError)
    /// Whether a call can wait for I/O or another process (true unless the store says
    /// otherwise). A store answering false is called inline on the loop thread.
    var callsMayBlock: Bool { get }
}

extension CredentialStore {
    public var callsMayBlock: Bool { true }
}

/// A store that several processes share: they refresh one at a time (a cross-process
/// refresh lease) and follow each other's changes (a directory watch).
///
/// The lease says who refreshes and until when. What a conforming store guarantees:
/// - While a lease is held and its deadline has not passed, `tryAcquireRefreshLease` answers
///   `.busy` to every other caller — in any process sharing the store, and to the holder
///   itself asking again (two sessions may share one store instance).
/// - A lease ends when its holder releases it, when its deadline passes (a stopped or hung
///   holder blocks the others only until then) or when its holder is known to be dead.
/// - `releaseRefreshLease` ends only the caller's own lease: one whose deadline passed and
///   that another caller has taken meanwhile stays the new holder's.
/// - Neither call waits for another process's refresh; each is a short critical section.
///   Like every store call they run on the session's store worker, never on its loop.
///
/// A caller holds the lease only while it refreshes, and reads the store again after taking
/// it (the previous holder may have stored tokens rotated meanwhile).
public protocol SharedCredentialStore: CredentialStore {
    /// Takes the cross-process refresh lease for `duration` if it is free; never waits for
    /// its holder. Choose `duration` so that the refresh has surely ended by then (its request
    /// answered or cancelled, the answer stored): past it, another process may refresh too.
    func tryAcquireRefreshLease(for duration: Duration) -> RefreshLeaseResult
    /// Ends the lease taken by `tryAcquireRefreshLease`, if it is still this caller's.
    func releaseRefreshLease()
    /// Makes sure the store's directory exists and returns it, for a directory watch
    /// (nil: no watch).
    func directoryToWatch() -> String?
}

/// What `SharedCredentialStore.tryAcquireRefreshLease` found.
public enum RefreshLeaseResult: Sendable, Hashable {
    /// The lease is the caller's until it releases it (or its duration runs out).
    case acquired
    /// Someone else refreshes. The holder, when the store could tell (nil: the lease could
    /// not be looked at just now — another process was reading or writing it at that instant,
    /// or its file could not be opened — try again shortly).
    case busy(RefreshLeaseHolder?)
}

/// Who holds a refresh lease, and until when.
public struct RefreshLeaseHolder: Sendable, Hashable, CustomStringConvertible {
    /// The holder's process id (in the holder's pid namespace).
    public var pid: Int32
    /// Whether the holder is this process (another session, or another store instance, in it).
    public var isThisProcess: Bool
    /// When the lease runs out, on `CLOCK_MONOTONIC` (one clock for every process of a Linux
    /// system, the one libuv's timers follow; it does not run while suspended).
    public var until: Duration
    /// How long the lease had left when it was looked at.
    public var remaining: Duration

    public init(pid: Int32, isThisProcess: Bool, until: Duration, remaining: Duration) {
        self.pid = pid
        self.isThisProcess = isThisProcess
        self.until = until
        self.remaining = remaining
    }

    /// "process 4242 (for 29.95 seconds more)", or "this process (...)".
    public var description: String {
        "\(isThisProcess ? "this process" : "process \(pid)") (for \(remaining.secondsToTheMillisecond) more)"
    }
}

extension Duration {
    /// "29.95 seconds", "600.0 seconds": to the millisecond, never negative, without the binary
    /// fraction artefacts of `description` ("599.9870000000001 seconds").
    var secondsToTheMillisecond: String {
        let (seconds, attoseconds) = components
        guard seconds >= 0 && attoseconds >= 0 else { return "0.0 seconds" }
        let milliseconds = attoseconds / 1_000_000_000_000_000
        var fraction = String(milliseconds)
        fraction = String(repeating: "0", count: 3 - fraction.count) + fraction
        while fraction.count > 1 && fraction.hasSuffix("0") { fraction.removeLast() }
        return "\(seconds).\(fraction) seconds"
    }
}
