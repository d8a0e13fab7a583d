import Foundation
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import Testing

@_spi(Fuzzing) @testable import SessionOAuth

/// Issue 29, point 2: a token a server hands us is sent back in a header line; one with a CR
/// or LF in it would end that line and start headers (or a whole request) of the server's
/// choosing. Tokens outside RFC 6749's VSCHAR are refused where they are parsed, and the
/// HTTP client refuses any header line with a control character before it connects.
@Suite("Header injection through tokens", .serialized)
struct HeaderInjectionTests {
    static func answer(_ json: String) -> HTTPAnswer {
        HTTPAnswer(status: 200, retryAfter: nil, body: Data(json.utf8), redactions: [])
    }

    @Test(arguments: [
        #"{"access_token":"Zq9\r\nX-Injected: yes","token_type":"Bearer"}"#,
        #"{"access_token":"Zq9\nPOST /admin/delete HTTP/1.1","token_type":"Bearer"}"#,
        #"{"access_token":"Zq9\u00e9","token_type":"Bearer"}"#,
        #"{"access_token":"Zq9\u0000","token_type":"Bearer"}"#,
        #"{"access_token":"Zq9\u007f","token_type":"Bearer"}"#,
        #"{"access_token":"Zq9","refresh_token":"Zq9\r\nX-Injected: yes","token_type":"Bearer"}"#,
    ])
    func aTokenOutsideVSCHARIsRefusedWhereItIsParsed(_ json: String) {
        guard case .failure(let error) = TokenResponse.grant(from: Self.answer(json), defaultLifetime: .seconds(60)) else {
            Issue.record("accepted: \(json)")
            return
        }
        #expect(error.kind == .transient)
        #expect(error.description.contains("%x20-7E"))
        #expect(!error.description.contains("X-Injected") && !error.description.contains("Zq9"))
    }

    @Test func everyVisibleCharacterAndSpaceAreAToken() throws {
        let vschar = String((0x20...0x7E).map { Character(Unicode.Scalar(UInt8($0))) })
        let escaped = vschar.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
        let grant = try TokenResponse.grant(
            from: Self.answer(#"{"access_token":"\#(escaped)","refresh_token":"\#(escaped)"}"#),
            defaultLifetime: .seconds(60)).get()
        #expect(grant.accessToken.reveal() == vschar && grant.refreshToken?.reveal() == vschar)
    }

    /// A server whose refresh answer carries a token with CR LF: the refresh fails (the session
    /// keeps what it had). That the token could never reach a header line even if a path
    /// accepted it is the next test's (the HTTP client refuses the line before connecting).
    @Test func aRefreshAnswerWithAnInjectingTokenIsRefused() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let tokens = try await server.signIn()
        let loop = try EventLoop(name: "inject")
        defer { _ = try? loop.shutdown() }
        let authority = try OAuthAuthority(server.configuration(), loop: loop)
        try await server.fault("set:access_token=tok\r\nX-Injected: yes\r\n\r\nGET /api/resource HTTP/1.1")
        let result = await withCheckedContinuation { (continuation: CheckedContinuation<Result<TokenGrant, AuthorityError>, Never>) in
            try! loop.execute {
                authority.refresh(RefreshRequest(refreshToken: tokens.refreshToken!, memberID: "alice", reason: .proactive),
                                  completion: .standalone { continuation.resume(returning: $0) })
            }
        }
        guard case .failure(let error) = result else {
            Issue.record("the injecting token was accepted")
            return
        }
        #expect(error.kind == .transient && error.description.contains("%x20-7E"), "\(error)")
        #expect(!error.description.contains("X-Injected") && !error.description.contains("/api/resource"), "\(error)")
    }

    /// The HTTP client itself: a header line with CR, LF, NUL-less control characters or DEL
    /// (a C host's, or a future path's) is refused before any connection.
    @Test(arguments: ["Authorization: Bearer a\r\nX-Injected: yes", "X-A: b\nc", "X-A: \u{1B}[2J", "X-A: b\u{7F}", ": no name"])
    func aHeaderLineWithAControlCharacterIsRefusedBeforeAnyConnection(_ line: String) async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let loop = try EventLoop(name: "inject-http")
        defer { _ = try? loop.shutdown() }
        let client = LoopHTTPClient(loop: loop)
        let url = server.resourceURL
        let result = await withCheckedContinuation { (continuation: CheckedContinuation<Result<HTTPResponse, HTTPFailure>, Never>) in
            _ = client.send(HTTPRequest(
                method: .get, url: url, headers: [line], timeout: .seconds(10), maximumAnswerSize: 1 << 16,
                allowsLoopbackHTTP: true)) { continuation.resume(returning: $0) }
        }
        guard case .failure = result else {
            Issue.record("sent: \(line.debugDescription)")
            return
        }
        #expect(try await server.resourceStats().counts["requests"] == 0)
        withExtendedLifetime(client) {}
    }
}
