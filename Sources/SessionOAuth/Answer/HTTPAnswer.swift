import FoundationEssentials
import SessionCore

/// An HTTP answer as the parsers see it (SPI Fuzzing: the fuzz targets in Tools/ call the parsers).
@_spi(Fuzzing) public struct HTTPAnswer: Sendable {
    public let status: Int
    public let retryAfter: Duration?
    /// The DPoP-Nonce header's value (RFC 9449 §8), if the answer had one.
    public let dpopNonce: String?
    /// The body, in memory a secret owns (zeroed when the answer goes).
    let secretBody: Secret
    public let redactions: [Secret]

    /// The members whose string values are secrets: parsed into `Secret`s, never `String`s.
    static let secretMembers: Set<String> = ["access_token", "refresh_token", "id_token", "device_code"]
    /// The most secrets an answer may hold (each is a page of its own: a server must not be
    /// able to make thousands). A token answer has one of each member, at the top.
    static let maximumSecrets = 16

    public init(status: Int, retryAfter: Duration?, body: Data, redactions: [Secret], dpopNonce: String? = nil) {
        self.init(
            status: status, retryAfter: retryAfter,
            secretBody: body.withUnsafeBytes { Secret(copying: $0) }, redactions: redactions, dpopNonce: dpopNonce)
    }

    init(status: Int, retryAfter: Duration?, secretBody: Secret, redactions: [Secret], dpopNonce: String? = nil) {
        self.status = status
        self.retryAfter = retryAfter
        self.dpopNonce = dpopNonce
        self.secretBody = secretBody
        self.redactions = redactions
    }

    /// A copy of the body (tests and fuzzers; the library reads `json`).
    public var body: Data { secretBody.withUnsafeBytes { Data($0) } }

    /// The body as a JSON object (its top-level members), nil if it is not one. The values
    /// of `secretMembers` are read into secrets (`JSONObject.secret`), never into strings.
    var json: JSONObject? {
        guard let redacted = secretBody.withUnsafeBytes({ SecretJSON.redact($0, keys: Self.secretMembers, maximumSecrets: Self.maximumSecrets) }),
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
