import ArgumentParser
import FoundationEssentials
import Glibc
import Logging
import LoopFlow
import SessionCore
import SessionFileStore
import SessionOAuth

// What every command reads before it does anything: the store's accounts and their profiles
// (issuer, client, scope), read directly from the store — no session started, nothing sent.
// The commands that use a token (token, exec, credential) go on with `TokenSource`.

/// The exit codes of `status`, which `token`, `exec` and `credential` share (besides 64).
enum StatusCodes {
    static let signedIn: Int32 = 0
    static let signedOut: Int32 = 1
    static let expired: Int32 = 4
    /// The store cannot be read (a locked keyring, permissions): the session is not known.
    static let storeUnavailable: Int32 = 7
    /// A refresh was due and could not be made (the server unreachable or failing).
    static let refreshFailed: Int32 = 8
    /// watch-session itself failed, whatever the session (sysexits' EX_OSERR): its event loop
    /// or another resource of the system could not be had (too many open files, say).
    static let internalFailure: Int32 = 71
    /// The token could not be written to standard output (sysexits' EX_IOERR): closed, full,
    /// a short write.
    static let outputFailed: Int32 = 74
}

/// A failure of a command: the message for standard error and the exit code.
struct CommandFailure: Error {
    let message: String
    let code: Int32

    /// Writes the message to standard error and exits with the code.
    func exit() -> ExitCode {
        StandardStream.error.write(Data(Terminal.errorLine(message).utf8))
        return ExitCode(code)
    }
}

/// `--store`, `--key-file` and `--account`: the session a command works on.
struct AccountOptions: ParsableArguments {
    @OptionGroup var storage: StoreOptions

    @Option(help: "The account (its key: the member id it signed in with). The store's active one otherwise.")
    var account: String?

    func validate() throws {
        if account?.isEmpty == true { throw ValidationError("--account is empty") }
    }

    func view() throws -> StoreView {
        StoreView(directory: storage.directory, key: try storage.key())
    }
}

/// A store's accounts as the store holds them.
struct StoreView {
    let directory: String
    let key: FileCredentialStore.Key
    let store: FileCredentialStore

    init(directory: String, key: FileCredentialStore.Key) {
        self.directory = directory
        self.key = key
        store = FileCredentialStore(directory: directory, key: key)
    }

    struct Account {
        let key: String
        let isActive: Bool
        let session: StoredSession

        var state: SessionState {
            if session.expired { return .sessionExpired }
            return session.accessToken != nil || session.refreshToken != nil ? .loggedIn : .loggedOut
        }

        /// Who is signed in, for messages: the member id, else the account key.
        var who: String { Presenter.printable(session.memberID ?? key) }
    }

    /// Every account with a record (sorted by key), or why the store cannot be read.
    func accounts() -> Result<[Account], CommandFailure> {
        // No store yet: nobody is signed in (and nothing is created).
        guard FileManager.default.fileExists(atPath: directory) else { return .success([]) }
        switch store.readAccounts() {
        case .unavailable(let error):
            return .failure(CommandFailure(
                message: "the store \(Presenter.printable(directory)) cannot be read, so the session is not known: \(error.message)",
                code: StatusCodes.storeUnavailable))
        case .present(let stored):
            var accounts: [Account] = []
            for key in stored.keys {
                switch store.account(key, isActive: false).read() {
                case .present(let session):
                    accounts.append(Account(key: key, isActive: key == stored.active, session: session))
                case .absent, .damaged:
                    continue
                case .unavailable(let error):
                    return .failure(CommandFailure(
                        message: "the store \(Presenter.printable(directory)) cannot be read, so the session is not known: \(error.message)",
                        code: StatusCodes.storeUnavailable))
                }
            }
            return .success(accounts)
        }
    }

    /// The account named, else the active one (else the only one); nil when the store holds
    /// none. A name the store does not hold is a failure naming those it holds (exit 1).
    func chosen(_ name: String?, in accounts: [Account]) throws(CommandFailure) -> Account? {
        if let name {
            guard let account = accounts.first(where: { $0.key == name }) else {
                throw CommandFailure(message: Self.noSuchAccount(name, known: accounts.map(\.key)), code: StatusCodes.signedOut)
            }
            return account
        }
        return accounts.first(where: \.isActive) ?? (accounts.count == 1 ? accounts.first : nil)
    }

    /// What every command says of an account the store does not hold (naming those it holds).
    static func noSuchAccount(_ name: String, known: [String]) -> String {
        let known = known.map(Presenter.printable)
        return "no account \"\(Presenter.printable(name))\" in the store ("
            + (known.isEmpty ? "it holds none" : "accounts: \(known.joined(separator: ", "))") + ")"
    }

    /// `chosen` after reading the accounts.
    func chosen(_ name: String?) throws(CommandFailure) -> Account? {
        try chosen(name, in: accounts().get())
    }
}

/// A stored token only ever goes to the issuer that minted it: a flag naming another issuer
/// than the stored session's is refused before anything is sent (exit 64, both named).
enum IssuerGuard {
    static func check(_ given: String?, against account: StoreView.Account?) throws(CommandFailure) {
        guard let given, let account, let profile = account.session.profile, !profile.isIssuer(given) else { return }
        throw CommandFailure(
            message: "--issuer \(Presenter.printable(given)) is not the issuer of the stored session of "
                + "\(account.who) (\(Presenter.printable(profile.issuer))): a stored token only goes to the issuer "
                + "that minted it, so nothing was sent",
            code: 64)
    }
}

extension SessionProfile {
    /// The OAuth settings to refresh and revoke with (nil: the profile names no token endpoint).
    var oauthConfiguration: OAuthConfiguration? {
        guard let endpoint = tokenEndpoint.flatMap(URL.init(string:)) else { return nil }
        var configuration = OAuthConfiguration(tokenEndpoint: endpoint, clientID: clientID)
        configuration.revocationEndpoint = revocationEndpoint.flatMap(URL.init(string:))
        configuration.dpop = dpop ?? .off
        return configuration
    }
}

/// `--verbose` (repeatable): the library's log lines on standard error.
struct VerbosityOptions: ParsableArguments {
    @Flag(name: .shortAndLong, help: "Show the library's log lines on standard error (-v: notices, -vv: info, -vvv: debug).")
    var verbose: Int

    /// The log level for the session's configuration.
    var level: Logger.Level {
        switch verbose {
        case 0: .critical
        case 1: .notice
        case 2: .info
        default: .debug
        }
    }
}

extension SessionConfiguration {
    /// A configuration whose log lines (at `level` and above) go to standard error: standard
    /// output is for data (a token, a JSON document), never for logs.
    static func logging(at level: Logger.Level) -> SessionConfiguration {
        var configuration = SessionConfiguration()
        configuration.logger = Logger(label: "sessionflow.session") { StreamLogHandler.standardError(label: $0) }
        configuration.logger.logLevel = level
        return configuration
    }
}

/// A fresh access token of a stored session (`token`, `exec`, `credential`): a session made
/// over the account's record in the shared store, with the OAuth authority its profile names.
/// A refresh, when one is due, goes through the store's refresh lease: any number of processes
/// asking at once cause one refresh, and every one of them gets its token.
struct TokenSource {
    let view: StoreView
    let account: String?
    let logLevel: Logger.Level
    /// Refresh first when less than this is left (nil: the library's margin).
    var minimumValidity: Duration? = nil
    /// A token a server refused (git's `erase`): compare-and-refresh with it.
    var refused: Secret? = nil

    func token() async throws(CommandFailure) -> (token: Secret, account: StoreView.Account) {
        guard let chosen = try view.chosen(account) else {
            throw CommandFailure(message: "not signed in (watch-session login signs in)", code: StatusCodes.signedOut)
        }
        switch chosen.state {
        case .loggedOut:
            throw CommandFailure(message: "not signed in (watch-session login signs in)", code: StatusCodes.signedOut)
        case .sessionExpired:
            throw CommandFailure(
                message: "the session of \(chosen.who) has expired: sign in again (watch-session login)",
                code: StatusCodes.expired)
        case .loggedIn:
            break
        }
        if let stored = Self.stillValid(chosen.session, minimumValidity: minimumValidity), refused == nil {
            return (stored, chosen)
        }
        do {
            return (try await fetch(chosen), chosen)
        } catch let failure as CommandFailure {
            throw failure
        } catch let error as OAuthConfigurationError {
            // The profile names a token endpoint the authority refuses: no refresh can be made.
            throw CommandFailure(message: "the token could not be refreshed: \(error)", code: StatusCodes.refreshFailed)
        } catch {
            // Not the session's answer: the loop, the system's resources (descriptors, threads).
            throw CommandFailure(
                message: "watch-session could not run its session (nothing is known of it): \(error)",
                code: StatusCodes.internalFailure)
        }
    }

    /// The stored access token when no refresh can be due: more than the refresh margin (or
    /// `minimumValidity`, whichever is longer) left, and a second to spare. A session would hand
    /// out the same token without a request (`freshAccessToken` refreshes only within the
    /// margin), so it is not started: no loop, no store worker, no second read of the store —
    /// a `token` call then costs little more than the process's start (the bench's cli rows).
    static func stillValid(_ session: StoredSession, minimumValidity: Duration?) -> Secret? {
        guard let access = session.accessToken, !access.isBlank, !session.expired,
              let expiresAt = session.accessTokenExpiresAt else { return nil }
        let needed = max(RefreshPolicy().margin, minimumValidity ?? .zero) + .seconds(1)
        return expiresAt - SessionConfiguration.realtime() > needed ? access : nil
    }

    private func fetch(_ account: StoreView.Account) async throws -> Secret {
        let loop = try EventLoop(name: "watch-session")
        var configuration = SessionConfiguration.logging(at: logLevel)
        configuration.startsAutomatically = false
        if let minimumValidity {
            configuration.policy.margin = max(configuration.policy.margin, minimumValidity)
            configuration.policy.maximumMarginFraction = 1
        }
        // Without a profile (a session stored before profiles were kept) the token is handed
        // out while it is valid, and no refresh is sent anywhere: the issuer is not known.
        let authority: any SessionAuthority = try account.session.profile?.oauthConfiguration.map {
            try OAuthAuthority($0, loop: loop)
        } ?? LiveWatch.WatchOnly()
        let manager = try SessionManager(
            loop: loop, authority: authority, store: view.store.account(account.key, isActive: false),
            configuration: configuration)
        func close() async throws {
            await manager.close()
            try loop.shutdown()
        }
        do {
            try manager.start()
            await manager.storeRead()
            // The first look (`StoreView`) found the account signed in; the session's own read
            // of the store must agree before anything it says counts: a store it cannot read
            // is "not known" (exit 7), never "signed out".
            if case .unavailable(let error) = manager.storeStatus.value {
                try await close()
                throw Self.unreadable(error)
            }
            let token = if let refused {
                try await manager.handleUnauthorized(token: refused)
            } else {
                try await manager.freshAccessToken()
            }
            // A refresh writes the new tokens (a rotated refresh token among them) to the store:
            // the token goes out only once the store took them. The write waits for the store's
            // write lock within the store's patience; one that missed it gets a last try when the
            // session closes, and the record says whether one landed.
            await manager.storeWorkDone()
            let missed: StoreError? = if case .unavailable(let error) = manager.storeStatus.value { error } else { nil }
            try await close()
            if let missed, !Self.stored(token, in: view.store.account(account.key, isActive: false)) {
                throw CommandFailure(
                    message: "the refreshed tokens could not be stored, so no token is given out: \(missed.message). "
                        + "The new refresh token is lost with this process; if the server rotated it, the next "
                        + "refresh fails and the session must be signed in again (watch-session login)",
                    code: StatusCodes.storeUnavailable)
            }
            return token
        } catch let error as SessionError {
            let status = manager.storeStatus.value
            try await close()
            throw Self.failure(error, account: account, storeStatus: status)
        }
    }

    /// Whether the store's record of the account holds `token` (the session's write of it landed).
    private static func stored(_ token: Secret, in store: any CredentialStore) -> Bool {
        guard case .present(let session) = store.read() else { return false }
        return session.accessToken == token
    }

    /// The session's own read of the store failed (after the first look found the account).
    static func unreadable(_ error: StoreError) -> CommandFailure {
        CommandFailure(
            message: "the session could not read the store, so the session is not known: \(error.message)",
            code: StatusCodes.storeUnavailable)
    }

    static func failure(_ error: SessionError, account: StoreView.Account, storeStatus: StoreStatus) -> CommandFailure {
        // Signed out only when the store says so: a session that could not read it knows nothing.
        if case .unavailable(let storeError) = storeStatus, error.code == .notLoggedIn {
            return unreadable(storeError)
        }
        return switch error.code {
        case .notLoggedIn:
            CommandFailure(message: "not signed in (watch-session login signs in)", code: StatusCodes.signedOut)
        case .sessionExpired, .sessionEnded:
            CommandFailure(
                message: "the session of \(account.who) has expired: sign in again (watch-session login)",
                code: StatusCodes.expired)
        case .storeUnavailable, .store:
            CommandFailure(message: "the store cannot be read or written: \(error.message)", code: StatusCodes.storeUnavailable)
        case .shutDown:
            CommandFailure(
                message: "watch-session could not run its session: \(error.message)", code: StatusCodes.internalFailure)
        case .configuration where account.session.profile == nil:
            CommandFailure(
                message: "the token of \(account.who) needs a refresh, but the store does not say which issuer minted "
                    + "it (signed in before profiles were kept): sign in again with watch-session login",
                code: StatusCodes.refreshFailed)
        default:
            CommandFailure(message: "the token could not be refreshed: \(error.message)", code: StatusCodes.refreshFailed)
        }
    }
}
