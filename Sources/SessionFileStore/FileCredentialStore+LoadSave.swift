import Crypto
import FoundationEssentials
import SessionCore

#if canImport(Glibc)
import Glibc
#endif

/// Load and save: the document read from and written to the store file (the caller holds the
/// lock). The format itself is in StoreFormat.swift, the keys in StoreKeys.swift.
extension FileCredentialStore {
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

    /// Where the key ring of a loaded file is, and the ring as read: under the write lock no
    /// one else changes either, so a change hands them from its load to its `save` and reads
    /// the file and the ring once.
    struct LoadedKeys {
        let home: KeyHome
        let ring: [SymmetricKey]
        /// The ids of `ring`'s keys that the load computed (nil where it did not), so that the
        /// save does not hash its key again: each id is a SHA-256 and a cipher-state scrub.
        var ids: [[UInt8]?] = []

        /// The id of `ring[index]`, computed only if the load did not.
        func id(at index: Int) -> [UInt8] {
            guard index < ids.count, let id = ids[index] else { return StoreKeyID.of(ring[index]) }
            assert(id == StoreKeyID.of(ring[index]), "a key id carried from the load is not its key's")
            return id
        }
    }

    /// The document, nil when there is no file. A damaged file is moved aside first.
    func load(in directory: TrustedDirectory, movingDamageAside: Bool = true) throws(StoreFailure) -> Document? {
        try loadKeepingKeys(in: directory, movingDamageAside: movingDamageAside)?.document
    }

    /// `load`, and the keys it used (nil when the file had no header to say where they are).
    ///
    /// The header says which source's key sealed the file (`keyHome`): a source that cannot be
    /// reached, or another than configured, is unavailable. A file that does not decode (a key
    /// id the ring lacks, a failed authentication) is damage — unless the file changed
    /// meanwhile: then it is read again (up to three times). Damage is moved aside — unless
    /// `movingDamageAside` is false (a read whose caller does not handle damage, the account
    /// list's: the damage stays for the session's own read, which reports it and writes the
    /// session back; moved aside by the list read, it was lost, and the session then read a
    /// store without its record — another process's logout).
    func loadKeepingKeys(
        in directory: TrustedDirectory, movingDamageAside: Bool = true
    ) throws(StoreFailure) -> (document: Document, keys: LoadedKeys?)? {
        var attempts = 0
        while true {
            let bytes: [UInt8]
            switch FileIO.readAll(name, in: directory) {
            case .missing: return nil
            case .failed(let message): throw .unavailable(message)
            case .read(let content): bytes = content
            }
            var keys: [SymmetricKey] = []
            var ids: [[UInt8]?] = []
            var loaded: LoadedKeys?
            if let header = StoreHeader(bytes) {
                let home = try keyHome(for: header, in: directory)
                keys = try loadRing(home, in: directory)
                loaded = LoadedKeys(home: home, ring: keys)
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
                let document = try Self.decode(bytes, name: name, keys: keys, ids: &ids)
                loaded?.ids = ids
                return (document, loaded)
            } catch {
                // Not damage if the file changed since it was read: another process rotated the
                // key between our read of the file and of the ring (the header names a key the
                // ring lacks), or overwrote the copy this read had open — the file before the
                // last write is the spare the next one overwrites (`FileIO.replaceThroughSpare`).
                attempts += 1
                if attempts < 4, case .read(let now) = FileIO.readAll(name, in: directory), now != bytes { continue }
                guard movingDamageAside else {
                    throw .damaged("the store file was damaged or tampered with (\(describe(error))); left in place")
                }
                let aside = moveAside(bytes, in: directory)
                throw .damaged("the store file was damaged or tampered with (\(describe(error))); moved aside to \(aside)")
            }
        }
    }

    /// Seals `document` with the newest key of the store's ring (made if there is none) and
    /// replaces the file. Older keys still in the ring are left from a rotation that was cut
    /// short (`saveRotatingKey`): the file no longer needs them, so they are dropped now.
    /// `loaded`: the keys this change's load used, under the same write lock (else both are
    /// read again).
    func save(_ document: Document, in directory: TrustedDirectory, loaded: LoadedKeys? = nil) throws(StoreFailure) {
        let home: KeyHome
        if let loaded { home = loaded.home } else { home = try currentKeyHome(in: directory) }
        let keys: [SymmetricKey]
        let keyID: [UInt8]
        if let loaded, !loaded.ring.isEmpty {
            keys = loaded.ring
            keyID = loaded.id(at: 0)
        } else {
            keys = try ringCreatingKey(home, in: directory)
            keyID = StoreKeyID.of(keys[0])
        }
        try seal(document, with: keys[0], keyID: keyID, home, in: directory)
        if keys.count > 1 { try storeRing([keys[0]], home, create: false, in: directory) }
    }

    /// `save` with a new key (logout): crypto-shredding every earlier copy of the file. In
    /// three steps, each durable before the next, so that a crash anywhere leaves a store that
    /// opens (the old document or the new one, never neither):
    ///   1. the ring becomes {new, old…} — the file still opens with an old key;
    ///   2. the file is sealed with the new key and replaced — it opens with the new key;
    ///   3. the spare (the file before) is removed, and the ring becomes {new} — the old keys
    ///      are gone, and with them every copy of the file sealed before (a backup, a file
    ///      moved aside, a snapshot).
    /// Cut short after 1 or 2, the next change of the store finishes it (`save`).
    func saveRotatingKey(_ document: Document, in directory: TrustedDirectory, loaded: LoadedKeys? = nil) throws(StoreFailure) {
        let home: KeyHome
        let old: [SymmetricKey]
        if let loaded {
            (home, old) = (loaded.home, loaded.ring)
        } else {
            home = try currentKeyHome(in: directory)
            old = try loadRing(home, in: directory)
        }
        let fresh = SymmetricKey(size: .bits256)
        try storeRing([fresh] + old, home, create: false, in: directory)
        try seal(document, with: fresh, keyID: StoreKeyID.of(fresh), home, in: directory)
        // The spare is the file before the logout, sealed with an old key — or, in a
        // version-1 file of a host's key, with the host's key, which no rotation removes.
        FileIO.remove(spareName, in: directory)
        FileIO.syncDirectory(directory)
        try storeRing([fresh], home, create: false, in: directory)
    }

    /// Where the keys of the store file as it is now are (read from its header).
    private func currentKeyHome(in directory: TrustedDirectory) throws(StoreFailure) -> KeyHome {
        try keyHome(for: currentHeader(in: directory), in: directory)
    }

    fileprivate func seal(
        _ document: Document, with key: SymmetricKey, keyID: [UInt8], _ home: KeyHome, in directory: TrustedDirectory
    ) throws(StoreFailure) {
        let sealed: [UInt8]
        do {
            sealed = try Self.encode(document, key: key, keyID: keyID, name: name, source: home.tag)
        } catch {
            throw .unavailable("cannot encode or encrypt the session: \(describe(error))")
        }
        try FileIO.replaceThroughSpare(name, spare: spareName, with: sealed, in: directory)
    }

    /// Renames the damaged store file (whose bytes were `damaged`) aside; returns the new
    /// name, or why it was not moved. Under the write lock, and only if the file still holds
    /// those bytes: another process may have replaced it with a good one meanwhile.
    fileprivate func moveAside(_ damaged: [UInt8], in directory: TrustedDirectory) -> String {
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
