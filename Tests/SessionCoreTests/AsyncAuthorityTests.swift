import LoopFlow
import SessionFlowTestSupport
import Synchronization
import Testing

@testable import SessionCore

/// `AsyncAuthority`: an async/await authority whose task is cancelled when the session
/// cancels the refresh, on a real loop and the system clock.
@Suite("AsyncAuthority: async/await authorities and cancellation", .serialized)
struct AsyncAuthorityTests {
    /// Answers after `delay`; counts its calls and the cancellations it saw. With
    /// `honoursCancellation` off it finishes its work and returns tokens anyway.
    final class Slow: AsyncSessionAuthority, Sendable {
        let delay: Duration
        let honoursCancellation: Bool
        let calls = Atomic<Int>(0)
        let cancellations = Atomic<Int>(0)

        init(delay: Duration, honoursCancellation: Bool) {
            self.delay = delay
            self.honoursCancellation = honoursCancellation
        }

        func refresh(_ request: RefreshRequest) async throws -> TokenGrant {
            calls.add(1, ordering: .relaxed)
            if honoursCancellation {
                try await withTaskCancellationHandler {
                    try await Task.sleep(for: delay)
                } onCancel: {
                    cancellations.add(1, ordering: .relaxed)
                }
            } else {
                // Finishes its work when told to stop: waits for the cancellation, then answers.
                let stop = LockedBox<(cancelled: Bool, waiting: CheckedContinuation<Void, Never>?)>((false, nil))
                await withTaskCancellationHandler {
                    await withCheckedContinuation { continuation in
                        let resumeNow = stop.withLockedValue { state -> Bool in
                            if !state.cancelled { state.waiting = continuation }
                            return state.cancelled
                        }
                        if resumeNow { continuation.resume() }
                    }
                } onCancel: {
                    cancellations.add(1, ordering: .relaxed)
                    stop.withLockedValue { state -> CheckedContinuation<Void, Never>? in
                        state.cancelled = true
                        defer { state.waiting = nil }
                        return state.waiting
                    }?.resume()
                }
            }
            return TokenGrant(accessToken: Secret("ACCESS-\(calls.load(ordering: .relaxed))"), refreshToken: Secret("R2"),
                              expiresIn: .seconds(3600))
        }
    }

    static func session(_ authority: Slow, timeout: Duration = .milliseconds(300)) async throws -> SessionHarness<AsyncAuthority<Slow>, MemoryCredentialStore> {
        let session = try await SessionHarness(
            loopName: "async-authority", authority: AsyncAuthority(authority), store: MemoryCredentialStore()
        ) { configuration in
            configuration.policy.timeout = timeout
        }
        try await session.manager.signIn(SessionTokens(
            accessToken: Secret("ACCESS-0"), refreshToken: Secret("R1"), expiresIn: .seconds(3600), memberID: "m"))
        return session
    }

    @Test func aTimedOutRefreshCancelsItsTaskAndEndsWhenTheTaskHas() async throws {
        // The authority would answer after 120 s; the timeout is 300 ms. The bound below is a hang
        // guard, half the hold: on a loaded machine under ThreadSanitizer the cooperative pool
        // that runs the task has taken over 5 s to get to it (what proves the timeout ended the
        // refresh is its message and the cancellation counted below, not a wall clock).
        let authority = Slow(delay: .seconds(120), honoursCancellation: true)
        let session = try await Self.session(authority)
        let started = ContinuousClock.now
        let error = await #expect(throws: SessionError.self) { try await session.manager.refreshNow() }
        #expect(ContinuousClock.now - started < .seconds(60))
        #expect(error?.code == .transient)
        #expect(error?.message.contains("did not answer within") == true, "\(error?.message ?? "")")
        #expect(authority.calls.load(ordering: .relaxed) == 1)
        #expect(authority.cancellations.load(ordering: .relaxed) == 1)
        #expect(session.manager.state.value == .loggedIn)
        await session.stop()
    }

    @Test func tokensATaskReturnsAfterItsCancellationAreKeptAndNothingIsSentMeanwhile() async throws {
        // The task answers with tokens when it is cancelled (its work was done): within the
        // grace of one more timeout the session gives a cancelled request to end, they are kept.
        let authority = Slow(delay: .zero, honoursCancellation: false)
        // The timeout is long: the task runs on the cooperative pool, which the test run's other
        // suites can hold for seconds (under ThreadSanitizer 2 s + 2 s was not enough).
        let session = try await Self.session(authority, timeout: .seconds(10))
        let token = try await session.manager.refreshNow()
        #expect(token == Secret("ACCESS-1"))
        #expect(authority.cancellations.load(ordering: .relaxed) == 1)
        #expect(authority.calls.load(ordering: .relaxed) == 1)  // no second request while it ran
        #expect(session.store.session?.refreshToken == Secret("R2"))
        await session.stop()
    }

    @Test func errorsKeepTheirKindAndHideTheirText() async throws {
        struct Failing: AsyncSessionAuthority {
            let error: any Error
            func refresh(_ request: RefreshRequest) async throws -> TokenGrant { throw error }
        }
        struct Leaky: Error, CustomStringConvertible { var description: String { "token R1 leaked" } }
        for (thrown, expected) in [(AuthorityError.terminal() as any Error, SessionError.Code.sessionExpired),
                                   (Leaky(), .transient)] {
            let session = try await SessionHarness(
                loopName: "async-errors", authority: AsyncAuthority(Failing(error: thrown)), store: MemoryCredentialStore())
            try await session.manager.signIn(SessionTokens(
                accessToken: Secret("A"), refreshToken: Secret("R1"), expiresIn: .seconds(3600), memberID: "m"))
            let error = await #expect(throws: SessionError.self) { try await session.manager.refreshNow() }
            #expect(error?.code == expected)
            #expect(error?.message.contains("R1") == false)
            await session.stop()
        }
    }
}
