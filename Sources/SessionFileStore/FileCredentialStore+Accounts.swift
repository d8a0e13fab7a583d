import LoopFlow
import SessionCore

/// Several accounts in one store file: a record per account key, and the active one.
///
/// `account(_:isActive:)` is the store a session keeps its record in: its reads, writes
/// and clears touch that record only, under the cross-process write lock, so accounts never
/// overwrite each other — in one process or several. Refreshes of every account of a store
/// take the same refresh lease (`<store>.lock`): they run one at a time across processes,
/// which costs an account a wait of one refresh at most.
///
/// A record's clear (a logout) removes the record, and the active pointer if it named that
/// account; it empties the copies of damaged store files (`*.damaged-*`, names kept: see
/// `RecordWitness`) and removes orphaned temporary files. Nothing of a session stays in the
/// store file after its logout: the file is rewritten without it (atomic replace).
extension FileCredentialStore: AccountCredentialStore {
    public func readAccounts() -> AccountsRead {
        lock.withLock {
            do throws(StoreFailure) {
                guard let directory = try openDirectory(create: false) else {
                    return .present(StoredAccounts(keys: [], active: nil))
                }
                try checkLockFiles(in: directory)
                // Damage is left for the active session's read to find (and report, and write
                // the session back over): the list has nothing to do about it.
                let document = try load(in: directory, movingDamageAside: false) ?? Document()
                return .present(StoredAccounts(keys: document.accounts.keys.sorted(), active: document.active))
            } catch {
                switch error {
                case .unavailable(let message), .damaged(let message): return .unavailable(StoreError(message))
                }
            }
        }
    }

    public func account(_ key: String, isActive: Bool) -> any CredentialStore {
        AccountRecord(store: self, key: key, isActive: isActive)
    }

    public func setActiveAccount(_ key: String?) throws(StoreError) {
        try change(creating: key != nil) { document in
            guard document.active != key else { return false }
            document.active = key
            return true
        }
    }

    // MARK: - One record

    /// Reads the record of `key` (absent if it has none).
    func read(account key: String) -> StoreRead {
        lock.withLock {
            do throws(StoreFailure) {
                guard let directory = try openDirectory(create: false) else { return .absent }
                guard let copies = FileIO.damagedCopies(of: name, in: directory) else { return unlisted(directory) }
                let read: StoreRead
                do throws(StoreFailure) {
                    try checkLockFiles(in: directory)
                    let document = try load(in: directory)
                    guard let record = document?.accounts[key] else {
                        return absent(.account(key), in: directory, document: document)
                    }
                    var session = record.session
                    session.account = key
                    read = .present(session)
                } catch {
                    read = error.read
                }
                witness(.account(key), account: key, read, copiesBefore: copies, in: directory)
                return read
            } catch {
                return error.read
            }
        }
    }

    /// Writes the record of `key`; with `claimingActive`, it becomes the active one if the
    /// store has none (otherwise the active pointer is left as it is).
    func write(_ session: StoredSession, account key: String, claimingActive: Bool) throws(StoreError) {
        try change(creating: true, account: key, witnessing: .account(key)) { document in
            document.accounts[key] = Record(session, keepingProfileOf: document.accounts[key])
            if claimingActive && document.active == nil { document.active = key }
            return true
        }
    }

    /// Sets the profile of `key`'s record (`SessionProfile`: issuer, client, scope), sealed with
    /// its tokens; the tokens are left as they are. False when `key` has no record.
    @discardableResult
    public func setProfile(_ profile: SessionProfile, account key: String) throws(StoreError) -> Bool {
        var found = false
        try change { document in
            guard document.accounts[key] != nil else { return false }
            found = true
            guard document.accounts[key]?.profile != profile else { return false }
            document.accounts[key]?.profile = profile
            return true
        }
        return found
    }

    /// Removes the record of `key`, and the active pointer if it named it; the key is rotated
    /// (`saveRotatingKey`), so no copy of the file taken before opens any more — also when the
    /// file was damaged (moved aside, that copy is shredded too).
    func clear(account key: String) throws(StoreError) {
        try change(clearing: true, account: key, witnessing: .account(key)) { document in
            let removed = document.accounts.removeValue(forKey: key) != nil
            let wasActive = document.active == key
            if wasActive { document.active = nil }
            return removed || wasActive
        }
    }

    /// A read-modify-write of the document under the write lock; `body` says whether it
    /// changed anything (nothing is written otherwise). A store that does not exist yet is
    /// created only with `creating`.
    ///
    /// `account`: the account whose record the change writes, or clears (for the plain
    /// `clear`, nil: the active one, or the one this instance last saw active if the file was
    /// damaged). `witnessing`: the record the instance then knows as seen (written) or forgets
    /// (cleared; the active record too, if it was that account's).
    ///
    /// `clearing` (a record's clear, a logout): written with a new key, also when only a damaged
    /// file was found, and orphaned temporary files of the store and its key ring (an old ring)
    /// are removed. With copies of damaged files beside the store, the account goes into the
    /// document's `cleared` (its absence is a logout, not damage: `RecordWitness`), and the
    /// copies are emptied first (what they hold may be sealed with a key no rotation reaches:
    /// a version-1 file of a host's key, a key the ring lost). Their names stay for good: a
    /// document written after the damage cannot tell whose records were lost with it. A write
    /// takes its account out of `cleared`.
    func change(
        creating: Bool = false, clearing: Bool = false, account: String? = nil,
        witnessing record: RecordWitness.Record? = nil, _ body: (inout Document) -> Bool
    ) throws(StoreError) {
        try lock.withLock { () throws(StoreError) in
            do throws(StoreFailure) {
                guard let directory = try openDirectory(create: creating) else {
                    if creating { throw .unavailable("cannot create \(self.directory)") }
                    if clearing, let record { witness.forget(record) }
                    return
                }
                // The copies beside the store once the record is written, listed under the write
                // lock (a copy made after it is new to this instance's sighting).
                var copiesAfter: Set<String>?
                var named: String?
                try withWriteLock(in: directory) { () throws(StoreFailure) in
                    defer { if !clearing && record != nil { copiesAfter = FileIO.damagedCopies(of: name, in: directory) } }
                    try checkLockFiles(in: directory)
                    FileIO.removeOrphanedTemporaries(of: [name, keyName], in: directory)
                    var document = Document()
                    var loaded: LoadedKeys?
                    var damaged = false
                    do throws(StoreFailure) {
                        let file = try loadKeepingKeys(in: directory)
                        document = file?.document ?? Document()
                        loaded = file?.keys
                    } catch {
                        guard case .damaged = error else { throw error }
                        damaged = true  // moved aside: start afresh
                    }
                    named = account ?? (record == .active ? document.active ?? witness.sighting(.active)?.account : nil)
                    var changed = body(&document)
                    if clearing {
                        guard let copies = FileIO.damagedCopies(of: name, in: directory) else {
                            throw .unavailable("cannot list \(self.directory) for copies of a damaged store file")
                        }
                        if !copies.isEmpty {
                            FileIO.emptyDamagedCopies(copies, of: name, in: directory)
                            if let named, document.cleared.insert(named).inserted { changed = true }
                        }
                    } else if let named, document.cleared.remove(named) != nil {
                        changed = true
                    }
                    guard changed || (clearing && damaged) else { return }
                    if clearing {
                        try saveRotatingKey(document, in: directory, loaded: loaded)
                    } else {
                        try save(document, in: directory, loaded: loaded)
                    }
                }
                if let record {
                    if clearing {
                        // Whichever way this instance saw the account: as its record, or as
                        // the active one.
                        witness.forget(record)
                        if let named {
                            witness.forget(.account(named))
                            if witness.sighting(.active)?.account == named { witness.forget(.active) }
                        }
                    } else if let account, let copiesAfter {
                        witness.saw(record, account: account, copies: copiesAfter)
                    }
                }
            } catch {
                throw error.storeError
            }
        }
    }
}

/// The store of one account's record in a `FileCredentialStore` (see its accounts).
public final class AccountRecord: SharedCredentialStore, Sendable {
    public let store: FileCredentialStore
    public let key: String
    /// Its writes make it the active account when the store has none.
    public let isActive: Bool

    init(store: FileCredentialStore, key: String, isActive: Bool) {
        self.store = store
        self.key = key
        self.isActive = isActive
    }

    public func read() -> StoreRead {
        store.read(account: key)
    }

    public func write(_ session: StoredSession) throws(StoreError) {
        try store.write(session, account: key, claimingActive: isActive)
    }

    public func clear() throws(StoreError) {
        try store.clear(account: key)
    }

    public func tryAcquireRefreshLease(for duration: Duration) -> RefreshLeaseResult {
        store.tryAcquireRefreshLease(for: duration)
    }

    public func releaseRefreshLease() {
        store.releaseRefreshLease()
    }

    public func directoryToWatch() -> String? {
        store.directoryToWatch()
    }
}
