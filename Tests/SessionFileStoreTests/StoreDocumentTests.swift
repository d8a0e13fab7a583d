import Crypto
import Foundation
import SessionCore
import Testing

@_spi(Fuzzing) @testable import SessionFileStore

/// The store document as Foundation's `JSONEncoder` wrote it before the store wrote its JSON
/// by hand: the same members (Codable's synthesized keys), the same omissions (`nil` left
/// out), Foundation's escaping (`\/`). Files written by earlier versions are exactly this.
struct FoundationWrittenDocument: Encodable {
    struct Record: Encodable {
        var account: String?
        var accessToken: String?
        var refreshToken: String?
        var expiresAtNanoseconds: Int64?
        var memberID: String?
        var externalUserID: String?
        var expired: Bool
        var profile: SessionProfile?
        var grantedScope: String?
        var dpopKey: String?
    }

    var version: Int
    var active: String?
    var accounts: [String: Record]

    init(_ document: FileCredentialStore.Document) {
        version = document.version
        active = document.active
        accounts = document.accounts.mapValues { record in
            Record(
                account: record.account, accessToken: record.accessToken?.reveal(), refreshToken: record.refreshToken?.reveal(),
                expiresAtNanoseconds: record.expiresAtNanoseconds, memberID: record.memberID,
                externalUserID: record.externalUserID, expired: record.expired, profile: record.profile,
                grantedScope: record.grantedScope, dpopKey: record.dpopKey?.encodedPrivateKey.reveal())
        }
    }

    static func json(_ document: FileCredentialStore.Document) throws -> Data {
        try JSONEncoder().encode(FoundationWrittenDocument(document))
    }
}

/// The store's plaintext, written and read by hand (`SecretJSON.Writer`, `SecretJSON.parse`):
/// what it writes is JSON any reader reads, what earlier versions wrote still opens, and
/// anything else is damage, not a crash.
@Suite("The store document's JSON")
struct StoreDocumentTests {
    static let key = SymmetricKey(size: .bits256)

    /// A document using every member, with text that needs escaping.
    static func fullDocument() -> FileCredentialStore.Document {
        var document = FileCredentialStore.Document()
        let profile = SessionProfile(
            issuer: "https://issuer.example/realms/a", clientID: "cli\"ent", requestedScope: "openid profile",
            grantedScope: "openid", tokenEndpoint: "https://issuer.example/token", revocationEndpoint: nil, dpop: .ifSupported)
        var alice = FileCredentialStore.Record(StoredSession(
            accessToken: Secret("acc\"ess\\/\u{1}é"), refreshToken: Secret("refresh-α"), accessTokenExpiresAt: .nanoseconds(1_900_000_000_123_456_789),
            memberID: "alice\n", externalUserID: "ext/é\u{7f}", expired: false, profile: profile, grantedScope: "openid",
            dpopKey: DPoPKey.generate()))
        alice.account = "alice"
        var bob = FileCredentialStore.Record(StoredSession(refreshToken: Secret("r"), expired: true))
        bob.account = "bob ☃"
        document.accounts = ["alice": alice, "bob ☃": bob]
        document.active = "alice"
        return document
    }

    static func expectSame(_ one: FileCredentialStore.Document, _ other: FileCredentialStore.Document) {
        #expect(one.version == other.version)
        #expect(one.active == other.active)
        #expect(one.accounts.keys.sorted() == other.accounts.keys.sorted())
        for (account, record) in one.accounts {
            #expect(other.accounts[account]?.session == record.session, "\(account)")
            #expect(other.accounts[account]?.account == record.account, "\(account)")
        }
    }

    @Test func aFileFoundationWroteOpensAsTheSameDocument() throws {
        let document = Self.fullDocument()
        let json = try FoundationWrittenDocument.json(document)
        #expect(String(decoding: json, as: UTF8.self).contains(#"https:\/\/issuer.example"#), "Foundation's escaping")
        let read = try FileCredentialStore.decode(FileCredentialStore.seal(json, key: Self.key), key: Self.key)
        Self.expectSame(document, read)
        #expect(read.accounts["alice"]?.profile?.dpop == .ifSupported)
        #expect(read.accounts["alice"]?.dpopKey != nil)
    }

    @Test func whatTheStoreWritesIsJSONFoundationReadsAndItReadsItBack() throws {
        let document = Self.fullDocument()
        let plaintext = document.plaintext()
        let object = try plaintext.withUnsafeBytes { bytes in
            try #require(try JSONSerialization.jsonObject(with: Data(bytes)) as? [String: Any])
        }
        #expect(object["version"] as? Int == 2)
        #expect(object["active"] as? String == "alice")
        let accounts = try #require(object["accounts"] as? [String: [String: Any]])
        let alice = try #require(accounts["alice"])
        #expect(alice["accessToken"] as? String == "acc\"ess\\/\u{1}é")
        #expect(alice["refreshToken"] as? String == "refresh-α")
        #expect(alice["expiresAtNanoseconds"] as? Int64 == 1_900_000_000_123_456_789)
        #expect(alice["memberID"] as? String == "alice\n")
        #expect(alice["externalUserID"] as? String == "ext/é\u{7f}")
        #expect((alice["profile"] as? [String: Any])?["clientID"] as? String == "cli\"ent")
        #expect((alice["profile"] as? [String: Any])?["dpop"] as? String == "ifSupported")
        #expect((alice["profile"] as? [String: Any]).map { $0.keys.contains("revocationEndpoint") } == false, "nil members are left out")
        #expect(accounts["bob ☃"]?.keys.contains("accessToken") == false)
        #expect(accounts["bob ☃"]?["expired"] as? Bool == true)
        // The same bytes through the store's own reader.
        Self.expectSame(document, try plaintext.withUnsafeBytes { try FileCredentialStore.Document.decode(plaintext: $0) })
        // And Foundation's decoding of it equals the hand-written one's (the schema is the same).
        let viaFoundation = try plaintext.withUnsafeBytes { try JSONDecoder().decode(FoundationReadDocument.self, from: Data($0)) }
        #expect(viaFoundation.accounts["alice"]?.profile == document.accounts["alice"]?.profile)
    }

    @Test func membersItDoesNotKnowAreSkipped() throws {
        let json = #"{"version":2,"future":{"x":[1,2,{"y":null}]},"accounts":{"a":{"account":"a","expired":false,"note":"n","refreshToken":"r"}}}"#
        let document = try Array(json.utf8).withUnsafeBytes { try FileCredentialStore.Document.decode(plaintext: $0) }
        #expect(document.accounts["a"]?.refreshToken == Secret("r"))
        #expect(document.active == nil)
    }

    @Test(arguments: [
        #"[]"#,  // not an object
        #"{"accounts":{}}"#,  // no version
        #"{"version":2}"#,  // no accounts
        #"{"version":"2","accounts":{}}"#,
        #"{"version":2.5,"accounts":{}}"#,
        #"{"version":2,"accounts":{"a":{"account":"a"}}}"#,  // no expired
        #"{"version":2,"accounts":{"a":{"expired":"no"}}}"#,
        #"{"version":2,"accounts":{"a":{"expired":false,"accessToken":7}}}"#,
        #"{"version":2,"accounts":{"a":{"expired":false,"memberID":["m"]}}}"#,
        #"{"version":2,"accounts":{"a":{"expired":false,"profile":{"issuer":"i"}}}}"#,  // no clientID
        #"{"version":2,"accounts":{"a":{"expired":false,"profile":{"issuer":"i","clientID":"c","dpop":"sometimes"}}}}"#,
        #"{"version":2,"accounts":{"a":{"expired":false,"dpopKey":"not a key"}}}"#,
        #"{"version":2,"version":2,"accounts":{}}"#,  // a member named twice
        #"{"version":2,"accounts":{},}"#,  // not JSON
        #"{"version":2,"active":3,"accounts":{}}"#,
    ])
    func aDocumentOfTheWrongShapeIsUnreadableContent(_ json: String) throws {
        let sealed = try FileCredentialStore.seal(Array(json.utf8), key: Self.key)
        #expect(throws: DecodingError.self) { try FileCredentialStore.decode(sealed, key: Self.key) }
    }

    @Test func nullIsNone() throws {
        let json = #"{"version":2,"active":null,"accounts":{"a":{"account":"a","expired":false,"accessToken":null,"profile":null}}}"#
        let document = try Array(json.utf8).withUnsafeBytes { try FileCredentialStore.Document.decode(plaintext: $0) }
        #expect(document.active == nil)
        #expect(document.accounts["a"]?.accessToken == nil)
        #expect(document.accounts["a"]?.profile == nil)
    }
}

/// Foundation's reading of the schema (profiles compared).
private struct FoundationReadDocument: Decodable {
    struct Record: Decodable {
        var profile: SessionProfile?
    }

    var accounts: [String: Record]
}
