import FoundationEssentials
import LoopFlow
import SessionCore

/// One sign-in from start to signed in: the configuration (given, or discovered from an
/// issuer), then the chosen flow (device or browser), then the session signed in with its
/// tokens — with one `cancel` that ends whichever phase is running, and one error vocabulary
/// (`Failure`, said to the session as a `SessionError`). The C API and `watch-session` both
/// sign in through it: they translate their settings into one and its outcome into their own
/// words, and run no sequence of their own.
///
/// As a `SignInFlow` it keeps that contract: one completion, on the loop thread, never inside
/// `start` or `cancel`; after `cancel()` no request is sent and the completion says
/// `cancelled`.
public struct SignInSequence: SignInFlow {
    /// The flow, and where it shows the user what to do (on the loop thread).
    public enum Method: Sendable {
        /// The device authorization grant (RFC 8628).
        case device(prompt: @Sendable (DevicePrompt) -> Void)
        /// The authorization code grant with PKCE on a loopback redirect, waiting `timeout` at most;
        /// `startPage` as `BrowserAuthorization`'s (false: no start URL, show the authorization URL).
        case browser(
            timeout: Duration = BrowserAuthorization.defaultTimeout, startPage: Bool = true,
            prompt: @Sendable (BrowserPrompt) -> Void)
    }

    /// An issuer to discover the endpoints from (RFC 8414, else OpenID Connect Discovery),
    /// and what is laid over what it says.
    public struct Issuer: Sendable {
        public var url: URL
        public var clientID: String
        public var clientSecret: Secret?
        /// Replaces the configuration's scope when set.
        public var scope: String?
        /// Replace the discovered endpoints when set.
        public var deviceAuthorizationEndpoint: URL?
        public var authorizationEndpoint: URL?
        /// DPoP (RFC 9449) for the sign-in's tokens (see `DPoPMode`).
        public var dpop: DPoPMode

        public init(
            _ url: URL, clientID: String, clientSecret: Secret? = nil, scope: String? = nil,
            deviceAuthorizationEndpoint: URL? = nil, authorizationEndpoint: URL? = nil, dpop: DPoPMode = .off
        ) {
            self.dpop = dpop
            self.url = url
            self.clientID = clientID
            self.clientSecret = clientSecret
            self.scope = scope
            self.deviceAuthorizationEndpoint = deviceAuthorizationEndpoint
            self.authorizationEndpoint = authorizationEndpoint
        }
    }

    /// Where the configuration comes from.
    public enum Source: Sendable {
        case configured(OAuthConfiguration)
        case issuer(Issuer)
    }

    /// Why no flow could start: the words every host starts from.
    public enum Failure: Error, Sendable {
        /// Discovery at the issuer failed (no answer, a refused document...).
        case discovery(OAuthDiscoveryError, issuer: URL)
        /// The configuration (`discovered`: the issuer's metadata) cannot make the flow.
        case unusable(OAuthConfigurationError, discovered: Bool)

        /// As the session (and the C API) says it: a discovery that got no answer is
        /// `transient`, anything else `configuration`.
        public var sessionError: SessionError {
            switch self {
            case .discovery(let error, let issuer):
                let code: SessionError.Code = error.kind == .network ? .transient : .configuration
                let member = error.field.map { " (\($0))" } ?? ""
                return SessionError(code, "discovery at \(issuer.absoluteString)\(member): \(error.message)")
            case .unusable(let error, let discovered):
                let origin = discovered ? "the issuer's metadata: " : ""
                return SessionError(.configuration, "\(origin)the \(error.field.replacing(" ", with: "_")) \(error.reason)")
            }
        }
    }

    public let source: Source
    public let method: Method
    /// Requested by the flow (nil: the configuration's).
    public let scope: String?

    public init(_ source: Source, method: Method, scope: String? = nil) {
        self.source = source
        self.method = method
        self.scope = scope
    }

    /// The configuration when it is known without discovery.
    public var configuration: OAuthConfiguration? {
        if case .configured(let configuration) = source { return configuration }
        return nil
    }

    /// The flow itself for `configuration` (a fresh one each time: a flow runs once).
    /// - Throws: when the configuration cannot serve the method (its endpoint is missing...).
    public func flow(for configuration: OAuthConfiguration) throws(OAuthConfigurationError) -> any SignInFlow {
        switch method {
        case .device(let prompt):
            try DeviceAuthorization(configuration, scope: scope, onPrompt: prompt)
        case .browser(let timeout, let startPage, let prompt):
            try BrowserAuthorization(configuration, scope: scope, timeout: timeout, startPage: startPage, onPrompt: prompt)
        }
    }

    /// Phase one alone: the configuration, discovered if need be and checked by making the
    /// flow. `completion` runs once on the loop thread: at once for a given configuration, on a
    /// later turn after discovery. The result cancels the discovery (nil: nothing to cancel).
    func resolve(
        on loop: EventLoop,
        completion: @escaping @Sendable (Result<(OAuthConfiguration, any SignInFlow), Failure>) -> Void
    ) -> (any SignInCancellable)? {
        @Sendable func made(_ configuration: OAuthConfiguration, discovered: Bool) -> Result<(OAuthConfiguration, any SignInFlow), Failure> {
            do {
                return .success((configuration, try flow(for: configuration)))
            } catch {
                return .failure(.unusable(error, discovered: discovered))
            }
        }
        switch source {
        case .configured(let configuration):
            completion(made(configuration, discovered: false))
            return nil
        case .issuer(let issuer):
            return OAuthDiscovery.configuration(
                issuer: issuer.url, clientID: issuer.clientID, loop: loop, clientSecret: issuer.clientSecret
            ) { result in
                switch result {
                case .failure(let error):
                    completion(.failure(.discovery(error, issuer: issuer.url)))
                case .success(var configuration):
                    if let scope = issuer.scope { configuration.scope = scope }
                    configuration.dpop = issuer.dpop
                    if let device = issuer.deviceAuthorizationEndpoint { configuration.deviceAuthorizationEndpoint = device }
                    if let authorization = issuer.authorizationEndpoint { configuration.authorizationEndpoint = authorization }
                    completion(made(configuration, discovered: true))
                }
            }
        }
    }

    /// Phase one ahead of time, for a host that needs the configuration before its session
    /// exists (`watch-session login`: its authority refreshes at the discovered endpoints):
    /// the same sequence with the configuration settled, so each sign-in skips discovery.
    /// Cancelling the calling Task cancels the discovery (`.discovery` with `.cancelled`).
    public func prepared(on loop: EventLoop) async throws(Failure) -> SignInSequence {
        let running = LockedBox<(run: (any SignInCancellable)?, cancelled: Bool)>((nil, false))
        let result = await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let run = resolve(on: loop) { continuation.resume(returning: $0) }
                let cancelled = running.withLockedValue { state -> Bool in
                    state.run = run
                    return state.cancelled
                }
                if cancelled { run?.cancel() }
            }
        } onCancel: {
            running.withLockedValue { state -> (any SignInCancellable)? in
                state.cancelled = true
                return state.run
            }?.cancel()
        }
        let (configuration, _) = try result.get()
        return SignInSequence(.configured(configuration), method: method, scope: scope)
    }

    /// `SignInFlow`: phase one, then the flow; the tokens are the completion's.
    public func start(
        on loop: EventLoop, completion: @escaping @Sendable (Result<SessionTokens, SessionError>) -> Void
    ) -> any SignInCancellable {
        let run = SequenceRun(loop: loop, completion: completion)
        run.begin(self)
        return run
    }

    /// The whole sequence: the flow's tokens sign `session` in. The handle's `cancel()` (any
    /// thread) ends whichever phase runs; `completion` as `SessionManager.signIn(with:)`'s.
    @discardableResult
    public func signIn(
        _ session: SessionManager, replacingUnreadableStore: Bool = false,
        completion: @escaping @Sendable (Result<Void, SessionError>) -> Void
    ) -> SignInHandle {
        session.signIn(with: self, replacingUnreadableStore: replacingUnreadableStore, completion: completion)
    }

    /// The whole sequence, `async`: cancelling the calling Task cancels it.
    public func signIn(_ session: SessionManager, replacingUnreadableStore: Bool = false) async throws(SessionError) {
        try await session.signIn(with: self, replacingUnreadableStore: replacingUnreadableStore)
    }
}

/// One run of a sequence as a flow: the discovery, then the flow, each cancelled by the one
/// `cancel()`. Its state is locked: `cancel()` comes from any thread.
private final class SequenceRun: SignInCancellable, Sendable {
    let loop: EventLoop
    let completion: @Sendable (Result<SessionTokens, SessionError>) -> Void

    private struct Progress {
        var cancelled = false
        var finished = false
        /// What `cancel()` ends: the discovery, then the flow.
        var inner: (any SignInCancellable)?
    }

    private let progress = LockedBox(Progress())

    init(loop: EventLoop, completion: @escaping @Sendable (Result<SessionTokens, SessionError>) -> Void) {
        self.loop = loop
        self.completion = completion
    }

    /// Loop thread (inside `start`).
    func begin(_ sequence: SignInSequence) {
        let discovery = sequence.resolve(on: loop) { [self] result in
            let (cancelled, finished) = progress.withLockedValue { ($0.cancelled, $0.finished) }
            if finished { return }
            if cancelled { return finish(.failure(SignInRun.cancelled)) }
            switch result {
            case .failure(let failure): finish(.failure(failure.sessionError))
            case .success(let (_, flow)): startFlow(flow)
            }
        }
        guard let discovery else { return }
        // Cancelled meanwhile (the discovery's answer comes on a later turn): its request is
        // ended, and no fallback is fetched.
        let cancelled = progress.withLockedValue { progress -> Bool in
            if !progress.cancelled && progress.inner == nil { progress.inner = discovery }
            return progress.cancelled
        }
        if cancelled { discovery.cancel() }
    }

    /// Loop thread.
    private func startFlow(_ flow: any SignInFlow) {
        let running = flow.start(on: loop) { [self] outcome in finish(outcome) }
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
            finish(.failure(SignInRun.cancelled))
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
            // The loop is being torn down: no later turn (the host's teardown ends the sign-in).
            if loop.inEventLoop { completion(result) }
        }
    }
}
