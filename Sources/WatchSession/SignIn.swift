import ArgumentParser
import Foundation
import LoopFlow
import SessionCore
import SessionFileStore
import SessionOAuth

/// The exit codes beside 0 (done) and 64 (bad usage).
enum ExitCodes {
    static let failed: Int32 = 1
    /// The issuer's metadata could not be had or was refused.
    static let discovery: Int32 = 2
    /// The user (or the server) refused the sign-in.
    static let denied: Int32 = 3
    /// The code (device) or the wait (browser) ran out before the sign-in was approved.
    static let expired: Int32 = 4
    /// Any other sign-in failure (the server, the network, the configuration).
    static let signInFailed: Int32 = 5
    /// Signed out here, but the server did not confirm the revocation.
    static let notRevoked: Int32 = 6
    /// Ctrl-C (or q while a first sign-in waits): cancelled.
    static let interrupted: Int32 = 130

    static func code(for error: SessionError) -> Int32 {
        switch error.code {
        case .accessDenied: denied
        case .signInExpired: expired
        case .cancelled: interrupted
        default: signInFailed
        }
    }
}

/// How `watch-session login` signs in: the issuer to discover, the client, the flow.
struct SignInPlan: Sendable {
    enum Flow: String, Sendable, EnumerableFlag {
        /// The device authorization grant (RFC 8628): a code to enter on another device.
        case device
        /// The authorization code grant with PKCE on a loopback redirect: a browser on this machine.
        case browser

        static func help(for value: Flow) -> ArgumentHelp? {
            switch value {
            case .device: "Sign in with the device flow (RFC 8628): enter a code in a browser anywhere (the default)."
            case .browser:
                "Sign in in a browser on this machine (authorization code with PKCE; it comes back to a loopback listener)."
            }
        }
    }

    let issuer: URL
    let clientID: String
    let flow: Flow
    let scope: String?
    /// `--browser`: run `xdg-open` on the authorization URL (unless --no-open).
    let openBrowser: Bool

    /// Why no sign-in could start: a message and the exit code.
    struct Failure: Error {
        let message: String
        let code: Int32
    }

    /// The sign-in sequence (SessionOAuth), its configuration settled before anything is
    /// shown: the issuer's endpoints discovered (RFC 8414, OpenID Connect Discovery as the
    /// fallback) and checked against the flow, so a metadata document without the flow's
    /// endpoint is an error up front. Each sign-in (the first, and each `s`) runs it. Only the
    /// words and exit codes are the CLI's.
    func prepare(on loop: EventLoop, presenter: Presenter) async throws(Failure) -> SignInSequence {
        let method: SignInSequence.Method
        switch flow {
        case .device:
            method = .device { prompt in presenter.devicePrompt(prompt) }
        case .browser:
            let open = openBrowser
            method = .browser(timeout: .seconds(300)) { prompt in
                // Looked up each time: PATH is the user's, and xdg-open may come and go.
                let opener = open ? BrowserOpener.find() : nil
                presenter.browserPrompt(prompt, opening: opener != nil)
                if let opener { BrowserOpener.open(prompt.authorizationURL, with: opener) }
            }
        }
        let sequence = SignInSequence(.issuer(SignInSequence.Issuer(issuer, clientID: clientID)), method: method, scope: scope)
        do {
            return try await sequence.prepared(on: loop)
        } catch {
            switch error {
            case .discovery(let error, _):
                throw Failure(message: Self.explain(error, issuer: issuer), code: ExitCodes.discovery)
            case .unusable(let error, _):
                let endpoint = flow == .device ? "device_authorization_endpoint" : "authorization_endpoint"
                throw Failure(
                    message: "the metadata of \(Presenter.printable(issuer.absoluteString)) cannot serve the \(flow.rawValue) flow "
                        + "(\(endpoint)): \(error)",
                    code: ExitCodes.discovery)
            }
        }
    }

    static func explain(_ error: OAuthDiscoveryError, issuer: URL) -> String {
        let at = Presenter.printable(issuer.absoluteString)
        if let field = error.field, error.kind == .metadata {
            return "discovery at \(at) refused the metadata's \(field): \(error.message)"
        }
        return "discovery at \(at) failed: \(error.message)"
    }

    /// A failed sign-in in words (the flows' messages never carry a secret).
    static func explain(_ error: SessionError) -> String {
        switch error.code {
        case .accessDenied: "sign-in denied: \(error.message)"
        case .signInExpired: "sign-in expired: \(error.message)"
        case .cancelled: "the sign-in was cancelled: nothing was signed in"
        default: "sign-in failed: \(error.message)"
        }
    }
}

/// `watch-session login`: discover, sign in, watch.
struct Login: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Signs in (device flow by default), stores the session, then watches it live.",
        discussion: """
            The endpoints come from the issuer's metadata (RFC 8414, else OpenID Connect \
            Discovery). The device flow shows where to go and the code to enter, with the time \
            the code has left; approve it in any browser. --browser opens the authorization page \
            with xdg-open (when it is on PATH; --no-open: never) and prints its URL, and waits \
            (5 minutes at most) for the browser to come back to a listener on 127.0.0.1. Once signed in, the session is stored \
            in --store (where every other mode and process finds it) and watched as \
            `watch-session --store DIR` does; when it expires, s signs in again the same way.

            Ctrl-C while waiting cancels the sign-in (exit 130): nothing is signed in. A \
            session already signed in in the store is left alone (exit 1: log out first).

            Examples:
              watch-session login --issuer https://auth.example.com --client-id my-app [--store DIR]
              watch-session login --issuer https://auth.example.com --client-id my-app --store DIR --json
              watch-session login --browser --issuer https://auth.example.com --client-id my-app --store DIR
            """)

    @Option(help: "The authorization server's issuer URL (its metadata tells the endpoints).")
    var issuer: String

    @Option(name: .customLong("client-id"), help: "OAuth 2.0 client id (a public client).")
    var clientID: String

    @Flag(help: "How to sign in.")
    var flow: SignInPlan.Flow = .device

    @OptionGroup var storage: StoreOptions

    @Option(help: "The scope to ask for (space-separated).")
    var scope: String?

    @Flag(name: .customLong("no-open"), help: "With --browser: print the URL to open, do not run xdg-open.")
    var noOpen = false

    @Flag(help: "Print one JSON object per line (NDJSON): the prompt, the outcome, then the session's events.")
    var json = false

    func validate() throws {
        _ = try issuerURL()
        guard !clientID.isEmpty else { throw ValidationError("--client-id is empty") }
        if noOpen && flow != .browser { throw ValidationError("--no-open goes with --browser") }
    }

    func issuerURL() throws -> URL { try StoreOptions.issuer(issuer) }

    func run() async throws {
        let presenter = Presenter(json: json)
        let plan = SignInPlan(issuer: try issuerURL(), clientID: clientID, flow: flow, scope: scope, openBrowser: !noOpen)
        let keys = !json && isatty(STDIN_FILENO) == 1 && isatty(STDOUT_FILENO) == 1
        let store = storage.directory
        if storage.store == nil { try Watch.prepareDefaultStore(store) }
        var watch = LiveWatch(
            storeDirectory: store, account: nil, storeKey: try storage.key(),
            oauth: nil, refreshToken: nil, presenter: presenter, keys: keys)
        watch.login = plan
        switch try await watch.run() {
        case .quit:
            return
        case .interrupted:
            throw ExitCode(ExitCodes.interrupted)
        case .failed(let message, let code):
            FileHandle.standardError.write(Data(Terminal.errorLine(message).utf8))
            throw ExitCode(code)
        }
    }
}

/// `watch-session logout`: revoke, wipe, say so.
struct Logout: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Signs the stored session out: revokes its refresh token (RFC 7009) and wipes it from the store.",
        discussion: """
            With --issuer and --client-id the revocation endpoint comes from the issuer's metadata \
            (discovery, as login does) and the refresh token is revoked there; without them the \
            session is only wiped here, and the token stays valid at the server until it expires \
            (the store keeps no server settings). Other processes watching the store see the \
            sign-out at once.

            Exit codes: 0 signed out (or nothing to sign out), 1 the store could not be read or \
            changed, 2 discovery failed (nothing was changed), 6 signed out here but the server \
            did not confirm the revocation.
            """)

    @OptionGroup var storage: StoreOptions

    @Option(help: "The account to sign out (the store's active one otherwise).")
    var account: String?

    @Option(help: "The issuer whose revocation endpoint revokes the refresh token (with --client-id).")
    var issuer: String?

    @Option(name: .customLong("client-id"), help: "OAuth 2.0 client id (with --issuer).")
    var clientID: String?

    @Flag(help: "Print the outcome as one JSON object (NDJSON).")
    var json = false

    func validate() throws {
        if (issuer == nil) != (clientID == nil) {
            throw ValidationError(issuer == nil ? "--client-id needs --issuer" : "--issuer needs --client-id")
        }
        if account?.isEmpty == true { throw ValidationError("--account is empty") }
        _ = try issuerURL()
    }

    func issuerURL() throws -> URL? { try issuer.map(StoreOptions.issuer) }

    func run() async throws {
        let presenter = Presenter(json: json)
        let outcome = try await SignOut(
            storeDirectory: storage.directory, storeKey: try storage.key(), account: account,
            issuer: try issuerURL(), clientID: clientID
        ).run()
        presenter.signOut(outcome)
        if let message = outcome.failure {
            FileHandle.standardError.write(Data(Terminal.errorLine(message).utf8))
        }
        if outcome.code != 0 { throw ExitCode(outcome.code) }
    }
}

/// One sign-out: discovery (if asked), the store read, `SessionManager.logout()` (store wiped,
/// then the refresh token revoked), waiting for the revocation's answer.
struct SignOut {
    let storeDirectory: String
    let storeKey: FileCredentialStore.Key
    let account: String?
    let issuer: URL?
    let clientID: String?

    struct Outcome: Sendable {
        /// Who was signed out (nil: nobody was).
        var member: String?
        var account: String?
        var wasSignedIn = false
        /// The state the session had (loggedIn, sessionExpired, loggedOut).
        var previousState: SessionState = .loggedOut
        var revocationEndpoint: String?
        var issuerGiven = false
        /// nil: not attempted.
        var revoked: Bool?
        var revocationError: String?
        var remainingAccounts: [String] = []
        var failure: String?
        var code: Int32 = 0
    }

    func run() async throws -> Outcome {
        var outcome = Outcome()
        outcome.issuerGiven = issuer != nil
        guard FileManager.default.fileExists(atPath: storeDirectory) else {
            return outcome  // no store: nobody to sign out, and nothing is created
        }
        let loop = try EventLoop(name: "watch-session")
        var oauth: OAuthConfiguration?
        if let issuer, let clientID {
            do {
                oauth = try await OAuthDiscovery.configuration(issuer: issuer, clientID: clientID, loop: loop)
            } catch {
                try loop.shutdown()
                outcome.failure = SignInPlan.explain(error, issuer: issuer) + " (nothing was changed; without --issuer the "
                    + "session is wiped here only)"
                outcome.code = ExitCodes.discovery
                return outcome
            }
            outcome.revocationEndpoint = oauth?.revocationEndpoint?.absoluteString
        }
        let witness = RevocationWitness(try oauth.map { configuration throws in try OAuthAuthority(configuration, loop: loop) })
        var configuration = SessionConfiguration()
        configuration.logger.logLevel = .critical
        configuration.startsAutomatically = false
        let manager = try SessionManager(
            loop: loop, authority: witness, store: FileCredentialStore(directory: storeDirectory, key: storeKey),
            configuration: configuration)
        try manager.start()
        await manager.storeRead()
        func close() async throws {
            await manager.close()
            try loop.shutdown()
        }
        if case .unavailable(let error) = manager.storeStatus.value {
            try await close()
            outcome.failure = "the store cannot be read, so nothing was signed out: \(error.message)"
            outcome.code = ExitCodes.failed
            return outcome
        }
        // The account named (left where it is: the active one stays active), else the active one.
        let named = account.flatMap { key in manager.accounts.first { $0.key == key } }
        if let account, named == nil {
            let known = manager.accounts.map { Presenter.printable($0.key) }
            try await close()
            outcome.failure = "no account \"\(Presenter.printable(account))\" in the store ("
                + (known.isEmpty ? "it holds none" : "accounts: \(known.joined(separator: ", "))") + ")"
            outcome.code = ExitCodes.failed
            return outcome
        }
        outcome.previousState = named?.state ?? manager.state.value
        guard outcome.previousState != .loggedOut else {
            try await close()
            return outcome
        }
        outcome.member = named?.memberID ?? manager.memberID
        outcome.account = named?.key ?? manager.accounts.first(where: \.isActive)?.key
        do {
            if let named {
                try await manager.logout(account: named.key)
            } else {
                try await manager.logout()
            }
        } catch {
            try await close()
            outcome.failure = "the sign-out failed: \(error.message)"
            outcome.code = ExitCodes.failed
            return outcome
        }
        outcome.wasSignedIn = true
        outcome.remainingAccounts = manager.accounts.map(\.key)
        // The revocation was sent inside the logout (the store's clear came first); its answer
        // arrives on the loop, which stays up until then (the request has its own deadline).
        if let result = await witness.result() {
            switch result {
            case .success:
                outcome.revoked = true
            case .failure(let error):
                outcome.revoked = false
                outcome.revocationError = error.message
                outcome.failure = "signed out here, but the revocation failed: \(error.message) "
                    + "(the refresh token may stay valid at the server until it expires)"
                outcome.code = ExitCodes.notRevoked
            }
        }
        try await close()
        return outcome
    }
}

/// The OAuth authority (or none) with the revocation's answer made visible: `logout` revokes
/// best effort and tells nobody; the CLI says what happened.
final class RevocationWitness: SessionAuthority, @unchecked Sendable {
    private let inner: (any SessionAuthority)?
    private let answers = AsyncStream<Result<Void, AuthorityError>>.makeStream()
    private let started = LockedBox(false)

    init(_ inner: (any SessionAuthority)?) {
        self.inner = inner
    }

    func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
        guard let inner else {
            completion.fail(.configuration("watch_only", "no issuer given: signing out only"))
            return
        }
        inner.refresh(request, completion: completion)
    }

    var canRevoke: Bool { inner?.canRevoke ?? false }

    func revoke(refreshToken: Secret?, accessToken: Secret?, completion: AuthorityCompletion<Void>) {
        guard let inner else {
            completion.succeed(())
            return
        }
        started.withLockedValue { $0 = true }
        let answers = self.answers.continuation
        inner.revoke(refreshToken: refreshToken, accessToken: accessToken, completion: .standalone { result in
            _ = completion.complete(result)
            answers.yield(result)
        })
    }

    /// The revocation's answer, or nil when none was sent.
    func result() async -> Result<Void, AuthorityError>? {
        guard started.withLockedValue({ $0 }) else { return nil }
        for await answer in answers.stream { return answer }
        return nil
    }
}

/// Runs `xdg-open URL` as a child of its own (stdin, stdout and stderr on /dev/null, its own
/// process group so a Ctrl-C on the terminal does not reach it, default signal handling), never
/// blocking the loop: a detached thread waits for it.
enum BrowserOpener {
    /// `xdg-open` on PATH, if it is there and executable.
    static func find() -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? ""
        for directory in path.split(separator: ":") where !directory.isEmpty {
            let candidate = "\(directory)/xdg-open"
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        }
        return nil
    }

    static func open(_ url: URL, with opener: String) {
        let arguments = [opener, url.absoluteString]
        Thread.detachNewThread {
            var actions = posix_spawn_file_actions_t()
            posix_spawn_file_actions_init(&actions)
            defer { posix_spawn_file_actions_destroy(&actions) }
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
            posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
            posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
            var attributes = posix_spawnattr_t()
            posix_spawnattr_init(&attributes)
            defer { posix_spawnattr_destroy(&attributes) }
            var defaults = sigset_t()
            sigemptyset(&defaults)
            sigaddset(&defaults, SIGINT)
            sigaddset(&defaults, SIGTERM)
            posix_spawnattr_setsigdefault(&attributes, &defaults)
            var none = sigset_t()
            sigemptyset(&none)
            posix_spawnattr_setsigmask(&attributes, &none)
            posix_spawnattr_setpgroup(&attributes, 0)
            posix_spawnattr_setflags(
                &attributes, Int16(POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETPGROUP))
            let argv = arguments.map { strdup($0) } + [nil]
            defer { for argument in argv { free(argument) } }
            var pid: pid_t = 0
            guard posix_spawn(&pid, opener, &actions, &attributes, argv, environ) == 0 else { return }
            var status: Int32 = 0
            while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
        }
    }
}

/// `--store` and `--key-file` of `login` and `logout` (the default store when `--store` is not
/// given), checked as every mode checks them.
struct StoreOptions: ParsableArguments {
    @Option(help: ArgumentHelp(
        "The encrypted file store that keeps the session (the one `watch-session --store DIR` watches).",
        discussion: "Default: $XDG_STATE_HOME/watch-session (~/.local/state/watch-session)."))
    var store: String?

    @Option(
        name: .customLong("key-file"),
        help: ArgumentHelp(
            "A file holding the store's key (32 bytes or 64 hex digits; yours, mode 0600).",
            discussion: "Default: $SESSIONFLOW_KEY_FILE; without either, the Secret Service or a key file beside the store."))
    var keyFile: String?

    /// `--store`, or the default one.
    var directory: String { store ?? Watch.defaultStoreDirectory() }

    func key() throws -> FileCredentialStore.Key { try Watch.storeKey(store: directory, keyFile: keyFile) }

    func validate() throws {
        try Watch.validateStore(directory, keyFile: keyFile)
    }

    /// `--issuer` as a URL discovery can use (exit 64 naming the problem otherwise).
    static func issuer(_ text: String) throws -> URL {
        guard let url = URL(string: text) else { throw ValidationError("--issuer is not a URL: \(Presenter.printable(text))") }
        do {
            _ = try OAuthDiscovery.wellKnownLocations(url)
        } catch {
            throw ValidationError("--issuer: \(Terminal.escape("\(error)"))")
        }
        return url
    }
}
