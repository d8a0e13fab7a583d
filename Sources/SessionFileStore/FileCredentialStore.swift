// Over 400 lines (565): the record format (sealed, account-keyed), the atomic replace and the
// write lock are still one type (the refresh lease is in RefreshLease.swift, the trusted
// directory and its file operations in FileIO.swift, the keys and the header in StoreKeys.swift). The store issue moves its file work to
// an I/O worker; it splits along those lines then.

import Crypto
import FoundationEssentials
import LoopFlow
import SessionCore

#if canImport(Glibc)
import Glibc
#endif

/// The session on disk, encrypted and authenticated (AES-GCM), replaced atomically.
///
/// - Trusted paths (`TrustedDirectory` in FileIO.swift): the directory is opened
///   `O_DIRECTORY|O_NOFOLLOW` and must be the effective user's and not writable by group or
///   others; every file is opened relative to it, `O_NOFOLLOW`, and must be a regular file of
///   that user without group/other permissions and with one link. Anything else is refused
///   (unavailable, naming the path and why) and nothing is read from or written to it. A
///   directory the store creates is 0700; an existing one is never `chmod`-ed.
/// - Files 0600. A write goes to a new temporary file in the same
///   directory, is fsync'd, renamed over the old file, and the directory fsync'd: a crash
///   at any moment leaves the old session or the new one, never a mix.
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
///   as `<name>.damaged-<time>` — kept until the last account signs out — and reads as absent.
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
    private var holdsWriteLock = false

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
                try checkLockFiles(in: directory)
                guard let document = try load(in: directory) else { return .absent }
                guard let active = document.active, let record = document.accounts[active] else { return .absent }
                var session = record.session
                session.account = active
                return .present(session)
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
                guard let directory = try openDirectory(create: true) else {
                    throw .unavailable("cannot create \(self.directory)")
                }
                try withWriteLock(in: directory) { () throws(StoreFailure) in
                    try checkLockFiles(in: directory)
                    FileIO.removeOrphanedTemporaries(of: [name, keyName], in: directory)
                    var document = try loadForChange(in: directory) ?? Document()
                    let account = session.memberID ?? Self.defaultAccount
                    document.accounts[account] = Record(session)
                    document.active = account
                    try save(document, in: directory)
                }
            } catch {
                throw error.storeError
            }
        }
    }

    public func clear() throws(StoreError) {
        try lock.withLock { () throws(StoreError) in
            do throws(StoreFailure) {
                guard let directory = try openDirectory(create: false) else { return }
                try withWriteLock(in: directory) { () throws(StoreFailure) in
                    try checkLockFiles(in: directory)
                    guard var document = try loadForChange(in: directory) else { return }
                    if let active = document.active {
                        document.accounts.removeValue(forKey: active)
                    }
                    document.active = nil
                    try saveRotatingKey(document, in: directory)
                }
            } catch {
                throw error.storeError
            }
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
                    guard var document = try load(in: directory), document.accounts[account] != nil else { return false }
                    document.active = account
                    try save(document, in: directory)
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
        public var version = 2
        public var active: String?
        public var accounts: [String: Record] = [:]

        public init() {}

        static let secretsKey = CodingUserInfoKey(rawValue: "sessionflow.secrets")!
        static let placeholdersKey = CodingUserInfoKey(rawValue: "sessionflow.placeholders")!
        /// The members that hold tokens.
        static let secretMembers: Set<String> = ["accessToken", "refreshToken"]

        /// The document's JSON, in memory a secret owns: the tokens never pass through a
        /// `String` (encoded as placeholders, then spliced in).
        func plaintext() throws -> Secret {
            let placeholders = SecretJSON.Placeholders()
            let encoder = JSONEncoder()
            encoder.userInfo[Self.placeholdersKey] = placeholders
            return SecretJSON.splice(Array(try encoder.encode(self)), placeholders)
        }

        /// The document in `plaintext` (which the caller zeroes), its tokens read into secrets.
        static func decode(plaintext: UnsafeRawBufferPointer) throws -> Document {
            guard let redacted = SecretJSON.redact(plaintext, keys: secretMembers) else {
                throw DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: "The given data was not valid JSON."))
            }
            let decoder = JSONDecoder()
            decoder.userInfo[secretsKey] = redacted
            return try decoder.decode(Document.self, from: Data(redacted.json))
        }
    }

    @_spi(Fuzzing) public struct Record: Codable {
        /// The account this record is filed under (set when sealed, checked when opened: a
        /// record found under another account is damaged). Nil only in version-1 files.
        var account: String?
        /// The tokens: never `String`s. Encoded as placeholders that `SecretJSON.splice` fills
        /// in, decoded from the placeholders `SecretJSON.redact` left (see `plaintext(of:)`).
        var accessToken: Secret?
        var refreshToken: Secret?
        var expiresAtNanoseconds: Int64?
        var memberID: String?
        var externalUserID: String?
        var expired: Bool

        init(_ session: StoredSession) {
            accessToken = session.accessToken
            refreshToken = session.refreshToken
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
                accessToken: accessToken, refreshToken: refreshToken,
                accessTokenExpiresAt: expiresAtNanoseconds.map { .nanoseconds($0) },
                memberID: memberID, externalUserID: externalUserID, expired: expired)
        }

        private enum CodingKeys: String, CodingKey {
            case account, accessToken, refreshToken, expiresAtNanoseconds, memberID, externalUserID, expired
        }

        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            let secrets = decoder.userInfo[Document.secretsKey] as? SecretJSON.Redacted
            func secret(_ key: CodingKeys) throws -> Secret? {
                guard let text = try container.decodeIfPresent(String.self, forKey: key) else { return nil }
                return secrets?.secret(for: text) ?? Secret(text)
            }
            account = try container.decodeIfPresent(String.self, forKey: .account)
            accessToken = try secret(.accessToken)
            refreshToken = try secret(.refreshToken)
            expiresAtNanoseconds = try container.decodeIfPresent(Int64.self, forKey: .expiresAtNanoseconds)
            memberID = try container.decodeIfPresent(String.self, forKey: .memberID)
            externalUserID = try container.decodeIfPresent(String.self, forKey: .externalUserID)
            expired = try container.decode(Bool.self, forKey: .expired)
        }

        public func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            let placeholders = encoder.userInfo[Document.placeholdersKey] as? SecretJSON.Placeholders
            func put(_ secret: Secret?, _ key: CodingKeys) throws {
                guard let secret else { return }
                // Without placeholders (only a test or a fuzzer encodes so) the text itself.
                try container.encode(placeholders?.placeholder(for: secret) ?? secret.reveal(), forKey: key)
            }
            try container.encodeIfPresent(account, forKey: .account)
            try put(accessToken, .accessToken)
            try put(refreshToken, .refreshToken)
            try container.encodeIfPresent(expiresAtNanoseconds, forKey: .expiresAtNanoseconds)
            try container.encodeIfPresent(memberID, forKey: .memberID)
            try container.encodeIfPresent(externalUserID, forKey: .externalUserID)
            try container.encode(expired, forKey: .expired)
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
    ///
    /// The header says which source's key sealed the file (`keyHome`): a source that cannot be
    /// reached, or another than configured, is unavailable. A key id the ring lacks is damage —
    /// unless the file changed meanwhile (another process rotated the key between our read of
    /// the file and of the ring): then it is read again.
    func load(in directory: TrustedDirectory) throws(StoreFailure) -> Document? {
        var attempts = 0
        while true {
            let bytes: [UInt8]
            switch FileIO.readAll(name, in: directory) {
            case .missing: return nil
            case .failed(let message): throw .unavailable(message)
            case .read(let content): bytes = content
            }
            var keys: [SymmetricKey] = []
            if let header = StoreHeader(bytes) {
                let home = try keyHome(for: header, in: directory)
                keys = try loadRing(home, in: directory)
                // The Secret Service answers "no such item" for a locked keyring too (it cannot
                // prompt): never take that for a lost key, which would move the store aside.
                if keys.isEmpty, case .secretService = home {
                    throw .unavailable(
                        "the key of \(path) is not in the Secret Service: its keyring is locked, or the item was "
                            + "removed (then the store cannot be opened any more: move it away to start afresh)")
                }
                // A version-1 file of a host's key was sealed with that key itself.
                if header.version == 1, case .wrapped(let kek) = home { keys.append(kek) }
            }
            do {
                return try Self.decode(bytes, name: name, keys: keys)
            } catch let failure as StoreDecodeFailure where failure.kind == .unknownKey && attempts < 3 {
                attempts += 1
                if case .read(let now) = FileIO.readAll(name, in: directory), now != bytes { continue }
                let aside = moveAside(bytes, in: directory)
                throw .damaged("the store file was damaged or tampered with (\(describe(failure))); moved aside to \(aside)")
            } catch {
                let aside = moveAside(bytes, in: directory)
                throw .damaged("the store file was damaged or tampered with (\(describe(error))); moved aside to \(aside)")
            }
        }
    }

    /// The document in a store file's bytes: header, then AES-GCM (authenticating the header
    /// and, from version 2, the store file's name `name`), then JSON; in version 2 every
    /// record must be filed under its own account. `keys`: the store's key ring (version 2
    /// picks the one whose id the header names; version 1 tries each). Throws for anything
    /// else. Pure (SPI Fuzzing: the fuzz target in Tools/ calls it).
    @_spi(Fuzzing) public static func decode(_ bytes: [UInt8], name: String, keys: [SymmetricKey]) throws -> Document {
        guard let header = StoreHeader(bytes), bytes.count > header.count else {
            throw StoreDecodeFailure(.header, "not a SessionFlow store (bad header)")
        }
        guard !keys.isEmpty else {
            throw StoreDecodeFailure(.missingKey, header.source == .secretService ? "its key is missing" : "its key file is missing")
        }
        let box = try AES.GCM.SealedBox(combined: bytes.dropFirst(header.count))
        var plaintext: Data
        if header.version == 1 {
            var opened: Data?
            for key in keys where opened == nil {
                opened = try? withCipherStateScrubbed { try AES.GCM.open(box, using: key, authenticating: header.bytes) }
            }
            guard let opened else { throw StoreDecodeFailure(.authentication, "authentication failed") }
            plaintext = opened
        } else {
            guard let key = keys.first(where: { StoreKeyID.of($0) == header.keyID }) else {
                throw StoreDecodeFailure(.unknownKey, "its key (id \(StoreKeyID.hex(header.keyID))) is not among the store's keys")
            }
            plaintext = try withCipherStateScrubbed {
                try AES.GCM.open(box, using: key, authenticating: header.authenticatedData(name: name))
            }
        }
        defer { plaintext.withUnsafeMutableBytes { zeroSecretMemory($0) } }
        let document = try plaintext.withUnsafeBytes { bytes in try Document.decode(plaintext: bytes) }
        if header.version >= 2 {
            for (account, record) in document.accounts where record.account != account {
                throw StoreDecodeFailure(.binding, "a record is filed under another account than its own")
            }
        }
        return document
    }

    /// `decode` with a single key, for a store file named `session.sfstore`.
    @_spi(Fuzzing) public static func decode(_ bytes: [UInt8], key: SymmetricKey?) throws -> Document {
        try decode(bytes, name: "session.sfstore", keys: key.map { [$0] } ?? [])
    }

    /// A store file's bytes for `document` (the inverse of `decode`): version 2, sealed with
    /// `key` of `source`, each record stamped with the account it is filed under.
    @_spi(Fuzzing) public static func encode(
        _ document: Document, key: SymmetricKey, name: String = "session.sfstore", source: KeySourceTag = .keyFile
    ) throws -> [UInt8] {
        var document = document
        document.version = max(document.version, 2)
        for account in document.accounts.keys { document.accounts[account]?.account = account }
        return try document.plaintext().withUnsafeBytes { plaintext in
            try seal(plaintext, key: key, name: name, source: source)
        }
    }

    /// A store file's bytes around any plaintext: header (version 2: source, key id), then
    /// AES-GCM (authenticating the header and `name`). `encode` seals a document's JSON; the
    /// fuzz target seals arbitrary bytes so that `decode`'s JSON decoding is reached behind
    /// valid authentication.
    @_spi(Fuzzing) public static func seal(
        _ plaintext: some DataProtocol, key: SymmetricKey, name: String = "session.sfstore", source: KeySourceTag = .keyFile
    ) throws -> [UInt8] {
        let header = StoreHeader(source: source, keyID: StoreKeyID.of(key))
        let box = try withCipherStateScrubbed {
            try AES.GCM.seal(plaintext, using: key, authenticating: header.authenticatedData(name: name))
        }
        guard let combined = box.combined else { throw StoreDecodeFailure(.header, "no combined form") }
        return header.bytes + Array(combined)
    }

    /// Like `load`, but a damaged file counts as nothing to change.
    func loadForChange(in directory: TrustedDirectory) throws(StoreFailure) -> Document? {
        do {
            return try load(in: directory)
        } catch .damaged {
            return nil
        }
    }

    /// Seals `document` with the newest key of the store's ring (made if there is none) and
    /// replaces the file. Older keys still in the ring are left from a rotation that was cut
    /// short (`saveRotatingKey`): the file no longer needs them, so they are dropped now.
    func save(_ document: Document, in directory: TrustedDirectory) throws(StoreFailure) {
        let home = try keyHome(for: currentHeader(in: directory), in: directory)
        let keys = try ringCreatingKey(home, in: directory)
        try seal(document, with: keys[0], home, in: directory)
        if keys.count > 1 { try storeRing([keys[0]], home, create: false, in: directory) }
    }

    /// `save` with a new key (logout): crypto-shredding every earlier copy of the file. In
    /// three steps, each durable before the next, so that a crash anywhere leaves a store that
    /// opens (the old document or the new one, never neither):
    ///   1. the ring becomes {new, old…} — the file still opens with an old key;
    ///   2. the file is sealed with the new key and replaced — it opens with the new key;
    ///   3. the ring becomes {new} — the old keys are gone, and with them every copy of the
    ///      file sealed before (a backup, a file moved aside, a snapshot).
    /// Cut short after 1 or 2, the next change of the store finishes it (`save`).
    func saveRotatingKey(_ document: Document, in directory: TrustedDirectory) throws(StoreFailure) {
        let home = try keyHome(for: currentHeader(in: directory), in: directory)
        let old = try loadRing(home, in: directory)
        let fresh = SymmetricKey(size: .bits256)
        try storeRing([fresh] + old, home, create: false, in: directory)
        try seal(document, with: fresh, home, in: directory)
        try storeRing([fresh], home, create: false, in: directory)
    }

    private func seal(_ document: Document, with key: SymmetricKey, _ home: KeyHome, in directory: TrustedDirectory) throws(StoreFailure) {
        let sealed: [UInt8]
        do {
            sealed = try Self.encode(document, key: key, name: name, source: home.tag)
        } catch {
            throw .unavailable("cannot encode or encrypt the session: \(describe(error))")
        }
        try FileIO.replaceAtomically(name, with: sealed, in: directory)
    }

    /// Renames the damaged store file (whose bytes were `damaged`) aside; returns the new
    /// name, or why it was not moved. Under the write lock, and only if the file still holds
    /// those bytes: another process may have replaced it with a good one meanwhile.
    private func moveAside(_ damaged: [UInt8], in directory: TrustedDirectory) -> String {
        func renameAside() -> String {
            var now = timespec()
            clock_gettime(CLOCK_REALTIME, &now)
            let aside = "\(name).damaged-\(now.tv_sec)-\(now.tv_nsec)"
            if !FileIO.rename(name, to: aside, in: directory) {
                return "(could not move it: \(String(cString: strerror(errno))))"
            }
            return directory.display(aside)
        }
        if holdsWriteLock { return renameAside() }
        do {
            return try withWriteLock(in: directory) { () throws(StoreFailure) -> String in
                guard case .read(let now) = FileIO.readAll(name, in: directory), now == damaged else {
                    return "(not moved: another process replaced the file meanwhile)"
                }
                return renameAside()
            }
        } catch {
            return "(not moved: \(error.storeError.message))"
        }
    }
}

/// Why `decode` refused a file (the text names no content of it).
@_spi(Fuzzing) public struct StoreDecodeFailure: Error, CustomStringConvertible {
    public enum Kind: Sendable {
        /// Not a store file (magic, version, source, length).
        case header
        /// There is no key at all.
        case missingKey
        /// The header names a key the ring lacks.
        case unknownKey
        /// No key of the ring opens it (version 1).
        case authentication
        /// A record is filed under another account than the one it carries.
        case binding
    }

    public let kind: Kind
    public let description: String
    init(_ kind: Kind, _ description: String) {
        self.kind = kind
        self.description = description
    }
}

/// Error text without any content of the file.
private func describe(_ error: any Error) -> String {
    switch error {
    case let failure as StoreDecodeFailure: failure.description
    case is CryptoKitError: "authentication failed"
    case is DecodingError: "unreadable content"
    default: "\(type(of: error))"
    }
}
