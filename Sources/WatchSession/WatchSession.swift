// The `watch-session` command and its default `watch` (492 lines, 50 of them its help text):
// options, their checks and the run are one ArgumentParser type; live watching is in
// LiveWatch.swift, the demo's authority in DemoAuthority.swift.

import ArgumentParser
import CLibUV
import FoundationEssentials
import Glibc
import Logging
import LoopFlow
import SessionCore
import SessionFileStore
import SessionOAuth

/// The help of `watch-session` and of its default subcommand `watch` (the same screen).
let helpText = """
    With no subcommand it watches the session in the default store (the one login uses: \
    $XDG_STATE_HOME/watch-session, ~/.local/state/watch-session) live, refreshing it at the \
    server its stored profile names. `watch-session demo` plays an embedded demo: a session \
    signs in, refreshes before its tokens expire, rides out a struggling server with backoff, \
    and ends when its refresh token is revoked.

    Examples:
      watch-session                    watch the session login stored (the default store)
      watch-session --json             one JSON object per event (NDJSON), for scripts
      watch-session demo               the demo, in about a minute
      watch-session demo --speed 10 --scenario offline-start
                                       the demo, ten times faster; another scenario
      watch-session --store ~/.config/app/session
                                       follow the session other processes keep there
      watch-session --store DIR --account bob
                                       follow the account bob of several (the list is shown)
      watch-session --store DIR --token-endpoint https://auth.example.com/oauth/token \\
                    --client-id my-app --refresh-token-file token.txt
                                       drive a real OAuth 2.0 server (token from a file or '-' for stdin)
      watch-session --store DIR --key-file ~/.config/app/store.key
                                       open a store sealed with a key of your own
      watch-session login --issuer https://auth.example.com --client-id my-app [--store DIR]
                                       sign in (device flow), store the session and its profile, exit
      watch-session login --browser --issuer https://auth.example.com --client-id my-app [--store DIR]
                                       sign in in this machine's browser (xdg-open; --no-open: print the URL)
      watch-session status [--json]    once: each account's state, issuer, scopes, expiry (exit 0/1/4/7)
      TOKEN=$(watch-session token)     a fresh access token (refreshed first when due), nothing else
      watch-session exec -- curl …     a command with a fresh token in $ACCESS_TOKEN
      git config credential.https://git.example.com.helper '!watch-session credential --host git.example.com'
                                       git's password is a fresh token (https only; --host: for that host only)
      watch-session logout [--store DIR]
                                       sign out: revoke the refresh token at its issuer, wipe the store

    The store's key: --key-file (or SESSIONFLOW_KEY_FILE) names a file with the key \
    (32 bytes, or 64 hex digits: openssl rand -hex 32), 0600 and yours, in a directory \
    only you can write; without one, the desktop Secret Service when a session bus and \
    the service answer, else a key file beside the store (SESSIONFLOW_SECRET_SERVICE=off: \
    never the Secret Service). A store is always opened with the source that sealed it.

    Beside the state it shows whether the store could be read (STORE → available, \
    reading, or unavailable: why; in --json {"kind":"store","status":…,"reason":…}): \
    loggedOut with the store unavailable means "the stored session cannot be read yet", \
    not "signed out"; it is restored when the store can be read again.

    Keys on a terminal, when watching a store or a server (--store, --token-endpoint, login): \
    l logout, r refresh now, u simulate a 401, a next account, q quit (after login also: s \
    sign in again); the demo plays by itself. Ctrl-C or SIGTERM exits (130) in every mode, \
    the demo's temporary store removed first.

    Exit codes: 0 done, 1 failed, 2 discovery failed, 3 sign-in denied, 4 sign-in code or \
    wait expired, 5 sign-in failed otherwise, 6 signed out here but the revocation failed, \
    64 bad usage, 130 interrupted (Ctrl-C; a sign-in in progress is cancelled).
    """

@main
struct WatchSession: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch-session",
        abstract: "Shows a session live: its state, its refreshes, its failures. Signs in and out.",
        usage: """
            watch-session [watch] [--json] [--store <dir>] [--account <key>] [--key-file <file>] [--token-endpoint <url> --client-id <id> [--refresh-token-file <file>]] [-v…]
              watch-session demo [--speed <n>] [--scenario <s>] [--json]
              watch-session login --issuer <url> --client-id <id> [--device | --browser [--no-open]] [--store <dir>] [--key-file <file>] [--scope <s>] [--json] [--watch] [--force]
              watch-session status [--json] [--store <dir>] [--account <key>]
              watch-session token [--min-valid <seconds>] [--show] [--store <dir>] [--account <key>]
              watch-session exec [--env <name>] [--store <dir>] [--account <key>] -- <command> <argument>…
              watch-session credential [--store <dir>] [--account <key>] [--host <host>]… get|store|erase
              watch-session logout [--store <dir>] [--account <key>] [--key-file <file>] [--json]
              (every option of each: watch-session help watch|demo|login|status|token|exec|credential|logout)
            """,
        discussion: helpText,
        version: "watch-session \(SessionFlowVersion.string)",
        subcommands: [Watch.self, DemoCommand.self, Login.self, Status.self, Token.self, Exec.self, Credential.self, Logout.self],
        defaultSubcommand: Watch.self)

    /// Before anything: descriptors 0, 1 and 2 are open (a closed standard output must never
    /// become another descriptor, which would receive a token). The process holds tokens, so it
    /// is made non-dumpable (no core dump; no other process of the user, Swift's crash reporter
    /// included, may read its memory).
    static func main() async {
        // First of all, before any descriptor is opened: 0, 1 and 2 are taken.
        StandardStream.openStandardDescriptors()
        _ = sf_set_not_dumpable()
        await Self.main(nil)
    }
}

/// `watch-session demo`: the embedded demo, on a temporary store of its own.
struct DemoCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo",
        abstract: "Plays the embedded demo: sign in, refreshes, failures with backoff, revoked, expired.",
        discussion: """
            Everything runs in this process: a demo authority answers the refreshes, a temporary \
            store (removed at the end) keeps the session. No server, no real token.

            Examples:
              watch-session demo                    about a minute
              watch-session demo --speed 10 --json  ten times faster, one JSON object per event
              watch-session demo --scenario 401-storm
            """)

    @Option(help: "Compress time by this factor (the demo's clock runs N times faster).")
    var speed: Double = 1

    @Option(help: "Which demo to play: \(Scenario.allCases.map(\.rawValue).joined(separator: ", ")).")
    var scenario: Scenario = .story

    @Flag(help: "Print one JSON object per event (NDJSON) instead of lines for people.")
    var json = false

    @OptionGroup var verbosity: VerbosityOptions

    func validate() throws {
        guard speed > 0, speed <= 1000 else {
            throw ValidationError("--speed must be above 0 and at most 1000, got \(speed)")
        }
    }

    func run() async throws {
        let presenter = Presenter(json: json)
        let outcome: String
        do {
            outcome = try await Demo(scenario: scenario, speed: speed, presenter: presenter, logLevel: verbosity.level).play()
        } catch is DemoInterrupted {
            presenter.note("demo interrupted")
            throw ExitCode(ExitCodes.interrupted)
        }
        presenter.note(outcome)
    }
}

/// The live watch: what `watch-session` does without a subcommand.
struct Watch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Shows a session live: its state, its refreshes, its failures (the default: `watch-session [options]`).",
        discussion: helpText
    )

    @Flag(help: "Print one JSON object per event (NDJSON) instead of lines for people.")
    var json = false

    @Option(help: ArgumentHelp(
        "Watch the encrypted file store in this directory (other processes' changes appear live).",
        discussion: "Default: $XDG_STATE_HOME/watch-session (~/.local/state/watch-session), where login stores the session."))
    var store: String?

    @Option(help: "The account to follow (its key: the member id it signed in with). The store's active one otherwise.")
    var account: String?
    @Option(
        name: .customLong("key-file"),
        help: ArgumentHelp(
            "A file holding the store's key (32 bytes or 64 hex digits; yours, mode 0600; with --store).",
            discussion: "Default: $SESSIONFLOW_KEY_FILE; without either, the Secret Service or a key file beside the store."))
    var keyFile: String?

    @Option(help: "OAuth 2.0 token endpoint to refresh with (https; plain http only to a loopback host).")
    var tokenEndpoint: String?

    @Option(name: .customLong("client-id"), help: "OAuth 2.0 client id (with --token-endpoint).")
    var clientID: String?

    @Option(help: "File holding a refresh token to sign in with ('-': standard input). Never on the command line.")
    var refreshTokenFile: String?

    @OptionGroup var verbosity: VerbosityOptions

    func validate() throws {
        if tokenEndpoint != nil {
            guard clientID?.isEmpty == false else { throw ValidationError("--token-endpoint needs --client-id") }
            // The authority's own rules (https, or http to loopback): refused here, exit 64.
            do {
                try oauthConfiguration()?.validate()
            } catch {
                throw ValidationError("--token-endpoint: \(Terminal.escape("\(error)"))")
            }
        }
        if account?.isEmpty == true {
            throw ValidationError("--account is empty")
        }
        if refreshTokenFile != nil && tokenEndpoint == nil {
            throw ValidationError("--refresh-token-file needs --token-endpoint")
        }
        try Self.validateStore(directory, keyFile: keyFile)
    }

    /// `--store`, or the default one (where login keeps the session).
    var directory: String { store ?? Self.defaultStoreDirectory() }

    /// Where `login` and `logout` keep the session without `--store`:
    /// `$XDG_STATE_HOME/watch-session` (default `~/.local/state/watch-session`).
    static func defaultStoreDirectory(environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        if let state = environment["XDG_STATE_HOME"], state.hasPrefix("/") { return state + "/watch-session" }
        let home = environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? FileManager.default.homeDirectoryForCurrentUser.path
        return home + "/.local/state/watch-session"
    }

    /// Makes the default store's parent directories (0700 each, as `mkdir -p -m 700`), so the
    /// store can create its own directory; an explicit `--store` gets no such help.
    static func prepareDefaultStore(_ directory: String) throws {
        let parent = directory.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
        do {
            try FileManager.default.createDirectory(
                atPath: parent, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw ValidationError(Terminal.escape("cannot create \(parent) for the default store: \(error)"))
        }
    }

    /// The checks every mode makes of `--store` and `--key-file`.
    static func validateStore(_ store: String?, keyFile: String?) throws {
        if keyFile != nil && store == nil {
            throw ValidationError("--key-file needs --store")
        }
        _ = try storeKey(store: store, keyFile: keyFile)  // a key file that cannot be used: exit 64, naming it and why
        if let store {
            var info = stat()
            if stat(store, &info) == 0, info.st_mode & S_IFMT != S_IFDIR {
                throw ValidationError("--store is not a directory: \(Terminal.escape(store))")
            }
        }
    }

    func run() async throws {
        let presenter = Presenter(json: json)
        let store = directory
        if self.store == nil { try Self.prepareDefaultStore(store) }
        var oauth = try oauthConfiguration()
        var storedProfile: SessionProfile?
        let storeKey = try Self.storeKey(store: store, keyFile: keyFile)
        // The stored session's profile names its server: refreshes go there (a token endpoint
        // given on the command line must be the same one).
        do {
            let view = StoreView(directory: store, key: storeKey)
            if let current = (try? view.accounts().get()).flatMap({ try? view.chosen(account, in: $0) }),
                let profile = current.session.profile
            {
                if let given = oauth?.tokenEndpoint.absoluteString, let stored = profile.tokenEndpoint, given != stored {
                    throw CommandFailure(
                        message: "--token-endpoint \(Presenter.printable(given)) is not the token endpoint of the stored "
                            + "session's issuer \(Presenter.printable(profile.issuer)) (\(Presenter.printable(stored))): "
                            + "a stored token only goes to the issuer that minted it, so nothing was sent",
                        code: 64
                    ).exit()
                }
                if let given = clientID, given != profile.clientID {
                    throw CommandFailure(
                        message: "--client-id \(Presenter.printable(given)) is not the client of the stored session "
                            + "(\(Presenter.printable(profile.clientID))): a stored token only goes out with the client "
                            + "it was issued to, so nothing was sent",
                        code: 64
                    ).exit()
                }
                if oauth == nil {
                    oauth = profile.oauthConfiguration
                    storedProfile = profile
                }
            }
        }
        let refreshToken = try refreshTokenFile.map(readRefreshToken)
        let keys = !json && isatty(STDIN_FILENO) == 1 && isatty(STDOUT_FILENO) == 1
        var live = LiveWatch(
            storeDirectory: store, account: account, storeKey: storeKey, oauth: oauth, refreshToken: refreshToken,
            presenter: presenter, keys: keys)
        live.oauthProfile = storedProfile
        live.logLevel = verbosity.level
        let ending = try await live.run()
        switch ending {
        case .quit, .signedIn:
            return
        case .interrupted:
            throw ExitCode(130)
        case .failed(let message, let code):
            StandardStream.error.write(Data(Terminal.errorLine(message).utf8))
            throw ExitCode(code)
        }
    }

    /// The store's key: --key-file, else $SESSIONFLOW_KEY_FILE (checked like the store's own
    /// files), else `.automatic`. A key file that cannot be used is a usage error (exit 64)
    /// naming the file and why, never its content.
    static func storeKey(store: String?, keyFile: String?) throws -> FileCredentialStore.Key {
        let environment = ProcessInfo.processInfo.environment["SESSIONFLOW_KEY_FILE"].flatMap { $0.isEmpty ? nil : $0 }
        guard store != nil, let path = keyFile ?? environment else { return .automatic }
        let origin = keyFile != nil ? "--key-file" : "SESSIONFLOW_KEY_FILE"
        do {
            return try FileCredentialStore.Key.fromFile(path)
        } catch {
            throw ValidationError("\(origin): \(Terminal.escape(error.message))")
        }
    }

    /// The OAuth settings the options give (nil without --token-endpoint).
    private func oauthConfiguration() throws -> OAuthConfiguration? {
        guard let tokenEndpoint else { return nil }
        guard let url = URL(string: tokenEndpoint) else {
            throw ValidationError("--token-endpoint is not a URL: \(Terminal.escape(tokenEndpoint))")
        }
        return OAuthConfiguration(tokenEndpoint: url, clientID: clientID ?? "")
    }

    private func readRefreshToken(_ path: String) throws -> Secret {
        let data = path == "-" ? StandardStream.readInput() : FileManager.default.contents(atPath: path)
        guard let data else { throw ValidationError("cannot read --refresh-token-file \(Terminal.escape(path))") }
        let token = Terminal.trimmed(String(decoding: data, as: UTF8.self))
        guard !token.isEmpty else { throw ValidationError("--refresh-token-file \(Terminal.escape(path)) is empty") }
        return Secret(token)
    }
}

enum Scenario: String, CaseIterable, ExpressibleByArgument {
    /// Signed in → proactive refreshes → transient failures with backoff → revoked → expired.
    case story
    /// The network is down when the app starts with a stored session: nobody is logged out.
    case offlineStart = "offline-start"
    /// Twenty requests get a 401 with the same token at once: one refresh serves them all.
    case unauthorizedStorm = "401-storm"
    /// The user logs out while a refresh is on the wire: its late answer changes nothing.
    case logoutDuringRefresh = "logout-during-refresh"
}

extension Demo {
    /// Twenty concurrent 401s with the same token → one refresh; a straggler with the old
    /// token gets the new one without a refresh.
    func unauthorizedStorm(_ manager: SessionManager) async throws {
        try await Task.sleep(for: Duration.seconds(1).compressed(by: speed))
        let token = try await manager.freshAccessToken()
        presenter.note("20 requests come back 401 with the same token")
        let answers = try await withThrowingTaskGroup(of: Secret.self) { group in
            for _ in 0..<20 {
                group.addTask { try await manager.handleUnauthorized(token: token) }
            }
            return try await group.reduce(into: Set<Secret>()) { $0.insert($1) }
        }
        presenter.note("all 20 got \(answers.count == 1 ? "the same new token" : "\(answers.count) tokens") from one refresh")
        _ = try await manager.handleUnauthorized(token: token)
        presenter.note("a late 401 with the old token: handed the current one, no refresh")
        try await Task.sleep(for: Duration.seconds(1).compressed(by: speed))
        try await manager.logout()
        try await Task.sleep(for: .milliseconds(100))  // let the last state reach the screen
    }

    /// A refresh is on the wire (3 s to answer) when the user logs out.
    func logoutDuringRefresh(_ manager: SessionManager, authority: DemoAuthority) async throws {
        try await Task.sleep(for: Duration.seconds(1).compressed(by: speed))
        let waiting = Task { try? await manager.refreshNow() }
        try await Task.sleep(for: Duration.milliseconds(500).compressed(by: speed))
        presenter.note("logging out while the refresh is on the wire")
        try await manager.logout()
        _ = await waiting.value
        try await Task.sleep(for: Duration.seconds(3).compressed(by: speed))
        presenter.note("the refresh answered after the logout: discarded, nothing stored, still \(manager.state.value)")
    }
}

/// Ctrl-C or SIGTERM during the demo (after its cleanup).
struct DemoInterrupted: Error {}

/// One demo run: an in-process authority, a temporary store, a session, and what it says.
struct Demo {
    let scenario: Scenario
    let speed: Double
    let presenter: Presenter
    var logLevel: Logger.Level = .critical

    func play() async throws -> String {
        let lifetime = Duration.seconds(20).compressed(by: speed)
        var configuration = SessionConfiguration()
        configuration.policy.minimumInterval = Duration.milliseconds(500).compressed(by: speed)
        configuration.policy.initialBackoff = Duration.seconds(1).compressed(by: speed)
        configuration.policy.maximumBackoff = Duration.seconds(30).compressed(by: speed)
        // Compressed, but never below a second: the attempt's timeout also bounds its wait for
        // the store's refresh lease, taken on the I/O worker behind the sign-in's fsync, and a
        // loaded disk takes longer than 100 ms (speed 50) for that. Below a second the demo
        // would show the machine's load as the authority's failure.
        configuration.policy.timeout = max(Duration.seconds(5).compressed(by: speed), .seconds(1))
        configuration.storeRetryInterval = Duration.seconds(5).compressed(by: speed)
        configuration.logger = SessionConfiguration.logging(at: logLevel).logger
        let latency = Duration.milliseconds(150).compressed(by: speed)

        let directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("watch-session-demo-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // A key file (never the desktop keyring) for the demo's throwaway store.
        let store = FileCredentialStore(directory: directory, key: .keyFile)

        let plan: [DemoAuthority.Step]
        switch scenario {
        case .story:
            plan = [.grant, .grant, .transient("503 Service Unavailable"), .silent,
                    .transient("503 Service Unavailable"), .grant, .terminal("the refresh token was revoked")]
        case .unauthorizedStorm:
            plan = [.grant, .terminal("the refresh token was revoked")]
        case .logoutDuringRefresh:
            plan = [.grant]
        case .offlineStart:
            plan = [.transient("network unreachable"), .transient("network unreachable"), .grant,
                    .terminal("the refresh token was revoked")]
            try store.write(StoredSession(
                accessToken: DemoAuthority.token("access"), refreshToken: DemoAuthority.token("refresh"),
                accessTokenExpiresAt: SessionConfiguration.realtime() - .seconds(1), memberID: "demo-user"))
        }
        // Logging out during a refresh needs a refresh that takes a while to answer.
        let authority = DemoAuthority(
            plan: plan, lifetime: lifetime,
            latency: scenario == .logoutDuringRefresh ? Duration.seconds(3).compressed(by: speed) : latency)

        let loop = try EventLoop(name: "watch-session")
        let settings = configuration
        let finished = AsyncStream<String>.makeStream()
        // Made here, off the loop thread, the manager waits for the store's read (on its worker):
        // the first state shown is the stored one. It starts once the presenter listens.
        var manual = settings
        manual.startsAutomatically = false
        let manager = try SessionManager(loop: loop, authority: authority, store: store, configuration: manual)
        let subscriptions = try await loop.submit {
            let states = try manager.subscribeToSessionState(onState: { presenter.state($0) })
            let storeStatus = try manager.storeStatus.subscribe(onState: { presenter.store($0) })
            // The expiry event comes after the state change: the story ends on it.
            let events = try manager.events.subscribe(onEvent: { event in
                presenter.event(event)
                if case .sessionExpired = event {
                    presenter.note("Your session has expired. Please sign in again.")
                    finished.continuation.yield("demo finished: the session expired")
                }
            })
            return [states, storeStatus, events]
        }
        try manager.start()
        let ticker = try loop.scheduleTimer(after: .milliseconds(200), repeating: .milliseconds(200)) {
            let timing = manager.timing
            presenter.status(expiresIn: timing.expiresIn, nextRefreshIn: timing.nextRefreshIn)
        }

        // Ctrl-C and SIGTERM end the demo as they end a live watch: everything is closed, the
        // temporary store removed (the `defer` above), and the exit status is 130.
        let interrupted = LockedBox(false)
        let signals = Signals {
            interrupted.withLockedValue { $0 = true }
            finished.continuation.yield("demo interrupted")
        }
        defer { signals.stop() }
        let script = Task { [self] in
            if scenario != .offlineStart {
                try await manager.signIn(SessionTokens(
                    accessToken: DemoAuthority.token("access"), refreshToken: DemoAuthority.token("refresh"),
                    expiresIn: lifetime, memberID: "demo-user"))
            }
            switch scenario {
            case .unauthorizedStorm:
                try await unauthorizedStorm(manager)
                finished.continuation.yield("demo finished: one refresh answered twenty 401s")
            case .logoutDuringRefresh:
                try await logoutDuringRefresh(manager, authority: authority)
                finished.continuation.yield("demo finished: the late answer changed nothing")
            case .story, .offlineStart:
                break
            }
        }
        var outcome = "demo finished"
        for await line in finished.stream {
            outcome = line
            break
        }
        script.cancel()
        let scripted = await script.result
        ticker.cancel()
        for subscription in subscriptions { subscription.close() }
        await manager.close()
        try loop.shutdown()
        if interrupted.withLockedValue({ $0 }) { throw DemoInterrupted() }
        try scripted.get()
        return outcome
    }
}
