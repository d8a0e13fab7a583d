import Foundation
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import Testing

@_spi(Fuzzing) @testable import SessionOAuth

/// The device authorization grant (RFC 8628) against the real Authlib server: the tests play
/// the user's browser over HTTP (approve / deny the user code, /__device/* hooks) and read the
/// server's request log to see when the client polled.
@Suite("Device authorization grant against a real Authlib server", .serialized)
struct DeviceFlowTests {
    /// A session with introspection (for the member id) and a device flow whose prompts are kept.
    struct Setup {
        let server: OAuthServer
        let session: LiveSession
        let prompts: PromptLog
        let flow: DeviceAuthorization

        init(_ device: [String: String], introspection: Bool = true) async throws {
            server = try await OAuthServer(expiresIn: 3600)
            try await server.device(device)
            let server = server
            session = try await LiveSession(server, introspection: introspection)
            let prompts = PromptLog(loop: session.loop)
            self.prompts = prompts
            var configuration = server.configuration(introspection: introspection)
            configuration.deviceAuthorizationEndpoint = server.base.appendingPathComponent("oauth/device_authorization")
            flow = try DeviceAuthorization(configuration, scope: "profile") { prompt in prompts.add(prompt) }
        }
    }

    @Test func approvedSignsInStoresTheTokensAndSetsTheMemberID() async throws {
        let setup = try await Setup(["interval": "1", "expires_in": "60"])
        let (server, session) = (setup.server, setup.session)
        let signIn = Task { try await session.manager.signIn(with: setup.flow) }
        let prompt = try #require(await setup.prompts.first())
        #expect(setup.prompts.allOnLoopThread)
        #expect(prompt.interval == .seconds(1) && prompt.expiresIn == .seconds(60))
        #expect(prompt.verificationURI.absoluteString == server.base.absoluteString + "/device")
        #expect(prompt.verificationURIComplete?.absoluteString.contains(prompt.userCode) == true)
        // A poll or two while the user reads: pending, still signed out.
        #expect(await eventually(timeout: .seconds(20), every: .milliseconds(50)) {
            ((try? await server.deviceStats())?["pending"] ?? 0) >= 1
        })
        #expect(session.manager.state.value == .loggedOut)
        try await server.approve(prompt.userCode)
        try await signIn.value
        #expect(session.manager.state.value == .loggedIn)
        #expect(session.manager.memberID == "alice")  // from the introspection's `sub`
        let stored = try #require(session.store.session)
        #expect(stored.memberID == "alice")
        let access = try #require(stored.accessToken)
        #expect(stored.refreshToken != nil)
        #expect(try await server.me(access) == 200)
        #expect(try await session.manager.freshAccessToken() == access)
        // What was sent: the device request (client id, scope), then device-code polls.
        let log = try await server.deviceLog()
        #expect(log.deviceForms.first?["client_id"] == "sessionflow-public")
        #expect(log.deviceForms.first?["scope"] == "profile")
        let deviceCode = try #require(log.pollForms.first?["device_code"])
        #expect(log.pollForms.allSatisfy { $0["device_code"] == deviceCode && $0["client_id"] == "sessionflow-public" })
        // The device code is not shown or logged anywhere.
        #expect(!session.output.contains(deviceCode) && !"\(prompt)".contains(deviceCode))
        #expect(!session.output.contains(access.reveal()))
        await session.stop()
    }

    @Test func deniedEndsWithAccessDeniedAndStaysSignedOut() async throws {
        let setup = try await Setup(["interval": "1", "expires_in": "60"])
        let (server, session) = (setup.server, setup.session)
        let signIn = Task { try await session.manager.signIn(with: setup.flow) }
        let prompt = try #require(await setup.prompts.first())
        try await server.deny(prompt.userCode)
        let error = await #expect(throws: SessionError.self) { try await signIn.value }
        #expect(error?.code == .accessDenied)
        #expect(error?.message.contains("access_denied") == true)
        #expect(session.manager.state.value == .loggedOut)
        #expect(session.store.session == nil)
        // It stopped: no poll after the refusal.
        let polls = try await server.deviceLog().polls.count
        try await Task.sleep(for: .milliseconds(2500))
        #expect(try await server.deviceLog().polls.count == polls)
        await session.stop()
    }

    @Test func expiredTokenFromTheServerEndsTheSignIn() async throws {
        // The server says the code lives a minute, but it dies after 1.5 s: `expired_token`.
        let setup = try await Setup(["interval": "1", "expires_in": "60", "lifetime": "1.5"])
        let (server, session) = (setup.server, setup.session)
        let error = await #expect(throws: SessionError.self) { try await session.manager.signIn(with: setup.flow) }
        #expect(error?.code == .signInExpired)
        #expect(try await server.deviceStats()["expired"] == 1)
        #expect(session.manager.state.value == .loggedOut)
        #expect(session.store.session == nil)
        await session.stop()
    }

    @Test func theCodesLifetimeEndsPollingHere() async throws {
        // The server never expires the code, but announced 3 s: the client stops by itself at
        // 3 s and sends nothing after.
        let setup = try await Setup(["interval": "1", "expires_in": "3", "lifetime": "600"])
        let (server, session) = (setup.server, setup.session)
        let started = ContinuousClock.now
        let error = await #expect(throws: SessionError.self) { try await session.manager.signIn(with: setup.flow) }
        let elapsed = ContinuousClock.now - started
        #expect(error?.code == .signInExpired)
        // At least the announced 3 s; the upper bound is a hang guard (ten times that), far
        // below the 600 s the server would keep the code: what proves the client stopped by
        // itself is the server's log below (no poll after 3.5 s), not a wall clock.
        #expect(elapsed >= .seconds(3) && elapsed < .seconds(30))
        #expect(try await server.deviceStats()["expired"] == 0)
        let log = try await server.deviceLog()
        let issued = try #require(log.device.first)
        // Every poll was sent around the lifetime, not long after: 3 s announced, plus one
        // interval and slack for a loaded machine (a poll decided at 2.9 s may arrive late; a
        // client that ignored the lifetime polls on, which the check below sees).
        #expect(!log.polls.isEmpty && log.polls.allSatisfy { $0 < issued + 8 })
        try await Task.sleep(for: .milliseconds(1500))
        #expect(try await server.deviceLog().polls.count == log.polls.count)
        #expect(session.manager.state.value == .loggedOut)
        await session.stop()
    }

    @Test func slowDownAddsFiveSecondsToTheInterval() async throws {
        // Interval 1 s; the first poll is answered slow_down: the next comes ≥ 6 s later.
        let setup = try await Setup(["interval": "1", "expires_in": "60", "slow_down": "1"])
        let (server, session) = (setup.server, setup.session)
        let signIn = Task { try await session.manager.signIn(with: setup.flow) }
        let prompt = try #require(await setup.prompts.first())
        #expect(await eventually(timeout: .seconds(20), every: .milliseconds(50)) {
            ((try? await server.deviceStats())?["slow_downs"] ?? 0) >= 1
        })
        try await server.approve(prompt.userCode)
        try await signIn.value
        #expect(session.manager.state.value == .loggedIn)
        let log = try await server.deviceLog()
        let issued = try #require(log.device.first)
        // (A loaded machine may approve only after the second poll: a third is then the one
        // that succeeds. The gaps are what the flow decided; the upper bounds are hang guards.)
        try #require(log.polls.count >= 2, "polls: \(log.polls.map { $0 - issued })")
        let first = log.polls[0] - issued
        let second = log.polls[1] - log.polls[0]
        #expect(first >= 0.95 && first < 30, "first poll after \(first) s")
        #expect(second >= 5.95, "the poll after slow_down came \(second) s later (interval 1 s + 5 s)")
        #expect(second < 60)
        if log.polls.count > 2 {
            // Once slowed down, the interval stays 6 s: the third poll is not sooner.
            #expect(log.polls[2] - log.polls[1] >= 5.95, "polls: \(log.polls.map { $0 - issued })")
        }
        await session.stop()
    }

    @Test func transientFailuresKeepPollingLessOften() async throws {
        let setup = try await Setup(["interval": "1", "expires_in": "60"])
        let (server, session) = (setup.server, setup.session)
        try await server.fault("status:503", count: 2)
        let signIn = Task { try await session.manager.signIn(with: setup.flow) }
        let prompt = try #require(await setup.prompts.first())
        #expect(await eventually(timeout: .seconds(20), every: .milliseconds(50)) {
            (try? await server.deviceLog().polls.count) ?? 0 >= 2
        })
        try await server.approve(prompt.userCode)
        try await signIn.value
        #expect(session.manager.state.value == .loggedIn)
        let log = try await server.deviceLog()
        #expect(Array(log.pollFaults.prefix(2)) == ["status:503", "status:503"])
        // RFC 8628 §3.5: each failure halves the polling frequency (interval 1 s → 2 s → 4 s).
        try #require(log.polls.count >= 3, "polls: \(log.polls)")
        let gaps = zip(log.polls.dropFirst(), log.polls).map { $0 - $1 }
        #expect(gaps[0] >= 1.95 && gaps[1] >= 3.95, "gaps between polls: \(gaps)")
        await session.stop()
    }

    @Test func cancellingTheHandleMidPollEndsTheRequestAndSignsNothingIn() async throws {
        let setup = try await Setup(["interval": "1", "expires_in": "60"])
        let (server, session) = (setup.server, setup.session)
        try await server.fault("delay:30")  // the first poll is held by the server: in flight
        let outcomes = LockedBox<[(Result<Void, SessionError>, Bool)]>([])
        let loop = session.loop
        let handle = session.manager.signIn(with: setup.flow) { result in
            outcomes.withLockedValue { $0.append((result, loop.inEventLoop)) }
        }
        let prompt = try #require(await setup.prompts.first())
        #expect(await eventually(timeout: .seconds(20), every: .milliseconds(20)) {
            (try? await server.deviceLog().polls.count) ?? 0 >= 1
        })
        let cancelledAt = ContinuousClock.now
        handle.cancel()
        handle.cancel()
        #expect(await eventually(timeout: .seconds(10), every: .milliseconds(10)) { outcomes.withLockedValue { !$0.isEmpty } })
        // The request in flight was ended at once (the server holds its answer 30 s; the bound is
        // a hang guard, a third of the hold).
        #expect(ContinuousClock.now - cancelledAt < .seconds(10))
        #expect(handle.isCancelled)
        let polls = try await server.deviceLog().polls.count
        // The user approves after the cancel: nothing may sign in, nothing more is sent.
        try await server.approve(prompt.userCode)
        try await Task.sleep(for: .milliseconds(4000))
        #expect(try await server.deviceLog().polls.count == polls)
        // (The held request may have been granted on the server after all: its answer went
        // nowhere.)
        let seen = outcomes.withLockedValue { $0 }
        #expect(seen.count == 1)
        if case .failure(let error)? = seen.first?.0 { #expect(error.code == .cancelled) } else { Issue.record("not cancelled") }
        #expect(seen.first?.1 == true)
        #expect(session.manager.state.value == .loggedOut && session.store.session == nil)
        await session.stop()
    }

    @Test func cancellingTheTaskBetweenPollsStopsPolling() async throws {
        let setup = try await Setup(["interval": "2", "expires_in": "60"])
        let (server, session) = (setup.server, setup.session)
        let signIn = Task { try await session.manager.signIn(with: setup.flow) }
        let prompt = try #require(await setup.prompts.first())
        #expect(await eventually(timeout: .seconds(20), every: .milliseconds(20)) {
            ((try? await server.deviceStats())?["pending"] ?? 0) >= 1
        })
        signIn.cancel()
        let error = await #expect(throws: SessionError.self) { try await signIn.value }
        #expect(error?.code == .cancelled)
        let polls = try await server.deviceLog().polls.count
        try await server.approve(prompt.userCode)
        try await Task.sleep(for: .milliseconds(4500))  // two intervals and more
        #expect(try await server.deviceLog().polls.count == polls)
        #expect(try await server.deviceStats()["granted"] == 0)
        #expect(session.manager.state.value == .loggedOut && session.store.session == nil)
        await session.stop()
    }

    @Test func aConfigurationWithoutADeviceEndpointIsRefused() throws {
        let configuration = OAuthConfiguration(
            tokenEndpoint: URL(string: "https://auth.example.com/token")!, clientID: "c")
        #expect(throws: OAuthConfigurationError.self) { try DeviceAuthorization(configuration) { _ in } }
        var plain = configuration
        plain.deviceAuthorizationEndpoint = URL(string: "http://auth.example.com/device")!
        let error = #expect(throws: OAuthConfigurationError.self) { try plain.validate() }
        #expect(error?.field == "device authorization endpoint")
    }

    @Test func theDeviceAnswerIsBounded() throws {
        func answer(_ object: [String: Any]) throws -> HTTPAnswer {
            HTTPAnswer(status: 200, retryAfter: nil, body: try JSONSerialization.data(withJSONObject: object), redactions: [])
        }
        let remote = URL(string: "https://auth.example.com/device")!
        let good: [String: Any] = [
            "device_code": "dc-1", "user_code": "ABCD-EFGH", "verification_uri": "https://example.com/device",
            "expires_in": 1e12, "interval": 0,
        ]
        let (prompt, code) = try DevicePolling.parse(try answer(good), origin: remote).get()
        #expect(code.reveal() == "dc-1")
        #expect(prompt.expiresIn == .seconds(3 * 3600) && prompt.interval == .seconds(1))
        #expect(prompt.verificationURIComplete == nil)
        var missing = good
        missing["interval"] = nil
        #expect(try DevicePolling.parse(try answer(missing), origin: remote).get().0.interval == .seconds(5))
        var javascript = good
        javascript["verification_uri"] = "javascript:alert(1)"
        #expect(throws: SessionError.self) { try DevicePolling.parse(try answer(javascript), origin: remote).get() }
        var noCode = good
        noCode["device_code"] = nil
        #expect(throws: SessionError.self) { try DevicePolling.parse(try answer(noCode), origin: remote).get() }
        // Format and bidi characters are removed from the user code (issue 29, point 6).
        var bidi = good
        bidi["user_code"] = "AB\u{202E}CD\u{200B}-EF\u{2066}GH\u{2069}"
        #expect(try DevicePolling.parse(try answer(bidi), origin: remote).get().0.userCode == "ABCD-EFGH")
        var onlyBidi = good
        onlyBidi["user_code"] = "\u{202E}\u{200E}"
        #expect(throws: SessionError.self) { try DevicePolling.parse(try answer(onlyBidi), origin: remote).get() }
        // Plain http to loopback: only from a loopback device endpoint (issue 29, point 3).
        var local = good
        local["verification_uri"] = "http://127.0.0.1:8080/device"
        #expect(throws: SessionError.self) { try DevicePolling.parse(try answer(local), origin: remote).get() }
        let loopback = URL(string: "http://127.0.0.1:9/device")!
        #expect(try DevicePolling.parse(try answer(local), origin: loopback).get().0.verificationURI.port == 8080)
        var complete = good
        complete["verification_uri_complete"] = "http://localhost:8080/device?code=ABCD"
        #expect(try DevicePolling.parse(try answer(complete), origin: remote).get().0.verificationURIComplete == nil)
    }
}

/// `SessionManager.signIn(with:)` over a flow the test drives by hand: one that ignores
/// `cancel()` and delivers tokens afterwards (the race a real flow can lose: its answer was
/// already on its way). The manager must not sign in with them.
@Suite("Sign-in flows: the manager's side")
struct SignInFlowManagerTests {
    final class HandDrivenFlow: SignInFlow, SignInCancellable, @unchecked Sendable {
        private let state = LockedBox<(completion: (@Sendable (Result<SessionTokens, SessionError>) -> Void)?, loop: EventLoop?, cancels: Int)>((nil, nil, 0))

        func start(on loop: EventLoop, completion: @escaping @Sendable (Result<SessionTokens, SessionError>) -> Void) -> any SignInCancellable {
            state.withLockedValue { $0 = (completion, loop, $0.cancels) }
            return self
        }

        func cancel() { state.withLockedValue { $0.cancels += 1 } }
        var started: Bool { state.withLockedValue { $0.completion != nil } }
        var cancels: Int { state.withLockedValue { $0.cancels } }

        /// Completes on the loop thread, as a flow must.
        func complete(_ result: Result<SessionTokens, SessionError>) throws {
            let (completion, loop, _) = state.withLockedValue { $0 }
            try loop!.execute { completion!(result) }
        }
    }

    static let tokens = SessionTokens(
        accessToken: Secret("at-hand"), refreshToken: Secret("rt-hand"), expiresIn: .seconds(3600), memberID: "hand")

    static func session() async throws -> LiveSession {
        try await SessionHarness(
            loopName: "flow-test",
            makeAuthority: { loop in
                try OAuthAuthority(OAuthConfiguration(tokenEndpoint: URL(string: "https://auth.invalid/token")!, clientID: "c"), loop: loop)
            },
            store: MemoryCredentialStore())
    }

    @Test func tokensSignInThroughTheHandleForm() async throws {
        let session = try await Self.session()
        let flow = HandDrivenFlow()
        let outcome = LockedBox<Result<Void, SessionError>?>(nil)
        session.manager.signIn(with: flow) { result in outcome.withLockedValue { $0 = result } }
        #expect(await eventually(timeout: .seconds(10)) { flow.started })
        try flow.complete(.success(Self.tokens))
        #expect(await eventually(timeout: .seconds(10)) { outcome.withLockedValue { $0 != nil } })
        #expect(throws: Never.self) { try outcome.withLockedValue { $0 }?.get() }
        #expect(session.manager.state.value == .loggedIn && session.manager.memberID == "hand")
        #expect(session.store.session?.accessToken == Self.tokens.accessToken)  // stored before the completion
        await session.stop()
    }

    @Test func tokensArrivingAfterTheHandleWasCancelledSignNothingIn() async throws {
        let session = try await Self.session()
        let flow = HandDrivenFlow()
        let outcomes = LockedBox<[Result<Void, SessionError>]>([])
        let handle = session.manager.signIn(with: flow) { result in outcomes.withLockedValue { $0.append(result) } }
        #expect(await eventually(timeout: .seconds(10)) { flow.started })
        handle.cancel()
        #expect(flow.cancels == 1)
        try flow.complete(.success(Self.tokens))
        #expect(await eventually(timeout: .seconds(10)) { outcomes.withLockedValue { !$0.isEmpty } })
        try await Task.sleep(for: .milliseconds(200))
        let seen = outcomes.withLockedValue { $0 }
        #expect(seen.count == 1)
        #expect(throws: SessionError(.cancelled, "the sign-in was cancelled")) { try seen.first?.get() }
        #expect(session.manager.state.value == .loggedOut && session.store.session == nil)
        await session.stop()
    }

    @Test func tokensArrivingAfterTheTaskWasCancelledSignNothingIn() async throws {
        let session = try await Self.session()
        let flow = HandDrivenFlow()
        let signIn = Task { try await session.manager.signIn(with: flow) }
        #expect(await eventually(timeout: .seconds(10)) { flow.started })
        signIn.cancel()
        #expect(await eventually(timeout: .seconds(10)) { flow.cancels == 1 })
        try flow.complete(.success(Self.tokens))
        let error = await #expect(throws: SessionError.self) { try await signIn.value }
        #expect(error?.code == .cancelled)
        #expect(session.manager.state.value == .loggedOut && session.store.session == nil)
        await session.stop()
    }

    @Test func aTaskCancelledBeforeTheStartNeverStartsTheFlow() async throws {
        let session = try await Self.session()
        let flow = HandDrivenFlow()
        let outcome = LockedBox<Result<Void, SessionError>?>(nil)
        Task {
            withUnsafeCurrentTask { $0?.cancel() }
            let result: Result<Void, SessionError>
            do throws(SessionError) {
                try await session.manager.signIn(with: flow)
                result = .success(())
            } catch {
                result = .failure(error)
            }
            outcome.withLockedValue { $0 = result }
        }
        #expect(await eventually(timeout: .seconds(20)) { outcome.withLockedValue { $0 != nil } })
        #expect(!flow.started)
        if flow.started { try flow.complete(.failure(SessionError(.transient, "unblock"))) }  // (a failing run ends)
        #expect(await eventually(timeout: .seconds(20)) { outcome.withLockedValue { $0 != nil } })
        #expect(throws: SessionError(.cancelled, "the sign-in was cancelled")) { try outcome.withLockedValue { $0 }?.get() }
        await session.stop()
    }
}

/// The prompts a flow handed the host, and whether each came on the loop thread.
final class PromptLog: Sendable {
    let loop: EventLoop
    private let prompts = LockedBox<[(DevicePrompt, Bool)]>([])

    init(loop: EventLoop) { self.loop = loop }

    func add(_ prompt: DevicePrompt) {
        let onLoop = loop.inEventLoop
        prompts.withLockedValue { $0.append((prompt, onLoop)) }
    }

    var allOnLoopThread: Bool { prompts.withLockedValue { $0.allSatisfy(\.1) } }

    /// Every prompt so far, in order.
    var all: [DevicePrompt] { prompts.withLockedValue { $0.map(\.0) } }

    func first(timeout: Duration = .seconds(20)) async -> DevicePrompt? {
        _ = await eventually(timeout: timeout, every: .milliseconds(10)) { prompts.withLockedValue { !$0.isEmpty } }
        return prompts.withLockedValue { $0.first?.0 }
    }
}

/// The fixture's device hooks (see oauth_server.py).
extension OAuthServer {
    /// `/__device/config` (interval, expires_in, lifetime, slow_down).
    func device(_ settings: [String: String]) async throws {
        let response = try await call("POST", "__device/config", form: settings.merging(["reset": "1"]) { a, _ in a })
        guard response.status == 200 else { throw ServerError("/__device/config: HTTP \(response.status)") }
    }

    func approve(_ userCode: String, as user: String = "alice") async throws {
        let response = try await call("POST", "__device/approve", form: ["user_code": userCode, "user": user])
        guard response.status == 200 else { throw ServerError("/__device/approve: HTTP \(response.status)") }
    }

    func deny(_ userCode: String) async throws {
        let response = try await call("POST", "__device/deny", form: ["user_code": userCode])
        guard response.status == 200 else { throw ServerError("/__device/deny: HTTP \(response.status)") }
    }

    func deviceStats() async throws -> [String: Int] {
        (try await call("GET", "__device/stats").json() as? [String: Int]) ?? [:]
    }

    struct DeviceLog {
        /// Server times (seconds since the epoch) of the device requests and of the polls.
        var device: [Double] = []
        var polls: [Double] = []
        var deviceForms: [[String: String]] = []
        var pollForms: [[String: String]] = []
        var pollFaults: [String?] = []
    }

    func deviceLog() async throws -> DeviceLog {
        let entries = (try await call("GET", "__requests").json() as? [[String: Any]]) ?? []
        var log = DeviceLog()
        for entry in entries {
            let form = entry["form"] as? [String: String] ?? [:]
            let time = entry["time"] as? Double ?? 0
            if entry["path"] as? String == "/oauth/device_authorization" {
                log.device.append(time)
                log.deviceForms.append(form)
            } else if form["grant_type"] == "urn:ietf:params:oauth:grant-type:device_code" {
                log.polls.append(time)
                log.pollForms.append(form)
                log.pollFaults.append(entry["fault"] as? String)
            }
        }
        return log
    }
}
