import ArgumentParser
import FoundationEssentials
import Glibc
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
        case .cancelled where error.message == "the sign-in was cancelled": interrupted
        case .cancelled: signInFailed  // ended by the library, not by the person (who gets 130)
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
    /// `--browser`: run `xdg-open` on the start URL (unless --no-open).
    let openBrowser: Bool
    /// `--dpop`: DPoP-bound tokens (RFC 9449), `.required`; else `.off`.
    var dpop: DPoPMode = .off

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
            // Looked up once, when the sign-in is prepared (the `s` of a watch signs in again
            // the same way): whether a browser is opened decides whether there is a start page.
            let opener = openBrowser ? BrowserOpener.find() : nil
            // One URL for everyone: when a browser is opened, it and the person both get the
            // start URL (nothing secret in the opener's argv, which any local user can read; a
            // second fetch ends the sign-in). When none is, the person gets the authorization
            // URL and there is no start page at all: one nothing legitimate fetches could be
            // fetched once, unnoticed, by another local program to read the state.
            method = .browser(startPage: opener != nil) { prompt in
                presenter.browserPrompt(prompt, opening: opener != nil)
                if let opener, let start = prompt.startURL { BrowserOpener.open(start, with: opener) }
            }
        }
        let sequence = SignInSequence(
            .issuer(SignInSequence.Issuer(issuer, clientID: clientID, dpop: dpop)), method: method, scope: scope)
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
        // Ours (Ctrl-C, q) says only that; one the library ended itself says why (the browser
        // flow's start page opened twice).
        case .cancelled where error.message == "the sign-in was cancelled": "the sign-in was cancelled: nothing was signed in"
        case .cancelled: "the sign-in was cancelled: \(error.message)"
        default: "sign-in failed: \(error.message)"
        }
    }
}

/// `watch-session login`: discover, sign in, watch.
struct Login: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Signs in (device flow by default), stores the session and its profile, says who signed in.",
        discussion: """
            The endpoints come from the issuer's metadata (RFC 8414, else OpenID Connect \
            Discovery). The device flow shows where to go and the code to enter, with the time \
            the code has left; approve it in any browser. --browser opens the sign-in page with \
            xdg-open (when it is on PATH; --no-open: never) through a one-time start URL, which \
            it prints too (without a browser opened: the authorization URL), and waits \
            (5 minutes at most) for the browser to come back to a listener on 127.0.0.1. Once \
            signed in, the session is stored in --store with its profile (issuer, client id, \
            requested and granted scope, endpoints: where every other command finds its server), \
            login says who signed in and exits 0. With --watch it goes on watching the session \
            as `watch-session watch` does; when it expires, s signs in again the same way.

            Ctrl-C while waiting cancels the sign-in (exit 130): nothing is signed in. When the \
            store's account is signed in already, login says so and exits 0 without a new \
            sign-in; --force signs that session out first (revoked at its own issuer, wiped).

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

    @Flag(help: ArgumentHelp(
        "Bind the tokens to a new DPoP key (RFC 9449): a stolen refresh token is useless without it.",
        discussion: "The key is made at sign-in, sealed with the session in the store and remembered in its profile; "
            + "a server that ignores DPoP (token_type Bearer) fails the sign-in."))
    var dpop = false

    @Flag(name: .customLong("no-open"), help: "With --browser: print the URL to open, do not run xdg-open.")
    var noOpen = false

    @Flag(help: "Print one JSON object per line (NDJSON): the prompt, the outcome (then, with --watch, the session's events).")
    var json = false

    @Flag(help: "Once signed in, go on watching the session live (keys on a terminal; s signs in again once it expired).")
    var watch = false

    @Flag(help: "Sign in even when the store's account is signed in already (its session is signed out first).")
    var force = false

    @OptionGroup var verbosity: VerbosityOptions

    func validate() throws {
        _ = try issuerURL()
        guard !clientID.isEmpty else { throw ValidationError("--client-id is empty") }
        if noOpen && flow != .browser { throw ValidationError("--no-open goes with --browser") }
    }

    func issuerURL() throws -> URL { try StoreOptions.issuer(issuer) }

    func run() async throws {
        let presenter = Presenter(json: json)
        let plan = SignInPlan(
            issuer: try issuerURL(), clientID: clientID, flow: flow, scope: scope, openBrowser: !noOpen,
            dpop: dpop ? .required : .off)
        let keys = !json && isatty(STDIN_FILENO) == 1 && isatty(STDOUT_FILENO) == 1
        let store = storage.directory
        if storage.store == nil { try Watch.prepareDefaultStore(store) }
        let storeKey = try storage.key()
        var live = LiveWatch(
            storeDirectory: store, account: nil, storeKey: storeKey,
            oauth: nil, refreshToken: nil, presenter: presenter, keys: keys)
        live.logLevel = verbosity.level
        live.keepsWatching = watch
        // Signed in already: say so (and watch with --watch), or with --force sign out first.
        let view = StoreView(directory: store, key: storeKey)
        if let current = (try? view.accounts().get()).flatMap({ try? view.chosen(nil, in: $0) }), current.state == .loggedIn {
            if !force {
                // Signed in at another issuer than the one named: not this account's server, and
                // a script that goes on would send its token there (`--force` replaces it).
                do throws(CommandFailure) {
                    try IssuerGuard.check(issuer, against: current)
                } catch {
                    throw error.exit()
                }
                presenter.alreadySignedIn(member: current.session.memberID, account: current.key, issuer: current.session.profile?.issuer)
                guard watch else { return }
                live.oauth = current.session.profile?.oauthConfiguration
                live.oauthProfile = current.session.profile
                try Self.end(try await live.run(), presenter: presenter, store: store)
                return
            }
            var signOut = SignOut(storeDirectory: store, storeKey: storeKey, account: current.key, issuer: nil, clientID: nil)
            signOut.configured = current.session.profile?.oauthConfiguration
            signOut.logLevel = verbosity.level
            let outcome = try await signOut.run()
            if let message = outcome.failure {
                StandardStream.error.write(Data(Terminal.errorLine(message).utf8))
                if outcome.code != ExitCodes.notRevoked { throw ExitCode(outcome.code) }
            }
        }
        live.login = plan
        try Self.end(try await live.run(), presenter: presenter, store: store)
    }

    static func end(_ ending: LiveWatch.Ending, presenter: Presenter, store: String) throws {
        switch ending {
        case .quit:
            return
        case .signedIn(let member, let account):
            presenter.signedIn(member: member, account: account, store: store)
        case .interrupted:
            throw ExitCode(ExitCodes.interrupted)
        case .failed(let message, let code):
            StandardStream.error.write(Data(Terminal.errorLine(message).utf8))
            throw ExitCode(code)
        }
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
        detachThread {
            var actions = posix_spawn_file_actions_t()
            posix_spawn_file_actions_init(&actions)
            defer { posix_spawn_file_actions_destroy(&actions) }
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
            posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
            posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
            let argv = arguments.map { strdup($0) } + [nil]
            defer { for argument in argv { free(argument) } }
            var pid: pid_t = 0
            let spawned = ChildProcess.withAttributes(newProcessGroup: true) { attributes in
                posix_spawn(&pid, opener, &actions, attributes, argv, environ)
            }
            guard spawned == 0 else { return }
            ChildProcess.wait(pid)
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
