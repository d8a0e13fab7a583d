import Foundation
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import Testing

@testable import SessionFileStore

/// One authority for both "processes": counts refreshes, answers a little later from
/// another thread, rotating the refresh token each time.
final class RotatingAuthority: SessionAuthority, @unchecked Sendable {
    private let lock = NSLock()
    private var count = 0
    private(set) var sent: [String] = []

    var refreshes: Int { lock.withLock { count } }

    func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
        let n: Int = lock.withLock {
            count += 1
            sent.append(request.refreshToken.reveal())
            return count
        }
        DispatchQueue.global().asyncAfter(deadline: .now() + 0.2) {
            completion.succeed(TokenGrant(
                accessToken: Secret("rotated-access-\(n)"), refreshToken: Secret("rotated-refresh-\(n)"),
                expiresIn: .seconds(3600)))
        }
    }
}

/// A session with its own loop and its own store instance (its own lock file descriptor),
/// as a second process would have.
func participant<Authority: SessionAuthority>(
    directory: String, authority: Authority
) async throws -> SessionHarness<Authority, FileCredentialStore> {
    try await SessionHarness(loopName: "participant", authority: authority, store: FileCredentialStore(directory: directory))
}

@Suite("Shared file store", .serialized)
struct SharedStoreTests {
    @Test func twoSessionsNeedingATokenCauseOneRefreshAndBothEndRotated() async throws {
        let tmp = TemporaryDirectory()
        let authority = RotatingAuthority()
        // A stored, expired session both start from
        try FileCredentialStore(directory: tmp.store).write(StoredSession(
            accessToken: Secret("old-access"), refreshToken: Secret("old-refresh"),
            accessTokenExpiresAt: .seconds(1), memberID: "alice"))
        let a = try await participant(directory: tmp.store, authority: authority)
        let b = try await participant(directory: tmp.store, authority: authority)
        async let tokenA = a.manager.freshAccessToken()
        async let tokenB = b.manager.freshAccessToken()
        let (ta, tb) = try await (tokenA, tokenB)
        #expect(authority.refreshes == 1)
        #expect(authority.sent == ["old-refresh"])
        #expect(ta.reveal() == "rotated-access-1")
        #expect(tb.reveal() == "rotated-access-1")
        guard case .present(let stored) = FileCredentialStore(directory: tmp.store).read() else {
            Issue.record("the store lost the session")
            return
        }
        #expect(stored.refreshToken?.reveal() == "rotated-refresh-1")
        await a.stop()
        await b.stop()
    }

    @Test func anotherProcessesSignInRefreshAndLogoutAppearWithinASecond() async throws {
        let tmp = TemporaryDirectory()
        let authority = RotatingAuthority()
        let a = try await participant(directory: tmp.store, authority: authority)
        let b = try await participant(directory: tmp.store, authority: authority)
        // sign-in in A shows up in B
        try await a.manager.signIn(SessionTokens(
            accessToken: Secret("a-access"), refreshToken: Secret("a-refresh"), expiresIn: .seconds(3600), memberID: "alice"))
        #expect(await eventually(timeout: .seconds(20)) { b.manager.state.value == .loggedIn })
        #expect(b.manager.memberID == "alice")
        // a refresh in A (forced by a 401) is adopted by B without a request of its own
        let fresh = try await a.manager.handleUnauthorized(token: Secret("a-access"))
        #expect(fresh.reveal() == "rotated-access-1")
        #expect(await eventually(timeout: .seconds(20)) { (try? awaitToken(b.manager)) == "rotated-access-1" })
        #expect(authority.refreshes == 1)
        // (the event is delivered on B's loop after the token is visible: wait for it)
        #expect(await eventually(timeout: .seconds(20)) {
            b.events.withLockedValue { $0 }.contains { if case .tokenRefreshed(_, .sharedStore) = $0 { true } else { false } }
        })
        // logout in A logs B out
        try await a.manager.logout()
        #expect(await eventually(timeout: .seconds(20)) { b.manager.state.value == .loggedOut })
        #expect(await eventually(timeout: .seconds(20)) { b.events.withLockedValue { $0 }.contains(.signedOut(reason: .otherProcess)) })
        await a.stop()
        await b.stop()
    }
}

/// The current token, synchronously (for polling).
func awaitToken(_ manager: SessionManager) throws -> String? {
    let box = LockedBox<String?>(nil)
    let done = Latch()
    try manager.freshAccessToken { result in
        box.withLockedValue { $0 = try? result.get().reveal() }
        done.signal()
    }
    done.wait()
    return box.withLockedValue { $0 }
}
