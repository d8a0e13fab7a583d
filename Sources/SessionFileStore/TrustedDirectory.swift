#if canImport(Glibc)
import Glibc
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

    /// Whether the entry `name` is the file `inode` (device, inode) now (not followed).
    func names(_ name: String, inode: (dev_t, ino_t)) -> Bool {
        var info = stat()
        return fstatat(descriptor, name, &info, AT_SYMLINK_NOFOLLOW) == 0 && info.st_dev == inode.0 && info.st_ino == inode.1
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
