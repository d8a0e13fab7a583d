import Testing

@testable import SessionCore

/// The store-sync machine on its own: no loop, no store, no timer. A storage double performs
/// its actions the way `SessionEngine` does — reads and saves queue on the worker, first in
/// first out, and answer when the test says so; the retry timer is a flag — and after every
/// step the double and the machine must agree, and a store that is behind or unread must have
/// a way forward (the timer armed, or work on the worker).
@Suite("StoreSyncMachine")
struct StoreSyncMachineTests {
    static let stored = StoredSession(
        accessToken: Secret("A"), refreshToken: Secret("R"), accessTokenExpiresAt: .seconds(3600), memberID: "m")

    enum Job: Equatable {
        /// A read; `savesAfter`: saves submitted after it (its answer is older than they are).
        case read(StoreSyncMachine.Purpose, savesAfter: Int)
        case save
    }

    /// Performs actions as the engine does and records what is visible from outside.
    struct Storage {
        var machine = StoreSyncMachine()
        var retryArmed = false
        var jobs: [Job] = []
        var followed: [Int] = []  // savesAfter of each read followed
        var initialTaken = 0
        var unavailableSaid = 0
        var catchUps = 0
        var clearsRetried = 0
        var watches = 0
        var startUps: [StoreRead] = []

        mutating func run(_ actions: [StoreSyncMachine.Action]) {
            for action in actions {
                switch action {
                case .watchStore: watches += 1
                case .startUp(let read):
                    startUps.append(read)
                    // The engine's start-up with an unavailable store: read again on the timer.
                    if case .unavailable = read { run(machine.initialReadUnavailable()) }
                case .read(let purpose): jobs.append(.read(purpose, savesAfter: 0))
                case .armRetry:
                    #expect(!retryArmed, "the retry timer armed twice")
                    retryArmed = true
                case .cancelRetry: retryArmed = false
                case .takeInitialRead:
                    initialTaken += 1
                    // The engine writes its session back when it acted before the read answered.
                    if machine.isBehind { submitSave() }
                case .stillUnavailable: unavailableSaid += 1
                case .follow: break  // recorded where the read answers
                case .seeChangeAgain: run(machine.storeChangeSeen())
                case .catchUp:
                    catchUps += 1
                    submitSave()
                case .clearOwed:
                    clearsRetried += 1
                    submitSave()
                }
            }
        }

        /// The engine persists: a save goes to the worker, after every job there.
        mutating func submitSave(merged: Bool = false) {
            run(machine.saveSubmitted())
            if merged, let last = jobs.lastIndex(of: .save), last == jobs.count - 1 {
                run(machine.saveMerged())
                return
            }
            jobs = jobs.map { if case .read(let p, let after) = $0 { .read(p, savesAfter: after + 1) } else { $0 } }
            jobs.append(.save)
        }

        /// The worker runs its oldest job; a failing one finds the store unavailable.
        mutating func workerAnswers(failing: Bool) {
            guard !jobs.isEmpty else { return }
            switch jobs.removeFirst() {
            case .save:
                run(machine.saveAnswered(failed: failing))
            case .read(let purpose, let savesAfter):
                let read: StoreRead = failing ? .unavailable(StoreError("gone")) : .present(StoreSyncMachineTests.stored)
                let actions = purpose == .retry ? machine.retryReadAnswered(read) : machine.changeReadAnswered(read)
                if actions.contains(.follow(read)) { followed.append(savesAfter) }
                run(actions)
            }
        }

        mutating func retryFires(owingClears: Bool = false) {
            retryArmed = false
            run(machine.retryFired(owesClears: owingClears))
        }

        func checkConsistency(_ context: String) {
            #expect(machine.checkInvariants() == nil, "\(context): \(machine.checkInvariants() ?? "")")
            // The session starts once: one watch, at most one start-up, none before the start.
            #expect(watches == (machine.started ? 1 : 0), "\(context): \(watches) watches, started \(machine.started)")
            #expect(startUps.count <= watches, "\(context): \(startUps.count) start-ups")
            #expect(retryArmed == machine.retryArmed, "\(context): timer \(retryArmed), machine \(machine.retryArmed)")
            // Only a read that saw every save we made is followed.
            #expect(followed.allSatisfy { $0 == 0 }, "\(context): followed a read older than our save")
            let changeReads = jobs.filter { if case .read(.change, _) = $0 { true } else { false } }.count
            #expect(changeReads <= 1, "\(context): \(changeReads) change reads on the worker")
            if case .reading = machine.changeRead {
                #expect(changeReads == 1, "\(context): reading, with no read on the worker")
            }
            guard !machine.closed else {
                #expect(!retryArmed, "\(context): closed with the retry armed")
                return
            }
            // A way forward: nothing is left unread or behind with nothing that will change it.
            let retryRead = jobs.contains { if case .read(.retry, _) = $0 { true } else { false } }
            // (Before the start, a first read held unavailable waits for it: the start reads again.)
            if machine.initialRead == .unavailable, machine.heldRead == nil {
                #expect(retryArmed || retryRead, "\(context): unread with no retry")
            }
            // A change seen before the first read answered is still to be seen: the read is
            // on its way (the creation's, or the retry's).
            if machine.changeSeenUnread {
                #expect(machine.awaitingInitialRead, "\(context): a change seen, and nothing will read it")
            }
            if machine.isBehind {
                // (A retry read of a store not read yet: its answer writes the session back.)
                #expect(retryArmed || jobs.contains(.save) || retryRead, "\(context): behind with no retry")
            }
        }

        var name: String {
            var parts: [String] = ["\(machine.initialRead)"]
            if machine.isBehind { parts.append("behind") }
            if case .reading(_, let again) = machine.changeRead { parts.append(again ? "reading+again" : "reading") }
            if machine.changeSeenUnread { parts.append("seen") }
            if machine.retryArmed { parts.append("retry") }
            if machine.closed { parts.append("closed") }
            return parts.joined(separator: "/")
        }
    }

    enum State: String, CaseIterable, CustomStringConvertible {
        case even, onWorker, unavailable, behind, reading, readingAgain, readingThenSaved, closed
        var description: String { rawValue }

        func make() -> Storage {
            var s = Storage()
            switch self {
            case .even: break
            case .onWorker: s.run(s.machine.initialReadOnWorker())
            case .unavailable: s.run(s.machine.initialReadUnavailable())
            case .behind:
                s.submitSave()
                s.workerAnswers(failing: true)
            case .reading: s.run(s.machine.storeChangeSeen())
            case .readingAgain:
                s.run(s.machine.storeChangeSeen())
                s.run(s.machine.storeChangeSeen())
            case .readingThenSaved:
                s.run(s.machine.storeChangeSeen())
                s.submitSave()
            case .closed: s.run(s.machine.close(owesClears: false))
            }
            return s
        }
    }

    enum Event: String, CaseIterable, CustomStringConvertible {
        case initialReadAnswered, initialReadUnavailable, markBehind
        case save, saveMerged, workerAnswers, workerFails
        case retryFires, retryFiresOwingClears, changeSeen, close, closeOwingClears
        var description: String { rawValue }

        func apply(to s: inout Storage) {
            switch self {
            case .initialReadAnswered: s.run(s.machine.initialReadAnswered())
            case .initialReadUnavailable: s.run(s.machine.initialReadUnavailable())
            case .markBehind:
                // The engine writes its session back at once (`follow`, `initialReadAnswered`).
                s.run(s.machine.markBehind())
                s.submitSave()
            case .save: s.submitSave()
            case .saveMerged:
                s.submitSave()
                s.submitSave(merged: true)
            case .workerAnswers: s.workerAnswers(failing: false)
            case .workerFails: s.workerAnswers(failing: true)
            case .retryFires: s.retryFires()
            case .retryFiresOwingClears: s.retryFires(owingClears: true)
            case .changeSeen: s.run(s.machine.storeChangeSeen())
            case .close: s.run(s.machine.close(owesClears: false))
            case .closeOwingClears: s.run(s.machine.close(owesClears: true))
            }
        }
    }

    /// The state each (state, event) leads to. Columns: even, onWorker, unavailable, behind,
    /// reading, readingAgain, readingThenSaved, closed.
    static let expected: [Event: [String]] = [
        .initialReadAnswered: ["answered", "answered", "answered/retry", "answered/behind/retry", "answered/reading", "answered/reading+again", "answered/reading", "answered/closed"],
        .initialReadUnavailable: ["unavailable/retry", "unavailable/retry", "unavailable/retry", "unavailable/behind/retry", "unavailable/reading/retry", "unavailable/reading+again/retry", "unavailable/reading/retry", "unavailable/closed"],
        .markBehind: ["answered/behind", "onWorker/behind", "unavailable/behind/retry", "answered/behind/retry", "answered/behind/reading", "answered/behind/reading+again", "answered/behind/reading", "answered/behind/closed"],
        .save: ["answered", "onWorker", "unavailable/retry", "answered/behind/retry", "answered/reading", "answered/reading+again", "answered/reading", "answered/closed"],
        .saveMerged: ["answered", "onWorker", "unavailable/retry", "answered/behind/retry", "answered/reading", "answered/reading+again", "answered/reading", "answered/closed"],
        .workerAnswers: ["answered", "onWorker", "unavailable/retry", "answered/behind/retry", "answered", "answered/reading", "answered", "answered/closed"],
        .workerFails: ["answered", "onWorker", "unavailable/retry", "answered/behind/retry", "answered", "answered/reading", "answered", "answered/closed"],
        .retryFires: ["answered", "onWorker", "unavailable", "answered/behind", "answered/reading", "answered/reading+again", "answered/reading", "answered/closed"],
        .retryFiresOwingClears: ["answered", "onWorker", "unavailable", "answered/behind", "answered/reading", "answered/reading+again", "answered/reading", "answered/closed"],
        .changeSeen: ["answered/reading", "onWorker/seen", "unavailable/seen/retry", "answered/behind/retry", "answered/reading+again", "answered/reading+again", "answered/reading+again", "answered/closed"],
        .close: ["answered/closed", "onWorker/closed", "unavailable/closed", "answered/behind/closed", "answered/reading/closed", "answered/reading+again/closed", "answered/reading/closed", "answered/closed"],
        .closeOwingClears: ["answered/closed", "onWorker/closed", "unavailable/closed", "answered/behind/closed", "answered/reading/closed", "answered/reading+again/closed", "answered/reading/closed", "answered/closed"],
    ]

    @Test("every state × every event leads to the expected state, with the double consistent",
          arguments: State.allCases)
    func everyStateTimesEveryEvent(state: State) {
        for event in Event.allCases {
            var s = state.make()
            s.checkConsistency("\(state) before \(event)")
            event.apply(to: &s)
            let column = State.allCases.firstIndex(of: state)!
            #expect(s.name == Self.expected[event]![column], "\(state) + \(event) → \(s.name)")
            s.checkConsistency("\(state) + \(event)")
            // The store answers everything from now on: it ends even, read, and idle.
            for _ in 0..<10 {
                while !s.jobs.isEmpty { s.workerAnswers(failing: false) }
                if s.retryArmed { s.retryFires() }
                s.checkConsistency("\(state) + \(event), draining")
            }
            // The creation's read is not the machine's; a closed session is left as it was.
            if s.machine.initialRead != .onWorker, !s.machine.closed {
                #expect(!s.machine.isBehind && !s.machine.awaitingInitialRead && s.jobs.isEmpty && !s.retryArmed,
                        "\(state) + \(event), drained: \(s.name)")
            }
        }
    }

    // MARK: - The start: every state × every event

    enum StartState: String, CaseIterable, CustomStringConvertible {
        case heldAtCreation, heldUnavailable, readOnWorker, started, closedBeforeStart
        var description: String { rawValue }

        func make() -> Storage {
            var s = Storage()
            switch self {
            case .heldAtCreation: s.run(s.machine.firstReadHeld(.present(StoreSyncMachineTests.stored)))
            case .heldUnavailable: s.run(s.machine.firstReadHeld(.unavailable(StoreError("locked"))))
            case .readOnWorker: s.run(s.machine.initialReadOnWorker())
            case .started:
                s.run(s.machine.firstReadHeld(.absent))
                s.run(s.machine.startRequested())
            case .closedBeforeStart:
                s.run(s.machine.firstReadHeld(.absent))
                s.run(s.machine.close(owesClears: false))
            }
            return s
        }
    }

    enum StartEvent: String, CaseIterable, CustomStringConvertible {
        case start, firstReadArrives
        var description: String { rawValue }

        func apply(to s: inout Storage) {
            switch self {
            case .start: s.run(s.machine.startRequested())
            case .firstReadArrives:
                // As the engine does: held before the start, taken at once after it.
                if s.machine.started {
                    s.run(s.machine.initialReadAnswered())
                } else {
                    s.run(s.machine.firstReadHeld(.present(StoreSyncMachineTests.stored)))
                }
            }
        }
    }

    /// Columns: heldAtCreation, heldUnavailable, readOnWorker, started, closedBeforeStart.
    static let startExpected: [StartEvent: [String]] = [
        .start: ["started/answered/1", "started/unavailable/1", "started/onWorker/0", "started/answered/1", "waiting/held/answered/closed"],
        .firstReadArrives: ["waiting/held/answered", "waiting/held/answered", "waiting/held/answered", "started/answered/1", "waiting/held/answered/closed"],
    ]

    @Test("every start state × every event: one start, from the read held, never after close",
          arguments: StartState.allCases)
    func everyStartStateTimesEveryEvent(state: StartState) {
        for event in StartEvent.allCases {
            var s = state.make()
            s.checkConsistency("\(state) before \(event)")
            event.apply(to: &s)
            let m = s.machine
            let name = m.started
                ? "started/\(m.initialRead)/\(s.startUps.count)"
                : "waiting/\(m.heldRead == nil ? "-" : "held")/\(m.initialRead)\(m.closed ? "/closed" : "")"
            let column = StartState.allCases.firstIndex(of: state)!
            #expect(name == Self.startExpected[event]![column], "\(state) + \(event) → \(name)")
            s.checkConsistency("\(state) + \(event)")
        }
    }

    @Test func aSessionStartsFromTheReadHeldAtCreationOnceHoweverOftenItIsAskedTo() {
        var s = Storage()
        s.run(s.machine.firstReadHeld(.present(Self.stored)))
        s.run(s.machine.startRequested())
        s.run(s.machine.startRequested())
        #expect(s.startUps == [.present(Self.stored)] && s.watches == 1)
        #expect(s.machine.heldRead == nil)
    }

    // MARK: - Behaviour, step by step

    /// Another process's change is read; before the answer, the session saves (its own write
    /// lands after the read on the worker). The read is older than our save: following it
    /// would undo the save (a logout followed back to the tokens we just cleared).
    @Test func aChangeReadAnsweredAfterOurSaveWasSubmittedIsNotFollowed() {
        var s = Storage()
        s.run(s.machine.storeChangeSeen())
        s.submitSave()
        s.workerAnswers(failing: false)  // the read
        #expect(s.followed.isEmpty, "a read older than our save was followed")
        s.checkConsistency("after the stale read")
        s.workerAnswers(failing: false)  // the save
        s.run(s.machine.storeChangeSeen())  // its own directory event
        s.workerAnswers(failing: false)
        #expect(s.followed == [0])
    }

    @Test func changesSeenWhileAReadIsOnTheWorkerReadOnceMoreAfterItsAnswer() {
        var s = Storage()
        s.run(s.machine.storeChangeSeen())
        s.run(s.machine.storeChangeSeen())
        s.run(s.machine.storeChangeSeen())
        #expect(s.jobs.count == 1)
        s.workerAnswers(failing: false)
        #expect(s.jobs == [.read(.change, savesAfter: 0)], "one more read for the changes seen meanwhile")
        s.workerAnswers(failing: false)
        #expect(s.followed.count == 2 && s.jobs.isEmpty)
    }

    /// Another process changes the store while the session's first read is on the worker (the
    /// creation's read, or the retry's of a store that was unavailable): that answer may be
    /// older than the change, so once it is taken the store is read again and followed.
    /// Before, the change was dropped and missed until the next one.
    @Test func aChangeSeenBeforeTheFirstReadAnsweredIsReadAfterIt() {
        var retry = Storage()
        retry.run(retry.machine.initialReadUnavailable())
        retry.retryFires()
        #expect(retry.jobs == [.read(.retry, savesAfter: 0)])
        retry.run(retry.machine.storeChangeSeen())
        retry.workerAnswers(failing: false)  // the retry's read: taken
        #expect(retry.initialTaken == 1)
        #expect(retry.jobs == [.read(.change, savesAfter: 0)], "the change seen meanwhile is not read: \(retry.jobs)")
        retry.workerAnswers(failing: false)
        #expect(retry.followed == [0])

        var creation = Storage()
        creation.run(creation.machine.initialReadOnWorker())
        creation.run(creation.machine.storeChangeSeen())
        creation.run(creation.machine.initialReadAnswered())
        #expect(creation.jobs == [.read(.change, savesAfter: 0)])
        #expect(!creation.machine.changeSeenUnread)

        // Still unavailable: the change stays to be seen until the store answers.
        var still = Storage()
        still.run(still.machine.initialReadUnavailable())
        still.run(still.machine.storeChangeSeen())
        still.retryFires()
        still.workerAnswers(failing: true)
        #expect(still.machine.changeSeenUnread && still.jobs.isEmpty && still.retryArmed)
        still.retryFires()
        still.workerAnswers(failing: false)
        #expect(still.jobs == [.read(.change, savesAfter: 0)])
    }

    /// A first read that found the store unavailable, held for the start, leaves what it holds
    /// unknown: the snapshot must not say "signed out" (the accounts façade retired such a
    /// background session as if its record had gone).
    @Test func aFirstReadHeldUnavailableIsNotAnAnswer() {
        var s = Storage()
        s.run(s.machine.firstReadHeld(.unavailable(StoreError("locked"))))
        #expect(s.machine.awaitingInitialRead)
        s.run(s.machine.startRequested())
        #expect(s.machine.awaitingInitialRead && s.retryArmed)
        s.retryFires()
        s.workerAnswers(failing: false)
        #expect(!s.machine.awaitingInitialRead && s.initialTaken == 1)
        var present = Storage()
        present.run(present.machine.firstReadHeld(.present(Self.stored)))
        #expect(!present.machine.awaitingInitialRead)
    }

    @Test func nothingIsFollowedWhileTheStoreIsBehindUntilAWriteLands() {
        var s = Storage()
        s.run(s.machine.storeChangeSeen())
        s.submitSave()
        s.workerAnswers(failing: false)  // the read: stale
        s.workerAnswers(failing: true)  // the save fails: behind
        s.run(s.machine.storeChangeSeen())
        #expect(s.jobs.isEmpty, "a store behind us is not read for changes")
        s.retryFires()
        #expect(s.catchUps == 1)
        s.workerAnswers(failing: false)
        #expect(!s.machine.isBehind)
        s.run(s.machine.storeChangeSeen())
        #expect(s.jobs.count == 1)
    }

    @Test func aStoreUnreadableAtStartIsReadAgainOnTheTimerUntilItAnswers() {
        var s = Storage()
        s.run(s.machine.initialReadUnavailable())
        s.retryFires()
        s.workerAnswers(failing: true)
        #expect(s.unavailableSaid == 1 && s.retryArmed && s.machine.awaitingInitialRead)
        s.retryFires()
        s.workerAnswers(failing: false)
        #expect(s.initialTaken == 1 && !s.retryArmed && !s.machine.awaitingInitialRead)
    }

    @Test func aRetryReadAnsweredAfterTheFirstReadAnsweredOtherwiseIsIgnored() {
        var s = Storage()
        s.run(s.machine.initialReadOnWorker())
        s.submitSave()
        s.workerAnswers(failing: true)  // a save while reading fails: the timer reads too
        s.retryFires()
        s.run(s.machine.initialReadAnswered())  // the creation's read answers first
        s.workerAnswers(failing: false)
        #expect(s.initialTaken == 0, "the first read was taken twice")
    }

    /// A logout's clear failed (the store behind), then a later write landed: the clear is
    /// still owed, the store no longer behind.
    static func clearOwedAfterALaterWrite() -> Storage {
        var s = Storage()
        s.submitSave()
        s.workerAnswers(failing: true)
        s.submitSave()
        s.workerAnswers(failing: false)
        s.run(s.machine.clearStillOwed())
        return s
    }

    @Test func aClearStillOwedKeepsTheRetriesGoingAfterALaterWriteLanded() {
        var s = Self.clearOwedAfterALaterWrite()
        s.retryFires(owingClears: true)
        #expect(s.catchUps == 1)
    }

    /// A logout's clear failed, then a later write landed (the store is not behind): closing
    /// before the retry fired must still send the clear once more, or the logged-out account's
    /// tokens come back at the next start. Only the clears: the session's record is current.
    /// Nothing is tried for a store never read, and nothing twice.
    @Test func closingSendsAClearStillOwedAgainThoughALaterWriteLanded() {
        var s = Self.clearOwedAfterALaterWrite()
        #expect(!s.machine.isBehind && s.retryArmed)
        s.run(s.machine.close(owesClears: true))
        #expect(s.clearsRetried == 1 && s.catchUps == 0 && !s.retryArmed, "\(s.clearsRetried) \(s.catchUps)")
        s.run(s.machine.close(owesClears: true))
        #expect(s.clearsRetried == 1)
        var unread = Storage()
        unread.run(unread.machine.initialReadUnavailable())
        unread.run(unread.machine.close(owesClears: true))
        #expect(unread.clearsRetried == 0 && unread.catchUps == 0)
        var behind = Storage()
        behind.submitSave()
        behind.workerAnswers(failing: true)
        behind.run(behind.machine.close(owesClears: true))
        #expect(behind.catchUps == 1 && behind.clearsRetried == 0)  // the catch-up sends the clears too
    }

    @Test func closingGivesAStoreThatMissedAWriteOneLastTryAndArmsNothingMore() {
        var s = Storage()
        s.submitSave()
        s.workerAnswers(failing: true)
        s.run(s.machine.close(owesClears: false))
        #expect(s.catchUps == 1 && !s.retryArmed)
        s.workerAnswers(failing: true)
        #expect(!s.retryArmed, "a retry armed after close")
        s.run(s.machine.storeChangeSeen())
        #expect(s.jobs.isEmpty)
    }
}
