import Foundation
import SessionCore
import SessionFileStore
import SessionFlowTestSupport
import Testing

/// A watch-session process started now and finished later: many run at once (their output is
/// a line or two, which a pipe holds until it is read).
final class Spawned: @unchecked Sendable {
    let process = Process()
    private let out = Pipe()
    private let err = Pipe()

    init(_ arguments: [String], input: String? = nil, environment extra: [String: String] = [:]) throws {
        process.executableURL = URL(fileURLWithPath: binary("watch-session"))
        process.arguments = arguments
        var environment = ProcessInfo.processInfo.environment
        environment["NO_COLOR"] = "1"
        environment.merge(extra) { $1 }
        process.environment = environment
        process.standardOutput = out
        process.standardError = err
        let stdin = Pipe()
        process.standardInput = stdin
        try process.run()
        if let input { stdin.fileHandleForWriting.write(Data(input.utf8)) }
        try stdin.fileHandleForWriting.close()
    }

    /// Its status and output once it exits, read and waited for on a thread of their own
    /// (`offThePool`): a test blocking a thread of the cooperative pool (two here) holds up
    /// every other test's tasks — under ThreadSanitizer for long enough to starve them.
    func finish() async -> (status: Int32, stdout: String, stderr: String) {
        await offThePool { self.finishBlocking() }
    }

    private func finishBlocking() -> (status: Int32, stdout: String, stderr: String) {
        // A hang guard: a command that should have ended but runs on (a watch that should have
        // been refused) is killed — its status is then SIGKILL's, and the test fails instead of
        // hanging the suite.
        let pid = process.processIdentifier
        let guardTimer = DispatchSource.makeTimerSource(queue: .global())
        guardTimer.schedule(deadline: .now() + .seconds(180))
        guardTimer.setEventHandler { kill(pid, SIGKILL) }
        guardTimer.resume()
        defer { guardTimer.cancel() }
        let stdout = out.fileHandleForReading.readDataToEndOfFile()
        let stderr = err.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: stdout, as: UTF8.self), String(decoding: stderr, as: UTF8.self))
    }
}

/// A store holding `tokens` for alice, with the profile of `server` (as `login` leaves it).
func storeSignedIn(
    _ directory: String, server: AuthServer, access: String, refresh: String, expiresIn: Duration = .seconds(3600),
    profile: Bool = true
) throws {
    try FileCredentialStore(directory: directory).write(StoredSession(
        accessToken: Secret(access), refreshToken: Secret(refresh),
        accessTokenExpiresAt: SessionConfiguration.realtime() + expiresIn, memberID: "alice",
        profile: profile ? SessionProfile(
            issuer: server.issuer, clientID: "sessionflow-public", requestedScope: "read",
            tokenEndpoint: server.issuer + "/oauth/token", revocationEndpoint: server.issuer + "/oauth/revoke") : nil))
}

func storedAccessToken(_ directory: String) -> String? {
    guard case .present(let session) = FileCredentialStore(directory: directory).read() else { return nil }
    return session.accessToken?.reveal()
}

@Suite("watch-session status, token, exec, credential", .serialized)
struct SessionCommandTests {
    /// The whole way in a pipe: login ends (exit 0) once the code is approved, saying who signed
    /// in; status shows the profile it stored; a new token process prints the stored token
    /// without a request; a second login says "already signed in" and starts no flow.
    @Test func loginInAPipeFinishesStatusShowsTheProfileAndTokenSendsNothing() async throws {
        let server = try await AuthServer()
        try await server.device(["interval": "1", "expires_in": "120"])
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let login = ["login", "--device", "--issuer", server.issuer, "--client-id", "sessionflow-public", "--store", directory,
                     "--scope", "read"]
        let cli = try Running(login + ["--json"], terminal: false)
        #expect(await cli.wait(for: "sign_in_prompt"), "\(cli.screen)")
        let prompt = try #require(try objects(cli.stdout.text).first { $0["event"] as? String == "sign_in_prompt" })
        try await server.decide(try #require(prompt["user_code"] as? String), approve: true)
        #expect(await cli.exit() == 0, "\(cli.screen)")
        let succeeded = try objects(cli.stdout.text).first { $0["event"] as? String == "sign_in_succeeded" }
        #expect(succeeded?["member_id"] as? String == "alice", "\(cli.screen)")

        let status = try await watchSession(["status", "--json", "--store", directory])
        #expect(status.status == 0, "\(status)")
        let document = try #require(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])
        #expect(document["version"] as? Int == 1)
        #expect(document["state"] as? String == "loggedIn")
        let account = try #require((document["accounts"] as? [[String: Any]])?.first)
        #expect(account["issuer"] as? String == server.issuer, "\(document)")
        #expect(account["client_id"] as? String == "sessionflow-public")
        #expect(account["requested_scope"] as? String == "read")
        #expect(account["granted_scope"] as? String == "read", "\(document)")
        #expect(account["member_id"] as? String == "alice")
        #expect((account["expires_in_s"] as? Int ?? 0) > 3000)
        let human = try await watchSession(["status", "--store", directory])
        #expect(human.status == 0 && human.stdout.contains("issuer:   \(server.issuer)"), "\(human)")

        let before = try await server.requests().count
        let token = try await watchSession(["token", "--store", directory])
        #expect(token.status == 0, "\(token)")
        #expect(token.stdout == (storedAccessToken(directory) ?? "-") + "\n")
        #expect(token.stderr.isEmpty, "\(token.stderr)")
        #expect(try await server.requests().count == before, "token sent a request")

        let again = try await watchSession(login)
        #expect(again.status == 0, "\(again)")
        #expect(again.stdout.contains("Already signed in as alice at \(server.issuer)"), "\(again)")
        #expect(try await server.requests().count == before, "a second login started a flow")

        let secrets = storedTokens(directory) + Array(try await server.deviceCodes())
        for output in [cli.screen, status.stdout + status.stderr, human.stdout + human.stderr, again.stdout + again.stderr] {
            #expect(clean(output, of: secrets), "\(output)")
        }
    }

    /// A store that cannot be read (its key file open to the group, which the store refuses to
    /// use, whoever runs the test): `status` does not know the session, so it says neither
    /// "signed in" nor "signed out" but "unavailable" and why, exit 7 (its exit-code table), in
    /// text and in JSON (`"state":null`, no account); `token` gives no token, exit 7 too, the
    /// reason on standard error. The store is left as it was.
    @Test func statusOfAStoreThatCannotBeReadExitsSeven() async throws {
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = FileCredentialStore(directory: directory)
        try store.write(storedSession(member: "carol"))
        #expect(chmod(store.keyPath, 0o640) == 0)
        let before = try Data(contentsOf: URL(fileURLWithPath: store.path))
        let reason = "cannot be read, so the session is not known: the key file cannot be used"

        let text = try await watchSession(["status", "--store", directory])
        #expect(text.status == 7, "\(text)")
        #expect(text.stdout.contains("(unavailable)") && text.stderr.contains(reason), "\(text)")
        #expect(!text.stdout.contains("carol") && !text.stdout.contains("not signed in"), "\(text)")

        let json = try await watchSession(["status", "--json", "--store", directory])
        #expect(json.status == 7, "\(json)")
        let document = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
        let storeStatus = document["store"] as? [String: Any]
        #expect(storeStatus?["status"] as? String == "unavailable", "\(document)")
        #expect((storeStatus?["reason"] as? String)?.contains(reason) == true, "\(document)")
        #expect(document["state"] is NSNull && (document["accounts"] as? [Any])?.isEmpty == true, "\(document)")

        let token = try await watchSession(["token", "--store", directory])
        #expect(token.status == 7 && token.stdout.isEmpty && token.stderr.contains(reason), "\(token)")
        for run in [text, json, token] {
            #expect(clean(run.stdout + run.stderr, of: [storedAccess]), "\(run)")
        }
        #expect(try Data(contentsOf: URL(fileURLWithPath: store.path)) == before)
    }

    /// A record written before profiles existed opens; the store keeps a profile through the
    /// writes of a session that knows none (a refresh); status and token work without one.
    @Test func aRecordWithoutAProfileOpensAndAProfileSurvivesLaterWrites() async throws {
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = FileCredentialStore(directory: directory)
        try store.write(storedSession(member: "carol"))  // no profile: the record as older versions wrote it
        guard case .present(let old) = store.read() else { Issue.record("the old record does not open"); return }
        #expect(old.profile == nil && old.accessToken == Secret(storedAccess))

        let status = try await watchSession(["status", "--json", "--store", directory])
        #expect(status.status == 0, "\(status)")
        #expect(status.stdout.contains(#""issuer":null"#), "\(status)")
        let token = try await watchSession(["token", "--store", directory])
        #expect(token.status == 0 && token.stdout == storedAccess + "\n", "\(token)")

        let profile = SessionProfile(issuer: "https://auth.example", clientID: "app", requestedScope: "read")
        #expect(try store.setProfile(profile, account: "carol"))
        var refreshed = storedSession(member: "carol")
        refreshed.accessToken = Secret("SENTINEL-ROTATED-ACCESS")
        try store.account("carol", isActive: true).write(refreshed)  // as a manager writes: no profile
        guard case .present(let now) = store.read() else { Issue.record("unreadable"); return }
        #expect(now.profile == profile)
        #expect(now.accessToken == Secret("SENTINEL-ROTATED-ACCESS"))
        #expect(!status.stdout.contains(storedAccess) && !status.stderr.contains(storedAccess))
    }

    /// The status table: 0 signed in, 1 signed out (or no such account), 4 expired; token says
    /// why on stderr with the same code and prints nothing.
    @Test func statusAndTokenExitCodesFollowTheTable() async throws {
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let out = try await watchSession(["status", "--store", directory])
        #expect(out.status == 1 && out.stdout.contains("not signed in"), "\(out)")
        let noToken = try await watchSession(["token", "--store", directory])
        #expect(noToken.status == 1 && noToken.stdout.isEmpty && noToken.stderr.contains("not signed in"), "\(noToken)")

        let store = FileCredentialStore(directory: directory)
        try store.write(StoredSession(memberID: "carol", expired: true))
        let expired = try await watchSession(["status", "--json", "--store", directory])
        #expect(expired.status == 4, "\(expired)")
        #expect(expired.stdout.contains(#""state":"sessionExpired""#), "\(expired)")
        let expiredToken = try await watchSession(["token", "--store", directory])
        #expect(expiredToken.status == 4 && expiredToken.stdout.isEmpty && expiredToken.stderr.contains("expired"), "\(expiredToken)")

        let missing = try await watchSession(["status", "--store", directory, "--account", "nobody"])
        #expect(missing.status == 1 && missing.stderr.contains("no account \"nobody\""), "\(missing)")
    }

    /// `status` says when the refresh is due as the library takes it: the margin (5 minutes) is
    /// at most half the time the token has left, so a 2-minute token is due in about a minute,
    /// not "now"; an hour's token 5 minutes before its expiry.
    @Test func statusSaysWhenAShortTokensRefreshIsDue() async throws {
        let server = try await AuthServer()
        for (lifetime, due) in [(120, 50...61), (3600, 3280...3301)] {
            let directory = temporaryStore()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            try storeSignedIn(directory, server: server, access: "a", refresh: "r", expiresIn: .seconds(lifetime))
            let status = try await watchSession(["status", "--json", "--store", directory])
            #expect(status.status == 0, "\(status)")
            let document = try #require(try objects(status.stdout).first)
            let account = try #require((document["accounts"] as? [[String: Any]])?.first)
            #expect(due.contains(account["next_refresh_in_s"] as? Int ?? -1), "\(lifetime) s: \(document)")
        }
    }

    /// A flag naming another issuer than the stored one: exit 64, both named, nothing sent.
    @Test func anotherIssuerThanTheStoredOneIsRefusedAndNothingIsSent() async throws {
        let server = try await AuthServer()
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try storeSignedIn(directory, server: server, access: "SENTINEL-ACCESS-1", refresh: "SENTINEL-REFRESH-1")
        let run = try await watchSession(["logout", "--store", directory, "--issuer", "https://other.example", "--client-id", "x"])
        #expect(run.status == 64, "\(run)")
        #expect(run.stderr.contains("https://other.example") && run.stderr.contains(server.issuer), "\(run)")
        #expect(try await server.requests().isEmpty)
        #expect(storedAccessToken(directory) == "SENTINEL-ACCESS-1")
        let watch = try await watchSession(["--store", directory, "--token-endpoint", "https://other.example/token", "--client-id", "x"])
        #expect(watch.status == 64, "\(watch)")
        #expect(try await server.requests().isEmpty)
        // The stored token endpoint with another client: the token would go out as another
        // client's.
        let client = try await watchSession(["--store", directory, "--token-endpoint", server.issuer + "/oauth/token", "--client-id", "x"])
        #expect(client.status == 64 && client.stderr.contains("sessionflow-public"), "\(client)")
        #expect(try await server.requests().isEmpty)
        // `login` at another issuer while signed in here: not "already signed in" (exit 0, and
        // a script would go on to use this issuer's token there).
        let login = try await watchSession(["login", "--store", directory, "--issuer", "https://other.example", "--client-id", "x"])
        #expect(login.status == 64, "\(login)")
        #expect(login.stderr.contains("https://other.example") && login.stderr.contains(server.issuer), "\(login)")
        #expect(try await server.requests().isEmpty)
        #expect(storedAccessToken(directory) == "SENTINEL-ACCESS-1")
        #expect(clean(
            run.stdout + run.stderr + watch.stdout + watch.stderr + client.stdout + client.stderr + login.stdout + login.stderr,
            of: ["SENTINEL-ACCESS-1", "SENTINEL-REFRESH-1"]))

        // With the stored profile, logout needs no flag: revoked at the stored issuer.
        let logout = try await watchSession(["logout", "--store", directory, "--json"])
        #expect(logout.status == 0 || logout.status == 6, "\(logout)")
        #expect(try objects(logout.stdout).first?["revocation_endpoint"] as? String == server.issuer + "/oauth/revoke", "\(logout)")
        #expect(FileCredentialStore(directory: directory).read() == .absent)
    }

    /// Fifty `token` processes on an expired access token: one refresh at the server, no
    /// reuse, the same new token printed by all.
    @Test func fiftyTokenProcessesOnAnExpiredTokenCauseOneRefresh() async throws {
        try await concurrentFreshTokens(tokens: 50, execs: 0, credentials: 0)
    }

    /// The same with ten `exec` and ten `credential get` mixed in.
    @Test func tokenExecAndCredentialTogetherCauseOneRefresh() async throws {
        try await concurrentFreshTokens(tokens: 50, execs: 10, credentials: 10)
    }

    /// Twenty `token` processes against a server that keeps its refresh tokens (Google's):
    /// the store's refresh token does not change, yet one refresh serves them all — those
    /// waiting for the lease take the newer access token another process stored.
    @Test func tokenProcessesCauseOneRefreshWhenTheServerKeepsRefreshTokens() async throws {
        try await concurrentFreshTokens(tokens: 20, execs: 0, credentials: 0, rotation: false)
    }

    func concurrentFreshTokens(tokens: Int, execs: Int, credentials: Int, rotation: Bool = true) async throws {
        let server = try await AuthServer(expiresIn: 3600, rotation ? ["--strict-reuse"] : ["--no-rotation"])
        let (access, refresh) = try await server.passwordSignIn()
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try storeSignedIn(directory, server: server, access: access, refresh: refresh, expiresIn: .seconds(-10))
        let started = ContinuousClock.now
        var processes: [(kind: String, process: Spawned)] = []
        for index in 0..<(tokens + execs + credentials) {
            if index < tokens {
                processes.append(("token", try Spawned(["token", "--store", directory])))
            } else if index < tokens + execs {
                processes.append(("exec", try Spawned(["exec", "--store", directory, "--", "sh", "-c", #"printf '%s\n' "$ACCESS_TOKEN""#])))
            } else {
                processes.append(("credential", try Spawned(
                    ["credential", "--store", directory, "get"], input: "protocol=https\nhost=git.example\n\n")))
            }
        }
        var printed: [String] = []
        for (kind, process) in processes {
            let run = await process.finish()
            #expect(run.status == 0, "\(kind): \(run)")
            switch kind {
            case "credential":
                let password = run.stdout.split(separator: "\n").first { $0.hasPrefix("password=") }
                printed.append(password.map { String($0.dropFirst("password=".count)) } ?? "")
                #expect(run.stdout.hasPrefix("username=oauth2\n"), "\(run)")
            default:
                printed.append(run.stdout.trimmingCharacters(in: .newlines))
            }
        }
        let elapsed = ContinuousClock.now - started
        let stats = try await server.stats()
        let fresh = storedAccessToken(directory)
        print("concurrent: \(processes.count) processes, refresh_grants \(stats["refresh_grants"] ?? -1), "
            + "reuse_detected \(stats["reuse_detected"] ?? -1), wall \(elapsed)")
        #expect(stats["refresh_grants"] == 1, "\(stats)")
        #expect(stats["reuse_detected"] == 0, "\(stats)")
        #expect(Set(printed).count == 1, "\(Set(printed).count) different answers")
        #expect(printed.first == fresh && fresh != access, "not the new stored token")
    }

    /// `exec`: the token in the child's environment (never its arguments), its status passed on.
    @Test func execPutsTheTokenInTheEnvironmentAndPassesTheStatusOn() async throws {
        let server = try await AuthServer()
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try storeSignedIn(directory, server: server, access: "SENTINEL-EXEC-ACCESS", refresh: "SENTINEL-EXEC-REFRESH")
        // The child compares with what the test expects (given in the environment, so that no
        // argument of the child holds the token) and looks at its own arguments.
        let run = try await watchSession([
            "exec", "--store", directory, "--env", "API_TOKEN", "--", "sh", "-c",
            #"test "$API_TOKEN" = "$EXPECTED" && ! tr '\0' ' ' < /proc/$$/cmdline | grep -q "$EXPECTED" && exit 3"#,
        ], environment: ["EXPECTED": "SENTINEL-EXEC-ACCESS"])
        #expect(run.status == 3, "\(run)")
        let missing = try await watchSession(["exec", "--store", directory, "--", "/nonexistent/command"])
        #expect(missing.status == 127, "\(missing)")
        #expect(clean(missing.stdout + missing.stderr, of: ["SENTINEL-EXEC-ACCESS"]))
        #expect(try await server.requests().isEmpty)
    }

    /// Real git through the helper: fill gets the token; reject (a 401) then fill gets a
    /// refreshed one, after exactly one refresh.
    @Test func gitCredentialFillAndRejectGoThroughTheHelper() async throws {
        let server = try await AuthServer()
        let (access, refresh) = try await server.passwordSignIn()
        let directory = temporaryStore()
        let home = temporaryStore()
        try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: true)
        defer {
            try? FileManager.default.removeItem(atPath: directory)
            try? FileManager.default.removeItem(atPath: home)
        }
        try storeSignedIn(directory, server: server, access: access, refresh: refresh)
        let helper = "!\(binary("watch-session")) credential --store \(directory) --account alice"
        let environment = [
            "HOME": home, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": home + "/gitconfig", "GIT_TERMINAL_PROMPT": "0",
        ]
        let config = try await git(["config", "--global", "credential.https://git.example.helper", helper], environment: environment)
        #expect(config.status == 0, "\(config)")

        let request = "protocol=https\nhost=git.example\n\n"
        let fill = try await git(["credential", "fill"], input: request, environment: environment)
        #expect(fill.status == 0, "\(fill)")
        #expect(fill.stdout.contains("password=\(access)\n"), "\(fill)")
        #expect(try await server.stats()["refresh_grants"] == 0)

        let reject = try await git(["credential", "reject"], input: "protocol=https\nhost=git.example\nusername=oauth2\npassword=\(access)\n\n",
                             environment: environment)
        #expect(reject.status == 0, "\(reject)")
        let refill = try await git(["credential", "fill"], input: request, environment: environment)
        let fresh = try #require(storedAccessToken(directory))
        #expect(fresh != access)
        #expect(refill.stdout.contains("password=\(fresh)\n"), "\(refill)")
        #expect(try await server.stats()["refresh_grants"] == 1)
        #expect(clean(reject.stdout + reject.stderr, of: [fresh, refresh]))
    }

    /// On a terminal `token` refuses without --show (the token would be on screen); with it, it
    /// prints.
    @Test func tokenOnATerminalNeedsShow() async throws {
        let server = try await AuthServer()
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try storeSignedIn(directory, server: server, access: "SENTINEL-TTY-ACCESS", refresh: "SENTINEL-TTY-REFRESH")
        let refused = try Running(["token", "--store", directory], terminal: true)
        #expect(await refused.exit() == 64, "\(refused.screen)")
        #expect(refused.screen.contains("--show") && !refused.screen.contains("SENTINEL-TTY-ACCESS"), "\(refused.screen)")
        let shown = try Running(["token", "--store", directory, "--show"], terminal: true)
        #expect(await shown.exit() == 0, "\(shown.screen)")
        #expect(shown.screen.contains("SENTINEL-TTY-ACCESS"))
    }

    /// Only token, exec (into the child) and credential (to git) output a token: every other
    /// command's standard output and error, in every mode, is scanned for it.
    @Test func noOtherCommandOutputsAToken() async throws {
        let server = try await AuthServer()
        let (access, refresh) = try await server.passwordSignIn()
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try storeSignedIn(directory, server: server, access: access, refresh: refresh)
        let store = ["--store", directory]
        var outputs: [(String, String)] = []
        func run(_ arguments: [String], input: String? = nil) async throws {
            let result = try await Spawned(arguments, input: input).finish()
            outputs.append((arguments.joined(separator: " "), result.stdout + result.stderr))
        }
        try await run(["status"] + store)
        try await run(["status", "--json"] + store)
        try await run(["status", "--account", "alice", "-vvv"] + store)
        try await run(["login", "--issuer", server.issuer, "--client-id", "sessionflow-public"] + store)
        try await run(["login", "--issuer", server.issuer, "--client-id", "sessionflow-public", "--json"] + store)
        try await run(["exec"] + store + ["-vvv", "--", "true"])
        try await run(["credential"] + store + ["store"], input: "protocol=https\nhost=x\nusername=u\npassword=\(access)\n\n")
        try await run(["credential"] + store + ["erase", "-vvv"], input: "protocol=https\nhost=x\npassword=not-the-token\n\n")
        try await run(["token", "-vvv"] + store)
        outputs[outputs.count - 1].1 = ""  // token's standard output is the token; its stderr:
        let tokenRun = try await Spawned(["token", "-vvv"] + store).finish()
        outputs.append(("token (stderr)", tokenRun.stderr))
        for command in ["status", "token", "exec", "credential", "login", "logout", "watch"] {
            try await run([command, "--help"])
        }
        let watch = try Running(store + ["--json", "-vvv"], terminal: false)
        #expect(await watch.wait(for: #""state":"loggedIn""#), "\(watch.screen)")
        kill(watch.process.processIdentifier, SIGINT)
        #expect(await watch.exit() == 130)
        outputs.append(("watch --json", watch.screen))
        try await run(["logout", "--json", "-vvv"] + store)
        try await run(["status", "--json"] + store)
        #expect(try await server.stats()["refresh_grants"] == 0)
        for (command, output) in outputs {
            #expect(clean(output, of: [access, refresh]), "\(command): \(output)")
        }
    }

    /// `watch-session` with no subcommand follows the default store (the one login uses);
    /// the demo is `watch-session demo`.
    @Test func theDefaultCommandWatchesTheDefaultStoreAndTheDemoIsASubcommand() async throws {
        let state = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: state) }
        try FileManager.default.createDirectory(atPath: state, withIntermediateDirectories: true)
        try FileCredentialStore(directory: state + "/watch-session").write(storedSession(member: "carol"))
        let watch = try Running(["--json"], terminal: false, environment: ["XDG_STATE_HOME": state])
        #expect(await watch.wait(for: #""state":"loggedIn""#), "\(watch.screen)")
        #expect(!watch.screen.contains("demo"), "\(watch.screen)")
        kill(watch.process.processIdentifier, SIGINT)
        #expect(await watch.exit() == 130)
        #expect(clean(watch.screen, of: [storedAccess, storedRefresh]))
        let status = try await watchSession(["status"], environment: ["XDG_STATE_HOME": state])
        #expect(status.status == 0 && status.stdout.contains("carol (active): loggedIn"), "\(status)")

        let demo = try await watchSession(["demo", "--json", "--speed", "10", "--scenario", "401-storm"])
        #expect(demo.status == 0, "\(demo)")
        #expect(demo.stdout.contains("one refresh answered twenty 401s"))
        let script = try String(contentsOfFile: URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("scripts/demo.sh").path, encoding: .utf8)
        #expect(script.contains("watch-session demo"))
    }

    /// `login --force` on a signed-in store: the old session is signed out at its own issuer
    /// (its refresh token revoked), then a new sign-in runs and login exits 0.
    @Test func loginForceSignsTheOldSessionOutFirst() async throws {
        let server = try await AuthServer()
        try await server.device(["interval": "1", "expires_in": "120"])
        let (access, refresh) = try await server.passwordSignIn()
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try storeSignedIn(directory, server: server, access: access, refresh: refresh)
        let cli = try Running(
            ["login", "--issuer", server.issuer, "--client-id", "sessionflow-public", "--store", directory, "--json", "--force"],
            terminal: false)
        #expect(await cli.wait(for: "sign_in_prompt"), "\(cli.screen)")
        #expect(try await server.refreshError(refresh) == "invalid_grant", "the old refresh token was not revoked")
        let prompt = try #require(try objects(cli.stdout.text).first { $0["event"] as? String == "sign_in_prompt" })
        try await server.decide(try #require(prompt["user_code"] as? String), approve: true)
        #expect(await cli.exit() == 0, "\(cli.screen)")
        let fresh = try #require(storedAccessToken(directory))
        #expect(fresh != access)
        #expect(clean(cli.screen, of: [access, refresh, fresh]))
    }

    /// `token --min-valid N` refreshes first when less than N seconds are left.
    @Test func tokenMinValidRefreshesFirst() async throws {
        let server = try await AuthServer()
        let (access, refresh) = try await server.passwordSignIn()
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try storeSignedIn(directory, server: server, access: access, refresh: refresh, expiresIn: .seconds(600))
        let enough = try await watchSession(["token", "--store", directory, "--min-valid", "60"])
        #expect(enough.status == 0 && enough.stdout == access + "\n", "\(enough)")
        #expect(try await server.stats()["refresh_grants"] == 0)
        let short = try await watchSession(["token", "--store", directory, "--min-valid", "1200"])
        #expect(short.status == 0, "\(short)")
        #expect(short.stdout != access + "\n" && short.stdout == (storedAccessToken(directory) ?? "-") + "\n")
        #expect(try await server.stats()["refresh_grants"] == 1)
    }

    /// A refresh whose answer names a narrower scope changes the profile's granted scope (the
    /// requested one stays): in the store's record and in what `status` shows.
    @Test func aRefreshThatNarrowsTheScopeUpdatesTheProfile() async throws {
        let server = try await AuthServer()
        let (access, refresh) = try await server.passwordSignIn()
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try FileCredentialStore(directory: directory).write(StoredSession(
            accessToken: Secret(access), refreshToken: Secret(refresh),
            accessTokenExpiresAt: SessionConfiguration.realtime() - .seconds(10), memberID: "alice",
            profile: SessionProfile(
                issuer: server.issuer, clientID: "sessionflow-public", requestedScope: "read write",
                grantedScope: "read write", tokenEndpoint: server.issuer + "/oauth/token")))
        let narrowed = try await server.call("POST", "__resource/config", form: ["grant_scope": "read"])
        #expect(narrowed.status == 200)
        let token = try await watchSession(["token", "--store", directory])
        #expect(token.status == 0, "\(token)")
        #expect(try await server.stats()["refresh_grants"] == 1)
        guard case .present(let stored) = FileCredentialStore(directory: directory).read() else {
            Issue.record("the store does not open")
            return
        }
        #expect(stored.profile?.grantedScope == "read", "\(String(describing: stored.profile))")
        #expect(stored.profile?.requestedScope == "read write")
        #expect(stored.profile?.issuer == server.issuer)
        let status = try await watchSession(["status", "--json", "--store", directory])
        let document = try #require(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])
        let account = try #require((document["accounts"] as? [[String: Any]])?.first)
        #expect(account["granted_scope"] as? String == "read", "\(document)")
        #expect(account["requested_scope"] as? String == "read write", "\(document)")
    }

    /// A store with accounts of two issuers: watching one of them refreshes it at its issuer,
    /// and the other account's refresh token goes nowhere (never to the first issuer) — whether
    /// its record names its issuer, has no profile at all (bare tokens a library host signed
    /// in: whose they are, nobody said; the server here was taken from alice's profile), or
    /// names the first issuer but another client (sent with alice's client id, the token would
    /// be refused as invalid_grant and bob's session end).
    @Test(arguments: ["profile", "none", "other client"])
    func aWatchNeverSendsAnotherIssuersTokenToItsOwn(bob bobsRecord: String) async throws {
        let first = try await AuthServer()
        let second = try await AuthServer()
        let bobsServer = bobsRecord == "other client" ? first : second
        let alice = try await first.passwordSignIn("alice")
        let bob = try await bobsServer.passwordSignIn("bob")
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = FileCredentialStore(directory: directory)
        for (member, server, tokens) in [("alice", first, alice), ("bob", bobsServer, bob)] {
            let client = member == "bob" && bobsRecord == "other client" ? "another-client" : "sessionflow-public"
            let profile = SessionProfile(issuer: server.issuer, clientID: client, tokenEndpoint: server.issuer + "/oauth/token")
            try store.account(member, isActive: true).write(StoredSession(
                accessToken: Secret(tokens.access), refreshToken: Secret(tokens.refresh),
                accessTokenExpiresAt: SessionConfiguration.realtime() - .seconds(10), memberID: member,
                profile: member == "bob" && bobsRecord == "none" ? nil : profile))
        }
        try store.setActiveAccount("alice")
        let watch = try Running(["--store", directory, "--json", "-vv"], terminal: false)
        #expect(await watch.wait(for: #""event":"tokenRefreshed""#), "\(watch.screen)")
        #expect(await watch.wait(for: "other_issuer"), "bob's refresh was not refused: \(watch.screen)")
        kill(watch.process.processIdentifier, SIGINT)
        #expect(await watch.exit() == 130)
        #expect(try await first.stats()["refresh_grants"] == 1)
        let sentToFirst = try await first.requests().compactMap { ($0["form"] as? [String: String])?["refresh_token"] }
        #expect(!sentToFirst.contains(bob.refresh), "bob's refresh token went to alice's issuer and client")
        #expect(try await second.stats()["refresh_grants"] == 0)
        #expect(clean(watch.screen, of: [alice.access, alice.refresh, bob.access, bob.refresh]))
    }

    /// The issuer is judged at each refresh from the session's profile as it stands, not from
    /// a list made at start-up: alice, watched at the first issuer, is signed in again by
    /// another process at the second (the same account key). Her new refresh token is never
    /// sent to the first issuer, which would refuse it and mark the account expired.
    @Test func anAccountSignedInAgainAtAnotherIssuerIsNotRefreshedAtTheFirst() async throws {
        let first = try await AuthServer()
        let second = try await AuthServer()
        let alice = try await first.passwordSignIn("alice")
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = FileCredentialStore(directory: directory)
        func profile(_ server: AuthServer) -> SessionProfile {
            SessionProfile(issuer: server.issuer, clientID: "sessionflow-public", tokenEndpoint: server.issuer + "/oauth/token")
        }
        try store.account("alice", isActive: true).write(StoredSession(
            accessToken: Secret(alice.access), refreshToken: Secret(alice.refresh),
            accessTokenExpiresAt: SessionConfiguration.realtime() + .seconds(3600), memberID: "alice", profile: profile(first)))
        let watch = try Running(["--store", directory, "--json", "-vv"], terminal: false)
        #expect(await watch.wait(for: #""state":"loggedIn""#), "\(watch.screen)")
        // Another process: alice signs in at the second issuer; the token it stores has expired.
        let again = try await second.passwordSignIn("alice")
        try store.account("alice", isActive: true).write(StoredSession(
            accessToken: Secret(again.access), refreshToken: Secret(again.refresh),
            accessTokenExpiresAt: SessionConfiguration.realtime() - .seconds(10), memberID: "alice", profile: profile(second)))
        #expect(await watch.wait(for: "other_issuer"), "alice's new refresh was not refused: \(watch.screen)")
        kill(watch.process.processIdentifier, SIGINT)
        #expect(await watch.exit() == 130)
        let sentToFirst = try await first.requests().compactMap { ($0["form"] as? [String: String])?["refresh_token"] }
        #expect(!sentToFirst.contains(again.refresh), "alice's second-issuer refresh token went to the first issuer")
        #expect(try await first.stats()["refresh_grants"] == 0)
        guard case .present(let stored) = store.account("alice", isActive: true).read() else {
            Issue.record("alice's record is gone")
            return
        }
        #expect(!stored.expired && stored.refreshToken == Secret(again.refresh))
        #expect(clean(watch.screen, of: [alice.access, alice.refresh, again.access, again.refresh]))
    }

    func git(_ arguments: [String], input: String = "", environment extra: [String: String]) async throws -> (status: Int32, stdout: String, stderr: String) {
        let run = try await runProcess(
            "/usr/bin/git", arguments, input: input,
            environment: ProcessInfo.processInfo.environment.merging(extra) { $1 })
        return (run.status, run.stdout, run.stderr)
    }
}
