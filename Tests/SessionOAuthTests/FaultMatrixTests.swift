import Foundation
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import Testing

@testable import SessionOAuth

/// One way the token endpoint misbehaves, and what the design (docs/ARCHITECTURE.md) says the session does about it.
struct Fault: Sendable, CustomTestStringConvertible {
    enum Outcome: Sendable {
        /// Transient: the tokens are kept, `attempts` failures are retried on the backoff
        /// schedule (never sooner than `retryAfter`), then the next attempt succeeds.
        case retried(attempts: Int, retryAfter: Int? = nil)
        /// Terminal: SESSION_EXPIRED, the tokens are gone (the store remembers the expiry).
        case expired
        /// A misconfigured client: reported once, never retried, the tokens are kept.
        case notRetried
        /// Tokens arrive; the access token lives `lifetime` as the session sees it.
        case refreshed(lifetime: Duration)
    }

    let name: String
    let mode: String
    let outcome: Outcome
    var count = 1
    var retryAfter: Int? = nil
    /// What the failure's message must say (clear errors), if anything.
    var says: String? = nil
    /// The HTTP client's own timeout; above the session's refresh timeout (3 s), only the
    /// session's timeout can end a hang.
    var httpTimeout = Fault.requestTimeout
    /// The session's refresh timeout in this case.
    var refreshTimeout = Fault.refreshTimeout

    var testDescription: String { name }

    /// The backoff the matrix runs with (the default 1 s scaled down so a case takes ~1 s).
    static let initialBackoff = Duration.milliseconds(200)
    /// Generous: a client that gives up on an answer the server did send loses the rotated
    /// refresh token (its next attempt sends the old one: invalid_grant). Only the timeout
    /// case uses a short one, against a server that really is slower.
    static let requestTimeout = Duration.seconds(5)
    static let refreshTimeout = Duration.seconds(3)
    static let tenYears = Duration.seconds(10 * 365 * 24 * 3600)

    static let all: [Fault] = [
        // The server holds both answers for good (`hold`, never released): a delayed one would
        // rotate the refresh token when it ends, and the retry had to get there first (3.4 s
        // of margin with delay:8). Only the HTTP client's 2 s deadline ends them: the session's
        // own timeout is far above it (with 3 s, 1 s of margin decided the message).
        Fault(
            name: "timeout (the HTTP client gives up)", mode: "hold", outcome: .retried(attempts: 2), count: 2,
            says: "timed out", httpTimeout: .seconds(2), refreshTimeout: .seconds(30)),
        Fault(
            name: "a hang (the session's refresh timeout)", mode: "hang", outcome: .retried(attempts: 1),
            says: "did not answer", httpTimeout: .seconds(30)),
        Fault(name: "500", mode: "status:500", outcome: .retried(attempts: 3), count: 3, says: "HTTP 500"),
        Fault(name: "503 with Retry-After", mode: "status:503", outcome: .retried(attempts: 1, retryAfter: 1), retryAfter: 1),
        Fault(name: "429 with Retry-After", mode: "status:429", outcome: .retried(attempts: 1, retryAfter: 1), retryAfter: 1),
        Fault(name: "400 invalid_grant", mode: "invalid_grant", outcome: .expired),
        Fault(name: "401 invalid_client", mode: "invalid_client", outcome: .notRetried),
        Fault(name: "HTML instead of JSON", mode: "html", outcome: .retried(attempts: 1), says: "not JSON"),
        Fault(name: "truncated JSON", mode: "truncated", outcome: .retried(attempts: 1), says: "not JSON"),
        Fault(name: "missing access_token", mode: "missing", outcome: .retried(attempts: 1), says: "no access_token"),
        Fault(name: "expires_in 0", mode: "expires:0", outcome: .refreshed(lifetime: .zero)),
        Fault(name: "expires_in negative", mode: "expires:-30", outcome: .refreshed(lifetime: .zero)),
        Fault(name: "expires_in huge (integer)", mode: "expires:9223372036854775807", outcome: .refreshed(lifetime: tenYears)),
        Fault(name: "expires_in huge (1e300)", mode: "expires:1e300", outcome: .refreshed(lifetime: tenYears)),
        Fault(name: "expires_in as a string", mode: "expires:\"120\"", outcome: .refreshed(lifetime: .seconds(120))),
        Fault(name: "a huge body (4 MiB)", mode: "huge", outcome: .retried(attempts: 1), says: "larger than"),
    ]
}

@Suite("Fault matrix: the token endpoint misbehaves", .serialized)
struct FaultMatrixTests {
    @Test(arguments: Fault.all)
    func theSessionDoesWhatTheDesignSays(_ fault: Fault) async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await LiveSession(server, configure: { configuration in
            configuration.policy.initialBackoff = Fault.initialBackoff
            configuration.policy.timeout = fault.refreshTimeout
            configuration.random = { 0.5 }  // backoff jitter pinned: a quarter of (base − initial) shorter
        }, oauth: { oauth in
            oauth.requestTimeout = fault.httpTimeout
        })
        let tokens = try await server.signIn()
        try await session.manager.signIn(tokens)
        let signedIn = session.store.session
        #expect(signedIn?.refreshToken == tokens.refreshToken)

        try await server.fault(fault.mode, count: fault.count, retryAfter: fault.retryAfter)
        let requestsBefore = try await server.stats()["token_requests"]!
        let result: Result<Secret, SessionError>
        do {
            result = .success(try await session.manager.refreshNow())
        } catch {
            result = .failure(error)
        }

        switch fault.outcome {
        case .retried(let attempts, let retryAfter):
            guard case .failure(let error) = result else {
                Issue.record("\(fault.name): the first attempt should fail, got a token")
                break
            }
            #expect(error.code == .transient)
            // Every failure is reported with its place in the schedule, then a retry works.
            #expect(await eventually(timeout: .seconds(15), every: .milliseconds(20)) { session.refreshes(reason: .retry) == 1 }, "\(fault.name): no successful retry")
            let failures = session.failures
            #expect(failures.map(\.attempt) == Array(1...attempts), "\(fault.name): \(failures)")
            for failure in failures {
                #expect(failure.error.kind == .transient)
                if let says = fault.says {
                    #expect(failure.error.description.contains(says), "\(fault.name): \(failure.error)")
                }
                // 1 s doubling by default (here 200 ms), jitter base − (base − initial) × 0.5 × u
                // with u = 0.5, Retry-After as a floor.
                let base = Fault.initialBackoff * (1 << (failure.attempt - 1))
                var expected = base - (base - Fault.initialBackoff) * 0.25
                if let retryAfter { expected = max(expected, .seconds(retryAfter)) }
                #expect(failure.retryIn == expected, "\(fault.name): attempt \(failure.attempt) retried in \(String(describing: failure.retryIn)), expected \(expected)")
            }
            #expect(session.manager.state.value == .loggedIn)
            // The tokens were kept through the failures and rotated by the retry.
            let stored = session.store.session
            #expect(stored?.refreshToken != nil && stored?.refreshToken != tokens.refreshToken)
            #expect(try await server.me(try await session.manager.freshAccessToken()) == 200)

        case .expired:
            guard case .failure(let error) = result else {
                Issue.record("\(fault.name): a refused refresh returned a token")
                break
            }
            #expect(error.code == .sessionExpired)
            #expect(session.manager.state.value == .sessionExpired)
            #expect(await eventually(timeout: .seconds(20), every: .milliseconds(20)) { session.recordedEvents.contains { if case .sessionExpired = $0 { true } else { false } } })
            #expect(session.failures.isEmpty, "a terminal answer is not retried")
            let stored = session.store.session
            #expect(stored?.expired == true && stored?.accessToken == nil && stored?.refreshToken == nil)
            #expect(session.manager.memberID == "alice")

        case .notRetried:
            guard case .failure(let error) = result else {
                Issue.record("\(fault.name): a misconfigured client got a token")
                break
            }
            #expect(error.code == .configuration)
            #expect(await eventually(timeout: .seconds(20), every: .milliseconds(20)) { session.failures.count == 1 })
            #expect(session.failures.first?.retryIn == nil && session.failures.first?.error.kind == .configuration)
            // Nothing more is sent on its own: the client must be fixed first.
            try await Task.sleep(for: .seconds(1))
            #expect(try await server.stats()["token_requests"]! == requestsBefore + 1)
            #expect(session.manager.state.value == .loggedIn)
            #expect(session.store.session?.refreshToken == tokens.refreshToken)

        case .refreshed(let lifetime):
            guard case .success(let token) = result else {
                Issue.record("\(fault.name): \(result)")
                break
            }
            #expect(token != tokens.accessToken)
            #expect(await eventually(timeout: .seconds(20), every: .milliseconds(20)) { session.refreshes(reason: .onDemand) == 1 })
            let refreshed = session.recordedEvents.compactMap { event -> Duration? in
                if case .tokenRefreshed(let expiresIn, .onDemand) = event { expiresIn } else { nil }
            }
            #expect(refreshed == [lifetime], "\(fault.name)")
            #expect(session.manager.state.value == .loggedIn)
            #expect(session.store.session?.refreshToken != tokens.refreshToken)
            if lifetime == .zero {
                // A token that is born dead is refreshed again, but never sooner than the
                // minimum interval (300 ms here): no storm. Again: waited for; no storm: at most
                // one request per interval over the time actually watched (a loaded machine
                // only makes fewer).
                func requests() async throws -> Int { try await server.stats()["token_requests"]! - requestsBefore }
                #expect(await eventually(timeout: .seconds(20), every: .milliseconds(20)) { ((try? await requests()) ?? 0) >= 2 })
                let watched = ContinuousClock.now
                let atStart = try await requests()
                try await Task.sleep(for: .milliseconds(1500))
                let made = try await requests() - atStart
                let intervals = Int((ContinuousClock.now - watched) / .milliseconds(300))
                #expect(made <= intervals + 1, "\(fault.name): \(made) token requests in \(intervals) intervals")
            } else {
                // The next refresh is due where the proactive law puts the pinned draw (0.5): before
                // expiry − margin (the margin capped at half the lifetime), never past it.
                let policy = RefreshPolicy()
                let due = policy.proactiveDelay(
                    now: .zero, expiresAt: lifetime, lifetime: lifetime, lastRefresh: nil, unitRandom: 0.5)
                #expect(due < lifetime - policy.effectiveMargin(lifetime: lifetime))
                #expect(session.manager.timing.nextRefreshIn.map { $0 > due - .seconds(10) && $0 <= due } ?? false,
                        "\(fault.name): next refresh in \(String(describing: session.manager.timing.nextRefreshIn)), due \(due)")
            }
        }
        let output = session.output
        for secret in [tokens.accessToken, tokens.refreshToken!] {
            #expect(!output.contains(secret.reveal()), "\(fault.name): a token reached the logs or events")
        }
        await session.stop()
    }
}

extension LiveSession {
    /// The refresh failures reported so far.
    var failures: [(attempt: Int, retryIn: Duration?, error: AuthorityError)] {
        recordedEvents.compactMap { event in
            if case .refreshFailed(let attempt, let retryIn, let error) = event { (attempt, retryIn, error) } else { nil }
        }
    }

    func refreshes(reason: RefreshReason) -> Int {
        recordedEvents.filter { if case .tokenRefreshed(_, let why) = $0 { why == reason } else { false } }.count
    }
}
