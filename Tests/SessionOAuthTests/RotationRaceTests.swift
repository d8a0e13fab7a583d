import Foundation
import LoopFlow
import SessionCore
import SessionFileStore
import SessionFlowTestSupport
import Testing

@testable import SessionOAuth

/// The rotation race of issue 13: the server rotates the refresh token at once and answers
/// only after the client's refresh timeout. A client that gives up on that request and sends
/// the same refresh token again while it still runs is taken for a thief (RFC 9700 §4.14.2
/// reuse detection) and the whole grant is revoked: the session is lost. SessionFlow cancels
/// the request at the timeout and sends nothing until it has ended — in this process and in
/// another sharing the store — so the fixture rolls the rotation back (its answer was never
/// delivered) and the retry succeeds. Lost sessions must be 0.
@Suite("The rotation race: a refresh that outlives its timeout", .serialized)
struct RotationRaceTests {
    /// The refresh timeout of these tests, and how long the server holds its answer: sixty
    /// timeouts. The server rolls the rotation back only if it sees the client's connection
    /// closed before it writes the answer; on a starved machine a cancel sent at 1 s reached it
    /// after a 2.5 s hold (the lost rounds of the issue-14 note: both probes' retries refused,
    /// no reuse detected — a rotation committed whose answer no one read), and a 4 s hold left
    /// 3 s, a margin a loaded CI machine need not keep. A client that cancels ends the hold at
    /// once, so a longer one costs nothing (the control's uncancellable request ends at curl's
    /// own 10 s timeout).
    static let timeout = Duration.seconds(1)
    static let hold = "rotate-late:60"
    /// Rounds per test: a few in the test command; SESSIONFLOW_RACE_ROUNDS=N for a long run.
    static func rounds(_ quick: Int) -> Int {
        ProcessInfo.processInfo.environment["SESSIONFLOW_RACE_ROUNDS"].flatMap(Int.init) ?? quick
    }

    /// An authority that hides the OAuth authority's cancellation: the session can only give
    /// up at the timeout (what every release before this one did).
    struct Uncancellable: SessionAuthority {
        let inner: OAuthAuthority
        func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
            inner.refresh(request, completion: .standalone { completion.complete($0) })
        }
    }

    /// Runs `rounds` rounds of the race on one session; returns how many lost the session.
    static func race<Authority: SessionAuthority>(
        rounds: Int, server: OAuthServer, makeAuthority: @escaping (EventLoop) throws -> Authority
    ) async throws -> (lost: Int, session: SessionHarness<Authority, MemoryCredentialStore>) {
        let session = try await SessionHarness(
            loopName: "rotation-race", makeAuthority: makeAuthority, store: MemoryCredentialStore()
        ) { configuration in
            configuration.policy.timeout = timeout
            configuration.policy.initialBackoff = .milliseconds(200)
            configuration.policy.minimumInterval = .milliseconds(100)
        }
        var lost = 0
        for _ in 0..<rounds {
            if session.manager.state.value != .loggedIn {
                try await session.manager.signIn(try await server.signIn())
            }
            let reusesBefore = try await server.stats()["reuse_detected"] ?? 0
            try await server.fault(hold)
            // What an app does: ask for a token, and ask again after a transient failure.
            var outcome: Result<Secret, SessionError> = .failure(SessionError(.transient, "not asked"))
            for _ in 0..<20 {
                do {
                    outcome = .success(try await session.manager.refreshNow())
                    break
                } catch {
                    outcome = .failure(error)
                    guard error.code == .transient else { break }
                    try await Task.sleep(for: .milliseconds(250))
                }
            }
            let reused = (try await server.stats()["reuse_detected"] ?? 0) > reusesBefore
            if case .failure = outcome { lost += 1 } else if reused || session.manager.state.value != .loggedIn { lost += 1 }
            // The server's hold must have ended before the next round's fault is set.
            try await Self.holdsEnded(server)
        }
        return (lost, session)
    }

    /// Waits until no rotate-late request holds its answer any more; a hang guard of 30 s.
    static func holdsEnded(_ server: OAuthServer) async throws {
        let deadline = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < deadline {
            if try await server.stats()["rotate_late_holding"] == 0 { return }
            try await Task.sleep(for: .milliseconds(50))
        }
    }

    @Test func inOneProcessNoSessionIsLost() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let rounds = Self.rounds(4)
        let (lost, session) = try await Self.race(rounds: rounds, server: server) { loop in
            var oauth = server.configuration()
            oauth.requestTimeout = .seconds(10)  // the session's timeout, not curl's, ends the request
            return try OAuthAuthority(oauth, loop: loop)
        }
        let stats = try await server.stats()
        print("rotation race, one process: \(lost) lost sessions in \(rounds) rounds; "
            + "requests cancelled before their answer: \(stats["cancelled_before_answer"] ?? -1), "
            + "reuse detected: \(stats["reuse_detected"] ?? -1)")
        #expect(lost == 0)
        let reuses = String(decoding: try await server.call("GET", "__reuse").body, as: UTF8.self)
        #expect(stats["reuse_detected"] == 0, "why: \(reuses)")
        if lost > 0 {
            print("session log of the lost race:\n" + session.output.split(separator: "\n")
                .filter { $0.contains("refresh") || $0.contains("cancel") || $0.contains("attempt") }.joined(separator: "\n"))
        }
        // Each round's first request was cancelled (and rolled back), not abandoned.
        #expect(stats["cancelled_before_answer"] == rounds)
        #expect(session.output.contains("cancelling its request"))
        await session.stop()
    }

    @Test func withoutCancellationTheSameRaceLosesTheSession() async throws {
        // The control: the test above can fail. A session that gives up on the request at
        // its timeout re-sends the refresh token while the first request still runs.
        let server = try await OAuthServer(expiresIn: 3600)
        let (lost, session) = try await Self.race(rounds: 1, server: server) { loop in
            var oauth = server.configuration()
            oauth.requestTimeout = .seconds(10)
            return Uncancellable(inner: try OAuthAuthority(oauth, loop: loop))
        }
        #expect(lost == 1)
        #expect(try await server.stats()["reuse_detected"] ?? 0 >= 1)
        await session.stop()
    }

    @Test func withTwoProcessesOnOneStoreNoSessionIsLost() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let rounds = Self.rounds(3)
        var lost = 0
        for round in 0..<rounds {
            let directory = FileManager.default.temporaryDirectory
                .appendingPathComponent("sessionflow-race-\(UUID().uuidString)").path
            defer { try? FileManager.default.removeItem(atPath: directory) }
            // A stored session whose access token has expired: both processes refresh at once.
            let tokens = try await server.signIn()
            try FileCredentialStore(directory: directory).write(StoredSession(
                accessToken: tokens.accessToken, refreshToken: tokens.refreshToken,
                accessTokenExpiresAt: SessionConfiguration.realtime() - .seconds(10), memberID: "alice"))
            let reusesBefore = try await server.stats()["reuse_detected"] ?? 0
            try await server.fault(Self.hold)
            let first = try runProbe(store: directory, server: server, refreshTimeout: Self.timeout)
            let second = try runProbe(store: directory, server: server, refreshTimeout: Self.timeout)
            let outputs = await outputs(of: [first, second])
            let reused = (try await server.stats()["reuse_detected"] ?? 0) > reusesBefore
            let bothIn = outputs.allSatisfy { $0.contains("TOKEN-SHA256 ") && $0.contains("STATE loggedIn") }
            if reused || !bothIn {
                lost += 1
                print("round \(round) lost the session: \(outputs)")
                // What the server saw, for the next reader of a lost round: every token request
                // of the round (arrival time, fault) and the rotate-late counters.
                let requests = try await server.requests().filter { $0.path.hasSuffix("/token") }.suffix(8)
                let first = requests.first?.time ?? 0
                print("round \(round) token requests: " + requests.map {
                    String(format: "+%.3fs ", $0.time - first) + ($0.fault ?? "-")
                }.joined(separator: ", ") + "; stats: \(try await server.stats())")
            }
            for text in outputs {
                #expect(!text.contains(tokens.refreshToken!.reveal()))
            }
            try await Self.holdsEnded(server)
        }
        let stats = try await server.stats()
        print("rotation race, two processes: \(lost) lost sessions in \(rounds) rounds; "
            + "cancelled before their answer: \(stats["cancelled_before_answer"] ?? -1), reuse detected: \(stats["reuse_detected"] ?? -1)")
        #expect(lost == 0)
        #expect(stats["reuse_detected"] == 0)
        #expect(stats["cancelled_before_answer"] ?? 0 >= rounds)
    }
}
