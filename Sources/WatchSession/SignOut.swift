import ArgumentParser
import FoundationEssentials
import Glibc
import Logging
import LoopFlow
import SessionCore
import SessionFileStore
import SessionOAuth

// `watch-session logout`: the command, the sign-out it runs and the witness of its revocation.
// Apart from SignIn.swift (login), which shares only ExitCodes, StoreOptions and the words
// of a failed discovery (SignInPlan.explain) with it.

/// `watch-session logout`: revoke, wipe, say so.
struct Logout: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Signs the stored session out: revokes its refresh token (RFC 7009) and wipes it from the store.",
        discussion: """
            The refresh token is revoked at the revocation endpoint of the issuer that minted it, \
            which the store keeps with the session (login stores it), then the session is wiped. \
            An --issuer other than the stored one is refused (exit 64, nothing sent): a stored \
            token only goes to its own issuer. For a session stored without a profile, --issuer \
            and --client-id find the revocation endpoint by discovery; without them it is only \
            wiped here, and the token stays valid at the server until it expires. Other \
            processes watching the store see the sign-out at once.

            Exit codes: 0 signed out (or nothing to sign out), 1 the store could not be read or \
            changed, 2 discovery failed (nothing was changed), 6 signed out here but the server \
            did not confirm the revocation, 64 bad usage (another issuer than the stored one).
            """)

    @OptionGroup var storage: StoreOptions

    @Option(help: "The account to sign out (the store's active one otherwise).")
    var account: String?

    @Option(help: "The issuer whose revocation endpoint revokes the refresh token (only for a session stored without a profile; with --client-id). Checked against the stored issuer otherwise.")
    var issuer: String?

    @Option(name: .customLong("client-id"), help: "OAuth 2.0 client id (with --issuer).")
    var clientID: String?

    @OptionGroup var verbosity: VerbosityOptions

    @Flag(help: "Print the outcome as one JSON object (NDJSON).")
    var json = false

    func validate() throws {
        if issuer == nil && clientID != nil { throw ValidationError("--client-id needs --issuer") }
        if account?.isEmpty == true { throw ValidationError("--account is empty") }
        _ = try issuerURL()
    }

    func issuerURL() throws -> URL? { try issuer.map(StoreOptions.issuer) }

    func run() async throws {
        let presenter = Presenter(json: json)
        // The session to sign out, read first: its profile says where its token goes.
        let view = StoreView(directory: storage.directory, key: try storage.key())
        let target = (try? view.accounts().get()).flatMap { try? view.chosen(account, in: $0) }
        let profile = target?.session.profile
        do throws(CommandFailure) {
            try IssuerGuard.check(issuer, against: target)
            if let profile, let clientID, clientID != profile.clientID {
                throw CommandFailure(
                    message: "--client-id \(Presenter.printable(clientID)) is not the client of the stored session "
                        + "(\(Presenter.printable(profile.clientID))): nothing was sent",
                    code: 64)
            }
            if profile == nil && issuer != nil && clientID == nil {
                throw CommandFailure(message: "--issuer needs --client-id (the store keeps no profile for this session)", code: 64)
            }
        } catch {
            throw error.exit()
        }
        var signOut = SignOut(
            storeDirectory: view.directory, storeKey: view.key, account: account,
            issuer: profile == nil ? try issuerURL() : nil, clientID: profile == nil ? clientID : nil)
        signOut.configured = profile?.oauthConfiguration
        signOut.logLevel = verbosity.level
        let outcome = try await signOut.run()
        presenter.signOut(outcome)
        if let message = outcome.failure {
            StandardStream.error.write(Data(Terminal.errorLine(message).utf8))
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
    /// Where to revoke without discovery: the stored session's profile (`issuer` nil then).
    var configured: OAuthConfiguration? = nil
    var logLevel: Logger.Level = .critical

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
        outcome.issuerGiven = issuer != nil || configured != nil
        guard FileManager.default.fileExists(atPath: storeDirectory) else {
            return outcome  // no store: nobody to sign out, and nothing is created
        }
        let loop = try EventLoop(name: "watch-session")
        var oauth = configured
        outcome.revocationEndpoint = configured?.revocationEndpoint?.absoluteString
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
        // The other accounts of the store are refreshed by this session too while it runs: only
        // those of this issuer go to it; the revocation goes there only if the signed-out
        // session's profile (read when it is signed out) names it — or, without a profile, if
        // the command line named the server.
        let accounts = (try? StoreView(directory: storeDirectory, key: storeKey).accounts().get()) ?? []
        let serverNamed = issuer != nil && clientID != nil
        let witness = RevocationWitness(try oauth.map { configuration throws in
            IssuerBoundAuthority(
                try OAuthAuthority(configuration, loop: loop), tokenEndpoint: configuration.tokenEndpoint.absoluteString,
                clientID: configuration.clientID, adoptsSessionsWithoutProfile: serverNamed, accounts: accounts)
        })
        var configuration = SessionConfiguration.logging(at: logLevel)
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
            let known = manager.accounts.map(\.key)
            try await close()
            outcome.failure = StoreView.noSuchAccount(account, known: known)
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
            // By key, the one read above: the active account may change meanwhile.
            if let key = outcome.account {
                try await manager.logout(account: key)
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
        revoke(refreshToken: refreshToken, accessToken: accessToken, profile: nil, completion: completion)
    }

    func revoke(
        refreshToken: Secret?, accessToken: Secret?, profile: SessionProfile?, completion: AuthorityCompletion<Void>
    ) {
        guard let inner else {
            completion.succeed(())
            return
        }
        started.withLockedValue { $0 = true }
        let answers = self.answers.continuation
        inner.revoke(refreshToken: refreshToken, accessToken: accessToken, profile: profile, completion: .standalone { result in
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
