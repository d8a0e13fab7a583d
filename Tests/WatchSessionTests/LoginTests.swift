import Foundation
import SessionCore
import SessionFileStore
import SessionFlowTestSupport
import Testing

/// The Authlib server of Tests/Fixtures/oauth_server.py for one test (its hooks are described
/// in its docstring); stopped when let go. The test's own calls go through `LoopbackHTTP`.
final class AuthServer: @unchecked Sendable {
    let server: AuthlibProcess
    var port: Int { server.port }
    var issuer: String { "http://127.0.0.1:\(port)" }

    init(expiresIn: Int = 3600, _ extra: [String] = []) async throws {
        server = try await AuthlibProcess(arguments: ["--expires-in", "\(expiresIn)"] + extra)
    }

    func call(_ method: String, _ path: String, form: [String: String]? = nil) async throws -> LoopbackHTTP.Response {
        var headers: [(String, String)] = []
        var body: [UInt8] = []
        if let form {
            headers.append(("Content-Type", "application/x-www-form-urlencoded"))
            body = LoopbackHTTP.form(form.sorted { $0.key < $1.key }.map { ($0.key, $0.value) })
        }
        return try await LoopbackHTTP.perform(port: port, method: method, path: "/" + path, headers: headers, body: body)
    }

    func object(_ method: String, _ path: String, form: [String: String]? = nil) async throws -> [String: Any] {
        ((try? await call(method, path, form: form).json()) as? [String: Any]) ?? [:]
    }

    /// What the device endpoint announces (interval, expires_in; see the docstring).
    func device(_ settings: [String: String]) async throws {
        let response = try await call("POST", "__device/config", form: settings.merging(["reset": "1"]) { a, _ in a })
        guard response.status == 200 else { throw TestFailure("/__device/config: HTTP \(response.status)") }
    }

    /// The user approves (or denies) the code, as in a browser.
    func decide(_ userCode: String, approve: Bool) async throws {
        let response = try await call("POST", approve ? "__device/approve" : "__device/deny", form: ["user_code": userCode, "user": "alice"])
        guard response.status == 200 else { throw TestFailure("/__device/\(approve ? "approve" : "deny"): HTTP \(response.status)") }
    }

    func deviceStats() async throws -> [String: Int] {
        (try await call("GET", "__device/stats").json() as? [String: Int]) ?? [:]
    }

    func stats() async throws -> [String: Int] {
        (try await call("GET", "__stats").json() as? [String: Int]) ?? [:]
    }

    /// The requests the server recorded (to /oauth/* and /.well-known/*), oldest first.
    func requests() async throws -> [[String: Any]] {
        (try await call("GET", "__requests").json() as? [[String: Any]]) ?? []
    }

    /// Every device code the server handed out (from the recorded polls' forms).
    func deviceCodes() async throws -> Set<String> {
        Set(try await requests().compactMap { ($0["form"] as? [String: String])?["device_code"] })
    }

    /// The next request to the metadata document misbehaves (`set:issuer=...`, `drop:name`).
    func faultMetadata(_ mode: String) async throws {
        let response = try await call("POST", "__fault", form: ["mode": mode, "endpoint": "metadata", "count": "5"])
        guard response.status == 200 else { throw TestFailure("/__fault: HTTP \(response.status)") }
    }

    /// A user signs in with the password grant (an app's login screen elsewhere).
    func passwordSignIn(_ user: String = "alice") async throws -> (access: String, refresh: String) {
        let answer = try await object("POST", "oauth/token", form: [
            "grant_type": "password", "username": user, "password": "correct horse", "client_id": "sessionflow-public",
        ])
        guard let access = answer["access_token"] as? String, let refresh = answer["refresh_token"] as? String else {
            throw TestFailure("the password grant answered no tokens: \(answer.keys.sorted())")
        }
        return (access, refresh)
    }

    /// What the token endpoint says of a refresh token now (nil: it still works).
    func refreshError(_ refreshToken: String) async throws -> String? {
        try await object("POST", "oauth/token", form: [
            "grant_type": "refresh_token", "refresh_token": refreshToken, "client_id": "sessionflow-public",
        ])["error"] as? String
    }
}

/// The fixture's consent form, played as a browser would (see oauth_server.py): the page at the
/// authorization URL, its form submitted, the redirect followed to the CLI's loopback listener.
extension AuthServer {
    static func pathAndQuery(_ url: URL) -> String {
        let components = URLComponents(url: url, resolvingAgainstBaseURL: false)
        return (components?.percentEncodedPath ?? "/") + (components?.percentEncodedQuery.map { "?" + $0 } ?? "")
    }

    /// Submits the consent form of `authorizationURL`; then follows the redirect to the
    /// listener and returns the page the browser would show.
    func browse(_ authorizationURL: URL, allow: Bool) async throws -> LoopbackHTTP.Response {
        guard authorizationURL.port == port else { throw TestFailure("not this server's URL: \(authorizationURL)") }
        let page = try await call("GET", String(Self.pathAndQuery(authorizationURL).dropFirst()))
        guard page.status == 200 else { throw TestFailure("the authorization page: HTTP \(page.status) \(page.text)") }
        var fields = page.text.matches(of: #/<input type="hidden" name="([^"]*)" value="([^"]*)">/#).map { match in
            (String(match.output.1), String(match.output.2)
                .replacingOccurrences(of: "&quot;", with: "\"").replacingOccurrences(of: "&#x27;", with: "'")
                .replacingOccurrences(of: "&lt;", with: "<").replacingOccurrences(of: "&gt;", with: ">")
                .replacingOccurrences(of: "&amp;", with: "&"))
        }
        fields += [("user", "alice"), ("consent", allow ? "allow" : "deny")]
        let answer = try await LoopbackHTTP.perform(
            port: port, method: "POST", path: "/oauth/authorize",
            headers: [("Content-Type", "application/x-www-form-urlencoded")], body: LoopbackHTTP.form(fields))
        guard answer.status == 302, let location = answer.header("Location").flatMap(URL.init(string:)),
              location.host == "127.0.0.1", let listener = location.port
        else {
            throw TestFailure("the consent form: HTTP \(answer.status) \(answer.text)")
        }
        return try await LoopbackHTTP.perform(port: listener, method: "GET", path: Self.pathAndQuery(location))
    }

    func authorizeStats() async throws -> [String: Int] {
        (try await call("GET", "__authorize/stats").json() as? [String: Int]) ?? [:]
    }
}

/// A directory with an `xdg-open` that only writes down what it was asked to open (in
/// `opened` beside it): put first on PATH, it stands for the desktop's browser launcher.
func fakeXDGOpen() throws -> (directory: String, opened: String) {
    let directory = temporaryStore()
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    let opened = directory + "/opened"
    let script = "#!/bin/sh\nprintf '%s\\n' \"$@\" >> '\(opened)'\n"
    guard FileManager.default.createFile(atPath: directory + "/xdg-open", contents: Data(script.utf8), attributes: [.posixPermissions: 0o755]) else {
        throw TestFailure("cannot write the stand-in xdg-open")
    }
    return (directory, opened)
}


struct TestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// A watch-session process the test watches while it runs: its output as it comes, keys typed
/// into it. `terminal`: through Tests/Fixtures/pty_session.py, a pseudo-terminal that is its
/// controlling terminal (stdout and stderr both show on the screen; Ctrl-C is the byte 0x03).
final class Running: @unchecked Sendable {
    let process = Process()
    let input = Pipe()
    let stdout = LockedText()
    let stderr = LockedText()

    init(_ arguments: [String], terminal: Bool, environment extra: [String: String] = [:]) throws {
        if terminal {
            let fixture = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
                .appendingPathComponent("Fixtures/pty_session.py").path
            process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
            process.arguments = ["python3", fixture, "--", binary("watch-session")] + arguments
        } else {
            process.executableURL = URL(fileURLWithPath: binary("watch-session"))
            process.arguments = arguments
        }
        var environment = ProcessInfo.processInfo.environment
        environment["NO_COLOR"] = "1"
        environment.merge(extra) { $1 }
        process.environment = environment
        let out = Pipe()
        let err = Pipe()
        process.standardOutput = out
        process.standardError = err
        process.standardInput = input
        stdout.collect(out)
        stderr.collect(err)
        try process.run()
    }

    deinit {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    }

    var screen: String { stdout.text + stderr.text }

    func type(_ keys: String) {
        input.fileHandleForWriting.write(Data(keys.utf8))
    }

    /// Waits until the output shows `text` (or the process ended).
    @discardableResult
    func wait(for text: String, timeout: Duration = .seconds(20)) async -> Bool {
        await eventually(timeout: timeout, every: .milliseconds(20)) { screen.contains(text) || !process.isRunning }
            && screen.contains(text)
    }

    /// The first match of `pattern`'s first group, once it shows.
    func wait(match pattern: String, timeout: Duration = .seconds(20)) async -> String? {
        let regex = try! Regex(pattern)
        var found: String?
        _ = await eventually(timeout: timeout, every: .milliseconds(20)) {
            if let match = screen.firstMatch(of: regex), let group = match.output[1].substring {
                found = String(group)
            }
            return found != nil || !process.isRunning
        }
        return found
    }

    /// Its exit status once it ended (nil if it had not within `timeout`: then it is killed).
    func exit(timeout: Duration = .seconds(20)) async -> Int32? {
        let ended = await eventually(timeout: timeout, every: .milliseconds(20)) { !process.isRunning }
        guard ended else {
            kill(process.processIdentifier, SIGKILL)
            return nil
        }
        // The readers have taken the last output once both pipes ended.
        _ = await eventually(timeout: .seconds(20), every: .milliseconds(20)) { stdout.ended && stderr.ended }
        return process.terminationStatus
    }
}

/// No secret of `secrets` in `text`.
func clean(_ text: String, of secrets: [String]) -> Bool {
    secrets.allSatisfy { !$0.isEmpty && !text.contains($0) }
}

/// The tokens a store holds (to check no output shows them).
func storedTokens(_ directory: String) -> [String] {
    guard case .present(let session) = FileCredentialStore(directory: directory).read() else { return [] }
    return [session.accessToken?.reveal(), session.refreshToken?.reveal()].compactMap { $0 }
}

@Suite("watch-session login and logout", .serialized)
struct WatchSessionLoginTests {
    /// `login --watch`: these tests follow the session after the sign-in too.
    func login(_ server: AuthServer, store: String, _ extra: [String] = []) -> [String] {
        ["login", "--issuer", server.issuer, "--client-id", "sessionflow-public", "--store", store, "--watch"] + extra
    }

    /// `login` with `arguments` on a new store, the stand-in xdg-open first on PATH. `cleanUp`
    /// removes the store and the stand-in.
    func browserLogin(
        _ server: AuthServer, _ arguments: [String]
    ) throws -> (cli: Running, directory: String, opened: String, cleanUp: @Sendable () -> Void) {
        let directory = temporaryStore()
        let opener = try fakeXDGOpen()
        let cleanUp: @Sendable () -> Void = {
            try? FileManager.default.removeItem(atPath: directory)
            try? FileManager.default.removeItem(atPath: opener.directory)
        }
        let path = opener.directory + ":" + (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin:/bin")
        do {
            let cli = try Running(login(server, store: directory, arguments), terminal: false, environment: ["PATH": path])
            return (cli, directory, opener.opened, cleanUp)
        } catch {
            cleanUp()
            throw error
        }
    }

    /// Through a pseudo-terminal, as a person would: the code is read off the screen, approved
    /// in "the browser" (the server's hook), and the session shows up signed in, stored where
    /// another watch-session process finds it.
    @Test func loginOnATerminalShowsTheCodeAndACountdownThenSignsInAndStores() async throws {
        let server = try await AuthServer()
        try await server.device(["interval": "1", "expires_in": "120"])
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cli = try Running(login(server, store: directory), terminal: true)

        let code = await cli.wait(match: #"To sign in, open \S+/device and enter ([A-Z]{4}-[A-Z]{4})"#)
        let userCode = try #require(code, "\(cli.screen)")
        #expect(cli.screen.contains("To sign in, open \(server.issuer)/device and enter \(userCode)\r\n"), "\(cli.screen)")
        #expect(cli.screen.contains("or open \(server.issuer)/device?user_code=\(userCode) (the code is filled in)"))
        // The countdown, updated in place: at least two different values of the time left.
        #expect(await eventually(timeout: .seconds(10), every: .milliseconds(50)) {
            let shown = Set(cli.screen.matches(of: #/code [A-Z]{4}-[A-Z]{4} expires in (\d+:\d\d)/#).map { String($0.output.1) })
            return shown.count >= 2 && shown.allSatisfy { $0.hasPrefix("1:5") || $0 == "2:00" }
        }, "\(cli.screen)")
        #expect(cli.screen.contains("\r\u{1B}[2K  code \(userCode) expires in"))

        try await server.decide(userCode, approve: true)
        #expect(await cli.wait(for: "STATE → loggedIn"), "\(cli.screen)")
        #expect(await cli.wait(for: "signed in as alice"), "\(cli.screen)")
        #expect(await cli.wait(for: "keys: s sign in again"), "\(cli.screen)")
        cli.type("q")
        #expect(await cli.exit() == 0, "\(cli.screen)")

        // Stored: the file store the other modes use, as alice.
        guard case .present(let stored) = FileCredentialStore(directory: directory).read() else {
            Issue.record("nothing stored: \(cli.screen)")
            return
        }
        #expect(stored.memberID == "alice")
        // A second process watching the store sees the session.
        let watcher = try Running(["--store", directory, "--json"], terminal: false)
        #expect(await watcher.wait(for: #""state":"loggedIn""#), "\(watcher.screen)")
        kill(watcher.process.processIdentifier, SIGINT)
        #expect(await watcher.exit() == 130)

        // No token, refresh token or device code anywhere.
        let secrets = storedTokens(directory) + Array(try await server.deviceCodes())
        #expect(secrets.count >= 3, "\(secrets.count)")
        #expect(clean(cli.screen, of: secrets) && clean(watcher.screen, of: secrets))
    }

    /// After login, a session the server ends (SESSION_EXPIRED) is signed in again with `s`:
    /// the same flow, a new code and prompt, LOGGED_IN again, the new tokens stored.
    @Test func sSignsInAgainWithTheSameFlowOnceTheSessionExpired() async throws {
        let server = try await AuthServer()
        try await server.device(["interval": "1", "expires_in": "120"])
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cli = try Running(login(server, store: directory), terminal: true)
        let first = try #require(await cli.wait(match: #"enter ([A-Z]{4}-[A-Z]{4})"#), "\(cli.screen)")
        try await server.decide(first, approve: true)
        #expect(await cli.wait(for: "keys: s sign in again"), "\(cli.screen)")
        let firstTokens = storedTokens(directory)
        cli.type("s")
        #expect(await cli.wait(for: "signed in already"), "\(cli.screen)")

        // The server ends every session of alice; the next refresh hears it: expired.
        _ = try await server.call("POST", "__revoke_user", form: ["user": "alice"])
        cli.type("r")
        #expect(await cli.wait(for: "STATE → sessionExpired"), "\(cli.screen)")
        #expect(await cli.wait(for: "the session expired: press s to sign in again"), "\(cli.screen)")
        cli.type("s")
        let again = await cli.wait(match: #"enter (?!\#(first))([A-Z]{4}-[A-Z]{4})"#)
        let second = try #require(again, "\(cli.screen)")
        #expect(second != first)
        try await server.decide(second, approve: true)
        #expect(await eventually(timeout: .seconds(20), every: .milliseconds(50)) {
            cli.screen.components(separatedBy: "STATE → loggedIn").count == 3
        }, "\(cli.screen)")
        cli.type("q")
        #expect(await cli.exit() == 0, "\(cli.screen)")
        let secondTokens = storedTokens(directory)
        #expect(secondTokens.count == 2 && Set(secondTokens).isDisjoint(with: firstTokens), "\(secondTokens.count)")
        #expect(clean(cli.screen, of: firstTokens + secondTokens + Array(try await server.deviceCodes())))
    }

    /// --json: the prompt is one NDJSON line with its fields; a denial ends with exit 3, a
    /// plain message, a `sign_in_failed` line, and nothing stored.
    @Test func loginJSONPrintsThePromptAsOneLineAndADenialExitsThree() async throws {
        let server = try await AuthServer()
        try await server.device(["interval": "1", "expires_in": "300"])
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cli = try Running(login(server, store: directory, ["--json"]), terminal: false)
        #expect(await cli.wait(for: "sign_in_prompt"), "\(cli.screen)")
        let lines = try objects(cli.stdout.text)
        let prompt = try #require(lines.first { $0["event"] as? String == "sign_in_prompt" })
        #expect(prompt["kind"] as? String == "sign_in")
        #expect(prompt["flow"] as? String == "device")
        #expect(prompt["verification_uri"] as? String == "\(server.issuer)/device")
        #expect(prompt["expires_in"] as? Int == 300)
        #expect(prompt["interval"] as? Int == 1)
        #expect(prompt["time"] is String)
        let userCode = try #require(prompt["user_code"] as? String)
        #expect(prompt["verification_uri_complete"] as? String == "\(server.issuer)/device?user_code=\(userCode)")
        #expect(userCode.wholeMatch(of: #/[A-Z]{4}-[A-Z]{4}/#) != nil)

        try await server.decide(userCode, approve: false)
        #expect(await cli.exit() == 3, "\(cli.screen)")
        #expect(cli.stderr.text.hasPrefix("watch-session: sign-in denied"), "\(cli.stderr.text)")
        let failed = try objects(cli.stdout.text).first { $0["event"] as? String == "sign_in_failed" }
        #expect(failed?["reason"] as? String == "accessDenied")
        #expect(!cli.stdout.text.contains(#""state":"loggedIn""#))
        #expect(FileCredentialStore(directory: directory).read() == .absent)
        #expect(clean(cli.screen, of: Array(try await server.deviceCodes())))
        #expect(try await server.deviceStats()["denied"] == 1)
    }

    /// `login --dpop` (issue 31): the tokens are bound to a new DPoP key, which is sealed with
    /// them in the store and remembered in the profile; the server saw only valid proofs.
    @Test func loginWithDPoPBindsTheTokensAndRemembersItInTheProfile() async throws {
        let server = try await AuthServer()
        try await server.device(["interval": "1", "expires_in": "120"])
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cli = try Running(
            ["login", "--issuer", server.issuer, "--client-id", "sessionflow-public", "--store", directory, "--json", "--dpop"],
            terminal: false)
        #expect(await cli.wait(for: "sign_in_prompt"), "\(cli.screen)")
        let prompt = try #require(try objects(cli.stdout.text).first { $0["event"] as? String == "sign_in_prompt" })
        try await server.decide(try #require(prompt["user_code"] as? String), approve: true)
        #expect(await cli.exit() == 0, "\(cli.screen)")
        guard case .present(let stored) = FileCredentialStore(directory: directory).read() else {
            Issue.record("nothing stored: \(cli.screen)")
            return
        }
        let key = try #require(stored.dpopKey)
        #expect(stored.profile?.dpop == .required)
        let issued = try await server.call("GET", "__tokens").json() as? [[String: Any]]
        let bound = issued?.first { $0["access_token"] as? String == stored.accessToken?.reveal() }
        #expect(bound?["jkt"] as? String == key.thumbprint)
        let dpop = try await server.object("GET", "__dpop/stats")
        let token = (dpop["endpoints"] as? [String: [String: Int]])?["token"]
        #expect(token?["invalid"] == 0 && token?["absent"] == 0 && (token?["valid"] ?? 0) >= 1, "\(String(describing: token))")
        #expect(clean(cli.screen, of: storedTokens(directory) + [key.encodedPrivateKey.reveal()]))
    }

    /// Without --store, login and logout use $XDG_STATE_HOME/watch-session (its parents made
    /// 0700), and a second process finds the session there.
    @Test func withoutStoreTheSessionLivesInTheStateDirectory() async throws {
        let server = try await AuthServer()
        try await server.device(["interval": "1", "expires_in": "300"])
        let root = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let state = root + "/state/deeper"  // nothing of it exists yet
        let environment = ["XDG_STATE_HOME": state]
        let cli = try Running(
            ["login", "--issuer", server.issuer, "--client-id", "sessionflow-public", "--json"], terminal: false,
            environment: environment)
        #expect(await cli.wait(for: "sign_in_prompt"), "\(cli.screen)")
        let prompt = try #require(try objects(cli.stdout.text).first { $0["event"] as? String == "sign_in_prompt" })
        try await server.decide(try #require(prompt["user_code"] as? String), approve: true)
        // Without --watch, login ends once signed in.
        #expect(await cli.exit() == 0, "\(cli.screen)")
        #expect(cli.stdout.text.contains(#""event":"sign_in_succeeded""#), "\(cli.screen)")
        let store = state + "/watch-session"
        guard case .present(let stored) = FileCredentialStore(directory: store).read() else {
            Issue.record("nothing stored in \(store): \(cli.screen)")
            return
        }
        #expect(stored.memberID == "alice")
        let mode = (try FileManager.default.attributesOfItem(atPath: state)[.posixPermissions] as? NSNumber)?.intValue
        #expect(mode == 0o700)
        let run = try await watchSession(["logout"], environment: environment)
        #expect(run.status == 0, "\(run)")
        #expect(FileCredentialStore(directory: store).read() == .absent)
    }

    /// A code that runs out before anyone approves it: exit 4, said plainly.
    @Test func anExpiredCodeExitsFour() async throws {
        let server = try await AuthServer()
        try await server.device(["interval": "1", "expires_in": "2"])
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cli = try Running(login(server, store: directory), terminal: false)
        #expect(await cli.exit() == 4, "\(cli.screen)")
        #expect(cli.stderr.text.contains("watch-session: sign-in expired"), "\(cli.stderr.text)")
        // Not a terminal: the prompt as plain lines, no in-place drawing.
        #expect(cli.stdout.text.contains("To sign in, open \(server.issuer)/device and enter "))
        #expect(!cli.stdout.text.contains("\u{1B}["))
        #expect(FileCredentialStore(directory: directory).read() == .absent)
    }

    /// Ctrl-C while the code waits: cancelled (exit 130, a plain message), nothing signed in,
    /// and no poll afterwards — even when the code is approved then.
    @Test func ctrlCDuringThePromptCancelsTheSignInAndPollingStops() async throws {
        let server = try await AuthServer()
        try await server.device(["interval": "1", "expires_in": "120"])
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cli = try Running(login(server, store: directory), terminal: true)
        let userCode = try #require(await cli.wait(match: #"enter ([A-Z]{4}-[A-Z]{4})"#), "\(cli.screen)")
        #expect(await eventually(timeout: .seconds(10), every: .milliseconds(50)) {
            (try? await server.deviceStats()["polls"] ?? 0) ?? 0 >= 1
        })
        cli.type("\u{03}")  // Ctrl-C, through the terminal
        #expect(await cli.exit() == 130, "\(cli.screen)")
        #expect(cli.screen.contains("watch-session: the sign-in was cancelled: nothing was signed in"), "\(cli.screen)")
        let polls = try await server.deviceStats()["polls"] ?? 0
        try await server.decide(userCode, approve: true)
        try await Task.sleep(for: .milliseconds(2500))
        #expect(try await server.deviceStats()["polls"] == polls)
        #expect(try await server.deviceStats()["granted"] == 0)
        #expect(FileCredentialStore(directory: directory).read() == .absent)
    }

    /// Discovery that is refused names the member; a metadata document without the device
    /// endpoint cannot serve the device flow. Exit 2 both, nothing stored.
    @Test func discoveryRefusedNamesTheFieldAndExitsTwo() async throws {
        let server = try await AuthServer()
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await server.faultMetadata("set:issuer=https://other.example")
        let issuer = try await watchSession(login(server, store: directory))
        #expect(issuer.status == 2, "\(issuer)")
        #expect(issuer.stderr.contains("refused the metadata's issuer"), "\(issuer.stderr)")
        #expect(issuer.stderr.contains("https://other.example"))

        let second = try await AuthServer()
        try await second.faultMetadata("drop:device_authorization_endpoint")
        let device = try await watchSession(login(second, store: directory))
        #expect(device.status == 2, "\(device)")
        #expect(device.stderr.contains("device_authorization_endpoint"), "\(device.stderr)")
        #expect(try await second.deviceStats()["device_requests"] == 0)
        #expect(FileCredentialStore(directory: directory).read() == .absent)

        let usage = try await watchSession(["login", "--issuer", "ftp://x", "--client-id", "c", "--store", directory])
        #expect(usage.status == 64 && usage.stderr.contains("--issuer"), "\(usage.stderr)")
    }

    /// --browser: xdg-open (a stand-in on PATH) is run on the listener's start URL, which sends
    /// the browser on to the authorization URL that is printed; the test plays the browser (consent form, redirect to the loopback listener)
    /// and the session is signed in and stored. No token in the output.
    /// The start page fetched twice (the browser and another local program): the library ends
    /// the sign-in, and `login` says why with exit 5 — not 130, which is a person's Ctrl-C.
    @Test func loginWithTheBrowserEndsWhenItsStartPageIsOpenedTwice() async throws {
        let server = try await AuthServer()
        let (cli, directory, openedFile, cleanUp) = try browserLogin(server, ["--browser"])
        defer { cleanUp() }
        #expect(await eventually(timeout: .seconds(20), every: .milliseconds(20)) {
            (try? String(contentsOfFile: openedFile, encoding: .utf8))?.hasSuffix("/start\n") == true
        }, "\(cli.screen)")
        let opened = try #require(try? String(contentsOfFile: openedFile, encoding: .utf8))
        let port = try #require(URL(string: opened.trimmingCharacters(in: .newlines))?.port)
        #expect(try LoopbackHTTP.request(port: port, method: "GET", path: "/start").status == 302)
        #expect(try LoopbackHTTP.request(port: port, method: "GET", path: "/start").status == 400)
        #expect(await cli.exit() == 5, "\(cli.screen)")
        #expect(cli.screen.contains("opened twice"), "\(cli.screen)")
        #expect(FileCredentialStore(directory: directory).read() == .absent)
    }

    @Test func loginWithTheBrowserOpensTheURLAndSignsInWhenTheBrowserComesBack() async throws {
        let server = try await AuthServer()
        let (cli, directory, openedFile, cleanUp) = try browserLogin(server, ["--browser"])
        defer { cleanUp() }
        // The person's fallback is the start URL xdg-open was given, not the authorization URL:
        // one URL, fetched once, whichever way the browser is opened.
        let shown = await cli.wait(
            match: #"Opening the sign-in page at 127\.0\.0\.1 in your browser… If it does not open, visit (\S+) \(once: a second visit ends the sign-in\)\."#)
        let start = try #require(shown.flatMap(URL.init(string:)), "\(cli.screen)")
        // Written right after the line above, by a separate write: wait for it (read at once,
        // it was missing in a CI run).
        #expect(await cli.wait(for: "Waiting for the browser to come back to http://127.0.0.1:"), "\(cli.screen)")
        // xdg-open was given the listener's start URL, nothing of the state (issue 29, point 4:
        // any local user reads a process's argv), and the start URL sends the browser on to
        // the authorization URL, which is not on the screen.
        #expect(await eventually(timeout: .seconds(10), every: .milliseconds(20)) {
            (try? String(contentsOfFile: openedFile, encoding: .utf8))?.hasSuffix("/start\n") == true
        }, "\((try? String(contentsOfFile: openedFile, encoding: .utf8)) ?? "xdg-open was not run")")
        let opened = try #require(try? String(contentsOfFile: openedFile, encoding: .utf8))
        #expect(opened == start.absoluteString + "\n", "\(opened)")
        #expect(opened.hasPrefix("http://127.0.0.1:") && !opened.contains("state=") && !opened.contains("code_challenge"))
        #expect(!cli.screen.contains("state=") && !cli.screen.contains("code_challenge"), "\(cli.screen)")
        let redirect = try LoopbackHTTP.request(port: try #require(start.port), method: "GET", path: "/start")
        #expect(redirect.status == 302, "\(redirect.status)")
        let url = try #require(redirect.header("Location").flatMap(URL.init(string:)))
        #expect(url.absoluteString.hasPrefix("\(server.issuer)/oauth/authorize?"))
        #expect(url.absoluteString.contains("code_challenge_method=S256"))

        let page = try await server.browse(url, allow: true)
        #expect(page.status == 200, "\(page.text)")
        #expect(await cli.wait(for: "STATE → loggedIn"), "\(cli.screen)")
        #expect(await cli.wait(for: "signed in as alice"), "\(cli.screen)")
        kill(cli.process.processIdentifier, SIGINT)
        #expect(await cli.exit() == 130, "\(cli.screen)")
        guard case .present(let stored) = FileCredentialStore(directory: directory).read() else {
            Issue.record("nothing stored: \(cli.screen)")
            return
        }
        #expect(stored.memberID == "alice")
        #expect(try await server.authorizeStats()["code_exchanges"] == 1)
        let secrets = storedTokens(directory)
        #expect(secrets.count == 2)
        #expect(clean(cli.screen, of: secrets))
        // The PKCE verifier and the code stay inside too.
        let exchange = try await server.requests().first { ($0["form"] as? [String: String])?["grant_type"] == "authorization_code" }
        let form = exchange?["form"] as? [String: String] ?? [:]
        #expect(clean(cli.screen, of: [form["code_verifier"] ?? "", form["code"] ?? ""]), "\(form.keys.sorted())")
    }

    /// --browser --no-open --json: the prompt is one NDJSON line (the URL, the redirect URI, the
    /// wait), xdg-open is not run; a refused consent ends with exit 3 and a plain message.
    /// Nothing will fetch a start page, so there is none: `/start` is not found, gives no
    /// state away and does not end the sign-in.
    @Test func loginWithTheBrowserInJSONWithoutOpeningAndADenialExitsThree() async throws {
        let server = try await AuthServer()
        let (cli, directory, openedFile, cleanUp) = try browserLogin(server, ["--browser", "--no-open", "--json"])
        defer { cleanUp() }
        #expect(await cli.wait(for: "sign_in_prompt"), "\(cli.screen)")
        let prompt = try #require(try objects(cli.stdout.text).first { $0["event"] as? String == "sign_in_prompt" })
        #expect(prompt["flow"] as? String == "browser")
        #expect(prompt["opened"] as? Bool == false)
        #expect(prompt["expires_in"] as? Int == 300)
        let redirect = try #require(prompt["redirect_uri"] as? String)
        #expect(redirect.wholeMatch(of: #/http:\/\/127\.0\.0\.1:\d+\/callback/#) != nil, "\(redirect)")
        let url = try #require((prompt["authorization_url"] as? String).flatMap(URL.init(string:)))
        #expect(prompt["start_url"] is NSNull, "\(prompt)")
        let port = try #require(URL(string: redirect)?.port)
        for _ in 0..<2 {
            let start = try LoopbackHTTP.request(port: port, method: "GET", path: "/start")
            #expect(start.status == 404 && start.header("Location") == nil && !start.text.contains("state="), "\(start.status)")
        }
        let page = try await server.browse(url, allow: false)
        #expect(page.status == 200 || page.status == 400, "\(page.status)")
        #expect(await cli.exit() == 3, "\(cli.screen)")
        #expect(cli.stderr.text.hasPrefix("watch-session: sign-in denied"), "\(cli.stderr.text)")
        #expect(try objects(cli.stdout.text).contains { $0["event"] as? String == "sign_in_failed" && $0["reason"] as? String == "accessDenied" })
        #expect(!FileManager.default.fileExists(atPath: openedFile))
        #expect(FileCredentialStore(directory: directory).read() == .absent)
        let usage = try await watchSession(login(server, store: directory, ["--no-open"]))
        #expect(usage.status == 64 && usage.stderr.contains("--no-open goes with --browser"), "\(usage.stderr)")
    }

    /// logout: the refresh token revoked at the endpoint discovery named, the store wiped,
    /// what was done said, no token shown.
    @Test func logoutRevokesTheRefreshTokenAndWipesTheStore() async throws {
        let server = try await AuthServer()
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let tokens = try await server.passwordSignIn()
        try FileCredentialStore(directory: directory).write(StoredSession(
            accessToken: Secret(tokens.access), refreshToken: Secret(tokens.refresh),
            accessTokenExpiresAt: SessionConfiguration.realtime() + .seconds(3600), memberID: "alice"))

        // login leaves a store with someone signed in alone, and says so (exit 0).
        let busy = try await watchSession(["login", "--issuer", server.issuer, "--client-id", "sessionflow-public", "--store", directory])
        #expect(busy.status == 0, "\(busy)")
        #expect(busy.stdout.contains("Already signed in as alice"), "\(busy.stdout)")
        #expect(try await server.deviceStats()["device_requests"] == 0)

        let run = try await watchSession(["logout", "--store", directory, "--issuer", server.issuer, "--client-id", "sessionflow-public"])
        #expect(run.status == 0, "\(run)")
        #expect(run.stdout.contains("signed out alice: the session is wiped from the store"), "\(run.stdout)")
        #expect(run.stdout.contains("the refresh token was revoked at \(server.issuer)/oauth/revoke"), "\(run.stdout)")
        #expect(FileCredentialStore(directory: directory).read() == .absent)
        // The server saw the revocation of that refresh token, and refuses it now.
        let revocations = try await server.requests().filter { $0["path"] as? String == "/oauth/revoke" }
        #expect(revocations.contains { ($0["form"] as? [String: String])?["token"] == tokens.refresh })
        #expect((try await server.stats()["revocations"] ?? 0) >= 1)
        #expect(try await server.refreshError(tokens.refresh) == "invalid_grant")
        #expect(clean(run.stdout + run.stderr + busy.stdout + busy.stderr, of: [tokens.access, tokens.refresh]))

        // Again: nothing to sign out, exit 0.
        let again = try await watchSession(["logout", "--store", directory, "--json"])
        #expect(again.status == 0, "\(again)")
        let outcome = try objects(again.stdout).first
        #expect(outcome?["kind"] as? String == "logout" && outcome?["signed_out"] as? Bool == false, "\(again.stdout)")
    }

    /// logout --account: that account's refresh token revoked and its record removed; the
    /// other account stays signed in, and the output says so.
    @Test func logoutOfOneAccountLeavesTheOtherSignedIn() async throws {
        let server = try await AuthServer()
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = FileCredentialStore(directory: directory)
        var refreshTokens: [String: String] = [:]
        var secrets: [String] = []
        for user in ["alice", "bob"] {
            let tokens = try await server.passwordSignIn(user)
            refreshTokens[user] = tokens.refresh
            secrets += [tokens.access, tokens.refresh]
            try store.account(user, isActive: false).write(StoredSession(
                accessToken: Secret(tokens.access), refreshToken: Secret(tokens.refresh),
                accessTokenExpiresAt: SessionConfiguration.realtime() + .seconds(3600), memberID: user))
        }
        try store.setActiveAccount("alice")
        let run = try await watchSession([
            "logout", "--store", directory, "--account", "bob", "--issuer", server.issuer, "--client-id", "sessionflow-public",
        ])
        #expect(run.status == 0, "\(run)")
        #expect(run.stdout.contains("signed out bob"), "\(run.stdout)")
        #expect(run.stdout.contains("still signed in: alice"), "\(run.stdout)")
        #expect(store.readAccounts() == .present(StoredAccounts(keys: ["alice"], active: "alice")))
        #expect(try await server.refreshError(refreshTokens["bob"]!) == "invalid_grant")
        #expect(try await server.refreshError(refreshTokens["alice"]!) == nil)
        #expect(clean(run.stdout + run.stderr, of: secrets))
        let unknown = try await watchSession(["logout", "--store", directory, "--account", "carol"])
        #expect(unknown.status == 1 && unknown.stderr.contains("no account \"carol\" in the store (accounts: alice)"), "\(unknown)")
    }

    /// A revocation the server refuses: signed out here all the same, said plainly, exit 6.
    @Test func aRefusedRevocationStillSignsOutAndExitsSix() async throws {
        let server = try await AuthServer()
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let tokens = try await server.passwordSignIn()
        try FileCredentialStore(directory: directory).write(StoredSession(
            accessToken: Secret(tokens.access), refreshToken: Secret(tokens.refresh),
            accessTokenExpiresAt: SessionConfiguration.realtime() + .seconds(3600), memberID: "alice"))
        let fault = try await server.call("POST", "__fault", form: ["mode": "status:503", "endpoint": "revoke", "count": "5"])
        #expect(fault.status == 200)
        let run = try await watchSession(["logout", "--store", directory, "--issuer", server.issuer, "--client-id", "sessionflow-public"])
        #expect(run.status == 6, "\(run)")
        #expect(run.stdout.contains("signed out alice"), "\(run.stdout)")
        #expect(run.stderr.contains("watch-session: signed out here, but the revocation failed"), "\(run.stderr)")
        #expect(FileCredentialStore(directory: directory).read() == .absent)
        #expect((try await server.stats()["revoke_requests"] ?? 0) >= 1)
        #expect(clean(run.stdout + run.stderr, of: [tokens.access, tokens.refresh]))
    }

    /// Without --issuer: wiped here only, and the output says the token was not revoked; a
    /// refused discovery changes nothing (exit 2).
    @Test func logoutWithoutAnIssuerWipesLocallyAndSaysSo() async throws {
        let server = try await AuthServer()
        let directory = temporaryStore()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let tokens = try await server.passwordSignIn()
        try FileCredentialStore(directory: directory).write(StoredSession(
            accessToken: Secret(tokens.access), refreshToken: Secret(tokens.refresh),
            accessTokenExpiresAt: SessionConfiguration.realtime() + .seconds(3600), memberID: "alice"))

        try await server.faultMetadata("status:500")
        let refused = try await watchSession(["logout", "--store", directory, "--issuer", server.issuer, "--client-id", "sessionflow-public"])
        #expect(refused.status == 2, "\(refused)")
        #expect(refused.stderr.contains("discovery at \(server.issuer) failed"), "\(refused.stderr)")
        guard case .present = FileCredentialStore(directory: directory).read() else {
            Issue.record("a refused discovery changed the store")
            return
        }

        let local = try await watchSession(["logout", "--store", directory, "--json"])
        #expect(local.status == 0, "\(local)")
        let outcome = try #require(try objects(local.stdout).first)
        #expect(outcome["signed_out"] as? Bool == true)
        #expect(outcome["member_id"] as? String == "alice")
        #expect(outcome["revoked"] is NSNull)
        #expect(FileCredentialStore(directory: directory).read() == .absent)
        #expect(try await server.stats()["revoke_requests"] == 0)
        #expect(try await server.refreshError(tokens.refresh) == nil)  // still valid at the server
        #expect(clean(local.stdout + local.stderr + refused.stderr, of: [tokens.access, tokens.refresh]))
        let usage = try await watchSession(["logout", "--store", directory, "--issuer", server.issuer])
        #expect(usage.status == 64 && usage.stderr.contains("--issuer needs --client-id"))
    }
}
