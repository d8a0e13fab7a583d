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

@Suite("Shared store regressions found in review", .serialized)
struct SharedStoreRegressionTests {
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
