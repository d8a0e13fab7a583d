import CLoopHTTP
import FoundationEssentials
import LoopFlow
import SessionCore

#if canImport(Glibc)
import Glibc
#endif

/// Where and as whom the OAuth 2.0 authority talks.
public struct OAuthConfiguration: Sendable {
    /// The token endpoint (RFC 6749 §3.2).
    public var tokenEndpoint: URL
    public var clientID: String
    /// For a confidential client (sent as `client_secret_post`); nil for a public client.
    public var clientSecret: Secret?
    /// Requested on refresh; nil keeps the grant's scope.
    public var scope: String?
    /// RFC 7009 revocation endpoint, for logout.
    public var revocationEndpoint: URL?
    /// RFC 7662 introspection endpoint, for `resume()` (and a member id after a sign-in flow).
    public var introspectionEndpoint: URL?
    /// The authorization endpoint (RFC 6749 §3.1), for the authorization code grant.
    public var authorizationEndpoint: URL?
    /// RFC 8628 device authorization endpoint, for the device authorization grant.
    public var deviceAuthorizationEndpoint: URL?
    /// OpenID Connect's UserInfo endpoint (from an OpenID provider's discovery document).
    public var userinfoEndpoint: URL?
    /// Lifetime assumed when a response has no `expires_in`.
    public var defaultLifetime: Duration = .seconds(3600)
    /// The overall deadline of one HTTP request, connection and answer included (the
    /// session has its own timeout on every refresh, after which the request is cancelled).
    public var requestTimeout: Duration = .seconds(20)
    /// An answer larger than this (default 1 MiB) is refused as a transient failure: a
    /// token answer is a few hundred bytes. Enforced while receiving (a Content-Length
    /// above it is refused before the body; a body that grows past it is cut off), so
    /// memory stays bounded whatever the server sends.
    public var maximumAnswerSize = 1 << 20

    public init(tokenEndpoint: URL, clientID: String, clientSecret: Secret? = nil) {
        self.tokenEndpoint = tokenEndpoint
        self.clientID = clientID
        self.clientSecret = clientSecret
    }

    /// The rules every endpoint must meet: https, or plain http to a loopback host
    /// (127.0.0.0/8, ::1, localhost: for development); no credentials inside the URL.
    /// Checked when the authority is made, before any connection.
    public func validate() throws(OAuthConfigurationError) {
        try Self.check(tokenEndpoint, "token endpoint")
        if let revocationEndpoint { try Self.check(revocationEndpoint, "revocation endpoint") }
        if let introspectionEndpoint { try Self.check(introspectionEndpoint, "introspection endpoint") }
        if let authorizationEndpoint { try Self.check(authorizationEndpoint, "authorization endpoint") }
        if let deviceAuthorizationEndpoint {
            try Self.check(deviceAuthorizationEndpoint, "device authorization endpoint")
        }
        if let userinfoEndpoint { try Self.check(userinfoEndpoint, "userinfo endpoint") }
        guard !clientID.isEmpty else { throw OAuthConfigurationError(field: "client id", reason: "is empty") }
        guard requestTimeout > .zero else {
            throw OAuthConfigurationError(field: "request timeout", reason: "must be positive")
        }
        guard maximumAnswerSize > 0 else {
            throw OAuthConfigurationError(field: "maximum answer size", reason: "must be positive")
        }
    }

    /// Whether `url` may be used, and if plain http is allowed for it.
    static func check(_ url: URL, _ field: String) throws(OAuthConfigurationError) -> Void {
        switch lh_url_check(url.absoluteString) {
        case LH_URL_HTTPS, LH_URL_LOOPBACK_HTTP:
            return
        case LH_URL_PLAIN_HTTP:
            throw OAuthConfigurationError(
                field: field, reason: "uses plain http to a host that is not loopback (https is required: "
                    + "tokens and the client secret would travel in clear)")
        case LH_URL_CREDENTIALS:
            throw OAuthConfigurationError(field: field, reason: "has a user name or password inside the URL")
        case LH_URL_OTHER_SCHEME:
            throw OAuthConfigurationError(field: field, reason: "is neither https nor http")
        default:
            throw OAuthConfigurationError(field: field, reason: "is not a URL with a host")
        }
    }
}

/// A configuration the OAuth authority refuses (at creation, before any connection).
public struct OAuthConfigurationError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Which setting ("token endpoint", "client id"...).
    public let field: String
    public let reason: String

    public init(field: String, reason: String) {
        self.field = field
        self.reason = reason
    }

    public var description: String { "the \(field) \(reason)" }
}

/// The built-in OAuth 2.0 authority: the refresh_token grant (RFC 6749 §6), revocation (RFC
/// 7009) and introspection (RFC 7662), over the loop's own HTTP client (libcurl's multi
/// interface driven by libuv: every request lives on the loop thread).
///
/// Every request: https only (plain http to loopback hosts for development), no redirect
/// followed (a 3xx is a configuration error naming the status), an overall deadline
/// (`requestTimeout`), `Accept-Encoding: identity`, the answer size limited while it is
/// received, TLS always verified. A refresh can be cancelled (the session does at its
/// timeout): the request then really ends (its connection is closed) before the session
/// may send the refresh token again.
///
/// Errors (RFC 6749 §5.2): `invalid_grant` is terminal (the session expires);
/// `invalid_client`, `unauthorized_client`, `unsupported_grant_type`, `invalid_scope`,
/// `invalid_request` and other 4xx are configuration errors (never retried automatically);
/// 408, 429, 5xx, network failures, timeouts and unreadable bodies are transient
/// (429/503 honour `Retry-After`).
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
        let call = post(configuration.tokenEndpoint, form: form, secrets: [request.refreshToken]) { [configuration] outcome in
            completion.complete(outcome.flatMap { response in
                TokenResponse.grant(from: response, defaultLifetime: configuration.defaultLifetime)
            })
        }
        completion.onCancel { call.cancel() }
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

    /// One form POST; the outcome carries status, headers and body, or the error it stands for.
    func post(
        _ url: URL, form: [(String, FormValue)], secrets: [Secret],
        _ done: @escaping @Sendable (Result<HTTPAnswer, AuthorityError>) -> Void
    ) -> HTTPCall {
        var fields = form
        fields.append(("client_id", .text(configuration.clientID)))
        if let secret = configuration.clientSecret { fields.append(("client_secret", .secret(secret))) }
        let redactions = secrets + [configuration.clientSecret].compactMap { $0 }
        let timeout = configuration.requestTimeout
        let limit = configuration.maximumAnswerSize
        let request = HTTPPost(
            url: url.absoluteString,
            headers: ["Content-Type: application/x-www-form-urlencoded", "Accept: application/json"],
            body: FormEncoding.body(fields), timeout: timeout, maximumAnswerSize: limit,
            allowsLoopbackHTTP: true)  // only a URL that passed `validate` reaches here
        return http.post(request) { result in
            switch result {
            case .success(let response) where (300...399).contains(response.status):
                done(.failure(.configuration(
                    "redirect", "HTTP \(response.status): the server redirects elsewhere; redirects are not followed "
                        + "(configure the endpoint's final URL)")))
            case .success(let response):
                done(.success(HTTPAnswer(
                    status: response.status, retryAfter: RetryAfter.parse(response.retryAfter),
                    secretBody: response.body, redactions: redactions)))
            case .failure(let failure):
                done(.failure(Self.error(for: failure, timeout: timeout, limit: limit, redactions: redactions)))
            }
        }
    }

    /// One GET with `Authorization: Bearer` (the userinfo endpoint); the same rules as `post`.
    func get(
        _ url: URL, bearer: Secret, secrets: [Secret],
        _ done: @escaping @Sendable (Result<HTTPAnswer, AuthorityError>) -> Void
    ) -> HTTPCall {
        let redactions = secrets + [bearer]
        let timeout = configuration.requestTimeout
        let limit = configuration.maximumAnswerSize
        let request = HTTPPost(
            url: url.absoluteString, headers: ["Accept: application/json"],
            secretHeader: Self.bearerHeader(bearer),
            body: Secret(""), timeout: timeout, maximumAnswerSize: limit,
            allowsLoopbackHTTP: true,  // only a URL that passed `validate` reaches here
            method: .get)
        return http.post(request) { result in
            switch result {
            case .success(let response) where (300...399).contains(response.status):
                done(.failure(.configuration(
                    "redirect", "HTTP \(response.status): the server redirects elsewhere; redirects are not followed")))
            case .success(let response):
                done(.success(HTTPAnswer(
                    status: response.status, retryAfter: RetryAfter.parse(response.retryAfter),
                    secretBody: response.body, redactions: redactions)))
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
        }
    }
}

/// What the server answered.
/// An HTTP answer as the parsers see it (SPI Fuzzing: the fuzz targets in Tools/ call the parsers).
@_spi(Fuzzing) public struct HTTPAnswer: Sendable {
    public let status: Int
    public let retryAfter: Duration?
    /// The body, in memory a secret owns (zeroed when the answer goes).
    let secretBody: Secret
    public let redactions: [Secret]

    /// The members whose string values are secrets: parsed into `Secret`s, never `String`s.
    static let secretMembers: Set<String> = ["access_token", "refresh_token", "id_token", "device_code"]

    public init(status: Int, retryAfter: Duration?, body: Data, redactions: [Secret]) {
        self.init(
            status: status, retryAfter: retryAfter,
            secretBody: body.withUnsafeBytes { Secret(copying: $0) }, redactions: redactions)
    }

    init(status: Int, retryAfter: Duration?, secretBody: Secret, redactions: [Secret]) {
        self.status = status
        self.retryAfter = retryAfter
        self.secretBody = secretBody
        self.redactions = redactions
    }

    /// A copy of the body (tests and fuzzers; the library reads `json`).
    public var body: Data { secretBody.withUnsafeBytes { Data($0) } }

    /// The body as a JSON object (its top-level members), nil if it is not one. The values
    /// of `secretMembers` are read into secrets (`JSONObject.secret`), never into strings.
    var json: JSONObject? {
        guard let redacted = secretBody.withUnsafeBytes({ SecretJSON.redact($0, keys: Self.secretMembers) }),
            let members = try? JSONDecoder().decode([String: JSONMember].self, from: Data(redacted.json))
        else { return nil }
        return JSONObject(members: members, redacted: redacted)
    }
}

/// A JSON object's top-level members, with the secrets of `HTTPAnswer.secretMembers` kept apart.
struct JSONObject {
    let members: [String: JSONMember]
    let redacted: SecretJSON.Redacted

    /// A member (a secret member reads as a placeholder string: use `secret`).
    subscript(_ key: String) -> JSONMember? { members[key] }

    /// The string value of a secret member, nil if absent or not a string.
    func secret(_ key: String) -> Secret? {
        guard case .string(let placeholder)? = members[key] else { return nil }
        return redacted.secret(for: placeholder)
    }
}

/// One top-level member of a JSON object: the scalars an OAuth answer uses; anything else
/// (an array, an object, null) is `.other`.
@_spi(Fuzzing) public enum JSONMember: Decodable, Sendable, Equatable {
    case string(String)
    case int(Int)
    case double(Double)
    case bool(Bool)
    case other

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Int.self) {
            self = .int(value)
        } else if let value = try? container.decode(Double.self) {
            self = .double(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else {
            self = .other
        }
    }

    var string: String? {
        if case .string(let value) = self { return value }
        return nil
    }
}

@_spi(Fuzzing) public enum TokenResponse {
    /// A 200 with the fields RFC 6749 §5.1 requires, or the error it stands for.
    public static func grant(from answer: HTTPAnswer, defaultLifetime: Duration) -> Result<TokenGrant, AuthorityError> {
        guard answer.status == 200 else { return .failure(error(from: answer)) }
        guard let object = answer.json else {
            return .failure(.transient("the token answer is not JSON"))
        }
        guard let access = object.secret("access_token"), access.count > 0 else {
            return .failure(.transient("the token answer has no access_token"))
        }
        if let type = object["token_type"]?.string, type.lowercased() != "bearer" {
            let shown = ErrorText.description(type, secrets: answer.redactions + [access]) ?? ""
            return .failure(.configuration("unsupported_token_type", "token_type \(shown) is not Bearer"))
        }
        let lifetime: Duration
        // Negative counts as 0; anything beyond 100 years as 100 years (the session clamps
        // further): a Double of 1e20 must not trap converting to an integer.
        let ceiling = 100.0 * 365 * 24 * 3600
        switch object["expires_in"] {
        case .int(let seconds)?: lifetime = .seconds(min(max(seconds, 0), Int(ceiling)))
        case .double(let seconds)? where seconds.isFinite:
            lifetime = .milliseconds(Int64(min(max(seconds, 0), ceiling) * 1000))
        case .string(let text)? where Int(text) != nil: lifetime = .seconds(min(max(Int(text)!, 0), Int(ceiling)))
        default: lifetime = defaultLifetime
        }
        let refresh = object.secret("refresh_token").flatMap { $0.count == 0 ? nil : $0 }
        return .success(TokenGrant(accessToken: access, refreshToken: refresh, expiresIn: lifetime))
    }

    /// The error an unsuccessful answer stands for (RFC 6749 §5.2).
    public static func error(from answer: HTTPAnswer) -> AuthorityError {
        let object = answer.json
        // Only what ErrorText lets through reaches a message: a code from the RFCs' list
        // (anything else, the refresh token echoed in `error` included, is
        // "unrecognised_error"), and a short, printable description scrubbed of every form of
        // what we sent.
        let code = ErrorText.code(object?["error"]?.string)
        let description = ErrorText.description(object?["error_description"]?.string, secrets: answer.redactions)
        let message = ["HTTP \(answer.status)", code, description].compactMap { $0 }.joined(separator: ": ")
        switch (answer.status, code) {
        case (_, "invalid_grant"):
            return AuthorityError(.terminal, code: code, message: message)
        case (408, _), (429, _), (500...599, _):
            return AuthorityError(.transient, code: code ?? "\(answer.status)", message: message, retryAfter: answer.retryAfter)
        case (_, "temporarily_unavailable"):
            return AuthorityError(.transient, code: code, message: message, retryAfter: answer.retryAfter)
        case (400...499, _):
            return AuthorityError(.configuration, code: code ?? "\(answer.status)", message: message)
        default:
            return AuthorityError(.transient, code: code ?? "\(answer.status)", message: message)
        }
    }
}

/// A form field's value: text, or a secret that is percent-encoded straight into the body.
enum FormValue {
    case text(String)
    case secret(Secret)
}

/// `application/x-www-form-urlencoded`.
enum FormEncoding {
    static func encode(_ fields: [(String, String)]) -> String {
        fields.map { "\(escape($0.0))=\(escape($0.1))" }.joined(separator: "&")
    }

    /// The body of `fields`, written into a `Secret` (its length counted first, so no
    /// buffer that held a secret is ever grown, copied or left unzeroed).
    static func body(_ fields: [(String, FormValue)]) -> Secret {
        func encodedLength(_ bytes: UnsafeRawBufferPointer) -> Int {
            bytes.reduce(0) { $0 + (unreserved.contains($1) || $1 == UInt8(ascii: " ") ? 1 : 3) }
        }
        func length(_ value: FormValue) -> Int {
            switch value {
            case .text(var text): return text.withUTF8 { encodedLength(UnsafeRawBufferPointer($0)) }
            case .secret(let secret): return secret.withUnsafeBytes { encodedLength($0) }
            }
        }
        var total = max(fields.count - 1, 0)
        for (name, value) in fields { total += escape(name).utf8.count + 1 + length(value) }
        return Secret(count: total) { out in
            var at = 0
            func put(_ byte: UInt8) {
                out[at] = byte
                at += 1
            }
            func put(encoding bytes: UnsafeRawBufferPointer) {
                let hex = Array("0123456789ABCDEF".utf8)
                for byte in bytes {
                    if unreserved.contains(byte) {
                        put(byte)
                    } else if byte == UInt8(ascii: " ") {
                        put(UInt8(ascii: "+"))
                    } else {
                        put(UInt8(ascii: "%"))
                        put(hex[Int(byte >> 4)])
                        put(hex[Int(byte & 0xF)])
                    }
                }
            }
            for (index, (name, value)) in fields.enumerated() {
                if index > 0 { put(UInt8(ascii: "&")) }
                var name = name
                name.withUTF8 { put(encoding: UnsafeRawBufferPointer($0)) }
                put(UInt8(ascii: "="))
                switch value {
                case .text(var text): text.withUTF8 { put(encoding: UnsafeRawBufferPointer($0)) }
                case .secret(let secret): secret.withUnsafeBytes { put(encoding: $0) }
                }
            }
        }
    }

    private static let unreserved = Set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._*".utf8)

    static func escape(_ text: String) -> String {
        var out = ""
        for byte in text.utf8 {
            if unreserved.contains(byte) {
                out.append(Character(UnicodeScalar(byte)))
            } else if byte == UInt8(ascii: " ") {
                out.append("+")
            } else {
                let hex = Array("0123456789ABCDEF".utf8)
                out.unicodeScalars.append("%")
                out.unicodeScalars.append(UnicodeScalar(hex[Int(byte >> 4)]))
                out.unicodeScalars.append(UnicodeScalar(hex[Int(byte & 0xF)]))
            }
        }
        return out
    }
}

/// `Retry-After`: delay-seconds or an HTTP-date.
@_spi(Fuzzing) public enum RetryAfter {
    /// `Retry-After` (RFC 9110 §10.2.3): delay-seconds, or an HTTP-date in the IMF-fixdate
    /// form ("Sun, 06 Nov 1994 08:49:37 GMT"), parsed by hand (ASCII only): anything else is
    /// nil. (Foundation's DateFormatter trapped on a combining mark a server can send.)
    public static func parse(_ value: String?) -> Duration? {
        guard let value, value.utf8.count <= 64 else { return nil }
        // (delay-seconds is 1*DIGIT: "+5" and "-1" are not Retry-After values.)
        let bytes = Array(value.utf8.drop { $0 == 0x20 || $0 == 0x09 }.reversed().drop { $0 == 0x20 || $0 == 0x09 }.reversed())
        guard !bytes.isEmpty, bytes.allSatisfy({ $0 < 0x80 }) else { return nil }
        let text = String(decoding: bytes, as: UTF8.self)
        if bytes.allSatisfy({ (0x30...0x39).contains($0) }) {
            // More digits than an Int holds: absurdly far; the session caps what it honours.
            guard let seconds = Int(text) else { return .seconds(100 * 365 * 24 * 3600) }
            return .seconds(seconds)
        }
        guard let date = imfFixdate(text) else { return nil }
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return .seconds(max(date - Int64(now.tv_sec), 0))
    }

    /// Seconds since the Unix epoch of an IMF-fixdate, or nil.
    static func imfFixdate(_ text: String) -> Int64? {
        let parts = text.split(separator: " ", omittingEmptySubsequences: false)
        let days = ["Mon,", "Tue,", "Wed,", "Thu,", "Fri,", "Sat,", "Sun,"]
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        guard parts.count == 6, days.contains(String(parts[0])), parts[5] == "GMT",
              parts[1].count == 2, let day = Int(parts[1]), (1...31).contains(day),
              let month = months.firstIndex(of: String(parts[2])),
              parts[3].count == 4, let year = Int(parts[3]), year >= 1970
        else { return nil }
        let clock = parts[4].split(separator: ":", omittingEmptySubsequences: false)
        guard clock.count == 3, clock.allSatisfy({ $0.count == 2 }),
              let hour = Int(clock[0]), let minute = Int(clock[1]), let second = Int(clock[2]),
              hour < 24, minute < 60, second < 61
        else { return nil }
        // Days since 1970-01-01 (civil-from-days, proleptic Gregorian).
        let y = Int64(month < 2 ? year - 1 : year)
        let m = Int64(month < 2 ? month + 13 : month + 1)   // March = 3 ... February = 14
        let era = y / 400
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (m - 3) + 2) / 5 + Int64(day) - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        let days1970 = era * 146_097 + dayOfEra - 719_468
        return days1970 * 86_400 + Int64(hour * 3600 + minute * 60 + second)
    }
}

extension Duration {
    var seconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}
