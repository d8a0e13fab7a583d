/// What `SessionManager.tokenInfo` tells about the current access token (never the token).
public struct TokenInfo: Sendable, Equatable, CustomStringConvertible {
    /// How the token is presented: `"Bearer"` (RFC 6750), or `"DPoP"` for tokens bound to the
    /// session's DPoP key (RFC 9449).
    public var tokenType: String
    /// The scope granted (RFC 6749 §3.3: space-separated names): the token answer's `scope`,
    /// else the scope asked for (RFC 6749 §5.1); kept through refreshes that do not say
    /// (§6). Nil: not known (a host signed in with tokens and no scope).
    public var scope: String?
    /// Time left until the token expires, on the monotonic clock; negative once expired. Nil
    /// when not known.
    public var expiresIn: Duration?
    /// When the token expires, on the wall clock: milliseconds since the Unix epoch.
    public var expiresAtUnixMilliseconds: Int64?

    public init(tokenType: String, scope: String?, expiresIn: Duration?, expiresAtUnixMilliseconds: Int64?) {
        self.tokenType = tokenType
        self.scope = scope
        self.expiresIn = expiresIn
        self.expiresAtUnixMilliseconds = expiresAtUnixMilliseconds
    }

    /// The scope as its names (empty when not known).
    public var scopes: [String] { scope.map { $0.split(separator: " ").map(String.init) } ?? [] }

    /// Whole milliseconds of `duration`, rounded toward negative infinity.
    static func milliseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        let millis = attoseconds / 1_000_000_000_000_000
        let floored = attoseconds < 0 && attoseconds % 1_000_000_000_000_000 != 0 ? millis - 1 : millis
        return seconds * 1000 + floored
    }

    public var description: String {
        "TokenInfo(tokenType: \(tokenType), scope: \(scope ?? "nil"), expiresIn: \(expiresIn.map { "\($0)" } ?? "nil"), "
            + "expiresAtUnixMilliseconds: \(expiresAtUnixMilliseconds.map { "\($0)" } ?? "nil"))"
    }
}
