import Testing

@testable import SessionCore

/// The refresh state machine on its own: no loop, no clock, no authority. Every state ×
/// every event is driven through a small storage double that performs the actions the way
/// `SessionEngine` does (timers armed and cancelled, the lock taken and given back), and
/// after every step the timers armed must match the phase.
@Suite("RefreshStateMachine")
struct RefreshStateMachineTests {
    typealias Machine = RefreshStateMachine<Int>

    static let a1 = Secret("A1")
    static let r1 = Secret("R1")
    static let a2 = Secret("A2")
    static let r2 = Secret("R2")
    static let hour = Duration.seconds(3600)
    /// Another process holding the shared store's refresh lease.
    static let otherHolder = RefreshLeaseHolder(pid: 4242, isThisProcess: false, until: .seconds(500), remaining: .milliseconds(12_500))

    static func session(access: Secret = a1, refresh: Secret? = r1, expiresAt: Duration = hour, externalUserID: String? = nil) -> LiveSession {
        LiveSession(accessToken: access, refreshToken: refresh, expiresAt: expiresAt, lifetime: expiresAt, externalUserID: externalUserID)
    }

    /// Performs actions as the engine does and records what is visible from outside.
    struct Storage {
        var machine: Machine
        var armed: [RefreshTimer: Duration] = [:]
        var lockHeld = false
        var sent: [AttemptIdentity] = []
        var cancelled: [AttemptIdentity] = []
        var reauthentications: [AttemptIdentity] = []
        var validations = 0
        var answers: [(waiters: [Int], result: Result<Secret, SessionError>)] = []
        var emitted: [SessionEvent] = []
        var persisted = 0
        var expired: [String] = []
        var lockRequests = 0
        var now: Duration = .seconds(10)

        init(lock: Bool = false) {
            machine = Machine(policy: RefreshPolicy(), usesRefreshLock: lock)
        }

        mutating func run(_ actions: [Machine.Action]) {
            for action in actions {
                switch action {
                case .arm(let timer, let delay): armed[timer] = now + delay
                case .cancel(let timer): armed[timer] = nil
                case .acquireLock: lockRequests += 1
                case .releaseLock:
                    #expect(lockHeld, "released a lock it does not hold")
                    lockHeld = false
                case .sendRefresh(let identity): sent.append(identity)
                case .cancelRequest(let identity): cancelled.append(identity)
                case .sendReauthentication(let identity, _): reauthentications.append(identity)
                case .validate: validations += 1
                case .answer(let waiters, let result): answers.append((waiters, result))
                case .setMemberID: break
                case .persist: persisted += 1
                case .emit(let event): emitted.append(event)
                case .expire(let reason):
                    expired.append(reason)
                    run(machine.endSession().actions)
                case .log: break
                }
            }
        }

        /// The timers armed match the phase, and the lock is held only by an attempt that holds it.
        func checkConsistency(_ context: String) {
            #expect(machine.checkInvariants() == nil, "\(context): \(machine.checkInvariants() ?? "")")
            switch machine.phase {
            case .inactive:
                #expect(armed.isEmpty, "\(context): inactive with timers \(armed.keys)")
                #expect(!lockHeld, "\(context): inactive holding the lock")
            case .idle(let due):
                #expect(armed[.proactive] == due, "\(context): proactive timer \(String(describing: armed[.proactive])) vs due \(String(describing: due))")
                #expect(Set(armed.keys).isSubset(of: [.proactive]), "\(context): idle with \(armed.keys)")
                #expect(!lockHeld, "\(context): idle holding the lock")
            case .backingOff(let due):
                #expect(armed[.backoff] == due, "\(context)")
                #expect(Set(armed.keys) == [.backoff], "\(context): backing off with \(armed.keys)")
                #expect(!lockHeld, "\(context): backing off holding the lock")
            case .refreshing(let attempt):
                #expect(armed[.attemptTimeout] != nil, "\(context): an attempt without its timeout")
                #expect(Set(armed.keys).isSubset(of: [.attemptTimeout, .lockRetry]), "\(context): refreshing with \(armed.keys)")
                if armed[.lockRetry] != nil { #expect(attempt.lock == .waiting, "\(context)") }
                #expect(lockHeld == (attempt.lock == .held), "\(context): lock \(lockHeld) vs \(attempt.lock)")
            }
        }

        var phaseName: String {
            switch machine.phase {
            case .inactive: "inactive"
            case .idle(nil): "idle"
            case .idle(.some): "idle(due)"
            case .backingOff: "backingOff"
            case .refreshing(let attempt):
                switch attempt.lock {
                case .notNeeded: "refreshing" + (attempt.cancelling ? "/cancelling" : "")
                case .waiting: "refreshing/waiting"
                case .held: "refreshing/held" + (attempt.cancelling ? "/cancelling" : "")
                }
            }
        }
    }

    // MARK: - The states

    enum State: String, CaseIterable, CustomStringConvertible {
        case inactive, idle, idleDue, refreshing, waitingForLock, holdingLock, backingOff, backingOffShared
        /// Refreshing, its timeout passed, its request asked to end (and not ended yet).
        case cancelling
        var description: String { rawValue }

        func make() -> Storage {
            var s = Storage(lock: [.waitingForLock, .holdingLock, .backingOffShared].contains(self))
            guard self != .inactive else { return s }
            s.machine.sessionBegan(RefreshStateMachineTests.session())
            if self == .idle { return s }
            s.run(s.machine.scheduleProactive(now: s.now, unitRandom: 0))
            if self == .idleDue { return s }
            s.run(s.machine.tokenRequested(.refreshNow, waiter: 1, now: s.now))
            if self == .holdingLock || self == .backingOffShared {
                s.lockHeld = true
                s.run(s.machine.lockAttempted(.acquired, now: s.now, unitRandom: 0))
            }
            if self == .cancelling {
                s.run(s.machine.timerFired(.attemptTimeout, now: s.now, unitRandom: 0, requestCancellable: true))
            }
            if self == .backingOff || self == .backingOffShared {
                let identity = s.machine.attemptInFlight!
                s.run(s.machine.answerArrived(identity, .failure(.transient("down")), receivedAt: s.now, now: s.now, unitRandom: 0, canReauthenticate: false))
            }
            // Only what the event under test does is looked at.
            s.answers = []
            s.emitted = []
            s.sent = []
            s.cancelled = []
            s.persisted = 0
            return s
        }
    }

    // MARK: - The events

    enum Event: String, CaseIterable, CustomStringConvertible {
        case fresh, refreshNow, unauthorizedCurrent, unauthorizedOld, resume, validationInactive
        case proactiveFired, backoffFired, timeoutFired, timeoutFiredCancellable, lockRetryFired
        case lockBusy, lockAcquired, newerStoredBeforeLock
        case storedTokensChanged
        case success, transient, terminal, configuration, lateSuccess, staleGeneration
        case endSession, scheduleProactive
        var description: String { rawValue }

        func apply(to s: inout Storage) {
            let now = s.now
            let inFlight = s.machine.attemptInFlight
            let current = inFlight ?? AttemptIdentity(id: 99, generation: s.machine.generation, reason: .proactive, refreshToken: RefreshStateMachineTests.r1)
            func answer(_ result: Result<TokenGrant, AuthorityError>, _ identity: AttemptIdentity) {
                s.run(s.machine.answerArrived(identity, result, receivedAt: now, now: now, unitRandom: 0, canReauthenticate: false))
            }
            let grant = TokenGrant(accessToken: RefreshStateMachineTests.a2, refreshToken: RefreshStateMachineTests.r2, expiresIn: .seconds(3600))
            switch self {
            case .fresh: s.run(s.machine.tokenRequested(.fresh, waiter: 7, now: now))
            case .refreshNow: s.run(s.machine.tokenRequested(.refreshNow, waiter: 7, now: now))
            case .unauthorizedCurrent: s.run(s.machine.tokenRequested(.unauthorized(RefreshStateMachineTests.a1), waiter: 7, now: now))
            case .unauthorizedOld: s.run(s.machine.tokenRequested(.unauthorized(Secret("old")), waiter: 7, now: now))
            case .resume: s.run(s.machine.resumeRequested(now: now, canValidate: true))
            case .validationInactive:
                s.run(s.machine.validationAnswered(generation: s.machine.generation, token: RefreshStateMachineTests.a1, result: .success(false), now: now))
            case .proactiveFired: s.armed[.proactive] = nil; s.run(s.machine.timerFired(.proactive, now: now, unitRandom: 0))
            case .backoffFired: s.armed[.backoff] = nil; s.run(s.machine.timerFired(.backoff, now: now, unitRandom: 0))
            case .timeoutFired: s.armed[.attemptTimeout] = nil; s.run(s.machine.timerFired(.attemptTimeout, now: now, unitRandom: 0))
            case .timeoutFiredCancellable:
                s.armed[.attemptTimeout] = nil
                s.run(s.machine.timerFired(.attemptTimeout, now: now, unitRandom: 0, requestCancellable: true))
            case .lockRetryFired: s.armed[.lockRetry] = nil; s.run(s.machine.timerFired(.lockRetry, now: now, unitRandom: 0))
            case .lockBusy: s.run(s.machine.lockAttempted(.busy(RefreshStateMachineTests.otherHolder), now: now, unitRandom: 0))
            case .lockAcquired:
                // The store answers `busy` to a holder asking again (FileCredentialStore).
                if s.lockHeld {
                    let itself = RefreshLeaseHolder(pid: 1, isThisProcess: true, until: .seconds(70), remaining: .seconds(60))
                    s.run(s.machine.lockAttempted(.busy(itself), now: now, unitRandom: 0))
                } else {
                    s.lockHeld = true
                    s.run(s.machine.lockAttempted(.acquired, now: now, unitRandom: 0))
                }
            case .newerStoredBeforeLock:
                s.run(s.machine.lockAttempted(.newerStored(RefreshStateMachineTests.session(access: RefreshStateMachineTests.a2, refresh: RefreshStateMachineTests.r2), lockHeld: false), now: now, unitRandom: 0))
            case .storedTokensChanged:
                s.run(s.machine.storedTokensChanged(RefreshStateMachineTests.session(access: RefreshStateMachineTests.a2, refresh: RefreshStateMachineTests.r2), now: now, unitRandom: 0))
            case .success: answer(.success(grant), current)
            case .transient: answer(.failure(.transient("HTTP 503")), current)
            case .terminal: answer(.failure(.terminal()), current)
            case .configuration: answer(.failure(.configuration("invalid_client", "no")), current)
            case .lateSuccess:
                answer(.success(grant), AttemptIdentity(id: 1000, generation: s.machine.generation, reason: .proactive, refreshToken: RefreshStateMachineTests.r1))
            case .staleGeneration:
                answer(.success(grant), AttemptIdentity(id: current.id, generation: s.machine.generation &- 1, reason: .proactive, refreshToken: RefreshStateMachineTests.r1))
            case .endSession: s.run(s.machine.endSession().actions)
            case .scheduleProactive: s.run(s.machine.scheduleProactive(now: now, unitRandom: 0))
            }
        }
    }

    /// The phase each (state, event) leads to. Columns: inactive, idle, idle(due),
    /// refreshing, refreshing/waiting, refreshing/held, backingOff, backingOff (shared store),
    /// cancelling.
    static let expected: [Event: [String]] = [
        .fresh: ["inactive", "idle", "idle(due)", "refreshing", "refreshing/waiting", "refreshing/held", "backingOff", "backingOff", "refreshing/cancelling"],
        .refreshNow: ["inactive", "refreshing", "refreshing", "refreshing", "refreshing/waiting", "refreshing/held", "refreshing", "refreshing/waiting", "refreshing/cancelling"],
        .unauthorizedCurrent: ["inactive", "refreshing", "refreshing", "refreshing", "refreshing/waiting", "refreshing/held", "backingOff", "backingOff", "refreshing/cancelling"],
        .unauthorizedOld: ["inactive", "idle", "idle(due)", "refreshing", "refreshing/waiting", "refreshing/held", "backingOff", "backingOff", "refreshing/cancelling"],
        .resume: ["inactive", "idle", "idle(due)", "refreshing", "refreshing/waiting", "refreshing/held", "backingOff", "backingOff", "refreshing/cancelling"],
        .validationInactive: ["inactive", "refreshing", "refreshing", "refreshing", "refreshing/waiting", "refreshing/held", "backingOff", "backingOff", "refreshing/cancelling"],
        .proactiveFired: ["inactive", "idle", "refreshing", "refreshing", "refreshing/waiting", "refreshing/held", "backingOff", "backingOff", "refreshing/cancelling"],
        .backoffFired: ["inactive", "idle", "idle(due)", "refreshing", "refreshing/waiting", "refreshing/held", "refreshing", "refreshing/waiting", "refreshing/cancelling"],
        .timeoutFired: ["inactive", "idle", "idle(due)", "backingOff", "backingOff", "backingOff", "backingOff", "backingOff", "backingOff"],
        .timeoutFiredCancellable: ["inactive", "idle", "idle(due)", "refreshing/cancelling", "backingOff", "refreshing/held/cancelling", "backingOff", "backingOff", "backingOff"],
        .lockRetryFired: ["inactive", "idle", "idle(due)", "refreshing", "refreshing/waiting", "refreshing/held", "backingOff", "backingOff", "refreshing/cancelling"],
        .lockBusy: ["inactive", "idle", "idle(due)", "refreshing", "refreshing/waiting", "refreshing/held", "backingOff", "backingOff", "refreshing/cancelling"],
        .lockAcquired: ["inactive", "idle", "idle(due)", "refreshing", "refreshing/held", "refreshing/held", "backingOff", "backingOff", "refreshing/cancelling"],
        .newerStoredBeforeLock: ["inactive", "idle", "idle(due)", "refreshing", "idle(due)", "refreshing/held", "backingOff", "backingOff", "refreshing/cancelling"],
        .storedTokensChanged: ["inactive", "idle(due)", "idle(due)", "idle(due)", "idle(due)", "idle(due)", "idle(due)", "idle(due)", "idle(due)"],
        .success: ["inactive", "idle(due)", "idle(due)", "idle(due)", "idle(due)", "idle(due)", "idle(due)", "idle(due)", "idle(due)"],
        .transient: ["inactive", "idle", "idle(due)", "backingOff", "backingOff", "backingOff", "backingOff", "backingOff", "backingOff"],
        .terminal: ["inactive", "idle", "idle(due)", "inactive", "inactive", "inactive", "backingOff", "backingOff", "inactive"],
        .configuration: ["inactive", "idle", "idle(due)", "idle", "idle", "idle", "backingOff", "backingOff", "idle"],
        .lateSuccess: ["inactive", "idle(due)", "idle(due)", "refreshing", "refreshing/waiting", "refreshing/held", "idle(due)", "idle(due)", "refreshing/cancelling"],
        .staleGeneration: ["inactive", "idle", "idle(due)", "refreshing", "refreshing/waiting", "refreshing/held", "backingOff", "backingOff", "refreshing/cancelling"],
        .endSession: ["inactive", "inactive", "inactive", "inactive", "inactive", "inactive", "inactive", "inactive", "inactive"],
        .scheduleProactive: ["inactive", "idle(due)", "idle(due)", "refreshing", "refreshing/waiting", "refreshing/held", "backingOff", "backingOff", "refreshing/cancelling"],
    ]

    @Test("every state × every event leads to the expected phase, with timers and lock consistent",
          arguments: State.allCases)
    func everyStateTimesEveryEvent(state: State) {
        for event in Event.allCases {
            var s = state.make()
            s.checkConsistency("\(state) before \(event)")
            let waitersBefore = s.machine.waiterCount
            event.apply(to: &s)
            let column = State.allCases.firstIndex(of: state)!
            #expect(s.phaseName == Self.expected[event]![column], "\(state) + \(event) → \(s.phaseName)")
            s.checkConsistency("\(state) + \(event)")
            // Nobody is lost: a waiter that is not answered waits on the attempt in flight.
            let answered = s.answers.reduce(0) { $0 + $1.waiters.count }
            let asked = [.fresh, .refreshNow, .unauthorizedCurrent, .unauthorizedOld].contains(event) ? 1 : 0
            let abandoned = event == .endSession ? waitersBefore : 0
            #expect(answered + s.machine.waiterCount + abandoned == waitersBefore + asked,
                    "\(state) + \(event): \(answered) answered, \(s.machine.waiterCount) waiting, \(waitersBefore) before")
        }
    }

    // MARK: - Behaviour, event by event

    @Test func concurrentCallersJoinTheOneAttemptAndAllGetItsResult() {
        var s = State.idleDue.make()
        s.now = .seconds(3400)  // within the margin
        for waiter in 1...5 { s.run(s.machine.tokenRequested(.fresh, waiter: waiter, now: s.now)) }
        #expect(s.sent.count == 1)
        #expect(s.machine.waiterCount == 5)
        s.run(s.machine.answerArrived(s.sent[0], .success(TokenGrant(accessToken: Self.a2, refreshToken: Self.r2, expiresIn: .seconds(60))),
                                      receivedAt: s.now, now: s.now, unitRandom: 0, canReauthenticate: false))
        #expect(s.answers.count == 1)
        #expect(s.answers[0].waiters == [1, 2, 3, 4, 5])
        #expect(s.answers[0].result == .success(Self.a2))
        #expect(s.machine.live?.refreshToken == Self.r2)
        #expect(s.persisted == 1)
    }

    @Test func aGrantIsPersistedAndAnnouncedBeforeAnyWaiterIsAnswered() {
        var s = State.refreshing.make()
        let actions = s.machine.answerArrived(s.machine.attemptInFlight!, .success(TokenGrant(accessToken: Self.a2, expiresIn: .seconds(60))),
                                              receivedAt: s.now, now: s.now, unitRandom: 0, canReauthenticate: false)
        let persist = actions.firstIndex { if case .persist = $0 { true } else { false } }!
        let emit = actions.firstIndex { if case .emit(.tokenRefreshed) = $0 { true } else { false } }!
        let answer = actions.firstIndex { if case .answer = $0 { true } else { false } }!
        #expect(persist < emit && emit < answer)
        // A grant without a refresh token keeps the one held.
        #expect(s.machine.live?.refreshToken == Self.r1)
    }

    @Test func transientFailuresBackOffOnTheScheduleAndHonourRetryAfter() {
        var s = State.idleDue.make()
        var delays: [Duration] = []
        for failure in 1...8 {
            s.run(s.machine.tokenRequested(.refreshNow, waiter: failure, now: s.now))
            let retryAfter: Duration? = failure == 8 ? .seconds(45) : nil
            s.run(s.machine.answerArrived(s.machine.attemptInFlight!, .failure(.transient("503", retryAfter: retryAfter)),
                                          receivedAt: s.now, now: s.now, unitRandom: 0, canReauthenticate: false))
            delays.append(s.armed[.backoff]! - s.now)
        }
        #expect(delays == [1, 2, 4, 8, 16, 30, 30, 45].map { Duration.seconds($0) })
        #expect(s.machine.consecutiveFailures == 8)
        #expect(s.emitted.last == .refreshFailed(attempt: 8, retryIn: .seconds(45), error: .transient("503", retryAfter: .seconds(45))))
    }

    @Test func onlyATerminalAnswerExpiresAndReauthenticationIsTriedOnceFirst() {
        var s = Storage()
        s.machine.sessionBegan(Self.session(externalUserID: "ext-1"))
        s.run(s.machine.tokenRequested(.refreshNow, waiter: 1, now: s.now))
        s.run(s.machine.answerArrived(s.sent[0], .failure(.terminal()), receivedAt: s.now, now: s.now, unitRandom: 0, canReauthenticate: true))
        #expect(s.expired.isEmpty)
        #expect(s.reauthentications.count == 1)
        #expect(s.machine.waiterCount == 1)  // the waiter moved to the re-authentication
        s.run(s.machine.answerArrived(s.reauthentications[0], .failure(.transient("down")), receivedAt: s.now, now: s.now, unitRandom: 0, canReauthenticate: true))
        #expect(s.expired.count == 1)
        #expect(s.answers.last?.result == .failure(Machine.expiredError))
        #expect(s.phaseName == "inactive")
        s.checkConsistency("after re-authentication failed")
    }

    @Test func anAnswerFromAnEarlierGenerationChangesNothing() {
        var s = State.refreshing.make()
        let old = s.machine.attemptInFlight!
        let ended = s.machine.endSession()
        s.run(ended.actions)
        #expect(ended.abandoned == [1])
        // The next session holds the same refresh token, so only the generation tells the
        // old attempt's answer apart (a late success for the held token is otherwise adopted).
        s.machine.sessionBegan(Self.session(access: Secret("B1"), refresh: Self.r1))
        s.run(s.machine.answerArrived(old, .success(TokenGrant(accessToken: Self.a2, refreshToken: Self.r2, expiresIn: .seconds(60))),
                                      receivedAt: s.now, now: s.now, unitRandom: 0, canReauthenticate: false))
        s.run(s.machine.answerArrived(old, .failure(.terminal()), receivedAt: s.now, now: s.now, unitRandom: 0, canReauthenticate: false))
        #expect(s.expired.isEmpty)
        #expect(s.persisted == 0)
        #expect(s.machine.live?.accessToken == Secret("B1"))
        #expect(s.machine.live?.refreshToken == Self.r1)
    }

    @Test func aTimedOutRequestIsCancelledAndTheAttemptKeepsTheLockUntilTheRequestHasEnded() {
        var s = State.holdingLock.make()
        let attempt = s.machine.attemptInFlight!
        s.armed[.attemptTimeout] = nil
        s.run(s.machine.timerFired(.attemptTimeout, now: s.now, unitRandom: 0, requestCancellable: true))
        #expect(s.cancelled == [attempt])
        // Nobody is answered yet, the lock stays held, and a caller arriving now joins the
        // attempt instead of sending the refresh token a second time.
        #expect(s.answers.isEmpty)
        #expect(s.lockHeld)
        s.run(s.machine.tokenRequested(.refreshNow, waiter: 2, now: s.now))
        #expect(s.sent.isEmpty)
        #expect(s.machine.waiterCount == 2)
        s.checkConsistency("cancelling")
        // The request ends (cancelled): the attempt ends as a timeout, the lock is let go last.
        let actions = s.machine.answerArrived(attempt, .failure(.cancelled), receivedAt: s.now, now: s.now, unitRandom: 0, canReauthenticate: false)
        if case .releaseLock = actions.last {} else { Issue.record("the lock must be released after everything else: \(actions)") }
        s.run(actions)
        #expect(s.phaseName == "backingOff")
        #expect(!s.lockHeld)
        #expect(s.answers.count == 1 && s.answers[0].waiters == [1, 2])
        guard case .failure(let error) = s.answers[0].result else { Issue.record("a cancelled attempt answered a token"); return }
        #expect(error.code == .transient)
        #expect(error.message.contains("did not answer within"), "\(error.message)")
        s.checkConsistency("after the cancelled request ended")
    }

    @Test func tokensArrivingAfterTheCancellationWasAskedForAreKept() {
        var s = State.cancelling.make()
        let attempt = s.machine.attemptInFlight!
        s.run(s.machine.answerArrived(attempt, .success(TokenGrant(accessToken: Self.a2, refreshToken: Self.r2, expiresIn: .seconds(600))),
                                      receivedAt: s.now, now: s.now, unitRandom: 0, canReauthenticate: false))
        #expect(s.machine.live?.refreshToken == Self.r2)
        #expect(s.persisted == 1)
        #expect(s.answers.count == 1 && s.answers[0].result == .success(Self.a2))
        #expect(s.phaseName == "idle(due)")
    }

    @Test func aCancelledRequestThatNeverEndsIsGivenUpAfterOneMoreTimeout() {
        var s = State.cancelling.make()
        #expect(s.armed[.attemptTimeout] == s.now + RefreshPolicy().timeout)
        s.armed[.attemptTimeout] = nil
        s.run(s.machine.timerFired(.attemptTimeout, now: s.now, unitRandom: 0, requestCancellable: true))
        #expect(s.phaseName == "backingOff")
        #expect(s.cancelled.isEmpty)  // asked once, not again
        guard case .failure(let error) = s.answers.first?.result else { Issue.record("the waiter was not answered"); return }
        #expect(error.message.contains("did not end"), "\(error.message)")
    }

    @Test func anAuthorityThatCannotCancelEndsTheAttemptAtTheTimeoutAsBefore() {
        var s = State.refreshing.make()
        s.armed[.attemptTimeout] = nil
        s.run(s.machine.timerFired(.attemptTimeout, now: s.now, unitRandom: 0, requestCancellable: false))
        #expect(s.cancelled.isEmpty)
        #expect(s.phaseName == "backingOff")
        #expect(s.answers.count == 1)
    }

    @Test func anAnswerThatIsArrivingIsNotCancelledAtTheTimeoutButWaitedFor() {
        // Issue 29, point 1: the authority said its answer is arriving (a 2xx: the token is
        // rotated) and ends by itself within 40 s: the timeout cancels nothing, and a guard of
        // one more timeout after that end is armed.
        var s = State.refreshing.make()
        let attempt = s.machine.attemptInFlight!
        s.armed[.attemptTimeout] = nil
        s.run(s.machine.timerFired(.attemptTimeout, now: s.now, unitRandom: 0, requestCancellable: true,
                                   answerArrivingBy: s.now + .seconds(40)))
        #expect(s.cancelled.isEmpty)
        #expect(s.answers.isEmpty)
        #expect(s.phaseName == "refreshing")
        #expect(s.armed[.attemptTimeout] == s.now + .seconds(40) + RefreshPolicy().timeout)
        // The answer arrives (late, whole): its tokens are the session's.
        s.run(s.machine.answerArrived(attempt, .success(TokenGrant(accessToken: Self.a2, refreshToken: Self.r2, expiresIn: .seconds(600))),
                                      receivedAt: s.now, now: s.now, unitRandom: 0, canReauthenticate: false))
        #expect(s.machine.live?.refreshToken == Self.r2)
        #expect(s.answers.count == 1 && s.answers[0].result == .success(Self.a2))
        s.checkConsistency("after the arriving answer")
    }

    @Test func anArrivingAnswerThatOutlivesItsWordIsCancelledAtTheGuard() {
        var s = State.refreshing.make()
        let attempt = s.machine.attemptInFlight!
        s.armed[.attemptTimeout] = nil
        s.run(s.machine.timerFired(.attemptTimeout, now: s.now, unitRandom: 0, requestCancellable: true, answerArrivingBy: s.now))
        s.armed[.attemptTimeout] = nil
        s.run(s.machine.timerFired(.attemptTimeout, now: s.now, unitRandom: 0, requestCancellable: true, answerArrivingBy: s.now))
        #expect(s.cancelled == [attempt])
        #expect(s.phaseName == "refreshing/cancelling")  // until the request has ended
    }

    @Test func aLostAnswerIsRetriedOnceAtOnceWithTheSameRefreshTokenThenBacksOff() {
        var s = State.refreshing.make()
        let first = s.machine.attemptInFlight!
        s.run(s.machine.tokenRequested(.fresh, waiter: 2, now: s.now))
        s.sent = []
        s.run(s.machine.answerArrived(first, .failure(.answerLost("HTTP 200, then the connection dropped")),
                                      receivedAt: s.now, now: s.now, unitRandom: 0, canReauthenticate: false))
        // No one is answered: the waiters join a new attempt sent now, with the same token.
        #expect(s.answers.isEmpty)
        #expect(s.phaseName == "refreshing")
        let retry = s.machine.attemptInFlight!
        #expect(retry.id != first.id)
        #expect(retry.refreshToken == Self.r1)
        #expect(s.sent.map(\.id) == [retry.id])
        #expect(s.machine.waiterCount == 2)
        guard case .refreshFailed(_, let retryIn, let error)? = s.emitted.last else {
            Issue.record("no refreshFailed event: \(s.emitted)")
            return
        }
        #expect(retryIn == .zero)
        #expect(error.isAnswerLost)
        s.checkConsistency("retrying a lost answer")
        // Lost again: a transient failure like any other (backoff), not a loop of retries.
        s.run(s.machine.answerArrived(retry, .failure(.answerLost("again")), receivedAt: s.now, now: s.now, unitRandom: 0, canReauthenticate: false))
        #expect(s.phaseName == "backingOff")
        #expect(s.answers.count == 1 && s.answers[0].waiters.count == 2)
        // New tokens make the next lost answer worth one prompt retry again.
        s.armed[.backoff] = nil
        s.run(s.machine.timerFired(.backoff, now: s.now, unitRandom: 0))
        let third = s.machine.attemptInFlight!
        s.run(s.machine.answerArrived(third, .success(TokenGrant(accessToken: Self.a2, refreshToken: Self.r2, expiresIn: .seconds(1))),
                                      receivedAt: s.now, now: s.now, unitRandom: 0, canReauthenticate: false))
        s.run(s.machine.tokenRequested(.refreshNow, waiter: 3, now: s.now))
        let fourth = s.machine.attemptInFlight!
        s.run(s.machine.answerArrived(fourth, .failure(.answerLost("dropped")), receivedAt: s.now, now: s.now, unitRandom: 0, canReauthenticate: false))
        #expect(s.phaseName == "refreshing")
        #expect(s.machine.attemptInFlight?.refreshToken == Self.r2)
    }

    @Test func aRefreshSentAfterWaitingForTheLeaseGetsAWholeTimeoutOfItsOwn() {
        // The stress tier's lost rounds: the second process took the lease 0.9 s into its 1 s
        // timeout and cancelled its refresh as the server answered.
        var s = State.waitingForLock.make()
        let timeout = RefreshPolicy().timeout
        s.now += timeout * 0.9
        s.lockHeld = true
        s.run(s.machine.lockAttempted(.acquired, now: s.now, unitRandom: 0))
        #expect(s.sent.count == 1)
        #expect(s.armed[.attemptTimeout] == s.now + timeout)
        s.checkConsistency("sent after the wait")
    }

    @Test func aCallerToldTheRefreshIsBackingOffIsToldWhy() {
        // (RefreshLeaseTests under load: a caller arriving after the attempt gave up on another
        // process's lease learnt only "backing off", not that another process was refreshing.)
        var s = State.backingOff.make()  // the attempt failed with "down"
        s.run(s.machine.tokenRequested(.unauthorized(Self.a1), waiter: 7, now: s.now))
        guard case .failure(let error)? = s.answers.last?.result else { Issue.record("not refused: \(s.answers)"); return }
        #expect(error.message == "the refresh is backing off after a failure: down", "\(error.message)")
    }

    @Test func endingTheSessionCancelsTheRequestInFlight() {
        var s = State.refreshing.make()
        let attempt = s.machine.attemptInFlight!
        s.run(s.machine.endSession().actions)
        #expect(s.cancelled == [attempt])
        // An attempt still waiting for the lock sent nothing: nothing to cancel.
        var waiting = State.waitingForLock.make()
        waiting.run(waiting.machine.endSession().actions)
        #expect(waiting.cancelled.isEmpty)
    }

    @Test func aLateSuccessForTheHeldRefreshTokenIsAdoptedAndOtherLateAnswersAreNot() {
        var s = State.refreshing.make()
        let first = s.machine.attemptInFlight!
        s.run(s.machine.timerFired(.attemptTimeout, now: s.now, unitRandom: 0))
        #expect(s.phaseName == "backingOff")
        s.run(s.machine.answerArrived(first, .failure(.terminal()), receivedAt: s.now, now: s.now, unitRandom: 0, canReauthenticate: false))
        #expect(s.expired.isEmpty)  // a late refusal is discarded
        s.run(s.machine.answerArrived(first, .success(TokenGrant(accessToken: Self.a2, refreshToken: Self.r2, expiresIn: .seconds(600))),
                                      receivedAt: s.now, now: s.now, unitRandom: 0, canReauthenticate: false))
        #expect(s.machine.live?.refreshToken == Self.r2)
        #expect(s.phaseName == "idle(due)")
        s.checkConsistency("after the late success")
    }

    @Test func compareAndRefreshRefreshesOnlyTheCurrentTokenAndNeverLoops() {
        var s = State.idleDue.make()
        s.run(s.machine.tokenRequested(.unauthorized(Secret("stale")), waiter: 1, now: s.now))
        #expect(s.answers.last?.result == .success(Self.a1))
        #expect(s.sent.isEmpty)
        s.run(s.machine.tokenRequested(.unauthorized(Self.a1), waiter: 2, now: s.now))
        #expect(s.sent.count == 1 && s.sent[0].reason == .unauthorized)
        s.run(s.machine.answerArrived(s.sent[0], .success(TokenGrant(accessToken: Self.a2, expiresIn: .seconds(3600))),
                                      receivedAt: s.now, now: s.now, unitRandom: 0, canReauthenticate: false))
        s.run(s.machine.tokenRequested(.unauthorized(Self.a2), waiter: 3, now: s.now))
        #expect(s.sent.count == 1)
        #expect(s.answers.last?.result == .failure(SessionError(
            .unauthorized, "a token fresh from a refresh was refused again; not refreshing in a loop")))
    }

    @Test func withASharedStoreTheRequestIsSentOnlyUnderTheLockWhichIsReleasedAfterThePersist() {
        var s = State.waitingForLock.make()
        #expect(s.sent.isEmpty && s.lockRequests == 1)
        s.run(s.machine.lockAttempted(.busy(Self.otherHolder), now: s.now, unitRandom: 0))
        #expect(s.armed[.lockRetry] == s.now + .milliseconds(50))
        s.armed[.lockRetry] = nil
        s.run(s.machine.timerFired(.lockRetry, now: s.now, unitRandom: 0))
        #expect(s.lockRequests == 2)
        s.lockHeld = true
        s.run(s.machine.lockAttempted(.acquired, now: s.now, unitRandom: 0))
        #expect(s.sent.count == 1)
        let actions = s.machine.answerArrived(s.sent[0], .success(TokenGrant(accessToken: Self.a2, refreshToken: Self.r2, expiresIn: .seconds(600))),
                                              receivedAt: s.now, now: s.now, unitRandom: 0, canReauthenticate: false)
        let persist = actions.firstIndex { if case .persist = $0 { true } else { false } }!
        let release = actions.firstIndex { if case .releaseLock = $0 { true } else { false } }!
        #expect(persist < release)
        s.run(actions)
        #expect(!s.lockHeld)
    }

    /// The store worker answers a lock look later: an answer for an attempt that ended meanwhile
    /// never counts for the attempt that waits now; a lease it took is given back.
    @Test func aLockAnswerForAnAttemptThatEndedNeverCountsForANewerOne() {
        var s = State.waitingForLock.make()
        guard let first = s.machine.attemptInFlight else {
            Issue.record("no attempt waits for the lock")
            return
        }
        // The answer for another attempt id (one that ended): the lease it took is released,
        // nothing is sent, the waiting attempt still waits.
        s.lockHeld = true
        s.run(s.machine.lockAttempted(.acquired, attempt: first.id + 1, now: s.now, unitRandom: 0))
        #expect(!s.lockHeld)
        #expect(s.sent.isEmpty)
        #expect(s.machine.attemptInFlight?.id == first.id)
        s.run(s.machine.lockAttempted(.newerStored(Self.session(access: Self.a2, refresh: Self.r2), lockHeld: false),
                                      attempt: first.id + 1, now: s.now, unitRandom: 0))
        #expect(s.answers.isEmpty && s.sent.isEmpty)
        // Its own answer counts.
        s.lockHeld = true
        s.run(s.machine.lockAttempted(.acquired, attempt: first.id, now: s.now, unitRandom: 0))
        #expect(s.sent.count == 1)
    }

    @Test func tokensAnotherProcessRefreshedAreAdoptedInsteadOfSendingAStaleRefreshToken() {
        var s = State.waitingForLock.make()
        s.lockHeld = true
        s.run(s.machine.lockAttempted(.newerStored(Self.session(access: Self.a2, refresh: Self.r2), lockHeld: true), now: s.now, unitRandom: 0))
        #expect(s.sent.isEmpty)
        #expect(!s.lockHeld)
        #expect(s.answers.last?.result == .success(Self.a2))
        #expect(s.emitted.last == .tokenRefreshed(expiresIn: Self.hour, reason: .sharedStore))
    }

    /// A server that keeps its refresh tokens: another process's refresh stores the same
    /// refresh token with a new access token. A process waiting for the lease adopts it when
    /// the directory watch shows it (a later expiry than its own), instead of refreshing once
    /// more when the lease frees; an older record (a write of ours the store missed) is not.
    @Test func tokensAnotherProcessRefreshedWithTheSameRefreshTokenAreAdoptedIfLater() {
        var s = State.waitingForLock.make()
        guard let held = s.machine.live else {
            Issue.record("no live session")
            return
        }
        let older = Self.session(access: Self.a2, refresh: held.refreshToken, expiresAt: held.expiresAt - .seconds(1))
        s.run(s.machine.storedTokensChanged(older, now: s.now, unitRandom: 0))
        // Expired: a record whose time is up is no refresh to take (the rule's table below has
        // the case where ours expired even earlier).
        s.run(s.machine.storedTokensChanged(
            Self.session(access: Self.a2, refresh: held.refreshToken, expiresAt: s.now), now: s.now, unitRandom: 0))
        #expect(s.answers.isEmpty)
        #expect(s.phaseName == "refreshing/waiting")
        let later = LiveSession(
            accessToken: Self.a2, refreshToken: held.refreshToken, expiresAt: s.now + Self.hour, lifetime: Self.hour)
        // With the lease held, our own request is on its way: nothing is taken (letting the
        // lease go would let another process send the same refresh token).
        var holding = State.holdingLock.make()
        holding.run(holding.machine.storedTokensChanged(later, now: holding.now, unitRandom: 0))
        #expect(holding.answers.isEmpty && holding.lockHeld)
        s.run(s.machine.storedTokensChanged(later, now: s.now, unitRandom: 0))
        #expect(s.sent.isEmpty)
        #expect(s.answers.last?.result == .success(Self.a2))
        #expect(s.emitted.last == .tokenRefreshed(expiresIn: Self.hour, reason: .sharedStore))
    }

    /// The rule itself (`LiveSession.refreshedElsewhere`), as the lease's look applies it to
    /// the stored record: rotated → refreshed elsewhere; not rotated → only another access
    /// token expiring later than the one held.
    @Test func refreshedElsewhereIsARotatedRefreshTokenOrALaterAccessToken() {
        func elsewhere(refresh: Secret, access: Secret, expiresAt: Duration?, now: Duration = .seconds(90)) -> Bool {
            LiveSession.refreshedElsewhere(
                refreshToken: refresh, accessToken: access, expiresAt: expiresAt,
                inFlight: Self.r1, held: Self.a1, heldExpiresAt: .seconds(100), now: now)
        }
        #expect(elsewhere(refresh: Self.r2, access: Self.a1, expiresAt: .seconds(50)))
        #expect(elsewhere(refresh: Self.r1, access: Self.a2, expiresAt: .seconds(101)))
        #expect(!elsewhere(refresh: Self.r1, access: Self.a2, expiresAt: .seconds(100)))
        #expect(!elsewhere(refresh: Self.r1, access: Self.a2, expiresAt: nil))
        #expect(!elsewhere(refresh: Self.r1, access: Self.a1, expiresAt: .seconds(200)))
        // The held token expired long ago: a record that expires later but has expired too is
        // no refresh of another process's (an older write, retried).
        #expect(!elsewhere(refresh: Self.r1, access: Self.a2, expiresAt: .seconds(150), now: .seconds(150)))
        #expect(elsewhere(refresh: Self.r1, access: Self.a2, expiresAt: .seconds(151), now: .seconds(150)))
        #expect(!LiveSession.refreshedElsewhere(
            refreshToken: Self.r1, accessToken: Self.a2, expiresAt: .seconds(200),
            inFlight: Self.r1, held: nil, heldExpiresAt: nil, now: .seconds(90)))
    }

    @Test func withoutARefreshTokenTheAccessTokenServesUntilItExpires() {
        var s = Storage()
        s.machine.sessionBegan(Self.session(refresh: nil, expiresAt: .seconds(100)))
        s.run(s.machine.scheduleProactive(now: s.now, unitRandom: 0))
        #expect(s.armed.isEmpty)
        s.run(s.machine.tokenRequested(.unauthorized(Self.a1), waiter: 1, now: s.now))
        #expect(s.answers.last?.result == .failure(SessionError(.unauthorized, "the token was refused and there is no refresh token")))
        s.now = .seconds(100)
        s.run(s.machine.tokenRequested(.fresh, waiter: 2, now: s.now))
        #expect(s.expired == ["the access token expired and there is no refresh token"])
        #expect(s.phaseName == "inactive")
    }

    @Test func resumeValidatesOnlyWhenIdleAndAValidationOfAnotherTokenIsIgnored() {
        var s = State.idleDue.make()
        s.run(s.machine.resumeRequested(now: s.now, canValidate: false))
        #expect(s.emitted == [.validated])
        s.run(s.machine.resumeRequested(now: s.now, canValidate: true))
        #expect(s.validations == 1)
        s.run(s.machine.validationAnswered(generation: s.machine.generation, token: Secret("other"), result: .success(false), now: s.now))
        #expect(s.sent.isEmpty)
        s.run(s.machine.validationAnswered(generation: s.machine.generation, token: Self.a1, result: .failure(.terminal()), now: s.now))
        #expect(s.sent.count == 1 && s.sent[0].reason == .resume)
    }

    // MARK: - The refresh lease of a shared store

    /// The error a timeout while waiting for the lease gives: the refreshFailed event's and the
    /// waiter's, which must agree.
    static func leaseWaitFailure(_ s: Storage) -> String? {
        guard case .refreshFailed(_, _, let error)? = s.emitted.last, case .failure(let answered)? = s.answers.last?.result else {
            return nil
        }
        #expect(answered.message == error.message)
        #expect(error.kind == .transient && answered.code == .transient)
        return error.message
    }

    @Test func aTimeoutWhileWaitingForTheLeaseNamesTheHolderNotTheAuthority() {
        var s = State.waitingForLock.make()
        s.run(s.machine.lockAttempted(.busy(Self.otherHolder), now: s.now, unitRandom: 0))
        // A look that could not tell who holds it keeps the holder seen before.
        s.armed[.lockRetry] = nil
        s.run(s.machine.timerFired(.lockRetry, now: s.now, unitRandom: 0))
        s.run(s.machine.lockAttempted(.busy(nil), now: s.now, unitRandom: 0))
        s.armed[.attemptTimeout] = nil
        s.run(s.machine.timerFired(.attemptTimeout, now: s.now, unitRandom: 0))
        #expect(s.phaseName == "backingOff")
        #expect(s.armed[.lockRetry] == nil)
        #expect(s.sent.isEmpty)
        let message = Self.leaseWaitFailure(s)
        #expect(message == "another process (pid 4242) is refreshing the session (its lease runs 12.5 seconds more); "
            + "no refresh was sent after waiting 30.0 seconds")
        #expect(message?.contains("did not answer") == false)
        #expect(s.answers.last?.waiters == [1])
        s.checkConsistency("after the lease wait timed out")
        // The backoff tries again, and this time the lease is free.
        s.armed[.backoff] = nil
        s.run(s.machine.timerFired(.backoff, now: s.now, unitRandom: 0))
        #expect(s.phaseName == "refreshing/waiting")
        s.lockHeld = true
        s.run(s.machine.lockAttempted(.acquired, now: s.now, unitRandom: 0))
        #expect(s.sent.count == 1)
    }

    @Test func aLeaseWaitWithoutAKnownHolderOrHeldInThisProcessSaysSo() {
        var s = State.waitingForLock.make()
        s.run(s.machine.lockAttempted(.busy(nil), now: s.now, unitRandom: 0))
        s.armed[.attemptTimeout] = nil
        s.run(s.machine.timerFired(.attemptTimeout, now: s.now, unitRandom: 0))
        #expect(Self.leaseWaitFailure(s) == "another process is refreshing the session (the store's refresh lease stayed busy); "
            + "no refresh was sent after waiting 30.0 seconds")

        var t = State.waitingForLock.make()
        let sibling = RefreshLeaseHolder(pid: 7, isThisProcess: true, until: .seconds(99), remaining: .milliseconds(1500))
        t.run(t.machine.lockAttempted(.busy(sibling), now: t.now, unitRandom: 0))
        t.armed[.attemptTimeout] = nil
        t.run(t.machine.timerFired(.attemptTimeout, now: t.now, unitRandom: 0))
        #expect(Self.leaseWaitFailure(t)?.hasPrefix("another session of this process is refreshing through the same store") == true)
    }

    @Test func aLeaseHolderDescribesItselfToTheMillisecond() {
        func text(_ remaining: Duration, this: Bool = false) -> String {
            RefreshLeaseHolder(pid: 31, isThisProcess: this, until: .seconds(1), remaining: remaining).description
        }
        #expect(text(.milliseconds(599_987)) == "process 31 (for 599.987 seconds more)")
        #expect(text(.nanoseconds(29_950_999_999)) == "process 31 (for 29.95 seconds more)")
        #expect(text(.seconds(600)) == "process 31 (for 600.0 seconds more)")
        #expect(text(.milliseconds(5)) == "process 31 (for 0.005 seconds more)")
        #expect(text(.milliseconds(-20), this: true) == "this process (for 0.0 seconds more)")
    }

    @Test func aTimeoutAfterTheLeaseWasTakenStillBlamesTheAuthority() {
        var s = State.holdingLock.make()
        s.armed[.attemptTimeout] = nil
        s.run(s.machine.timerFired(.attemptTimeout, now: s.now, unitRandom: 0))
        #expect(Self.leaseWaitFailure(s) == "the authority did not answer within 30.0 seconds")
        #expect(!s.lockHeld)
    }
}
