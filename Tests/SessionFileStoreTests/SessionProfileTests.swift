import Crypto
import Foundation
import SessionCore
import Testing

@_spi(Fuzzing) @testable import SessionFileStore

/// The profile (issuer, client, scopes) sealed in the record beside the tokens.
@Suite("FileCredentialStore: the session's profile")
struct SessionProfileTests {
    let profile = SessionProfile(
        issuer: "https://auth.example", clientID: "app", requestedScope: "read", grantedScope: "read",
        tokenEndpoint: "https://auth.example/token", revocationEndpoint: "https://auth.example/revoke")

    /// A record as versions before profiles wrote it (its JSON literally) opens, without one.
    @Test func aRecordWrittenBeforeProfilesOpens() throws {
        let key = SymmetricKey(size: .bits256)
        let json = #"{"version":2,"active":"alice","accounts":{"alice":{"account":"alice","accessToken":"A-1","#
            + #""refreshToken":"R-1","expiresAtNanoseconds":1,"memberID":"alice","expired":false}}}"#
        let document = try FileCredentialStore.decode(FileCredentialStore.seal(Data(json.utf8), key: key), key: key)
        let session = try #require(document.accounts["alice"]).session
        #expect(session.profile == nil)
        #expect(session.accessToken == Secret("A-1") && session.memberID == "alice")
    }

    /// The granted scope (issue 28): sealed with the record, read back; a record without it
    /// (above) reads nil.
    @Test func theGrantedScopeIsSealedAndReadBack() throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        var scoped = session("alice")
        scoped.grantedScope = "read write:all"
        try store.write(scoped)
        guard case .present(let read) = FileCredentialStore(directory: tmp.store).read() else {
            Issue.record("unreadable")
            return
        }
        #expect(read.grantedScope == "read write:all")
        #expect(read == scoped)
        #expect(!String(decoding: contents(store.path), as: UTF8.self).contains("write:all"), "sealed, not plain")
        try store.write(session("alice"))
        guard case .present(let without) = store.read() else { Issue.record("unreadable"); return }
        #expect(without.grantedScope == nil)
    }

    /// The DPoP key (issue 31): sealed with the record as a secret member, read back as the
    /// same key; a record without one (above, and every record before DPoP) reads nil; a
    /// member that is no key makes the record damaged, never a session with another key.
    @Test func theDPoPKeyIsSealedAndReadBack() throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        var bound = session("alice")
        let key = DPoPKey.generate()
        bound.dpopKey = key
        try store.write(bound)
        guard case .present(let read) = FileCredentialStore(directory: tmp.store).read() else {
            Issue.record("unreadable")
            return
        }
        #expect(read.dpopKey == key && read.dpopKey?.thumbprint == key.thumbprint)
        #expect(read == bound)
        let file = String(decoding: contents(store.path), as: UTF8.self)
        #expect(!file.contains(key.encodedPrivateKey.reveal()) && !file.contains("dpopKey"), "sealed, not plain")
        let bad = SymmetricKey(size: .bits256)
        let json = #"{"version":2,"active":"alice","accounts":{"alice":{"account":"alice","accessToken":"A-1","#
            + #""expired":false,"dpopKey":"not-a-key"}}}"#
        #expect(throws: (any Error).self) {
            try FileCredentialStore.decode(FileCredentialStore.seal(Data(json.utf8), key: bad), key: bad)
        }
    }

    /// Sealed with the record; kept through the writes of a session that knows no profile (a
    /// refresh); gone with the record (logout); `setProfile` needs a record.
    @Test func theProfileIsKeptThroughWritesAndGoesWithTheRecord() throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        #expect(try store.setProfile(profile, account: "alice") == false)
        try store.write(session("alice"))
        #expect(try store.setProfile(profile, account: "alice"))
        guard case .present(let read) = FileCredentialStore(directory: tmp.store).read() else {
            Issue.record("unreadable")
            return
        }
        #expect(read.profile == profile)
        #expect(!String(decoding: contents(store.path), as: UTF8.self).contains("auth.example"), "sealed, not plain")

        try store.account("alice", isActive: true).write(session("alice", access: "SENTINEL-ROTATED"))
        try store.write(session("alice", access: "SENTINEL-ROTATED-2"))
        guard case .present(let after) = store.read() else { Issue.record("unreadable"); return }
        #expect(after.profile == profile && after.accessToken == Secret("SENTINEL-ROTATED-2"))

        try store.account("alice", isActive: true).clear()
        try store.write(session("alice"))
        guard case .present(let fresh) = store.read() else { Issue.record("unreadable"); return }
        #expect(fresh.profile == nil, "a new sign-in after logout starts without the old profile")
    }

    /// An expired record keeps who its tokens were from, but tokens written over it are a new
    /// sign-in (maybe at another issuer, by a host that gives no profile): they do not take the
    /// old profile, which would send them to the old issuer (watch-session judges by it).
    @Test func tokensWrittenOverAnExpiredRecordDoNotTakeItsProfile() throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        var signedIn = session("alice")
        signedIn.profile = profile
        try store.write(signedIn)
        try store.write(StoredSession(memberID: "alice", expired: true))
        guard case .present(let expired) = store.read() else { Issue.record("unreadable"); return }
        #expect(expired.expired && expired.profile == profile, "the expired record says whose it was")
        try store.write(session("alice", access: "SENTINEL-AGAIN"))
        guard case .present(let again) = store.read() else { Issue.record("unreadable"); return }
        #expect(again.accessToken == Secret("SENTINEL-AGAIN") && again.profile == nil)
    }

    @Test func issuersCompareWithoutATrailingSlashOrCase() {
        #expect(profile.isIssuer("https://AUTH.example/"))
        #expect(!profile.isIssuer("https://other.example"))
        #expect(SessionProfile(issuer: "https://a.example/Tenant", clientID: "c").isIssuer("https://a.example/Tenant/"))
        #expect(!SessionProfile(issuer: "https://a.example/Tenant", clientID: "c").isIssuer("https://a.example/tenant"))
    }
}
