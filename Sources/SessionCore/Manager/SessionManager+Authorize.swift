import LoopFlow

/// Authorizing requests: the one primitive every HTTP adapter uses (Python's `httpx.Auth`
/// and `requests` auth, the libcurl example, `perform(_:)` below).
///
/// 1. `authorization(method:url:)` gives the header fields to add, refreshing first when
///    the token is due (single-flight: any number of concurrent requests cause one refresh).
/// 2. Send the request.
/// 3. On a 401 (or a 403 with a challenge), hand the refusal to `unauthorized(_:status:
///    wwwAuthenticate:)`: if the refused token is still the session's, it is refreshed (once,
///    shared by every request refused with it: compare-and-refresh); the answer is the
///    authorization to retry with. Retry once. A token fresh from such a refresh that is
///    refused again is `unauthorized`, never another refresh, so no caller can loop.
extension SessionManager {
    /// The header fields that authorize `method` on `url` with the session's access token,
    /// refreshed first when it is within the margin of expiry.
    ///
    /// Any thread; returns once the token is known. The fields' values are secrets (see
    /// `RequestAuthorization`).
    /// - Throws: `invalidArgument` for a method that is not an HTTP method name, or a URL
    ///   that is not absolute `https://` (or `http://` to a loopback host), or with a
    ///   fragment; `notLoggedIn`, `sessionExpired`, `transient`, `busy` as
    ///   `freshAccessToken()`.
    public func authorization(method: String, url: String) async throws(SessionError) -> RequestAuthorization {
        if let problem = RequestAuthorization.problem(method: method, url: url) {
            throw SessionError(.invalidArgument, problem)
        }
        let key = KeyOfToken()
        let token = try await awaitToken { engine, completion in engine.freshAccessToken(key.noting(engine, completion)) }
        return try Self.authorization(token, key: key.key, method: method, url: url)
    }

    /// The same, answered on the loop thread (never inside this call; not at all when it
    /// throws).
    public func authorization(
        method: String, url: String,
        _ completion: @escaping @Sendable (Result<RequestAuthorization, SessionError>) -> Void
    ) throws(SessionError) {
        if let problem = RequestAuthorization.problem(method: method, url: url) {
            throw SessionError(.invalidArgument, problem)
        }
        let key = KeyOfToken()
        try postTokenRequest({ result in
            completion(result.flatMap { token in
                Result { () throws(SessionError) in try Self.authorization(token, key: key.key, method: method, url: url) }
            })
        }) { engine, answer in engine.freshAccessToken(key.noting(engine, answer)) }
    }

    /// A request sent with `refused` was answered `status` with `wwwAuthenticate`: the
    /// authorization to retry it with, once.
    ///
    /// - 401 (whatever the challenge says, `invalid_token` or nothing): compare-and-refresh
    ///   (`handleUnauthorized(token:)`): refreshed if `refused` carries the current token,
    ///   else the current one is returned at once.
    /// - 403 with `error="insufficient_scope"` (RFC 6750 §3.1): a new token would not have
    ///   more scope — `unauthorized`, nothing refreshed.
    /// - Throws: `unauthorized` for a refusal a new token cannot cure, or when the token of a
    ///   refresh made for this very refusal is refused again; `invalidArgument` for a status
    ///   that is not a refusal (not 401 or 403); `sessionExpired` when the refresh found the
    ///   session dead (the state is then `sessionExpired`); as `freshAccessToken()` otherwise.
    ///
    /// A DPoP session's refusal `DPoP error="use_dpop_nonce"` with the server's `DPoP-Nonce`
    /// (`dpopNonce`; RFC 9449 §9) is no reason to refresh: the nonce is remembered for that
    /// server and the answer is a new proof carrying it. A nonce demanded again of a proof that
    /// carried the nonce the server gave is `unauthorized` (a server that never lets the
    /// request through: the caller's one retry is spent, nothing loops). Nor is
    /// `DPoP error="invalid_dpop_proof"` (§7.1: the proof, not the token, was refused — its
    /// `iat` outside the server's window, a `jti` it has seen): the answer is the same token
    /// with a new proof; a refresh would spend a rotation and cure nothing.
    public func unauthorized(
        _ refused: RequestAuthorization, status: Int, wwwAuthenticate: String?, dpopNonce: String? = nil
    ) async throws(SessionError) -> RequestAuthorization {
        try Self.checkRefusal(status: status, wwwAuthenticate: wwwAuthenticate)
        let key = KeyOfToken()
        if try Self.wantsNewProofOnly(refused, wwwAuthenticate: wwwAuthenticate, dpopNonce: dpopNonce) {
            let token = try await awaitToken { engine, completion in engine.freshAccessToken(key.noting(engine, completion)) }
            return try Self.authorization(token, key: key.key, method: refused.method, url: refused.url)
        }
        let token = try await awaitToken { engine, completion in
            engine.handleUnauthorized(token: refused.accessToken, key.noting(engine, completion))
        }
        return try Self.authorization(token, key: key.key, method: refused.method, url: refused.url)
    }

    /// The same, answered on the loop thread.
    public func unauthorized(
        _ refused: RequestAuthorization, status: Int, wwwAuthenticate: String?, dpopNonce: String? = nil,
        _ completion: @escaping @Sendable (Result<RequestAuthorization, SessionError>) -> Void
    ) throws(SessionError) {
        try Self.checkRefusal(status: status, wwwAuthenticate: wwwAuthenticate)
        let key = KeyOfToken()
        let proofOnly = try Self.wantsNewProofOnly(refused, wwwAuthenticate: wwwAuthenticate, dpopNonce: dpopNonce)
        try postTokenRequest({ result in
            completion(result.flatMap { token in
                Result { () throws(SessionError) in
                    try Self.authorization(token, key: key.key, method: refused.method, url: refused.url)
                }
            })
        }) { engine, answer in
            if proofOnly {
                engine.freshAccessToken(key.noting(engine, answer))
            } else {
                engine.handleUnauthorized(token: refused.accessToken, key.noting(engine, answer))
            }
        }
    }

    /// Whether a new proof with the same token is the whole cure of `refused`'s refusal: a
    /// DPoP nonce wanted (`wantsNonce`), or the proof itself refused (`invalid_dpop_proof`).
    static func wantsNewProofOnly(
        _ refused: RequestAuthorization, wwwAuthenticate: String?, dpopNonce: String?
    ) throws(SessionError) -> Bool {
        if try wantsNonce(refused, wwwAuthenticate: wwwAuthenticate, dpopNonce: dpopNonce) { return true }
        return refused.scheme == .dpop
            && AuthenticationChallenge.parse(wwwAuthenticate).contains { $0.scheme == "dpop" && $0.error == "invalid_dpop_proof" }
    }

    /// Whether `refused` was refused for want of a DPoP nonce (RFC 9449 §9) — then remembered
    /// for its server.
    /// - Throws: `unauthorized` when the proof already carried the nonce the server demands
    ///   (or a nonce is demanded without one given): retrying would be refused again.
    static func wantsNonce(_ refused: RequestAuthorization, wwwAuthenticate: String?, dpopNonce: String?) throws(SessionError) -> Bool {
        guard refused.scheme == .dpop,
              AuthenticationChallenge.parse(wwwAuthenticate).contains(where: { $0.scheme == "dpop" && $0.error == "use_dpop_nonce" })
        else {
            // Another refusal may give a new nonce too (§8.2): the retry's proof carries it.
            if refused.scheme == .dpop, let dpopNonce { DPoPNonces.shared.remember(dpopNonce, for: refused.url) }
            return false
        }
        guard let dpopNonce, !dpopNonce.isEmpty else {
            throw SessionError(.unauthorized, "the server demands a DPoP nonce (use_dpop_nonce) but sent none (no DPoP-Nonce header)")
        }
        if refused.dpopNonce == dpopNonce {
            throw SessionError(.unauthorized, "the server demanded a DPoP nonce again of a proof that carried the one it gave")
        }
        guard DPoPNonces.shared.remember(dpopNonce, for: refused.url) else {
            throw SessionError(.unauthorized, "the server's DPoP nonce (DPoP-Nonce) is not a string of NQCHARs (RFC 9449 §4.2): no proof can carry it")
        }
        return true
    }

    /// A server's `DPoP-Nonce` on an answer to a request this session authorized, whatever the
    /// answer's status: a server may give a new nonce on any answer, a 200 included, and accept
    /// only that one from then on (RFC 9449 §8.2, §9). It is remembered for the server of `url`
    /// (its origin), so that the next proof to that server carries it. Without it, each
    /// rotation costs the next request one refusal (`use_dpop_nonce`) and a retry. The
    /// adapters call this for every answer with the header; a refusal's nonce goes to
    /// `unauthorized(_:status:wwwAuthenticate:dpopNonce:)` instead.
    ///
    /// Any thread; no hop to the loop (the nonces are process-wide, like the proofs' keys'
    /// servers).
    /// - Returns: false, and nothing remembered, when `url` is not one
    ///   `authorization(method:url:)` accepts, or `nonce` is not one a proof can carry (1 to
    ///   1024 NQCHARs, RFC 9449 §4.2). A server's bad nonce on a good answer is no reason to
    ///   fail the request that got it.
    @discardableResult
    public func rememberDPoPNonce(_ nonce: String, for url: String) -> Bool {
        guard RequestAuthorization.problem(method: "GET", url: url) == nil else { return false }
        return DPoPNonces.shared.remember(nonce, for: url)
    }

    /// Runs `request` with an authorization for `method` `url`; when it reports a refusal
    /// (`.refused(status:wwwAuthenticate:)`), runs it once more with the authorization
    /// `unauthorized` gives — AppAuth's `performActionWithFreshTokens`, with the retry built in.
    /// Returns what the last run returned.
    ///
    /// ```swift
    /// let body = try await session.perform(method: "GET", url: api) { authorization in
    ///     let (data, response) = try await send(request, adding: authorization.fields)
    ///     if response.statusCode == 401 {
    ///         return .refused(status: 401, wwwAuthenticate: response.value(forHTTPHeaderField: "WWW-Authenticate"))
    ///     }
    ///     return .done(data)
    /// }
    /// ```
    /// A DPoP session talking to a server that gives nonces on good answers: hand each answer's
    /// `DPoP-Nonce` to `rememberDPoPNonce(_:for:)` from `request`, and a refusal's in
    /// `.refused(status:wwwAuthenticate:dpopNonce:)`.
    /// - Throws: the session's errors (as `authorization` and `unauthorized`), or what
    ///   `request` throws; `unauthorized` when the retry is refused too.
    public func perform<Value: Sendable>(
        method: String, url: String,
        _ request: (RequestAuthorization) async throws -> AuthorizedOutcome<Value>
    ) async throws -> Value {
        let first = try await authorization(method: method, url: url)
        switch try await request(first) {
        case .done(let value):
            return value
        case .refused(let status, let challenge, let nonce):
            let retry = try await unauthorized(first, status: status, wwwAuthenticate: challenge, dpopNonce: nonce)
            switch try await request(retry) {
            case .done(let value):
                return value
            case .refused(let status, _, _):
                throw SessionError(.unauthorized, "the request was refused again (HTTP \(status)) with a fresh authorization")
            }
        }
    }

    static func authorization(
        _ token: Secret, key: DPoPKey? = nil, method: String, url: String
    ) throws(SessionError) -> RequestAuthorization {
        // A header value holds no control character (RFC 9110 §5.5): one in the token (a host
        // signed in with it) would end the field and start another.
        let clean = token.withUnsafeBytes { bytes in bytes.allSatisfy { $0 >= 0x20 && $0 != 0x7F } }
        guard clean, token.count > 0 else {
            throw SessionError(.invalidArgument, "the access token is empty or holds a control character: it cannot be sent in a header")
        }
        guard let key else { return RequestAuthorization(accessToken: token, method: method, url: url) }
        return try RequestAuthorization(
            accessToken: token, method: method, url: url, dpopKey: key, nonce: DPoPNonces.shared.nonce(for: url))
    }

    static func checkRefusal(status: Int, wwwAuthenticate: String?) throws(SessionError) {
        switch status {
        case 401:
            return
        case 403:
            let scope = AuthenticationChallenge.parse(wwwAuthenticate).contains {
                ($0.scheme == "bearer" || $0.scheme == "dpop") && $0.error == "insufficient_scope"
            }
            throw SessionError(
                .unauthorized,
                scope ? "the token lacks the scope this request needs (insufficient_scope): a refresh would not add it"
                    : "HTTP 403: the server forbids this request whatever the token")
        default:
            throw SessionError(.invalidArgument, "HTTP \(status) is not a refusal of the authorization (401, or 403)")
        }
    }
}

/// What a request run by `SessionManager.perform` ended with.
public enum AuthorizedOutcome<Value: Sendable>: Sendable {
    /// It got its answer.
    case done(Value)
    /// The server refused the authorization: its status (401, or 403), `WWW-Authenticate`,
    /// and `DPoP-Nonce` (a DPoP session: the nonce the server demands, RFC 9449 §9).
    case refused(status: Int, wwwAuthenticate: String?, dpopNonce: String? = nil)
}

/// The DPoP key of the token a request for one is answered with, noted on the loop thread
/// when the answer is given (the engine's session is then the token's): nil for a bearer
/// session.
final class KeyOfToken: Sendable {
    private let box = LockedBox<DPoPKey?>(nil)

    var key: DPoPKey? { box.withLockedValue { $0 } }

    /// `completion`, noting first the key of the token it is answered with.
    func noting(_ engine: SessionEngine, _ completion: @escaping TokenCompletion) -> TokenCompletion {
        { [box] result in
            if case .success(let token) = result, let live = engine.refresh.live, live.accessToken == token {
                box.withLockedValue { $0 = live.dpopKey }
            }
            completion(result)
        }
    }
}
