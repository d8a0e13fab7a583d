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
/// (or trace, info, notice). Never a token (the session redacts).
func makeLogger(_ sink: LogSink? = nil, level: Logger.Level = .info) -> Logger {
    if let sink {
        return Logger(label: "sessionflow", factory: { HostLogHandler(label: $0, sink: sink, logLevel: level) })
    }
    var logger = Logger(label: "sessionflow", factory: { StreamLogHandler.standardError(label: $0) })
    if let level = getenv("SESSIONFLOW_LOG").flatMap({ Logger.Level(rawValue: String(cString: $0)) }) {
        logger.logLevel = level
    } else {
        logger.logLevel = .warning
    }
    return logger
}

/// The sizes of `sf_options` in the released headers, oldest first: each field group added
/// since (min_refresh_interval_ms; the built-in OAuth client and the store; refresh_release;
/// start_manually; refresh_cancel; the store key; issuer; log) ends one.
let releasedOptionsSizes: [Int] = [
    MemoryLayout<sf_options>.offset(of: \.min_refresh_interval_ms)!,
    MemoryLayout<sf_options>.offset(of: \.token_endpoint)!,
    MemoryLayout<sf_options>.offset(of: \.refresh_release)!,
    MemoryLayout<sf_options>.offset(of: \.start_manually)!,
    MemoryLayout<sf_options>.offset(of: \.refresh_cancel)!,
    MemoryLayout<sf_options>.offset(of: \.store_key)!,
    MemoryLayout<sf_options>.offset(of: \.issuer)!,
    MemoryLayout<sf_options>.offset(of: \.log)!,
    MemoryLayout<sf_options>.size,
]

/// The options the host gave, read up to the size it declared (older hosts pass a
/// shorter struct: one of `releasedOptionsSizes`, anything else is nil), over the defaults.
func readOptions(_ options: UnsafePointer<sf_options>?) -> sf_options? {
    var result = sf_options()
    sf_options_init(&result)
    guard let options else { return result }
    let declared = options.pointee.size
    guard acceptedSize(declared, releasedOptionsSizes) else { return nil }
    let count = declared
    withUnsafeMutableBytes(of: &result) { target in
        target.copyMemory(from: UnsafeRawBufferPointer(start: options, count: count))
    }
    result.size = MemoryLayout<sf_options>.size
    return result
}

func configuration(from options: sf_options, logger: Logger) -> SessionConfiguration? {
    var configuration = SessionConfiguration()
    configuration.policy.margin = .milliseconds(options.refresh_margin_ms)
    configuration.policy.timeout = .milliseconds(options.refresh_timeout_ms)
    configuration.policy.initialBackoff = .milliseconds(options.min_backoff_ms)
    configuration.policy.maximumBackoff = .milliseconds(options.max_backoff_ms)
    configuration.policy.minimumInterval = .milliseconds(options.min_refresh_interval_ms)
    // The same check the session makes (RefreshPolicy.problem), answered here as SF_EINVAL.
    if let problem = configuration.policy.problem {
        explain(problem)
        return nil
    }
    configuration.startsAutomatically = options.start_manually == 0
    configuration.logger = logger
    return configuration
}

/// The built-in OAuth 2.0 authority's configuration, when the host names a token endpoint
/// and no refresher of its own; nil when it does not. Unusable settings throw (said in the
/// log: SF_EINVAL alone would not tell the host which field is wrong).
func oauthConfiguration(from options: sf_options) throws(OAuthConfigurationError) -> OAuthConfiguration? {
    guard options.refresh == nil, let tokenEndpoint = string(options.token_endpoint) else { return nil }
    func url(_ text: String, _ field: String) throws(OAuthConfigurationError) -> URL {
        guard let url = URL(string: text) else { throw OAuthConfigurationError(field: field, reason: "is not a URL") }
        return url
    }
    var oauth = OAuthConfiguration(
        tokenEndpoint: try url(tokenEndpoint, "token endpoint"),
        clientID: string(options.client_id) ?? "", clientSecret: string(options.client_secret).map(Secret.init))
    oauth.scope = string(options.scope)
    if let revocation = string(options.revocation_endpoint) {
        oauth.revocationEndpoint = try url(revocation, "revocation endpoint")
    }
    if let introspection = string(options.introspection_endpoint) {
        oauth.introspectionEndpoint = try url(introspection, "introspection endpoint")
    }
    try oauth.validate()
    return oauth
}

/// The issuer of `sf_options.issuer`, checked (a URL with the transport rule, no query or
/// fragment), or nil when it is not set.
func issuer(from options: sf_options) throws(OAuthConfigurationError) -> URL? {
    guard let text = string(options.issuer) else { return nil }
    guard !text.isEmpty, let url = URL(string: text) else { throw OAuthConfigurationError(field: "issuer", reason: "is not a URL") }
    _ = try OAuthDiscovery.wellKnownLocations(url)
    return url
}

/// The built-in authority from `sf_options.issuer` alone (no refresher, no token endpoint):
/// its configuration's client, scope and limits, the endpoints left to discovery.
func issuerTemplate(from options: sf_options) throws(OAuthConfigurationError) -> (URL, OAuthConfiguration)? {
    guard options.refresh == nil, string(options.token_endpoint) == nil, let issuer = try issuer(from: options) else {
        return nil
    }
    guard let clientID = string(options.client_id), !clientID.isEmpty else {
        throw OAuthConfigurationError(field: "client id", reason: "is not set (the issuer's authority needs the client)")
    }
    var template = OAuthConfiguration(
        tokenEndpoint: issuer, clientID: clientID, clientSecret: string(options.client_secret).map(Secret.init))
    template.scope = string(options.scope)
    return (issuer, template)
}

/// The host's refresher if it gave one; else the built-in OAuth 2.0 authority if it named
/// a token endpoint, or an issuer (endpoints discovered on first use); else a refresher that
/// answers "not configured".
func authority(from options: sf_options, loop: EventLoop) throws(OAuthConfigurationError) -> any SessionAuthority {
    if let oauth = try oauthConfiguration(from: options) {
        return try OAuthAuthority(oauth, loop: loop)
    }
    if let (issuer, template) = try issuerTemplate(from: options) {
        return try IssuerAuthority(issuer: issuer, template: template, loop: loop)
    }
    return HostAuthority(
        refresh: options.refresh, cancel: options.refresh_cancel, userdata: UserData(pointer: options.refresh_userdata))
}

/// Whether the options can make a runtime; an unusable setting is logged by name, and said
/// (sf_last_error_message).
func optionsAreUsable(_ options: sf_options, logger: Logger) -> Bool {
    guard configuration(from: options, logger: logger) != nil else { return false }
    do {
        _ = try oauthConfiguration(from: options)
        _ = try issuer(from: options)
        _ = try issuerTemplate(from: options)
        _ = try storeKey(from: options)
        return true
    } catch {
        // The field by its C name: "sf_options.token_endpoint uses plain http to a host...".
        let field = "sf_options." + error.field.replacing(" ", with: "_")
        logger.error("sf_runtime_create: SF_EINVAL: \(field) \(error.reason)")
        explain("\(field) \(error.reason)")
        return false
    }
}

@c @implementation
public func sf_options_init(_ options: UnsafeMutablePointer<sf_options>!) {
    guard let options else { return }
    options.pointee = sf_options(
        size: MemoryLayout<sf_options>.size,
        refresh_margin_ms: 300_000,
        refresh_timeout_ms: 30_000,
        min_backoff_ms: 1_000,
        max_backoff_ms: 30_000,
        refresh: nil,
        refresh_userdata: nil,
        min_refresh_interval_ms: 10_000,
        token_endpoint: nil,
        client_id: nil,
        client_secret: nil,
        scope: nil,
        revocation_endpoint: nil,
        introspection_endpoint: nil,
        store_directory: nil,
        refresh_release: nil,
        start_manually: 0,
        refresh_cancel: nil,
        store_key: nil,
        store_key_size: 0,
        store_key_file: nil,
        store_key_source: 0,
        issuer: nil,
        log: nil,
        log_userdata: nil,
        log_level: Int32(SF_LOG_INFO.rawValue))
}

/// The store's key as the options say (`store_key`, `store_key_file`, `store_key_source`);
/// unusable settings throw, naming the field. The key bytes are copied here, during create.
func storeKey(from options: sf_options) throws(OAuthConfigurationError) -> FileCredentialStore.Key {
    let hasKey = options.store_key != nil || options.store_key_size != 0
    let keyFile = string(options.store_key_file)
    if hasKey || keyFile != nil, options.store_directory == nil {
        throw OAuthConfigurationError(
            field: hasKey ? "store key" : "store key file", reason: "is set without store_directory (there is no store to key)")
    }
    if hasKey && keyFile != nil {
        throw OAuthConfigurationError(field: "store key", reason: "and store_key_file are both set (give one)")
    }
    if hasKey {
        guard let bytes = options.store_key else {
            throw OAuthConfigurationError(field: "store key", reason: "is NULL with store_key_size \(options.store_key_size)")
        }
        guard options.store_key_size != 0 else {
            throw OAuthConfigurationError(field: "store key size", reason: "is 0 with store_key set (a 256-bit key: 32)")
        }
        guard options.store_key_size == 32 else {
            throw OAuthConfigurationError(
                field: "store key size", reason: "is \(options.store_key_size), not 32 (a 256-bit key) or 0 (no key)")
        }
        return .provided(copying: UnsafeRawBufferPointer(start: bytes, count: 32))
    }
    if let keyFile {
        do {
            return try FileCredentialStore.Key.fromFile(keyFile)
        } catch {
            throw OAuthConfigurationError(field: "store key file", reason: "cannot be used: \(error.message)")
        }
    }
    switch options.store_key_source {
    case SF_STORE_KEY_AUTOMATIC: return .automatic
    case SF_STORE_KEY_FILE: return .keyFile
    case SF_STORE_KEY_SECRET_SERVICE: return .secretService
    default:
        throw OAuthConfigurationError(
            field: "store key source", reason: "is \(options.store_key_source), not one of SF_STORE_KEY_AUTOMATIC, SF_STORE_KEY_FILE, SF_STORE_KEY_SECRET_SERVICE")
    }
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
