// The store file's format, apart from its I/O: the document and its records, their JSON
// (tokens never in a `String`), and seal/open (header, AES-GCM). Pure: what the fuzz target
// in Tools/Sources/FuzzStoreDecoder calls.

import Crypto
import FoundationEssentials
import SessionCore

extension FileCredentialStore {
    /// What the file holds, once decrypted. Its JSON is written and read by hand
    /// (`SecretJSON.Writer`, `SecretJSON.parse`): the tokens never pass through a `String`, and
    /// a store write spent two thirds of its CPU time in Foundation's Codable for this small,
    /// fixed schema. The member names are those Foundation's encoder wrote before (files
    /// written then open, tested), a member it does not know is skipped, one it needs and
    /// lacks, or of the wrong type, makes the file unreadable (`DecodingError`).
    @_spi(Fuzzing) public struct Document {
        public var version = 2
        public var active: String?
        public var accounts: [String: Record] = [:]
        /// The accounts logged out while copies of a damaged file lay beside the store: their
        /// absence is a logout, not a record lost with the damage (`RecordWitness`). An account
        /// leaves it when it is written again (the copies' names stay for good, and so does the
        /// list of the accounts never signed in again: one entry per account).
        public var cleared: Set<String> = []

        public init() {}

        /// The members that hold tokens.
        static let secretMembers: Set<String> = ["accessToken", "refreshToken", "dpopKey"]

        /// The document's JSON, written straight into memory a secret owns.
        func plaintext() -> Secret {
            let order = accounts.keys.sorted()
            // The DPoP keys' text made once: the writer runs its body twice.
            let dpopKeys = accounts.compactMapValues { $0.dpopKey?.encodedPrivateKey }
            return SecretJSON.Writer.secret { json in
                json.beginObject()
                json.key("version")
                json.integer(Int64(version))
                if let active {
                    json.key("active")
                    json.string(active)
                }
                json.key("accounts")
                json.beginObject()
                for account in order {
                    json.key(account)
                    accounts[account]?.write(into: &json, dpopKey: dpopKeys[account])
                }
                json.endObject()
                if !cleared.isEmpty {
                    json.key("cleared")
                    json.beginArray()
                    for account in cleared.sorted() { json.string(account) }
                    json.endArray()
                }
                json.endObject()
            }
        }

        /// The document in `plaintext` (which the caller zeroes), its tokens read into secrets.
        static func decode(plaintext: UnsafeRawBufferPointer) throws -> Document {
            guard let json = SecretJSON.parse(plaintext, secretKeys: secretMembers) else {
                throw DecodingError.dataCorrupted(.init(codingPath: [], debugDescription: "The given data was not valid JSON."))
            }
            let members = try Members(json, "the document")
            var document = Document()
            guard let version = try members.integer("version").flatMap({ Int(exactly: $0) }) else {
                throw Members.corrupt("version", "missing")
            }
            document.version = version
            document.active = try members.string("active")
            for (account, record) in try Members(members.required("accounts"), "accounts").all {
                document.accounts[account] = try Record(reading: record)
            }
            if let cleared = try members.optional("cleared") {
                guard case .array(let accounts) = cleared else { throw Members.corrupt("cleared", "not an array") }
                for account in accounts { document.cleared.insert(try members.string(account, "cleared")) }
            }
            return document
        }
    }

    @_spi(Fuzzing) public struct Record {
        /// The account this record is filed under (set when sealed, checked when opened: a
        /// record found under another account is damaged). Nil only in version-1 files.
        var account: String?
        /// The tokens: never `String`s (see `Document`).
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
        /// scope the session now holds (a refresh that named a scope changed it) — unless the
        /// record had expired: tokens written over an expired record are a new sign-in, maybe at
        /// another issuer, and a profile says who minted the tokens beside it.
        init(_ session: StoredSession, keepingProfileOf previous: Record?) {
            self.init(session)
            if profile == nil, previous?.expired != true, var kept = previous?.profile {
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

        init(reading value: SecretJSON.Value) throws {
            let members = try Members(value, "a record")
            account = try members.string("account")
            accessToken = try members.secret("accessToken")
            refreshToken = try members.secret("refreshToken")
            expiresAtNanoseconds = try members.integer("expiresAtNanoseconds")
            memberID = try members.string("memberID")
            externalUserID = try members.string("externalUserID")
            expired = try members.bool(members.required("expired"))
            if let profile = try members.optional("profile") {
                let fields = try Members(profile, "a profile")
                let mode = try fields.string("dpop")
                self.profile = SessionProfile(
                    issuer: try fields.string(fields.required("issuer")),
                    clientID: try fields.string(fields.required("clientID")),
                    requestedScope: try fields.string("requestedScope"), grantedScope: try fields.string("grantedScope"),
                    tokenEndpoint: try fields.string("tokenEndpoint"), revocationEndpoint: try fields.string("revocationEndpoint"),
                    dpop: try mode.map { text in
                        guard let mode = DPoPMode(rawValue: text) else { throw Members.corrupt("dpop", "not a DPoP mode") }
                        return mode
                    })
            }
            grantedScope = try members.string("grantedScope")
            if let key = try members.secret("dpopKey") {
                do {
                    dpopKey = try DPoPKey(encodedPrivateKey: key)
                } catch {
                    throw Members.corrupt("dpopKey", "not a DPoP key")
                }
            }
        }

        /// The record's JSON object; `dpopKey` is `dpopKey`'s text (made once by the caller).
        func write(into json: inout SecretJSON.Writer, dpopKey encodedKey: Secret?) {
            json.beginObject()
            json.optional("account", account)
            json.optional("accessToken", secret: accessToken)
            json.optional("refreshToken", secret: refreshToken)
            if let expiresAtNanoseconds {
                json.key("expiresAtNanoseconds")
                json.integer(expiresAtNanoseconds)
            }
            json.optional("memberID", memberID)
            json.optional("externalUserID", externalUserID)
            json.key("expired")
            json.bool(expired)
            if let profile {
                json.key("profile")
                json.beginObject()
                json.key("issuer")
                json.string(profile.issuer)
                json.key("clientID")
                json.string(profile.clientID)
                json.optional("requestedScope", profile.requestedScope)
                json.optional("grantedScope", profile.grantedScope)
                json.optional("tokenEndpoint", profile.tokenEndpoint)
                json.optional("revocationEndpoint", profile.revocationEndpoint)
                json.optional("dpop", profile.dpop?.rawValue)
                json.endObject()
            }
            json.optional("grantedScope", grantedScope)
            json.optional("dpopKey", secret: encodedKey)
            json.endObject()
        }
    }

    /// An object's members, read with the types the store document gives them. An absent
    /// member and `null` are both "none"; anything else of the wrong type is damage.
    struct Members {
        let all: [String: SecretJSON.Value]

        init(_ value: SecretJSON.Value, _ what: String) throws {
            guard case .object(let members) = value else { throw Self.corrupt(what, "not an object") }
            all = members
        }

        static func corrupt(_ member: String, _ problem: String) -> DecodingError {
            .dataCorrupted(.init(codingPath: [], debugDescription: "\(member): \(problem)"))
        }

        func optional(_ key: String) throws -> SecretJSON.Value? {
            switch all[key] {
            case nil, .null?: nil
            case let value?: value
            }
        }

        func required(_ key: String) throws -> SecretJSON.Value {
            guard let value = try optional(key) else { throw Self.corrupt(key, "missing") }
            return value
        }

        func string(_ key: String) throws -> String? {
            try optional(key).map { try string($0, key) }
        }

        func string(_ value: SecretJSON.Value, _ key: String = "a member") throws -> String {
            guard case .string(let text) = value else { throw Self.corrupt(key, "not a string") }
            return text
        }

        func secret(_ key: String) throws -> Secret? {
            guard let value = try optional(key) else { return nil }
            guard case .secret(let secret) = value else { throw Self.corrupt(key, "not a string") }
            return secret
        }

        func integer(_ key: String) throws -> Int64? {
            guard let value = try optional(key) else { return nil }
            guard case .number(let text) = value, let number = Int64(text) else { throw Self.corrupt(key, "not an integer") }
            return number
        }

        func bool(_ value: SecretJSON.Value) throws -> Bool {
            guard case .bool(let flag) = value else { throw Self.corrupt("a member", "not a boolean") }
            return flag
        }
    }

    /// The document in a store file's bytes: header, then AES-GCM (authenticating the header
    /// and, from version 2, the store file's name `name`), then JSON; in version 2 every
    /// record must be filed under its own account. `keys`: the store's key ring (version 2
    /// picks the one whose id the header names; version 1 tries each). Throws for anything
    /// else. Pure (SPI Fuzzing: the fuzz target in Tools/ calls it).
    @_spi(Fuzzing) public static func decode(_ bytes: [UInt8], name: String, keys: [SymmetricKey]) throws -> Document {
        var ids: [[UInt8]?] = []
        return try decode(bytes, name: name, keys: keys, ids: &ids)
    }

    /// `decode`, keeping in `ids` (parallel to `keys`) the key ids it computed, for the save
    /// that follows the load (`LoadedKeys`).
    static func decode(_ bytes: [UInt8], name: String, keys: [SymmetricKey], ids: inout [[UInt8]?]) throws -> Document {
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
                opened = try? withCipherStateScrubbed(.cipher) { try AES.GCM.open(box, using: key, authenticating: header.bytes) }
            }
            guard let opened else { throw StoreDecodeFailure(.authentication, "authentication failed") }
            plaintext = opened
        } else {
            if ids.count != keys.count { ids = Array(repeating: nil, count: keys.count) }
            let match = keys.indices.first { index in
                let id = ids[index] ?? StoreKeyID.of(keys[index])
                ids[index] = id
                return id == header.keyID
            }
            guard let match else {
                throw StoreDecodeFailure(.unknownKey, "its key (id \(StoreKeyID.hex(header.keyID))) is not among the store's keys")
            }
            plaintext = try withCipherStateScrubbed(.cipher) {
                try AES.GCM.open(box, using: keys[match], authenticating: header.authenticatedData(name: name))
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
        _ document: Document, key: SymmetricKey, keyID: [UInt8]? = nil, name: String = "session.sfstore",
        source: KeySourceTag = .keyFile
    ) throws -> [UInt8] {
        var document = document
        document.version = max(document.version, 2)
        for account in document.accounts.keys { document.accounts[account]?.account = account }
        return try document.plaintext().withUnsafeBytes { plaintext in
            try seal(plaintext, key: key, keyID: keyID, name: name, source: source)
        }
    }

    /// A store file's bytes around any plaintext: header (version 2: source, key id), then
    /// AES-GCM (authenticating the header and `name`). `encode` seals a document's JSON; the
    /// fuzz target seals arbitrary bytes so that `decode`'s JSON decoding is reached behind
    /// valid authentication.
    /// `keyID`: `key`'s id when the caller has it (else it is computed).
    @_spi(Fuzzing) public static func seal(
        _ plaintext: some DataProtocol, key: SymmetricKey, keyID: [UInt8]? = nil, name: String = "session.sfstore",
        source: KeySourceTag = .keyFile
    ) throws -> [UInt8] {
        let header = StoreHeader(source: source, keyID: keyID ?? StoreKeyID.of(key))
        let box = try withCipherStateScrubbed(.cipher) {
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

extension SecretJSON.Writer {
    /// `key` and its text when there is one; nothing when there is none.
    mutating func optional(_ key: String, _ text: String?) {
        guard let text else { return }
        self.key(key)
        string(text)
    }

    /// `key` and the secret when there is one; nothing when there is none.
    mutating func optional(_ key: String, secret value: Secret?) {
        guard let value else { return }
        self.key(key)
        secret(value)
    }
}
