import Foundation
@_spi(Testing) import LoopFlow
import SessionFlowTestSupport
import Testing

@testable import SessionCore

/// `freshAccessToken()`'s fast path (issue 32, the valid-token path): a token that is valid and
/// not due is answered from the published snapshot, without a hop to the loop; everything else
/// still goes to the loop.
@Suite("The valid-token fast path")
struct FastTokenPathTests {
    static func signIn(_ h: Harness, refresh: Bool = true, lifetime: Duration = .seconds(3600)) async throws {
        try await h.manager.signIn(SessionTokens(
            accessToken: Sentinel.access(1), refreshToken: refresh ? Sentinel.refresh(1) : nil, expiresIn: lifetime,
            memberID: "member-1"))
        try await h.settle()
    }

    /// Runs `body` while the loop thread is held in a job of its own; a hang guard lets the
    /// loop go after 10 s (a body that waited for the loop then ends, late). Returns what body
    /// returned and whether it returned while the loop was still held.
    static func whileTheLoopIsHeld<T: Sendable>(_ h: Harness, _ body: () async throws -> T) async throws -> (T, held: Bool) {
        let entered = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let released = LockedBox(false)
        try h.loop.execute {
            entered.signal()
            _ = release.wait(timeout: .now() + 10)
            released.withLockedValue { $0 = true }
        }
        entered.wait()
        defer { release.signal() }
        let value = try await body()
        return (value, !released.withLockedValue { $0 })
    }

    @Test func aValidTokenIsAnsweredWhileTheLoopIsBusy() async throws {
        let h = try await Harness()
        try await Self.signIn(h)
        let (token, held) = try await Self.whileTheLoopIsHeld(h) { try await h.manager.freshAccessToken() }
        #expect(token == Sentinel.access(1))
        #expect(held, "the token came only once the loop was free")
        await h.stop()
    }

    @Test func everythingElseGoesToTheLoop() async throws {
        let h = try await Harness()
        // Signed out: nothing to answer from the snapshot.
        #expect(h.manager.freshTokenWithoutWaiting() == nil)
        try await Self.signIn(h, refresh: false)
        #expect(h.manager.freshTokenWithoutWaiting() == Sentinel.access(1))
        #expect(h.manager.engine.freshTokenWithoutWaiting() == Sentinel.access(1))  // (the job path's)
        // Within the margin of expiry (no refresh token: no proactive refresh runs meanwhile).
        let policy = RefreshPolicy()
        try await h.advance(by: .seconds(3600) - policy.effectiveMargin(lifetime: .seconds(3600)) + .seconds(1))
        #expect(h.manager.freshTokenWithoutWaiting() == nil)
        #expect(try await h.manager.freshAccessToken() == Sentinel.access(1))  // the loop's answer
        // A refresh in flight: callers join it on the loop.
        try await h.manager.logout()
        try await Self.signIn(h)
        h.authority.enqueue(.hang)
        let refreshing = Task { try await h.manager.refreshNow() }
        try await h.settle()
        #expect(h.authority.heldCount == 1)
        #expect(h.manager.freshTokenWithoutWaiting() == nil)
        h.authority.release(.grant(h.authority.nextGrant()))
        _ = try await refreshing.value
        try await h.settle()
        #expect(h.manager.freshTokenWithoutWaiting() != nil)
        // Logged out, then closed: the loop says so (notLoggedIn, shutDown).
        try await h.manager.logout()
        try await h.settle()
        #expect(h.manager.freshTokenWithoutWaiting() == nil)
        try await Self.signIn(h)
        await h.manager.close()
        #expect(h.manager.freshTokenWithoutWaiting() == nil)
        await #expect(throws: SessionError.self) { try await h.manager.freshAccessToken() }
        await h.stop()
    }
}
