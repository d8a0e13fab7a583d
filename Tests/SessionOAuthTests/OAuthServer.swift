import Foundation
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import SessionOAuth

/// The Authlib server of Tests/Fixtures/oauth_server.py, started for a test and stopped
/// after it, on a loopback port of its own. The test's own calls to it (sign-in, hooks) go
/// through `LoopbackHTTP` (POSIX sockets), never through the transport under test.
final class OAuthServer: @unchecked Sendable {
    let server: AuthlibProcess
    var port: Int { server.port }
    var base: URL { URL(string: "http://127.0.0.1:\(port)")! }

    /// `strictReuse`: every rotated refresh token presented again revokes its grant (the
    /// server's --strict-reuse; without it only rotate-late rotations are strict).
    init(expiresIn: Int, strictReuse: Bool = false) async throws {
        server = try await AuthlibProcess(arguments: ["--expires-in", "\(expiresIn)"] + (strictReuse ? ["--strict-reuse"] : []))
    }

    func configuration(introspection: Bool = false) -> OAuthConfiguration {
        var configuration = OAuthConfiguration(
            tokenEndpoint: base.appendingPathComponent("oauth/token"), clientID: "sessionflow-public")
        configuration.revocationEndpoint = base.appendingPathComponent("oauth/revoke")
        if introspection { configuration.introspectionEndpoint = base.appendingPathComponent("oauth/introspect") }
        return configuration
    }

    /// Signs `user` in with the password grant, as an app's login screen would.
    func signIn(_ user: String = "alice") async throws -> SessionTokens {
        let object = try await post("oauth/token", [
            "grant_type": "password", "username": user, "password": "correct horse", "client_id": "sessionflow-public",
        ])
        guard let access = object["access_token"] as? String, let refresh = object["refresh_token"] as? String,
              let expiresIn = object["expires_in"] as? Int
        else { throw ServerError("the password grant did not answer tokens: \(object.keys.sorted())") }
        return SessionTokens(
            accessToken: Secret(access), refreshToken: Secret(refresh), expiresIn: .seconds(expiresIn), memberID: user)
    }

    /// The server's counters (see oauth_server.py's docstring; all integers).
    func stats() async throws -> [String: Int] {
        let response = try await call("GET", "__stats")
        guard let stats = try response.json() as? [String: Int] else {
            throw ServerError("/__stats is not a map of integers: \(response.text.prefix(200))")
        }
        return stats
    }

    /// The protected resource's status code for `token`.
    func me(_ token: Secret) async throws -> Int {
        try await call("GET", "api/me", headers: [("Authorization", "Bearer \(token.reveal())")]).status
    }

    /// The next `count` requests to `endpoint` ("token", "revoke" or "introspect") misbehave as
    /// `mode` says (see oauth_server.py).
    func fault(_ mode: String, count: Int = 1, retryAfter: Int? = nil, endpoint: String = "token") async throws {
        var form = ["mode": mode, "count": "\(count)", "endpoint": endpoint]
        if let retryAfter { form["retry_after"] = "\(retryAfter)" }
        let response = try await call("POST", "__fault", form: form)
        guard response.status == 200 else { throw ServerError("/__fault \(mode): HTTP \(response.status) \(response.text)") }
    }

    func revokeEverything(of user: String) async throws {
        _ = try await post("__revoke_user", ["user": user])
    }

    /// A raw refresh, to see what the server says of a token.
    func refreshError(_ refreshToken: Secret) async throws -> String? {
        let object = try await post("oauth/token", [
            "grant_type": "refresh_token", "refresh_token": refreshToken.reveal(), "client_id": "sessionflow-public",
        ])
        return object["error"] as? String
    }

    /// A request the server recorded: to /oauth/* (`lastRequest`, `requests`) or to the
    /// redirect target (`redirectHits`; `form` is empty there, `body` holds what was sent).
    struct RecordedRequest: Sendable {
        let method: String
        let path: String
        /// Names as the client sent them; `header(_:)` looks them up case-insensitively.
        let headers: [String: String]
        let form: [String: String]
        let body: String?
        /// The fault mode this request got, if any.
        let fault: String?
        /// When the server received it (seconds since the epoch; 0 if not recorded).
        let time: Double
        /// The status the server answered with; nil while it has not answered yet.
        let status: Int?

        func header(_ name: String) -> String? {
            headers.first { $0.key.lowercased() == name.lowercased() }?.value
        }

        init(_ object: [String: Any]) {
            method = object["method"] as? String ?? ""
            path = object["path"] as? String ?? ""
            headers = object["headers"] as? [String: String] ?? [:]
            form = object["form"] as? [String: String] ?? [:]
            body = object["body"] as? String
            fault = object["fault"] as? String
            time = object["time"] as? Double ?? 0
            status = object["status"] as? Int
        }
    }

    /// The last request to /oauth/*, or nil before any.
    func lastRequest() async throws -> RecordedRequest? {
        try (await call("GET", "__last_request").json() as? [String: Any]).map(RecordedRequest.init)
    }

    /// The last 200 requests to /oauth/*, oldest first.
    func requests() async throws -> [RecordedRequest] {
        ((try await call("GET", "__requests").json() as? [[String: Any]]) ?? []).map(RecordedRequest.init)
    }

    /// What reached the second listener `redirect:<code>` faults point to.
    func redirectHits() async throws -> [RecordedRequest] {
        let object = try await call("GET", "__redirect_hits").json() as? [String: Any]
        return ((object?["hits"] as? [[String: Any]]) ?? []).map(RecordedRequest.init)
    }

    /// A form POST to the server; its JSON object (empty if it answered none).
    func post(_ path: String, _ form: [String: String]) async throws -> [String: Any] {
        let response = try await call("POST", path, form: form)
        return ((try? response.json()) as? [String: Any]) ?? [:]
    }

    /// One request to the server (a form body when `form` is given).
    func call(
        _ method: String, _ path: String, form: [String: String]? = nil, headers: [(String, String)] = []
    ) async throws -> LoopbackHTTP.Response {
        var headers = headers
        var body: [UInt8] = []
        if let form {
            headers.append(("Content-Type", "application/x-www-form-urlencoded"))
            body = LoopbackHTTP.form(form.sorted { $0.key < $1.key }.map { ($0.key, $0.value) })
        }
        return try await LoopbackHTTP.perform(port: port, method: method, path: "/" + path, headers: headers, body: body)
    }
}

struct ServerError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
