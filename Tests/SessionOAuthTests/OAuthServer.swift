import Foundation
import LoopFlow
import SessionCore
import SessionOAuth

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The Authlib server of Tests/Fixtures/oauth_server.py, started for a test and stopped
/// after it, on a loopback port of its own.
final class OAuthServer: @unchecked Sendable {
    let process = Process()
    /// The server's stdin: closing it ends the server, even if this process dies first.
    let lifeline = Pipe()
    let port: Int
    var base: URL { URL(string: "http://127.0.0.1:\(port)")! }

    static var fixture: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Fixtures/oauth_server.py").path
    }

    init(expiresIn: Int) throws {
        let output = Pipe()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", Self.fixture, "--expires-in", "\(expiresIn)"]
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        process.standardInput = lifeline
        try process.run()
        var line = Data()
        while !line.contains(UInt8(ascii: "\n")) {
            let chunk = output.fileHandleForReading.availableData
            if chunk.isEmpty { throw ServerError("the OAuth server exited before listening (is authlib installed?)") }
            line.append(chunk)
        }
        let text = String(decoding: line, as: UTF8.self)
        guard let port = text.split(separator: " ").last.flatMap({ Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) }) else {
            throw ServerError("unexpected first line: \(text)")
        }
        self.port = port
    }

    deinit {
        // Closing its stdin ends the server; SIGKILL in case it is stuck. Foundation reaps
        // the child (waitUntilExit can hang here, on a run loop this thread does not run).
        try? lifeline.fileHandleForWriting.close()
        kill(process.processIdentifier, SIGKILL)
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
        return SessionTokens(
            accessToken: Secret(object["access_token"] as! String),
            refreshToken: Secret(object["refresh_token"] as! String),
            expiresIn: .seconds(object["expires_in"] as! Int), memberID: user)
    }

    func stats() async throws -> [String: Int] {
        let (data, _) = try await URLSession.shared.data(from: base.appendingPathComponent("__stats"))
        return try JSONSerialization.jsonObject(with: data) as! [String: Int]
    }

    /// The protected resource's status code for `token`.
    func me(_ token: Secret) async throws -> Int {
        var request = URLRequest(url: base.appendingPathComponent("api/me"))
        request.setValue("Bearer \(token.reveal())", forHTTPHeaderField: "Authorization")
        let (_, response) = try await URLSession.shared.data(for: request)
        return (response as! HTTPURLResponse).statusCode
    }

    /// The next `count` token requests misbehave as `mode` says (see oauth_server.py).
    func fault(_ mode: String, count: Int = 1, retryAfter: Int? = nil) async throws {
        var form = ["mode": mode, "count": "\(count)"]
        if let retryAfter { form["retry_after"] = "\(retryAfter)" }
        _ = try await post("__fault", form)
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

    private func post(_ path: String, _ form: [String: String]) async throws -> [String: Any] {
        var request = URLRequest(url: base.appendingPathComponent(path))
        request.httpMethod = "POST"
        request.setValue("application/x-www-form-urlencoded", forHTTPHeaderField: "Content-Type")
        request.httpBody = form.map { "\($0.key)=\($0.value.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)" }
            .joined(separator: "&").data(using: .utf8)
        let (data, _) = try await URLSession.shared.data(for: request)
        return (try JSONSerialization.jsonObject(with: data) as? [String: Any]) ?? [:]
    }
}

struct ServerError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
