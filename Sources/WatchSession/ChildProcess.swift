import FoundationEssentials
import Glibc

/// The children of watch-session: `exec`'s command (waited for, its status passed on) and the
/// browser `login --browser` opens (`BrowserOpener`).
enum ChildProcess {
    enum Status {
        case exited(Int32)
        case signalled(Int32)
        case notStarted(String)
    }

    /// Runs `argv` (looked up on PATH) with our environment plus `extra` (`NAME=value`, which
    /// replace ours of the same names) and waits for it. Ctrl-C and SIGTERM go to the child (the
    /// terminal sends SIGINT to the whole group) and are ignored here meanwhile. The copies of
    /// the environment made for it are zeroed after (`extra` may hold a token).
    static func run(_ argv: [String], environment extra: [String]) -> Status {
        let names = Set(extra.compactMap { $0.split(separator: "=", maxSplits: 1).first.map(String.init) })
        var environment = ProcessInfo.processInfo.environment
            .filter { !names.contains($0.key) }
            .map { "\($0.key)=\($0.value)" }
        environment += extra
        let cArguments = argv.map { strdup($0) } + [nil]
        let cEnvironment = environment.map { strdup($0) } + [nil]
        defer {
            for argument in cArguments { free(argument) }
            for variable in cEnvironment {
                if let variable { memset(variable, 0, strlen(variable)) }
                free(variable)
            }
        }
        let previousInt = signal(SIGINT, SIG_IGN)
        let previousTerm = signal(SIGTERM, SIG_IGN)
        defer {
            signal(SIGINT, previousInt)
            signal(SIGTERM, previousTerm)
        }
        var pid: pid_t = 0
        let spawned = withAttributes(newProcessGroup: false) { attributes in
            posix_spawnp(&pid, argv[0], nil, attributes, cArguments, cEnvironment)
        }
        guard spawned == 0 else { return .notStarted(String(cString: strerror(spawned))) }
        let status = wait(pid)
        let low = status & 0x7F
        return low == 0 ? .exited((status >> 8) & 0xFF) : .signalled(low)
    }

    /// The spawn attributes of every child: SIGINT, SIGTERM and SIGPIPE back to their default
    /// handling and no signal blocked, whatever this process ignores or blocks; with
    /// `newProcessGroup`, a process group of its own (a Ctrl-C on the terminal does not reach it).
    static func withAttributes<T>(newProcessGroup: Bool, _ body: (UnsafePointer<posix_spawnattr_t>) -> T) -> T {
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var defaults = sigset_t()
        sigemptyset(&defaults)
        sigaddset(&defaults, SIGINT)
        sigaddset(&defaults, SIGTERM)
        sigaddset(&defaults, SIGPIPE)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        var none = sigset_t()
        sigemptyset(&none)
        posix_spawnattr_setsigmask(&attributes, &none)
        var flags = POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK
        if newProcessGroup {
            posix_spawnattr_setpgroup(&attributes, 0)
            flags |= POSIX_SPAWN_SETPGROUP
        }
        posix_spawnattr_setflags(&attributes, Int16(flags))
        return body(&attributes)
    }

    /// Waits for `pid` to end (through EINTR); its wait status.
    @discardableResult
    static func wait(_ pid: pid_t) -> Int32 {
        var status: Int32 = 0
        while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
        return status
    }
}
