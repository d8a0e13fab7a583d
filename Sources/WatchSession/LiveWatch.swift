import FoundationEssentials
import Glibc
import Logging
import LoopFlow
import SessionCore
import SessionFileStore
import SessionOAuth

/// Watching a real session: a file store other processes use, and/or a real OAuth 2.0
/// server. Runs until `q`, Ctrl-C (exit 130) or SIGTERM. With `login`, it first discovers the
/// issuer's endpoints and signs in with a flow (`watch-session login`).
struct LiveWatch {
    let storeDirectory: String?
    /// The account to follow (nil: the store's active one).
    let account: String?
    let storeKey: FileCredentialStore.Key
    var oauth: OAuthConfiguration?
    /// The stored profile `oauth` was taken from (nil: the command line named the server, whose
    /// it is then for the sessions without a profile too: `IssuerBoundAuthority`).
    var oauthProfile: SessionProfile? = nil
    let refreshToken: Secret?
    let presenter: Presenter
    let keys: Bool
    /// Sign in with a flow first (`watch-session login`); `s` signs in again the same way.
    var login: SignInPlan? = nil
    /// After `login`'s first sign-in: go on watching (`--watch`), or end (`.signedIn`).
    var keepsWatching = true
    /// The library's log level (`--verbose`).
    var logLevel: Logger.Level = .critical

    enum Ending: Sendable {
        case quit
        /// `login` signed in and does not watch: who, under which account key.
        case signedIn(member: String?, account: String?)
        case interrupted
        /// A message for standard error and the exit code.
        case failed(String, code: Int32 = 1)
    }

    /// What wakes the watch up.
    private enum Wake: Sendable {
        case end(Ending)
        case signedIn(Result<Void, SessionError>)
        case signInAgain
    }

    /// Refreshes fail as a configuration matter: this process only watches.
    struct WatchOnly: SessionAuthority {
        func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
            completion.fail(.configuration("watch_only", "no token endpoint given (--token-endpoint): watching only"))
        }
    }

    /// A phase that ends the run before the watch: the ending to report.
    private struct Stop: Error {
        let ending: Ending
    }

    /// Makes the sign-in flow `login` asked for (nil: no flow; the watch cannot sign in).
    private typealias FlowMaker = @Sendable () throws -> any SignInFlow

    /// What the run has opened once the session is up, closed by `close` alone.
    private struct Session {
        let loop: EventLoop
        let manager: SessionManager
        /// The authority itself (a refresh token given on the side is exchanged with it).
        let authority: any SessionAuthority
        let subscriptions: [FlowSubscription]
    }

    /// In phases: discover (`login`), open the session, check it may be watched, watch. Every
    /// way out goes through the one teardown at the end (`close`).
    func run() async throws -> Ending {
        // Ctrl-C and SIGTERM are heard from the start (a signal before the watch loop waits is
        // kept in the stream, not lost: it never kills the process half-way).
        let wake = AsyncStream<Wake>.makeStream()
        let signals = Signals { wake.continuation.yield(.end(.interrupted)) }
        defer { signals.stop() }
        let loop = try EventLoop(name: "watch-session")
        var session: Session?
        let ending: Ending
        do {
            let granted = LockedBox<String?>(nil)
            let (oauth, flowMaker) = try await discover(on: loop, granted: granted)
            let canSignInAgain = flowMaker != nil && keys && keepsWatching
            let opened = try await open(on: loop, oauth: oauth, canSignInAgain: canSignInAgain)
            session = opened
            try opened.manager.start()
            try await preflight(opened, signsIn: flowMaker != nil)
            let recorder: ProfileRecorder? = login.flatMap { plan in
                oauth.map { ProfileRecorder(plan: plan, oauth: $0, granted: granted, storeDirectory: storeDirectory, storeKey: storeKey) }
            }
            ending = try await watch(
                opened, flowMaker: flowMaker, canSignInAgain: canSignInAgain, recorder: recorder, wake: wake)
        } catch let stop as Stop {
            ending = stop.ending
        } catch {
            try? await close(session, loop)
            throw error
        }
        try await close(session, loop)
        return ending
    }

    /// `login`: the endpoints come from the issuer's metadata, before anything else.
    private func discover(on loop: EventLoop, granted: LockedBox<String?>) async throws(Stop) -> (OAuthConfiguration?, FlowMaker?) {
        guard let login else { return (oauth, nil) }
        do throws(SignInPlan.Failure) {
            let sequence = try await login.prepare(on: loop, presenter: presenter)
            return (sequence.configuration, { ScopeCapture(inner: sequence, granted: granted) })
        } catch {
            throw Stop(ending: .failed(error.message, code: error.code))
        }
    }

    /// The session, its store and authority, with the presenter listening (not started yet).
    private func open(on loop: EventLoop, oauth: OAuthConfiguration?, canSignInAgain: Bool) async throws -> Session {
        // A store that cannot be read is watched all the same: `STORE → unavailable` says so
        // (the state says loggedOut, but the stored session is not known), and the session is
        // restored when the store can be read again.
        let store: any CredentialStore = storeDirectory.map { FileCredentialStore(directory: $0, key: storeKey) } ?? MemoryCredentialStore()
        var configuration = SessionConfiguration.logging(at: logLevel)
        // Made here, off the loop thread, the manager waits for the store's read (on its worker):
        // the first state shown is the stored one. It starts once the presenter listens.
        configuration.startsAutomatically = false
        let authority: any SessionAuthority = try oauth.map { configuration throws in
            try OAuthAuthority(configuration, loop: loop)
        } ?? WatchOnly()
        // Every account of the store is refreshed by this session: only those of this issuer here.
        let bound = oauth.flatMap { oauth in
            storeDirectory.map { directory in
                IssuerBoundAuthority(
                    authority, tokenEndpoint: oauth.tokenEndpoint.absoluteString, clientID: oauth.clientID,
                    adoptsSessionsWithoutProfile: oauthProfile == nil,
                    accounts: (try? StoreView(directory: directory, key: storeKey).accounts().get()) ?? [])
            }
        }
        let manager = try SessionManager(
            loop: loop, authority: bound ?? authority, store: store, configuration: configuration)
        let presenter = self.presenter
        let subscriptions = try await loop.submit {
            let states = try manager.subscribeToSessionState(onState: { presenter.state($0) })
            let storeStatus = try manager.storeStatus.subscribe(onState: { presenter.store($0) })
            let events = try manager.events.subscribe(onEvent: { event in
                presenter.event(event)
                if canSignInAgain, case .sessionExpired = event {
                    presenter.note("the session expired: press s to sign in again")
                }
            })
            return [states, storeStatus, events]
        }
        return Session(loop: loop, manager: manager, authority: authority, subscriptions: subscriptions)
    }

    /// Before watching: the account asked for must exist; for `login`, the stored session must
    /// be known first (a sign-in would replace it), and nobody may be signed in already.
    private func preflight(_ session: Session, signsIn: Bool) async throws(Stop) {
        let manager = session.manager
        if let account {
            do {
                try await manager.switchAccount(to: account)
            } catch {
                throw Stop(ending: .failed(StoreView.noSuchAccount(account, known: manager.accounts.map(\.key))))
            }
        }
        guard signsIn else { return }
        await manager.storeRead()
        if case .unavailable(let error) = manager.storeStatus.value {
            throw Stop(ending: .failed("the store cannot be read, so the stored session is not known: \(error.message)"))
        }
        if manager.state.value == .loggedIn {
            let who = manager.memberID.map { " as \(Presenter.printable($0))" } ?? ""
            throw Stop(ending: .failed("already signed in\(who) in \(storeDirectory ?? "the store"): "
                + "sign out first (watch-session logout --store DIR)"))
        }
    }

    /// The watch: accounts and timings on screen, the keys, sign-ins, until an ending. A sign-in
    /// still running at the end is cancelled and waited for (its request, its timers end before
    /// the loop goes).
    private func watch(
        _ session: Session, flowMaker: FlowMaker?, canSignInAgain: Bool, recorder: ProfileRecorder?, wake: (stream: AsyncStream<Wake>, continuation: AsyncStream<Wake>.Continuation)
    ) async throws -> Ending {
        let manager = session.manager
        let presenter = self.presenter
        // The accounts, shown at start and whenever the list changes.
        let shownAccounts = LockedBox<[SessionAccount]?>(nil)
        let showAccounts: @Sendable () -> Void = {
            let now = manager.accounts
            let changed = shownAccounts.withLockedValue { shown -> Bool in
                defer { shown = now }
                return shown != now
            }
            if changed { presenter.accounts(now) }
        }
        showAccounts()
        let ticker = try session.loop.scheduleTimer(after: .milliseconds(250), repeating: .milliseconds(250)) {
            let timing = manager.timing
            presenter.status(expiresIn: timing.expiresIn, nextRefreshIn: timing.nextRefreshIn)
            showAccounts()
        }
        defer { ticker.cancel() }

        // A refresh token given on the side: exchange it for a session.
        if let refreshToken, manager.state.value != .loggedIn {
            do {
                let grant = try await firstGrant(session, refreshToken)
                // Minted by the server `oauth` names: the session says so, as a login's does.
                var profile = oauthProfile
                if let granted = grant.scope { profile?.grantedScope = granted }
                try await manager.signIn(SessionTokens(
                    accessToken: grant.accessToken, refreshToken: grant.refreshToken ?? refreshToken,
                    expiresIn: grant.expiresIn, memberID: grant.memberID, profile: profile))
            } catch {
                presenter.note("sign-in with the refresh token failed: \(error)")
            }
        }

        let keyboard = keys ? Self.keyboard(manager, presenter, wake.continuation, canSignInAgain: canSignInAgain) : nil
        defer { keyboard?.stop() }
        let keyHelp = "keys: " + (canSignInAgain ? "s sign in again · " : "")
            + "l logout · r refresh now · u simulate a 401 · a next account · q quit"

        // A sign-in with the flow runs in a task of its own; cancelling it cancels the flow.
        var signingIn: Task<Void, Never>?
        var firstSignIn = flowMaker != nil
        func startSignIn() {
            guard let flowMaker else { return }
            let flow: any SignInFlow
            do {
                flow = try flowMaker()
            } catch {
                wake.continuation.yield(.signedIn(.failure(SessionError(.configuration, "\(error)"))))
                return
            }
            signingIn = Task {
                let result: Result<Void, SessionError>
                do throws(SessionError) {
                    try await manager.signIn(with: flow)
                    result = .success(())
                } catch {
                    result = .failure(error)
                }
                wake.continuation.yield(.signedIn(result))
            }
        }
        if firstSignIn {
            startSignIn()
        } else if keys {
            presenter.note(keyHelp)
        }

        var result = Ending.quit
        loop: for await reason in wake.stream {
            switch reason {
            case .end(let ending):
                result = ending
                if firstSignIn {
                    // Ctrl-C or q while the first sign-in waits: cancelled, nothing signed in.
                    result = .failed("the sign-in was cancelled: nothing was signed in", code: ExitCodes.interrupted)
                }
                break loop
            case .signedIn(let outcome):
                signingIn = nil
                presenter.signInEnded(outcome, flow: login?.flow.rawValue, member: manager.memberID)
                switch outcome {
                case .success:
                    if let recorder, let problem = recorder.record(manager) {
                        presenter.note(problem)
                    }
                    if firstSignIn && !keepsWatching {
                        result = .signedIn(member: manager.memberID, account: manager.accounts.first(where: \.isActive)?.key)
                        firstSignIn = false
                        break loop
                    }
                    if firstSignIn, keys { presenter.note(keyHelp) }
                    firstSignIn = false
                case .failure(let error) where firstSignIn:
                    result = .failed(SignInPlan.explain(error), code: ExitCodes.code(for: error))
                    break loop
                case .failure(let error):
                    presenter.note(SignInPlan.explain(error))
                }
            case .signInAgain:
                if signingIn != nil {
                    presenter.note("a sign-in is in progress already")
                } else if manager.state.value == .loggedIn {
                    presenter.note("signed in already (l logs out)")
                } else {
                    startSignIn()
                }
            }
        }
        if let signingIn {
            // Ends the flow (its request, its timers) before the loop goes; nothing is signed in.
            signingIn.cancel()
            await signingIn.value
            presenter.signInEnded(.failure(SessionError(.cancelled, "the sign-in was cancelled")), flow: login?.flow.rawValue)
        }
        return result
    }

    /// The keys of an interactive watch; each acts on the session in a task of its own.
    private static func keyboard(
        _ manager: SessionManager, _ presenter: Presenter, _ wake: AsyncStream<Wake>.Continuation, canSignInAgain: Bool
    ) -> Keyboard {
        Keyboard { key in
            switch key {
            case "q": wake.yield(.end(.quit))
            case "s" where canSignInAgain: wake.yield(.signInAgain)
            case "l":
                Task { do { try await manager.logout() } catch { presenter.note("logout: \(error)") } }
            case "r":
                Task { do { _ = try await manager.refreshNow() } catch { presenter.note("refresh: \(error)") } }
            case "a":
                // The next account, in the list's order.
                let all = manager.accounts
                guard all.count > 1, let current = all.firstIndex(where: \.isActive) else {
                    presenter.note("no other account to switch to")
                    break
                }
                let next = all[(current + 1) % all.count].key
                Task { do { try await manager.switchAccount(to: next) } catch { presenter.note("switch: \(error)") } }
            case "u":
                Task {
                    do {
                        let token = try await manager.freshAccessToken()
                        _ = try await manager.handleUnauthorized(token: token)
                    } catch {
                        presenter.note("401: \(error)")
                    }
                }
            default: break
            }
        }
    }

    /// The one teardown: the subscriptions, the manager (it writes a store that fell behind),
    /// then the loop.
    private func close(_ session: Session?, _ loop: EventLoop) async throws {
        if let session {
            for subscription in session.subscriptions { subscription.close() }
            await session.manager.close()
        }
        try loop.shutdown()
    }

    /// One exchange of `token`, on the loop thread (an authority is only called there), not
    /// through a session.
    private func firstGrant(_ session: Session, _ token: Secret) async throws -> TokenGrant {
        let authority = session.authority
        let result: Result<TokenGrant, AuthorityError> = await withCheckedContinuation { continuation in
            let completion = AuthorityCompletion<TokenGrant>.standalone { continuation.resume(returning: $0) }
            do {
                try session.loop.execute {
                    authority.refresh(RefreshRequest(refreshToken: token, memberID: nil, reason: .onDemand), completion: completion)
                }
            } catch {
                continuation.resume(returning: .failure(.transient("the loop has stopped")))
            }
        }
        return try result.get()
    }
}
