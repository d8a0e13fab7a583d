import Foundation
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import Testing

@_spi(Fuzzing) @testable import SessionOAuth

/// Issue 28 point 3: the granted scope, read from the token answers of the real Authlib server
/// (`POST /__resource/config grant_scope=read` makes it grant less than asked), kept by the
/// session and reported by `SessionManager.tokenInfo`.
@Suite("Granted scope against the Authlib server (issue 28)", .serialized)
struct TokenScopeTests {
    /// A device sign-in asking `scope`, approved by alice; the session signed in with it.
    static func deviceSignIn(_ server: OAuthServer, _ session: LiveSession, scope: String) async throws {
        try await server.device(["interval": "1", "expires_in": "60"])
        let prompts = PromptLog(loop: session.loop)
        var configuration = server.configuration()
        configuration.deviceAuthorizationEndpoint = server.base.appendingPathComponent("oauth/device_authorization")
        let flow = try DeviceAuthorization(configuration, scope: scope) { prompt in prompts.add(prompt) }
        let signIn = Task { try await session.manager.signIn(with: flow) }
        let prompt = try #require(await prompts.first())
        try await server.approve(prompt.userCode)
        try await signIn.value
    }

    @Test func aNarrowerScopeGrantedAtSignInIsReportedAsGranted() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        try await server.grantScope("read")
        let session = try await LiveSession(server)
        try await Self.deviceSignIn(server, session, scope: "read write")
        let info = try #require(session.manager.tokenInfo)
        #expect(info.tokenType == "Bearer")
        #expect(info.scope == "read")
        #expect(info.scopes == ["read"])
        let left = try #require(info.expiresIn)
        #expect(left > .seconds(3500) && left <= .seconds(3600))
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let at = try #require(info.expiresAtUnixMilliseconds)
        #expect(abs(at - (now + 3_600_000)) < 120_000)
        #expect(session.store.session?.grantedScope == "read")
        // The resource agrees.
        let authorization = try await session.manager.authorization(method: "GET", url: server.resourceURL)
        let (answer, _) = try await ResourceClient.get(server.resourceURL, authorization, requestID: "scope")
        #expect(answer.status == 200)
        let body = try JSONSerialization.jsonObject(with: answer.body) as? [String: Any]
        #expect(body?["scope"] as? String == "read")
        await session.stop()
    }

    @Test func theScopeAskedForIsReportedWhenGrantedWhole() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await LiveSession(server)
        try await Self.deviceSignIn(server, session, scope: "read write")
        #expect(session.manager.tokenInfo?.scope == "read write")
        await session.stop()
    }

    @Test func aRefreshAnswerCarryingANarrowerScopeReplacesIt() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await LiveSession(server)
        // Signed in by the host with tokens and no scope: not known.
        try await session.manager.signIn(try await server.signIn())
        #expect(session.manager.tokenInfo?.scope == nil)
        try await server.grantScope("read")
        _ = try await session.manager.refreshNow()
        #expect(session.manager.tokenInfo?.scope == "read")
        #expect(session.store.session?.grantedScope == "read")
        await session.stop()
    }

    @Test func scopeMembersOutsideRFC6749AreIgnored() {
        #expect(TokenResponse.scope(in: "read") == "read")
        #expect(TokenResponse.scope(in: "read write:all https://x.example/a") == "read write:all https://x.example/a")
        #expect(TokenResponse.scope(in: "!#[]~") == "!#[]~")
        for bad in ["", " ", "read  write", " read", "read ", "a\"b", "a\\b", "read\twrite", "read\nwrite", "r\u{7F}",
                    "lecture-é", "a\u{0}b"] {
            #expect(TokenResponse.scope(in: bad) == nil, "\(bad.debugDescription)")
        }
        #expect(TokenResponse.scope(in: nil) == nil)
        let longest = String(repeating: "a", count: TokenResponse.maximumScopeLength)
        #expect(TokenResponse.scope(in: longest) == longest)
        #expect(TokenResponse.scope(in: longest + "a") == nil)
    }

    @Test func theTokenAnswersScopeIsReadIntoTheGrant() throws {
        func grant(_ json: String) throws -> TokenGrant {
            let answer = HTTPAnswer(status: 200, retryAfter: nil, body: Data(json.utf8), redactions: [])
            return try TokenResponse.grant(from: answer, defaultLifetime: .seconds(60)).get()
        }
        #expect(try grant(#"{"access_token":"a","token_type":"Bearer","scope":"read"}"#).scope == "read")
        #expect(try grant(#"{"access_token":"a","token_type":"Bearer"}"#).scope == nil)
        #expect(try grant(#"{"access_token":"a","token_type":"Bearer","scope":"a\"b"}"#).scope == nil)
        #expect(try grant(#"{"access_token":"a","token_type":"Bearer","scope":42}"#).scope == nil)
    }
}

extension OAuthServer {
    /// `/__resource/config grant_scope=`: every token issued from now on gets `scope`.
    func grantScope(_ scope: String) async throws {
        let response = try await call("POST", "__resource/config", form: ["grant_scope": scope])
        guard response.status == 200 else { throw ServerError("/__resource/config: HTTP \(response.status)") }
    }
}
