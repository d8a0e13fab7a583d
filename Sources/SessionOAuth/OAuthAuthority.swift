import FoundationEssentials
import LoopFlow
import SessionCore

/// The built-in OAuth 2.0 authority: the refresh_token grant (RFC 6749 §6), revocation (RFC
/// 7009) and introspection (RFC 7662), over the loop's own HTTP client (libcurl's multi
/// interface driven by libuv: every request lives on the loop thread).
///
/// Every request: https only (plain http to loopback hosts for development), no redirect
/// followed (a 3xx is a configuration error naming the status), an overall deadline
/// (`requestTimeout`), `Accept-Encoding: identity`, the answer size limited while it is
/// received, TLS always verified. A refresh can be cancelled (the session does at its
/// timeout): the request then really ends (its connection is closed) before the session
/// may send the refresh token again — unless its answer has started to arrive: once a 2xx
/// status line is in, the server has rotated the refresh token, and only the answer on its way
/// carries the new one. From then on the request is not cancelled at the session's timeout;
/// it ends by itself when no byte arrives for that timeout (a stall) or at four times it from
/// its start (the cap: a token answer is a few kilobytes, so a link still delivering after
/// four timeouts is as good as gone, and the session must not wait on it forever). If the
/// answer is lost anyway, the error is `AuthorityError.answerLost`, and the session sends the
/// same refresh token once more at once (the server's reuse grace).
///
/// Errors (RFC 6749 §5.2): `invalid_grant` is terminal (the session expires);
/// `invalid_client`, `unauthorized_client`, `unsupported_grant_type`, `invalid_scope`,
/// `invalid_request` and other 4xx are configuration errors (never retried automatically);
/// 408, 429, 5xx, network failures, timeouts and unreadable bodies are transient
/// (429/503 honour `Retry-After`).
///
/// DPoP (RFC 9449): a refresh of a session with a DPoP key (`RefreshRequest.dpopKey`) carries
/// a proof by it, retried once with the server's nonce (`DPoPExchange`); its answer must say
/// `token_type` DPoP, else it is the configuration error `dpop_ignored`.
public final class OAuthAuthority: SessionAuthority {
    public let configuration: OAuthConfiguration
    private let http: LoopHTTPClient

    /// An authority whose requests run on `loop` (the session's loop).
    /// - Throws: `OAuthConfigurationError` for an endpoint that is not https (or loopback
    ///   http), or another unusable setting.
    public init(_ configuration: OAuthConfiguration, loop: EventLoop) throws(OAuthConfigurationError) {
        try configuration.validate()
        self.configuration = configuration
        self.http = LoopHTTPClient(loop: loop)
    }

    // MARK: SessionAuthority

    public func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
        var form: [(String, FormValue)] = [("grant_type", .text("refresh_token")), ("refresh_token", .secret(request.refreshToken))]
        if let scope = configuration.scope { form.append(("scope", .text(scope))) }
        // The cap runs from the request's start: four session timeouts, never more — the
        // session's refresh lease is made to outlast it (`SessionEngine.refreshLeaseDuration`:
        // six), so no other process may send the same refresh token while this answer can
        // still land. (It was the HTTP deadline when that was longer: with a refresh timeout
        // under 3.3 s the default 20 s deadline outlived the lease.)
        let rule = request.timeout.map { timeout in
            let cap = timeout * Self.answerCapFactor
            return HTTPRequest.AnswerRule(stall: timeout, cap: cap) { completion.answerArriving(within: cap) }
        }
        let key = request.dpopKey
        let call = tokenPost(
            configuration.tokenEndpoint, form: form, secrets: [request.refreshToken], dpop: key, answerRule: rule
        ) {
            [configuration] outcome in
            completion.complete(outcome.flatMap { response in
                // RFC 6749 §5.1: an answer without `scope` granted the scope asked for; one
                // that asked for none keeps the grant's (nil: the session keeps its own).
                // A DPoP session stays one: a bearer answer to its refresh is refused.
                Self.grant(from: response, dpop: key, required: true, defaultLifetime: configuration.defaultLifetime)
                    .map { grant, _ in
                        var grant = grant
                        if grant.scope == nil { grant.scope = TokenResponse.scope(in: configuration.scope) }
                        return grant
                    }
            })
        }
        completion.onCancel { call.cancel() }
    }

    /// A refresh answer that has started to arrive ends at this many refresh timeouts from the
    /// request's start, whatever still trickles in (see the type's comment).
    public static let answerCapFactor = 4

    /// The grant of a token answer to a request made with a proof by `dpop` (nil: none), and
    /// whether its tokens are DPoP-bound (`token_type` DPoP). A bearer answer to a proof is the
    /// configuration error `dpop_ignored` when `required`, else bearer tokens (false).
    static func grant(
        from answer: HTTPAnswer, dpop: DPoPKey?, required: Bool, defaultLifetime: Duration
    ) -> Result<(TokenGrant, bound: Bool), AuthorityError> {
        guard dpop != nil else {
            return TokenResponse.grant(from: answer, defaultLifetime: defaultLifetime).map { ($0, false) }
        }
        return TokenResponse.grant(from: answer, defaultLifetime: defaultLifetime, acceptsDPoP: true).flatMap { grant in
            let bound = answer.json?["token_type"]?.string?.lowercased() == "dpop"
            if !bound && required {
                return .failure(.configuration(
                    "dpop_ignored", "the token endpoint answered token_type Bearer to a DPoP request: the server ignored "
                        + "DPoP (RFC 9449) and DPoP is required (configure dpop: .ifSupported, or turn it off)"))
            }
            return .success((grant, bound))
        }
    }

    public var canRevoke: Bool { configuration.revocationEndpoint != nil }

    public func revoke(refreshToken: Secret?, accessToken: Secret?, completion: AuthorityCompletion<Void>) {
        guard let endpoint = configuration.revocationEndpoint, let token = refreshToken ?? accessToken else {
            completion.succeed(())
            return
        }
        let hint = refreshToken != nil ? "refresh_token" : "access_token"
        let call = post(endpoint, form: [("token", .secret(token)), ("token_type_hint", .text(hint))], secrets: [token]) { outcome in
            // RFC 7009 §2.2: 200 whether or not the token was valid.
            completion.complete(outcome.flatMap { response in
                response.status == 200 ? .success(()) : .failure(TokenResponse.error(from: response))
            })
        }
        completion.onCancel { call.cancel() }
    }

    public var canValidate: Bool { configuration.introspectionEndpoint != nil }

    public func validate(accessToken: Secret, completion: AuthorityCompletion<Bool>) {
        guard let endpoint = configuration.introspectionEndpoint else {
            completion.fail(.configuration("unsupported", "no introspection endpoint"))
            return
        }
        let call = post(endpoint, form: [("token", .secret(accessToken)), ("token_type_hint", .text("access_token"))],
             secrets: [accessToken]) { outcome in
            completion.complete(outcome.flatMap { response in
                guard response.status == 200 else { return .failure(TokenResponse.error(from: response)) }
                guard case .bool(let active)? = response.json?["active"] else {
                    return .failure(.transient("the introspection answer is not the JSON RFC 7662 describes"))
                }
                return .success(active)
            })
        }
        completion.onCancel { call.cancel() }
    }

    // MARK: HTTP

    /// One form POST (client id and secret added, then `secretHeaders`); the outcome carries
    /// status, headers and body, or the error it stands for.
    func post(
        _ url: URL, form: [(String, FormValue)], secrets: [Secret], secretHeaders: [Secret] = [],
        answerRule: HTTPRequest.AnswerRule? = nil,
        _ done: @escaping @Sendable (Result<HTTPAnswer, AuthorityError>) -> Void
    ) -> HTTPCall {
        var fields = form
        fields.append(("client_id", .text(configuration.clientID)))
        if let secret = configuration.clientSecret { fields.append(("client_secret", .secret(secret))) }
        return send(
            .post(body: FormEncoding.body(fields)), url,
            headers: ["Content-Type: application/x-www-form-urlencoded", "Accept: application/json"],
            secretHeaders: secretHeaders, answerRule: answerRule,
            redactions: secrets + [configuration.clientSecret].compactMap { $0 }, done)
    }

    /// A POST to the token endpoint (loop thread): `post`, with a DPoP proof by `dpop` and its
    /// one nonce retry when a key is given (`DPoPExchange`).
    func tokenPost(
        _ url: URL, form: [(String, FormValue)], secrets: [Secret], dpop: DPoPKey?,
        answerRule: HTTPRequest.AnswerRule? = nil,
        _ done: @escaping @Sendable (Result<HTTPAnswer, AuthorityError>) -> Void
    ) -> any HTTPCancellable {
        guard let dpop else { return post(url, form: form, secrets: secrets, answerRule: answerRule, done) }
        return DPoPExchange(loop: http.loop, url: url, key: dpop, post: { [self] line, proof, answered in
            post(url, form: form, secrets: secrets + [proof], secretHeaders: [line], answerRule: answerRule, answered)
        }, done: done)
    }

    /// One GET with `Authorization: Bearer` (the userinfo endpoint) — or, with a DPoP key,
    /// `Authorization: DPoP` and a proof (with `ath`); the same rules as `post`.
    func get(
        _ url: URL, bearer: Secret, secrets: [Secret], dpop: DPoPKey? = nil,
        _ done: @escaping @Sendable (Result<HTTPAnswer, AuthorityError>) -> Void
    ) -> HTTPCall {
        var lines = [Self.bearerHeader(bearer)]
        var redactions = secrets + [bearer]
        if let dpop {
            let nonce = DPoPNonces.shared.nonce(for: url.absoluteString)
            if let proof = try? dpop.proof(method: "GET", url: url.absoluteString, accessToken: bearer, nonce: nonce) {
                lines = [DPoPExchange.line("Authorization: DPoP ", bearer), DPoPExchange.line("DPoP: ", proof)]
                redactions.append(proof)
            }
        }
        return send(.get, url, headers: ["Accept: application/json"], secretHeaders: lines, redactions: redactions, done)
    }

    /// Sends one request with the configured deadline and size limit, and maps what came back:
    /// a 3xx is a configuration error (redirects are not followed), any other status an
    /// answer, no answer the error it stands for (`redactions` scrubbed from every text).
    private func send(
        _ method: HTTPRequest.Method, _ url: URL, headers: [String], secretHeaders: [Secret] = [],
        answerRule: HTTPRequest.AnswerRule? = nil, redactions: [Secret],
        _ done: @escaping @Sendable (Result<HTTPAnswer, AuthorityError>) -> Void
    ) -> HTTPCall {
        // A refresh's answer ends at its cap, however long the HTTP deadline (the cap is what
        // the session's refresh lease is made to outlast).
        let timeout = answerRule.map { min(configuration.requestTimeout, $0.cap) } ?? configuration.requestTimeout
        let limit = configuration.maximumAnswerSize
        let request = HTTPRequest(
            method: method, url: url.absoluteString, headers: headers, secretHeaders: secretHeaders,
            timeout: timeout, maximumAnswerSize: limit,
            allowsLoopbackHTTP: true,  // only a URL that passed `validate` reaches here
            answerRule: answerRule)
        return http.send(request) { result in
            switch result {
            case .success(let response) where (300...399).contains(response.status):
                done(.failure(.configuration(
                    "redirect", "HTTP \(response.status): the server redirects elsewhere; redirects are not followed "
                        + "(configure the endpoint's final URL)")))
            case .success(let response):
                done(.success(HTTPAnswer(
                    status: response.status, retryAfter: RetryAfter.parse(response.retryAfter),
                    secretBody: response.body, redactions: redactions, dpopNonce: response.dpopNonce)))
            case .failure(let failure):
                done(.failure(Self.error(for: failure, timeout: timeout, limit: limit, redactions: redactions)))
            }
        }
    }

    /// `Authorization: Bearer <token>`, written into a `Secret`.
    static func bearerHeader(_ token: Secret) -> Secret {
        let prefix = Array("Authorization: Bearer ".utf8)
        return Secret(count: prefix.count + token.count) { out in
            for (index, byte) in prefix.enumerated() { out[index] = byte }
            token.withUnsafeBytes { bytes in
                for (index, byte) in bytes.enumerated() { out[prefix.count + index] = byte }
            }
        }
    }

    /// A request that produced no answer, in words (never a token).
    static func error(for failure: HTTPFailure, timeout: Duration, limit: Int, redactions: [Secret]) -> AuthorityError {
        switch failure {
        case .cancelled:
            return .cancelled
        case .timedOut:
            return .transient("network: no answer within \(timeout) (the request timed out)")
        case .tooLarge(let received):
            let seen = received > 0 ? " (\(received) bytes received)" : ""
            return .transient("the answer is larger than \(limit) bytes\(seen); the transfer was stopped")
        case .network(let text):
            return .transient("network: \(ErrorText.scrub(text, secrets: redactions))")
        case .refused(let text):
            return .transient("the request was not sent: \(ErrorText.scrub(text, secrets: redactions))")
        case .answerLost(let status, let text):
            return .answerLost("the server accepted the refresh (HTTP \(status)) but its answer was lost: "
                + ErrorText.scrub(text, secrets: redactions))
        }
    }
}
