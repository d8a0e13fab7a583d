// The store file's format, apart from its I/O: the document and its records, their JSON
// (tokens never in a `String`), and seal/open (header, AES-GCM). Pure: what the fuzz target
// in Tools/Sources/FuzzStoreDecoder calls.

import Crypto
import FoundationEssentials
import SessionCore

extension FileCredentialStore {
    /// What the file holds, once decrypted.
    @_spi(Fuzzing) public struct Document: Codable {
        public var version = 2
        public var active: String?
        public var accounts: [String: Record] = [:]

        public init() {}

        static let secretsKey = CodingUserInfoKey(rawValue: "sessionflow.secrets")!
        static let placeholdersKey = CodingUserInfoKey(rawValue: "sessionflow.placeholders")!
        /// The members that hold tokens.
        static let secretMembers: Set<String> = ["accessToken", "refreshToken", "dpopKey"]

        /// The document's JSON, in memory a secret owns: the tokens never pass through a
        /// `String` (encoded as placeholders, then spliced in).
        func plaintext() throws -> Secret {
            let placeholders = SecretJSON.Placeholders()
            let encoder = JSONEncoder()
            encoder.userInfo[Self.placeholdersKey] = placeholders
            return SecretJSON.splice(Array(try encoder.encode(self)), placeholders)
        }

        /// The document in `plaintext` (which the caller zeroes), its tokens read into secrets.
        static func decode(plaintext: UnsafeRawBufferPointer) throws -> Document {
            guard let redacted = SecretJSON.redact(plaintext, keys: secretMembers) else {
                throw DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: "The given data was not valid JSON."))
            }
            let decoder = JSONDecoder()
            decoder.userInfo[secretsKey] = redacted
            return try decoder.decode(Document.self, from: Data(redacted.json))
        }
    }

    @_spi(Fuzzing) public struct Record: Codable {
        /// The account this record is filed under (set when sealed, checked when opened: a
        /// record found under another account is damaged). Nil only in version-1 files.
        var account: String?
        /// The tokens: never `String`s. Encoded as placeholders that `SecretJSON.splice` fills
        /// in, decoded from the placeholders `SecretJSON.redact` left (see `plaintext(of:)`).
        var accessToken: Secret?
        var refreshToken: Secret?
        var expiresAtNanoseconds: Int64?
        var memberID: String?
        var externalUserID: String?
        var expired: Bool
        /// Issuer, client and scope (`SessionProfile`), sealed with the tokens; absent in
        /// records written before profiles existed (they still open).
        var profile: SessionProfile?
        /// The scope granted to the access token; absent in records written before it was
        /// kept, and when not known (they still open).
        var grantedScope: String?
        /// The DPoP private key (base64url of its 32 bytes, a secret like the tokens); absent
        /// for bearer sessions and in records written before DPoP existed (they still open).
        var dpopKey: DPoPKey?

        init(_ session: StoredSession) {
            accessToken = session.accessToken
            refreshToken = session.refreshToken
            expiresAtNanoseconds = session.accessTokenExpiresAt.map { duration in
                let (seconds, attoseconds) = duration.components
                return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
            }
            memberID = session.memberID
            externalUserID = session.externalUserID
            expired = session.expired
            profile = session.profile
            grantedScope = session.grantedScope
            dpopKey = session.dpopKey
        }

        /// A record for `session` replacing `previous`: a session without a profile (a host
        /// that signed in with bare tokens) keeps the profile the record had, with the granted
        /// scope the session now holds (a refresh that named a scope changed it).
        init(_ session: StoredSession, keepingProfileOf previous: Record?) {
            self.init(session)
            if profile == nil, var kept = previous?.profile {
                if let granted = session.grantedScope { kept.grantedScope = granted }
                profile = kept
            }
        }

        public var session: StoredSession {
            StoredSession(
                accessToken: accessToken, refreshToken: refreshToken,
                accessTokenExpiresAt: expiresAtNanoseconds.map { .nanoseconds($0) },
                memberID: memberID, externalUserID: externalUserID, expired: expired, profile: profile,
                grantedScope: grantedScope, dpopKey: dpopKey)
        }

        private enum CodingKeys: String, CodingKey {
            case account, accessToken, refreshToken, expiresAtNanoseconds, memberID, externalUserID, expired, profile
            case grantedScope, dpopKey
        }

        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            let secrets = decoder.userInfo[Document.secretsKey] as? SecretJSON.Redacted
            func secret(_ key: CodingKeys) throws -> Secret? {
                guard let text = try container.decodeIfPresent(String.self, forKey: key) else { return nil }
                return secrets?.secret(for: text) ?? Secret(text)
            }
            account = try container.decodeIfPresent(String.self, forKey: .account)
            accessToken = try secret(.accessToken)
            refreshToken = try secret(.refreshToken)
            expiresAtNanoseconds = try container.decodeIfPresent(Int64.self, forKey: .expiresAtNanoseconds)
            memberID = try container.decodeIfPresent(String.self, forKey: .memberID)
            externalUserID = try container.decodeIfPresent(String.self, forKey: .externalUserID)
            expired = try container.decode(Bool.self, forKey: .expired)
            profile = try container.decodeIfPresent(SessionProfile.self, forKey: .profile)
            grantedScope = try container.decodeIfPresent(String.self, forKey: .grantedScope)
            if let key = try secret(.dpopKey) {
                do {
                    dpopKey = try DPoPKey(encodedPrivateKey: key)
                } catch {
                    throw DecodingError.dataCorruptedError(forKey: .dpopKey, in: container, debugDescription: "not a DPoP key")
                }
            }
        }

        public func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            let placeholders = encoder.userInfo[Document.placeholdersKey] as? SecretJSON.Placeholders
            func put(_ secret: Secret?, _ key: CodingKeys) throws {
                guard let secret else { return }
                // Without placeholders (only a test or a fuzzer encodes so) the text itself.
                try container.encode(placeholders?.placeholder(for: secret) ?? secret.reveal(), forKey: key)
            }
            try container.encodeIfPresent(account, forKey: .account)
            try put(accessToken, .accessToken)
            try put(refreshToken, .refreshToken)
            try container.encodeIfPresent(expiresAtNanoseconds, forKey: .expiresAtNanoseconds)
            try container.encodeIfPresent(memberID, forKey: .memberID)
            try container.encodeIfPresent(externalUserID, forKey: .externalUserID)
            try container.encode(expired, forKey: .expired)
            try container.encodeIfPresent(profile, forKey: .profile)
            try container.encodeIfPresent(grantedScope, forKey: .grantedScope)
            try put(dpopKey?.encodedPrivateKey, .dpopKey)
        }
    }

    /// The document in a store file's bytes: header, then AES-GCM (authenticating the header
    /// and, from version 2, the store file's name `name`), then JSON; in version 2 every
    /// record must be filed under its own account. `keys`: the store's key ring (version 2
    /// picks the one whose id the header names; version 1 tries each). Throws for anything
    /// else. Pure (SPI Fuzzing: the fuzz target in Tools/ calls it).
    @_spi(Fuzzing) public static func decode(_ bytes: [UInt8], name: String, keys: [SymmetricKey]) throws -> Document {
        guard let header = StoreHeader(bytes), bytes.count > header.count else {
            throw StoreDecodeFailure(.header, "not a SessionFlow store (bad header)")
        }
        guard !keys.isEmpty else {
            throw StoreDecodeFailure(.missingKey, header.source == .secretService ? "its key is missing" : "its key file is missing")
        }
        let box = try AES.GCM.SealedBox(combined: bytes.dropFirst(header.count))
        var plaintext: Data
        if header.version == 1 {
            var opened: Data?
            for key in keys where opened == nil {
                opened = try? withCipherStateScrubbed { try AES.GCM.open(box, using: key, authenticating: header.bytes) }
            }
            guard let opened else { throw StoreDecodeFailure(.authentication, "authentication failed") }
            plaintext = opened
        } else {
            guard let key = keys.first(where: { StoreKeyID.of($0) == header.keyID }) else {
                throw StoreDecodeFailure(.unknownKey, "its key (id \(StoreKeyID.hex(header.keyID))) is not among the store's keys")
            }
            plaintext = try withCipherStateScrubbed {
                try AES.GCM.open(box, using: key, authenticating: header.authenticatedData(name: name))
            }
        }
        defer { plaintext.withUnsafeMutableBytes { zeroSecretMemory($0) } }
        let document = try plaintext.withUnsafeBytes { bytes in try Document.decode(plaintext: bytes) }
        if header.version >= 2 {
            for (account, record) in document.accounts where record.account != account {
                throw StoreDecodeFailure(.binding, "a record is filed under another account than its own")
            }
        }
        return document
    }

    /// `decode` with a single key, for a store file named `session.sfstore`.
    @_spi(Fuzzing) public static func decode(_ bytes: [UInt8], key: SymmetricKey?) throws -> Document {
        try decode(bytes, name: "session.sfstore", keys: key.map { [$0] } ?? [])
    }

    /// A store file's bytes for `document` (the inverse of `decode`): version 2, sealed with
    /// `key` of `source`, each record stamped with the account it is filed under.
    @_spi(Fuzzing) public static func encode(
        _ document: Document, key: SymmetricKey, name: String = "session.sfstore", source: KeySourceTag = .keyFile
    ) throws -> [UInt8] {
        var document = document
        document.version = max(document.version, 2)
        for account in document.accounts.keys { document.accounts[account]?.account = account }
        return try document.plaintext().withUnsafeBytes { plaintext in
            try seal(plaintext, key: key, name: name, source: source)
        }
    }

    /// A store file's bytes around any plaintext: header (version 2: source, key id), then
    /// AES-GCM (authenticating the header and `name`). `encode` seals a document's JSON; the
    /// fuzz target seals arbitrary bytes so that `decode`'s JSON decoding is reached behind
    /// valid authentication.
    @_spi(Fuzzing) public static func seal(
        _ plaintext: some DataProtocol, key: SymmetricKey, name: String = "session.sfstore", source: KeySourceTag = .keyFile
    ) throws -> [UInt8] {
        let header = StoreHeader(source: source, keyID: StoreKeyID.of(key))
        let box = try withCipherStateScrubbed {
            try AES.GCM.seal(plaintext, using: key, authenticating: header.authenticatedData(name: name))
        }
        guard let combined = box.combined else { throw StoreDecodeFailure(.header, "no combined form") }
        return header.bytes + Array(combined)
    }
}

/// Why `decode` refused a file (the text names no content of it).
@_spi(Fuzzing) public struct StoreDecodeFailure: Error, CustomStringConvertible {
    public enum Kind: Sendable {
        /// Not a store file (magic, version, source, length).
        case header
        /// There is no key at all.
        case missingKey
        /// The header names a key the ring lacks.
        case unknownKey
        /// No key of the ring opens it (version 1).
        case authentication
        /// A record is filed under another account than the one it carries.
        case binding
    }

    public let kind: Kind
    public let description: String
    init(_ kind: Kind, _ description: String) {
        self.kind = kind
        self.description = description
    }
}

/// Error text without any content of the file.
func describe(_ error: any Error) -> String {
    switch error {
    case let failure as StoreDecodeFailure: failure.description
    case is CryptoKitError: "authentication failed"
    case is DecodingError: "unreadable content"
    default: "\(type(of: error))"
    }
}
