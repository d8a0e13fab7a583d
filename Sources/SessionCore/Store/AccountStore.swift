/// A store that keeps several accounts' sessions, one record each, and remembers which
/// account is active (the one a session restores at its next start).
///
/// A `SessionManager` given such a store keeps a session per stored account: each refreshes
/// on its own, and only the active one drives `state`, `events` and `storeStatus`
/// (`SessionManager.accounts`, `switchAccount(to:)`, `addAccount(_:)`, `logout(account:)`).
///
/// Every record is keyed by its **account key**: the member id the session signed in with
/// (or `defaultAccount` without one). The key never changes while the session lives — a
/// refresh that reports another member id updates the same record — so a logout removes
/// every byte the session stored.
///
/// Like every store call, these run on a session's store worker, never on its loop thread.
public protocol AccountCredentialStore: CredentialStore {
    /// The accounts that have a record, and the active one.
    func readAccounts() -> AccountsRead
    /// The store of one account's record: its `read`, `write` and `clear` touch that record
    /// only (a shared store's is shared too). The active pointer is `setActiveAccount`'s,
    /// except that a clear of the active account's record clears the pointer with it, and —
    /// with `isActive` (the manager's active session) — a write makes the account active when
    /// the store has no active account (a store rebuilt after damage, or after a write that
    /// failed: the pointer comes back with the record).
    func account(_ key: String, isActive: Bool) -> any CredentialStore
    /// Makes `key` the active account (nil: none). A key without a record reads as absent.
    /// (A manager makes these calls on one worker of their own, in order.)
    func setActiveAccount(_ key: String?) throws(StoreError)
}

/// The key of the record of a session signed in without a member id.
public let defaultAccount = "default"

/// The accounts a store holds.
public struct StoredAccounts: Sendable, Equatable {
    /// The account keys with a record, sorted.
    public var keys: [String]
    /// The active account's key, if any (it may have no record).
    public var active: String?

    public init(keys: [String], active: String?) {
        self.keys = keys
        self.active = active
    }
}

/// The answers to `readAccounts`.
public enum AccountsRead: Sendable, Equatable {
    case present(StoredAccounts)
    /// Out of reach for now (or damaged: moved aside, and then reads as no accounts).
    case unavailable(StoreError)
}

/// One account of a `SessionManager` (`SessionManager.accounts`).
public struct SessionAccount: Sendable, Equatable, CustomStringConvertible {
    /// The account key (the member id it signed in with, or `defaultAccount`).
    public var key: String
    /// Who is signed in now (a refresh may have reported another member id).
    public var memberID: String?
    /// `loggedIn` or `sessionExpired` (a signed-out account is no longer listed).
    public var state: SessionState
    /// Whether it drives the manager's `state`.
    public var isActive: Bool
    /// Who minted its tokens (issuer, client, requested and granted scope), when known: a
    /// sign-in through a discovered issuer, or a record that holds one. Nil otherwise.
    public var profile: SessionProfile?

    public init(key: String, memberID: String?, state: SessionState, isActive: Bool, profile: SessionProfile? = nil) {
        self.profile = profile
        self.key = key
        self.memberID = memberID
        self.state = state
        self.isActive = isActive
    }

    public var description: String {
        "\(key)\(isActive ? " (active)" : ""): \(state)"
    }
}
