import Foundation
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import Testing

@_spi(Fuzzing) @testable import SessionOAuth

/// What the server cannot make the client do (issue 13): follow a redirect, hold an answer of
/// any size in memory, decompress, or put a secret into a message.
@Suite("Transport faults: what a server cannot make the client do", .serialized)
struct TransportFaultTests {
    @Test(arguments: [307, 308, 302, 301, 303])
    func aRedirectIsAConfigurationErrorNothingIsSavedAndNothingReachesTheTarget(_ status: Int) async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await LiveSession(server, introspection: true)
        let tokens = try await server.signIn()
        try await session.manager.signIn(tokens)

        try await server.fault("redirect:\(status)")
        let error = await #expect(throws: SessionError.self) { try await session.manager.refreshNow() }
        #expect(error?.code == .configuration)
        #expect(error?.message.contains("HTTP \(status)") == true, "\(error?.message ?? "")")
        #expect(error?.message.contains("redirects are not followed") == true)
        // Nothing saved: the session keeps the tokens it had.
        #expect(session.store.session?.accessToken == tokens.accessToken)
        #expect(session.store.session?.refreshToken == tokens.refreshToken)
        #expect(session.manager.state.value == .loggedIn)

        // Introspection and revocation are not redirected either.
        try await server.fault("redirect:\(status)", endpoint: "introspect")
        try session.manager.resume()
        #expect(await eventually(timeout: .seconds(20)) {
            (try? await server.requests())?.contains { $0.path == "/oauth/introspect" } == true
        })
        try await server.fault("redirect:\(status)", endpoint: "revoke")
        try await session.manager.logout()
        #expect(await eventually(timeout: .seconds(20)) {
            (try? await server.requests())?.contains { $0.path == "/oauth/revoke" } == true
        })
        try await Task.sleep(for: .milliseconds(200))
        #expect(try await server.redirectHits().isEmpty, "a request followed the redirect")
        #expect(!session.recordedEvents.contains(.validated))
        await session.stop()
    }

    /// A memory figure of this process from /proc/self/status (`VmHWM`: the peak resident size
    /// since the last reset; `VmRSS`: now), in bytes.
    static func memory(_ field: String) -> Int {
        guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
            let line = status.split(separator: "\n").first(where: { $0.hasPrefix(field + ":") }),
            let kilobytes = Int(line.split(separator: " ", omittingEmptySubsequences: true)[1])
        else { return -1 }
        return kilobytes * 1024
    }

    /// Resets VmHWM to the current RSS (Linux ≥ 4.0: `echo 5 > /proc/self/clear_refs`).
    static func resetPeakRSS() -> Bool {
        let fd = open("/proc/self/clear_refs", O_WRONLY)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        return write(fd, "5", 1) == 1
    }

    @Test(arguments: ["stream-huge:600", "stream-huge-chunked:600", "gzip-bomb"])
    func aHugeOrCompressedAnswerIsCutOffWithMemoryBounded(_ mode: String) async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        // No retry while the test looks (its backoff's 1 s is short on a loaded machine): the
        // store must still hold the tokens the refused answer did not replace.
        let session = try await LiveSession(server, configure: {
            $0.policy.initialBackoff = .seconds(600)
            $0.policy.maximumBackoff = .seconds(600)
        })
        let tokens = try await server.signIn()
        try await session.manager.signIn(tokens)
        try await server.fault(mode, count: 1)

        #expect(Self.resetPeakRSS(), "cannot reset the peak RSS")
        let before = Self.memory("VmRSS")
        let error = await #expect(throws: SessionError.self) { try await session.manager.refreshNow() }
        let growth = Self.memory("VmHWM") - before
        print("\(mode): peak RSS growth during the refresh \(growth / 1024) KiB")
        #expect(growth < 16 << 20, "peak RSS grew by \(growth) bytes")
        #expect(error?.code == .transient)
        if mode == "gzip-bomb" {
            // Nothing is decompressed: the wire bytes are under the limit, and not JSON.
            #expect(try await server.lastRequest()?.header("Accept-Encoding") == "identity")
            #expect(error?.message.contains("not JSON") == true, "\(error?.message ?? "")")
        } else {
            #expect(error?.message.contains("larger than 1048576 bytes") == true, "\(error?.message ?? "")")
            // The transfer was stopped, not read to the end.
            #expect(await eventually(timeout: .seconds(20)) { (try? await server.stats()["streams_aborted"]) == 1 })
            let sent = try await server.stats()["stream_bytes_sent"] ?? 0
            #expect(sent < 64 << 20, "the server sent \(sent) bytes before the client stopped")
        }
        #expect(session.store.session?.refreshToken == tokens.refreshToken)
        #expect(session.manager.state.value == .loggedIn)
        await session.stop()
    }

    @Test(arguments: ["echo", "echo-200"])
    func aServerEchoingSecretsInEveryFormGetsNoneIntoErrorsOrLogs(_ mode: String) async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let session = try await LiveSession(server, oauth: { oauth in
            oauth.clientSecret = Secret("SENTINEL-CLIENT-SECRET-%/+ \"é")
        })
        let tokens = try await server.signIn()
        try await session.manager.signIn(tokens)
        try await server.fault(mode, count: 1)
        let error = await #expect(throws: SessionError.self) { try await session.manager.refreshNow() }
        let texts = [error.map { "\($0)" } ?? "", error?.message ?? "", session.output]
            + session.recordedEvents.map { "\($0)" }
        let refresh = tokens.refreshToken!.reveal()
        let clientSecret = "SENTINEL-CLIENT-SECRET-%/+ \"é"
        for secret in [refresh, clientSecret] {
            let forms = [
                secret,
                secret.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!,
                secret.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!.lowercased(),
                String(String(data: try JSONEncoder().encode(secret), encoding: .utf8)!.dropFirst().dropLast()),
            ]
            for form in forms where form.count >= 8 {
                for text in texts {
                    #expect(!text.contains(form), "\(mode): a form of a secret reached a message: \(form)")
                }
            }
        }
        // No terminal control sequence either (the echo carries ESC ] 0; ... BEL and ESC [2J).
        for text in texts.prefix(2) {
            #expect(!text.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7f }, "\(text)")
        }
        #expect(session.manager.state.value == .loggedIn)
        await session.stop()
    }
}
