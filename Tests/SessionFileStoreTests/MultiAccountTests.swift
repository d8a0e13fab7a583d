import Crypto
import Foundation
import LoopFlow
@testable import SessionCore
import SessionFlowTestSupport
import Testing

@_spi(Fuzzing) @testable import SessionFileStore

/// Answers each refresh with tokens derived from the refresh token it was sent
/// ("alice-r" → access "alice-r.a", refresh "alice-r+"), from another thread, a little later;
/// `renames` makes a refresh report another member id (a server that changed the user's id).
final class PerAccountAuthority: SessionAuthority, @unchecked Sendable {
    private let lock = NSLock()
    private var _sent: [String] = []
    var renames: [String: String] = [:]

    var sent: [String] { lock.withLock { _sent } }

    func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
        let token = request.refreshToken.reveal()
        let member = lock.withLock { () -> String? in
            _sent.append(token)
            return request.memberID.flatMap { renames[$0] } ?? request.memberID
        }
        DispatchQueue.global().asyncAfter(deadline: .now() + 0.05) {
            completion.succeed(TokenGrant(
                accessToken: Secret(token + ".a"), refreshToken: Secret(token + "+"), expiresIn: .seconds(3600),
                memberID: member))
        }
    }
}

private func account(_ member: String, lifetime: Duration = .seconds(3600)) -> SessionTokens {
    SessionTokens(
        accessToken: Secret("\(member)-a"), refreshToken: Secret("\(member)-r"), expiresIn: lifetime, memberID: member)
}

/// What the store file (or a copy of it: `bytes`) holds, decrypted with the key file's keys.
func storedDocument(_ directory: String, bytes: [UInt8]? = nil) throws -> FileCredentialStore.Document {
    let ring = contents(directory + "/session.sfstore.key")
    let keys = stride(from: 0, to: ring.count - ring.count % 32, by: 32).map { SymmetricKey(data: ring[$0..<$0 + 32]) }
    return try FileCredentialStore.decode(bytes ?? contents(directory + "/session.sfstore"), name: "session.sfstore", keys: keys)
}

private func record(_ store: FileCredentialStore, _ key: String) -> StoredSession? {
    guard case .present(let stored) = store.account(key, isActive: false).read() else { return nil }
    return stored
}

@Suite("Several accounts", .serialized)
struct MultiAccountTests {
    typealias Session = SessionHarness<PerAccountAuthority, FileCredentialStore>

    private func session(_ tmp: TemporaryDirectory, _ authority: PerAccountAuthority = PerAccountAuthority()) async throws -> Session {
        try await SessionHarness(loopName: "accounts", authority: authority, store: FileCredentialStore(directory: tmp.store, key: .keyFile))
    }

    private func aliceActiveBobInTheBackground(_ tmp: TemporaryDirectory) async throws -> Session {
        let s = try await session(tmp)
        try await s.manager.signIn(account("alice"))
        try await s.manager.addAccount(account("bob"))
        try await s.manager.switchAccount(to: "alice")
        return s
    }

    /// The C API's order: `sf_logout_account` (answered once the session changed in memory),
    /// then what `sf_runtime_destroy` waits for. Blocking calls: on a thread of their own, not
    /// the pool's.
    private func logOutBobAndLetGoAsACHostDoes(_ s: Session) async throws {
        let manager = s.manager
        try await onOwnThread {
            try manager.logoutAndWait(account: "bob")
            manager.waitForStoreWork()
        }
    }

    @Test func twoAccountsAreListedSwitchedAndEachKeepsItsOwnTokens() async throws {
        let tmp = TemporaryDirectory()
        let s = try await session(tmp)
        try await s.manager.signIn(account("alice"))
        try await s.manager.addAccount(account("bob"))
        #expect(s.manager.accounts == [
            SessionAccount(key: "alice", memberID: "alice", state: .loggedIn, isActive: false),
            SessionAccount(key: "bob", memberID: "bob", state: .loggedIn, isActive: true),
        ])
        #expect(s.manager.memberID == "bob")
        #expect(try await s.manager.freshAccessToken().reveal() == "bob-a")
        // The valid-token path (no hop to the loop) answers the active account's token only.
        #expect(s.manager.freshTokenWithoutWaiting()?.reveal() == "bob-a")
        #expect(s.store.readAccounts() == .present(StoredAccounts(keys: ["alice", "bob"], active: "bob")))

        try await s.manager.switchAccount(to: "alice")
        #expect(s.manager.state.value == .loggedIn)
        #expect(s.manager.memberID == "alice")
        #expect(s.manager.freshTokenWithoutWaiting()?.reveal() == "alice-a")
        #expect(try await s.manager.freshAccessToken().reveal() == "alice-a")
        #expect(s.manager.accounts.map(\.isActive) == [true, false])
        #expect(s.events.withLockedValue { $0 }.contains(.accountSwitched(account: "alice")))
        #expect(s.store.readAccounts() == .present(StoredAccounts(keys: ["alice", "bob"], active: "alice")))
        // The active account is what the plain read (and the next start) finds.
        #expect(s.store.read().memberID == "alice")

        // Errors are clear and change nothing.
        await #expect(throws: SessionError.self) { try await s.manager.switchAccount(to: "carol") }
        await #expect(throws: SessionError.self) { try await s.manager.signIn(account("bob")) }
        #expect(s.manager.memberID == "alice")
        #expect(s.manager.accounts.count == 2)
        await s.stop()
    }

    @Test func eachAccountRefreshesOnItsOwnAndOnlyTheActiveOneDrivesTheState() async throws {
        let tmp = TemporaryDirectory()
        let authority = PerAccountAuthority()
        let s = try await session(tmp, authority)
        // Alice's token is short-lived: her session refreshes it in the background.
        try await s.manager.signIn(account("alice", lifetime: .seconds(3)))
        try await s.manager.addAccount(account("bob"))
        let eventsBefore = s.events.withLockedValue { $0.count }
        #expect(await eventually(timeout: .seconds(15)) { authority.sent.contains("alice-r") })
        #expect(await eventually(timeout: .seconds(20)) { record(s.store, "alice")?.refreshToken?.reveal() == "alice-r+" })
        // Bob (active) saw nothing of it: no refresh of his, no event, same token.
        #expect(!authority.sent.contains("bob-r"))
        #expect(!s.events.withLockedValue { $0.dropFirst(eventsBefore) }.contains { if case .tokenRefreshed = $0 { true } else { false } })
        #expect(try await s.manager.freshAccessToken().reveal() == "bob-a")
        #expect(record(s.store, "bob")?.refreshToken?.reveal() == "bob-r")

        // Bob's refresh sends his refresh token and touches only his record.
        #expect(try await s.manager.refreshNow().reveal() == "bob-r.a")
        #expect(authority.sent.filter { $0.hasPrefix("bob") } == ["bob-r"])
        await s.manager.storeWorkDone()
        #expect(record(s.store, "bob")?.refreshToken?.reveal() == "bob-r+")
        #expect(record(s.store, "alice")?.refreshToken?.reveal() == "alice-r+")

        // Switched to, Alice has her refreshed token.
        try await s.manager.switchAccount(to: "alice")
        #expect(try await s.manager.freshAccessToken().reveal() == "alice-r.a")
        await s.stop()
    }

    @Test func signingOutOneAccountLeavesTheOtherIntactAndTheLastLeavesNothing() async throws {
        let tmp = TemporaryDirectory()
        let s = try await session(tmp)
        try await s.manager.signIn(account("alice"))
        try await s.manager.addAccount(account("bob"))
        let bobBefore = record(s.store, "bob")

        let backup = contents(tmp.store + "/session.sfstore")
        #expect(try storedDocument(tmp.store, bytes: backup).accounts.keys.sorted() == ["alice", "bob"])

        try await s.manager.logout(account: "alice")  // in the background
        #expect(s.manager.accounts.map(\.key) == ["bob"])
        // The key was rotated: a copy of the file taken before no longer opens with the key
        // left on the machine (crypto-shredding alice's tokens in every copy).
        #expect(throws: (any Error).self) { try storedDocument(tmp.store, bytes: backup) }
        // The spare, the file as it was before the logout's write, is gone.
        #expect(!tmp.files().contains("session.sfstore.spare"), "\(tmp.files())")
        #expect(s.manager.state.value == .loggedIn)
        #expect(s.manager.memberID == "bob")
        #expect(record(s.store, "alice") == nil)
        #expect(record(s.store, "bob") == bobBefore)
        #expect(try storedDocument(tmp.store).accounts.keys.sorted() == ["bob"])

        // A damaged copy from earlier holds what the file held then.
        let damaged = tmp.store + "/session.sfstore.damaged-1-1"
        _ = FileManager.default.createFile(atPath: damaged, contents: Data(contents(tmp.store + "/session.sfstore")), attributes: [.posixPermissions: 0o600])

        try await s.manager.logout()
        #expect(s.manager.state.value == .loggedOut)
        #expect(s.manager.accounts.isEmpty)
        let document = try storedDocument(tmp.store)
        #expect(document.accounts.isEmpty)
        #expect(document.active == nil)
        // The copy is emptied, its name kept (`RecordWitness`); the spare is gone.
        #expect(!tmp.files().contains { $0.hasSuffix(".spare") }, "\(tmp.files())")
        #expect(FileManager.default.fileExists(atPath: damaged) && contents(damaged).isEmpty, "\(tmp.files())")
        await s.stop()
    }

    @Test func logoutWipesTheRecordWhateverMemberIDsTheSessionPassedThrough() async throws {
        let tmp = TemporaryDirectory()
        let authority = PerAccountAuthority()
        authority.renames = ["alice": "alice-2"]
        let s = try await session(tmp, authority)
        try await s.manager.signIn(account("alice"))
        _ = try await s.manager.refreshNow()
        #expect(s.manager.memberID == "alice-2")
        await s.manager.storeWorkDone()
        // One record, under the key the session signed in with, holding the new member id.
        let during = try storedDocument(tmp.store)
        #expect(during.accounts.keys.sorted() == ["alice"])
        #expect(record(s.store, "alice")?.memberID == "alice-2")

        try await s.manager.logout()
        let after = try storedDocument(tmp.store)
        #expect(after.accounts.isEmpty, "records left: \(after.accounts.keys.sorted())")
        #expect(s.store.read() == .absent)
        await s.stop()
    }

    @Test func aLogoutTheStoreMissedIsClearedWhenItAnswersAgain() async throws {
        let tmp = TemporaryDirectory()
        let s = try await SessionHarness(
            loopName: "accounts", authority: PerAccountAuthority(), store: FileCredentialStore(directory: tmp.store, key: .keyFile)
        ) { $0.storeRetryInterval = .milliseconds(100) }
        try await s.manager.signIn(account("alice"))
        // The disk fails every write for a while: the logout's clear and the next sign-in's write.
        FileIO.injectedWriteErrors.withLockedValue { $0[tmp.store] = EIO }
        try await s.manager.logout()
        try await s.manager.signIn(account("bob"))
        #expect(await s.storeError(containing: "Input/output error") != nil)
        #expect(try storedDocument(tmp.store).accounts.keys.sorted() == ["alice"])  // nothing landed
        _ = FileIO.injectedWriteErrors.withLockedValue { $0.removeValue(forKey: tmp.store) }
        // The owed clear lands with the session's own write: alice's tokens are gone.
        #expect(await eventually(timeout: .seconds(20)) { (try? storedDocument(tmp.store).accounts.keys.sorted()) == ["bob"] })
        #expect(try storedDocument(tmp.store).active == "bob")
        await s.stop()
    }

    /// The C API's order: a background account's logout answered once the session changed in
    /// memory, then the host lets go (`sf_runtime_destroy` waits for the store work). That
    /// account's session leaves the list at once; its clear, on its own worker, must still be
    /// waited for — a slow disk (each read of the store file paused) makes it land late.
    @Test func aBackgroundAccountsLogoutHasLandedWhenTheHostLetsGo() async throws {
        let tmp = TemporaryDirectory()
        let s = try await aliceActiveBobInTheBackground(tmp)
        let paused = LockedBox(0)
        FileIO.injectedPausesAfterOpen.withLockedValue {
            $0[tmp.store] = { name in
                guard name == "session.sfstore" else { return }
                paused.withLockedValue { $0 += 1 }
                usleep(300_000)
            }
        }
        try await logOutBobAndLetGoAsACHostDoes(s)
        _ = FileIO.injectedPausesAfterOpen.withLockedValue { $0.removeValue(forKey: tmp.store) }
        #expect(paused.withLockedValue { $0 } > 0, "no store read was paused: the test tested nothing")
        #expect(try storedDocument(tmp.store).accounts.keys.sorted() == ["alice"])
        await s.stop()
    }

    /// A background account's logout whose clear the disk refuses once: the session leaves
    /// the list at once, but is closed only after that answer came — and a closing session
    /// gives a store that missed a write one last try. Closed before the answer (as it was),
    /// nothing tried again, and the account's tokens came back at the next start.
    @Test func aBackgroundLogoutWhoseClearFailedGetsALastTry() async throws {
        let tmp = TemporaryDirectory()
        let s = try await aliceActiveBobInTheBackground(tmp)
        await s.manager.storeWorkDone()
        FileIO.injectedWriteFailuresLeft.withLockedValue { $0[tmp.store] = 1 }
        defer { _ = FileIO.injectedWriteFailuresLeft.withLockedValue { $0.removeValue(forKey: tmp.store) } }
        try await logOutBobAndLetGoAsACHostDoes(s)
        #expect(FileIO.injectedWriteFailuresLeft.withLockedValue { $0[tmp.store] } == 0, "no write failed: the test tested nothing")
        #expect(try storedDocument(tmp.store).accounts.keys.sorted() == ["alice"])
        await s.stop()
    }

    /// The active account's logout whose clear the disk refuses once, then another account
    /// signs in and its write lands: the store is no longer behind, but alice's clear is still
    /// owed. Closed before the retry timer fires, the session gives that clear a last try —
    /// without it alice's tokens stayed on disk and came back at the next start.
    @Test func aLogoutsClearStillOwedAtCloseGetsALastTry() async throws {
        let tmp = TemporaryDirectory()
        let s = try await SessionHarness(
            loopName: "accounts", authority: PerAccountAuthority(), store: FileCredentialStore(directory: tmp.store, key: .keyFile)
        ) { $0.storeRetryInterval = .seconds(600) }  // the retry must not be what clears it
        try await s.manager.signIn(account("alice"))
        await s.manager.storeWorkDone()
        FileIO.injectedWriteFailuresLeft.withLockedValue { $0[tmp.store] = 1 }
        defer { _ = FileIO.injectedWriteFailuresLeft.withLockedValue { $0.removeValue(forKey: tmp.store) } }
        try await s.manager.logout()
        try await s.manager.signIn(account("bob"))
        await s.manager.storeWorkDone()
        #expect(FileIO.injectedWriteFailuresLeft.withLockedValue { $0[tmp.store] } == 0, "no write failed: the test tested nothing")
        #expect(try storedDocument(tmp.store).accounts.keys.sorted() == ["alice", "bob"])  // the clear is owed
        await s.stop()
        #expect(try storedDocument(tmp.store).accounts.keys.sorted() == ["bob"])
    }

    @Test func aRestartRestoresTheActiveAccountAndStartsTheOthersInTheBackground() async throws {
        let tmp = TemporaryDirectory()
        let authority = PerAccountAuthority()
        let first = try await session(tmp, authority)
        try await first.manager.signIn(account("alice"))
        try await first.manager.addAccount(account("bob"))
        try await first.manager.switchAccount(to: "alice")
        await first.stop()

        let again = try await session(tmp, authority)
        #expect(await eventually(timeout: .seconds(20)) { again.manager.accounts.count == 2 })
        #expect(again.manager.state.value == .loggedIn)
        #expect(again.manager.memberID == "alice")
        #expect(again.manager.accounts == [
            SessionAccount(key: "alice", memberID: "alice", state: .loggedIn, isActive: true),
            SessionAccount(key: "bob", memberID: "bob", state: .loggedIn, isActive: false),
        ])
        try await again.manager.switchAccount(to: "bob")
        #expect(try await again.manager.freshAccessToken().reveal() == "bob-a")
        await again.stop()
    }

    @Test func anAccountSignedOutInAnotherProcessLeavesTheList() async throws {
        let tmp = TemporaryDirectory()
        let authority = PerAccountAuthority()
        let a = try await session(tmp, authority)
        try await a.manager.signIn(account("alice"))
        try await a.manager.addAccount(account("bob"))
        let b = try await session(tmp, authority)  // restores bob (active), alice in the background
        #expect(await eventually(timeout: .seconds(20)) { b.manager.accounts.count == 2 })
        try await b.manager.logout(account: "alice")
        #expect(await eventually(timeout: .seconds(20)) { a.manager.accounts.map(\.key) == ["bob"] })
        #expect(a.manager.memberID == "bob")
        #expect(a.manager.state.value == .loggedIn)
        // An account signed in elsewhere joins the list (in the background: bob stays active).
        try await b.manager.addAccount(account("carol"))
        #expect(await eventually(timeout: .seconds(20)) { a.manager.accounts.map(\.key) == ["bob", "carol"] })
        #expect(a.manager.memberID == "bob")
        try await a.manager.switchAccount(to: "carol")
        #expect(try await a.manager.freshAccessToken().reveal() == "carol-a")
        await a.stop()
        await b.stop()
    }
}

extension StoreRead {
    fileprivate var memberID: String? {
        if case .present(let stored) = self { stored.memberID } else { nil }
    }
}
