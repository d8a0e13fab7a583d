import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import Testing

@_spi(Fuzzing) @testable import SessionOAuth

/// The test server's DPoP hooks (see oauth_server.py).
extension OAuthServer {
    /// POST /__dpop/config (nonce_token, nonce_resource, ignore, advertise...).
    func dpop(_ settings: [String: String]) async throws {
        let response = try await call("POST", "__dpop/config", form: settings)
        guard response.status == 200 else { throw ServerError("/__dpop/config: HTTP \(response.status)") }
    }

    /// /__dpop/stats' per-endpoint counters: valid, invalid, absent, nonce_demanded.
    func dpopStats(_ endpoint: String) async throws -> [String: Int] {
        let object = try await call("GET", "__dpop/stats").json() as? [String: Any]
        let endpoints = object?["endpoints"] as? [String: [String: Int]]
        return endpoints?[endpoint] ?? ["valid": 0, "invalid": 0, "absent": 0, "nonce_demanded": 0]
    }

    /// The thumbprint (`jkt`) the server bound `accessToken` to, nil for a bearer token.
    func boundKey(of accessToken: Secret) async throws -> String? {
        let tokens = try await call("GET", "__tokens").json() as? [[String: Any]] ?? []
        return tokens.first { $0["access_token"] as? String == accessToken.reveal() }?["jkt"] as? String
    }

    /// Signs `user` in with the password grant and a proof by a new key: DPoP-bound tokens
    /// that carry the key (what a DPoP sign-in flow hands the session).
    func signInWithDPoP(_ user: String = "alice") async throws -> SessionTokens {
        let key = DPoPKey.generate()
        let url = base.appendingPathComponent("oauth/token").absoluteString
        let proof = try key.proof(method: "POST", url: url)
        let response = try await call("POST", "oauth/token", form: [
            "grant_type": "password", "username": user, "password": "correct horse", "client_id": "sessionflow-public",
        ], headers: [("DPoP", proof.reveal())])
        let object = try response.json() as? [String: Any] ?? [:]
        guard object["token_type"] as? String == "DPoP", let access = object["access_token"] as? String,
              let refresh = object["refresh_token"] as? String, let expiresIn = object["expires_in"] as? Int
        else { throw ServerError("the DPoP password grant did not answer DPoP tokens: \(response.text.prefix(300))") }
        return SessionTokens(
            accessToken: Secret(access), refreshToken: Secret(refresh), expiresIn: .seconds(expiresIn), memberID: user,
            dpopKey: key)
    }

    /// A refresh with `refreshToken` as another client would send it: bearer (`key` nil) or
    /// with a proof by `key`. The answer's status and `error`.
    func stolenRefresh(_ refreshToken: Secret, key: DPoPKey?) async throws -> (Int, String?) {
        let url = base.appendingPathComponent("oauth/token").absoluteString
        let headers = try key.map { [("DPoP", try $0.proof(method: "POST", url: url).reveal())] } ?? []
        let response = try await call("POST", "oauth/token", form: [
            "grant_type": "refresh_token", "refresh_token": refreshToken.reveal(), "client_id": "sessionflow-public",
        ], headers: headers)
        return (response.status, (try? response.json() as? [String: Any])?["error"] as? String)
    }
}

/// Issue 31: sender-constrained sessions (DPoP, RFC 9449) end to end against the Authlib
/// server, which checks every proof with joserfc and binds tokens to the key's thumbprint.
@Suite("DPoP sessions against a real server", .serialized)
struct DPoPSessionTests {
    /// The resource through `perform`, passing the refusal's DPoP-Nonce on, and a good answer's
    /// (what adapters do).
    static func perform(_ session: SessionManager, _ url: String, requestID: String) async throws -> ResourceClient.Answer {
        try await session.perform(method: "GET", url: url) { authorization in
            var request = URLRequest(url: URL(string: url)!)
            request.httpMethod = authorization.method
            for field in authorization.fields { request.setValue(field.value.reveal(), forHTTPHeaderField: field.name) }
            request.setValue(requestID, forHTTPHeaderField: "X-Request-Id")
            let (data, response) = try await URLSession.shared.data(for: request)
            let http = response as! HTTPURLResponse
            if http.statusCode == 401 || http.statusCode == 403 {
                return .refused(
                    status: http.statusCode, wwwAuthenticate: http.value(forHTTPHeaderField: "WWW-Authenticate"),
                    dpopNonce: http.value(forHTTPHeaderField: "DPoP-Nonce"))
            }
            // A good answer's nonce serves the next proof (RFC 9449 §8.2; what adapters do).
            if let nonce = http.value(forHTTPHeaderField: "DPoP-Nonce") { session.rememberDPoPNonce(nonce, for: url) }
            return .done(ResourceClient.Answer(status: http.statusCode, body: data))
        }
    }

    @Test func refreshAndResourceRequestsCarryValidProofsOfTheSessionsKey() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await LiveSession(server)
        let tokens = try await server.signInWithDPoP()
        let key = try #require(tokens.dpopKey)
        try await session.manager.signIn(tokens)
        // The store keeps the key with the tokens.
        #expect(session.store.session?.dpopKey == key)
        let refreshed = try await session.manager.refreshNow()
        #expect(try await server.boundKey(of: refreshed) == key.thumbprint)
        let authorization = try await session.manager.authorization(method: "GET", url: server.resourceURL)
        #expect(authorization.scheme == .dpop && authorization.fields.map(\.name) == ["Authorization", "DPoP"])
        #expect(authorization.value(of: "Authorization")?.reveal() == "DPoP " + refreshed.reveal())
        #expect(session.manager.tokenInfo?.tokenType == "DPoP")
        let answer = try await Self.perform(session.manager, server.resourceURL, requestID: "one")
        #expect(answer.status == 200)
        // Every token-endpoint and resource request carried a valid proof (the sign-in's included).
        let token = try await server.dpopStats("token")
        #expect(token["valid"] == 2 && token["invalid"] == 0 && token["absent"] == 0, "\(token)")
        let resource = try await server.dpopStats("resource")
        #expect(resource["valid"] == 1 && resource["invalid"] == 0 && resource["absent"] == 0, "\(resource)")
        #expect(!session.output.contains(key.encodedPrivateKey.reveal()))
        await session.stop()
    }

    /// A proof is a credential for its request (replayable until the server forgets its jti):
    /// a server that echoes it in its error gets it into no error, event or log line.
    @Test func aServerEchoingTheProofGetsItIntoNoErrorOrLog() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await LiveSession(server)
        try await session.manager.signIn(try await server.signInWithDPoP())
        try await server.fault("echo", count: 1)
        let error = await #expect(throws: SessionError.self) { try await session.manager.refreshNow() }
        let proof = try #require(try await server.lastRequest()?.header("DPoP"))
        #expect(proof.split(separator: ".").count == 3)
        let texts = [error.map { "\($0)" } ?? "", error?.message ?? "", session.output]
            + session.recordedEvents.map { "\($0)" }
        #expect(texts[1].contains("redacted"), "\(texts[1])")  // the echo was there, scrubbed
        for text in texts {
            #expect(!text.contains(String(proof.prefix(40))), "a proof reached a message: \(text)")
        }
        await session.stop()
    }

    @Test func aStolenRefreshTokenIsUselessWhileTheSessionKeepsRefreshing() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await LiveSession(server)
        try await session.manager.signIn(try await server.signInWithDPoP())
        for round in 0..<2 {
            // Given the refresh token copied out of the session (a backup, a core dump)...
            let stolen = try #require(session.store.session?.refreshToken)
            // ...presented as a bearer, and with a proof by another key: both refused.
            #expect(try await server.stolenRefresh(stolen, key: nil) == (400, "invalid_grant"), "round \(round)")
            #expect(try await server.stolenRefresh(stolen, key: DPoPKey.generate()) == (400, "invalid_grant"))
            // The session, with its key, still refreshes.
            _ = try await session.manager.refreshNow()
            #expect(session.manager.state.value == .loggedIn)
        }
        let stats = try await server.call("GET", "__dpop/stats").json() as? [String: Any]
        #expect(stats?["bound_refused"] as? Int == 4)
        await session.stop()
    }

    @Test func aNonceDemandedOnRefreshAndOnTheResourceCostsExactlyOneRetryEach() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await LiveSession(server)
        try await session.manager.signIn(try await server.signInWithDPoP())
        try await server.dpop(["nonce_token": "on", "nonce_resource": "on", "new_nonce": "1"])
        let before = try await server.stats()
        _ = try await session.manager.refreshNow()
        let after = try await server.stats()
        #expect(after["token_requests"]! - before["token_requests"]! == 2, "the refresh, then its one retry with the nonce")
        #expect(after["refresh_grants"]! - before["refresh_grants"]! == 1, "the refused one never reached the grant")
        #expect(try await server.dpopStats("token")["nonce_demanded"] == 1)
        // A new nonce at the server: the one the client remembers is refused once.
        try await server.dpop(["new_nonce": "1"])
        let answer = try await Self.perform(session.manager, server.resourceURL, requestID: "n")
        #expect(answer.status == 200)
        let resource = try await server.resourceStats()
        #expect(resource.counts["requests"] == 2 && resource.counts["ok"] == 1)
        #expect(try await server.dpopStats("resource")["nonce_demanded"] == 1)
        // The nonce is remembered: the next refresh and request need no retry.
        let again = try await server.stats()["token_requests"]!
        _ = try await session.manager.refreshNow()
        #expect(try await server.stats()["token_requests"]! - again == 1)
        _ = try await Self.perform(session.manager, server.resourceURL, requestID: "m")
        #expect(try await server.resourceStats().counts["requests"] == 3)
        await session.stop()
    }

    /// A server that gives a new nonce on every good answer and accepts only the newest (RFC
    /// 9449 §8.2): handed to `rememberDPoPNonce`, each serves the next proof. Five requests make
    /// six (the first refused once for want of a nonce), not ten; nothing is refreshed. A nonce
    /// on a 401 that is no use_dpop_nonce (here invalid_token) is remembered too, for the retry.
    @Test func aServerRotatingItsNonceOnGoodAnswersCostsNoRefusal() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await LiveSession(server)
        try await session.manager.signIn(try await server.signInWithDPoP())
        try await server.dpop(["nonce_resource": "rotate"])
        let refreshes = try await server.stats()["refresh_grants"]!
        for index in 0..<5 {
            #expect(try await Self.perform(session.manager, server.resourceURL, requestID: "r\(index)").status == 200)
        }
        let resource = try await server.resourceStats()
        #expect(resource.counts["requests"] == 6 && resource.counts["ok"] == 5, "\(resource.counts)")
        #expect(try await server.dpopStats("resource")["nonce_demanded"] == 1)
        #expect(try await server.stats()["refresh_grants"]! == refreshes)
        // What no proof can carry, or a URL no request goes to, changes nothing.
        #expect(!session.manager.rememberDPoPNonce(#"bad "nonce"#, for: server.resourceURL))
        #expect(!session.manager.rememberDPoPNonce("n", for: "ftp://127.0.0.1/x"))
        let remembered = DPoPNonces.shared.nonce(for: server.resourceURL)
        #expect(remembered != nil)
        // Another refusal's nonce (not use_dpop_nonce) is remembered for the retry's proof.
        let refused = try await session.manager.authorization(method: "GET", url: server.resourceURL)
        _ = try? await session.manager.unauthorized(
            refused, status: 401, wwwAuthenticate: #"DPoP error="invalid_token""#, dpopNonce: "after-invalid-token")
        #expect(DPoPNonces.shared.nonce(for: server.resourceURL) == "after-invalid-token")
        await session.stop()
    }

    /// A proof the resource refuses as a proof (`invalid_dpop_proof`: here a replayed jti) is
    /// answered with a new proof for the same token: nothing is refreshed (a refresh would
    /// spend a rotation and cure nothing), and the retry goes through.
    @Test func aRefusedProofGetsANewProofNotARefresh() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await LiveSession(server)
        try await session.manager.signIn(try await server.signInWithDPoP())
        let refreshes = try await server.stats()["refresh_grants"]!
        let url = server.resourceURL
        func send(_ authorization: RequestAuthorization) async throws -> (Int, String?) {
            var request = URLRequest(url: URL(string: url)!)
            for field in authorization.fields { request.setValue(field.value.reveal(), forHTTPHeaderField: field.name) }
            let (_, response) = try await URLSession.shared.data(for: request)
            let http = response as! HTTPURLResponse
            return (http.statusCode, http.value(forHTTPHeaderField: "WWW-Authenticate"))
        }
        let first = try await session.manager.authorization(method: "GET", url: url)
        #expect(try await send(first).0 == 200)
        let (status, challenge) = try await send(first)  // the same proof again: its jti is a replay
        #expect(status == 401 && challenge?.contains("invalid_dpop_proof") == true, "\(status) \(challenge ?? "-")")
        let retry = try await session.manager.unauthorized(first, status: status, wwwAuthenticate: challenge)
        func field(_ authorization: RequestAuthorization, _ name: String) -> String? {
            authorization.fields.first { $0.name == name }?.value.reveal()
        }
        #expect(field(retry, "Authorization") == field(first, "Authorization"), "the token was replaced")
        #expect(field(retry, "DPoP") != nil && field(retry, "DPoP") != field(first, "DPoP"))
        #expect(try await send(retry).0 == 200)
        #expect(try await server.stats()["refresh_grants"]! == refreshes, "a refused proof was cured by a refresh")
        await session.stop()
    }

    @Test func aServerDemandingANewNonceEveryTimeEndsInABoundedError() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await LiveSession(server)
        try await session.manager.signIn(try await server.signInWithDPoP())
        try await server.dpop(["nonce_token": "always", "nonce_resource": "always"])
        let before = try await server.stats()["token_requests"]!
        await #expect {
            _ = try await session.manager.refreshNow()
        } throws: { error in
            (error as? SessionError)?.code == .configuration && "\(error)".contains("use_dpop_nonce")
        }
        #expect(try await server.stats()["token_requests"]! - before == 2, "one request, one retry, no more")
        #expect(session.manager.state.value == .loggedIn, "the tokens are kept")
        await #expect {
            _ = try await Self.perform(session.manager, server.resourceURL, requestID: "a")
        } throws: { error in
            (error as? SessionError)?.code == .unauthorized
        }
        #expect(try await server.resourceStats().counts["requests"] == 2)
        await session.stop()
    }

    /// The administrator revokes the access token; 50 requests are under way: one refresh
    /// (with a proof) for all of them, each retried once with a new proof.
    @Test func fiftyConcurrentRefusedRequestsCauseOneRefresh() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await LiveSession(server)
        let tokens = try await server.signInWithDPoP()
        try await session.manager.signIn(tokens)
        try await server.revokeAccess(tokens.accessToken)
        let before = try await server.stats()["refresh_grants"] ?? 0
        let manager = session.manager
        let url = server.resourceURL
        let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
            for index in 0..<50 {
                group.addTask { try await Self.perform(manager, url, requestID: "r\(index)").status }
            }
            return try await group.reduce(into: [Int]()) { $0.append($1) }
        }
        #expect(statuses == Array(repeating: 200, count: 50))
        #expect(try await server.stats()["refresh_grants"]! - before == 1)
        let resource = try await server.dpopStats("resource")
        let requests = try await server.resourceStats().counts["requests"]
        #expect(resource["invalid"] == 0 && resource["absent"] == 0 && resource["valid"] == requests)
        #expect(try await server.dpopStats("token")["invalid"] == 0)
        await session.stop()
    }

    @Test func deviceSignInWithDPoPBindsTheTokensToANewKey() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        try await server.device(["interval": "1", "expires_in": "60"])
        let session = try await LiveSession(server, introspection: true)
        let prompts = PromptLog(loop: session.loop)
        var configuration = server.configuration(introspection: true)
        configuration.deviceAuthorizationEndpoint = server.base.appendingPathComponent("oauth/device_authorization")
        configuration.dpop = .required
        var keys: [String] = []
        for round in 0..<2 {
            let flow = try DeviceAuthorization(configuration, scope: "profile") { prompts.add($0) }
            let signIn = Task { try await session.manager.signIn(with: flow) }
            #expect(await eventually(timeout: .seconds(20)) { prompts.count > round })
            try await server.approve(prompts.all[round].userCode)
            try await signIn.value
            let stored = try #require(session.store.session)
            let key = try #require(stored.dpopKey)
            #expect(try await server.boundKey(of: try #require(stored.accessToken)) == key.thumbprint)
            keys.append(key.thumbprint)
            if round == 0 { try await session.manager.logout() }
        }
        #expect(Set(keys).count == 2, "a new key at every sign-in")
        let token = try await server.dpopStats("token")
        #expect(token["invalid"] == 0 && token["absent"] == 0 && token["valid"]! >= 2, "\(token)")
        await session.stop()
    }

    @Test func browserSignInWithDPoPBindsTheTokensAndTheExchangeCarriesAProof() async throws {
        let setup = try await BrowserFlowTests.Setup { $0.dpop = .required }
        let (server, session) = (setup.server, setup.session)
        let signIn = Task { try await session.manager.signIn(with: setup.flow) }
        let prompt = try #require(await setup.prompts.first())
        #expect(try await server.browse(prompt, consent: true).status == 200)
        try await signIn.value
        let stored = try #require(session.store.session)
        let key = try #require(stored.dpopKey)
        #expect(try await server.boundKey(of: try #require(stored.accessToken)) == key.thumbprint)
        let exchange = try #require(try await server.requests().last { $0.form["grant_type"] == "authorization_code" })
        #expect(exchange.header("DPoP") != nil)
        let token = try await server.dpopStats("token")
        #expect(token["valid"] == 1 && token["invalid"] == 0 && token["absent"] == 0, "\(token)")
        #expect(try await Self.perform(session.manager, server.resourceURL, requestID: "b").status == 200)
        await session.stop()
    }

    @Test func requiredDPoPRefusesAServerThatIgnoresIt() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        try await server.device(["interval": "1", "expires_in": "60"])
        try await server.dpop(["ignore": "1"])
        let session = try await LiveSession(server)
        let prompts = PromptLog(loop: session.loop)
        var configuration = server.configuration()
        configuration.deviceAuthorizationEndpoint = server.base.appendingPathComponent("oauth/device_authorization")
        configuration.dpop = .required
        let flow = try DeviceAuthorization(configuration, scope: nil) { prompts.add($0) }
        let signIn = Task { try await session.manager.signIn(with: flow) }
        #expect(await eventually(timeout: .seconds(20)) { prompts.count > 0 })
        try await server.approve(prompts.all[0].userCode)
        await #expect {
            try await signIn.value
        } throws: { error in
            (error as? SessionError)?.code == .configuration && "\(error)".contains("ignored DPoP")
        }
        #expect(session.manager.state.value == .loggedOut)
        await session.stop()
    }

    /// `.ifSupported` with a server that answers Bearer to the proof: a bearer session (no key
    /// kept), signed in, its authorizations Bearer.
    @Test func ifSupportedTakesBearerTokensFromAServerThatIgnoresDPoP() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        try await server.device(["interval": "1", "expires_in": "60"])
        try await server.dpop(["ignore": "1"])
        let session = try await LiveSession(server)
        let prompts = PromptLog(loop: session.loop)
        var configuration = server.configuration()
        configuration.deviceAuthorizationEndpoint = server.base.appendingPathComponent("oauth/device_authorization")
        configuration.dpop = .ifSupported
        configuration.dpopSigningAlgorithms = ["ES256"]
        let flow = try DeviceAuthorization(configuration, scope: nil) { prompts.add($0) }
        let signIn = Task { try await session.manager.signIn(with: flow) }
        #expect(await eventually(timeout: .seconds(20)) { prompts.count > 0 })
        try await server.approve(prompts.all[0].userCode)
        try await signIn.value
        #expect(session.manager.state.value == .loggedIn)
        #expect(session.store.session?.dpopKey == nil)
        #expect(try await session.manager.authorization(method: "GET", url: server.resourceURL).scheme == .bearer)
        #expect(try await Self.perform(session.manager, server.resourceURL, requestID: "i").status == 200)
        await session.stop()
    }

    @Test func ifSupportedFollowsTheMetadata() throws {
        var configuration = OAuthConfiguration(tokenEndpoint: URL(string: "https://as.example/token")!, clientID: "c")
        configuration.dpop = .ifSupported
        // Discovery reads dpop_signing_alg_values_supported (RFC 9449 §5.1); another shape is none.
        func discovered(_ algorithms: String) throws -> [String]? {
            let body = #"{"issuer": "https://as.example", "token_endpoint": "https://as.example/token""#
                + (algorithms.isEmpty ? "" : #", "dpop_signing_alg_values_supported": "# + algorithms) + "}"
            return try OAuthDiscovery.configuration(metadata: Array(body.utf8), issuer: "https://as.example", template: configuration)
                .get().dpopSigningAlgorithms
        }
        #expect(try discovered(#"["ES256", "RS256"]"#) == ["ES256", "RS256"])
        #expect(try discovered("") == nil && discovered(#""ES256""#) == nil)
        #expect(!configuration.signsInWithDPoP)
        configuration.dpopSigningAlgorithms = ["RS256"]
        #expect(!configuration.signsInWithDPoP)
        configuration.dpopSigningAlgorithms = ["RS256", "ES256"]
        #expect(configuration.signsInWithDPoP)
        configuration.dpop = .off
        #expect(!configuration.signsInWithDPoP)
    }
}

extension PromptLog {
    var count: Int { all.count }
}
