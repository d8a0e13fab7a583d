/// Whether the OAuth client binds its tokens to a DPoP key (RFC 9449).
public enum DPoPMode: String, Sendable, Hashable, Codable, CaseIterable {
    /// Bearer tokens (the default).
    case off
    /// Every sign-in makes a key and proves it; a token answer whose `token_type` is not
    /// `DPoP` (the server ignored the proof) is a configuration error.
    case required
    /// DPoP when the server's metadata lists ES256 in `dpop_signing_alg_values_supported`,
    /// bearer tokens otherwise (and when it answers `token_type` Bearer to a sign-in's proof).
    case ifSupported
}
