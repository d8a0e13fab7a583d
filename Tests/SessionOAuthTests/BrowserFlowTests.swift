import Crypto
import Foundation
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import Testing

@_spi(Fuzzing) @testable import SessionOAuth

/// The authorization code grant with PKCE on a loopback redirect (RFC 6749 §4.1, RFC 7636,
/// RFC 8252 §7.3) against the real Authlib server. The tests play the browser over HTTP: open
/// the authorization URL (the server's consent form), submit it, and follow the redirect to
/// the flow's listener on the loop.
@Suite("Browser sign-in (authorization code + PKCE, loopback redirect) against a real Authlib server", .serialized)
struct BrowserFlowTests {
    struct Setup {
        let server: OAuthServer
        let session: LiveSession
        let prompts: BrowserPromptLog
        let flow: BrowserAuthorization

        init(
            timeout: Duration = .seconds(60), introspection: Bool = true, startPage: Bool = true,
            oauth: (inout OAuthConfiguration) -> Void = { _ in }
        ) async throws {
            server = try await OAuthServer(expiresIn: 3600)
            let server = server
            session = try await LiveSession(server, introspection: introspection, oauth: oauth)
            let prompts = BrowserPromptLog(loop: session.loop)
            self.prompts = prompts
            var configuration = server.configuration(introspection: introspection)
            configuration.authorizationEndpoint = server.base.appendingPathComponent("oauth/authorize")
            oauth(&configuration)
            flow = try BrowserAuthorization(configuration, scope: "profile", timeout: timeout, startPage: startPage) {
                prompts.add($0)
            }
        }
    }

    @Test func theBrowserComesBackAndTheSessionSignsIn() async throws {
        let setup = try await Setup()
        let (server, session) = (setup.server, setup.session)
        let signIn = Task { try await session.manager.signIn(with: setup.flow) }
        let prompt = try #require(await setup.prompts.first())
        #expect(setup.prompts.allOnLoopThread)
        // The authorization URL: the endpoint, our redirect URI, a state, an S256 challenge.
        let query = BrowserFlowTests.query(prompt.authorizationURL)
        let port = try #require(prompt.redirectURI.port)
        #expect(prompt.redirectURI.absoluteString == "http://127.0.0.1:\(port)/callback")
        #expect(prompt.authorizationURL.absoluteString.hasPrefix(server.base.absoluteString + "/oauth/authorize?"))
        #expect(query["response_type"] == "code" && query["client_id"] == "sessionflow-public")
        #expect(query["redirect_uri"] == prompt.redirectURI.absoluteString && query["scope"] == "profile")
        #expect(query["code_challenge_method"] == "S256")
        let state = try #require(query["state"])
        let challenge = try #require(query["code_challenge"])
        #expect(state.count >= 22 && challenge.count == 43)
        #expect(BrowserFlowTests.listens(port))
        #expect(session.manager.state.value == .loggedOut)

        let page = try await server.browse(prompt, consent: true)
        #expect(page.status == 200)
        #expect(page.text.contains("You can close this window"))
        #expect(page.header("Content-Type")?.hasPrefix("text/html") == true)
        try await signIn.value
        #expect(session.manager.state.value == .loggedIn)
        #expect(session.manager.memberID == "alice")  // from the introspection's `sub`
        let stored = try #require(session.store.session)
        let access = try #require(stored.accessToken)
        #expect(stored.refreshToken != nil && stored.memberID == "alice")
        #expect(try await server.me(access) == 200)
        // The exchange: the code from the redirect, our redirect URI, the verifier whose S256
        // is the challenge in the URL (the server checked it too: it issued tokens).
        let exchange = try #require(try await server.requests().last { $0.form["grant_type"] == "authorization_code" })
        let verifier = try #require(exchange.form["code_verifier"])
        #expect(BrowserFlowTests.s256(verifier) == challenge)
        #expect(verifier.count >= 43 && verifier != challenge)
        #expect(exchange.form["redirect_uri"] == prompt.redirectURI.absoluteString)
        #expect(exchange.form["client_id"] == "sessionflow-public")
        let stats = try await server.authorizeStats()
        #expect(stats["codes_issued"] == 1 && stats["code_exchanges"] == 1 && stats["codes_refused"] == 0)
        // The listener is gone: the port refuses connections and can be bound again.
        #expect(!BrowserFlowTests.listens(port))
        #expect(BrowserFlowTests.canBind(port))
        // Nothing secret in the logs or the prompt.
        let code = try #require(exchange.form["code"])
        for secret in [code, verifier, access.reveal(), stored.refreshToken!.reveal()] {
            #expect(!session.output.contains(secret) && !"\(prompt)".contains(secret))
        }
        await session.stop()
    }

    @Test func aWrongStateIsRefusedAndTheFlowWaitsForTheRightRedirect() async throws {
        let setup = try await Setup()
        let (server, session) = (setup.server, setup.session)
        let signIn = Task { try await session.manager.signIn(with: setup.flow) }
        let prompt = try #require(await setup.prompts.first())
        let port = try #require(prompt.redirectURI.port)
        let location = try await server.consent(prompt, allow: true)
        let state = try #require(BrowserFlowTests.query(location)["state"])
        let code = try #require(BrowserFlowTests.query(location)["code"])
        // A forged redirect (another state, no state, two states), another path or method,
        // a callback without code or error: 400 (404 for the path), ignored.
        let forged: [(String, String, Int)] = [
            ("GET", "/callback?code=\(code)&state=forged", 400),
            ("GET", "/callback?code=\(code)", 400),
            ("GET", "/callback?code=\(code)&state=\(state)&state=\(state)", 400),
            ("GET", "/callback?state=\(state)", 400),
            ("POST", "/callback?code=\(code)&state=\(state)", 400),
            ("GET", "/favicon.ico", 404),
            ("GET", "/callback?error=access_denied&state=nope", 400),
        ]
        for (method, path, status) in forged {
            let answer = try await LoopbackHTTP.perform(port: port, method: method, path: path)
            #expect(answer.status == status, "\(method) \(path)")
        }
        #expect(session.manager.state.value == .loggedOut)
        #expect(try await server.authorizeStats()["code_exchanges"] == 0)  // nothing was exchanged
        // The real redirect still works.
        let page = try await LoopbackHTTP.perform(port: port, method: "GET", path: BrowserFlowTests.pathAndQuery(location))
        #expect(page.status == 200 && page.text.contains("You can close this window"))
        try await signIn.value
        #expect(session.manager.state.value == .loggedIn)
        // A second redirect after completion: refused (nothing listens any more).
        #expect(throws: LoopbackHTTP.Failure.self) {
            try LoopbackHTTP.request(port: port, method: "GET", path: BrowserFlowTests.pathAndQuery(location))
        }
        #expect(try await server.authorizeStats()["code_exchanges"] == 1)
        await session.stop()
    }

    @Test func accessDeniedInTheBrowserEndsTheSignIn() async throws {
        let setup = try await Setup()
        let (server, session) = (setup.server, setup.session)
        let signIn = Task { try await session.manager.signIn(with: setup.flow) }
        let prompt = try #require(await setup.prompts.first())
        let port = try #require(prompt.redirectURI.port)
        let page = try await server.browse(prompt, consent: false)
        #expect(page.status == 200 && page.text.contains("access_denied") && page.text.contains("You can close this window"))
        let error = await #expect(throws: SessionError.self) { try await signIn.value }
        #expect(error?.code == .accessDenied)
        #expect(error?.message.contains("access_denied") == true)
        #expect(session.manager.state.value == .loggedOut && session.store.session == nil)
        #expect(!BrowserFlowTests.listens(port) && BrowserFlowTests.canBind(port))
        #expect(try await server.authorizeStats()["code_exchanges"] == 0)
        await session.stop()
    }

    @Test func anotherErrorIsReportedWithItsCode() async throws {
        let setup = try await Setup()
        let session = setup.session
        let signIn = Task { try await session.manager.signIn(with: setup.flow) }
        let prompt = try #require(await setup.prompts.first())
        let port = try #require(prompt.redirectURI.port)
        let state = try #require(BrowserFlowTests.query(prompt.authorizationURL)["state"])
        let answer = try await LoopbackHTTP.perform(
            port: port, method: "GET",
            path: "/callback?error=invalid_scope&error_description=%1B%5B2J+no+such+scope&state=\(state)")
        #expect(answer.status == 200 && answer.text.contains("invalid_scope"))
        let error = await #expect(throws: SessionError.self) { try await signIn.value }
        #expect(error?.code == .configuration)
        #expect(error?.message.contains("invalid_scope: ?[2J no such scope") == true)  // control bytes replaced
        #expect(!BrowserFlowTests.listens(port))
        await session.stop()
    }

    @Test func noRedirectWithinTheTimeoutEndsWithSignInExpired() async throws {
        let setup = try await Setup(timeout: .seconds(2))
        let session = setup.session
        let started = ContinuousClock.now
        let signIn = Task { try await session.manager.signIn(with: setup.flow) }
        let prompt = try #require(await setup.prompts.first())
        let port = try #require(prompt.redirectURI.port)
        let error = await #expect(throws: SessionError.self) { try await signIn.value }
        #expect(error?.code == .signInExpired)
        let elapsed = ContinuousClock.now - started
        #expect(elapsed >= .seconds(2) && elapsed < .seconds(20))  // the upper bound: a hang guard
        #expect(!BrowserFlowTests.listens(port) && BrowserFlowTests.canBind(port))
        #expect(session.manager.state.value == .loggedOut)
        await session.stop()
    }

    @Test func cancellingClosesTheListenerAndALateRedirectSignsNothingIn() async throws {
        let setup = try await Setup()
        let (server, session) = (setup.server, setup.session)
        let outcomes = LockedBox<[Result<Void, SessionError>]>([])
        let handle = session.manager.signIn(with: setup.flow) { result in outcomes.withLockedValue { $0.append(result) } }
        let prompt = try #require(await setup.prompts.first())
        let port = try #require(prompt.redirectURI.port)
        let location = try await server.consent(prompt, allow: true)
        handle.cancel()
        #expect(await eventually(timeout: .seconds(10), every: .milliseconds(10)) { outcomes.withLockedValue { !$0.isEmpty } })
        #expect(throws: SessionError(.cancelled, "the sign-in was cancelled")) { try outcomes.withLockedValue { $0 }.first?.get() }
        #expect(!BrowserFlowTests.listens(port) && BrowserFlowTests.canBind(port))
        // The browser comes back after the cancel: nobody listens; nothing is exchanged.
        #expect(throws: LoopbackHTTP.Failure.self) {
            try LoopbackHTTP.request(port: port, method: "GET", path: BrowserFlowTests.pathAndQuery(location))
        }
        try await Task.sleep(for: .milliseconds(300))
        #expect(try await server.authorizeStats()["code_exchanges"] == 0)
        #expect(session.manager.state.value == .loggedOut && session.store.session == nil)
        #expect(outcomes.withLockedValue { $0.count } == 1)
        await session.stop()
    }

    @Test func cancellingDuringTheExchangeEndsTheRequest() async throws {
        let setup = try await Setup()
        let (server, session) = (setup.server, setup.session)
        // The exchange is held by the server, long enough that the test, however slowly a
        // loaded machine runs it, cancels before the answer comes.
        try await server.fault("delay:10")
        let signIn = Task { try await session.manager.signIn(with: setup.flow) }
        let prompt = try #require(await setup.prompts.first())
        let page = try await server.browse(prompt, consent: true)
        #expect(page.status == 200)
        func exchange() async -> OAuthServer.RecordedRequest? {
            ((try? await server.requests()) ?? []).first { $0.form["grant_type"] == "authorization_code" }
        }
        // The exchange reached the server (recorded on arrival; the server holds its answer).
        #expect(await eventually(timeout: .seconds(20), every: .milliseconds(10)) { await exchange() != nil })
        signIn.cancel()
        let error = await #expect(throws: SessionError.self) { try await signIn.value }
        #expect(error?.code == .cancelled)
        // Ended without waiting for the held answer: the server has not answered yet.
        let held = await exchange()
        #expect(held != nil && held?.status == nil, "the cancel waited for the server's answer")
        // The held answer comes (to a request the client dropped): nothing is signed in.
        #expect(await eventually(timeout: .seconds(60), every: .milliseconds(50)) { await exchange()?.status != nil })
        #expect(session.manager.state.value == .loggedOut && session.store.session == nil)
        await session.stop()
    }

    @Test func theTimeoutNoLongerAppliesOnceTheBrowserCameBack() async throws {
        // The exchange is held longer than the whole timeout, so it always ends after the
        // timeout's deadline, however soon the browser came back. The timeout is only a bound
        // on the browser's return (at once here; under ThreadSanitizer on a loaded machine it
        // took over 2 s once, the timeout's length then, and the listener was gone).
        let setup = try await Setup(timeout: .seconds(8))
        let (server, session) = (setup.server, setup.session)
        try await server.fault("delay:9")
        let signIn = Task { try await session.manager.signIn(with: setup.flow) }
        let prompt = try #require(await setup.prompts.first())
        #expect(try await server.browse(prompt, consent: true).status == 200)
        try await signIn.value
        #expect(session.manager.state.value == .loggedIn)
        await session.stop()
    }

    @Test func theLoopEndingWhileTheBrowserIsAwayEndsTheFlow() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        var configuration = server.configuration()
        configuration.authorizationEndpoint = server.base.appendingPathComponent("oauth/authorize")
        let loop = try EventLoop(name: "browser-teardown")
        let prompts = BrowserPromptLog(loop: loop)
        let flow = try BrowserAuthorization(configuration) { prompts.add($0) }
        let outcome = LockedBox<Result<SessionTokens, SessionError>?>(nil)
        try loop.execute { _ = flow.start(on: loop) { result in outcome.withLockedValue { $0 = result } } }
        let port = try #require(await prompts.first()?.redirectURI.port)
        try loop.shutdown()
        // Answered (not left hanging), with shutDown, and the listener is gone.
        #expect(await eventually(timeout: .seconds(20)) { outcome.withLockedValue { $0 != nil } })
        if case .failure(let error)? = outcome.withLockedValue({ $0 }) {
            #expect(error.code == .shutDown)
        } else {
            Issue.record("not ended with shutDown")
        }
        #expect(!BrowserFlowTests.listens(port))
    }

    @Test func aCodeTheServerRefusesEndsWithItsError() async throws {
        let setup = try await Setup()
        let (server, session) = (setup.server, setup.session)
        let signIn = Task { try await session.manager.signIn(with: setup.flow) }
        let prompt = try #require(await setup.prompts.first())
        let port = try #require(prompt.redirectURI.port)
        let location = try await server.consent(prompt, allow: true)
        let state = try #require(BrowserFlowTests.query(location)["state"])
        let answer = try await LoopbackHTTP.perform(port: port, method: "GET", path: "/callback?code=not-the-code&state=\(state)")
        #expect(answer.status == 200)
        let error = await #expect(throws: SessionError.self) { try await signIn.value }
        #expect(error?.code == .configuration)
        #expect(error?.message.contains("invalid_grant") == true)
        #expect(session.manager.state.value == .loggedOut)
        #expect(!BrowserFlowTests.listens(port))
        await session.stop()
    }

    @Test func theMemberIDComesFromTheUserinfoEndpointWithoutIntrospection() async throws {
        let setup = try await Setup(introspection: false)
        var configuration = setup.server.configuration(introspection: false)
        configuration.authorizationEndpoint = setup.server.base.appendingPathComponent("oauth/authorize")
        configuration.userinfoEndpoint = setup.server.base.appendingPathComponent("api/me")
        let prompts = setup.prompts
        let flow = try BrowserAuthorization(configuration) { prompts.add($0) }
        let session = setup.session
        let signIn = Task { try await session.manager.signIn(with: flow) }
        let prompt = try #require(await prompts.first())
        _ = try await setup.server.browse(prompt, consent: true, user: "bob")
        try await signIn.value
        #expect(session.manager.memberID == "bob")
        #expect(try await setup.server.stats()["introspections"] == 0)
        await session.stop()
    }

    @Test func discoveryThenBrowserSignIn() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await LiveSession(server)
        let configuration = try await OAuthDiscovery.configuration(
            issuer: server.base, clientID: "sessionflow-public", loop: session.loop)
        let prompts = BrowserPromptLog(loop: session.loop)
        let flow = try BrowserAuthorization(configuration) { prompts.add($0) }
        let signIn = Task { try await session.manager.signIn(with: flow) }
        let prompt = try #require(await prompts.first())
        #expect(prompt.authorizationURL.absoluteString.hasPrefix(server.base.absoluteString + "/oauth/authorize?"))
        _ = try await server.browse(prompt, consent: true)
        try await signIn.value
        #expect(session.manager.state.value == .loggedIn && session.manager.memberID == "alice")
        await session.stop()
    }

    @Test func runsLeaveNoTeardownHookOnTheLoop() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await LiveSession(server)
        let before = session.loop.teardownHookCount
        var configuration = server.configuration()
        configuration.authorizationEndpoint = server.base.appendingPathComponent("oauth/authorize")
        for _ in 0..<3 {
            let prompts = BrowserPromptLog(loop: session.loop)
            let flow = try BrowserAuthorization(configuration) { prompts.add($0) }
            let handle = session.manager.signIn(with: flow) { _ in }
            #expect(await prompts.first() != nil)
            #expect(session.loop.teardownHookCount > before)  // the listener's and its HTTP client's
            handle.cancel()
            _ = try await OAuthDiscovery.configuration(issuer: server.base, clientID: "c", loop: session.loop)
        }
        #expect(await eventually(timeout: .seconds(10)) { session.loop.teardownHookCount == before },
                "hooks: \(session.loop.teardownHookCount), before: \(before)")
        await session.stop()
    }

    @Test func aConfigurationWithoutAnAuthorizationEndpointIsRefused() throws {
        let configuration = OAuthConfiguration(tokenEndpoint: URL(string: "https://auth.example.com/token")!, clientID: "c")
        let error = #expect(throws: OAuthConfigurationError.self) { try BrowserAuthorization(configuration) { _ in } }
        #expect(error?.field == "authorization endpoint")
    }

    @Test func theAuthorizationURLKeepsTheEndpointsQuery() throws {
        let url = try #require(BrowserAuthorization.authorizationURL(
            endpoint: URL(string: "https://auth.example.com/authorize?tenant=a%20b#frag")!, clientID: "c d",
            redirectURI: "http://127.0.0.1:5/callback", scope: nil, state: "s", challenge: "x"))
        #expect(url.absoluteString == "https://auth.example.com/authorize?tenant=a%20b&response_type=code&client_id=c+d"
            + "&redirect_uri=http%3A%2F%2F127.0.0.1%3A5%2Fcallback&state=s&code_challenge=x&code_challenge_method=S256")
        // RFC 7636 Appendix B's example.
        #expect(BrowserAuthorization.challenge(of: "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk")
            == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM")
    }

    // MARK: - The listener's own limits

    @Test func theListenerRefusesWhatIsNotAnHTTPRequestHead() async throws {
        let loop = try EventLoop(name: "listener-test")
        let seen = LockedBox<[String]>([])
        let made = LockedBox<LoopbackListener?>(nil)
        try loop.execute {
            made.withLockedValue {
                $0 = try? LoopbackListener(loop: loop) { method, target in
                    seen.withLockedValue { $0.append("\(method) \(target)") }
                    return .init(status: 200, page: "ok")
                }
            }
        }
        #expect(await eventually(timeout: .seconds(20)) { made.withLockedValue { $0 != nil } })
        let port = try #require(made.withLockedValue { $0?.port })
        // An ordinary request.
        #expect(try await LoopbackHTTP.perform(port: port, method: "GET", path: "/x?y=1").text == "ok")
        // A head longer than 8 KiB, a bad request line, a target with a control byte: 400, no call.
        let raw: [String] = [
            "GET /" + String(repeating: "a", count: 9000) + " HTTP/1.1\r\n\r\n",
            "GET\r\n\r\n",
            "get / HTTP/1.1\r\n\r\n",
            "GET /\u{7F} HTTP/1.1\r\n\r\n",
            "GET / SPDY/3\r\n\r\n",
        ]
        for head in raw {
            #expect(try BrowserFlowTests.rawExchange(port: port, Array(head.utf8)).hasPrefix("HTTP/1.1 400 "), "\(head.prefix(20))")
        }
        #expect(seen.withLockedValue { $0 } == ["GET /x?y=1"])
        // 20 idle connections (more than the 16 it keeps) do not shut the browser out: the
        // oldest idle ones are let go, the newest request is answered.
        var idle: [Int32] = []
        for _ in 0..<20 {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            var address = BrowserFlowTests.loopback(port)
            _ = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            idle.append(fd)
        }
        defer { for fd in idle { close(fd) } }
        try await Task.sleep(for: .milliseconds(100))
        #expect(try await LoopbackHTTP.perform(port: port, method: "GET", path: "/after-idle", timeout: .seconds(5)).text == "ok")
        #expect(seen.withLockedValue { $0 }.last == "GET /after-idle")
        try loop.execute { made.withLockedValue { $0?.close() } }
        #expect(await eventually(timeout: .seconds(20)) { !BrowserFlowTests.listens(port) })
        try loop.execute { made.withLockedValue { $0 = nil } }
        try loop.shutdown()
    }

    @Test func aBrowserThatResetsTheConnectionBeforeTheReplyCostsNothing() async throws {
        // A write to a reset connection raises SIGPIPE, which kills a process that does not
        // ignore it (most do not): the listener must never write that way.
        let loop = try EventLoop(name: "listener-reset")
        let made = LockedBox<LoopbackListener?>(nil)
        let calls = LockedBox(0)
        try loop.execute {
            made.withLockedValue {
                $0 = try? LoopbackListener(loop: loop) { _, _ in
                    calls.withLockedValue { $0 += 1 }
                    usleep(300_000)  // the client resets meanwhile
                    return .init(status: 200, page: String(repeating: "x", count: 200_000))
                }
            }
        }
        #expect(await eventually(timeout: .seconds(20)) { made.withLockedValue { $0 != nil } })
        let port = try #require(made.withLockedValue { $0?.port })
        for _ in 0..<3 {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            var address = BrowserFlowTests.loopback(port)
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            #expect(connected == 0)
            let head = Array("GET /callback HTTP/1.1\r\nHost: x\r\n\r\n".utf8)
            _ = head.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            try await Task.sleep(for: .milliseconds(100))
            var linger = Glibc.linger(l_onoff: 1, l_linger: 0)  // close with RST
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
            close(fd)
            try await Task.sleep(for: .milliseconds(400))
        }
        // Still here, and still answering.
        #expect(calls.withLockedValue { $0 } == 3)
        try loop.execute { made.withLockedValue { $0?.close() } }
        try loop.execute { made.withLockedValue { $0 = nil } }
        try loop.shutdown()
    }

    // MARK: - Helpers

    static func query(_ url: URL) -> [String: String] {
        var fields: [String: String] = [:]
        for item in URLComponents(url: url, resolvingAgainstBaseURL: false)?.queryItems ?? [] {
            fields[item.name] = item.value ?? ""
        }
        return fields
    }

    static func pathAndQuery(_ url: URL) -> String {
        let components = URLComponents(url: url, resolvingAgainstBaseURL: false)
        return (components?.percentEncodedPath ?? "/") + (components?.percentEncodedQuery.map { "?" + $0 } ?? "")
    }

    static func s256(_ verifier: String) -> String {
        Data(SHA256.hash(data: Array(verifier.utf8))).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    /// Whether a socket of this process listens on 127.0.0.1:`port` (the flow's listener).
    /// Connecting alone is not enough: once the flow closed its listener, another process's
    /// server binding port 0 (the suites start many) may be given the same port — a full
    /// parallel run saw one there right after the flow ended.
    static func listens(_ port: Int) -> Bool {
        accepts(port) && socketsOfThisProcess(onPort: port).contains(true)
    }

    /// This process's IPv4 sockets whose local port is `port` (its descriptors, by
    /// getsockname), each with whether it listens (SO_ACCEPTCONN). (Not /proc/net/tcp: a
    /// line past the first page was missed once under ThreadSanitizer, with many sockets.)
    static func socketsOfThisProcess(onPort port: Int) -> [Bool] {
        let descriptors = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        return descriptors.compactMap(Int32.init).compactMap { fd -> Bool? in
            var address = sockaddr_in()
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            let named = withUnsafeMutablePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
            }
            guard named == 0, address.sin_family == sa_family_t(AF_INET),
                  Int(UInt16(bigEndian: address.sin_port)) == port
            else { return nil }
            var accepting: Int32 = 0
            var size = socklen_t(MemoryLayout<Int32>.size)
            guard getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &size) == 0 else { return nil }
            return accepting != 0
        }
    }

    /// Whether something accepts connections on 127.0.0.1:`port`.
    static func accepts(_ port: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        defer { close(fd) }
        var address = loopback(port)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        } == 0
        guard connected else { return false }
        // TCP self-connect: with nothing listening, the kernel may pick `port` itself as this
        // socket's ephemeral port and connect it to itself (seen once in a full parallel run).
        // That is no listener.
        var local = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let named = withUnsafeMutablePointer(to: &local) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        return !(named == 0 && Int(UInt16(bigEndian: local.sin_port)) == port)
    }

    /// Whether a server could listen on 127.0.0.1:`port` again (SO_REUSEADDR, as servers do),
    /// as far as this process goes: it holds no socket there (another process's server may
    /// have been given the port since; see `listens`).
    static func canBind(_ port: Int) -> Bool {
        bindable(port) || socketsOfThisProcess(onPort: port).isEmpty
    }

    static func bindable(_ port: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        defer { close(fd) }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var address = loopback(port)
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        return bound == 0 && listen(fd, 1) == 0
    }

    static func loopback(_ port: Int) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr = in_addr(s_addr: UInt32(0x7F00_0001).bigEndian)
        return address
    }

    /// Sends `bytes` as they are and reads until the listener closes (its answer, as text).
    static func rawExchange(port: Int, _ bytes: [UInt8]) throws -> String {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        defer { close(fd) }
        var limit = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        var address = loopback(port)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else { throw ServerError("connect to 127.0.0.1:\(port) failed") }
        _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count <= 0 { break }
            received += buffer[0..<count]
        }
        return String(decoding: received, as: UTF8.self)
    }
}

/// The browser prompts a flow handed the host, and whether each came on the loop thread.
final class BrowserPromptLog: Sendable {
    let loop: EventLoop
    private let prompts = LockedBox<[(BrowserPrompt, Bool)]>([])

    init(loop: EventLoop) { self.loop = loop }

    func add(_ prompt: BrowserPrompt) {
        let onLoop = loop.inEventLoop
        prompts.withLockedValue { $0.append((prompt, onLoop)) }
    }

    var allOnLoopThread: Bool { prompts.withLockedValue { $0.allSatisfy(\.1) } }

    func first(timeout: Duration = .seconds(20)) async -> BrowserPrompt? {
        _ = await eventually(timeout: timeout, every: .milliseconds(10)) { prompts.withLockedValue { !$0.isEmpty } }
        return prompts.withLockedValue { $0.first?.0 }
    }
}

/// The fixture's consent form, played as a browser would (see oauth_server.py).
extension OAuthServer {
    /// Opens the authorization URL (the consent form) and submits it: the redirect's Location.
    func consent(_ prompt: BrowserPrompt, allow: Bool, user: String = "alice") async throws -> URL {
        let page = try await LoopbackHTTP.perform(
            port: port, method: "GET", path: BrowserFlowTests.pathAndQuery(prompt.authorizationURL))
        guard page.status == 200 else { throw ServerError("the authorization page: HTTP \(page.status) \(page.text)") }
        let pattern = try NSRegularExpression(pattern: #"<input type="hidden" name="([^"]*)" value="([^"]*)">"#)
        let text = page.text
        var fields: [(String, String)] = pattern.matches(in: text, range: NSRange(text.startIndex..., in: text)).map { match in
            (String(text[Range(match.range(at: 1), in: text)!]), Self.unescape(String(text[Range(match.range(at: 2), in: text)!])))
        }
        fields += [("user", user), ("consent", allow ? "allow" : "deny")]
        let answer = try await LoopbackHTTP.perform(
            port: port, method: "POST", path: "/oauth/authorize",
            headers: [("Content-Type", "application/x-www-form-urlencoded")], body: LoopbackHTTP.form(fields))
        guard answer.status == 302, let location = answer.header("Location").flatMap(URL.init(string:)) else {
            throw ServerError("the consent form: HTTP \(answer.status) \(answer.text)")
        }
        return location
    }

    /// `consent`, then follows the redirect to the flow's listener: the page the browser shows.
    func browse(_ prompt: BrowserPrompt, consent allow: Bool, user: String = "alice") async throws -> LoopbackHTTP.Response {
        let location = try await consent(prompt, allow: allow, user: user)
        guard location.host == "127.0.0.1", let port = location.port else { throw ServerError("redirected to \(location)") }
        return try await LoopbackHTTP.perform(port: port, method: "GET", path: BrowserFlowTests.pathAndQuery(location))
    }

    func authorizeStats() async throws -> [String: Int] {
        (try await call("GET", "__authorize/stats").json() as? [String: Int]) ?? [:]
    }

    static func unescape(_ html: String) -> String {
        html.replacingOccurrences(of: "&quot;", with: "\"").replacingOccurrences(of: "&#x27;", with: "'")
            .replacingOccurrences(of: "&lt;", with: "<").replacingOccurrences(of: "&gt;", with: ">")
            .replacingOccurrences(of: "&amp;", with: "&")
    }
}

/// The listener's request-line parser (loop_listener.c) on what any local process may send;
/// the fuzz target (fuzz-loopback-request) holds it to the same properties.
@Suite struct LoopbackRequestLineTests {
    @Test func aWellFormedLineIsTakenAndNothingElse() {
        func line(_ text: String) -> (String, String)? {
            LoopbackRequestParsing.requestLine(Array(text.utf8)).map { ($0.method, $0.target) }
        }
        #expect(line("GET /callback?code=a&state=b HTTP/1.1\r\nHost: x\r\n\r\n")! == ("GET", "/callback?code=a&state=b"))
        #expect(line("POST / HTTP/1.0\r\n\r\n")! == ("POST", "/"))
        for bad in ["get / HTTP/1.1\r\n", "GET  / HTTP/1.1\r\n", "GET / HTTP/2\r\n", "GET x HTTP/1.1\r\n",
                    "GET / HTTP/1.1", "GET /a\u{0}b HTTP/1.1\r\n", "GET /a\u{7F} HTTP/1.1\r\n", "GETGETGETGETGETGETGET / HTTP/1.1\r\n",
                    "\r\n", "", "GET /é HTTP/1.1\r\n",
                    "GET / HTTP/1.0\u{0}\u{18}cal1\r\n\r\n"] {  // found by fuzz-loopback-request
            #expect(line(bad) == nil, "\(bad.debugDescription)")
        }
        let (path, fields) = LoopbackRequestParsing.callback("/callback?code=%41+b&state=%ff&x")
        #expect(path == "/callback" && fields?.map(\.0) == ["code", "x"] && fields?.first?.1 == "A b")
        #expect(LoopbackRequestParsing.shown("<script>\u{1B}é\"'", limit: 200) == "&lt;script&gt;??&quot;&#39;")
    }
}

/// Issue 29, point 4: the start URL carries nothing secret and sends the browser on to the
/// authorization URL; `state` is compared in constant time.
@Suite struct BrowserStartURLTests {
    @Test func theStartURLRedirectsToTheAuthorizationURLUntilTheRedirectIsTaken() async throws {
        let setup = try await BrowserFlowTests.Setup()
        let signIn = Task { try await setup.session.manager.signIn(with: setup.flow) }
        let prompt = try #require(await setup.prompts.first())
        #expect(prompt.startURL?.absoluteString == "http://127.0.0.1:\(prompt.redirectURI.port!)/start")
        let port = try #require(prompt.startURL?.port)
        let redirect = try LoopbackHTTP.request(port: port, method: "GET", path: "/start")
        #expect(redirect.status == 302 && redirect.header("Location") == prompt.authorizationURL.absoluteString)
        #expect(try LoopbackHTTP.request(port: port, method: "POST", path: "/start").status == 404)
        #expect(try await setup.server.browse(prompt, consent: true).status == 200)
        try await signIn.value
        #expect(setup.session.manager.state.value == .loggedIn)
        await setup.session.stop()
    }

    /// The start URL answers once: whoever fetched it first holds the state and the PKCE
    /// challenge, so a second fetch (the browser after another local program, or that program
    /// after the browser) ends the sign-in instead of letting the first answer at the callback
    /// win. Even a callback with the right state is refused after that.
    @Test func aSecondFetchOfTheStartURLEndsTheSignIn() async throws {
        let setup = try await BrowserFlowTests.Setup()
        let signIn = Task { try await setup.session.manager.signIn(with: setup.flow) }
        let prompt = try #require(await setup.prompts.first())
        let port = try #require(prompt.startURL?.port)
        let first = try LoopbackHTTP.request(port: port, method: "GET", path: "/start")
        #expect(first.status == 302)
        let location = try #require(first.header("Location"))
        let second = try LoopbackHTTP.request(port: port, method: "GET", path: "/start")
        #expect(second.status == 400 && second.header("Location") == nil, "\(second.status)")
        let outcome = await signIn.result
        guard case .failure(let error as SessionError) = outcome else {
            Issue.record("the sign-in went on after its start page was fetched twice: \(outcome)")
            return
        }
        #expect(error.code == .cancelled, "\(error)")
        // The first fetcher answers the callback with the state it read: the listener is closed
        // (or refuses it), nothing signed in.
        let state = try #require(URLComponents(string: location)?.queryItems?.first { $0.name == "state" }?.value)
        let late = try? LoopbackHTTP.request(port: port, method: "GET", path: "/callback?state=\(state)&error=access_denied")
        #expect(late.map { $0.status != 200 } ?? true)
        #expect(setup.session.manager.state.value == .loggedOut)
        await setup.session.stop()
    }

    /// A host that shows the person the authorization URL turns the start page off: nothing
    /// legitimate would fetch it, so another local program could, once and unnoticed, to read
    /// the state and the challenge. Without it `/start` is not found, reveals nothing, and does
    /// not end the sign-in, which the authorization URL still completes.
    @Test func withoutAStartPageStartRevealsNothingAndTheAuthorizationURLSignsIn() async throws {
        let setup = try await BrowserFlowTests.Setup(startPage: false)
        let signIn = Task { try await setup.session.manager.signIn(with: setup.flow) }
        let prompt = try #require(await setup.prompts.first())
        #expect(prompt.startURL == nil && !prompt.description.contains("/start"))
        let port = try #require(prompt.redirectURI.port)
        for _ in 0..<2 {
            let start = try LoopbackHTTP.request(port: port, method: "GET", path: "/start")
            #expect(start.status == 404 && start.header("Location") == nil, "\(start.status)")
            #expect(!start.text.contains("state=") && !start.text.contains("code_challenge"))
        }
        #expect(try await setup.server.browse(prompt, consent: true).status == 200)
        try await signIn.value
        #expect(setup.session.manager.state.value == .loggedIn)
        await setup.session.stop()
    }

    @Test func stateIsComparedByteForByte() {
        #expect(BrowserRedirect.constantTimeEqual("abc", "abc"))
        #expect(!BrowserRedirect.constantTimeEqual("abc", "abd"))
        #expect(!BrowserRedirect.constantTimeEqual("abc", "abcd"))
        #expect(!BrowserRedirect.constantTimeEqual("K", "\u{212A}"))
        #expect(BrowserRedirect.constantTimeEqual("", ""))
    }
}
