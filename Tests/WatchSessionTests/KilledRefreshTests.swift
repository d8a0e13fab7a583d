import Foundation
import SessionCore
import SessionFileStore
import SessionFlowTestSupport
import Testing

/// A `watch-session token` process SIGKILLed while its refresh is in flight, and what the next
/// `token` gets (docs/watch-session.md, "A process killed during its refresh"). The killed
/// process held the store's refresh lease; the lease names its pid, so the next process takes
/// it over at once (the holder is gone), re-reads the store and refreshes with the stored
/// refresh token. Whether that token is still good is the server's doing:
/// - a server that rolls back a rotation whose client went away before the answer was written
///   (the fixture's `rotate-late`): good, the next `token` prints a new token;
/// - a server that rotates and writes into the dead socket (`delay`): the rotated refresh token
///   died with the process, the stored one was rotated away, so the next refresh is refused
///   (`invalid_grant`) and `token` says the session expired (exit 4, nothing on stdout).
@Suite("watch-session token killed mid-refresh", .serialized)
struct KilledRefreshTests {
    /// Starts `token` on an expired stored token with the token endpoint misbehaving as `fault`,
    /// waits until the server has the refresh request, SIGKILLs the process, and checks that it
    /// printed nothing and left its lease behind.
    func killMidRefresh(
        _ server: AuthServer, fault: String, directory: String
    ) async throws -> (access: String, refresh: String) {
        let (access, refresh) = try await server.passwordSignIn()
        try storeSignedIn(directory, server: server, access: access, refresh: refresh, expiresIn: .seconds(-10))
        let set = try await server.call("POST", "__fault", form: ["mode": fault, "count": "1"])
        #expect(set.status == 200)
        let victim = try Spawned(["token", "--store", directory])
        let pid = victim.process.processIdentifier
        let arrived = try await eventually { try await refreshRequests(server).count == 1 }
        #expect(arrived, "the refresh never reached the server")
        #expect(kill(pid, SIGKILL) == 0)
        let killed = await victim.finish()
        #expect(victim.process.terminationReason == .uncaughtSignal && killed.status == SIGKILL, "\(killed)")
        #expect(killed.stdout.isEmpty, "\(killed)")
        // It held the refresh lease when it died, and nothing released it.
        #expect(leaseHolders(directory).contains(pid), "no lease of \(pid) in the store: \(leaseHolders(directory))")
        #expect(storedAccessToken(directory) == access, "the store changed under a killed refresh")
        return (access, refresh)
    }

    /// The server takes the rotation back (the client was gone before the answer was written):
    /// the stored refresh token still works, so the next `token` refreshes with it at once and
    /// prints the new token. The server saw two refreshes, no reuse, no revoked family.
    @Test func afterAServerRolledTheRotationBackTheNextTokenRefreshes() async throws {
        let server = try await AuthServer(expiresIn: 3600, ["--strict-reuse"])
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (access, _) = try await killMidRefresh(server, fault: "rotate-late:60", directory: directory)
        let rolledBack = try await eventually { try await server.stats()["cancelled_before_answer"] == 1 }
        #expect(rolledBack, "the server did not see the killed client go")

        // The lease of the dead process is taken over at once: a hang guard well under the
        // lease's length (twice the refresh timeout), which a waiting process would run into.
        let nextProcess = try Spawned(["token", "--store", directory])
        let done = await eventually(timeout: .seconds(20)) { !nextProcess.process.isRunning }
        #expect(done, "the next token waited for the killed process's lease")
        if !done { kill(nextProcess.process.processIdentifier, SIGKILL) }
        let next = await nextProcess.finish()
        #expect(next.status == 0, "\(next)")
        let fresh = try #require(storedAccessToken(directory))
        #expect(next.stdout == fresh + "\n" && fresh != access, "\(next)")
        let stats = try await server.stats()
        #expect(stats["refresh_grants"] == 2, "\(stats)")
        #expect(stats["reuse_detected"] == 0 && stats["families_revoked"] == 0, "\(stats)")
        let resource = try await LoopbackHTTP.perform(
            port: server.port, method: "GET", path: "/api/resource", headers: [("Authorization", "Bearer " + fresh)])
        #expect(resource.status == 200, "the new token is not valid at the resource: \(resource.status)")
    }

    /// The server rotates and answers into the dead process's socket: the new refresh token is
    /// lost, the stored one is spent. The next `token` gets the lease, presents the stored token,
    /// is refused, and says the session expired: exit 4, nothing on stdout; `status` agrees.
    @Test func afterAServerRotatedIntoTheDeadSocketTheNextTokenSaysExpired() async throws {
        let server = try await AuthServer(expiresIn: 3600)
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // The server holds the answer until the test has seen the request and killed the
        // process (no clock to race: a loaded CI machine once took longer than the 5 s this
        // was), then rotates and writes into the closed socket.
        let (_, refresh) = try await killMidRefresh(server, fault: "hold", directory: directory)
        #expect(try await server.call("POST", "__release", form: [:]).status == 200)
        // The server has rotated and written its answer (to a closed socket) before we go on.
        let answered = try await eventually { try await refreshRequests(server).first?["status"] as? Int == 200 }
        #expect(answered, "the delayed refresh was not answered")

        let next = try await watchSession(["token", "--store", directory])
        #expect(next.status == 4, "\(next)")
        #expect(next.stdout.isEmpty, "\(next)")
        #expect(next.stderr.contains("expired"), "\(next)")
        let requests = try await refreshRequests(server)
        #expect(requests.count == 2, "\(requests.count) refreshes")
        #expect((requests.last?["form"] as? [String: String])?["refresh_token"] == refresh, "not the stored refresh token")
        #expect(requests.last?["status"] as? Int == 400)
        let status = try await watchSession(["status", "--json", "--store", directory])
        #expect(status.status == 4 && status.stdout.contains(#""state":"sessionExpired""#), "\(status)")
        #expect(clean(next.stdout + next.stderr + status.stdout + status.stderr, of: [refresh]))
    }
}

/// The refresh_token grants the server has recorded, oldest first.
func refreshRequests(_ server: AuthServer) async throws -> [[String: Any]] {
    try await server.requests().filter { ($0["form"] as? [String: String])?["grant_type"] == "refresh_token" }
}

/// The pids the store's lease records name (`sessionflow-lease 1 pid=N ...`, RefreshLease.swift).
func leaseHolders(_ directory: String) -> [Int32] {
    let names = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
    return names.flatMap { name -> [Int32] in
        guard let data = FileManager.default.contents(atPath: directory + "/" + name) else { return [] }
        return String(decoding: data, as: UTF8.self).matches(of: #/sessionflow-lease \d+ pid=(\d+) /#).compactMap {
            Int32($0.output.1)
        }
    }
}
