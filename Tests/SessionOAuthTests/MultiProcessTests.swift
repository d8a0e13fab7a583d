import Foundation
import LoopFlow
import SessionCore
import SessionFileStore
import SessionFlowTestSupport
import Testing

/// Runs a probe process; returns what it printed.
/// `refreshTimeout`: the probe's refresh timeout, with transient failures retried (see the probe).
func runProbe(store: String, server: OAuthServer, refreshTimeout: Duration? = nil) throws -> Process {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: try sessionProbeExecutable())
    process.arguments = [store, server.base.appendingPathComponent("oauth/token").absoluteString, "sessionflow-public"]
        + (refreshTimeout.map { ["\($0.components.seconds * 1000 + $0.components.attoseconds / 1_000_000_000_000_000)"] } ?? [])
    process.standardOutput = Pipe()
    process.standardError = Pipe()
    try process.run()
    return process
}

/// Everything each process printed, once all of them have exited; the blocking reads and
/// waits run off the cooperative pool.
func outputs(of processes: [Process]) async -> [String] {
    struct Processes: @unchecked Sendable { let all: [Process] }
    let boxed = Processes(all: processes)
    return await offThePool {
        let texts = boxed.all.map(output(of:))
        boxed.all.forEach { $0.waitUntilExit() }
        return texts
    }
}

func output(of process: Process) -> String {
    let data = (process.standardOutput as! Pipe).fileHandleForReading.readDataToEndOfFile()
    let errors = (process.standardError as! Pipe).fileHandleForReading.readDataToEndOfFile()
    return String(decoding: data + errors, as: UTF8.self)
}

@Suite("Two processes, one store", .serialized)
struct MultiProcessTests {
    @Test func twoProcessesNeedingATokenMakeOneRefreshAndBothEndWithTheRotatedToken() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("sessionflow-mp-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // A stored session whose access token has expired: each process refreshes at start
        let tokens = try await server.signIn()
        try FileCredentialStore(directory: directory).write(StoredSession(
            accessToken: tokens.accessToken, refreshToken: tokens.refreshToken,
            accessTokenExpiresAt: SessionConfiguration.realtime() - .seconds(10), memberID: "alice"))

        let first = try runProbe(store: directory, server: server)
        let second = try runProbe(store: directory, server: server)
        let outputs = await outputs(of: [first, second])

        // Exactly one refresh reached the server...
        #expect(try await server.stats()["refresh_grants"] == 1)
        // ...and both processes ended with the same, rotated token
        let digests = outputs.compactMap { text in
            text.split(separator: "\n").first { $0.hasPrefix("TOKEN-SHA256 ") }.map(String.init)
        }
        #expect(digests.count == 2, "\(outputs)")
        #expect(Set(digests).count == 1)
        #expect(outputs.allSatisfy { $0.contains("STATE loggedIn") })
        guard case .present(let stored) = FileCredentialStore(directory: directory).read() else {
            Issue.record("the store lost the session")
            return
        }
        #expect(stored.refreshToken != tokens.refreshToken)
        // No token in what either process printed
        for text in outputs {
            #expect(!text.contains(tokens.accessToken.reveal()) && !text.contains(tokens.refreshToken!.reveal()))
            #expect(!text.contains(stored.refreshToken!.reveal()))
        }
    }
}

@Suite("watch-session against the Authlib server", .serialized)
struct WatchSessionOAuthTests {
    @Test func aRefreshTokenFromStdinDrivesARealServerAndIsNeverPrinted() async throws {
        let server = try await OAuthServer(expiresIn: 3600)
        let tokens = try await server.signIn()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("ws-oauth-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let me = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        let process = Process()
        process.executableURL = URL(fileURLWithPath: me).deletingLastPathComponent().appendingPathComponent("watch-session")
        process.arguments = [
            "--json", "--store", directory, "--token-endpoint", server.base.appendingPathComponent("oauth/token").absoluteString,
            "--client-id", "sessionflow-public", "--refresh-token-file", "-",
        ]
        let input = Pipe()
        let output = Pipe()
        process.standardInput = input
        process.standardOutput = output
        let collected = LockedText()
        collected.collect(output)
        try process.run()
        input.fileHandleForWriting.write(Data((tokens.refreshToken!.reveal() + "\n").utf8))
        try input.fileHandleForWriting.close()
        #expect(try await eventually(timeout: .seconds(10), every: .milliseconds(20)) { try await server.stats()["refresh_grants"] == 1 })
        // Signed in, and the session with its rotated refresh token stored: what is checked
        // below, waited for (not a pause that assumed 300 ms were enough).
        let store = FileCredentialStore(directory: directory)
        #expect(await eventually(timeout: .seconds(20), every: .milliseconds(20)) {
            guard case .present(let stored) = store.read() else { return false }
            return stored.refreshToken != tokens.refreshToken && collected.text.contains("\"state\":\"loggedIn\"")
        })
        kill(process.processIdentifier, SIGINT)
        await offThePool { process.waitUntilExit() }
        #expect(await eventually(timeout: .seconds(20), every: .milliseconds(20)) { collected.ended })
        let text = collected.text
        #expect(process.terminationStatus == 130)
        #expect(text.contains("\"event\":\"signedIn\""))
        #expect(text.contains("\"state\":\"loggedIn\""))
        #expect(!text.contains(tokens.refreshToken!.reveal()) && !text.contains(tokens.accessToken.reveal()))
        // the session it made is in the store, with the rotated refresh token
        guard case .present(let stored) = FileCredentialStore(directory: directory).read() else {
            Issue.record("nothing stored")
            return
        }
        #expect(stored.refreshToken != tokens.refreshToken)
        #expect(!text.contains(stored.refreshToken!.reveal()))
    }
}
