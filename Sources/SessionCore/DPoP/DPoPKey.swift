import Crypto

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The key a sender-constrained session proves possession of (DPoP, RFC 9449): an ES256
/// (P-256) key pair made at each sign-in, kept with the session in the sealed store record,
/// gone with the session (logout wipes the record; memory is zeroed when the last copy goes).
///
/// The private key is 32 bytes (the scalar, big-endian) in a `Secret`: memory of its own,
/// left out of core dumps, zeroed at the end. Each proof loads it into swift-crypto for the
/// signature only (BoringSSL zeroes what it allocated for it when the signature is made), so
/// no other copy outlives the call. The public half (`publicJWK`, `thumbprint`) is not secret.
public struct DPoPKey: Sendable, Hashable, CustomStringConvertible {
    /// The private scalar, 32 bytes big-endian.
    public let privateKey: Secret
    /// The public key as a JWK with only the members RFC 7638 §3.2 hashes, in its order:
    /// `{"crv":"P-256","kty":"EC","x":"…","y":"…"}`.
    public let publicJWK: String
    /// RFC 7638 thumbprint: base64url(SHA-256(publicJWK)) — the `jkt` a server binds tokens to.
    public let thumbprint: String
    /// base64url of the proof's JOSE header (typ, alg, jwk): the same for every proof.
    private let encodedHeader: [UInt8]

    /// A new key from the system's random source.
    public static func generate() -> DPoPKey {
        var generator = SystemRandomNumberGenerator()
        while true {
            // The scalar is drawn straight into secret memory: no other copy of it exists.
            // (One in 2^32 draws is not below the group order: drawn again.)
            let scalar = Secret(count: 32) { out in
                for index in 0..<32 { out[index] = UInt8.random(in: .min ... .max, using: &generator) }
            }
            if let key = try? DPoPKey(privateKey: scalar) { return key }
        }
    }

    /// The key whose private scalar is `privateKey` (32 bytes, as `privateKey` holds it).
    /// - Throws: `invalidArgument` when it is not a P-256 private key.
    public init(privateKey: Secret) throws(SessionError) {
        let publicKey: P256.Signing.PublicKey
        do {
            publicKey = try privateKey.withUnsafeBytes { bytes in
                guard bytes.count == 32 else { throw SessionError(.invalidArgument, "a DPoP key is 32 bytes") }
                return try P256.Signing.PrivateKey(rawRepresentation: bytes).publicKey
            }
        } catch {
            throw SessionError(.invalidArgument, "the DPoP key is not a P-256 private key")
        }
        let point = Array(publicKey.x963Representation)  // 0x04 || X || Y
        let jwk = #"{"crv":"P-256","kty":"EC","x":""# + Base64URL.encode(point[1..<33]) + #"","y":""#
            + Base64URL.encode(point[33..<65]) + #""}"#
        self.privateKey = privateKey
        self.publicJWK = jwk
        self.thumbprint = Base64URL.encode(SHA256.hash(data: Array(jwk.utf8)))
        self.encodedHeader = Array(Base64URL.encode(Array((#"{"typ":"dpop+jwt","alg":"ES256","jwk":"# + jwk + "}").utf8)).utf8)
    }

    /// The private key as base64url text in a secret (the store's sealed record holds it so).
    public var encodedPrivateKey: Secret {
        privateKey.withUnsafeBytes { raw in
            Secret(count: Base64URL.encodedCount(raw.count)) { Base64URL.encode(raw, into: $0) }
        }
    }

    /// The key whose private scalar `encodedPrivateKey` gave (base64url text).
    /// - Throws: `invalidArgument` when it is not that.
    public init(encodedPrivateKey text: Secret) throws(SessionError) {
        let raw: Secret? = text.withUnsafeBytes { encoded in
            guard Base64URL.decodedCount(encoded.count) == 32 else { return nil }
            var good = false
            let raw = Secret(count: 32) { good = Base64URL.decode(encoded, into: $0) }
            return good ? raw : nil
        }
        guard let raw else { throw SessionError(.invalidArgument, "the stored DPoP key is not base64url of 32 bytes") }
        try self.init(privateKey: raw)
    }

    /// The most a proof may hold: the URL and nonce are bounded, so is the proof.
    package static let maximumNonceLength = 1024

    /// Whether `nonce` can go into a proof: 1 to `maximumNonceLength` NQCHARs (RFC 9449 §4.2:
    /// %x21 / %x23-5B / %x5D-7E, nothing to escape in JSON). A server's value is checked before
    /// it is remembered: one that is not is never stored (it would fail every later proof).
    package static func isNonce(_ nonce: String) -> Bool {
        !nonce.isEmpty && nonce.utf8.count <= maximumNonceLength
            && nonce.utf8.allSatisfy { $0 == 0x21 || (0x23...0x5B).contains($0) || (0x5D...0x7E).contains($0) }
    }

    /// A DPoP proof (RFC 9449 §4.2) for `method` on `url`: a JWS (ES256) whose header holds
    /// typ `dpop+jwt`, alg `ES256` and the public jwk, and whose claims are a new `jti`
    /// (128 random bits), `htm`, `htu` (`url` without query and fragment), `iat`
    /// (`issuedAt`, seconds since the Unix epoch), `ath` (base64url SHA-256 of `accessToken`,
    /// for a resource request) and `nonce` (when the server gave one).
    /// - Throws: `invalidArgument` for a nonce that is not NQCHARs (RFC 9449 §4.2) or is too
    ///   long; `configuration` should signing fail (it does not with a key this type made).
    public func proof(
        method: String, url: String, accessToken: Secret? = nil, nonce: String? = nil,
        issuedAt: Int64 = DPoPKey.now()
    ) throws(SessionError) -> Secret {
        if let nonce, !Self.isNonce(nonce) {
            throw SessionError(.invalidArgument, "the server's DPoP nonce is not a string of NQCHARs (RFC 9449 §4.2)")
        }
        var claims = #"{"jti":""# + Self.newJTI() + #"","htm":"# + Self.jsonString(method)
            + #","htu":"# + Self.jsonString(Self.targetURI(url)) + #","iat":"# + String(issuedAt)
        if let accessToken {
            // Not swift-crypto's SHA256: it leaves the token's bytes in a freed context.
            let hash = accessToken.withUnsafeBytes { ScrubbedSHA256.hash($0) }
            claims += #","ath":""# + Base64URL.encode(hash) + "\""
        }
        if let nonce { claims += #","nonce":""# + nonce + "\"" }
        claims += "}"
        var input = encodedHeader
        input.append(UInt8(ascii: "."))
        input.append(contentsOf: Base64URL.encode(Array(claims.utf8)).utf8)
        let signature: [UInt8]
        do {
            signature = try privateKey.withUnsafeBytes { raw in
                Array(try P256.Signing.PrivateKey(rawRepresentation: raw).signature(for: input).rawRepresentation)
            }
        } catch {
            throw SessionError(.configuration, "a DPoP proof could not be signed")
        }
        input.append(UInt8(ascii: "."))
        input.append(contentsOf: Base64URL.encode(signature).utf8)
        return input.withUnsafeBytes { Secret(copying: $0) }
    }

    /// `url` without its query and fragment (RFC 9449 §4.2, `htu`).
    package static func targetURI(_ url: String) -> String {
        String(url.prefix { $0 != "?" && $0 != "#" })
    }

    /// Seconds since the Unix epoch (the wall clock: `iat` is compared with the server's).
    public static func now() -> Int64 {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return Int64(time.tv_sec)
    }

    /// 128 random bits, base64url: a `jti` that never repeats (RFC 9449 §11.1).
    private static func newJTI() -> String {
        var generator = SystemRandomNumberGenerator()
        return Base64URL.encode((0..<16).map { _ in UInt8.random(in: .min ... .max, using: &generator) })
    }

    /// `text` as a JSON string (RFC 8259 §7): quote, backslash and controls escaped.
    private static func jsonString(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case _ where scalar.value < 0x20:
                let hex = String(scalar.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out + "\""
    }

    public static func == (lhs: DPoPKey, rhs: DPoPKey) -> Bool { lhs.privateKey == rhs.privateKey }
    public func hash(into hasher: inout Hasher) { hasher.combine(thumbprint) }

    public var description: String { "DPoPKey(ES256, jkt: \(thumbprint), private key <redacted>)" }
}
