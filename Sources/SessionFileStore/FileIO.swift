import FoundationEssentials
import LoopFlow

#if canImport(Glibc)
import Glibc
import SessionCore
#endif

/// The store's directory, opened once per store operation and trusted only after it is checked:
/// opened `O_DIRECTORY|O_NOFOLLOW` (the directory itself may not be a symbolic link), owned by
/// the effective user, not writable by group or others (a sticky bit does not make a shared
/// directory private: others could still plant names in it, so 1777 is refused like 0777).
/// Every file of the store is then reached relative to this descriptor (`openat`, `renameat`,
/// `linkat`, `unlinkat`, each `O_NOFOLLOW`) and checked once open (`checkFile`): nothing is
/// read from or written to a file that fails.
///
/// Parents: only the last component is opened `O_NOFOLLOW`; symbolic links in the parents
/// are followed (`/var -> /private/var`, a home directory on another volume). Trust rests on
/// the directory itself: whoever controls a parent can at most make this path reach another
/// directory, which must pass the same checks (ours, private) — never one of someone else's.
/// `.` components and trailing slashes are removed first, so `link/` or `link/.` cannot make
/// the last component's link be followed.
///
/// Only a directory this store creates is given a mode (0700, by `mkdir`; only the last
/// component is created, never its parents); an existing one is never `chmod`-ed.
final class TrustedDirectory {
    /// The path as the store was given it (for messages).
    let path: String
    let descriptor: Int32

    private init(path: String, descriptor: Int32) {
        self.path = path
        self.descriptor = descriptor
    }

    deinit { close(descriptor) }

    enum Opening {
        case opened(TrustedDirectory)
        /// The directory (or a parent) does not exist, and it was not to be created.
        case missing
        /// It could not be opened or created (`errno`), e.g. EACCES, EROFS, ENOTDIR.
        case unreachable(Int32, String)
        /// It exists but must not be used: a symbolic link, not a directory, someone else's,
        /// writable by group or others.
        case refused(String)
    }

    /// Opens (and with `create`, first creates 0700 if missing) and checks the directory.
    static func open(_ path: String, create: Bool) -> Opening {
        let target = normalized(path)
        var fd = Glibc.open(target, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        if fd < 0 && errno == ENOENT && create {
            if mkdir(target, 0o700) != 0 && errno != EEXIST {
                return .unreachable(errno, "cannot create \(path): \(FileIO.errnoText())")
            }
            fd = Glibc.open(target, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        }
        if fd < 0 {
            let code = errno
            if code == ELOOP || code == ENOTDIR {
                var info = stat()
                if lstat(target, &info) == 0 {
                    if info.st_mode & S_IFMT == S_IFLNK { return .refused("\(path) is a symbolic link: not used") }
                    if info.st_mode & S_IFMT != S_IFDIR { return .refused("\(path) is not a directory: not used") }
                }
            }
            if code == ENOENT { return .missing }
            return .unreachable(code, "cannot open \(path): \(String(cString: strerror(code)))")
        }
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            let code = errno
            close(fd)
            return .unreachable(code, "cannot inspect \(path): \(String(cString: strerror(code)))")
        }
        let reason: String? =
            if info.st_uid != geteuid() {
                "is owned by uid \(info.st_uid), not \(geteuid())"
            } else if info.st_mode & (S_IWGRP | S_IWOTH) != 0 {
                "is writable by group or others (mode \(octal(info.st_mode)))"
            } else {
                nil
            }
        if let reason {
            close(fd)
            return .refused("\(path) \(reason): not used")
        }
        return .opened(TrustedDirectory(path: path, descriptor: fd))
    }

    /// `path` without `.` components, repeated or trailing slashes.
    static func normalized(_ path: String) -> String {
        let absolute = path.hasPrefix("/")
        let parts = path.split(separator: "/").filter { $0 != "." }
        if parts.isEmpty { return absolute ? "/" : "." }
        return (absolute ? "/" : "") + parts.joined(separator: "/")
    }

    /// The full path of `name` in this directory (for messages).
    func display(_ name: String) -> String { path + "/" + name }

    /// Why a file of the store must not be used, or nil: it must be a regular file owned by the
    /// effective user, without any group or other permission, with one link (a second link
    /// would be a name outside the store's control for the same content).
    static func fileProblem(_ info: stat) -> String? {
        if info.st_mode & S_IFMT == S_IFLNK { return "is a symbolic link" }
        if info.st_mode & S_IFMT != S_IFREG { return "is not a regular file" }
        if info.st_uid != geteuid() { return "is owned by uid \(info.st_uid), not \(geteuid())" }
        if info.st_mode & 0o077 != 0 { return "is open to group or others (mode \(octal(info.st_mode)))" }
        if info.st_nlink != 1 { return "has \(info.st_nlink) links, not 1" }
        return nil
    }

    enum FileOpening {
        case opened(Int32)
        case missing
        /// `open` failed with this errno (and message naming the file).
        case failed(Int32, String)
        /// The file exists but is not to be used (message names it and why).
        case refused(String)
    }

    /// `openat(name, flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK)` (O_NONBLOCK: a planted FIFO
    /// cannot block the open), then `checkFile`. A refused file is closed unread.
    func openFile(_ name: String, _ flags: Int32, mode: mode_t = 0o600) -> FileOpening {
        let fd = openat(descriptor, name, flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, mode)
        guard fd >= 0 else {
            let code = errno
            if code == ENOENT { return .missing }
            // ELOOP (a link), EISDIR, ENXIO...: say what is there rather than the errno.
            if let problem = problem(of: name) { return .refused("\(display(name)) \(problem): not used") }
            return .failed(code, "cannot open \(display(name)): \(String(cString: strerror(code)))")
        }
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            let code = errno
            close(fd)
            return .failed(code, "cannot inspect \(display(name)): \(String(cString: strerror(code)))")
        }
        if let problem = Self.fileProblem(info) {
            close(fd)
            return .refused("\(display(name)) \(problem): not used")
        }
        return .opened(fd)
    }

    /// Why the entry `name` must not be used, nil if it is fine or absent (`fstatat`, not followed).
    func problem(of name: String) -> String? {
        var info = stat()
        guard fstatat(descriptor, name, &info, AT_SYMLINK_NOFOLLOW) == 0 else { return nil }
        return Self.fileProblem(info)
    }

    /// Throws if `name` exists and must not be used (checked without opening it).
    func check(_ name: String) throws(FileCredentialStore.StoreFailure) {
        if let problem = problem(of: name) {
            throw .unavailable("\(display(name)) \(problem): not used")
        }
    }
}

private func octal(_ mode: mode_t) -> String {
    let text = String(mode & 0o7777, radix: 8)
    return String(repeating: "0", count: max(0, 4 - text.count)) + text
}

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

    /// Tests only: writes of files under a directory fail with an errno (disk full where no
    /// small filesystem can be mounted). Keyed by directory, so other stores are unaffected.
    static let injectedWriteErrors = LockedBox<[String: Int32]>([:])

    /// Tests only: the temporary files of a store in a directory get this suffix instead of
    /// `<pid>-<random>`, so that a test can plant something under that name.
    static let injectedTemporarySuffixes = LockedBox<[String: String]>([:])

    /// -1 with `errno` set when a fault is injected for `path`, else nil.
    private static func injectedWriteError(_ path: String) -> Int? {
        let code = injectedWriteErrors.withLockedValue { faults in
            faults.first { path.hasPrefix($0.key + "/") }?.value
        }
        guard let code else { return nil }
        errno = code
        return -1
    }

    private static func temporaryName(_ name: String, _ kind: String, in directory: TrustedDirectory) -> String {
        if let suffix = injectedTemporarySuffixes.withLockedValue({ $0[directory.path] }) {
            return "\(name).\(kind)-\(suffix)"
        }
        var random = SystemRandomNumberGenerator()
        return "\(name).\(kind)-\(getpid())-\(random.next() as UInt32)"
    }

    static func readAll(_ name: String, in directory: TrustedDirectory) -> ReadResult {
        let fd: Int32
        switch directory.openFile(name, O_RDONLY) {
        case .opened(let opened): fd = opened
        case .missing: return .missing
        case .failed(_, let message), .refused(let message): return .failed(message)
        }
        defer { close(fd) }
        // Key files pass through here: the buffer is sized from the file's size up front, so
        // it is not grown (a grown array leaves a copy behind in freed memory), and the chunk
        // is zeroed after.
        var status = stat()
        var bytes: [UInt8] = []
        if fstat(fd, &status) == 0, status.st_size > 0 { bytes.reserveCapacity(Int(status.st_size) + 1) }
        var chunk = [UInt8](repeating: 0, count: 16384)
        defer { chunk.zeroSecretBytes() }
        while true {
            let count = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                return .failed("cannot read \(directory.display(name)): \(errnoText())")
            }
            if count == 0 { break }
            bytes.append(contentsOf: chunk[0..<count])
        }
        return .read(bytes)
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

    /// Renames `name` to `newName` in the directory (never following either).
    static func rename(_ name: String, to newName: String, in directory: TrustedDirectory) -> Bool {
        renameat(directory.descriptor, name, directory.descriptor, newName) == 0
    }

    /// Removes the temporary files that writers killed mid-write left beside `names` (one
    /// store's files): `<name>.tmp-<pid>-<n>` and `<name>.new-<pid>-<n>[…]`, only those whose
    /// process is gone, so a write in progress elsewhere is never touched and no other file in
    /// the directory is. `unlinkat` removes the entry itself, whatever it is. Best effort.
    static func removeOrphanedTemporaries(of names: [String], in directory: TrustedDirectory) {
        let copy = fcntl(directory.descriptor, F_DUPFD_CLOEXEC, 0)
        guard copy >= 0 else { return }
        guard let handle = fdopendir(copy) else {
            close(copy)
            return
        }
        defer { closedir(handle) }
        let prefixes = names.flatMap { [$0 + ".tmp-", $0 + ".new-"] }
        while let entry = readdir(handle) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
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

    /// Removes the copies of a damaged store file moved aside as `<name>.damaged-<time>`
    /// (only those entries: `unlinkat` of the name, never following it). Returns how many.
    @discardableResult
    static func removeDamagedCopies(of name: String, in directory: TrustedDirectory) -> Int {
        let copy = fcntl(directory.descriptor, F_DUPFD_CLOEXEC, 0)
        guard copy >= 0 else { return 0 }
        guard let handle = fdopendir(copy) else {
            close(copy)
            return 0
        }
        defer { closedir(handle) }
        var names: [String] = []
        while let entry = readdir(handle) {
            let entryName = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            if entryName.hasPrefix(name + ".damaged-") { names.append(entryName) }
        }
        var removed = 0
        for entryName in names where unlinkat(directory.descriptor, entryName, 0) == 0 {
            removed += 1
        }
        if removed > 0 { syncDirectory(directory) }
        return removed
    }

    /// fsync of the directory, so a rename or link in it survives a crash.
    static func syncDirectory(_ directory: TrustedDirectory) {
        fsync(directory.descriptor)
    }
}
