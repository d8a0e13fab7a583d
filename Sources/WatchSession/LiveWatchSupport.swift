// What a live watch uses beside its phases (LiveWatch.swift): the signal and keyboard sources it
// wakes on, and the sign-in bookkeeping that records a session's profile.
import Dispatch
import FoundationEssentials
import Glibc
import Logging
import LoopFlow
import SessionCore
import SessionFileStore
import SessionOAuth

/// SIGINT and SIGTERM, handled instead of killing the process.
final class Signals: @unchecked Sendable {
    private var sources: [any DispatchSourceSignal] = []

    init(_ handler: @escaping @Sendable () -> Void) {
        for number in [SIGINT, SIGTERM] {
            signal(number, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler(handler: handler)
            source.resume()
            sources.append(source)
        }
    }

    func stop() {
        for source in sources { source.cancel() }
    }
}

/// Single key presses from a terminal (raw mode, no echo), restored on stop.
final class Keyboard: @unchecked Sendable {
    private var saved = termios()
    private let lock = Lock()
    private var stopped = false

    init(_ onKey: @escaping @Sendable (Character) -> Void) {
        tcgetattr(STDIN_FILENO, &saved)
        var raw = saved
        raw.c_lflag &= ~tcflag_t(ICANON | ECHO)
        tcsetattr(STDIN_FILENO, TCSANOW, &raw)
        detachThread { [self] in
            var byte: UInt8 = 0
            while read(STDIN_FILENO, &byte, 1) == 1 {
                if lock.withLock({ stopped }) { return }
                onKey(Character(UnicodeScalar(byte)))
            }
        }
    }

    func stop() {
        lock.withLock { stopped = true }
        tcsetattr(STDIN_FILENO, TCSANOW, &saved)
    }
}


/// A sign-in flow whose granted scope (the token answer's `scope`) is kept for the profile.
struct ScopeCapture: SignInFlow {
    let inner: any SignInFlow
    let granted: LockedBox<String?>

    func start(
        on loop: EventLoop, completion: @escaping @Sendable (Result<SessionTokens, SessionError>) -> Void
    ) -> any SignInCancellable {
        let granted = self.granted
        return inner.start(on: loop) { result in
            if case .success(let tokens) = result { granted.withLockedValue { $0 = tokens.scope } }
            completion(result)
        }
    }
}

/// Writes the profile of a session `login` signed in (issuer, client, scopes, endpoints) into
/// its record, sealed with its tokens: every later command finds its server there.
struct ProfileRecorder: Sendable {
    let plan: SignInPlan
    let oauth: OAuthConfiguration
    let granted: LockedBox<String?>
    let storeDirectory: String?
    let storeKey: FileCredentialStore.Key

    /// Nil when recorded; otherwise why not (a note: the session itself is stored).
    func record(_ manager: SessionManager) -> String? {
        guard let storeDirectory else { return nil }
        let key = manager.accounts.first(where: \.isActive)?.key ?? manager.memberID ?? defaultAccount
        let profile = SessionProfile(
            issuer: plan.issuer.absoluteString, clientID: plan.clientID, requestedScope: plan.scope,
            grantedScope: granted.withLockedValue { $0 }, tokenEndpoint: oauth.tokenEndpoint.absoluteString,
            revocationEndpoint: oauth.revocationEndpoint?.absoluteString, dpop: plan.dpop == .off ? nil : plan.dpop)
        do {
            guard try FileCredentialStore(directory: storeDirectory, key: storeKey).setProfile(profile, account: key) else {
                return "the session's profile (issuer, scopes) was not stored: its record is gone"
            }
            return nil
        } catch {
            return "the session's profile (issuer, scopes) was not stored: \(error.message)"
        }
    }
}
