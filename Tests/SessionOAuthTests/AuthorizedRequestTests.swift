import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import Testing

@testable import SessionOAuth

/// The protected resource of the Authlib server (`/api/resource`), called the way a Swift app
/// would: `URLSession` (FoundationNetworking on Linux) inside `SessionManager.perform`, which
/// authorizes the request, and retries it once after a 401 with the authorization
/// `unauthorized` gives (compare-and-refresh).
enum ResourceClient {
    struct Answer: Sendable {
        let status: Int
        let body: Data
    }

    /// One GET of `url` with `authorization`'s fields, tagged with `requestID` (the server
    /// counts how often each request was sent).
    static func get(_ url: String, _ authorization: RequestAuthorization, requestID: String) async throws -> (Answer, String?) {
        var request = URLRequest(url: URL(string: url)!)
        request.httpMethod = authorization.method
        for field in authorization.fields {
            // The value leaves the session's memory here: URLRequest keeps a String.
            request.setValue(field.value.reveal(), forHTTPHeaderField: field.name)
        }
        request.setValue(requestID, forHTTPHeaderField: "X-Request-Id")
        let (data, response) = try await URLSession.shared.data(for: request)
        let http = response as! HTTPURLResponse
        return (Answer(status: http.statusCode, body: data), http.value(forHTTPHeaderField: "WWW-Authenticate"))
    }

    /// The resource through `session.perform`: the retry after a 401 is the library's.
    static func perform(_ session: SessionManager, _ url: String, requestID: String) async throws -> Answer {
        try await session.perform(method: "GET", url: url) { authorization in
            let (answer, challenge) = try await get(url, authorization, requestID: requestID)
            if answer.status == 401 || answer.status == 403 {
                return .refused(status: answer.status, wwwAuthenticate: challenge)
            }
            return .done(answer)
        }
    }
}

extension OAuthServer {
    /// /__resource/stats: the counters, and how often each access token was presented.
    func resourceStats() async throws -> (counts: [String: Int], presented: [String: Int]) {
        let object = try await call("GET", "__resource/stats").json() as! [String: Any]
        var counts: [String: Int] = [:]
        for (key, value) in object { if let number = value as? Int { counts[key] = number } }
        return (counts, object["presented"] as? [String: Int] ?? [:])
    }

    /// The resource refuses `accessToken` from now on; its refresh token still refreshes.
    func revokeAccess(_ accessToken: Secret) async throws {
        let response = try await call("POST", "__resource/revoke_access", form: ["token": accessToken.reveal()])
        guard response.status == 200 else { throw ServerError("/__resource/revoke_access: HTTP \(response.status)") }
    }

    var resourceURL: String { base.appendingPathComponent("api/resource").absoluteString }
}

@Suite("Authorized requests against the Authlib resource (issue 28)", .serialized)
struct AuthorizedRequestTests {
    @Test func anAuthorizationIsTheBearerFieldTheResourceAccepts() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await LiveSession(server)
        let tokens = try await server.signIn()
        try await session.manager.signIn(tokens)
        let authorization = try await session.manager.authorization(method: "GET", url: server.resourceURL)
        #expect(authorization.fields.map(\.name) == ["Authorization"])
        #expect(authorization.value(of: "authorization")?.reveal() == "Bearer " + tokens.accessToken.reveal())
        #expect(!"\(authorization)".contains(tokens.accessToken.reveal()))
        let (answer, _) = try await ResourceClient.get(server.resourceURL, authorization, requestID: "one")
        #expect(answer.status == 200)
        await session.stop()
    }

    /// The administrator revokes the access token; 50 requests are under way: each is refused
    /// once, the session refreshes once for all of them, each retries once and succeeds.
    @Test func aRevokedTokenUnderFiftyConcurrentRequestsCausesOneRefresh() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await LiveSession(server)
        let tokens = try await server.signIn()
        try await session.manager.signIn(tokens)
        try await server.revokeAccess(tokens.accessToken)
        let before = try await server.stats()["refresh_grants"] ?? 0
        let manager = session.manager
        let url = server.resourceURL
        let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
            for index in 0..<50 {
                group.addTask { try await ResourceClient.perform(manager, url, requestID: "r\(index)").status }
            }
            return try await group.reduce(into: [Int]()) { $0.append($1) }
        }
        #expect(statuses == Array(repeating: 200, count: 50))
        #expect(try await server.stats()["refresh_grants"]! - before == 1)
        let stats = try await server.resourceStats()
        // Every request was sent at most twice: once refused, once accepted.
        #expect(stats.counts["requests"]! <= 100 && stats.counts["ok"] == 50)
        #expect(stats.presented[tokens.accessToken.reveal()]! <= 50)
        await session.stop()
    }

    /// The whole grant is revoked (access and refresh tokens): each request fails once with the
    /// session's error, the session expires, and nothing loops.
    @Test func aDeadSessionFailsEachRequestOnceAndExpires() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await LiveSession(server)
        try await session.manager.signIn(try await server.signIn())
        try await server.revokeEverything(of: "alice")
        let before = try await server.stats()["token_requests"] ?? 0
        let manager = session.manager
        let url = server.resourceURL
        let errors = await withTaskGroup(of: SessionError?.self) { group in
            for index in 0..<10 {
                group.addTask {
                    do {
                        _ = try await ResourceClient.perform(manager, url, requestID: "d\(index)")
                        return nil
                    } catch let error as SessionError {
                        return error
                    } catch {
                        return SessionError(.invalidArgument, "not a session error: \(error)")
                    }
                }
            }
            return await group.reduce(into: [SessionError?]()) { $0.append($1) }
        }
        #expect(errors.allSatisfy { $0?.code == .sessionExpired }, "\(errors)")
        #expect(manager.state.value == .sessionExpired)
        let stats = try await server.resourceStats()
        #expect(stats.counts["requests"] == 10, "one request each, no retry")
        #expect(try await server.stats()["token_requests"]! - before == 1, "one refresh attempt")
        await session.stop()
    }

    @Test func insufficientScopeIsRefusedWithoutARefresh() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await LiveSession(server)
        try await session.manager.signIn(try await server.signIn())
        let authorization = try await session.manager.authorization(method: "POST", url: server.resourceURL)
        await #expect(throws: SessionError.self) {
            try await session.manager.unauthorized(
                authorization, status: 403, wwwAuthenticate: #"Bearer error="insufficient_scope", scope="admin""#)
        }
        await #expect(throws: SessionError.self) {
            try await session.manager.unauthorized(authorization, status: 500, wwwAuthenticate: nil)
        }
        #expect(try await server.stats()["refresh_grants"] == 0)
        await session.stop()
    }
}
