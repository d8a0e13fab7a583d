import FoundationEssentials
import LoopFlow
import SessionCore

/// The built-in OAuth 2.0 authority for a host that knows only its issuer: the endpoints come
/// from discovery (`OAuthDiscovery`, RFC 8414 / OpenID Connect), fetched on the loop the first
/// time the session needs the authority (a refresh, a revocation, a validation) and kept for
/// the authority's life. Until then nothing is sent; a discovery that fails fails the call
/// that needed it (no answer, HTTP 408/429/5xx as `transient`, so the session retries with
/// backoff; a refused document or another status as `configuration`) and the next call
/// discovers again.
///
/// Loop-confined: every `SessionAuthority` call comes on the session's loop thread.
public final class IssuerAuthority: SessionAuthority, @unchecked Sendable {
    public let issuer: URL
    /// The client and limits the discovered configuration gets (its endpoints are replaced).
    public let template: OAuthConfiguration
    private let loop: EventLoop

    // Loop-confined.
    private var ready: OAuthAuthority?
    private var waiters: [(UInt64, @Sendable (Result<OAuthAuthority, AuthorityError>) -> Void)] = []
    private var nextWaiter: UInt64 = 0
    private var discovery: (any SignInCancellable)?
    /// Which discovery is the current one (a cancelled one's late answer is ignored).
    private var generation: UInt64 = 0

    /// - Parameter template: the client id (and secret, scope, timeouts, answer limit); its
    ///   endpoints are ignored.
    /// - Throws: for an issuer that breaks the transport rule or has a query or fragment.
    public init(issuer: URL, template: OAuthConfiguration, loop: EventLoop) throws(OAuthConfigurationError) {
        _ = try OAuthDiscovery.wellKnownLocations(issuer)
        guard !template.clientID.isEmpty else { throw OAuthConfigurationError(field: "client id", reason: "is empty") }
        self.issuer = issuer
        self.template = template
        self.loop = loop
    }

    /// The authority discovery made, once it has (loop thread; tests).
    public var discovered: OAuthAuthority? { ready }

    /// Runs `body` with the discovered authority, discovering first if needed (loop thread).
    /// Returns a token for `forget` while it waits, nil when it ran at once.
    @discardableResult
    private func withAuthority(
        _ body: @escaping @Sendable (Result<OAuthAuthority, AuthorityError>) -> Void
    ) -> UInt64? {
        loop.assertInEventLoop()
        if let ready {
            body(.success(ready))
            return nil
        }
        nextWaiter += 1
        let token = nextWaiter
        waiters.append((token, body))
        if discovery == nil { discover() }
        return token
    }

    /// A waiter that no longer wants the authority (its call was cancelled).
    private func forget(_ token: UInt64) -> Bool {
        guard let index = waiters.firstIndex(where: { $0.0 == token }) else { return false }
        waiters.remove(at: index)
        if waiters.isEmpty, let running = discovery {
            discovery = nil
            generation += 1
            running.cancel()
        }
        return true
    }

    private func discover() {
        generation += 1
        let current = generation
        // Its completion runs once, on a later loop turn — or at once when the loop is shut
        // down: then it has been answered before `configuration` returns, and is not kept.
        let running = OAuthDiscovery.configuration(
            issuer: issuer, clientID: template.clientID, loop: loop, clientSecret: template.clientSecret,
            requestTimeout: template.requestTimeout, maximumAnswerSize: template.maximumAnswerSize
        ) { [self] result in
            guard current == generation else { return }  // cancelled: a newer one runs, or none
            generation += 1  // answered: this run is over
            discovered(result)
        }
        if current == generation { discovery = running }
    }

    private func discovered(_ result: Result<OAuthConfiguration, OAuthDiscoveryError>) {
        discovery = nil
        let outcome: Result<OAuthAuthority, AuthorityError>
        switch result {
        case .success(var configuration):
            configuration.scope = template.scope
            configuration.defaultLifetime = template.defaultLifetime
            configuration.dpop = template.dpop
            do {
                let authority = try OAuthAuthority(configuration, loop: loop)
                ready = authority
                outcome = .success(authority)
            } catch {
                outcome = .failure(.configuration("discovery", "the discovered configuration is refused: \(error)"))
            }
        case .failure(let error) where error.kind == .cancelled:
            outcome = .failure(.cancelled)
        case .failure(let error) where error.isTransient:
            outcome = .failure(.transient("discovery of \(issuer.absoluteString): \(error.message)"))
        case .failure(let error):
            outcome = .failure(.configuration("discovery", "discovery of \(issuer.absoluteString): \(error.message)"))
        }
        let waiting = waiters
        waiters = []
        for (_, body) in waiting { body(outcome) }
    }

    /// Waits for the authority with `completion` cancellable meanwhile: a cancel before the
    /// discovery ended answers `cancelled` and `start` never runs; after, `start` owns the
    /// completion (and its cancellation).
    private func run<Output: Sendable>(
        _ completion: AuthorityCompletion<Output>,
        _ start: @escaping @Sendable (OAuthAuthority, AuthorityCompletion<Output>) -> Void
    ) {
        if let ready { return start(ready, completion) }
        // The inner completion is the one the discovered authority answers (and registers its
        // cancellation on); the outer one's cancel reaches it.
        let inner = AuthorityCompletion<Output>.relaying(to: completion)
        let waiting = withAuthority { result in
            switch result {
            case .success(let authority):
                if inner.isCancellationRequested {
                    inner.fail(.cancelled)
                } else {
                    start(authority, inner)
                }
            case .failure(let error):
                inner.fail(error)
            }
        }
        let token = LockedBox<UInt64?>(waiting)
        completion.onCancel { [self] in
            if let waiting = token.withLockedValue({ $0 }), forget(waiting) {
                inner.fail(.cancelled)  // still discovering: nothing was sent with the token
            } else {
                inner.requestCancellation()
            }
        }
    }

    public func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
        run(completion) { authority, inner in authority.refresh(request, completion: inner) }
    }

    /// Unknown until discovery: assumed, and a document without a revocation endpoint makes
    /// `revoke` a success that sent nothing.
    public var canRevoke: Bool { ready?.canRevoke ?? true }

    public func revoke(refreshToken: Secret?, accessToken: Secret?, completion: AuthorityCompletion<Void>) {
        run(completion) { authority, inner in
            if authority.canRevoke {
                authority.revoke(refreshToken: refreshToken, accessToken: accessToken, completion: inner)
            } else {
                inner.succeed(())
            }
        }
    }

    /// Unknown until discovery: assumed; a document without an introspection endpoint answers
    /// `validate` with the same configuration error an authority without one gives.
    public var canValidate: Bool { ready?.canValidate ?? true }

    public func validate(accessToken: Secret, completion: AuthorityCompletion<Bool>) {
        run(completion) { authority, inner in authority.validate(accessToken: accessToken, completion: inner) }
    }
}
