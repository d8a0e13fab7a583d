// The store's calls, its lock, the write lock and the refresh lease. The file's format (records,
// seal/open, encode/decode: the fuzzed part) is in StoreFormat.swift, load and save in
// FileCredentialStore+LoadSave.swift, the keys in StoreKeys.swift, file operations in FileIO.swift
// and TrustedDirectory.swift.

import Crypto
import FoundationEssentials
import LoopFlow
import SessionCore

#if canImport(Glibc)
import Glibc
#endif

/// The session on disk, encrypted and authenticated (AES-GCM), replaced atomically.
///
/// - Trusted paths (`TrustedDirectory.swift`): the directory is opened
///   `O_DIRECTORY|O_NOFOLLOW` and must be the effective user's and not writable by group or
///   others; every file is opened relative to it, `O_NOFOLLOW`, and must be a regular file of
///   that user without group/other permissions and with one link. Anything else is refused
///   (unavailable, naming the path and why) and nothing is read from or written to it. A
///   directory the store creates is 0700; an existing one is never `chmod`-ed.
/// - Files 0600. A write goes over `<name>.spare` (the file before the last write) in place,
///   is fsync'd, exchanged with the store file (`renameat2(RENAME_EXCHANGE)`), and the
///   directory fsync'd: a crash at any moment leaves the old session or the new one, never a
///   mix (`FileIO.replaceThroughSpare`; where the filesystem cannot exchange, the spare just
///   written is renamed over the store file).
/// - Encrypted with a 256-bit key (`Key`): from the host (wrapping a data key of the store's
///   own), the desktop Secret Service, or a key file created (0600) beside the store on first
///   use. The header (which names the key's source and id) and the store file's name are
///   authenticated too; each record carries its account. `clear` (logout) rotates the key:
///   a copy of the file taken before no longer opens with anything left (StoreKeys.swift).
/// - Account-keyed (`FileCredentialStore+Accounts.swift`): a record per account, an active
///   pointer. A `SessionManager` keeps each account's session in its record
///   (`account(_:isActive:)`); the plain calls act on the active record (`read`), store under
///   the session's member id and make it active (`write`), or remove the active one (`clear`).
/// - A read answers present, absent, unavailable (permissions, I/O: try later) or damaged
///   (bad magic, failed authentication, unreadable content): a damaged file is moved aside
///   as `<name>.damaged-<time>` — kept byte for byte until a logout empties it (its name
///   stays: `RecordWitness`) — and reads as absent.
///
/// Calls may block (the write lock, fsync): a session makes them on its store worker, never on
/// its loop thread (`CredentialStore`). Calls are serialised by a lock. Across processes: `<store>.wlock` is held around each change
/// of the file, and `<store>.lock` holds the refresh lease (`RefreshLease.swift`).
public final class FileCredentialStore: SharedCredentialStore, @unchecked Sendable {
    /// Where the encryption key comes from. The store file's header records which source
    /// (and which key) sealed it: a store is only ever opened from that source, and one whose
    /// source cannot be reached is unavailable — never re-keyed, never overwritten.
    /// docs/storage-and-oauth.md, "Threat model of the store", says what each protects against.
    public enum Key: Sendable {
        /// The Secret Service when a session bus and the service answer, else a key file — for
        /// a new store; an existing one keeps the source its header names (a store made in the
        /// desktop session and read over ssh, without a bus, is unavailable, not replaced).
        /// `SESSIONFLOW_SECRET_SERVICE=off` in the environment: never the Secret Service.
        case automatic
        /// A key file beside the store (`<name>.key`, 0600), made with a random key on first use.
        case keyFile
        /// The desktop Secret Service (GNOME Keyring, KWallet, KeePassXC through libsecret,
        /// loaded at run time): unavailable when it cannot be reached.
        case secretService
        /// A 256-bit key the host keeps. It is a key-encryption key: the store's data keys are
        /// kept in `<name>.key` sealed with it, so that logout can rotate them (a host key
        /// itself cannot be rotated by the library). `Key.fromFile(_:)` reads one from a file.
        case provided(SymmetricKey)
    }

    public let directory: String
    public let path: String
    public let keyPath: String
    /// The files' names in the directory (every operation is relative to its descriptor).
    let name: String
    let keyName: String
    /// The store file before the last write, overwritten by the next (`FileIO.replaceThroughSpare`).
    let spareName: String
    private let lockName: String
    private let writeLockName: String
    let keySource: Key
    let lock = Lock()
    /// The cross-process refresh lease: a record in `<store>.lock` (see `LeaseRecord`).
    public let lockPath: String
    /// The cross-process write lock: `flock` on `<store>.wlock` around each change.
    public let writeLockPath: String
    /// This instance's refresh lease (guarded by `lock`).
    private var lease: LeaseFile.Hold = .none
    /// Whether this instance is inside `withWriteLock` (guarded by `lock`).
    var holdsWriteLock = false
    /// When this instance last saw each record (guarded by `lock`): a record lost with a damaged
    /// file another reader moved aside reads as damaged (`RecordWitness`).
    var witness = RecordWitness()

    private static let defaultAccount = "default"

    /// - Parameters:
    ///   - directory: created 0700 if missing (only the last component); an existing one must
    ///     be the effective user's and not writable by group or others, and is never changed.
    ///   - name: the store file's name in it (a single path component).
    ///   - key: where the key comes from (`.automatic`: the Secret Service or a key file).
    public init(directory: String, name: String = "session.sfstore", key: Key = .automatic) {
        self.directory = directory
        self.path = directory + "/" + name
        self.keyPath = directory + "/" + name + ".key"
        self.lockPath = directory + "/" + name + ".lock"
        self.writeLockPath = directory + "/" + name + ".wlock"
        self.name = name
        self.keyName = name + ".key"
        self.spareName = name + ".spare"
        self.lockName = name + ".lock"
        self.writeLockName = name + ".wlock"
        self.keySource = key
    }

    deinit {
        LeaseFile.release(lease, name: lockName, directory: directory)
    }

    /// The store's directory, opened and checked (see `TrustedDirectory`); nil when it does not
    /// exist and `create` is false.
    func openDirectory(create: Bool) throws(StoreFailure) -> TrustedDirectory? {
        guard !name.isEmpty, name != ".", name != "..", !name.contains("/") else {
            throw .unavailable("the store name \"\(name)\" is not a single file name")
        }
        switch TrustedDirectory.open(directory, create: create) {
        case .opened(let opened): return opened
        case .missing: return nil
        case .unreachable(_, let message), .refused(let message): throw .unavailable(message)
        }
    }

    /// Both lock files, checked without opening them (reads open neither; the lease and the
    /// write lock check what they open): a planted one is reported by every operation.
    func checkLockFiles(in directory: TrustedDirectory) throws(StoreFailure) {
        try directory.check(lockName)
        try directory.check(writeLockName)
    }

    // MARK: SharedCredentialStore

    /// Takes the refresh lease if no one holds it: the lock file is locked (`flock`) only to
    /// read and write its record, never across the refresh. Free means: no record (or garbage),
    /// its deadline passed, it is from an earlier boot, or its holder died. An instance that
    /// holds the lease answers busy to a second request (two sessions may share an instance).
    ///
    /// Where no lock file can exist (a read-only or vanished store) the lease is granted
    /// without any: no process can write tokens through such a store. A lock file that can
    /// only be read keeps the old way: its `flock` is held until release.
    public func tryAcquireRefreshLease(for duration: Duration) -> RefreshLeaseResult {
        lock.withLock {
            if let until = lease.until {
                let now = LeaseClock.now()
                return .busy(RefreshLeaseHolder(
                    pid: getpid(), isThisProcess: true, until: .nanoseconds(until), remaining: .nanoseconds(until - now)))
            }
            let (result, hold) = LeaseFile.acquire(lockName, directory: directory, for: duration)
            lease = hold
            return result
        }
    }

    /// Ends this instance's lease; the lock file's record is cleared only if it is still ours.
    public func releaseRefreshLease() {
        lock.withLock {
            let hold = lease
            lease = .none
            LeaseFile.release(hold, name: lockName, directory: directory)
        }
    }

    /// Runs a read-modify-write of the store file with `<store>.wlock` held exclusively, so
    /// that two processes changing the store (different accounts, a logout racing a refresh,
    /// the first key file) never lose each other's change. Such a section lasts a read, an
    /// encryption and a write; a holder that does not let go within `writeLockPatience` (a
    /// stopped process) makes the change fail as unavailable — the session retries it — rather
    /// than hold the session's store worker (never its loop: see `CredentialStore`). Where no
    /// lock file can exist the write fails anyway.
    func withWriteLock<T>(
        in directory: TrustedDirectory, _ body: () throws(StoreFailure) -> T
    ) throws(StoreFailure) -> T {
        var fd: Int32 = -1
        switch LockFile.open(writeLockName, in: directory) {
        case .open(let opened, _):
            fd = opened
            if let failure = WriteLockWait.lockExclusively(fd, patience: Self.writeLockPatience) {
                let reason = failure == EWOULDBLOCK ? "another process holds it" : String(cString: strerror(failure))
                close(fd)
                throw .unavailable("cannot lock \(writeLockPath) for a change: \(reason)")
            }
        case .impossible:
            break
        case .failed(let message):
            throw .unavailable(message)
        }
        holdsWriteLock = true
        defer {
            holdsWriteLock = false
            if fd >= 0 {
                _ = flock(fd, LOCK_UN)
                close(fd)
            }
        }
        return try body()
    }

    /// How long a change waits for another process's change (`WriteLockWait`: on the store
    /// worker, never spinning).
    private static let writeLockPatience = Duration.seconds(2)

    public func directoryToWatch() -> String? {
        // Created (0700) if missing, so that it can be watched; an existing directory that is
        // refused is not watched (and never changed): reads report why.
        lock.withLock { ((try? openDirectory(create: true)) ?? nil) != nil ? directory : nil }
    }

    // MARK: CredentialStore

    public func read() -> StoreRead {
        lock.withLock {
            do throws(StoreFailure) {
                guard let directory = try openDirectory(create: false) else { return .absent }
                guard let copies = FileIO.damagedCopies(of: name, in: directory) else { return unlisted(directory) }
                let read: StoreRead
                var account: String?
                do throws(StoreFailure) {
                    try checkLockFiles(in: directory)
                    let document = try load(in: directory)
                    guard let document, let active = document.active, let record = document.accounts[active] else {
                        return absent(.active, in: directory, document: document)
                    }
                    var session = record.session
                    session.account = active
                    account = active
                    read = .present(session)
                } catch {
                    read = error.read
                }
                witness(.active, account: account, read, copiesBefore: copies, in: directory)
                return read
            } catch {
                return error.read
            }
        }
    }

    public func write(_ session: StoredSession) throws(StoreError) {
        // Damaged → already moved aside, start afresh.
        let account = session.memberID ?? Self.defaultAccount
        try change(creating: true, account: account, witnessing: .active) { document in
            document.accounts[account] = Record(session, keepingProfileOf: document.accounts[account])
            document.active = account
            return true
        }
    }

    public func clear() throws(StoreError) {
        // A document that holds anything is written again with a new key (crypto-shredding its
        // earlier copies), whether or not an account is active.
        try change(clearing: true, witnessing: .active) { document in
            let holdsAnything = document.active != nil || !document.accounts.isEmpty
            if let active = document.active { document.accounts.removeValue(forKey: active) }
            document.active = nil
            return holdsAnything
        }
    }

    /// The accounts that have an entry (for hosts that switch between accounts).
    public func accounts() -> [String] {
        lock.withLock {
            guard let directory = (try? openDirectory(create: false)) ?? nil,
                (try? checkLockFiles(in: directory)) != nil
            else { return [] }
            return ((try? load(in: directory))?.accounts.keys).map { Array($0).sorted() } ?? []
        }
    }

    /// Makes `account`'s stored session the active one. False if it has no entry.
    @discardableResult
    public func activate(account: String) throws(StoreError) -> Bool {
        try lock.withLock { () throws(StoreError) -> Bool in
            do throws(StoreFailure) {
                guard let directory = try openDirectory(create: false) else { return false }
                return try withWriteLock(in: directory) { () throws(StoreFailure) -> Bool in
                    try checkLockFiles(in: directory)
                    guard let loaded = try loadKeepingKeys(in: directory), loaded.document.accounts[account] != nil else {
                        return false
                    }
                    var document = loaded.document
                    document.active = account
                    try save(document, in: directory, loaded: loaded.keys)
                    return true
                }
            } catch {
                throw error.storeError
            }
        }
    }
}
