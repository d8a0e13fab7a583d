import CRenameExchange
import FoundationEssentials
import LoopFlow

#if canImport(Glibc)
import Glibc
import SessionCore
#endif

/// The few POSIX file operations the store needs, with the durability steps spelled out, all
/// relative to a `TrustedDirectory`.
enum FileIO {
    enum ReadResult {
        case read([UInt8])
        case missing
        /// The message names the file and the reason (a refused file is never read).
        case failed(String)
    }

    static func errnoText() -> String { String(cString: strerror(errno)) }

    private static func temporaryName(_ name: String, _ kind: String, in directory: TrustedDirectory) -> String {
        if let suffix = injectedTemporarySuffix(directory) {
            return "\(name).\(kind)-\(suffix)"
        }
        var random = SystemRandomNumberGenerator()
        return "\(name).\(kind)-\(getpid())-\(random.next() as UInt32)"
    }

    static func readAll(_ name: String, in directory: TrustedDirectory) -> ReadResult {
        var attempts = 0
        while true {
            attempts += 1
            let fd: Int32
            switch directory.openFile(name, O_RDONLY) {
            case .opened(let opened): fd = opened
            case .missing: return .missing
            case .failed(_, let message), .refused(let message): return .failed(message)
            }
            var read = readAll(fd, name, in: directory)
            // The file read must still be the one the name holds, unchanged since it was opened:
            // the store file before the last write is the spare the next write overwrites in
            // place — it may have been written over while this read had it open, with bytes
            // never published (a writer that failed before its exchange), and even have come
            // back under the name since. Read the name again then (a torn read the timestamps
            // miss is the decode's to catch: `loadKeepingKeys`).
            var moved = false
            if read.bytes != nil, let before = read.info {
                moved = !directory.names(name, inode: (before.st_dev, before.st_ino)) || Self.changed(fd, since: before)
            }
            close(fd)
            if moved && attempts < 8 {
                read.bytes?.zeroSecretBytes()  // key files pass through here
                continue
            }
            if let bytes = read.bytes { return .read(bytes) }
            return .failed(read.failure ?? "cannot read \(directory.display(name))")
        }
    }

    private struct OneRead {
        /// What was read, or why not.
        var bytes: [UInt8]?
        var failure: String?
        /// The opened file's status before the read (nil if fstat failed).
        var info: stat?
    }

    /// Whether the file open as `fd` was written to or truncated since `before` (its change
    /// time or size moved).
    private static func changed(_ fd: Int32, since before: stat) -> Bool {
        var now = stat()
        guard fstat(fd, &now) == 0 else { return true }
        return now.st_size != before.st_size || now.st_ctim.tv_sec != before.st_ctim.tv_sec
            || now.st_ctim.tv_nsec != before.st_ctim.tv_nsec
    }

    private static func readAll(_ fd: Int32, _ name: String, in directory: TrustedDirectory) -> OneRead {
        injectedPauseAfterOpen(name, in: directory)
        // Key files pass through here: the buffer is sized from the file's size up front, so
        // it is not grown (a grown array leaves a copy behind in freed memory), and the chunk
        // is zeroed after.
        var status = stat()
        var bytes: [UInt8] = []
        let inspected = fstat(fd, &status) == 0
        if inspected, status.st_size > 0 { bytes.reserveCapacity(Int(status.st_size) + 1) }
        let info = inspected ? status : nil
        var chunk = [UInt8](repeating: 0, count: 16384)
        defer { chunk.zeroSecretBytes() }
        while true {
            let count = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                bytes.zeroSecretBytes()  // what a key file's read got before the error
                return OneRead(failure: "cannot read \(directory.display(name)): \(errnoText())", info: info)
            }
            if count == 0 { break }
            bytes.append(contentsOf: chunk[0..<count])
        }
        return OneRead(bytes: bytes, info: info)
    }

    /// Writes `name` only if it does not exist, atomically (temp file, fsync, link, fsync
    /// directory). Returns false, writing nothing, if it exists already (whatever it is).
    static func createExclusively(
        _ name: String, with bytes: [UInt8], in directory: TrustedDirectory
    ) throws(FileCredentialStore.StoreFailure) -> Bool {
        let temporary = temporaryName(name, "new", in: directory)
        try replaceAtomically(temporary, with: bytes, in: directory)
        // linkat without AT_SYMLINK_FOLLOW: the new name is the temporary file itself. Until the
        // temporary name is unlinked the new file has two links and reads refuse it; that
        // happens only while no store file sealed with it exists (the key is made before the
        // first write), and a writer killed in between leaves a `.new-<pid>-…` orphan that
        // the next write removes before it reads the key.
        if linkat(directory.descriptor, temporary, directory.descriptor, name, 0) == 0 {
            unlinkat(directory.descriptor, temporary, 0)  // at once: the new file has one link again
            syncDirectory(directory)
            return true
        }
        let code = errno
        unlinkat(directory.descriptor, temporary, 0)
        if code == EEXIST { return false }
        guard code == EPERM || code == ENOTSUP || code == EOPNOTSUPP else {
            throw .unavailable("cannot create \(directory.display(name)): \(String(cString: strerror(code)))")
        }
        // No hard links here (vfat, some FUSE/SMB mounts): O_EXCL still makes one creator
        // win; it writes the key in place and syncs it before anyone can decrypt with it.
        let fd = openat(directory.descriptor, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            if errno == EEXIST { return false }
            throw .unavailable("cannot create \(directory.display(name)): \(errnoText())")
        }
        defer { close(fd) }
        let written = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        guard written == bytes.count, fsync(fd) == 0 else {
            let reason = errnoText()
            unlinkat(directory.descriptor, name, 0)
            throw .unavailable("cannot write \(directory.display(name)): \(reason)")
        }
        syncDirectory(directory)
        return true
    }

    /// temp file (0600, O_EXCL|O_NOFOLLOW) → write all → fsync → renameat over `name` → fsync
    /// directory. The caller has checked what `name` holds (the rename replaces the entry, it
    /// never writes through it).
    static func replaceAtomically(
        _ name: String, with bytes: [UInt8], in directory: TrustedDirectory
    ) throws(FileCredentialStore.StoreFailure) {
        let temporary = temporaryName(name, "tmp", in: directory)
        let fd = openat(directory.descriptor, temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw .unavailable("cannot create \(directory.display(temporary)): \(errnoText())")
        }
        let path = directory.display(name)
        var failure: String?
        var written = 0
        while written < bytes.count && failure == nil {
            let count = injectedWriteError(path) ?? bytes.withUnsafeBytes { buffer in
                Glibc.write(fd, buffer.baseAddress! + written, buffer.count - written)
            }
            if count < 0 {
                if errno != EINTR { failure = "write: \(errnoText())" }
            } else {
                written += count
            }
        }
        if failure == nil && fsync(fd) != 0 { failure = "fsync: \(errnoText())" }
        if close(fd) != 0 && failure == nil { failure = "close: \(errnoText())" }
        if failure == nil && renameat(directory.descriptor, temporary, directory.descriptor, name) != 0 {
            failure = "rename: \(errnoText())"
        }
        if let failure {
            unlinkat(directory.descriptor, temporary, 0)
            throw .unavailable("cannot write \(path): \(failure)")
        }
        syncDirectory(directory)
    }

    /// Replaces `name` with `bytes` through `spare`, a file kept beside it: the bytes are
    /// written over the spare in place (pwrite, ftruncate, fsync), the two entries exchanged
    /// (`renameat2(RENAME_EXCHANGE)`) and the directory fsync'd. The old file becomes the
    /// spare, to be overwritten by the next write. A crash at any moment leaves `name` whole —
    /// the old file until the exchange, the new one (synced before it) after — as
    /// `replaceAtomically` does; but no inode is allocated and none freed, so no fsync of a new
    /// directory entry and no freeing of the old file's blocks (with `discard`, a trim waited
    /// for inside the rename): on ext4 a write costs two thirds of a new file's.
    ///
    /// The spare must be the old file *on disk* before it is written over: a writer killed
    /// between its exchange and its directory fsync leaves the exchange in memory only, and a
    /// crash after the next writer's first block could bring back a directory where the
    /// spare's inode is still the store file. So the directory is fsync'd first (clean, that
    /// is the disk's cache flush alone); if that fails, no spare for this write.
    ///
    /// The spare holds the previous file (sealed like it); a logout removes it
    /// (`saveRotatingKey`). A reader of another process whose opened copy becomes the spare
    /// finds its name on another file after reading and reads again (`readAll`).
    ///
    /// Falls back to `replaceAtomically`, leaving the spare's name free: when the spare must
    /// not be used (a planted link, FIFO, directory, second link, other owner or mode —
    /// `openFile`'s checks) or cannot be opened, the entry itself is removed, never followed;
    /// where the filesystem cannot exchange, the spare is renamed over `name`. Only for files
    /// whose previous content may stay: never key files.
    static func replaceThroughSpare(
        _ name: String, spare: String, with bytes: [UInt8], in directory: TrustedDirectory
    ) throws(FileCredentialStore.StoreFailure) {
        let fd: Int32
        switch directory.openFile(spare, O_WRONLY | O_CREAT) {
        case .opened(let opened):
            fd = opened
        case .refused, .failed:
            remove(spare, in: directory)
            return try replaceAtomically(name, with: bytes, in: directory)
        case .missing:
            return try replaceAtomically(name, with: bytes, in: directory)
        }
        guard injectedDirectorySyncError(directory) ?? fsync(directory.descriptor) == 0 else {
            close(fd)
            return try replaceAtomically(name, with: bytes, in: directory)
        }
        let path = directory.display(name)
        var failure: String?
        var written = 0
        while written < bytes.count && failure == nil {
            let count = injectedWriteError(path) ?? bytes.withUnsafeBytes { buffer in
                pwrite(fd, buffer.baseAddress! + written, buffer.count - written, off_t(written))
            }
            if count < 0 {
                if errno != EINTR { failure = "write: \(errnoText())" }
            } else {
                written += count
            }
        }
        if failure == nil && ftruncate(fd, off_t(bytes.count)) != 0 { failure = "truncate: \(errnoText())" }
        if failure == nil && fsync(fd) != 0 { failure = "fsync: \(errnoText())" }
        if close(fd) != 0 && failure == nil { failure = "close: \(errnoText())" }
        if failure == nil && exchange(spare, name, in: directory) != 0 {
            // ENOENT: no file yet to exchange with (the first write); EINVAL, ENOSYS, ENOTSUP,
            // EPERM: a filesystem (or kernel) that cannot exchange. A rename then.
            if renameat(directory.descriptor, spare, directory.descriptor, name) != 0 {
                failure = "rename: \(errnoText())"
            }
        }
        if let failure {
            remove(spare, in: directory)
            throw .unavailable("cannot write \(path): \(failure)")
        }
        syncDirectory(directory)
    }

    private static func exchange(_ first: String, _ second: String, in directory: TrustedDirectory) -> Int32 {
        if let failed = injectedExchangeError(directory) { return failed }
        return sf_rename_exchange(directory.descriptor, first, second)
    }

    /// Removes the entry `name` itself, whatever it is (never following it). Best effort.
    static func remove(_ name: String, in directory: TrustedDirectory) {
        unlinkat(directory.descriptor, name, 0)
    }

    /// Renames `name` to `newName` in the directory (never following either).
    static func rename(_ name: String, to newName: String, in directory: TrustedDirectory) -> Bool {
        renameat(directory.descriptor, name, directory.descriptor, newName) == 0
    }

    /// Removes the temporary files that writers killed mid-write left beside `names` (one
    /// store's files): `<name>.tmp-<pid>-<n>` and `<name>.new-<pid>-<n>[…]`, only those whose
    /// process is gone, so a write in progress elsewhere is never touched and no other file in
    /// the directory is. `unlinkat` removes the entry itself, whatever it is. Best effort.
    static func removeOrphanedTemporaries(of names: [String], in directory: TrustedDirectory) {
        let prefixes = names.flatMap { [$0 + ".tmp-", $0 + ".new-"] }
        for name in entries(of: directory) ?? [] {
            guard let prefix = prefixes.first(where: { name.hasPrefix($0) }) else { continue }
            let fields = name.dropFirst(prefix.count).split(separator: "-", maxSplits: 1)
            guard fields.count == 2, let pid = pid_t(fields[0]), pid > 0,
                  fields[1].prefix(while: { $0 != "." }).allSatisfy(\.isNumber)
            else { continue }
            if pid != getpid() && kill(pid, 0) != 0 && errno == ESRCH {
                unlinkat(directory.descriptor, name, 0)
            }
        }
    }

    /// Empties the copies of a damaged store file, keeping their names: an empty file (0600)
    /// made under a temporary name is renamed over each that is not empty yet, so the name
    /// never goes missing (a reader listing the copies meanwhile sees it). What a copy held — tokens a key rotation
    /// may not reach: a version-1 file sealed with the host's key, a key the ring no longer
    /// holds — is gone; its name still tells sessions that a damaged file was moved aside
    /// (`RecordWitness`).
    static func emptyDamagedCopies(_ copies: Set<String>, of name: String, in directory: TrustedDirectory) {
        var emptied = 0
        for copy in copies {
            var status = stat()  // emptied already (by an earlier logout): left as it is
            if fstatat(directory.descriptor, copy, &status, AT_SYMLINK_NOFOLLOW) == 0,
                status.st_mode & S_IFMT == S_IFREG, status.st_size == 0
            {
                continue
            }
            // `<name>.new-<pid>-<random>`: an orphan a later change removes, never blocked by one.
            let empty = "\(name).new-\(getpid())-\(UInt64.random(in: 0...UInt64(UInt32.max)))"
            let fd = openat(directory.descriptor, empty, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
            guard fd >= 0 else { continue }
            close(fd)
            if renameat(directory.descriptor, empty, directory.descriptor, copy) == 0 {
                emptied += 1
            } else {
                unlinkat(directory.descriptor, empty, 0)
            }
        }
        if emptied > 0 { syncDirectory(directory) }
    }

    /// The names of the copies of a damaged store file moved aside as `<name>.damaged-<time>`;
    /// nil when the directory cannot be listed.
    static func damagedCopies(of name: String, in directory: TrustedDirectory) -> Set<String>? {
        let prefix = name + ".damaged-"
        return entries(of: directory).map { Set($0.filter { $0.hasPrefix(prefix) }) }
    }

    /// The names in `directory`, read through a descriptor of its own (opened on "."): a
    /// duplicate of the directory's descriptor would share its offset, and a second listing in
    /// the same operation would start where the first ended and find nothing. Nil when it
    /// cannot be listed (no descriptor left, a read error).
    static func entries(of directory: TrustedDirectory) -> [String]? {
        let fd = openat(directory.descriptor, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        guard let handle = fdopendir(fd) else {
            close(fd)
            return nil
        }
        defer { closedir(handle) }
        var names: [String] = []
        while true {
            errno = 0
            guard let entry = readdir(handle) else { break }
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return errno == 0 ? names : nil
    }

    /// fsync of the directory, so a rename or link in it survives a crash.
    static func syncDirectory(_ directory: TrustedDirectory) {
        fsync(directory.descriptor)
    }
}
