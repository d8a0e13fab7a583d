import CLoopHTTP
import FoundationEssentials
import SessionCore

/// Where and as whom the OAuth 2.0 authority talks.
public struct OAuthConfiguration: Sendable {
    /// The token endpoint (RFC 6749 §3.2).
    public var tokenEndpoint: URL
    /// The issuer these endpoints were discovered from (`OAuthDiscovery` sets it); nil when
    /// they were given directly. A sign-in flow with an issuer hands the session a
    /// `SessionProfile` naming it.
    public var issuer: URL?
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
    /// DPoP (RFC 9449): off (bearer tokens, the default), `.required`, or `.ifSupported`
    /// (when `dpopSigningAlgorithms` lists ES256). See `DPoPMode`.
    public var dpop: DPoPMode = .off
    /// The server's `dpop_signing_alg_values_supported` (RFC 9449 §5.1), from discovery; nil
    /// when its metadata lists none (or was not asked).
    public var dpopSigningAlgorithms: [String]?

    /// Whether a sign-in makes a DPoP key and proves it: `.required`, or `.ifSupported` with
    /// ES256 listed by the server.
    public var signsInWithDPoP: Bool {
        switch dpop {
        case .off: false
        case .required: true
        case .ifSupported: dpopSigningAlgorithms?.contains("ES256") == true
        }
    }

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

    /// Whether `url` names a loopback host (127.0.0.0/8, ::1, localhost), whatever its scheme.
    static func isLoopback(_ url: URL) -> Bool {
        guard let host = url.host?.lowercased() else { return false }
        if host == "localhost" || host == "::1" || host == "[::1]" { return true }
        let parts = host.split(separator: ".", omittingEmptySubsequences: false)
        return parts.count == 4 && parts[0] == "127"
            && parts.allSatisfy { $0.count <= 3 && !$0.isEmpty && $0.allSatisfy(\.isASCII) && UInt8($0) != nil }
    }

    /// `check`, for a URL a server named (metadata, a device answer) on behalf of a server at
    /// `origin`: plain http to loopback only when `origin` is itself loopback. A remote https
    /// issuer naming `http://127.0.0.1:8080/token` would have refresh tokens, the client
    /// secret, codes and verifiers sent in clear to whatever a local user binds there.
    static func check(_ url: URL, _ field: String, namedBy origin: URL) throws(OAuthConfigurationError) {
        try check(url, field)
        if lh_url_check(url.absoluteString) == LH_URL_LOOPBACK_HTTP, !isLoopback(origin) {
            throw OAuthConfigurationError(
                field: field, reason: "uses plain http to a loopback host, but the server that named it (\(origin.host ?? "?")) "
                    + "is not loopback: anything on this machine could listen there")
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
