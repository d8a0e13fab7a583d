import CSessionFlow
import SessionCore

#if canImport(Glibc)
import Glibc
#endif

// Authorizing requests (sf_session_authorize, sf_session_unauthorized) and refreshing on
// demand (sf_session_refresh_now): thin over SessionManager's completion forms.

/// The longest refused `Authorization` value read: far beyond any real token (a JWT with
/// many claims is a few KiB), and a bound on what a host can make the library copy.
private let maximumRefusedLength = 65_536

private let bearerScheme = StaticCString(RequestAuthorization.Scheme.bearer.rawValue)
private let dpopScheme = StaticCString(RequestAuthorization.Scheme.dpop.rawValue)

extension RequestAuthorization.Scheme {
    /// The scheme's name as a C string that lives as long as the process.
    fileprivate var cString: UnsafePointer<CChar> {
        switch self {
        case .bearer: bearerScheme.pointer
        case .dpop: dpopScheme.pointer
        }
    }
}

/// The C callback of one authorization request, carried to the loop thread.
struct AuthorizeCallback: @unchecked Sendable {
    let function: sf_authorize_fn
    let userdata: UnsafeMutableRawPointer?
    /// The C function that asked (for sf_last_error_message in a failing answer).
    let call: String

    func callAsFunction(_ result: Result<RequestAuthorization, SessionError>) {
        switch result {
        case .success(let authorization):
            lend(authorization) { function(SF_OK.code, $0, userdata) }
        case .failure(let error):
            let code = answerFailed(call, error)
            function(code, nil, userdata)
        }
    }
}

/// `authorization` as an `sf_authorization`, for the duration of `body`: the names copied
/// (they are no secret), the values the secrets' own bytes (in place: nothing to zero).
private func lend(_ authorization: RequestAuthorization, _ body: (UnsafePointer<sf_authorization>) -> Void) {
    let fields = authorization.fields
    let names = fields.map { strdup($0.name)! }
    defer { names.forEach { free($0) } }
    let headers = UnsafeMutablePointer<sf_header>.allocate(capacity: max(fields.count, 1))
    defer { headers.deallocate() }
    // One `withCString` per value, nested: each value's bytes are lent until `body` returns.
    func lendValues(from index: Int) {
        guard index < fields.count else {
            let lent = sf_authorization(
                size: MemoryLayout<sf_authorization>.size, scheme: authorization.scheme.cString,
                headers: UnsafePointer(headers), header_count: fields.count)
            withUnsafePointer(to: lent) { body($0) }
            return
        }
        fields[index].value.withCString { value in
            headers[index] = sf_header(name: names[index], value: value)
            lendValues(from: index + 1)
        }
    }
    lendValues(from: 0)
}

/// The bytes of the host's C string `text`, read up to `limit` (one more to tell that it is
/// longer): nil when it is longer.
private func bounded(_ text: UnsafePointer<CChar>, _ limit: Int) -> UnsafeRawBufferPointer? {
    let length = strnlen(text, limit + 1)
    return length <= limit ? UnsafeRawBufferPointer(start: text, count: length) : nil
}

/// The method and URL of a request a host passed, copied; nil (refused, SF_EINVAL) when one
/// is NULL or too long to be one. What they say is checked by the session
/// (`RequestAuthorization.problem`).
private func readRequest(
    _ function: String, _ pointer: OpaquePointer?, _ method: UnsafePointer<CChar>?, _ url: UnsafePointer<CChar>?
) -> (method: String, url: String)? {
    guard let method, let url else {
        refuse(function, pointer, method == nil ? "method is NULL" : "url is NULL")
        return nil
    }
    guard let methodBytes = bounded(method, RequestAuthorization.maximumMethodLength) else {
        refuse(function, pointer, "method is longer than \(RequestAuthorization.maximumMethodLength) bytes")
        return nil
    }
    guard let urlBytes = bounded(url, RequestAuthorization.maximumURLLength) else {
        refuse(function, pointer, "url is longer than \(RequestAuthorization.maximumURLLength) bytes")
        return nil
    }
    return (String(decoding: methodBytes, as: UTF8.self), String(decoding: urlBytes, as: UTF8.self))
}

@c @implementation
public func sf_session_authorize(
    _ pointer: OpaquePointer!, _ method: UnsafePointer<CChar>!, _ url: UnsafePointer<CChar>!,
    _ onDone: sf_authorize_fn!, _ userdata: UnsafeMutableRawPointer!
) -> Int32 {
    api("sf_session_authorize") {
        guard let request = readRequest("sf_session_authorize", pointer, method, url) else { return SF_EINVAL.code }
        guard let onDone else {
            refuse("sf_session_authorize", pointer, "on_done is NULL")
            return SF_EINVAL.code
        }
        let answer = AuthorizeCallback(function: onDone, userdata: userdata, call: "sf_session_authorize")
        return posting(pointer) { runtime throws(SessionError) in
            try runtime.session.authorization(method: request.method, url: request.url) { answer($0) }
        }
    }
}

@c @implementation
public func sf_session_unauthorized(
    _ pointer: OpaquePointer!, _ method: UnsafePointer<CChar>!, _ url: UnsafePointer<CChar>!,
    _ refused: UnsafePointer<CChar>!, _ httpStatus: Int32, _ wwwAuthenticate: UnsafePointer<CChar>!,
    _ onDone: sf_authorize_fn!, _ userdata: UnsafeMutableRawPointer!
) -> Int32 {
    api("sf_session_unauthorized") {
        unauthorized("sf_session_unauthorized", pointer, method, url, refused, httpStatus, wwwAuthenticate, nil, onDone, userdata)
    }
}

@c @implementation
public func sf_session_unauthorized_dpop(
    _ pointer: OpaquePointer!, _ method: UnsafePointer<CChar>!, _ url: UnsafePointer<CChar>!,
    _ refused: UnsafePointer<CChar>!, _ httpStatus: Int32, _ wwwAuthenticate: UnsafePointer<CChar>!,
    _ dpopNonce: UnsafePointer<CChar>!, _ onDone: sf_authorize_fn!, _ userdata: UnsafeMutableRawPointer!
) -> Int32 {
    api("sf_session_unauthorized_dpop") {
        unauthorized(
            "sf_session_unauthorized_dpop", pointer, method, url, refused, httpStatus, wwwAuthenticate, dpopNonce, onDone,
            userdata)
    }
}

@c @implementation
public func sf_session_remember_dpop_nonce(
    _ pointer: OpaquePointer!, _ url: UnsafePointer<CChar>!, _ dpopNonce: UnsafePointer<CChar>!
) -> Int32 {
    api("sf_session_remember_dpop_nonce") {
        guard let url, let dpopNonce else {
            refuse("sf_session_remember_dpop_nonce", pointer, url == nil ? "url is NULL" : "dpop_nonce is NULL")
            return SF_EINVAL.code
        }
        return withRuntime(pointer) { runtime throws(SessionError) in
            guard let urlBytes = bounded(url, RequestAuthorization.maximumURLLength) else {
                throw SessionError(.invalidArgument, "url is longer than \(RequestAuthorization.maximumURLLength) bytes")
            }
            let address = String(decoding: urlBytes, as: UTF8.self)
            if let problem = RequestAuthorization.problem(method: "GET", url: address) {
                throw SessionError(.invalidArgument, problem)
            }
            guard let nonceBytes = bounded(dpopNonce, DPoPKey.maximumNonceLength),
                runtime.session.rememberDPoPNonce(String(decoding: nonceBytes, as: UTF8.self), for: address)
            else {
                throw SessionError(
                    .invalidArgument,
                    "dpop_nonce is not 1 to \(DPoPKey.maximumNonceLength) NQCHARs (RFC 9449 §4.2): no proof can carry it")
            }
            return SF_OK.code
        }
    }
}

/// What both refusals share (see the header); `dpopNonce`: the answer's DPoP-Nonce, if any.
private func unauthorized(
    _ function: String, _ pointer: OpaquePointer?, _ method: UnsafePointer<CChar>?, _ url: UnsafePointer<CChar>?,
    _ refused: UnsafePointer<CChar>?, _ httpStatus: Int32, _ wwwAuthenticate: UnsafePointer<CChar>?,
    _ dpopNonce: UnsafePointer<CChar>?, _ onDone: sf_authorize_fn?, _ userdata: UnsafeMutableRawPointer?
) -> Int32 {
    guard let request = readRequest(function, pointer, method, url) else { return SF_EINVAL.code }
    guard let refused else {
        refuse(function, pointer, "refused is NULL")
        return SF_EINVAL.code
    }
    guard let refusedBytes = bounded(refused, maximumRefusedLength) else {
        refuse(function, pointer, "refused is longer than \(maximumRefusedLength) bytes")
        return SF_EINVAL.code
    }
    guard let onDone else {
        refuse(function, pointer, "on_done is NULL")
        return SF_EINVAL.code
    }
    var nonce: String?
    if let dpopNonce {
        guard let bytes = bounded(dpopNonce, DPoPKey.maximumNonceLength) else {
            refuse(function, pointer, "dpop_nonce is longer than \(DPoPKey.maximumNonceLength) bytes")
            return SF_EINVAL.code
        }
        nonce = String(decoding: bytes, as: UTF8.self)
    }
    // Straight into secret memory: the refused value holds the access token.
    let refusedValue = Secret(copying: refusedBytes)
    // Read up to what the parser reads; a longer field is cut (its first challenges count).
    let challenge = wwwAuthenticate.map {
        String(
            decoding: UnsafeRawBufferPointer(start: $0, count: strnlen($0, AuthenticationChallenge.maximumFieldLength)),
            as: UTF8.self)
    }
    let answer = AuthorizeCallback(function: onDone, userdata: userdata, call: function)
    return posting(pointer) { runtime throws(SessionError) in
        // The host hands back only the Authorization value it sent, not its proof: which nonce
        // that proof carried is not known. Not the one remembered now — a concurrent request
        // refused for want of the same nonce may have remembered it meanwhile, and this one
        // must still be retried with it. So a nonce demanded is always retried with (once: the
        // host's second refusal is the answer).
        let authorization = try RequestAuthorization(refused: refusedValue, method: request.method, url: request.url)
        try runtime.session.unauthorized(authorization, status: Int(httpStatus), wwwAuthenticate: challenge, dpopNonce: nonce) {
            answer($0)
        }
    }
}

@c @implementation
public func sf_session_refresh_now(_ pointer: OpaquePointer!, _ callback: sf_token_fn!, _ userdata: UnsafeMutableRawPointer!) -> Int32 {
    api("sf_session_refresh_now") {
        guard let callback else { return SF_EINVAL.code }
        let answer = TokenCallback(function: callback, userdata: userdata, call: "sf_session_refresh_now")
        return posting(pointer) { runtime throws(SessionError) in
            try runtime.session.refreshNow { answer($0) }
        }
    }
}
