import Foundation
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import Testing

@testable import SessionFileStore

#if canImport(Glibc)
import Glibc
#endif

// Helpers of the crash-consistency and store-fault tests: child processes (the
// session-probe executable), small tmpfs mounts, and a SessionManager whose events are kept.

var runningAsRoot: Bool { geteuid() == 0 }

func errnoDescription() -> String { String(cString: strerror(errno)) }

struct SetupFailure: Error, CustomStringConvertible {
    let description: String
}

/// A child process whose stdout and stderr come back through one pipe, line by line.
/// posix_spawn rather than Foundation's Process: the test needs the pid to SIGKILL at an
/// exact moment, and a channel no other child inherits (close-on-exec), so EOF comes at its death.
/// Unchecked Sendable: one test uses it at a time — its blocking waits are handed to a thread
/// of their own (`offThePool`) while the test awaits them, never run by two threads at once.
final class ChildProcess: @unchecked Sendable {
    let pid: pid_t
    private let output: Int32
    /// Our end of the child's stdin, when it was given one (`input: true`); else it inherits ours.
    private var input: Int32 = -1
    private var buffer: [UInt8] = []
    private var ended = false
    private var status: Int32?
    /// Every line read so far.
    private(set) var lines: [String] = []

    init(_ executable: String, _ arguments: [String], input withInput: Bool = false) throws {
        var fds: [Int32] = [-1, -1]
        var inputFDs: [Int32] = [-1, -1]
        // A socket pair, made close-on-exec atomically (pipe2 is not visible from Swift).
        let kind = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
        guard socketpair(AF_UNIX, kind, 0, &fds) == 0 else {
            throw SetupFailure(description: "socketpair: \(errnoDescription())")
        }
        if withInput && socketpair(AF_UNIX, kind, 0, &inputFDs) != 0 {
            close(fds[0])
            close(fds[1])
            throw SetupFailure(description: "socketpair: \(errnoDescription())")
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, fds[1], 1)
        posix_spawn_file_actions_adddup2(&actions, fds[1], 2)
        if withInput { posix_spawn_file_actions_adddup2(&actions, inputFDs[1], 0) }
        let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
        let environment: [UnsafeMutablePointer<CChar>?] =
            ProcessInfo.processInfo.environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for pointer in argv { free(pointer) }
            for pointer in environment { free(pointer) }
        }
        // The child starts with no signal blocked: the test process's threads block some
        // (SIGTERM among them), and a spawned child inherits the mask — a daemon it starts
        // (dbus-daemon, gnome-keyring-daemon) could then never be terminated.
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var empty = sigset_t()
        sigemptyset(&empty)
        posix_spawnattr_setsigmask(&attributes, &empty)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK))
        var child: pid_t = 0
        let rc = posix_spawn(&child, executable, &actions, &attributes, argv, environment)
        close(fds[1])
        if withInput { close(inputFDs[1]) }
        guard rc == 0 else {
            close(fds[0])
            if withInput { close(inputFDs[0]) }
            throw SetupFailure(description: "posix_spawn \(executable): \(String(cString: strerror(rc)))")
        }
        pid = child
        output = fds[0]
        input = inputFDs[0]
    }

    /// Writes `line` and a newline to the child's stdin (made with `input: true`).
    func send(_ line: String) {
        precondition(input >= 0, "the child was made without input")
        let bytes = Array((line + "\n").utf8)
        var written = 0
        while written < bytes.count {
            let count = bytes.withUnsafeBytes { Glibc.send(input, $0.baseAddress! + written, $0.count - written, Int32(MSG_NOSIGNAL)) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { return }  // the child is gone: it will not answer
            written += count
        }
    }

    deinit {
        if status == nil {
            Glibc.kill(pid, SIGKILL)
            _ = waitForExit()
        }
        close(output)
        if input >= 0 { close(input) }
    }

    /// The next line, or nil at end of output or after `timeout`.
    func nextLine(timeout: Duration = .seconds(10)) -> String? {
        let deadline = ContinuousClock.now + timeout
        while true {
            if let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: buffer[..<newline], as: UTF8.self)
                buffer.removeSubrange(...newline)
                lines.append(line)
                return line
            }
            if ended { return nil }
            let remaining = deadline - ContinuousClock.now
            guard remaining > .zero else { return nil }
            let milliseconds = Int32(clamping: remaining.components.seconds * 1000 + remaining.components.attoseconds / 1_000_000_000_000_000 + 1)
            var descriptor = pollfd(fd: output, events: Int16(POLLIN), revents: 0)
            let ready = poll(&descriptor, 1, milliseconds)
            if ready < 0 && errno != EINTR { ended = true }
            if ready > 0 { fill() }
        }
    }

    /// Reads until a line satisfies `condition`; nil at end of output or timeout.
    func waitForLine(timeout: Duration = .seconds(10), where condition: (String) -> Bool) -> String? {
        let deadline = ContinuousClock.now + timeout
        while let line = nextLine(timeout: deadline - ContinuousClock.now) {
            if condition(line) { return line }
        }
        return nil
    }

    /// Everything the process printed until it exits (its end of the pipe closes).
    func readToEnd(timeout: Duration = .seconds(30)) -> [String] {
        let deadline = ContinuousClock.now + timeout
        while nextLine(timeout: deadline - ContinuousClock.now) != nil {}
        if !buffer.isEmpty {  // a last line without its newline (killed mid-write)
            lines.append(String(decoding: buffer, as: UTF8.self))
            buffer.removeAll()
        }
        return lines
    }

    func kill(_ signal: Int32 = SIGKILL) {
        Glibc.kill(pid, signal)
    }

    /// The raw wait status.
    @discardableResult
    func waitForExit() -> Int32 {
        if let status { return status }
        var raw: Int32 = 0
        while waitpid(pid, &raw, 0) < 0 && errno == EINTR {}
        status = raw
        return raw
    }

    private func fill() {
        var chunk = [UInt8](repeating: 0, count: 4096)
        let count = chunk.withUnsafeMutableBytes { Glibc.read(output, $0.baseAddress, $0.count) }
        if count > 0 {
            buffer.append(contentsOf: chunk[0..<count])
        } else if count == 0 || errno != EINTR {
            ended = true
        }
    }
}

/// Runs a session-probe and returns everything it printed (it is given 30 s).
func runSessionProbe(_ arguments: [String]) throws -> (lines: [String], status: Int32) {
    let child = try ChildProcess(sessionProbeExecutable(), arguments)
    let lines = child.readToEnd()
    let raw = child.waitForExit()
    return (lines, (raw & 0x7f) == 0 ? (raw >> 8) & 0xff : 128 + (raw & 0x7f))
}

/// Blocking work on a thread of its own, so the test does not hold a concurrency-pool thread
/// (two cores: two pool threads) for its whole run.
func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        let thread = Thread { continuation.resume(with: Result { try body() }) }
        thread.stackSize = 4 << 20
        thread.start()
    }
}

/// A small tmpfs mounted for one test (root with CAP_SYS_ADMIN only). Unmount it with
/// `unmount()` in a `defer`; the deinit does it too.
final class TmpfsMount {
    let path: String
    private var mounted = false

    /// Throws (with the reason) where mounting is not permitted; the tests then take a
    /// fallback. SESSIONFLOW_TEST_NO_MOUNT=1 forces the fallbacks (to test them as root).
    init(size: String) throws(SetupFailure) {
        if ProcessInfo.processInfo.environment["SESSIONFLOW_TEST_NO_MOUNT"] != nil {
            throw SetupFailure(description: "SESSIONFLOW_TEST_NO_MOUNT is set")
        }
        var template = Array("/tmp/sessionflow-tmpfs-XXXXXX".utf8CString)
        guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
            throw SetupFailure(description: "mkdtemp: \(errnoDescription())")
        }
        path = String(cString: made)
        guard mount("tmpfs", path, "tmpfs", 0, "size=\(size),mode=0755") == 0 else {
            let reason = "mount tmpfs: \(errnoDescription())"
            rmdir(path)
            throw SetupFailure(description: reason)
        }
        mounted = true
    }

    /// `mount -o remount,ro`.
    /// EBUSY is retried: a child another test spawns (fork, then exec) briefly holds copies of
    /// this process's descriptors, a store file's among them, until its exec closes them.
    func remountReadOnly() throws(SetupFailure) {
        for _ in 0..<100 {
            if mount("tmpfs", path, "tmpfs", UInt(MS_REMOUNT | MS_RDONLY), nil) == 0 { return }
            guard errno == EBUSY else { break }
            usleep(20_000)
        }
        throw SetupFailure(description: "remount ro: \(errnoDescription())")
    }

    func unmount() {
        if mounted {
            // Lazily if something still holds it open (a store's lock file descriptor).
            if umount2(path, 0) != 0 { umount2(path, Int32(MNT_DETACH)) }
            mounted = false
            rmdir(path)
        }
    }

    deinit { unmount() }
}

/// An authority that never answers successfully: the fault tests exercise only the store.
struct OfflineAuthority: SessionAuthority {
    func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
        completion.fail(.transient("offline"))
    }
}

/// An authority that counts refreshes and grants new tokens.
final class GrantingAuthority: SessionAuthority, @unchecked Sendable {
    private let count = LockedBox(0)
    var refreshes: Int { count.withLockedValue { $0 } }

    func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
        let n = count.withLockedValue { value in
            value += 1
            return value
        }
        completion.succeed(TokenGrant(
            accessToken: Secret("granted-access-\(n)"), refreshToken: Secret("granted-refresh-\(n)"),
            expiresIn: .seconds(3600)))
    }
}

/// A SessionManager on its own loop over `store`, its events kept from the first one (the
/// shared harness, the store retried every 100 ms).
func observedSession<Authority: SessionAuthority, Store: CredentialStore>(
    store: Store, authority: Authority
) async throws -> SessionHarness<Authority, Store> {
    try await SessionHarness(loopName: "store-fault", authority: authority, store: store) { configuration in
        configuration.storeRetryInterval = .milliseconds(100)
    }
}

/// The same on an authority that never answers successfully.
func observedSession<Store: CredentialStore>(store: Store) async throws -> SessionHarness<OfflineAuthority, Store> {
    try await observedSession(store: store, authority: OfflineAuthority())
}

func tokens(_ member: String, access: String = sentinelAccess, refresh: String = sentinelRefresh) -> SessionTokens {
    SessionTokens(accessToken: Secret(access), refreshToken: Secret(refresh), expiresIn: .seconds(3600), memberID: member)
}

/// The store's member and access token, for comparisons (expiry differs run to run).
func summary(of read: StoreRead) -> String {
    switch read {
    case .present(let session): "present \(session.memberID ?? "nil") \(session.accessToken?.reveal() ?? "nil")"
    case .absent: "absent"
    case .unavailable(let error): "unavailable: \(error.message)"
    case .damaged(let error): "damaged: \(error.message)"
    }
}

/// Directory 0700, store and key files 0600, and no secret in the file in plaintext.
func expectPrivateAndEncrypted(
    _ store: FileCredentialStore, secrets: [String], sourceLocation: SourceLocation = #_sourceLocation
) {
    #expect(mode(store.directory) == 0o700, sourceLocation: sourceLocation)
    #expect(mode(store.path) == 0o600, sourceLocation: sourceLocation)
    if access(store.keyPath, F_OK) == 0 {
        #expect(mode(store.keyPath) == 0o600, sourceLocation: sourceLocation)
    }
    let bytes = contents(store.path)
    #expect(!bytes.isEmpty, sourceLocation: sourceLocation)
    let text = String(decoding: bytes, as: UTF8.self)
    for secret in secrets {
        #expect(!text.contains(secret), "a secret is in the store file in plaintext", sourceLocation: sourceLocation)
    }
}
