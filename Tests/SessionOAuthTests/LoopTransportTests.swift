import CLibUV
import Foundation
import LoopFlow
import SessionCore
import SessionFileStore
import SessionFlowTestSupport
import Testing

@_spi(Fuzzing) @testable import SessionOAuth

/// The HTTP client on the loop (libcurl multi driven by libuv), against the real server:
/// on a loop the library owns and on a host's borrowed loop, every answer on the loop
/// thread, requests cancelled for real, nothing left open at teardown.
@Suite("HTTP on the loop", .serialized)
struct LoopTransportTests {
    /// A host program's own uv loop, run on a thread of its own until nothing is left on it.
    final class HostLoop: @unchecked Sendable {
        let uvLoop = UnsafeMutablePointer<uv_loop_t>.allocate(capacity: 1)
        private let ready = DispatchSemaphore(value: 0)
        private let done = DispatchSemaphore(value: 0)
        private(set) var loop: EventLoop!
        private(set) var closeResult: Int32 = -1
        /// A host timer that keeps uv_run alive until the host closes it.
        private let keepAlive = UnsafeMutablePointer<uv_timer_t>.allocate(capacity: 1)

        init() {
            let thread = Thread { [self] in
                uv_loop_init(uvLoop)
                uv_timer_init(uvLoop, keepAlive)
                uv_timer_start(keepAlive, { _ in }, 1000, 1000)
                loop = try! EventLoop(borrowing: uvLoop)
                ready.signal()
                uv_run(uvLoop, UV_RUN_DEFAULT)
                closeResult = uv_loop_close(uvLoop)
                done.signal()
            }
            thread.start()
            ready.wait()
        }

        /// On the loop thread: the library is shut down, then the host's timer closed; waits
        /// until uv_run has returned.
        func finish() {
            try! loop.execute { [self] in
                _ = try? loop.shutdown()
                uv_close(UnsafeMutableRawPointer(keepAlive).assumingMemoryBound(to: uv_handle_t.self), nil)
            }
            done.wait()
        }
    }

    @Test func onABorrowedLoopEveryAnswerArrivesOnTheLoopThreadAndTeardownLeavesNothingOpen() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let tokens = try await server.signIn()
        let host = HostLoop()
        let loop = host.loop!
        var configuration = server.configuration()
        configuration.requestTimeout = .seconds(10)
        let authority = try OAuthAuthority(configuration, loop: loop)

        // A refresh: answered on the host's loop thread, with the rotated token.
        let answered = LockedBox<(onLoop: Bool, result: Result<TokenGrant, AuthorityError>)?>(nil)
        try loop.execute {
            authority.refresh(
                RefreshRequest(refreshToken: tokens.refreshToken!, memberID: nil, reason: .onDemand),
                completion: .standalone { result in answered.withLockedValue { $0 = (loop.inEventLoop, result) } })
        }
        #expect(await eventually(timeout: .seconds(10)) { answered.withLockedValue { $0 } != nil })
        let first = try #require(answered.withLockedValue { $0 })
        #expect(first.onLoop)
        let grant = try first.result.get()
        #expect(grant.refreshToken != nil && grant.refreshToken != tokens.refreshToken)

        // A request that hangs, still running when the host tears the library down: it
        // ends as cancelled (on the loop thread), and the host's loop closes cleanly.
        try await server.fault("hang")
        let hung = LockedBox<(onLoop: Bool, result: Result<TokenGrant, AuthorityError>)?>(nil)
        try loop.execute {
            authority.refresh(
                RefreshRequest(refreshToken: grant.refreshToken!, memberID: nil, reason: .onDemand),
                completion: .standalone { result in hung.withLockedValue { $0 = (loop.inEventLoop, result) } })
        }
        #expect(await eventually(timeout: .seconds(20)) { (try? await server.stats()["token_requests"]) ?? 0 >= 3 })
        #expect(hung.withLockedValue { $0 } == nil)
        host.finish()
        let ended = try #require(hung.withLockedValue { $0 })
        #expect(ended.onLoop)
        guard case .failure(let error) = ended.result else {
            Issue.record("a hanging request answered tokens")
            return
        }
        #expect(error.isCancellation)
        #expect(host.closeResult == 0, "uv_loop_close: \(host.closeResult) (a handle was left open)")
    }

    @Test func cancellingARequestClosesItsConnectionAndAnswersCancelled() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let tokens = try await server.signIn()
        let loop = try EventLoop(name: "cancel")
        defer { _ = try? loop.shutdown() }
        let authority = try OAuthAuthority(server.configuration(), loop: loop)
        try await server.fault("hang")
        let result = LockedBox<Result<TokenGrant, AuthorityError>?>(nil)
        let completion = AuthorityCompletion<TokenGrant>.standalone { answer in result.withLockedValue { $0 = answer } }
        try loop.execute {
            authority.refresh(
                RefreshRequest(refreshToken: tokens.refreshToken!, memberID: nil, reason: .onDemand), completion: completion)
        }
        #expect(await eventually(timeout: .seconds(20)) { completion.isCancellable })
        #expect(await eventually(timeout: .seconds(20)) { (try? await server.stats()["token_requests"]) ?? 0 >= 2 })
        try await loop.submit { #expect(completion.requestCancellation()) }
        #expect(await eventually(timeout: .seconds(20)) { result.withLockedValue { $0 } != nil })
        guard case .failure(let error)? = result.withLockedValue({ $0 }) else {
            Issue.record("a cancelled request answered tokens")
            return
        }
        #expect(error.isCancellation)
        // A second cancellation changes nothing; the completion is spent.
        try await loop.submit { #expect(!completion.requestCancellation()) }
        #expect(!completion.isCancellable)
    }

    @Test func anAuthorityLetGoOfEndsItsRequestsAndTheLoopClosesCleanly() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let tokens = try await server.signIn()
        let host = HostLoop()
        let loop = host.loop!
        try await server.fault("hang")
        let result = LockedBox<Result<TokenGrant, AuthorityError>?>(nil)
        do {
            let authority = try OAuthAuthority(server.configuration(), loop: loop)
            try loop.execute {
                authority.refresh(
                    RefreshRequest(refreshToken: tokens.refreshToken!, memberID: nil, reason: .onDemand),
                    completion: .standalone { answer in result.withLockedValue { $0 = answer } })
            }
            #expect(await eventually(timeout: .seconds(20)) { (try? await server.stats()["token_requests"]) ?? 0 >= 2 })
        }
        // The authority is gone (only the loop job above held it, and it has run): its client
        // is closed on the loop and the hanging request ends as cancelled.
        #expect(await eventually(timeout: .seconds(20)) { result.withLockedValue { $0 } != nil })
        guard case .failure(let error)? = result.withLockedValue({ $0 }) else {
            Issue.record("the request did not end as cancelled")
            return
        }
        #expect(error.isCancellation)
        host.finish()
        #expect(host.closeResult == 0)
    }

    @Test func anEndpointThatIsNotHttpsOrLoopbackIsRefusedBeforeAnyConnection() throws {
        let loop = try EventLoop(name: "rules")
        defer { _ = try? loop.shutdown() }
        func make(_ url: String) -> OAuthConfigurationError? {
            do {
                _ = try OAuthAuthority(OAuthConfiguration(tokenEndpoint: URL(string: url)!, clientID: "c"), loop: loop)
                return nil
            } catch {
                return error
            }
        }
        #expect(make("http://auth.example.com/token")?.reason.contains("plain http") == true)
        #expect(make("http://192.168.1.1/token")?.reason.contains("plain http") == true)
        #expect(make("http://localhost.evil.example/token")?.reason.contains("plain http") == true)
        #expect(make("ftp://auth.example.com/token") != nil)
        #expect(make("https://u:p@auth.example.com/token")?.reason.contains("user name or password") == true)
        #expect(make("https://auth.example.com/token") == nil)
        #expect(make("http://127.0.0.1:1/token") == nil)
        #expect(make("http://localhost:1/token") == nil)
        #expect(make("http://[::1]:1/token") == nil)
        var revocation = OAuthConfiguration(tokenEndpoint: URL(string: "https://a.example/token")!, clientID: "c")
        revocation.revocationEndpoint = URL(string: "http://a.example/revoke")
        #expect(throws: OAuthConfigurationError.self) { try OAuthAuthority(revocation, loop: loop) }
    }

    /// A python3 program run for a test, printing "PORT <n>" first (its stdin a pipe kept open,
    /// its stdout read here): the process, the port, and its output to read the rest of.
    static func pythonServer(_ script: String, arguments: [String] = []) async throws -> (Process, Int, FileHandle) {
        let server = Process()
        let output = Pipe()
        server.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        server.arguments = ["python3", "-c", script] + arguments
        server.standardOutput = output
        server.standardError = FileHandle.nullDevice
        server.standardInput = Pipe()
        try server.run()
        let reading = output.fileHandleForReading
        let first = await offThePool {
            var first = Data()
            while !first.contains(UInt8(ascii: "\n")) {
                let chunk = reading.availableData
                if chunk.isEmpty { break }
                first.append(chunk)
            }
            return first
        }
        guard let port = String(decoding: first, as: UTF8.self).split(separator: " ").last
            .flatMap({ Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) })
        else {
            kill(server.processIdentifier, SIGKILL)
            throw ServerError("the test server printed no port")
        }
        return (server, port, reading)
    }

    @Test func tlsIsAlwaysVerifiedASelfSignedServerGetsNoRequest() async throws {
        // A TLS server on loopback with a self-signed certificate (made here with openssl):
        // the handshake fails, nothing is sent, and the failure says why.
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tls-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let openssl = Process()
        openssl.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        openssl.arguments = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                             "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                             "-keyout", directory + "/key.pem", "-out", directory + "/cert.pem"]
        openssl.standardOutput = FileHandle.nullDevice
        openssl.standardError = FileHandle.nullDevice
        try openssl.run()
        // The child processes are waited for off the cooperative pool (`offThePool`).
        await offThePool { openssl.waitUntilExit() }
        #expect(openssl.terminationStatus == 0)
        let script = """
            import http.server, ssl, sys
            class Handler(http.server.BaseHTTPRequestHandler):
                def do_POST(self):
                    print("GOT POST", flush=True)
                    self.send_response(200); self.end_headers(); self.wfile.write(b'{"access_token":"x"}')
                def log_message(self, *args): pass
            server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(sys.argv[1], sys.argv[2])
            server.socket = context.wrap_socket(server.socket, server_side=True)
            print("PORT", server.server_address[1], flush=True)
            server.serve_forever()
            """
        let (server, port, reading) = try await Self.pythonServer(
            script, arguments: [directory + "/cert.pem", directory + "/key.pem"])
        defer { kill(server.processIdentifier, SIGKILL) }

        let loop = try EventLoop(name: "tls")
        defer { _ = try? loop.shutdown() }
        let configuration = OAuthConfiguration(tokenEndpoint: URL(string: "https://127.0.0.1:\(port)/token")!, clientID: "c")
        let authority = try OAuthAuthority(configuration, loop: loop)
        let result = LockedBox<Result<TokenGrant, AuthorityError>?>(nil)
        try loop.execute {
            authority.refresh(
                RefreshRequest(refreshToken: Secret("SENTINEL-TLS-REFRESH"), memberID: nil, reason: .onDemand),
                completion: .standalone { answer in result.withLockedValue { $0 = answer } })
        }
        #expect(await eventually(timeout: .seconds(10)) { result.withLockedValue { $0 } != nil })
        guard case .failure(let error)? = result.withLockedValue({ $0 }) else {
            Issue.record("a server with a self-signed certificate was trusted")
            return
        }
        #expect(error.kind == .transient)
        #expect(error.message.lowercased().contains("certificate"), "\(error.message)")
        kill(server.processIdentifier, SIGKILL)
        await offThePool { server.waitUntilExit() }
        let rest = await offThePool { reading.readDataToEndOfFile() }
        #expect(!String(decoding: rest, as: UTF8.self).contains("GOT POST"), "the request reached the server")
    }

    @Test func aProxysAnswerToConnectIsNotTheRefreshsAnswer() async throws {
        // An https proxy (libcurl's HTTPS_PROXY) answers CONNECT with "200 Connection
        // established", then drops the tunnel: the TLS handshake fails before the request is
        // sent. That 200 is the proxy's: the refresh failed, it was not "accepted by the server
        // and its answer lost" (which would retry at once, the same refresh token again).
        let script = """
            import socket
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen(8)
            print("PORT", listener.getsockname()[1], flush=True)
            while True:
                connection, _ = listener.accept()
                data = b""
                while b"\\r\\n\\r\\n" not in data:
                    chunk = connection.recv(4096)
                    if not chunk: break
                    data += chunk
                print(data.split(b"\\r\\n")[0].decode(errors="replace"), flush=True)
                connection.sendall(b"HTTP/1.1 200 Connection established\\r\\n\\r\\n")
                connection.close()
            """
        let (proxy, port, reading) = try await Self.pythonServer(script)
        defer { kill(proxy.processIdentifier, SIGKILL) }

        // A process of its own (the proxy is its environment's): a stored session whose access
        // token has expired, refreshed at an https endpoint only the proxy reaches.
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("proxy-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try FileCredentialStore(directory: directory).write(StoredSession(
            accessToken: Secret("SENTINEL-PROXY-ACCESS"), refreshToken: Secret("SENTINEL-PROXY-REFRESH"),
            accessTokenExpiresAt: SessionConfiguration.realtime() - .seconds(10), memberID: "alice"))
        let probe = Process()
        probe.executableURL = URL(fileURLWithPath: try sessionProbeExecutable())
        probe.arguments = [directory, "https://token.sessionflow.invalid/token", "c"]
        var environment = ProcessInfo.processInfo.environment.filter { !$0.key.lowercased().hasSuffix("_proxy") }
        environment["HTTPS_PROXY"] = "http://127.0.0.1:\(port)"
        probe.environment = environment
        probe.standardOutput = Pipe()
        probe.standardError = Pipe()
        try probe.run()
        let printed = await outputs(of: [probe])[0]
        kill(proxy.processIdentifier, SIGKILL)
        await offThePool { proxy.waitUntilExit() }
        let seen = String(decoding: await offThePool { reading.readDataToEndOfFile() }, as: UTF8.self)
        #expect(seen.contains("CONNECT token.sessionflow.invalid:443"), "the request did not go through the proxy: \(seen)")
        #expect(printed.contains("ERROR"), "\(printed)")
        #expect(!printed.contains("answer was lost") && !printed.contains("HTTP 200"), "\(printed)")
        #expect(!printed.contains("SENTINEL"))
    }
}
