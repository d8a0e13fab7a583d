import FoundationEssentials
import LoopFlow
import SessionCore
import Synchronization

/// What the sign-in flows (`DeviceAuthorization`, `BrowserAuthorization`) share: one run's
/// request in flight, its cancellation from any thread, the member id lookup after the tokens,
/// and the single completion on a later loop turn. Loop-confined state; `cancel()` from any
/// thread. Subclasses disarm their own timers and listeners in `cleanUp()`.
class SignInRun: SignInCancellable, @unchecked Sendable {
    let loop: EventLoop
    let configuration: OAuthConfiguration
    private let completion: @Sendable (Result<SessionTokens, SessionError>) -> Void
    /// The run's DPoP key (RFC 9449), made for this sign-in when the configuration signs in
    /// with DPoP (a new key at every sign-in): every token-endpoint request carries a proof by
    /// it, and the session keeps it when the tokens are bound to it (`token_type` DPoP).
    let dpopKey: DPoPKey?
    /// Set by `cancel()` on any thread: checked before every request, so none starts after it.
    private let cancelRequested = Atomic<Bool>(false)

    // Loop-confined.
    var authority: OAuthAuthority?
    private(set) var finished = false
    private var call: (any HTTPCancellable)?
    /// The loop's teardown ends a run still going (`shutDown`): its timers are stopped
    /// without firing and its listener closed, so nothing else would. Removed at `finish`.
    private var hook: UInt64?

    init(
        loop: EventLoop, configuration: OAuthConfiguration,
        completion: @escaping @Sendable (Result<SessionTokens, SessionError>) -> Void
    ) {
        self.loop = loop
        self.configuration = configuration
        self.completion = completion
        self.dpopKey = configuration.signsInWithDPoP ? DPoPKey.generate() : nil
    }

    /// Loop thread, first thing in a run's `begin()`: false when the loop is already tearing
    /// down (the run has then finished with `shutDown`).
    final func watchTeardown() -> Bool {
        hook = loop.addRemovableTeardownHook { [weak self] in
            self?.finish(.failure(SessionError(.shutDown, "the event loop shut down during the sign-in")))
        }
        if hook == nil { finish(.failure(SessionError(.shutDown, "the event loop is shut down"))) }
        return hook != nil
    }

    final func cancel() {
        cancelRequested.store(true, ordering: .releasing)
        if loop.inEventLoop {
            finish(.failure(Self.cancelled))  // once: `finish` does nothing the second time
        } else {
            // If the loop no longer takes work, its teardown hook ends the run.
            try? loop.execute { [self] in finish(.failure(Self.cancelled)) }
        }
    }

    static var cancelled: SessionError { SessionError(.cancelled, "the sign-in was cancelled") }

    /// Whether `cancel()` was called (any thread).
    final var isCancelled: Bool { cancelRequested.load(ordering: .acquiring) }

    /// Loop thread: the authority for the run's requests (false: the run has finished with the error).
    final func makeAuthority() -> Bool {
        do {
            authority = try OAuthAuthority(configuration, loop: loop)
            return true
        } catch {
            finish(.failure(SessionError(.configuration, "\(error)")))
            return false
        }
    }

    /// Loop thread: POSTs `form` to `url` (client id and secret added) as the run's one request
    /// in flight, ended at once if the run was cancelled meanwhile. `done` runs unless the run
    /// has finished by then.
    final func post(
        _ url: URL, form: [(String, FormValue)], secrets: [Secret],
        _ done: @escaping @Sendable (Result<HTTPAnswer, AuthorityError>) -> Void
    ) {
        send(done) { authority, answered in authority.post(url, form: form, secrets: secrets, answered) }
    }

    /// Loop thread: `post` to the token endpoint, with a DPoP proof by the run's key (and the
    /// one nonce retry) when it has one.
    final func tokenPost(
        form: [(String, FormValue)], secrets: [Secret],
        _ done: @escaping @Sendable (Result<HTTPAnswer, AuthorityError>) -> Void
    ) {
        send(done) { [configuration, dpopKey] authority, answered in
            authority.tokenPost(configuration.tokenEndpoint, form: form, secrets: secrets, dpop: dpopKey, answered)
        }
    }

    /// The grant of the token endpoint's answer, and whether it is bound to the run's DPoP key
    /// (a bearer answer to a proof: the configuration error `dpop_ignored` under
    /// `DPoPMode.required`, bearer tokens under `.ifSupported`).
    final func grant(from answer: HTTPAnswer) -> Result<(TokenGrant, bound: Bool), AuthorityError> {
        OAuthAuthority.grant(
            from: answer, dpop: dpopKey, required: configuration.dpop == .required,
            defaultLifetime: configuration.defaultLifetime)
    }

    /// Loop thread: a GET with a bearer token (the userinfo endpoint), as `post` (DPoP-bound
    /// tokens: `Authorization: DPoP` with a proof by `dpop`).
    final func get(
        _ url: URL, bearer: Secret, secrets: [Secret], dpop: DPoPKey? = nil,
        _ done: @escaping @Sendable (Result<HTTPAnswer, AuthorityError>) -> Void
    ) {
        send(done) { authority, answered in authority.get(url, bearer: bearer, secrets: secrets, dpop: dpop, answered) }
    }

    /// What `post` and `get` share: nothing is sent once the run has finished or was cancelled;
    /// the request is the run's one call in flight; its answer reaches `done` unless the run
    /// has finished by then.
    private func send(
        _ done: @escaping @Sendable (Result<HTTPAnswer, AuthorityError>) -> Void,
        _ start: (OAuthAuthority, @escaping @Sendable (Result<HTTPAnswer, AuthorityError>) -> Void) -> any HTTPCancellable
    ) {
        guard let authority, !finished, !isCancelled else { return }
        let started = start(authority) { [self] outcome in
            call = nil
            guard !finished else { return }
            done(outcome)
        }
        call = started
        if isCancelled || finished {
            call = nil
            started.cancel()
        }
    }

    /// Loop thread: the tokens arrived (`answer`: the token endpoint's answer). The member id is
    /// the answer's `member_id` / `user_id` / `sub`; else the introspection's `sub` / `username`
    /// (when an introspection endpoint is configured); else the userinfo endpoint's `sub` /
    /// `preferred_username` (when one is configured). A lookup that fails leaves it unset: the
    /// sign-in goes on. The lifetime counts from when the tokens arrived. The scope is the
    /// answer's `scope`, else `requestedScope` (RFC 6749 §5.1: absent when as requested). A
    /// configuration discovered from an issuer gives the tokens a profile naming it. Tokens
    /// `bound` to the run's DPoP key carry it (`SessionTokens.dpopKey`).
    final func granted(_ grant: TokenGrant, bound: Bool = false, answer: HTTPAnswer, requestedScope: String?) {
        let receivedAt = loop.now
        let key = bound ? dpopKey : nil
        let tokens = SessionTokens(
            accessToken: grant.accessToken, refreshToken: grant.refreshToken, expiresIn: grant.expiresIn,
            memberID: Self.memberID(in: answer.json, keys: ["member_id", "user_id", "sub"]),
            scope: grant.scope ?? TokenResponse.scope(in: requestedScope),
            profile: configuration.issuer.map { issuer in
                SessionProfile(
                    issuer: issuer.absoluteString, clientID: configuration.clientID, requestedScope: requestedScope,
                    grantedScope: grant.scope ?? TokenResponse.scope(in: requestedScope),
                    tokenEndpoint: configuration.tokenEndpoint.absoluteString,
                    revocationEndpoint: configuration.revocationEndpoint?.absoluteString,
                    dpop: configuration.dpop == .off ? nil : configuration.dpop)
            },
            dpopKey: key)
        let secrets = [grant.accessToken] + [grant.refreshToken].compactMap { $0 }
        let done: @Sendable (String?) -> Void = { [self] memberID in
            var signedIn = tokens
            signedIn.memberID = memberID
            signedIn.expiresIn = max(tokens.expiresIn - (loop.now - receivedAt), .zero)
            finish(.success(signedIn))
        }
        let userinfo: @Sendable () -> Void = { [self] in
            guard let endpoint = configuration.userinfoEndpoint else { return done(nil) }
            get(endpoint, bearer: grant.accessToken, secrets: secrets, dpop: key) { outcome in
                guard case .success(let answer) = outcome, answer.status == 200 else { return done(nil) }
                done(Self.memberID(in: answer.json, keys: ["sub", "preferred_username", "username"]))
            }
        }
        guard tokens.memberID == nil else { return finish(.success(tokens)) }
        guard let endpoint = configuration.introspectionEndpoint else { return userinfo() }
        let form: [(String, FormValue)] = [("token", .secret(grant.accessToken)), ("token_type_hint", .text("access_token"))]
        post(endpoint, form: form, secrets: secrets) { outcome in
            if case .success(let answer) = outcome, answer.status == 200,
               let memberID = Self.memberID(in: answer.json, keys: ["sub", "username"]) {
                return done(memberID)
            }
            userinfo()
        }
    }

    /// Subclasses: disarm timers, close listeners (loop thread, once, inside `finish`).
    func cleanUp() {}

    /// Ends the run once: `cleanUp()`, the request in flight ended; the completion runs on a
    /// later loop turn (never inside `start` or `cancel`). After a cancel it says `cancelled`.
    final func finish(_ result: Result<SessionTokens, SessionError>) {
        loop.assertInEventLoop()
        guard !finished else { return }
        finished = true
        if let hook {
            self.hook = nil
            loop.removeTeardownHook(hook)
        }
        cleanUp()
        if let running = call {
            call = nil
            running.cancel()  // its answer handler sees `finished` and does nothing
        }
        let outcome = isCancelled ? .failure(Self.cancelled) : result
        let completion = completion
        // The HTTP client is let go once the ended request's handler has run.
        do {
            try loop.execute { [self] in
                authority = nil
                completion(outcome)
            }
        } catch {
            authority = nil
            completion(outcome)
        }
    }

    /// An error of a request or answer as the session sees it (never a secret: the messages
    /// come from `TokenResponse.error` / the HTTP layer, which scrub them).
    static func failure(_ error: AuthorityError, at endpoint: String) -> SessionError {
        switch error.kind {
        case .transient: SessionError(.transient, "\(endpoint): \(error.message)", retryAfter: error.retryAfter)
        case .terminal, .configuration: SessionError(.configuration, "\(endpoint): \(error.message)")
        }
    }

    /// The first of `keys` that is a plausible member id (a short printable string).
    static func memberID(in object: JSONObject?, keys: [String]) -> String? {
        for key in keys {
            guard let value = object?[key]?.string, !value.isEmpty, value.utf8.count <= 256,
                  value.unicodeScalars.allSatisfy({ $0.value >= 0x20 && $0.value != 0x7F })
            else { continue }
            return value
        }
        return nil
    }
}
