import FoundationEssentials

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
            let count = bytes.withUnsafeBytes { buffer in
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
        let directoryFD = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if directoryFD >= 0 {
            fsync(directoryFD)
            close(directoryFD)
        }
    }
}
