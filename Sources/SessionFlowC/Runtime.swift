import CLibUV
import CSessionFlow
import Logging
import LoopFlow
import SessionCore
import Synchronization
import SessionFileStore
import SessionOAuth
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

/// One loop and one session, as a C host sees them.
final class Runtime: Sendable {
    /// The number the host holds (as its `sf_runtime *`).
    let id: UInt64
    let loop: EventLoop
    let session: SessionManager
    /// The host's refresher, when it supplied one.
    let authority: HostAuthority?
    let borrowed: Bool
    /// The client and endpoints sign-in flows start from (sf_options).
    let signInBase: SignInBase
    /// The host's log function (sf_options.log), when it gave one.
    let logSink: LogSink?
    /// The runtime's log (the host's function, or standard error).
    let logger: Logger
    private let destroyed = Atomic<Bool>(false)

    init(
        id: UInt64, loop: EventLoop, session: SessionManager, authority: HostAuthority?, borrowed: Bool,
        signInBase: SignInBase, logSink: LogSink?, logger: Logger
    ) {
        self.logger = logger
        self.id = id
        self.loop = loop
        self.session = session
        self.authority = authority
        self.borrowed = borrowed
        self.signInBase = signInBase
        self.logSink = logSink
    }

    /// Marks the runtime destroyed; true for the one caller that got there first.
    func claimDestruction() -> Bool {
        !destroyed.exchange(true, ordering: .acquiringAndReleasing)
    }

    /// For calls that wait for an answer: a borrowed loop answers only on its own thread.
    var synchronousCallsAllowed: Bool {
        !borrowed || loop.inEventLoop
    }
}

let runtimes = HandleTable<Runtime>(.runtime)

/// The one place a C `sf_runtime *` is resolved: runs `body` with the runtime behind
/// `pointer` and returns its result (a thrown session error as its C code). NULL is
/// SF_EINVAL; an unknown or destroyed runtime is SF_ECLOSED (`body` then never runs).
func withRuntime(_ pointer: OpaquePointer?, _ body: (Runtime) throws(SessionError) -> Int32) -> Int32 {
    guard let id = handle(of: pointer) else { return SF_EINVAL.code }
    // A handle of another kind (a refresh request's, a subscription's) finds nothing, like
    // an unknown one.
    guard let runtime = runtimes.lookup(id) else { return SF_ECLOSED.code }
    do {
        return try body(runtime)
    } catch {
        explain(error.message)
        return errorCode(error)
    }
}

/// The library's logger for C hosts: the host's log function (sf_options.log) at the level it
/// chose; without one, warnings and above to standard error, more with SESSIONFLOW_LOG=debug
/// (or trace, info, notice), escaped as the host's lines are. Never a token (the session redacts).
func makeLogger(_ sink: LogSink? = nil, level: Logger.Level = .info) -> Logger {
    if let sink {
        return Logger(label: "sessionflow", factory: { HostLogHandler(label: $0, sink: sink, logLevel: level) })
    }
    let chosen = getenv("SESSIONFLOW_LOG").flatMap { Logger.Level(rawValue: String(cString: $0)) } ?? .warning
    var logger = Logger(label: "sessionflow", factory: { HostLogHandler(label: $0, sink: nil, logLevel: chosen) })
    logger.logLevel = chosen
    return logger
}

/// Makes the runtime on `loop` (already running or about to be) and publishes its handle.
/// Only a runtime that is published takes ownership of `refresh_userdata`: its teardown
/// closes the host's refresher and then runs `refresh_release`. A failure calls nothing.
private func makeRuntime(
    loop: EventLoop, options: sf_options, borrowed: Bool, logger: Logger, logSink: LogSink?,
    out: UnsafeMutablePointer<OpaquePointer?>
) -> Int32 {
    guard let configuration = configuration(from: options, logger: logger),
        let authority = try? authority(from: options, loop: loop),
        let key = try? storeKey(from: options)
    else {
        return SF_EINVAL.code
    }
    let store: any CredentialStore = string(options.store_directory).map { FileCredentialStore(directory: $0, key: key) }
        ?? MemoryCredentialStore()
    let session: SessionManager
    do {
        session = try SessionManager(loop: loop, authority: authority, store: store, configuration: configuration)
    } catch {
        explain(error.message)
        return errorCode(error)
    }
    let host = authority as? HostAuthority
    let release = RefreshRelease(function: options.refresh_release, userdata: UserData(pointer: options.refresh_userdata))
    // Registered after the session's own hook, so it runs after the session has failed its
    // waiters and stopped its timers: the host's refresher is closed for good, then released.
    // Sign-ins still running end first (on_done SF_ESHUTDOWN, release), their flows stopped.
    // A borrowed loop's host hears nothing after the teardown (an owned runtime's destroy
    // closes the log once the store's last work has landed too).
    guard loop.addTeardownHook({ endSignIns(on: loop) }),
        loop.addTeardownHook({ host?.close(); release() }),
        !borrowed || loop.addFinalHook({ logSink?.close() })
    else { return SF_ESHUTDOWN.code }
    let base = SignInBase(options)
    let runtime = runtimes.insert { id in
        Runtime(
            id: id, loop: loop, session: session, authority: host, borrowed: borrowed, signInBase: base,
            logSink: logSink, logger: logger)
    }
    out.pointee = pointer(for: runtime.id)
    return SF_OK.code
}

/// Reads the options, makes the loop, then the runtime; a failure leaves nothing behind.
private func create(
    _ options: UnsafePointer<sf_options>?, _ out: UnsafeMutablePointer<OpaquePointer?>?, borrowed: Bool,
    makeLoop: (Logger) throws(LoopFlowError) -> EventLoop
) -> Int32 {
    guard let out else {
        explain("out is NULL")
        return SF_EINVAL.code
    }
    guard let options = readOptions(options) else {
        let size = options?.pointee.size ?? 0
        let problem = "sf_options.size is \(size), not the size of a released sf_options (use sf_options_init)"
        explain(problem)
        makeLogger().error("sf_runtime_create: SF_EINVAL: \(problem)")
        return SF_EINVAL.code
    }
    let logSink = options.log.map { LogSink(function: $0, userdata: options.log_userdata) }
    guard let level = Logger.Level(cLevel: options.log_level) else {
        let problem = "sf_options.log_level is \(options.log_level), not an sf_log_level (SF_LOG_TRACE…SF_LOG_CRITICAL)"
        explain(problem)
        makeLogger().error("sf_runtime_create: SF_EINVAL: \(problem)")
        return SF_EINVAL.code
    }
    let logger = makeLogger(logSink, level: level)
    guard optionsAreUsable(options, logger: logger) else {
        logSink?.close()
        return SF_EINVAL.code
    }
    let loop: EventLoop
    do {
        loop = try makeLoop(logger)
    } catch {
        explain("the loop: \(error.message)")
        logSink?.close()
        return SF_EINVAL.code
    }
    let result = makeRuntime(
        loop: loop, options: options, borrowed: borrowed, logger: logger, logSink: logSink, out: out)
    if result != SF_OK.code {
        _ = try? loop.shutdown()
        logSink?.close()
    }
    return result
}

@c @implementation
public func sf_runtime_create(
    _ options: UnsafePointer<sf_options>!, _ out: UnsafeMutablePointer<OpaquePointer?>!
) -> Int32 {
    api("sf_runtime_create") {
        create(options, out, borrowed: false) { logger throws(LoopFlowError) in
            try EventLoop(name: "sessionflow", logger: logger)
        }
    }
}

@c @implementation
public func sf_runtime_create_on_loop(
    _ uvLoop: UnsafeMutablePointer<uv_loop_s>!, _ options: UnsafePointer<sf_options>!,
    _ out: UnsafeMutablePointer<OpaquePointer?>!
) -> Int32 {
    api("sf_runtime_create_on_loop") {
        guard let uvLoop else {
            explain("loop is NULL")
            return SF_EINVAL.code
        }
        return create(options, out, borrowed: true) { logger throws(LoopFlowError) in
            try EventLoop(borrowing: uvLoop, logger: logger)
        }
    }
}

@c @implementation
public func sf_runtime_start(_ pointer: OpaquePointer!) -> Int32 {
    api("sf_runtime_start") {
        withRuntime(pointer) { runtime throws(SessionError) in
            try runtime.session.start()
            return SF_OK.code
        }
    }
}

@c @implementation
public func sf_runtime_destroy(_ runtime: OpaquePointer!) -> Int32 {
    api("sf_runtime_destroy") { destroy(runtime, nil) }
}

@c @implementation
public func sf_runtime_destroy_report(_ pointer: OpaquePointer!, _ unclosed: UnsafeMutablePointer<Int>!) -> Int32 {
    api("sf_runtime_destroy_report") { destroy(pointer, unclosed) }
}

private func destroy(_ pointer: OpaquePointer?, _ unclosed: UnsafeMutablePointer<Int>?) -> Int32 {
    guard pointer != nil else { return SF_OK.code }  // destroy(NULL) is a no-op
    return withRuntime(pointer) { target in
        // From inside the runtime's log function: its teardown would wait for that function.
        guard target.logSink?.isWritingOnThisThread != true else {
            explain("called from inside the runtime's log function: it would wait for itself")
            return SF_EBUSY.code
        }
        if target.borrowed {
            guard target.loop.inEventLoop else {
                explain("a runtime on the host's loop is destroyed on the thread that runs that loop")
                return SF_ETHREAD.code
            }
        } else {
            guard !target.loop.inEventLoop else {
                explain("called on the runtime's own loop thread (from a callback): it would wait for itself")
                return SF_EBUSY.code
            }
        }
        guard target.claimDestruction(), runtimes.remove(target.id) != nil else { return SF_ECLOSED.code }
        // From here the host's refresher is never called again and its open requests are
        // SF_ECLOSED; the teardown (below, or on a borrowed loop's next iteration) closes it
        // once more on the loop thread and then runs `refresh_release`.
        target.authority?.close()
        let report: EventLoop.ShutdownReport
        do {
            report = try target.loop.shutdown()
        } catch {
            return SF_ESHUTDOWN.code
        }
        unclosed?.pointee = report.unclosedSubscriptions
        // The store's last writes (a logout's clear, say) run on the session's store worker:
        // an owned runtime's destroy returns once they have landed, so a host may exit next.
        // (A borrowed runtime's destroy runs on the host's loop thread, which never waits for
        // the store: they land on the worker thread shortly after.)
        if !target.borrowed {
            target.session.waitForStoreWork()
            target.logSink?.close()
        }
        return SF_OK.code
    }
}
