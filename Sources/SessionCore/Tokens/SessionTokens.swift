/// What a sign-in hands the session.
public struct SessionTokens: Sendable, Equatable, CustomStringConvertible {
    public var accessToken: Secret
    public var refreshToken: Secret?
    /// Lifetime of the access token from now (from the authority's `expires_in`).
    public var expiresIn: Duration
    /// Who signed in; kept with the session, cleared on logout and reconfigure.
    public var memberID: String?
    /// An id the authority can re-authenticate with, if it supports that fallback.
    public var externalUserID: String?
    /// The scope the token endpoint granted (RFC 6749 §5.1; a sign-in flow fills it in: the
    /// answer's `scope`, else the scope it asked for). Kept with the session, stored with it
    /// and reported by `SessionManager.tokenInfo`; nil: not known.
    public var scope: String?
    /// Who minted the tokens (issuer, client, scopes: `SessionProfile`), when the sign-in
    /// knows (a flow that discovered its issuer fills it in). Stored with the session, in the
    /// same sealed record; nil: not known (the record keeps the profile it had).
    public var profile: SessionProfile?
    /// The DPoP key the tokens are bound to (RFC 9449), for a sender-constrained session: made
    /// by the sign-in flow, kept with the session (sealed in its store record), sent with every
    /// refresh and used by `SessionManager.authorization` for `Authorization: DPoP` and its
    /// proof. Nil: bearer tokens.
    public var dpopKey: DPoPKey?

    public init(
        accessToken: Secret, refreshToken: Secret?, expiresIn: Duration,
        memberID: String? = nil, externalUserID: String? = nil, scope: String? = nil,
        profile: SessionProfile? = nil, dpopKey: DPoPKey? = nil
    ) {
        self.scope = scope
        self.profile = profile
        self.dpopKey = dpopKey
        self.accessToken = accessToken
        self.refreshToken = refreshToken
        self.expiresIn = expiresIn
        self.memberID = memberID
        self.externalUserID = externalUserID
    }

    public var description: String {
        "SessionTokens(accessToken: <redacted>, refreshToken: \(refreshToken == nil ? "nil" : "<redacted>"), "
            + "expiresIn: \(expiresIn), memberID: \(memberID ?? "nil")\(dpopKey == nil ? "" : ", DPoP"))"
    }
}

/// What an authority answers to a refresh or re-authentication.
public struct TokenGrant: Sendable, Equatable, CustomStringConvertible {
    public var accessToken: Secret
    /// A rotated refresh token, or nil to keep the current one (RFC 6749 §6).
    public var refreshToken: Secret?
    /// The access token's lifetime (`expires_in`); negative values count as 0.
    public var expiresIn: Duration
    /// A member id, if the authority reports one (kept otherwise).
    public var memberID: String?
    /// The scope granted, if the answer said (or the authority knows it: the scope it asked
    /// for). Nil keeps the session's current scope (RFC 6749 §6: a refresh without `scope`
    /// keeps the scope of the grant).
    public var scope: String?

    public init(
        accessToken: Secret, refreshToken: Secret? = nil, expiresIn: Duration, memberID: String? = nil,
        scope: String? = nil
    ) {
        self.accessToken = accessToken
        self.refreshToken = refreshToken
        self.expiresIn = expiresIn
        self.memberID = memberID
        self.scope = scope
    }

    public var description: String {
        "TokenGrant(accessToken: <redacted>, refreshToken: \(refreshToken == nil ? "nil" : "<redacted>"), "
            + "expiresIn: \(expiresIn))"
    }
}
