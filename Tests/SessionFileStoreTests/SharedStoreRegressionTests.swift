import Foundation
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import Testing

@testable import SessionFileStore

/// A shared file store whose clear() can be made to fail (disk full, say).
final class FlakyShared: SharedCredentialStore, @unchecked Sendable {
    let inner: FileCredentialStore
    let failClear = LockedBox(false)
    init(_ inner: FileCredentialStore) { self.inner = inner }
    func read() -> StoreRead { inner.read() }
    func write(_ s: StoredSession) throws(StoreError) { try inner.write(s) }
    func clear() throws(StoreError) {
        if failClear.withLockedValue({ $0 }) { throw StoreError("injected ENOSPC") }
        try inner.clear()
    }
    func tryAcquireRefreshLease(for duration: Duration) -> RefreshLeaseResult { inner.tryAcquireRefreshLease(for: duration) }
    func releaseRefreshLease() { inner.releaseRefreshLease() }
    func directoryToWatch() -> String? { inner.directoryToWatch() }
}

/// A shared file store with no directory to watch (inotify exhausted, NFS): another process's
/// writes are only seen when the session reads (its lease look before a refresh).
final class Unwatched: SharedCredentialStore, @unchecked Sendable {
    let inner: FileCredentialStore
    init(_ inner: FileCredentialStore) { self.inner = inner }
    func read() -> StoreRead { inner.read() }
    func write(_ s: StoredSession) throws(StoreError) { try inner.write(s) }
    func clear() throws(StoreError) { try inner.clear() }
    func tryAcquireRefreshLease(for duration: Duration) -> RefreshLeaseResult { inner.tryAcquireRefreshLease(for: duration) }
    func releaseRefreshLease() { inner.releaseRefreshLease() }
    func directoryToWatch() -> String? { nil }
}

/// Records the profile each refresh came with, and rotates.
final class ProfileRecordingAuthority: SessionAuthority, @unchecked Sendable {
    let seen = LockedBox<[(refreshToken: String, issuer: String?)]>([])
    func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
        let n = seen.withLockedValue { seen in
            seen.append((request.refreshToken.reveal(), request.profile?.issuer))
            return seen.count
        }
        completion.succeed(TokenGrant(
            accessToken: Secret("access-\(n)"), refreshToken: Secret("refresh-\(n)"), expiresIn: .seconds(3600)))
    }
}

@Suite("Shared store regressions found in review", .serialized)
struct SharedStoreRegressionTests {
    /// Tokens another process stored, taken at the lease look before a refresh (no watch told
    /// of them), come with their profile: alice signed in again at Y elsewhere; her next
    /// refresh says Y, not X (watch-session's issuer check goes by it).
    @Test func tokensTakenAtTheLeaseLookBringTheirProfile() async throws {
        let tmp = TemporaryDirectory()
        let loop = try EventLoop(name: "lease-profile")
        let file = FileCredentialStore(directory: tmp.store)
        let authority = ProfileRecordingAuthority()
        let manager = try await loop.submit {
            try SessionManager(loop: loop, authority: authority, store: Unwatched(file))
        }
        let x = SessionProfile(issuer: "https://x.example", clientID: "c", tokenEndpoint: "https://x.example/token")
        let y = SessionProfile(issuer: "https://y.example", clientID: "c", tokenEndpoint: "https://y.example/token")
        try await manager.signIn(SessionTokens(
            accessToken: Secret("a-x"), refreshToken: Secret("r-x"), expiresIn: .seconds(3600), memberID: "alice", profile: x))
        // Another process: alice again, at Y.
        try file.write(StoredSession(
            accessToken: Secret("a-y"), refreshToken: Secret("r-y"),
            accessTokenExpiresAt: SessionConfiguration.realtime() + .seconds(3600), memberID: "alice", profile: y))
        for _ in 0..<2 { _ = try await manager.refreshNow() }
        let sent = authority.seen.withLockedValue { $0 }
        #expect(!sent.isEmpty, "no refresh was made")
        for refresh in sent where refresh.refreshToken == "r-y" {
            #expect(refresh.issuer == "https://y.example", "Y's refresh token went out as X's: \(sent)")
        }
        #expect(sent.contains { $0.refreshToken == "r-y" || $0.issuer == "https://y.example" }, "\(sent)")
        await manager.close()
        _ = try? loop.shutdown()
    }

    @Test func aLogoutWhoseClearFailedIsNotUndoneByTheStoreWatch() async throws {
        let tmp = TemporaryDirectory()
        let loop = try EventLoop(name: "r3")
        let store = FlakyShared(FileCredentialStore(directory: tmp.store))
        let manager = try await loop.submit {
            try SessionManager(loop: loop, authority: RotatingAuthority(), store: store)
        }
        try await manager.signIn(SessionTokens(
            accessToken: Secret("a1"), refreshToken: Secret("r1"), expiresIn: .seconds(3600), memberID: "alice"))
        // The watch must be up, or the change below is never seen and nothing is tested.
        #expect(await eventually { await manager.watchesStore() }, "the session never watched its store")
        store.failClear.withLockedValue { $0 = true }
        try await manager.logout()
        #expect(manager.state.value == .loggedOut)
        // Any directory entry change (a temp file, another process's lock file...)
        _ = FileManager.default.createFile(atPath: tmp.store + "/unrelated", contents: Data())
        try await Task.sleep(for: .milliseconds(400))
        #expect(manager.state.value == .loggedOut, "the logout was undone")
        await manager.close()
        _ = try? loop.shutdown()
    }

    @Test func oneStoreInstanceStillExcludesASecondRefresher() {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        #expect(store.tryAcquireRefreshLease(for: .seconds(30)) == .acquired)
        guard case .busy(let holder?) = store.tryAcquireRefreshLease(for: .seconds(30)) else {
            Issue.record("the instance holding the lease got it a second time (two sessions sharing it would both refresh)")
            return
        }
        #expect(holder.pid == getpid() && holder.isThisProcess)
        store.releaseRefreshLease()
        #expect(store.tryAcquireRefreshLease(for: .seconds(30)) == .acquired)
        store.releaseRefreshLease()
    }
}
