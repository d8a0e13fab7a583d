import Foundation
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import Testing

@_spi(Fuzzing) @testable import SessionOAuth

/// Discovery (issue 15, point 1): a configuration from an issuer URL through Authorization
/// Server Metadata (RFC 8414) or OpenID Connect discovery, against the real Authlib server's
/// documents (Tests/Fixtures/oauth_server.py) and its faults on them.
@Suite("Discovery: configuration from an issuer (RFC 8414, OpenID Connect)", .serialized)
struct DiscoveryTests {
    /// What the completion form delivered, and whether it ran on the loop thread.
    struct Delivery: Sendable {
        let result: Result<OAuthConfiguration, OAuthDiscoveryError>
        let onLoopThread: Bool
    }

    /// One discovery through the completion form.
    static func discover(
        _ issuer: URL, loop: EventLoop, requestTimeout: Duration = .seconds(10), maximumAnswerSize: Int = 1 << 20
    ) async -> Delivery {
        await withCheckedContinuation { (continuation: CheckedContinuation<Delivery, Never>) in
            // Called off the loop thread: a completion on the loop thread is not inside the call.
            #expect(!loop.inEventLoop)
            OAuthDiscovery.configuration(
                issuer: issuer, clientID: "sessionflow-public", loop: loop, requestTimeout: requestTimeout,
                maximumAnswerSize: maximumAnswerSize
            ) { result in
                continuation.resume(returning: Delivery(result: result, onLoopThread: loop.inEventLoop))
            }
        }
    }

    /// The error of a discovery that must fail.
    static func refusal(
        _ issuer: URL, loop: EventLoop, requestTimeout: Duration = .seconds(10), maximumAnswerSize: Int = 1 << 20,
        sourceLocation: SourceLocation = #_sourceLocation
    ) async -> OAuthDiscoveryError? {
        let delivery = await discover(issuer, loop: loop, requestTimeout: requestTimeout, maximumAnswerSize: maximumAnswerSize)
        #expect(delivery.onLoopThread, sourceLocation: sourceLocation)
        switch delivery.result {
        case .success(let configuration):
            Issue.record("discovery succeeded: \(configuration.tokenEndpoint)", sourceLocation: sourceLocation)
            return nil
        case .failure(let error):
            #expect(error.description.utf8.count < 600, sourceLocation: sourceLocation)
            #expect(error.description.unicodeScalars.allSatisfy { (0x20...0x7E).contains($0.value) },
                    "\(error.description)", sourceLocation: sourceLocation)
            return error
        }
    }

    @Test func theDiscoveredConfigurationIsTheServersAndASessionMadeFromItRefreshesAndRevokes() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let loop = try EventLoop(name: "discovery")
        defer { _ = try? loop.shutdown() }
        let delivery = await Self.discover(server.base, loop: loop)
        #expect(delivery.onLoopThread)
        let configuration = try delivery.result.get()
        let base = server.base.absoluteString
        #expect(configuration.tokenEndpoint.absoluteString == "\(base)/oauth/token")
        #expect(configuration.revocationEndpoint?.absoluteString == "\(base)/oauth/revoke")
        #expect(configuration.introspectionEndpoint?.absoluteString == "\(base)/oauth/introspect")
        #expect(configuration.deviceAuthorizationEndpoint?.absoluteString == "\(base)/oauth/device_authorization")
        #expect(configuration.authorizationEndpoint?.absoluteString == "\(base)/oauth/authorize")
        #expect(configuration.userinfoEndpoint == nil)  // RFC 8414 has none
        #expect(configuration.clientID == "sessionflow-public" && configuration.clientSecret == nil)
        // One GET, to the RFC 8414 location, with the transport's headers; no OIDC request.
        let requests = try await server.requests()
        #expect(requests.map { "\($0.method) \($0.path)" } == ["GET /.well-known/oauth-authorization-server"])
        #expect(requests.first?.header("Accept-Encoding") == "identity")
        #expect(try await server.stats()["openid_requests"] == 0)

        // The async form gives the same.
        let again = try await OAuthDiscovery.configuration(issuer: server.base, clientID: "sessionflow-public", loop: loop)
        #expect(again.tokenEndpoint == configuration.tokenEndpoint && again.revocationEndpoint == configuration.revocationEndpoint)

        // A session on it refreshes, introspects and revokes against the real server.
        let session = try await LiveSession(server, oauth: { $0 = configuration })
        let tokens = try await server.signIn()
        try await session.manager.signIn(tokens)
        let fresh = try await session.manager.refreshNow()
        #expect(fresh != tokens.accessToken)
        #expect(try await server.me(fresh) == 200)
        #expect(try await server.stats()["refresh_grants"] == 1)
        try session.manager.resume()
        #expect(try await eventually(timeout: .seconds(20), every: .milliseconds(20)) {
            try await server.stats()["introspections"] == 1
        })
        try await session.manager.logout()
        #expect(try await eventually(timeout: .seconds(20), every: .milliseconds(20)) {
            try await server.stats()["revocations"] == 1
        })
        await session.stop()
    }

    @Test func anIssuerWithAPathHasTheWellKnownSegmentBeforeItsPath() async throws {
        func locations(_ issuer: String) throws -> [String] {
            let found = try OAuthDiscovery.wellKnownLocations(URL(string: issuer)!)
            return [found.authorizationServer, found.openID]
        }
        #expect(try locations("https://h.example/tenant") == [
            "https://h.example/.well-known/oauth-authorization-server/tenant",
            "https://h.example/tenant/.well-known/openid-configuration",
        ])
        #expect(try locations("https://h.example/tenant/") == [
            "https://h.example/.well-known/oauth-authorization-server/tenant",
            "https://h.example/tenant/.well-known/openid-configuration",
        ])
        #expect(try locations("https://h.example:8443") == [
            "https://h.example:8443/.well-known/oauth-authorization-server",
            "https://h.example:8443/.well-known/openid-configuration",
        ])
        #expect(try locations("http://127.0.0.1:9/a/b") == [
            "http://127.0.0.1:9/.well-known/oauth-authorization-server/a/b",
            "http://127.0.0.1:9/a/b/.well-known/openid-configuration",
        ])

        let server = try await OAuthServer(expiresIn: 3600)
        let loop = try EventLoop(name: "discovery-path")
        defer { _ = try? loop.shutdown() }
        let issuer = URL(string: "\(server.base.absoluteString)/tenant/one")!
        let configuration = try await OAuthDiscovery.configuration(issuer: issuer, clientID: "sessionflow-public", loop: loop)
        #expect(configuration.tokenEndpoint.absoluteString == "\(server.base.absoluteString)/oauth/token")
        #expect(try await server.requests().map(\.path) == ["/.well-known/oauth-authorization-server/tenant/one"])
    }

    @Test func a404AtTheRFC8414LocationFallsBackToOpenIDConnectAndNothingElseDoes() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let loop = try EventLoop(name: "discovery-oidc")
        defer { _ = try? loop.shutdown() }
        let base = server.base.absoluteString
        try await server.fault("status:404", endpoint: "metadata")
        let configuration = try await OAuthDiscovery.configuration(issuer: server.base, clientID: "sessionflow-public", loop: loop)
        #expect(configuration.userinfoEndpoint?.absoluteString == "\(base)/api/me")  // only the OIDC document has it
        #expect(configuration.tokenEndpoint.absoluteString == "\(base)/oauth/token")
        #expect(try await server.requests().map(\.path) == [
            "/.well-known/oauth-authorization-server", "/.well-known/openid-configuration",
        ])

        // With a path: the OIDC location appends to the issuer.
        try await server.fault("status:404", endpoint: "metadata")
        let tenant = URL(string: "\(base)/tenant")!
        let withPath = try await OAuthDiscovery.configuration(issuer: tenant, clientID: "sessionflow-public", loop: loop)
        #expect(withPath.userinfoEndpoint?.absoluteString == "\(base)/api/me")
        #expect(try await server.requests().suffix(2).map(\.path) == [
            "/.well-known/oauth-authorization-server/tenant", "/tenant/.well-known/openid-configuration",
        ])

        // Another failure status is no reason to fall back; a 404 at both is reported.
        try await server.fault("status:500", endpoint: "metadata")
        let error = await Self.refusal(server.base, loop: loop)
        #expect(error?.kind == .http && error?.description == "the metadata request got HTTP 500")
        #expect(try await server.stats()["openid_requests"] == 2)
        try await server.fault("status:404", endpoint: "metadata")
        try await server.fault("status:404", endpoint: "openid")
        let neither = await Self.refusal(server.base, loop: loop)
        #expect(neither?.kind == .http)
        #expect(neither?.description.contains("OpenID Connect") == true && neither?.description.contains("HTTP 404") == true)
    }

    @Test func aDocumentWhoseIssuerDiffersIsRefusedNamingTheIssuer() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let loop = try EventLoop(name: "discovery-issuer")
        defer { _ = try? loop.shutdown() }
        try await server.fault("set:issuer=https://other.example", endpoint: "metadata")
        let error = await Self.refusal(server.base, loop: loop)
        #expect(error?.kind == .metadata && error?.field == "issuer")
        #expect(error?.description.hasPrefix("the metadata's issuer 'https://other.example' is not the issuer asked for") == true,
                "\(error?.description ?? "")")
        #expect(try await server.stats()["openid_requests"] == 0)  // refused, not a reason to look elsewhere

        // Exact comparison: a terminating "/" makes another issuer.
        let slash = await Self.refusal(URL(string: server.base.absoluteString + "/")!, loop: loop)
        #expect(slash?.field == "issuer")

        // The OIDC document is held to the same rule.
        try await server.fault("status:404", endpoint: "metadata")
        try await server.fault("set:issuer=https://other.example", endpoint: "openid")
        #expect(await Self.refusal(server.base, loop: loop)?.field == "issuer")

        // What the server wrote reaches the message bounded and printable.
        let hostile = "https://x.example/\u{1b}]0;pwned\u{07}\u{1b}[2J" + String(repeating: "A", count: 5000)
        try await server.fault("set:issuer=\(hostile)", endpoint: "metadata")
        let shown = await Self.refusal(server.base, loop: loop)
        #expect(shown?.field == "issuer")
        #expect(shown?.description.contains("\u{1b}") == false && shown?.description.contains("pwned") == true)

        // No issuer at all, or not a string.
        try await server.fault("drop:issuer", endpoint: "metadata")
        #expect(await Self.refusal(server.base, loop: loop)?.description == "the metadata has no issuer")
        try await server.fault("set-json:issuer=7", endpoint: "metadata")
        #expect(await Self.refusal(server.base, loop: loop)?.description == "the metadata's issuer is not a string")
    }

    @Test func anEndpointOverPlainHttpToAHostThatIsNotLoopbackIsRefusedNamingTheField() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let loop = try EventLoop(name: "discovery-endpoints")
        defer { _ = try? loop.shutdown() }
        for field in ["token_endpoint", "revocation_endpoint", "introspection_endpoint",
                      "device_authorization_endpoint", "authorization_endpoint"] {
            try await server.fault("set:\(field)=http://auth.example.com/x", endpoint: "metadata")
            let error = await Self.refusal(server.base, loop: loop)
            #expect(error?.kind == .metadata && error?.field == field, "\(field)")
            #expect(error?.description.hasPrefix(
                "the metadata's \(field) uses plain http to a host that is not loopback") == true,
                "\(error?.description ?? "")")
        }
        // The OIDC document's userinfo_endpoint too.
        try await server.fault("status:404", endpoint: "metadata")
        try await server.fault("set:userinfo_endpoint=http://10.0.0.1/me", endpoint: "openid")
        let userinfo = await Self.refusal(server.base, loop: loop)
        #expect(userinfo?.field == "userinfo_endpoint" && userinfo?.description.contains("plain http") == true)

        // Credentials inside, another scheme, not a string, not there.
        try await server.fault("set:revocation_endpoint=https://u:p@auth.example.com/revoke", endpoint: "metadata")
        let credentials = await Self.refusal(server.base, loop: loop)
        #expect(credentials?.field == "revocation_endpoint" && credentials?.description.contains("user name or password") == true)
        try await server.fault("set:introspection_endpoint=ftp://auth.example.com/i", endpoint: "metadata")
        #expect(await Self.refusal(server.base, loop: loop)?.field == "introspection_endpoint")
        try await server.fault("set-json:token_endpoint=42", endpoint: "metadata")
        #expect(await Self.refusal(server.base, loop: loop)?.description == "the metadata's token_endpoint is not a string")
        try await server.fault("drop:token_endpoint", endpoint: "metadata")
        let missing = await Self.refusal(server.base, loop: loop)
        #expect(missing?.field == "token_endpoint" && missing?.description == "the metadata has no token_endpoint")

        // Optional endpoints may be absent; https to any host is fine.
        try await server.fault("drop:revocation_endpoint", endpoint: "metadata")
        let partial = try await OAuthDiscovery.configuration(issuer: server.base, clientID: "sessionflow-public", loop: loop)
        #expect(partial.revocationEndpoint == nil && partial.introspectionEndpoint != nil)
        try await server.fault("set:revocation_endpoint=https://auth.example.com/revoke", endpoint: "metadata")
        let https = try await OAuthDiscovery.configuration(issuer: server.base, clientID: "sessionflow-public", loop: loop)
        #expect(https.revocationEndpoint?.absoluteString == "https://auth.example.com/revoke")
    }

    /// Issue 29, point 3: a remote issuer's metadata naming plain http to loopback is refused
    /// (anything on this machine could listen there); a loopback issuer's may.
    @Test func aRemoteIssuerMayNotNameLoopbackHttpEndpoints() throws {
        let template = OAuthConfiguration(tokenEndpoint: URL(string: "https://as.example")!, clientID: "c")
        for field in ["token_endpoint", "revocation_endpoint", "introspection_endpoint",
                      "device_authorization_endpoint", "authorization_endpoint"] {
            var document: [String: String] = ["issuer": "https://as.example", "token_endpoint": "https://as.example/token"]
            document[field] = "http://127.0.0.1:8080/x"
            let body = Array(try JSONSerialization.data(withJSONObject: document))
            guard case .failure(let error) = OAuthDiscovery.configuration(metadata: body, issuer: "https://as.example", template: template) else {
                Issue.record("\(field): loopback http accepted from a remote issuer")
                continue
            }
            #expect(error.field == field && error.description.contains("is not loopback"), "\(error)")
            // The same document from a loopback issuer is taken.
            document["issuer"] = "http://127.0.0.1:9"
            let local = Array(try JSONSerialization.data(withJSONObject: document))
            #expect((try? OAuthDiscovery.configuration(metadata: local, issuer: "http://127.0.0.1:9", template: template).get()) != nil)
        }
        // Byte for byte: a Kelvin sign is not a K, however Unicode compares them.
        #expect("https://as.example/K" == "https://as.example/\u{212A}")  // Swift's ==: canonical
        let kelvin = Array(try JSONSerialization.data(withJSONObject: [
            "issuer": "https://as.example/\u{212A}", "token_endpoint": "https://as.example/token"]))
        guard case .failure(let other) = OAuthDiscovery.configuration(metadata: kelvin, issuer: "https://as.example/K", template: template) else {
            Issue.record("an issuer equal only under canonical equivalence was taken")
            return
        }
        #expect(other.field == "issuer")
        #expect(OAuthConfiguration.isLoopback(URL(string: "https://localhost:1/")!))
        #expect(OAuthConfiguration.isLoopback(URL(string: "http://[::1]:1/")!))
        #expect(!OAuthConfiguration.isLoopback(URL(string: "https://127.0.0.1.evil.example/")!))
        #expect(!OAuthConfiguration.isLoopback(URL(string: "https://as.example/")!))
    }

    @Test func garbageAFailureStatusARedirectAndAnOversizedAnswerAreRefusedClearly() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let loop = try EventLoop(name: "discovery-faults")
        defer { _ = try? loop.shutdown() }
        for mode in ["truncated", "html"] {
            try await server.fault(mode, endpoint: "metadata")
            let error = await Self.refusal(server.base, loop: loop)
            #expect(error?.kind == .metadata && error?.description == "the metadata document is not a JSON object", "\(mode)")
        }
        try await server.fault("status:503", endpoint: "metadata")
        #expect(await Self.refusal(server.base, loop: loop)?.description == "the metadata request got HTTP 503")

        try await server.fault("redirect:302", endpoint: "metadata")
        let redirect = await Self.refusal(server.base, loop: loop)
        #expect(redirect?.kind == .http && redirect?.description.contains("HTTP 302") == true)
        #expect(redirect?.description.contains("redirects are not followed") == true)
        #expect(try await server.redirectHits().isEmpty)  // not followed
        #expect(try await server.stats()["openid_requests"] == 0)

        try await server.fault("huge", endpoint: "metadata")  // 4 MiB against the 1 MiB default
        let huge = await Self.refusal(server.base, loop: loop)
        #expect(huge?.kind == .metadata && huge?.description.contains("larger than 1048576 bytes") == true)
        // The limit given is the one applied (the real document is some 800 bytes).
        let small = await Self.refusal(server.base, loop: loop, maximumAnswerSize: 100)
        #expect(small?.description.contains("larger than 100 bytes") == true)

        try await server.fault("delay:3", endpoint: "metadata")
        let slow = await Self.refusal(server.base, loop: loop, requestTimeout: .milliseconds(500))
        #expect(slow?.kind == .network && slow?.description.contains("timed out") == true)
    }

    @Test func aDiscoveryCanBeCancelledByItsHandleOrItsTask() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let loop = try EventLoop(name: "discovery-cancel")
        defer { _ = try? loop.shutdown() }
        // The handle: the server holds the answer 30 s; the cancel ends the request at once (the bound
        // below is a hang guard, a third of the hold).
        try await server.fault("delay:30", endpoint: "metadata")
        let delivered = LockedBox<[(Result<OAuthConfiguration, OAuthDiscoveryError>, Bool)]>([])
        let run = OAuthDiscovery.configuration(issuer: server.base, clientID: "c", loop: loop) { result in
            delivered.withLockedValue { $0.append((result, loop.inEventLoop)) }
        }
        #expect(await eventually(timeout: .seconds(10), every: .milliseconds(10)) {
            ((try? await server.stats())?["metadata_requests"] ?? 0) >= 1
        })
        let cancelledAt = ContinuousClock.now
        run.cancel()
        run.cancel()
        #expect(await eventually(timeout: .seconds(10), every: .milliseconds(10)) { delivered.withLockedValue { !$0.isEmpty } })
        #expect(ContinuousClock.now - cancelledAt < .seconds(10))
        try await Task.sleep(for: .milliseconds(200))
        let seen = delivered.withLockedValue { $0 }
        #expect(seen.count == 1 && seen.first?.1 == true)
        if case .failure(let error)? = seen.first?.0 { #expect(error.kind == .cancelled) } else { Issue.record("not cancelled") }
        // The Task: cancelling it cancels the discovery.
        try await server.fault("delay:30", endpoint: "metadata")
        let task = Task { try await OAuthDiscovery.configuration(issuer: server.base, clientID: "c", loop: loop) }
        #expect(await eventually(timeout: .seconds(10), every: .milliseconds(10)) {
            ((try? await server.stats())?["metadata_requests"] ?? 0) >= 2
        })
        task.cancel()
        let started = ContinuousClock.now
        let error = await #expect(throws: OAuthDiscoveryError.self) { try await task.value }
        #expect(error?.kind == .cancelled)
        #expect(ContinuousClock.now - started < .seconds(10))
        // Not falling back to OpenID Connect after a cancel.
        #expect(try await server.stats()["openid_requests"] == 0)
    }

    @Test func anIssuerThatBreaksTheTransportRuleIsRefusedBeforeAnyRequest() async throws {
        let loop = try EventLoop(name: "discovery-rule")
        defer { _ = try? loop.shutdown() }
        let plain = await Self.refusal(URL(string: "http://auth.example.com")!, loop: loop)
        #expect(plain?.kind == .configuration && plain?.field == "issuer")
        #expect(plain?.description.hasPrefix("the issuer uses plain http to a host that is not loopback") == true)
        let credentials = await Self.refusal(URL(string: "https://u:p@auth.example.com")!, loop: loop)
        #expect(credentials?.field == "issuer" && credentials?.description.contains("user name or password") == true)
        let query = await Self.refusal(URL(string: "https://auth.example.com/t?x=1")!, loop: loop)
        #expect(query?.field == "issuer" && query?.description.contains("query or fragment") == true)
        let client = await Self.refusal(URL(string: "https://auth.example.com")!, loop: loop, requestTimeout: .zero)
        #expect(client?.kind == .configuration && client?.field == "request timeout")
    }

    @Test func explicitEndpointsFollowTheSameRule() throws {
        let loop = try EventLoop(name: "explicit")
        defer { _ = try? loop.shutdown() }
        var configuration = OAuthConfiguration(tokenEndpoint: URL(string: "https://a.example/token")!, clientID: "c")
        configuration.deviceAuthorizationEndpoint = URL(string: "https://a.example/device")
        configuration.authorizationEndpoint = URL(string: "http://127.0.0.1:9/authorize")
        configuration.userinfoEndpoint = URL(string: "https://a.example/userinfo")
        #expect(throws: Never.self) { try OAuthAuthority(configuration, loop: loop) }
        for (path, field) in [(\OAuthConfiguration.deviceAuthorizationEndpoint, "device authorization endpoint"),
                              (\.authorizationEndpoint, "authorization endpoint"), (\.userinfoEndpoint, "userinfo endpoint")] {
            var broken = configuration
            broken[keyPath: path] = URL(string: "http://a.example/x")
            #expect(throws: OAuthConfigurationError.self) { try broken.validate() }
            do {
                try broken.validate()
            } catch {
                #expect(error.field == field && error.reason.contains("plain http"))
            }
        }
    }
}
