import LoopFlow
import Logging

/// Keeps the credential store in step with the session (loop-confined).
///
/// - Write-behind: a failed write or clear never logs anyone out. The session goes on in
///   memory, the store is marked *behind*, and a retry timer brings it up to date when it
///   answers again.
/// - The initial read: a store that was unavailable at start is read again on the same
///   timer until it answers (`awaitingInitialRead`).
/// - Every write goes through the store's worker (`StoreWorker`): `save` returns at once and
///   the outcome arrives later, on the loop, in the order of the saves.
///
/// The session decides *what* to store (`SessionEngine.storedForm`); this type only knows
/// whether the store has it.
/// Loop-confined (`@unchecked Sendable` only so its timer and the worker's answers can call
/// back): every method runs on the loop thread and checks so in debug builds.
final class StoreSync: @unchecked Sendable {
    let worker: StoreWorker
    private let loop: EventLoop
    private let retryInterval: Duration
    private let logger: Logger
    /// Called on the loop thread when the retry timer fires (the engine's entry point).
    var onRetryDue: () -> Void = {}

    /// The store has not answered a read yet (it was unavailable at start, or the read is
    /// still on the worker).
    private(set) var awaitingInitialRead = false
    /// The store missed a write or a clear: what it holds is older than the session.
    private(set) var isBehind = false
    /// Saves handed to the worker (merged ones not counted) and saves answered.
    private(set) var savesSubmitted: UInt64 = 0
    private(set) var savesAnswered: UInt64 = 0
    private var retryTimer: LoopTimer?
    private var closed = false

    init(worker: StoreWorker, loop: EventLoop, retryInterval: Duration, logger: Logger) {
        self.worker = worker
        self.loop = loop
        self.retryInterval = retryInterval
        self.logger = logger
    }

    /// Saves are on the worker that have not answered yet.
    var hasSavesInFlight: Bool { savesAnswered != savesSubmitted }

    /// The initial read is on the worker (the session was made on its loop thread).
    func awaitInitialReadAnswer() {
        awaitingInitialRead = true
    }

    /// The store was unavailable at start: keep reading it on the retry timer.
    func awaitInitialRead() {
        loop.assertInEventLoop()
        awaitingInitialRead = true
        scheduleRetry()
    }

    /// The store answered the initial read.
    func initialReadAnswered() {
        awaitingInitialRead = false
    }

    /// What the store holds is older than the session (e.g. a damaged file was moved aside).
    func markBehind() {
        isBehind = true
    }

    /// Writes `session`, or clears the store when it is nil, on the worker. `failed` runs on
    /// the loop thread with the failure to report, if the store fails it (the store is then
    /// behind and a retry is scheduled); `succeeded` runs there when it takes the write. A
    /// store that never blocks answers inline. `target`: a record other than the session's
    /// own (`SessionEngine.clearRecord`).
    func save(
        _ session: StoredSession?, to target: (any CredentialStore)? = nil,
        failed: @escaping @Sendable (StoreError) -> Void,
        succeeded: @escaping @Sendable () -> Void = {}
    ) {
        loop.assertInEventLoop()
        let counted = worker.save(session, to: target) { [self] failure in
            loop.assertInEventLoop()
            savesAnswered += 1
            if let failure {
                isBehind = true
                logger.warning("credential store write failed", metadata: ["error": "\(failure.message)"])
                scheduleRetry()
                failed(failure)
            } else {
                isBehind = false
                succeeded()
            }
        }
        // Counted after the call: an inline store has answered (and counted) already.
        if counted { savesSubmitted += 1 }
    }

    /// Arms the retry timer (once; never after `close()`).
    func scheduleRetry() {
        loop.assertInEventLoop()
        guard retryTimer == nil, !closed else { return }
        retryTimer = try? loop.scheduleTimer(after: retryInterval) { [weak self] in
            guard let self else { return }
            retryTimer = nil
            onRetryDue()
        }
    }

    /// Stops retrying.
    func cancelRetry() {
        retryTimer?.cancel()
        retryTimer = nil
    }

    /// The session is closed: stop retrying, and never arm the retry again.
    func close() {
        closed = true
        cancelRetry()
    }
}

/// What to do about a change another process made to a shared store: a pure decision from
/// what the store holds now and where this session stands.
enum StoreChange: Equatable {
    /// Nothing to follow (unavailable, our own write, a record without tokens).
    case ignore
    /// The store is damaged: report it and write our session back.
    case damaged(StoreError)
    /// Logged out elsewhere: log out here too.
    case logout
    /// The session expired elsewhere.
    case expire
    /// The same session with tokens another process refreshed.
    case adoptTokens(StoredSession, access: Secret)
    /// Someone else signed in elsewhere: log out, then follow the sign-in.
    case switchSession(StoredSession, access: Secret)
    /// Signed in elsewhere while this process had no session.
    case signIn(StoredSession, access: Secret)

    /// - Parameter account: the record the session keeps in a store of several accounts (nil:
    ///   none, or a store of one session). What that record holds is this session's, whatever
    ///   member id a refresh reported.
    static func decide(_ read: StoreRead, state: SessionState, memberID: String?, account: String? = nil) -> StoreChange {
        switch read {
        case .unavailable:
            return .ignore
        case .damaged(let error):
            return .damaged(error)
        case .absent:
            return state == .loggedOut ? .ignore : .logout
        case .present(let stored):
            let same = stored.memberID == memberID || (account != nil && stored.account == account)
            if stored.expired {
                return state == .loggedIn && same ? .expire : .ignore
            }
            guard let access = stored.accessToken, !access.isBlank else { return .ignore }
            switch state {
            case .loggedIn where same:
                return .adoptTokens(stored, access: access)
            case .loggedIn:
                return .switchSession(stored, access: access)
            case .loggedOut, .sessionExpired:
                return .signIn(stored, access: access)
            }
        }
    }
}
