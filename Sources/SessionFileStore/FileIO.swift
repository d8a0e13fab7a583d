import FoundationEssentials
import LoopFlow

#if canImport(Glibc)
import Glibc
#endif

/// The few POSIX file operations the store needs, with the durability steps spelled out.
enum FileIO {
    enum ReadResult {
        case read([UInt8])
        case missing
        case failed(String)
    }

    static func errnoText() -> String { String(cString: strerror(errno)) }

    /// Tests only: writes of files under a directory fail with an errno (disk full where no
    /// small filesystem can be mounted). Keyed by directory, so other stores are unaffected.
    static let injectedWriteErrors = LockedBox<[String: Int32]>([:])

    /// -1 with `errno` set when a fault is injected for `path`, else nil.
    private static func injectedWriteError(_ path: String) -> Int? {
        let code = injectedWriteErrors.withLockedValue { faults in
            faults.first { path.hasPrefix($0.key + "/") }?.value
        }
        guard let code else { return nil }
        errno = code
        return -1
    }

    static func readAll(_ path: String) -> ReadResult {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            return errno == ENOENT ? .missing : .failed(errnoText())
        }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16384)
        while true {
            let count = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                return .failed(errnoText())
            }
            if count == 0 { break }
            bytes.append(contentsOf: chunk[0..<count])
        }
        return .read(bytes)
    }

    /// Creates `directory` (0700) if missing; tightens an existing one to 0700.
    static func makeDirectory(_ directory: String) throws(FileCredentialStore.StoreFailure) {
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            throw .unavailable("cannot create \(directory): \(errnoText())")
        }
        var info = stat()
        guard stat(directory, &info) == 0 else {
            throw .unavailable("cannot inspect \(directory): \(errnoText())")
        }
        if info.st_mode & 0o077 != 0 && chmod(directory, 0o700) != 0 {
            throw .unavailable("cannot make \(directory) private (0700): \(errnoText())")
        }
    }

    /// Writes `path` only if it does not exist, atomically (temp file, fsync, link, fsync
    /// directory). Returns false, writing nothing, if it exists already.
    static func createExclusively(
        _ path: String, with bytes: [UInt8], directory: String
    ) throws(FileCredentialStore.StoreFailure) -> Bool {
        let temporary = "\(path).new-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        try replaceAtomically(temporary, with: bytes, directory: directory)
        defer { unlink(temporary) }
        if link(temporary, path) == 0 {
            syncDirectory(directory)
            return true
        }
        if errno == EEXIST { return false }
        guard errno == EPERM || errno == ENOTSUP || errno == EOPNOTSUPP else {
            throw .unavailable("cannot create \(path): \(errnoText())")
        }
        // No hard links here (vfat, some FUSE/SMB mounts): O_EXCL still makes one creator
        // win; it writes the key in place and syncs it before anyone can decrypt with it.
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            if errno == EEXIST { return false }
            throw .unavailable("cannot create \(path): \(errnoText())")
        }
        defer { close(fd) }
        let written = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        guard written == bytes.count, fsync(fd) == 0 else {
            let reason = errnoText()
            unlink(path)
            throw .unavailable("cannot write \(path): \(reason)")
        }
        syncDirectory(directory)
        return true
    }

    /// temp file (0600, O_EXCL) → write all → fsync → rename over `path` → fsync directory.
    static func replaceAtomically(
        _ path: String, with bytes: [UInt8], directory: String
    ) throws(FileCredentialStore.StoreFailure) {
        var random = SystemRandomNumberGenerator()
        let temporary = "\(path).tmp-\(getpid())-\(random.next() as UInt32)"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw .unavailable("cannot create \(temporary): \(errnoText())")
        }
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
        if failure == nil && rename(temporary, path) != 0 { failure = "rename: \(errnoText())" }
        if let failure {
            unlink(temporary)
            throw .unavailable("cannot write \(path): \(failure)")
        }
        syncDirectory(directory)
    }

    /// Removes the temporary files that writers killed mid-write left beside `files` (full
    /// paths of one store's files): `<file>.tmp-<pid>-<n>` and `<file>.new-<pid>-<n>[…]`, only
    /// those whose process is gone, so a write in progress elsewhere is never touched and no
    /// other file in the directory is. Best effort.
    static func removeOrphanedTemporaries(of files: [String], in directory: String) {
        guard let handle = opendir(directory) else { return }
        defer { closedir(handle) }
        let prefixes = files.compactMap { $0.split(separator: "/").last.map(String.init) }
            .flatMap { [$0 + ".tmp-", $0 + ".new-"] }
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
                unlink(directory + "/" + name)
            }
        }
    }

    /// fsync of a directory, so a rename or link in it survives a crash.
    static func syncDirectory(_ directory: String) {
        let directoryFD = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if directoryFD >= 0 {
            fsync(directoryFD)
            close(directoryFD)
        }
    }
}
