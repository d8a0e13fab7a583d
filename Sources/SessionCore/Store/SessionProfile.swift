/// Who a stored session belongs to at the server: the issuer that minted its tokens, the
/// client they were issued to, the scope asked for and the scope granted, and the endpoints
/// discovery found (so that a later process can refresh or revoke without asking the issuer's
/// metadata again). Kept beside the tokens in the same sealed record (`StoredSession.profile`):
/// a stored token is only ever sent to the issuer that minted it. No secret in it.
public struct SessionProfile: Sendable, Hashable, Codable, CustomStringConvertible {
    /// The issuer URL the session signed in with (as given to discovery).
    public var issuer: String
    public var clientID: String
    /// The scope asked for at sign-in (nil: none asked for, the server's default).
    public var requestedScope: String?
    /// The scope the token endpoint granted (nil: it did not say, RFC 6749 §5.1: as requested).
    public var grantedScope: String?
    /// The token endpoint discovery found (refreshes go there).
    public var tokenEndpoint: String?
    /// The revocation endpoint discovery found (logout revokes there), if any.
    public var revocationEndpoint: String?
    /// How the session signed in with DPoP (RFC 9449): nil when off (and in profiles written
    /// before DPoP existed).
    public var dpop: DPoPMode?

    public init(
        issuer: String, clientID: String, requestedScope: String? = nil, grantedScope: String? = nil,
        tokenEndpoint: String? = nil, revocationEndpoint: String? = nil, dpop: DPoPMode? = nil
    ) {
        self.dpop = dpop
        self.issuer = issuer
        self.clientID = clientID
        self.requestedScope = requestedScope
        self.grantedScope = grantedScope
        self.tokenEndpoint = tokenEndpoint
        self.revocationEndpoint = revocationEndpoint
    }

    /// The scope in force: the granted one, else the requested one.
    public var scope: String? { grantedScope ?? requestedScope }

    /// Whether `other` names the same issuer (a trailing `/` aside; scheme and host compared
    /// without regard to case, as URLs are).
    public func isIssuer(_ other: String) -> Bool {
        Self.normalized(issuer) == Self.normalized(other)
    }

    static func normalized(_ issuer: String) -> String {
        var text = issuer
        while text.hasSuffix("/") { text.removeLast() }
        // scheme://authority/path: scheme and authority lowered, the path as it is.
        let parts = text.split(separator: "/", maxSplits: 3, omittingEmptySubsequences: false)
        guard parts.count >= 3, parts[0].hasSuffix(":"), parts[1].isEmpty else { return text }
        let head = "\(parts[0].lowercased())//\(parts[2].lowercased())"
        return parts.count == 4 ? head + "/" + parts[3] : head
    }

    public var description: String {
        "SessionProfile(issuer: \(issuer), clientID: \(clientID), scope: \(scope ?? "nil"))"
    }
}
