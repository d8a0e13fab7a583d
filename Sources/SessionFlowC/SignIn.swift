import CSessionFlow
import FoundationEssentials
import LoopFlow
import SessionCore
import SessionOAuth

// The sign-in flows of the C API (sf_session_sign_in_device, sf_session_sign_in_browser,
// sf_sign_in_cancel): translation only. sf_sign_in_options become a SessionOAuth
// SignInSequence (discovery, the flow, the session signed in, one cancel); its prompts and
// outcome become the host's sf_sign_in_observer calls; the handle maps to its SignInHandle.

/// Running sign-ins by handle. An entry goes when its on_done is called (or the runtime's
/// teardown ends it); a handle is never reused.
let signIns = HandleTable<SignInRecord>(.signIn)

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
                withOptionalCString(browser.startURL?.absoluteString) { start in
                    c.authorization_url = authorization
                    c.redirect_uri = redirect
                    c.start_url = start
                    withUnsafePointer(to: c) { prompt($0) }
                }
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

/// Which C function started the sign-in.
enum SignInKind: Sendable {
    case device
    case browser
}

// MARK: - Starting

/// The host's options, read up to the size it declared, over the defaults.
func readSignInOptions(_ options: UnsafePointer<sf_sign_in_options>?) -> sf_sign_in_options? {
    var result = sf_sign_in_options()
    sf_sign_in_options_init(&result)
    guard let options else { return result }
    let declared = options.pointee.size
    // One size so far: no_start_page took the padding after replace_unreadable_store in 0.2.0
    // (unreleased, and a breaking release for C hosts: they are rebuilt against its header;
    // sf_sign_in_options_init writes the field, and C's initializers zero a field not named).
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
    options.timeout_ms == 0 ? BrowserAuthorization.defaultTimeout : .milliseconds(options.timeout_ms)
}

/// The longest `timeout_ms` taken (a day).
let maximumBrowserTimeout: Int64 = 86_400_000

/// Where the flow's configuration comes from, checked before anything starts.
func configurationSource(
    _ kind: SignInKind, _ options: sf_sign_in_options, _ base: SignInBase
) throws(SignInOptionError) -> SignInSequence.Source {
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
        return .issuer(SignInSequence.Issuer(
            issuer, clientID: clientID, clientSecret: base.clientSecret, scope: scope,
            deviceAuthorizationEndpoint: device, authorizationEndpoint: authorization, dpop: base.dpop))
    }
    guard var configuration = base.configuration else {
        throw SignInOptionError(
            field: "sf_options.token_endpoint", reason: "is not set, and neither is sf_sign_in_options.issuer (no endpoints)")
    }
    configuration.scope = scope
    configuration.dpop = base.dpop
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

/// The flow, reporting its prompt to `record`.
func method(_ kind: SignInKind, _ options: sf_sign_in_options, record: SignInRecord) -> SignInSequence.Method {
    switch kind {
    case .device: .device { prompt in record.prompt(prompt) }
    case .browser:
        .browser(timeout: browserTimeout(options), startPage: options.no_start_page == 0) { prompt in record.prompt(prompt) }
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
        let source: SignInSequence.Source
        do throws(SignInOptionError) {
            source = try configurationSource(kind, options, runtime.signInBase)
        } catch {
            refuse(name, pointer, "\(error.field) \(error.reason)")
            return SF_EINVAL.code
        }
        guard runtime.session.state.value != .loggedIn else { return SF_ESTATE.code }
        let record = signIns.insert { id in SignInRecord(id: id, loop: runtime.loop, callbacks: callbacks) }
        let sequence = SignInSequence(source, method: method(kind, options, record: record), scope: string(options.scope))
        let session = runtime.session
        let replacing = options.replace_unreadable_store != 0
        // Before the flow can call anything: a callback on the loop thread may read the
        // host's variable `out` points to (to cancel, or to tell its sign-ins apart).
        out.pointee = record.id
        do {
            // On the loop, so that a refusal (the loop shutting down) is known here and calls nothing.
            try runtime.loop.execute {
                record.markStarted()
                let handle = sequence.signIn(session, replacingUnreadableStore: replacing) { result in
                    record.finish(result)
                }
                record.attach(handle)
            }
        } catch {
            _ = signIns.remove(record.id)
            out.pointee = 0
            return SF_ESHUTDOWN.code
        }
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
        replace_unreadable_store: 0,
        no_start_page: 0)
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
