import Foundation
import SessionFlowTestSupport
import Testing

/// Runs the built watch-session binary (beside this test binary; standard input empty) and
/// returns its output.
func watchSession(
    _ arguments: [String], environment extra: [String: String] = [:]
) async throws -> (status: Int32, stdout: String, stderr: String) {
    try await Spawned(arguments, environment: extra).finish()
}

func objects(_ ndjson: String) throws -> [[String: Any]] {
    try ndjson.split(separator: "\n").map {
        try JSONSerialization.jsonObject(with: Data($0.utf8)) as! [String: Any]
    }
}

@Suite("watch-session", .serialized)
struct WatchSessionTests {
    @Test func theDemoStoryPlaysEventByEventAndExitsZero() async throws {
        let run = try await watchSession(["demo", "--json", "--speed", "10"])
        #expect(run.status == 0)
        let lines = try objects(run.stdout)
        let trail = lines.map { line -> String in
            switch line["kind"] as? String {
            case "state": "state:\(line["state"]!)"
            case "event": "event:\(line["event"]!)"
            default: "note"
            }
        }
        // signed in → proactive refreshes → failures with backoff → a retry that works → expired
        let states = trail.filter { $0.hasPrefix("state:") }
        #expect(states == ["state:loggedOut", "state:loggedIn", "state:sessionExpired"])
        let proactive = lines.filter { $0["event"] as? String == "tokenRefreshed" && $0["reason"] as? String == "proactive" }
        #expect(proactive.count >= 2)
        let failures = lines.filter { $0["event"] as? String == "refreshFailed" }
        #expect(failures.map { $0["attempt"] as? Int } == [1, 2, 3])
        let delays = failures.compactMap { $0["retry_in_ms"] as? Int }
        #expect(delays.count == 3 && delays == delays.sorted() && delays[2] > delays[0])  // backoff grows
        #expect(lines.contains { $0["event"] as? String == "tokenRefreshed" && $0["reason"] as? String == "retry" })
        #expect(lines.contains { $0["event"] as? String == "sessionExpired" })
        #expect(lines.contains { ($0["text"] as? String) == "Your session has expired. Please sign in again." })
        let expiredAt = trail.firstIndex(of: "state:sessionExpired")!
        #expect(trail.firstIndex(of: "state:loggedIn")! < trail.firstIndex(where: { $0 == "event:refreshFailed" })!)
        #expect(trail.lastIndex(where: { $0 == "event:refreshFailed" })! < expiredAt)
        // every line is dated
        #expect(lines.allSatisfy { $0["time"] is String })
        // no token value, ever
        #expect(!run.stdout.contains("demo-token") && !run.stderr.contains("demo-token"))
    }

    @Test func theHumanFormatHighlightsStatesAndSaysTheSessionExpired() async throws {
        let run = try await watchSession(["demo", "--speed", "20"])
        #expect(run.status == 0)
        #expect(run.stdout.contains("STATE → loggedIn"))
        #expect(run.stdout.contains("retrying in"))
        #expect(run.stdout.contains("Your session has expired. Please sign in again."))
        #expect(!run.stdout.contains("\u{1B}["))  // NO_COLOR and not a terminal: no colour
        #expect(!run.stdout.contains("demo-token"))
    }

    @Test func anOfflineStartLogsNobodyOut() async throws {
        let run = try await watchSession(["demo", "--json", "--speed", "10", "--scenario", "offline-start"])
        #expect(run.status == 0)
        let lines = try objects(run.stdout)
        let states = lines.compactMap { $0["kind"] as? String == "state" ? $0["state"] as? String : nil }
        #expect(states == ["loggedIn", "sessionExpired"])
        #expect(lines.filter { $0["event"] as? String == "refreshFailed" }.count == 2)
        #expect(!run.stdout.contains("demo-token"))
    }

    @Test func a401StormIsServedByOneRefresh() async throws {
        let run = try await watchSession(["demo", "--json", "--speed", "10", "--scenario", "401-storm"])
        #expect(run.status == 0)
        let refreshed = try objects(run.stdout).filter { $0["event"] as? String == "tokenRefreshed" }
        #expect(refreshed.count == 1)
        #expect(refreshed.first?["reason"] as? String == "unauthorized")
        #expect(run.stdout.contains("all 20 got the same new token from one refresh"))
    }

    @Test func aRefreshAnsweringAfterLogoutChangesNothing() async throws {
        let run = try await watchSession(["demo", "--json", "--speed", "10", "--scenario", "logout-during-refresh"])
        #expect(run.status == 0)
        let lines = try objects(run.stdout)
        let signedOut = lines.firstIndex { $0["event"] as? String == "signedOut" }
        #expect(signedOut != nil)
        #expect(!lines.contains { $0["event"] as? String == "tokenRefreshed" })
        #expect(lines.last { $0["kind"] as? String == "state" }?["state"] as? String == "loggedOut")
    }

    @Test func badInputGetsOneClearLineAndANonZeroExit() async throws {
        let speed = try await watchSession(["demo", "--speed", "0"])
        #expect(speed.status != 0)
        #expect(speed.stderr.contains("--speed must be above 0"))
        let unknown = try await watchSession(["--bogus"])
        #expect(unknown.status != 0)
        #expect(unknown.stderr.contains("Unknown option '--bogus'"))
        let scenario = try await watchSession(["demo", "--scenario", "nope"])
        #expect(scenario.status != 0)
    }

    @Test func helpHasExamples() async throws {
        let help = try await watchSession(["--help"])
        #expect(help.status == 0)
        #expect(help.stdout.contains("Examples:"))
        #expect(help.stdout.contains("--json"))
    }
}

import SessionCore
import SessionFileStore

func binary(_ name: String) -> String {
    let me = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    return URL(fileURLWithPath: me).deletingLastPathComponent().appendingPathComponent(name).path
}

func temporaryStore() -> String {
    FileManager.default.temporaryDirectory.appendingPathComponent("watch-store-\(UUID().uuidString)").path
}

let storedAccess = "SENTINEL-WATCH-ACCESS-77"
let storedRefresh = "SENTINEL-WATCH-REFRESH-88"

func storedSession(member: String = "carol") -> StoredSession {
    StoredSession(
        accessToken: Secret(storedAccess), refreshToken: Secret(storedRefresh),
        accessTokenExpiresAt: SessionConfiguration.realtime() + .seconds(3600), memberID: member)
}

@Suite("watch-session, real use", .serialized)
struct WatchSessionLiveTests {
    @Test func aStoreChangedByAnotherProcessShowsUpLiveAndCtrlCExits130() async throws {
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binary("watch-session"))
        process.arguments = ["--store", directory, "--json"]
        let out = Pipe()
        process.standardOutput = out
        let collected = LockedText()
        collected.collect(out)
        try process.run()
        #expect(await eventually(timeout: .seconds(20), every: .milliseconds(20)) { collected.text.contains("\"state\":\"loggedOut\"") })
        // Another process (this test) signs in through the store...
        try FileCredentialStore(directory: directory).write(storedSession())
        #expect(await eventually(timeout: .seconds(20), every: .milliseconds(20)) { collected.text.contains("\"event\":\"signedIn\"") })
        #expect(collected.text.contains("\"state\":\"loggedIn\""))
        // ...and logs out
        try FileCredentialStore(directory: directory).clear()
        #expect(await eventually(timeout: .seconds(20), every: .milliseconds(20)) { collected.text.contains("otherProcess") })
        // Ctrl-C: a clean exit with 130
        kill(process.processIdentifier, SIGINT)
        await offThePool { process.waitUntilExit() }
        #expect(process.terminationStatus == 130)
        #expect(!collected.text.contains(storedAccess) && !collected.text.contains(storedRefresh))
    }

    @Test func severalAccountsAreListedAndAccountPicksTheOneFollowed() async throws {
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = FileCredentialStore(directory: directory)
        try store.account("alice", isActive: false).write(storedSession(member: "alice"))
        try store.account("bob", isActive: false).write(storedSession(member: "bob"))
        try store.setActiveAccount("alice")

        let process = Process()
        process.executableURL = URL(fileURLWithPath: binary("watch-session"))
        process.arguments = ["--store", directory, "--account", "bob", "--json"]
        let out = Pipe()
        process.standardOutput = out
        let collected = LockedText()
        collected.collect(out)
        try process.run()
        let bobActive = #"{"active":true,"key":"bob","state":"loggedIn"}"#
        #expect(await eventually(timeout: .seconds(20), every: .milliseconds(20)) { collected.text.contains(bobActive) })
        #expect(collected.text.contains(#"{"active":false,"key":"alice","state":"loggedIn"}"#), "\(collected.text)")
        #expect(collected.text.contains("accountSwitched"))
        // Another process signs alice out: the list follows.
        try store.account("alice", isActive: false).clear()
        #expect(await eventually(timeout: .seconds(20), every: .milliseconds(20)) {
            collected.text.contains(#""accounts":[\#(bobActive)]"#)
        })
        kill(process.processIdentifier, SIGINT)
        await offThePool { process.waitUntilExit() }
        #expect(process.terminationStatus == 130)
        #expect(!collected.text.contains(storedAccess) && !collected.text.contains(storedRefresh))

        // An account the store does not hold: one clear line, exit 1, nothing changed.
        let unknown = try await watchSession(["--store", directory, "--account", "carol\u{1B}]0;owned\u{07}"])
        #expect(unknown.status == 1)
        #expect(unknown.stderr.contains(#"no account "carol\u{1B}]0;owned\u{7}" in the store (accounts: bob)"#), "\(unknown.stderr)")
        #expect(!unknown.stderr.contains("\u{1B}"))
        #expect(store.readAccounts() == .present(StoredAccounts(keys: ["bob"], active: "bob")))
        // Without --store, the default store (where login keeps the session): bob is not there.
        let state = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: state) }
        let orphan = try await watchSession(["--account", "bob"], environment: ["XDG_STATE_HOME": state])
        #expect(orphan.status == 1 && orphan.stderr.contains(#"no account "bob" in the store (it holds none)"#), "\(orphan)")
    }

    /// A store that cannot be read is not "signed out". The CLI keeps watching, shows
    /// `STORE → unavailable` with the reason next to `loggedOut`, and the stored session once
    /// the store can be read again (the read is retried every 5 s).
    @Test func anUnreadableStoreIsShownAsSuchAndTheSessionComesBackWhenReadable() async throws {
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let file = FileCredentialStore(directory: directory)
        try file.write(storedSession())
        chmod(file.keyPath, 0o640)  // refused by the store, even for root
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binary("watch-session"))
        process.arguments = ["--store", directory, "--json"]
        let out = Pipe()
        process.standardOutput = out
        let collected = LockedText()
        collected.collect(out)
        try process.run()
        defer { if process.isRunning { process.terminate() } }
        func lines() -> [[String: Any]] {
            collected.text.split(separator: "\n").compactMap {
                try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
            }
        }
        func store(_ status: String) -> [[String: Any]] {
            lines().filter { $0["kind"] as? String == "store" && $0["status"] as? String == status }
        }
        #expect(await eventually(timeout: .seconds(20), every: .milliseconds(20)) { !store("unavailable").isEmpty })
        let reason = store("unavailable").first?["reason"] as? String ?? ""
        #expect(reason.contains(file.keyPath) && reason.contains("open to group or others"), "\(reason)")
        #expect(lines().contains { $0["kind"] as? String == "state" && $0["state"] as? String == "loggedOut" })
        #expect(!lines().contains { $0["state"] as? String == "loggedIn" })
        // The fault goes: the stored session comes back, and the store says available.
        chmod(file.keyPath, 0o600)
        #expect(await eventually(timeout: .seconds(12), every: .milliseconds(50)) {
            lines().contains { $0["kind"] as? String == "state" && $0["state"] as? String == "loggedIn" }
        }, "\(collected.text)")
        #expect(!store("available").isEmpty, "\(collected.text)")
        #expect(store("available").allSatisfy { $0["reason"] is NSNull })
        kill(process.processIdentifier, SIGINT)
        await offThePool { process.waitUntilExit() }
        #expect(process.terminationStatus == 130)
        #expect(!collected.text.contains(storedAccess) && !collected.text.contains(storedRefresh))
    }

    @Test func keysOnATerminalLogOutAndQuit() async throws {
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try FileCredentialStore(directory: directory).write(storedSession())
        // The state line and the event line come from two flows, in either order: wait for both
        // before quitting.
        let (status, screen) = try await onTerminal(keys: "lq", after: "signed out (userRequested)&&STATE → loggedOut", store: directory)
        #expect(status == 0, "\(screen)")
        #expect(screen.contains("STATE → loggedIn"))
        #expect(screen.contains("STATE → loggedOut"))
        #expect(screen.contains("signed out (userRequested)"))
        #expect(FileCredentialStore(directory: directory).read() == .absent)
        #expect(!screen.contains(storedAccess) && !screen.contains(storedRefresh))
    }

    @Test(arguments: ["r", "u"])
    func refreshAndSimulated401KeysReachTheAuthority(key: String) async throws {
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try FileCredentialStore(directory: directory).write(storedSession())
        // Watching only (no token endpoint): the refresh the key asks for is refused as a
        // configuration matter, and that refusal is what shows the key reached the session.
        let (status, screen) = try await onTerminal(keys: key + "q", after: "refresh failed", store: directory)
        #expect(status == 0, "\(screen)")
        #expect(screen.contains("refresh failed"), "\(screen)")
        #expect(screen.contains("watching only"))
        #expect(!screen.contains(storedAccess) && !screen.contains(storedRefresh))
    }

    @Test func aBadURLOrStoreGetsOneClearLine() async throws {
        let url = try await watchSession(["--token-endpoint", "not a url", "--client-id", "x"])
        #expect(url.status == 64)
        #expect(url.stderr.contains("--token-endpoint: the token endpoint is not a URL with a host"), "\(url.stderr)")
        // Plain http to a host that is not loopback: refused before any connection (tokens
        // and the client secret would travel in clear); loopback http stays allowed.
        let plain = try await watchSession(["--token-endpoint", "http://auth.example.com/token", "--client-id", "x"])
        #expect(plain.status == 64)
        #expect(plain.stderr.contains("plain http to a host that is not loopback"), "\(plain.stderr)")
        let ftp = try await watchSession(["--token-endpoint", "ftp://auth.example.com/token", "--client-id", "x"])
        #expect(ftp.status == 64 && ftp.stderr.contains("neither https nor http"), "\(ftp.stderr)")
        let credentials = try await watchSession(["--token-endpoint", "https://user:pw@auth.example.com/token", "--client-id", "x"])
        #expect(credentials.status == 64 && credentials.stderr.contains("user name or password"))
        #expect(!credentials.stderr.contains("pw@"))
        let noClient = try await watchSession(["--token-endpoint", "https://auth.example.com/token"])
        #expect(noClient.status != 0 && noClient.stderr.contains("needs --client-id"))
        let file = FileManager.default.temporaryDirectory.appendingPathComponent("not-a-dir-\(UUID().uuidString)").path
        _ = FileManager.default.createFile(atPath: file, contents: Data())
        defer { try? FileManager.default.removeItem(atPath: file) }
        let store = try await watchSession(["--store", file])
        #expect(store.status != 0 && store.stderr.contains("--store is not a directory"))
    }
}

@Suite("watch-session, the store's key", .serialized)
struct WatchSessionKeyTests {
    /// Runs `watch-session --json` with `arguments` and `environment` until its JSON shows
    /// `until` (then Ctrl-C) or it exits by itself; returns its exit status and output.
    func watch(_ arguments: [String], environment extra: [String: String] = [:], until: String) async throws
        -> (status: Int32, stdout: String, stderr: String)
    {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binary("watch-session"))
        process.arguments = arguments + ["--json"]
        var environment = ProcessInfo.processInfo.environment
        environment.removeValue(forKey: "SESSIONFLOW_KEY_FILE")
        environment.merge(extra) { $1 }
        process.environment = environment
        let out = Pipe()
        let err = Pipe()
        process.standardOutput = out
        process.standardError = err
        let collected = LockedText()
        let errors = LockedText()
        collected.collect(out)
        errors.collect(err)
        try process.run()
        _ = await eventually(timeout: .seconds(20), every: .milliseconds(20)) { collected.text.contains(until) || !process.isRunning }
        if process.isRunning { kill(process.processIdentifier, SIGINT) }
        await offThePool { process.waitUntilExit() }
        // Everything it wrote, not what the readers had so far.
        _ = await eventually(timeout: .seconds(20), every: .milliseconds(20)) { collected.ended && errors.ended }
        return (process.terminationStatus, collected.text, errors.text)
    }

    @Test func aKeyFileFromTheFlagOrTheEnvironmentOpensTheStoreAndWithoutItTheStoreIsLeftAlone() async throws {
        let directory = temporaryStore()
        let keyDirectory = temporaryStore()
        defer {
            try? FileManager.default.removeItem(atPath: directory)
            try? FileManager.default.removeItem(atPath: keyDirectory)
        }
        try FileManager.default.createDirectory(atPath: keyDirectory, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        let keyHex = "5c" + String(repeating: "a7", count: 31)
        let keyFile = keyDirectory + "/store.key"
        #expect(FileManager.default.createFile(atPath: keyFile, contents: Data((keyHex + "\n").utf8), attributes: [.posixPermissions: 0o600]))
        try FileCredentialStore(directory: directory, key: .fromFile(keyFile)).write(storedSession())
        let stored = try Data(contentsOf: URL(fileURLWithPath: directory + "/session.sfstore"))

        let flag = try await watch(["--store", directory, "--key-file", keyFile], until: "\"state\":\"loggedIn\"")
        #expect(flag.status == 130, "\(flag.stderr)")
        #expect(flag.stdout.contains("\"state\":\"loggedIn\""), "\(flag.stdout)")
        let environment = try await watch(["--store", directory], environment: ["SESSIONFLOW_KEY_FILE": keyFile], until: "\"state\":\"loggedIn\"")
        #expect(environment.status == 130, "\(environment.stderr)")
        #expect(environment.stdout.contains("\"state\":\"loggedIn\""), "\(environment.stdout)")

        // Without the key: the store is shown unavailable (it needs the host's key), never
        // signed in, and is left as it is.
        let without = try await watch(["--store", directory], until: "\"status\":\"unavailable\"")
        #expect(without.status == 130, "\(without)")
        #expect(without.stdout.contains("sealed with a key the host provides"), "\(without.stdout)")
        #expect(!without.stdout.contains("\"state\":\"loggedIn\""), "\(without.stdout)")
        #expect(try Data(contentsOf: URL(fileURLWithPath: directory + "/session.sfstore")) == stored)

        // A key file others may read is refused before anything runs (exit 64), never quoted.
        chmod(keyFile, 0o644)
        let open = try await watchSession(["--store", directory, "--key-file", keyFile])
        #expect(open.status == 64, "\(open.stderr)")
        #expect(open.stderr.contains("--key-file") && open.stderr.contains("open to group or others"), "\(open.stderr)")
        let openEnvironment = try await watch(["--store", directory], environment: ["SESSIONFLOW_KEY_FILE": keyFile], until: "never")
        #expect(openEnvironment.status == 64 && openEnvironment.stderr.contains("SESSIONFLOW_KEY_FILE"), "\(openEnvironment.stderr)")
        for output in [flag.stdout, flag.stderr, environment.stdout, without.stderr, open.stderr, openEnvironment.stderr] {
            #expect(!output.contains(keyHex) && !output.contains(storedAccess) && !output.contains(storedRefresh))
        }
        // Without --store the key file is the default store's, checked the same way.
        let state = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: state) }
        let noStore = try await watchSession(["--key-file", keyFile], environment: ["XDG_STATE_HOME": state])
        #expect(noStore.status == 64 && noStore.stderr.contains("open to group or others"), "\(noStore)")
    }

    @Test func helpExplainsTheKeyFile() async throws {
        let help = try await watchSession(["--help"])
        #expect(help.stdout.contains("--key-file"))
        #expect(help.stdout.contains("SESSIONFLOW_KEY_FILE"))
    }
}

/// Runs `watch-session --store DIR` in a pseudo-terminal (Tests/Fixtures/pty_drive.py), waits
/// for its key help, types `keys` (each after `after` appears), and returns what it showed.
func onTerminal(keys: String, after: String, store directory: String) async throws -> (status: Int32, screen: String) {
    let fixture = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/pty_drive.py").path
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    process.arguments = ["python3", fixture, "keys:", keys, after, "--", binary("watch-session"), "--store", directory]
    let out = Pipe()
    process.standardOutput = out
    try process.run()
    return await offThePool {
        let screen = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (process.terminationStatus, screen)
    }
}
