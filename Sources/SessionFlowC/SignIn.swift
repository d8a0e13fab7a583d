import CSessionFlow
import FoundationEssentials
import LoopFlow
import SessionCore
import SessionOAuth

// The sign-in flows of the C API (sf_session_sign_in_device, sf_session_sign_in_browser,
// sf_sign_in_cancel): a SessionOAuth flow, perhaps preceded by discovery, run through
// SessionManager.signIn(with:completion:), its outcome handed to the host's observer.

/// Running sign-ins by handle. An entry goes when its on_done is called (or the runtime's
/// teardown ends it); a handle is never reused.
let signIns = HandleTable<SignInRecord>(.signIn)

/// What a runtime's sf_options say about sign-in flows: the client, and the endpoints when
/// a token endpoint is named (whether or not the host refreshes itself).
struct SignInBase: Sendable {
    var configuration: OAuthConfiguration?
    var clientID: String?
    var clientSecret: Secret?
    var scope: String?
    /// `sf_options.issuer`: the issuer of flows that name none.
    var issuer: URL?

    init(_ options: sf_options) {
        var plain = options
        plain.refresh = nil  // the endpoints are wanted even when the host refreshes itself
        configuration = (try? oauthConfiguration(from: plain)) ?? nil
        clientID = string(options.client_id).flatMap { $0.isEmpty ? nil : $0 }
        clientSecret = string(options.client_secret).map(Secret.init)
        scope = string(options.scope)
        issuer = (try? SessionFlowC.issuer(from: options)) ?? nil
    }
}

struct SignInCallbacks: @unchecked Sendable {
    let observer: sf_sign_in_observer
}

/// One sign-in as the host sees it: its handle, its observer, whether it was cancelled or
/// is done. Callbacks run on the loop thread; `cancel()` from any thread.
final class SignInRecord: Sendable {
    let id: UInt64
    let loop: EventLoop
    private let callbacks: SignInCallbacks

    private struct Progress {
        /// The starting call's job ran on the loop: the sign-in is the runtime's to end.
        var started = false
        var cancelled = false
        var done = false
        var handle: SignInHandle?
    }

    private let progress = LockedBox(Progress())

    init(id: UInt64, loop: EventLoop, callbacks: SignInCallbacks) {
        self.id = id
        self.loop = loop
        self.callbacks = callbacks
    }

    /// Any thread: stops the flow. False when cancelled already or done.
    func cancel() -> Bool {
        let (first, handle) = progress.withLockedValue { progress -> (Bool, SignInHandle?) in
            guard !progress.done, !progress.cancelled else { return (false, nil) }
            progress.cancelled = true
            return (true, progress.handle)
        }
        handle?.cancel()
        return first
    }

    /// Loop thread, first thing in the starting call's job.
    func markStarted() {
        progress.withLockedValue { $0.started = true }
    }

    /// Loop thread: the session's handle of this sign-in (cancelled at once if the host
    /// cancelled before it existed).
    func attach(_ handle: SignInHandle) {
        let cancelled = progress.withLockedValue { progress -> Bool in
            if !progress.done { progress.handle = handle }
            return progress.cancelled
        }
        if cancelled { handle.cancel() }
    }

    /// Loop thread: on_prompt, unless cancelled or done.
    func prompt(_ prompt: UnsafePointer<sf_sign_in_prompt>) {
        guard let onPrompt = callbacks.observer.on_prompt else { return }
        guard progress.withLockedValue({ !$0.cancelled && !$0.done }) else { return }
        onPrompt(prompt, callbacks.observer.userdata)
    }

    func prompt(_ device: DevicePrompt) {
        var c = sf_sign_in_prompt()
        c.size = MemoryLayout<sf_sign_in_prompt>.size
        c.expires_in_ms = milliseconds(device.expiresIn)
        c.interval_ms = milliseconds(device.interval)
        device.userCode.withCString { userCode in
            device.verificationURI.absoluteString.withCString { uri in
                withOptionalCString(device.verificationURIComplete?.absoluteString) { complete in
                    c.user_code = userCode
                    c.verification_uri = uri
                    c.verification_uri_complete = complete
                    withUnsafePointer(to: c) { prompt($0) }
                }
            }
        }
    }

    func prompt(_ browser: BrowserPrompt) {
        var c = sf_sign_in_prompt()
        c.size = MemoryLayout<sf_sign_in_prompt>.size
        c.expires_in_ms = milliseconds(browser.timeout)
        c.interval_ms = -1
        browser.authorizationURL.absoluteString.withCString { authorization in
            browser.redirectURI.absoluteString.withCString { redirect in
                c.authorization_url = authorization
                c.redirect_uri = redirect
                withUnsafePointer(to: c) { prompt($0) }
            }
        }
    }

    /// Loop thread, the first time only: the handle goes, then on_done, then release.
    func finish(_ code: Int32, _ message: String) {
        let first = progress.withLockedValue { progress -> Bool in
            guard !progress.done else { return false }
            progress.done = true
            progress.handle = nil
            return true
        }
        guard first else { return }
        _ = signIns.remove(id)
        let observer = callbacks.observer
        message.withCString { observer.on_done?(code, $0, observer.userdata) }
        observer.release?(observer.userdata)
    }

    func finish(_ result: Result<Void, SessionError>) {
        switch result {
        case .success: finish(SF_OK.code, "")
        case .failure(let error): finish(errorCode(error), error.message)
        }
    }

    /// Loop thread, at the runtime's teardown: ends the sign-in (SF_ESHUTDOWN) and its flow.
    /// One whose job never ran is not touched: every job the loop accepted has run before the
    /// teardown hooks, so its starting call was refused (SF_ESHUTDOWN, nothing called).
    func end() {
        let (started, handle) = progress.withLockedValue { ($0.started, $0.handle) }
        guard started else { return }
        finish(SF_ESHUTDOWN.code, "the runtime was destroyed before the sign-in finished")
        handle?.cancel()
    }
}

/// Loop thread, at a runtime's teardown: every sign-in still running on `loop` ends.
func endSignIns(on loop: EventLoop) {
    for record in signIns.removeAll(where: { $0.loop === loop }) {
        record.end()
    }
}

// MARK: - Flows

enum SignInKind: Sendable {
    case device
    case browser
}

/// Where a flow's configuration comes from: known at the start, or discovered from an issuer.
enum ConfigurationSource: Sendable {
    case configured(OAuthConfiguration)
    case issuer(URL, clientID: String, clientSecret: Secret?, scope: String?,
                deviceEndpoint: URL?, authorizationEndpoint: URL?)
}

/// A flow that first gets its configuration (discovery, when an issuer is given), then makes
/// and runs the real flow. Keeps `SignInFlow`'s contract: one completion, on the loop thread,
/// never inside `start` or `cancel`.
final class ConfiguredSignIn: SignInFlow {
    let source: ConfigurationSource
    let make: @Sendable (OAuthConfiguration) throws(OAuthConfigurationError) -> any SignInFlow

    init(source: ConfigurationSource, make: @escaping @Sendable (OAuthConfiguration) throws(OAuthConfigurationError) -> any SignInFlow) {
        self.source = source
        self.make = make
    }

    func start(
        on loop: EventLoop, completion: @escaping @Sendable (Result<SessionTokens, SessionError>) -> Void
    ) -> any SignInCancellable {
        let run = ConfiguredRun(flow: self, loop: loop, completion: completion)
        run.begin()
        return run
    }
}

private final class ConfiguredRun: SignInCancellable, Sendable {
    let flow: ConfiguredSignIn
    let loop: EventLoop
    let completion: @Sendable (Result<SessionTokens, SessionError>) -> Void

    private struct Progress {
        var cancelled = false
        var finished = false
        var inner: (any SignInCancellable)?
    }

    private let progress = LockedBox(Progress())

    init(flow: ConfiguredSignIn, loop: EventLoop, completion: @escaping @Sendable (Result<SessionTokens, SessionError>) -> Void) {
        self.flow = flow
        self.loop = loop
        self.completion = completion
    }

    /// Loop thread (inside `start`).
    func begin() {
        switch flow.source {
        case .configured(let configuration):
            startInner(configuration)
        case .issuer(let issuer, let clientID, let clientSecret, let scope, let device, let authorization):
            let discovery = OAuthDiscovery.configuration(
                issuer: issuer, clientID: clientID, loop: loop, clientSecret: clientSecret
            ) { [self] result in
                let (cancelled, finished) = progress.withLockedValue { ($0.cancelled, $0.finished) }
                if finished { return }
                if cancelled { return finish(.failure(SessionError(.cancelled, "the sign-in was cancelled"))) }
                switch result {
                case .failure(let error):
                    let code: SessionError.Code = error.kind == .network ? .transient : .configuration
                    let member = error.field.map { " (\($0))" } ?? ""
                    finish(.failure(SessionError(code, "discovery at \(issuer.absoluteString)\(member): \(error.message)")))
                case .success(var configuration):
                    if let scope { configuration.scope = scope }
                    if let device { configuration.deviceAuthorizationEndpoint = device }
                    if let authorization { configuration.authorizationEndpoint = authorization }
                    startInner(configuration, discovered: true)
                }
            }
            // Cancelled meanwhile (the discovery's answer comes on a later turn): its request
            // is ended, and no fallback is fetched.
            let cancelled = progress.withLockedValue { progress -> Bool in
                if !progress.cancelled && progress.inner == nil { progress.inner = discovery }
                return progress.cancelled
            }
            if cancelled { discovery.cancel() }
        }
    }

    /// Loop thread: makes and starts the flow itself.
    private func startInner(_ configuration: OAuthConfiguration, discovered: Bool = false) {
        let inner: any SignInFlow
        do {
            inner = try flow.make(configuration)
        } catch {
            let origin = discovered ? "the issuer's metadata: " : ""
            let field = error.field.replacing(" ", with: "_")
            return finish(.failure(SessionError(.configuration, "\(origin)the \(field) \(error.reason)")))
        }
        let running = inner.start(on: loop) { [self] outcome in finish(outcome) }
        let cancelled = progress.withLockedValue { progress -> Bool in
            if !progress.cancelled { progress.inner = running }
            return progress.cancelled
        }
        if cancelled { running.cancel() }
    }

    /// Any thread.
    func cancel() {
        let (first, inner) = progress.withLockedValue { progress -> (Bool, (any SignInCancellable)?) in
            guard !progress.cancelled, !progress.finished else { return (false, nil) }
            progress.cancelled = true
            return (true, progress.inner)
        }
        guard first else { return }
        if let inner {
            inner.cancel()  // it completes (cancelled) on a later turn: `finish`
        } else {
            finish(.failure(SessionError(.cancelled, "the sign-in was cancelled")))
        }
    }

    /// Once; the completion on a later loop turn (never inside `start` or `cancel`).
    private func finish(_ result: Result<SessionTokens, SessionError>) {
        let first = progress.withLockedValue { progress -> Bool in
            guard !progress.finished else { return false }
            progress.finished = true
            progress.inner = nil
            return true
        }
        guard first else { return }
        let completion = completion
        do {
            try loop.execute { completion(result) }
        } catch {
            // The loop is being torn down: no later turn (the runtime's teardown ends the sign-in).
            if loop.inEventLoop { completion(result) }
        }
    }
}

// MARK: - Starting

/// The host's options, read up to the size it declared, over the defaults.
func readSignInOptions(_ options: UnsafePointer<sf_sign_in_options>?) -> sf_sign_in_options? {
    var result = sf_sign_in_options()
    sf_sign_in_options_init(&result)
    guard let options else { return result }
    let declared = options.pointee.size
    // One released layout so far.
    guard acceptedSize(declared, [MemoryLayout<sf_sign_in_options>.size]) else { return nil }
    let count = declared
    withUnsafeMutableBytes(of: &result) { target in
        target.copyMemory(from: UnsafeRawBufferPointer(start: options, count: count))
    }
    result.size = MemoryLayout<sf_sign_in_options>.size
    return result
}

/// A setting that cannot start a sign-in, named by its C field.
struct SignInOptionError: Error {
    let field: String
    let reason: String
}

/// The browser flow's timeout: 0 is the default (5 minutes).
func browserTimeout(_ options: sf_sign_in_options) -> Duration {
    .milliseconds(options.timeout_ms == 0 ? 300_000 : options.timeout_ms)
}

/// The longest `timeout_ms` taken (a day).
let maximumBrowserTimeout: Int64 = 86_400_000

/// Where the flow's configuration comes from, checked before anything starts.
func configurationSource(
    _ kind: SignInKind, _ options: sf_sign_in_options, _ base: SignInBase
) throws(SignInOptionError) -> ConfigurationSource {
    func url(_ text: UnsafePointer<CChar>?, _ field: String) throws(SignInOptionError) -> URL? {
        guard let text = string(text) else { return nil }
        guard let url = URL(string: text), !text.isEmpty else { throw SignInOptionError(field: field, reason: "is not a URL") }
        return url
    }
    func named(_ error: OAuthConfigurationError) -> SignInOptionError {
        let field = error.field.replacing(" ", with: "_")
        let local = ["issuer", "device_authorization_endpoint", "authorization_endpoint"].contains(field)
        return SignInOptionError(field: (local ? "sf_sign_in_options." : "sf_options.") + field, reason: error.reason)
    }
    if kind == .browser, options.timeout_ms < 0 || options.timeout_ms > maximumBrowserTimeout {
        throw SignInOptionError(
            field: "sf_sign_in_options.timeout_ms", reason: "is \(options.timeout_ms), not 0 (the default) ... \(maximumBrowserTimeout)")
    }
    let device = try url(options.device_authorization_endpoint, "sf_sign_in_options.device_authorization_endpoint")
    let authorization = try url(options.authorization_endpoint, "sf_sign_in_options.authorization_endpoint")
    let scope = string(options.scope) ?? base.scope
    if let issuer = try url(options.issuer, "sf_sign_in_options.issuer") ?? base.issuer {
        guard let clientID = base.clientID else {
            throw SignInOptionError(field: "sf_options.client_id", reason: "is not set (discovery from an issuer needs the client)")
        }
        do {
            _ = try OAuthDiscovery.wellKnownLocations(issuer)
            // The endpoints given beside the issuer must meet the same rule.
            var template = OAuthConfiguration(tokenEndpoint: issuer, clientID: clientID)
            template.deviceAuthorizationEndpoint = device
            template.authorizationEndpoint = authorization
            try template.validate()
        } catch {
            throw named(error)
        }
        return .issuer(issuer, clientID: clientID, clientSecret: base.clientSecret, scope: scope,
                       deviceEndpoint: device, authorizationEndpoint: authorization)
    }
    guard var configuration = base.configuration else {
        throw SignInOptionError(
            field: "sf_options.token_endpoint", reason: "is not set, and neither is sf_sign_in_options.issuer (no endpoints)")
    }
    configuration.scope = scope
    switch kind {
    case .device:
        guard let device else {
            throw SignInOptionError(
                field: "sf_sign_in_options.device_authorization_endpoint", reason: "is not set, and neither is the issuer")
        }
        configuration.deviceAuthorizationEndpoint = device
    case .browser:
        guard let authorization else {
            throw SignInOptionError(
                field: "sf_sign_in_options.authorization_endpoint", reason: "is not set, and neither is the issuer")
        }
        configuration.authorizationEndpoint = authorization
    }
    do {
        try configuration.validate()
    } catch {
        throw named(error)
    }
    return .configured(configuration)
}

/// The flow itself, made from a configuration, reporting its prompt to `record`.
func flowMaker(
    _ kind: SignInKind, _ options: sf_sign_in_options, record: SignInRecord
) -> @Sendable (OAuthConfiguration) throws(OAuthConfigurationError) -> any SignInFlow {
    let scope = string(options.scope)
    switch kind {
    case .device:
        return { configuration throws(OAuthConfigurationError) in
            try DeviceAuthorization(configuration, scope: scope ?? configuration.scope) { prompt in record.prompt(prompt) }
        }
    case .browser:
        let timeout = browserTimeout(options)
        return { configuration throws(OAuthConfigurationError) in
            try BrowserAuthorization(configuration, scope: scope ?? configuration.scope, timeout: timeout) { prompt in
                record.prompt(prompt)
            }
        }
    }
}

/// sf_session_sign_in_device and sf_session_sign_in_browser.
private func startSignIn(
    _ kind: SignInKind, _ name: String, _ pointer: OpaquePointer?, _ options: UnsafePointer<sf_sign_in_options>?,
    _ observer: UnsafePointer<sf_sign_in_observer>?, _ out: UnsafeMutablePointer<sf_sign_in>?
) -> Int32 {
    guard let observer, let out else { return SF_EINVAL.code }
    guard let options = readSignInOptions(options) else {
        refuse(
            name, pointer,
            "sf_sign_in_options.size is \(options?.pointee.size ?? 0), not the size of a released sf_sign_in_options (use sf_sign_in_options_init)")
        return SF_EINVAL.code
    }
    let callbacks = SignInCallbacks(observer: observer.pointee)
    return withRuntime(pointer) { runtime in
        let source: ConfigurationSource
        do throws(SignInOptionError) {
            source = try configurationSource(kind, options, runtime.signInBase)
        } catch {
            refuse(name, pointer, "\(error.field) \(error.reason)")
            return SF_EINVAL.code
        }
        guard runtime.session.state.value != .loggedIn else { return SF_ESTATE.code }
        let record = signIns.insert { id in SignInRecord(id: id, loop: runtime.loop, callbacks: callbacks) }
        let flow = ConfiguredSignIn(source: source, make: flowMaker(kind, options, record: record))
        let session = runtime.session
        let replacing = options.replace_unreadable_store != 0
        do {
            // On the loop, so that a refusal (the loop shutting down) is known here and calls nothing.
            try runtime.loop.execute {
                record.markStarted()
                let handle = session.signIn(with: flow, replacingUnreadableStore: replacing) { result in
                    record.finish(result)
                }
                record.attach(handle)
            }
        } catch {
            _ = signIns.remove(record.id)
            return SF_ESHUTDOWN.code
        }
        out.pointee = record.id
        return SF_OK.code
    }
}

@c @implementation
public func sf_sign_in_options_init(_ options: UnsafeMutablePointer<sf_sign_in_options>!) {
    guard let options else { return }
    options.pointee = sf_sign_in_options(
        size: MemoryLayout<sf_sign_in_options>.size,
        issuer: nil,
        device_authorization_endpoint: nil,
        authorization_endpoint: nil,
        scope: nil,
        timeout_ms: 300_000,
        replace_unreadable_store: 0)
}

@c @implementation
public func sf_session_sign_in_device(
    _ pointer: OpaquePointer!, _ options: UnsafePointer<sf_sign_in_options>!,
    _ observer: UnsafePointer<sf_sign_in_observer>!, _ out: UnsafeMutablePointer<sf_sign_in>!
) -> Int32 {
    api("sf_session_sign_in_device") {
        startSignIn(.device, "sf_session_sign_in_device", pointer, options, observer, out)
    }
}

@c @implementation
public func sf_session_sign_in_browser(
    _ pointer: OpaquePointer!, _ options: UnsafePointer<sf_sign_in_options>!,
    _ observer: UnsafePointer<sf_sign_in_observer>!, _ out: UnsafeMutablePointer<sf_sign_in>!
) -> Int32 {
    api("sf_session_sign_in_browser") {
        startSignIn(.browser, "sf_session_sign_in_browser", pointer, options, observer, out)
    }
}

@c @implementation
public func sf_sign_in_cancel(_ signIn: sf_sign_in) -> Int32 {
    api("sf_sign_in_cancel") {
        guard signIn != 0, let record = signIns.lookup(signIn) else { return SF_ECLOSED.code }
        return record.cancel() ? SF_OK.code : SF_ECLOSED.code
    }
}
