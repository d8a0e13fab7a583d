// Over 400 lines (410): the record format (sealed, account-keyed), the atomic replace and the
// write lock are still one type (the refresh lease is in RefreshLease.swift). The store issue
// moves its file work to an I/O worker and trusted directory descriptors; it splits along
// those lines then.

import Crypto
import FoundationEssentials
import LoopFlow
import SessionCore

#if canImport(Glibc)
import Glibc
#endif

/// The session on disk, encrypted and authenticated (AES-GCM), replaced atomically.
///
/// - Directory 0700, files 0600. A write goes to a new temporary file in the same
///   directory, is fsync'd, renamed over the old file, and the directory fsync'd: a crash
///   at any moment leaves the old session or the new one, never a mix.
/// - Encrypted with a 256-bit key: the host's, or a key file created (0600) beside the
///   store on first use. The file's header is authenticated too.
/// - Account-keyed: each account (member id) has its own entry; an active-account pointer
///   says whose session is current. `write` stores under the session's member id and
///   makes it active; `clear` removes the active entry.
/// - A read answers present, absent, unavailable (permissions, I/O: try later) or damaged
///   (bad magic, failed authentication, unreadable content): a damaged file is moved aside
///   as `<name>.damaged-<time>` — never deleted — and reads as absent.
///
/// Calls may block (the write lock, fsync): a session makes them on its store worker, never on
/// its loop thread (`CredentialStore`). Calls are serialised by a lock. Across processes: `<store>.wlock` is held around each change
/// of the file, and `<store>.lock` holds the refresh lease (`RefreshLease.swift`).
public final class FileCredentialStore: SharedCredentialStore, @unchecked Sendable {
    /// Where the encryption key comes from.
    public enum Key: Sendable {
        /// A key file beside the store, created 0600 with a random key on first use.
        case keyFile
        /// A 256-bit key the host keeps (in a keyring, say).
        case provided(SymmetricKey)
    }

    public let directory: String
    public let path: String
    public let keyPath: String
    private let keySource: Key
    private let lock = Lock()
    /// The cross-process refresh lease: a record in `<store>.lock` (see `LeaseRecord`).
    public let lockPath: String
    /// The cross-process write lock: `flock` on `<store>.wlock` around each change.
    public let writeLockPath: String
    /// This instance's refresh lease (guarded by `lock`).
    private var lease: LeaseFile.Hold = .none
    /// Whether this instance is inside `withWriteLock` (guarded by `lock`).
    private var holdsWriteLock = false

    private static let magic: [UInt8] = Array("SFSTORE".utf8) + [1]
    private static let defaultAccount = "default"

    /// - Parameters:
    ///   - directory: created 0700 if missing.
    ///   - name: the store file's name in it.
    public init(directory: String, name: String = "session.sfstore", key: Key = .keyFile) {
        self.directory = directory
        self.path = directory + "/" + name
        self.keyPath = directory + "/" + name + ".key"
        self.lockPath = directory + "/" + name + ".lock"
        self.writeLockPath = directory + "/" + name + ".wlock"
        self.keySource = key
    }

    deinit {
        LeaseFile.release(lease, path: lockPath)
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
            let (result, hold) = LeaseFile.acquire(lockPath, directory: directory, for: duration)
            lease = hold
            return result
        }
    }

    /// Ends this instance's lease; the lock file's record is cleared only if it is still ours.
    public func releaseRefreshLease() {
        lock.withLock {
            let hold = lease
            lease = .none
            LeaseFile.release(hold, path: lockPath)
        }
    }

    /// Runs a read-modify-write of the store file with `<store>.wlock` held exclusively, so
    /// that two processes changing the store (different accounts, a logout racing a refresh,
    /// the first key file) never lose each other's change. Such a section lasts a read, an
    /// encryption and a write; a holder that does not let go within `writeLockPatience` (a
    /// stopped process) makes the change fail as unavailable — the session retries it — rather
    /// than hold the session's store worker (never its loop: see `CredentialStore`). Where no lock file can exist the write fails anyway.
    private func withWriteLock<T>(_ body: () throws(StoreFailure) -> T) throws(StoreFailure) -> T {
        var fd: Int32 = -1
        switch LockFile.open(writeLockPath, directory: directory) {
        case .open(let opened, _):
            fd = opened
            if let failure = WriteLockWait.lockExclusively(fd, patience: Self.writeLockPatience) {
                let reason = failure == EWOULDBLOCK ? "another process holds it" : String(cString: strerror(failure))
                close(fd)
                throw .unavailable("cannot lock \(writeLockPath) for a change: \(reason)")
            }
        case .impossible:
            break
        case .failed:
            throw .unavailable("cannot open \(writeLockPath): \(FileIO.errnoText())")
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
        lock.withLock { (try? FileIO.makeDirectory(directory)) != nil ? directory : nil }
    }

    // MARK: CredentialStore

    public func read() -> StoreRead {
        lock.withLock {
            do throws(StoreFailure) {
                guard let document = try load() else { return .absent }
                guard let active = document.active, let record = document.accounts[active] else { return .absent }
                return .present(record.session)
            } catch {
                return error.read
            }
        }
    }

    public func write(_ session: StoredSession) throws(StoreError) {
        try lock.withLock { () throws(StoreError) in
            do throws(StoreFailure) {
                // Out of reach → fail (never overwrite other accounts blindly); damaged →
                // already moved aside, start afresh.
                try withWriteLock { () throws(StoreFailure) in
                    FileIO.removeOrphanedTemporaries(of: [path, keyPath], in: directory)
                    var document = try loadForChange() ?? Document()
                    let account = session.memberID ?? Self.defaultAccount
                    document.accounts[account] = Record(session)
                    document.active = account
                    try save(document)
                }
            } catch {
                throw error.storeError
            }
        }
    }

    public func clear() throws(StoreError) {
        try lock.withLock { () throws(StoreError) in
            do throws(StoreFailure) {
                try withWriteLock { () throws(StoreFailure) in
                    guard var document = try loadForChange() else { return }
                    if let active = document.active {
                        document.accounts.removeValue(forKey: active)
                    }
                    document.active = nil
                    try save(document)
                }
            } catch {
                throw error.storeError
            }
        }
    }

    /// The accounts that have an entry (for hosts that switch between accounts).
    public func accounts() -> [String] {
        lock.withLock { ((try? load())?.accounts.keys).map { Array($0).sorted() } ?? [] }
    }

    /// Makes `account`'s stored session the active one. False if it has no entry.
    @discardableResult
    public func activate(account: String) throws(StoreError) -> Bool {
        try lock.withLock { () throws(StoreError) -> Bool in
            do throws(StoreFailure) {
                return try withWriteLock { () throws(StoreFailure) -> Bool in
                    guard var document = try load(), document.accounts[account] != nil else { return false }
                    document.active = account
                    try save(document)
                    return true
                }
            } catch {
                throw error.storeError
            }
        }
    }

    // MARK: Format

    /// What the file holds, once decrypted.
    @_spi(Fuzzing) public struct Document: Codable {
        public var version = 1
        public var active: String?
        public var accounts: [String: Record] = [:]

        public init() {}
    }

    @_spi(Fuzzing) public struct Record: Codable {
        var accessToken: String?
        var refreshToken: String?
        var expiresAtNanoseconds: Int64?
        var memberID: String?
        var externalUserID: String?
        var expired: Bool

        init(_ session: StoredSession) {
            accessToken = session.accessToken?.reveal()
            refreshToken = session.refreshToken?.reveal()
            expiresAtNanoseconds = session.accessTokenExpiresAt.map { duration in
                let (seconds, attoseconds) = duration.components
                return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
            }
            memberID = session.memberID
            externalUserID = session.externalUserID
            expired = session.expired
        }

        public var session: StoredSession {
            StoredSession(
                accessToken: accessToken.map(Secret.init), refreshToken: refreshToken.map(Secret.init),
                accessTokenExpiresAt: expiresAtNanoseconds.map { .nanoseconds($0) },
                memberID: memberID, externalUserID: externalUserID, expired: expired)
        }
    }

    /// Why a load or save failed, and how a read reports it.
    enum StoreFailure: Error {
        case unavailable(String)
        case damaged(String)

        var read: StoreRead {
            switch self {
            case .unavailable(let message): .unavailable(StoreError(message))
            case .damaged(let message): .damaged(StoreError(message))
            }
        }

        var storeError: StoreError {
            switch self {
            case .unavailable(let message), .damaged(let message): StoreError(message)
            }
        }
    }

    // MARK: Load and save (caller holds the lock)

    /// The document, nil when there is no file. A damaged file is moved aside first.
    private func load() throws(StoreFailure) -> Document? {
        let bytes: [UInt8]
        switch FileIO.readAll(path) {
        case .missing: return nil
        case .failed(let reason): throw .unavailable("cannot read \(path): \(reason)")
        case .read(let content): bytes = content
        }
        let key = try encryptionKey(creating: false)
        do {
            return try Self.decode(bytes, key: key)
        } catch {
            let aside = moveAside(bytes)
            throw .damaged("the store file was damaged or tampered with (\(describe(error))); moved aside to \(aside)")
        }
    }

    /// The document in a store file's bytes: header, then AES-GCM (authenticating the
    /// header), then JSON. Throws for anything else. Pure (SPI Fuzzing: the fuzz target in Tools/ calls it).
    @_spi(Fuzzing) public static func decode(_ bytes: [UInt8], key: SymmetricKey?) throws -> Document {
        guard bytes.count > magic.count, Array(bytes.prefix(magic.count)) == magic else {
            throw DecodeFailure("not a SessionFlow store (bad header)")
        }
        guard let key else { throw DecodeFailure("its key file is missing") }
        let box = try AES.GCM.SealedBox(combined: bytes.dropFirst(magic.count))
        let plaintext = try AES.GCM.open(box, using: key, authenticating: magic)
        return try JSONDecoder().decode(Document.self, from: Data(plaintext))
    }

    /// A store file's bytes for `document` (the inverse of `decode`).
    @_spi(Fuzzing) public static func encode(_ document: Document, key: SymmetricKey) throws -> [UInt8] {
        try seal(JSONEncoder().encode(document), key: key)
    }

    /// A store file's bytes around any plaintext: header, then AES-GCM (authenticating the
    /// header). `encode` seals a document's JSON; the fuzz target seals arbitrary bytes so
    /// that `decode`'s JSON decoding is reached behind valid authentication.
    @_spi(Fuzzing) public static func seal(_ plaintext: some DataProtocol, key: SymmetricKey) throws -> [UInt8] {
        let box = try AES.GCM.seal(plaintext, using: key, authenticating: magic)
        guard let combined = box.combined else { throw DecodeFailure("no combined form") }
        return magic + Array(combined)
    }

    /// Like `load`, but a damaged file counts as nothing to change.
    private func loadForChange() throws(StoreFailure) -> Document? {
        do {
            return try load()
        } catch .damaged {
            return nil
        }
    }

    private func save(_ document: Document) throws(StoreFailure) {
        try FileIO.makeDirectory(directory)
        guard let key = try encryptionKey(creating: true) else {
            throw .unavailable("no encryption key")
        }
        let sealed: [UInt8]
        do {
            sealed = try Self.encode(document, key: key)
        } catch {
            throw .unavailable("cannot encode or encrypt the session: \(describe(error))")
        }
        try FileIO.replaceAtomically(path, with: sealed, directory: directory)
    }

    private func encryptionKey(creating: Bool) throws(StoreFailure) -> SymmetricKey? {
        if case .provided(let key) = keySource { return key }
        switch FileIO.readAll(keyPath) {
        case .read(let bytes):
            guard bytes.count == 32 else {
                throw .unavailable("the key file \(keyPath) is not a 256-bit key")
            }
            return SymmetricKey(data: bytes)
        case .failed(let reason):
            throw .unavailable("cannot read the key file \(keyPath): \(reason)")
        case .missing:
            guard creating else { return nil }
            try FileIO.makeDirectory(directory)
            let key = SymmetricKey(size: .bits256)
            let bytes = key.withUnsafeBytes { Array($0) }
            // Created, never replaced: a key another writer made first wins, and is used.
            if try FileIO.createExclusively(keyPath, with: bytes, directory: directory) {
                return key
            }
            return try encryptionKey(creating: false)
        }
    }

    /// Renames the store file aside; returns the new name.
    /// Renames the damaged store file (whose bytes were `damaged`) aside; returns the new
    /// name, or why it was not moved. Under the write lock, and only if the file still holds
    /// those bytes: another process may have replaced it with a good one meanwhile.
    private func moveAside(_ damaged: [UInt8]) -> String {
        func renameAside() -> String {
            var now = timespec()
            clock_gettime(CLOCK_REALTIME, &now)
            let aside = "\(path).damaged-\(now.tv_sec)-\(now.tv_nsec)"
            if rename(path, aside) != 0 {
                return "(could not move it: \(String(cString: strerror(errno))))"
            }
            return aside
        }
        if holdsWriteLock { return renameAside() }
        do {
            return try withWriteLock { () throws(StoreFailure) -> String in
                guard case .read(let now) = FileIO.readAll(path), now == damaged else {
                    return "(not moved: another process replaced the file meanwhile)"
                }
                return renameAside()
            }
        } catch {
            return "(not moved: \(error.storeError.message))"
        }
    }
}

private struct DecodeFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// Error text without any content of the file.
private func describe(_ error: any Error) -> String {
    switch error {
    case let failure as DecodeFailure: failure.description
    case is CryptoKitError: "authentication failed"
    case is DecodingError: "unreadable content"
    default: "\(type(of: error))"
    }
}
