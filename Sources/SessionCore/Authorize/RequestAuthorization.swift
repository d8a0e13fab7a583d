/// What to add to one HTTP request so that a resource server accepts it: the header fields
/// (`Authorization: Bearer <access token>`; for a sender-constrained session (DPoP, RFC 9449)
/// `Authorization: DPoP <access token>` and `DPoP: <proof>` bound to this method and URL, so
/// callers that add every field they are given need no change), and what the session needs to
/// recognise a refusal of it (`SessionManager.unauthorized`).
///
/// Made by `SessionManager.authorization(method:url:)`. The fields' values are secrets: they
/// print as `<redacted>`, and their bytes are the session's own memory (zeroed when the last
/// copy goes). Add them to the request with `withUnsafeBytes` / `withCString` where the HTTP
/// client copies them; a `String` made with `reveal()` cannot be wiped.
public struct RequestAuthorization: Sendable, Hashable, CustomStringConvertible {
    /// One header field: its name (`Authorization`, `DPoP`) and its value (a secret).
    public struct Field: Sendable, Hashable {
        public let name: String
        public let value: Secret
    }

    /// How the access token is presented.
    public enum Scheme: String, Sendable, Hashable {
        /// RFC 6750: `Authorization: Bearer <token>`.
        case bearer = "Bearer"
        /// RFC 9449 §7: `Authorization: DPoP <token>` and a `DPoP` proof (with `ath`).
        case dpop = "DPoP"
    }

    /// The fields to add, in order.
    public let fields: [Field]
    public private(set) var scheme: Scheme
    /// The request this authorization was made for (a DPoP proof is bound to both).
    public let method: String
    public let url: String
    /// The access token the fields present (compare-and-refresh on a refusal).
    let accessToken: Secret
    /// The server nonce the proof carries (DPoP), nil if none: a nonce demanded again after
    /// a proof that carried this very one is a server that never lets the request through.
    private(set) var dpopNonce: String?

    /// A bearer authorization (`Authorization: Bearer <token>`).
    init(accessToken: Secret, method: String, url: String) {
        self.accessToken = accessToken
        self.scheme = .bearer
        self.method = method
        self.url = url
        self.dpopNonce = nil
        self.fields = [Field(name: "Authorization", value: Self.value("Bearer ", accessToken))]
    }

    /// A DPoP authorization (RFC 9449 §7): `Authorization: DPoP <token>` and a new proof by
    /// `key` for `method` `url` with `ath` (and `nonce`, when the server gave one).
    init(accessToken: Secret, method: String, url: String, dpopKey: DPoPKey, nonce: String?) throws(SessionError) {
        self.accessToken = accessToken
        self.scheme = .dpop
        self.method = method
        self.url = url
        self.dpopNonce = nonce
        let proof = try dpopKey.proof(method: method, url: url, accessToken: accessToken, nonce: nonce)
        self.fields = [
            Field(name: "Authorization", value: Self.value("DPoP ", accessToken)),
            Field(name: "DPoP", value: proof),
        ]
    }

    /// `prefix` then `secret`, in a secret's own memory.
    private static func value(_ prefix: String, _ secret: Secret) -> Secret {
        let prefix = Array(prefix.utf8)
        return Secret(count: prefix.count + secret.count) { out in
            for (index, byte) in prefix.enumerated() { out[index] = byte }
            secret.withUnsafeBytes { bytes in
                for (index, byte) in bytes.enumerated() { out[prefix.count + index] = byte }
            }
        }
    }

    /// The authorization a host sent as the `Authorization` value `refused` (`Bearer <token>`
    /// or `DPoP <token>`, the scheme in any case) for `method` `url`, with the proof's nonce
    /// `dpopNonce` if it carried one: what a host that keeps only the header it sent (the C
    /// API) hands back to `SessionManager.unauthorized`.
    /// - Throws: `invalidArgument` when `method` / `url` cannot be authorized (as
    ///   `authorization(method:url:)`) or `refused` is not a Bearer or DPoP value with a token.
    package init(refused: Secret, method: String, url: String, dpopNonce: String? = nil) throws(SessionError) {
        if let problem = Self.problem(method: method, url: url) {
            throw SessionError(.invalidArgument, problem)
        }
        let isDPoP = refused.withUnsafeBytes { bytes in
            bytes.count > 5 && zip(bytes.prefix(4), "dpop".utf8).allSatisfy { ($0 | 0x20) == $1 } && bytes[4] == 0x20
        }
        let prefix = Array((isDPoP ? "dpop" : "bearer").utf8)
        let token: Secret? = refused.withUnsafeBytes { bytes in
            guard bytes.count > prefix.count,
                  zip(bytes.prefix(prefix.count), prefix).allSatisfy({ ($0 | 0x20) == $1 }),
                  bytes[prefix.count] == 0x20
            else { return nil }
            var start = prefix.count
            while start < bytes.count, bytes[start] == 0x20 { start += 1 }
            var end = bytes.count
            while end > start, bytes[end - 1] == 0x20 { end -= 1 }
            guard end > start else { return nil }
            return Secret(copying: UnsafeRawBufferPointer(rebasing: bytes[start..<end]))
        }
        guard let token else {
            throw SessionError(.invalidArgument, "the refused authorization is not a Bearer or DPoP value with a token (\"Bearer <token>\")")
        }
        self.init(accessToken: token, method: method, url: url)
        if isDPoP { self.scheme = .dpop }
        self.dpopNonce = dpopNonce
    }

    /// The value of the field `name` (case-insensitive), if present.
    public func value(of name: String) -> Secret? {
        fields.first { $0.name.lowercased() == name.lowercased() }?.value
    }

    public var description: String {
        "RequestAuthorization(\(scheme.rawValue), \(method) \(url), fields: \(fields.map(\.name).joined(separator: ", ")); values <redacted>)"
    }
}

extension RequestAuthorization {
    /// The longest method name taken (RFC 9110 §9.1 sets none; every registered one is short).
    package static let maximumMethodLength = 32
    /// The longest URL taken: ample for any API request (RFC 9110 §4.1 recommends supporting
    /// 8 000 octets), and a bound on what a DPoP proof will carry.
    package static let maximumURLLength = 8192

    /// Why `method` and `url` cannot be authorized, or nil. The method is an RFC 9110 token
    /// (`tchar`s); the URL is absolute `https://`, or `http://` to a loopback host only (a
    /// bearer token in clear over a network is anyone's), without a fragment, printable ASCII.
    package static func problem(method: String, url: String) -> String? {
        let tchar = Set("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz".utf8)
        guard !method.isEmpty, method.utf8.count <= maximumMethodLength, method.utf8.allSatisfy(tchar.contains) else {
            return "the method is not an HTTP method name (1 to \(maximumMethodLength) token characters)"
        }
        guard url.utf8.count <= maximumURLLength else {
            return "the URL is longer than \(maximumURLLength) bytes"
        }
        guard url.utf8.allSatisfy({ (0x21...0x7E).contains($0) }) else {
            return "the URL holds a space, a control character or a non-ASCII byte (percent-encode it)"
        }
        let lower = url.lowercased()
        let rest: Substring
        if lower.hasPrefix("https://") {
            rest = url.dropFirst("https://".count)
        } else if lower.hasPrefix("http://") {
            rest = url.dropFirst("http://".count)
            guard Self.isLoopback(authority: rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }) else {
                return "the URL uses plain http to a host that is not loopback (the token would travel in clear)"
            }
        } else {
            return "the URL is not an absolute http(s) URL"
        }
        let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        guard !authority.isEmpty, !authority.contains("@") else {
            return "the URL names no host, or carries user information"
        }
        guard !url.contains("#") else {
            return "the URL has a fragment (it is never sent)"
        }
        return nil
    }

    /// Whether an authority (`host[:port]`) names a loopback host: `localhost`, 127.0.0.0/8
    /// or `[::1]`.
    static func isLoopback(authority: Substring) -> Bool {
        var host = authority.lowercased()[...]
        if host.hasPrefix("[") {
            return host.hasPrefix("[::1]") && (host.count == 5 || host.dropFirst(5).first == ":")
        }
        if let colon = host.lastIndex(of: ":") { host = host[..<colon] }
        if host == "localhost" { return true }
        let parts = host.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 4, parts[0] == "127" else { return false }
        return parts.allSatisfy { part in
            !part.isEmpty && part.count <= 3 && part.allSatisfy(\.isASCII) && part.allSatisfy(\.isNumber)
                && Int(part).map { $0 <= 255 } == true
        }
    }
}
