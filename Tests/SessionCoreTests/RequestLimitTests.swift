import Dispatch
import LoopFlow
import SessionFlowTestSupport
import Testing

@testable import SessionCore

/// Issue 17, point 2: a loop stuck in a host callback, or a refresh that hangs, once let
/// every token request queue (2 000 000 accepted, RSS 28 → 357 MB). Requests are now counted
/// against `tokenRequestLimit`; beyond it they fail with `busy` at once and nothing is queued.
@Suite("Session: limits on waiting requests")
struct RequestLimitTests {
    /// Signed in with a token that needs a refresh at every request.
    private func dueSession(limit: Int) async throws -> Harness {
        let h = try await Harness { $0.tokenRequestLimit = limit }
        try await h.signIn(1, lifetime: .seconds(120), member: "member-1")
        try await h.loop.submit { h.manager.engine.cancelProactiveRefreshForTesting() }
        try await h.advance(by: .seconds(70))
        return h
    }

    @Test func tokenRequestsBeyondTheLimitAreBusyWhileARefreshHangs() async throws {
        let h = try await dueSession(limit: 3)
        h.authority.enqueue(.hang)
        let answers = LockedBox<[Result<Secret, SessionError>]>([])
        // Given three callers waiting for a refresh the authority does not answer,
        for _ in 0..<3 {
            try h.manager.freshAccessToken { result in answers.withLockedValue { $0.append(result) } }
        }
        try await h.settle()
        #expect(try await h.waitingCallers() == 3)
        // then a fourth is refused at once, and nothing of it is queued,
        let refused = #expect(throws: SessionError.self) {
            try h.manager.freshAccessToken { result in answers.withLockedValue { $0.append(result) } }
        }
        #expect(refused?.code == .busy)
        let refusedAsync = await #expect(throws: SessionError.self) { _ = try await h.manager.refreshNow() }
        #expect(refusedAsync?.code == .busy)
        let refused401 = #expect(throws: SessionError.self) {
            try h.manager.handleUnauthorized(token: Sentinel.access(1)) { _ in }
        }
        #expect(refused401?.code == .busy)
        try await h.settle()
        #expect(try await h.waitingCallers() == 3)
        // and once the refresh is answered, the three get the token and the places are free.
        h.authority.release(.grant(h.authority.nextGrant()))
        try await h.settle()
        let seen = answers.withLockedValue { $0 }
        #expect(seen.count == 3)
        #expect(seen.allSatisfy { (try? $0.get()) != nil })
        #expect(h.manager.tokenRequestsPending.load(ordering: .relaxed) == 0)
        _ = try await h.manager.freshAccessToken()
        h.expectNoSecretsInOutput()
    }

    @Test func tokenRequestsBeyondTheLimitAreBusyWhileTheLoopIsStuck() async throws {
        let h = try await Harness { $0.tokenRequestLimit = 100 }
        try await h.signIn(1)
        // Given a loop stuck in a callback,
        let stuck = DispatchSemaphore(value: 0)
        let inside = DispatchSemaphore(value: 0)
        try h.loop.execute { inside.signal(); stuck.wait() }
        inside.wait()
        let answered = LockedBox(0)
        var accepted = 0
        var busy: SessionError?
        // callers asking for tokens are accepted up to the limit, then refused.
        for _ in 0..<1_000 {
            do {
                try h.manager.freshAccessToken { _ in answered.withLockedValue { $0 += 1 } }
                accepted += 1
            } catch {
                busy = error
                break
            }
        }
        #expect(accepted == 100)
        #expect(busy?.code == .busy)
        #expect(h.loop.boundedJobsPending == 100)
        stuck.signal()
        try await h.settle()
        // Every accepted request is answered once; the refused ones never.
        #expect(answered.withLockedValue { $0 } == 100)
        #expect(h.manager.tokenRequestsPending.load(ordering: .relaxed) == 0)
        #expect(h.loop.boundedJobsPending == 0)
    }

    @Test func aLimitBelowOneIsRefusedAtCreation() async throws {
        await #expect(throws: SessionError.self) { _ = try await Harness { $0.tokenRequestLimit = 0 } }
    }
}
