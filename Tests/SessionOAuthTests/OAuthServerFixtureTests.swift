import Foundation
import SessionCore
import SessionFlowTestSupport
import Testing

/// The test server's hooks and the tests' own HTTP client (`LoopbackHTTP`), seen from Swift:
/// what the transport tests of issue 13 build on. (Every fault mode is also checked with curl by
/// Tests/Fixtures/verify_oauth_server.sh.)
@Suite("The OAuth test server and the tests' own HTTP client", .serialized)
struct OAuthServerFixtureTests {
    @Test func theHooksRecordWhatWasSent() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let tokens = try await server.signIn()
        let last = try #require(try await server.lastRequest())
        #expect(last.method == "POST" && last.path == "/oauth/token")
        #expect(last.form["grant_type"] == "password" && last.form["password"] == "correct horse")
        #expect(last.header("content-type") == "application/x-www-form-urlencoded")
        #expect(last.header("Accept-Encoding") == nil)
        #expect(last.fault == nil)
        #expect(try await server.me(tokens.accessToken) == 200)
        #expect(try await server.me(Secret("nope")) == 401)
        let stats = try await server.stats()
        #expect(stats["password_grants"] == 1 && stats["reuse_detected"] == 0)
        #expect(try await server.requests().count == 1)  // /api/me and the hooks are not recorded
    }

    @Test func theClientReadsLengthDelimitedChunkedAndRedirectAnswers() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        try await server.fault("stream-huge:1")
        let whole = try await server.call("POST", "oauth/token", form: ["grant_type": "x"])
        #expect(whole.status == 200 && whole.header("content-length") == "1048576" && whole.body.count == 1 << 20)
        try await server.fault("stream-huge-chunked:0.25")
        let chunked = try await server.call("POST", "oauth/token", form: ["grant_type": "x"])
        #expect(chunked.header("transfer-encoding") == "chunked" && chunked.body.count == 1 << 18)
        #expect((try chunked.json() as? [String: Any])?["access_token"] as? String == "tok-stream")
        #expect(try await server.stats()["streams_completed"] == 2)

        try await server.fault("redirect:307", endpoint: "revoke")
        let redirect = try await server.call("POST", "oauth/revoke", form: ["token": "t", "client_id": "sessionflow-public"])
        #expect(redirect.status == 307)
        let location = try #require(redirect.header("location"))
        #expect(location.hasPrefix("http://127.0.0.1:") && location.hasSuffix("/oauth/revoke"))
        #expect(!location.hasPrefix("http://127.0.0.1:\(server.port)/"))
        #expect(try await server.redirectHits().isEmpty)  // not followed
        #expect(try await server.lastRequest()?.fault == "redirect:307")
    }

    /// rotate-late: a second request with the refresh token in flight is reuse, and the whole
    /// grant dies (what the transport must never cause).
    @Test func overlappingRefreshesWithOneTokenRevokeTheGrant() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let tokens = try await server.signIn()
        let refreshToken = try #require(tokens.refreshToken)
        try await server.fault("rotate-late:1")
        async let first = server.post("oauth/token", [
            "grant_type": "refresh_token", "refresh_token": refreshToken.reveal(), "client_id": "sessionflow-public",
        ])
        // The first request is held by the server (not merely sent: on a loaded machine it may
        // arrive later than a fixed sleep).
        #expect(await eventually(timeout: .seconds(10), every: .milliseconds(10)) {
            ((try? await server.stats())?["rotate_late_requests"] ?? 0) >= 1
        })
        #expect(try await server.refreshError(refreshToken) == "invalid_grant")
        let delivered = try await first
        let rotated = try #require(delivered["refresh_token"] as? String)
        #expect(try await server.refreshError(Secret(rotated)) == "invalid_grant")
        #expect(try await server.me(tokens.accessToken) == 401)
        let stats = try await server.stats()
        #expect(stats["reuse_detected"] == 1 && stats["families_revoked"] == 1)
    }

    /// rotate-late: a request the client abandons before the answer is rolled back, so the same
    /// refresh token works at once.
    @Test func aCancelledRotationIsRolledBack() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let tokens = try await server.signIn()
        let refreshToken = try #require(tokens.refreshToken)
        try await server.fault("rotate-late:5")
        let form = LoopbackHTTP.form([
            ("grant_type", "refresh_token"), ("refresh_token", refreshToken.reveal()), ("client_id", "sessionflow-public"),
        ])
        await #expect(throws: LoopbackHTTP.Failure.self) {
            // Gives up (closes the connection) after 1 s, as a client at its deadline (long
            // enough for a loaded server to have taken the request in).
            _ = try await LoopbackHTTP.perform(
                port: server.port, method: "POST", path: "/oauth/token",
                headers: [("Content-Type", "application/x-www-form-urlencoded")], body: form, timeout: .seconds(1))
        }
        #expect(try await server.refreshError(refreshToken) == nil)
        let stats = try await server.stats()
        #expect(stats["cancelled_before_answer"] == 1 && stats["reuse_detected"] == 0 && stats["rotations_committed"] == 0)
    }
}
