// The cross-process refresh lease of a file store: a one-line record in `<store>.lock` that
// says who refreshes and until when. `flock` guards only the read-modify-write of the record
// (microseconds), never the refresh: a holder that is stopped (SIGSTOP, a debugger) blocks the
// others only until its deadline, and one that died not at all.

import SessionCore

#if canImport(Glibc)
import Glibc
#endif

/// One lease as the lock file holds it, a single line of printable ASCII:
///
///     sessionflow-lease 1 pid=4242 nonce=9f3c0a1b2c3d4e5f boot=<boot id> pidns=4026531836 granted=1200000000 until=61200000000
///
/// - `pid` and `pidns` (the inode of the holder's pid namespace): whether the holder still
///   lives can be asked (`kill(pid, 0)`) only from the same pid namespace.
/// - `nonce`: random per acquisition; release clears the record only if it still carries the
///   releaser's nonce (same pid is not enough: two store instances in one process).
/// - `granted`, `until`: nanoseconds of `CLOCK_MONOTONIC`. Not the wall clock: a step of the
///   wall clock (NTP, a manual change) would end leases early (two refreshes) or late. Linux's
///   monotonic clock is one clock for all processes of a boot (outside time namespaces), and
///   the clock libuv's timers follow — the holder's attempt timeout and its request's deadline
///   are such timers. Like them it stands still while the machine is suspended, so a suspend
///   cannot end a lease while its holder's request still runs (CLOCK_BOOTTIME, which the loop's
///   `now` reads, could). It restarts at each boot: `boot` (`/proc/sys/kernel/random/boot_id`)
///   tells a record from an earlier boot, which is free.
///
/// The line must end with its newline: a truncated record is no record. Anything that does not
/// parse — garbage, a truncated or oversized file, numbers out of range — counts as no lease.
struct LeaseRecord: Equatable, Sendable {
    var pid: Int32
    var nonce: UInt64
    var boot: String
    var pidNamespace: String
    /// CLOCK_MONOTONIC nanoseconds.
    var granted: Int64
    var until: Int64

    /// A record is far shorter (about 150 bytes); a file longer than this is garbage.
    static let maximumSize = 512
    private static let tag = "sessionflow-lease"
    private static let version = "1"

    var line: String {
        "\(Self.tag) \(Self.version) pid=\(pid) nonce=\(String(nonce, radix: 16)) boot=\(boot) "
            + "pidns=\(pidNamespace) granted=\(granted) until=\(until)\n"
    }

    /// The record in `bytes`, or nil for anything else.
    static func parse(_ bytes: some BidirectionalCollection<UInt8>) -> LeaseRecord? {
        guard bytes.count <= maximumSize, bytes.last == UInt8(ascii: "\n") else { return nil }
        let body = bytes.dropLast()
        guard body.allSatisfy({ (0x20...0x7e).contains($0) }) else { return nil }
        let words = body.split(separator: UInt8(ascii: " "), omittingEmptySubsequences: false)
            .map { String(decoding: $0, as: UTF8.self) }
        guard words.count == 8, words[0] == tag, words[1] == version else { return nil }
        var fields: [String: String] = [:]
        for word in words.dropFirst(2) {
            guard let equals = word.firstIndex(of: "=") else { return nil }
            let key = String(word[..<equals])
            guard fields[key] == nil else { return nil }
            fields[key] = String(word[word.index(after: equals)...])
        }
        guard let pid = fields["pid"].flatMap({ Int32($0) }), pid > 0,
            let nonceText = fields["nonce"], (1...16).contains(nonceText.count),
            let nonce = UInt64(nonceText, radix: 16),
            let boot = fields["boot"], isIdentifier(boot),
            let pidNamespace = fields["pidns"], isIdentifier(pidNamespace),
            let granted = fields["granted"].flatMap({ Int64($0) }), granted >= 0,
            let until = fields["until"].flatMap({ Int64($0) }), until >= granted,
            until - granted <= LeaseRecord.maximumDuration
        else { return nil }
        return LeaseRecord(pid: pid, nonce: nonce, boot: boot, pidNamespace: pidNamespace, granted: granted, until: until)
    }

    /// The longest lease a record may give, in nanoseconds (one hour; a lease lasts twice the
    /// refresh timeout): a record claiming longer (written by anything but us: `until` years
    /// away) is unreadable, so free — it cannot lock every process out of refreshing. Leases
    /// asked for longer are granted this long.
    static let maximumDuration: Int64 = 3_600_000_000_000

    /// 1 to 64 characters of [0-9a-zA-Z-].
    private static func isIdentifier(_ text: String) -> Bool {
        (1...64).contains(text.utf8.count)
            && text.utf8.allSatisfy { $0 == UInt8(ascii: "-") || (0x30...0x39).contains($0) || (0x41...0x5a).contains($0) || (0x61...0x7a).contains($0) }
    }

    /// Whether this record still holds the lease at `now`, seen from a process of boot `boot`
    /// in pid namespace `pidNamespace`. `isGone` answers whether a pid of that namespace is dead.
    func holds(now: Int64, boot: String, pidNamespace: String, isGone: (Int32) -> Bool) -> Bool {
        if self.boot != boot && self.boot != LeaseClock.unknown && boot != LeaseClock.unknown { return false }
        // A grant "in the future" comes from another boot whose id could not be read.
        guard now < until, granted <= now else { return false }
        if self.pidNamespace == pidNamespace && isGone(pid) { return false }
        return true
    }

    func holder(now: Int64) -> RefreshLeaseHolder {
        RefreshLeaseHolder(
            pid: pid, isThisProcess: pid == getpid() && pidNamespace == LeaseClock.pidNamespace,
            until: .nanoseconds(until), remaining: .nanoseconds(until - now))
    }
}

/// The clock and the identities a lease record is written with.
enum LeaseClock {
    static let unknown = "unknown"

    /// CLOCK_MONOTONIC, in nanoseconds.
    static func now() -> Int64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return Int64(time.tv_sec) * 1_000_000_000 + Int64(time.tv_nsec)
    }

    /// `duration` in nanoseconds, within [0, 365 days] (no arithmetic overflow, whatever the policy).
    static func nanoseconds(_ duration: Duration) -> Int64 {
        let year: Int64 = 365 * 24 * 3600
        let (seconds, attoseconds) = duration.components
        if seconds < 0 { return 0 }
        if seconds >= year { return year * 1_000_000_000 }
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }

    /// This boot's id, or "unknown".
    static let boot: String = {
        let fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return unknown }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 64)
        let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard count > 0 else { return unknown }
        let text = String(decoding: buffer[..<count], as: UTF8.self).filter { $0 != "\n" }
        return text.isEmpty || text.count > 64 || !text.allSatisfy({ $0.isHexDigit || $0 == "-" }) ? unknown : text
    }()

    /// The inode number of this process's pid namespace ("pid:[4026531836]"), or "unknown".
    static let pidNamespace: String = {
        var buffer = [CChar](repeating: 0, count: 64)
        let count = buffer.withUnsafeMutableBufferPointer { readlink("/proc/self/ns/pid", $0.baseAddress!, $0.count - 1) }
        guard count > 0 else { return unknown }
        let text = String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        let digits = text.filter(\.isASCII).filter(\.isNumber)
        return digits.isEmpty || digits.count > 20 ? unknown : String(digits)
    }()

    /// Whether `pid` (of this pid namespace) has died: no such process, or a zombie (dead,
    /// not yet reaped by its parent: it will never release anything).
    static func isGone(_ pid: Int32) -> Bool {
        guard pid > 0 else { return true }
        if kill(pid, 0) != 0 && errno == ESRCH { return true }
        // /proc/<pid>/stat: "pid (comm) S ..."; comm may hold spaces and parentheses.
        let fd = open("/proc/\(pid)/stat", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 512)
        let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard count > 0, let paren = buffer[..<count].lastIndex(of: UInt8(ascii: ")")), paren + 2 < count else { return false }
        let state = buffer[paren + 2]
        return state == UInt8(ascii: "Z") || state == UInt8(ascii: "X")
    }
}

/// The lock files of a store (`<store>.lock`, `<store>.wlock`).
enum LockFile {
    /// A lock file: read-write (created 0600 if need be), else read-only (flock works on
    /// either); `impossible` only for the errors that mean no lock file can exist. Opened
    /// relative to the trusted directory, never through a symbolic link, and checked like the
    /// store's other files (a regular file of ours, no group/other bits, one link).
    enum Opened {
        case open(Int32, writable: Bool)
        /// The store's directory or filesystem cannot hold a lock file at all.
        case impossible
        /// A passing failure (EMFILE, ENFILE, ENOMEM, EINTR...) or a file or directory that
        /// must not be used (the message names it and why).
        case failed(String)
    }

    private static let cannotExist: Set<Int32> = [EROFS, EACCES, EPERM, ENOENT, ENOTDIR]

    static func open(_ name: String, in directory: TrustedDirectory) -> Opened {
        var opening = directory.openFile(name, O_RDWR | O_CREAT)
        var writable = true
        if case .failed(let code, _) = opening, cannotExist.contains(code) {
            opening = directory.openFile(name, O_RDONLY)
            writable = false
        }
        switch opening {
        case .opened(let fd): return .open(fd, writable: writable)
        case .missing: return .impossible
        case .failed(let code, let message): return cannotExist.contains(code) ? .impossible : .failed(message)
        case .refused(let message): return .failed(message)
        }
    }

    /// The store's directory (created 0700 if missing), then `name` in it.
    static func open(_ name: String, directory path: String) -> Opened {
        switch TrustedDirectory.open(path, create: true) {
        case .opened(let directory): open(name, in: directory)
        case .missing: .impossible
        case .unreachable(let code, let message): cannotExist.contains(code) ? .impossible : .failed(message)
        case .refused(let message): .failed(message)
        }
    }
}

/// The lock file's side of the lease: open, a short exclusive `flock`, read the record, decide,
/// write. Every function here runs inside the store's own lock.
enum LeaseFile {
    /// What a store instance holds.
    enum Hold: Sendable {
        case none
        /// Our record is in the lock file.
        case record(LeaseRecord)
        /// The lock file could be opened but not written (read-only file or filesystem), or the
        /// record could not be written: the flock itself is held until release, as before the
        /// lease existed. A holder stopped in this mode blocks the others until it continues.
        case descriptor(Int32, until: Int64)
        /// No lock file can exist here, or flock cannot be used on it: nothing to hold (see
        /// `FileCredentialStore.tryAcquireRefreshLease`).
        case unguarded(until: Int64)

        var until: Int64? {
            switch self {
            case .none: nil
            case .record(let record): record.until
            case .descriptor(_, let until), .unguarded(let until): until
            }
        }
    }

    /// The errors of `flock` that mean this descriptor cannot be locked at all.
    static func flockUnusable(_ error: Int32) -> Bool {
        error == EBADF || error == ENOTSUP || error == EOPNOTSUPP
    }

    /// Takes the lease for `duration` unless someone holds it. The caller holds nothing.
    /// A lock file or directory that is refused (a symbolic link, someone else's...) answers
    /// busy: never refresh unguarded because of a planted file; the store's reads report it.
    static func acquire(_ name: String, directory: String, for duration: Duration) -> (RefreshLeaseResult, Hold) {
        let fd: Int32
        let writable: Bool
        switch LockFile.open(name, directory: directory) {
        case .open(let opened, let canWrite):
            fd = opened
            writable = canWrite
        case .impossible:
            // No lock file can exist here (a read-only or vanished store): nothing can be
            // written through it either, so no process can have rotated the tokens through it.
            // Refresh without the lease, not never.
            return (.acquired, .unguarded(until: LeaseClock.now() + LeaseClock.nanoseconds(duration)))
        case .failed:
            return (.busy(nil), .none)  // try again shortly
        }
        if flock(fd, LOCK_EX | LOCK_NB) != 0 {
            let error = errno
            close(fd)
            if flockUnusable(error) {
                // A descriptor flock cannot use (a read-only one on NFS): as impossible.
                return (.acquired, .unguarded(until: LeaseClock.now() + LeaseClock.nanoseconds(duration)))
            }
            // EWOULDBLOCK: another process is reading or writing the record this instant (or
            // a SessionFlow from before the lease holds the flock for its whole refresh);
            // EINTR, ENOLCK: a passing failure. The caller looks again shortly.
            return (.busy(nil), .none)
        }
        let now = LeaseClock.now()
        if let current = LeaseRecord.parse(readBounded(fd)),
            current.holds(now: now, boot: LeaseClock.boot, pidNamespace: LeaseClock.pidNamespace, isGone: LeaseClock.isGone)
        {
            _ = flock(fd, LOCK_UN)
            close(fd)
            return (.busy(current.holder(now: now)), .none)
        }
        // Free: no record, garbage, expired, from another boot, or its holder died.
        let mine = LeaseRecord(
            pid: getpid(), nonce: UInt64.random(in: 1...UInt64.max), boot: LeaseClock.boot,
            pidNamespace: LeaseClock.pidNamespace, granted: now,
            until: now + min(LeaseClock.nanoseconds(duration), LeaseRecord.maximumDuration))
        if writable && replaceContents(fd, with: Array(mine.line.utf8)) {
            _ = flock(fd, LOCK_UN)
            close(fd)
            return (.acquired, .record(mine))
        }
        // A read-only lock file (read-only filesystem, another owner), or the record could not
        // be written (disk full, quota): keep the flock for the whole refresh instead, so the
        // others still see it busy. (A partial record has no final newline: it reads as no lease.)
        if writable { _ = ftruncate(fd, 0) }
        return (.acquired, .descriptor(fd, until: mine.until))
    }

    /// Ends `hold`. A record is cleared only if the file still holds exactly it: a lease whose
    /// deadline passed may have been taken by another process, whose record stays.
    static func release(_ hold: Hold, name: String, directory path: String) {
        switch hold {
        case .none, .unguarded:
            return
        case .descriptor(let fd, _):
            _ = flock(fd, LOCK_UN)
            close(fd)
        case .record(let mine):
            guard case .opened(let directory) = TrustedDirectory.open(path, create: false),
                case .opened(let fd) = directory.openFile(name, O_RDWR)
            else { return }  // gone or no longer trusted: nothing to clear
            defer { close(fd) }
            // Others hold the flock only to read or write a record (microseconds): wait a
            // little, never for ever (one stopped inside that instant). Given up, the record
            // stays until its deadline.
            guard WriteLockWait.lockExclusively(fd, patience: releasePatience) == nil else { return }
            if LeaseRecord.parse(readBounded(fd)) == mine {
                _ = ftruncate(fd, 0)
            }
            _ = flock(fd, LOCK_UN)
        }
    }

    /// How long a release waits for another process's record section (on the store worker).
    static let releasePatience = Duration.milliseconds(100)

    /// The file's first `LeaseRecord.maximumSize + 1` bytes at most (one more than a record
    /// may have, so an oversized file is seen as such).
    static func readBounded(_ fd: Int32) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: LeaseRecord.maximumSize + 1)
        var filled = 0
        while filled < bytes.count {
            let count = bytes.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + filled, $0.count - filled, off_t(filled)) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { break }
            filled += count
        }
        return Array(bytes[..<filled])
    }

    /// Writes `bytes` at the start and cuts the file there. False on any failure.
    private static func replaceContents(_ fd: Int32, with bytes: [UInt8]) -> Bool {
        var written = 0
        while written < bytes.count {
            let count = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress! + written, $0.count - written, off_t(written)) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { return false }
            written += count
        }
        return ftruncate(fd, off_t(bytes.count)) == 0
    }
}
