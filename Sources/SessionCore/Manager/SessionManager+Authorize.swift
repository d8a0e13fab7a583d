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
        let token = try await freshAccessToken()
        return try Self.authorization(token, method: method, url: url)
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
        try freshAccessToken { result in
            completion(result.flatMap { token in
                Result { () throws(SessionError) in try Self.authorization(token, method: method, url: url) }
            })
        }
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
    public func unauthorized(
        _ refused: RequestAuthorization, status: Int, wwwAuthenticate: String?
    ) async throws(SessionError) -> RequestAuthorization {
        try Self.checkRefusal(status: status, wwwAuthenticate: wwwAuthenticate)
        let token = try await handleUnauthorized(token: refused.accessToken)
        return try Self.authorization(token, method: refused.method, url: refused.url)
    }

    /// The same, answered on the loop thread.
    public func unauthorized(
        _ refused: RequestAuthorization, status: Int, wwwAuthenticate: String?,
        _ completion: @escaping @Sendable (Result<RequestAuthorization, SessionError>) -> Void
    ) throws(SessionError) {
        try Self.checkRefusal(status: status, wwwAuthenticate: wwwAuthenticate)
        try handleUnauthorized(token: refused.accessToken) { result in
            completion(result.flatMap { token in
                Result { () throws(SessionError) in
                    try Self.authorization(token, method: refused.method, url: refused.url)
                }
            })
        }
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
        case .refused(let status, let challenge):
            let retry = try await unauthorized(first, status: status, wwwAuthenticate: challenge)
            switch try await request(retry) {
            case .done(let value):
                return value
            case .refused(let status, _):
                throw SessionError(.unauthorized, "the request was refused again (HTTP \(status)) with a fresh authorization")
            }
        }
    }

    static func authorization(_ token: Secret, method: String, url: String) throws(SessionError) -> RequestAuthorization {
        // A header value holds no control character (RFC 9110 §5.5): one in the token (a host
        // signed in with it) would end the field and start another.
        let clean = token.withUnsafeBytes { bytes in bytes.allSatisfy { $0 >= 0x20 && $0 != 0x7F } }
        guard clean, token.count > 0 else {
            throw SessionError(.invalidArgument, "the access token is empty or holds a control character: it cannot be sent in a header")
        }
        return RequestAuthorization(accessToken: token, method: method, url: url)
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
    /// The server refused the authorization: its status (401, or 403) and `WWW-Authenticate`.
    case refused(status: Int, wwwAuthenticate: String?)
}
