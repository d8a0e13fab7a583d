import Testing

@testable import SessionCore

/// The accounts machine on its own: no loop, no store, no sessions. A storage double performs
/// its actions the way `SessionManager` does — list reads and pointer writes queue on their
/// workers (first in, first out) and answer when the test says so — and after every step the
/// double's store and sessions must agree with what the machine believes.
@Suite("AccountsMachine")
struct AccountsMachineTests {
    /// Performs actions as the manager does, with the store and its two workers in memory.
    struct Storage {
        var machine = AccountsMachine()
        /// The store: its account keys and its active-account pointer.
        var storeKeys: Set<String> = ["bob"]
        var storePointer: String?
        /// List reads on the worker, oldest first; `taken`: the list it read (nil: not run yet).
        var listReads: [(request: UInt64, taken: StoredAccounts?)] = []
        /// Pointer writes on the pointer's worker, oldest first.
        var pointerWrites: [(key: String, request: UInt64)] = []
        /// The accounts with a session.
        var sessions: Set<String> = []
        /// The account the manager made active last.
        var lastActive: String?
        /// Another process wrote the pointer after our last write landed.
        var pointerMovedElsewhere = false
        /// The store took a write of the active session since the latest pointer write was made.
        var storeTookWriteSinceLatestPointerWrite = false
        /// The manager's list retry timer.
        var listRetryArmed = false
        /// The latest list read requested answered unavailable (nothing asks again but the timer).
        var latestListReadUnavailable = false

        mutating func run(_ actions: [AccountsMachine.Action]) {
            for action in actions {
                switch action {
                case .readList(let request): listReads.append((request, nil))
                case .addSessions(let list): sessions.formUnion(list.keys)
                case .writePointer(let key, let request):
                    pointerWrites.append((key, request))
                    storeTookWriteSinceLatestPointerWrite = false
                case .readListLater:
                    #expect(!listRetryArmed, "the list retry armed twice")
                    listRetryArmed = true
                }
            }
        }

        // MARK: What happens outside the machine

        /// Another process signed `key` in: the store changes, and the directory watch says so.
        mutating func otherProcessSignsIn(_ key: String) {
            storeKeys.insert(key)
            run(machine.storeChanged())
        }

        /// The worker runs the oldest list read that has not run: it takes the list now.
        mutating func listReadTakesList() {
            guard let index = listReads.firstIndex(where: { $0.taken == nil }) else { return }
            listReads[index].taken = StoredAccounts(keys: storeKeys.sorted(), active: storePointer)
        }

        /// The oldest list read answers (taking the list now if it has not yet).
        mutating func listReadAnswers(unavailable: Bool = false) {
            guard !listReads.isEmpty else { return }
            if listReads[0].taken == nil { listReadTakesList() }
            let (request, taken) = listReads.removeFirst()
            let answer: AccountsRead = unavailable ? .unavailable(StoreError("disk gone")) : .present(taken!)
            if request == machine.listRequest { latestListReadUnavailable = unavailable }
            run(machine.listAnswered(answer, request: request))
        }

        /// The manager's list retry timer fires.
        mutating func listRetryFires() {
            guard listRetryArmed else { return }
            listRetryArmed = false
            run(machine.listRetryFired())
        }

        mutating func switchTo(_ key: String) {
            lastActive = key
            run(machine.activeChanged(to: key))
        }

        /// The pointer's worker runs its oldest write, which lands or fails, and answers.
        mutating func pointerWriteAnswers(failing: Bool) {
            guard !pointerWrites.isEmpty else { return }
            let (key, request) = pointerWrites.removeFirst()
            if !failing {
                storePointer = key
                pointerMovedElsewhere = false
            }
            run(machine.pointerAnswered(request: request, failed: failing))
        }

        /// The signed-out active session follows another process's sign-in of `key` to its
        /// session here, found by a read of the store submitted at `mark`.
        mutating func follow(to key: String, readAt mark: AccountsMachine.PointerMark) {
            lastActive = key
            run(machine.activeFollowed(to: key, readAt: mark))
        }

        /// Another process records `key` as the active account.
        mutating func otherProcessPoints(to key: String) {
            storePointer = key
            pointerMovedElsewhere = true
        }

        /// The store took a write of the active session (its record).
        mutating func activeWriteLands() {
            storeTookWriteSinceLatestPointerWrite = true
            run(machine.activeWriteLanded())
        }

        // MARK: What must always hold

        func checkConsistency(_ context: String) {
            #expect(machine.checkInvariants() == nil, "\(context): \(machine.checkInvariants() ?? "")")
            #expect(listRetryArmed == machine.listRetryArmed, "\(context): timer \(listRetryArmed), machine \(machine.listRetryArmed)")
            // A way forward: a list the store could not give is read again on the timer, or a
            // read is on the worker.
            if !machine.listed, !machine.closed, latestListReadUnavailable {
                #expect(listRetryArmed || !listReads.isEmpty, "\(context): unlisted after an unavailable read, with no retry")
            }
            // A list taken never misses an account of the store (accounts only join here).
            if machine.listed {
                #expect(sessions.isSuperset(of: storeKeys), "\(context): listed, sessions \(sessions.sorted()) vs store \(storeKeys.sorted())")
            }
            switch machine.pointer {
            case .recorded:
                #expect(pointerWrites.isEmpty, "\(context): recorded with writes on their way")
                // Or another process's later choice, which ours does not undo.
                #expect(storePointer == lastActive || pointerMovedElsewhere,
                    "\(context): recorded, but the store says \(storePointer ?? "-") for \(lastActive ?? "-")")
            case .writing(let request, let key, _):
                #expect(key == lastActive, "\(context): writing \(key) for \(lastActive ?? "-")")
                #expect(pointerWrites.last?.request == request, "\(context): the write in flight is not the latest submitted")
            case .owed(let key):
                #expect(key == lastActive, "\(context): owes \(key) for \(lastActive ?? "-")")
                #expect(pointerWrites.isEmpty, "\(context): owed with writes on their way")
                // The store took an active write after the failing write was made: it is
                // reachable, and the pointer must not wait for yet another write.
                #expect(!storeTookWriteSinceLatestPointerWrite, "\(context): owed though the store took a write since")
            }
        }

        var listName: String {
            "\(machine.listed ? "listed" : "unlisted")/\(listReads.count)\(machine.listRetryArmed ? "+retry" : "")"
                + (machine.closed ? "+closed" : "")
        }

        var pointerName: String {
            switch machine.pointer {
            case .recorded: "recorded"
            case .writing(_, _, let landed): "writing/\(pointerWrites.count)\(landed ? "+landed" : "")"
            case .owed: "owed"
            }
        }
    }

    // MARK: - The account list: every state × every event

    enum ListState: String, CaseIterable, CustomStringConvertible {
        case unread, reading, readingStale, listed, unavailable
        var description: String { rawValue }

        func make() -> Storage {
            var s = Storage()
            switch self {
            case .unread: break
            case .reading: s.run(s.machine.listWanted())
            case .readingStale:
                // A read took the list, then the store changed: a second read is asked for.
                s.run(s.machine.listWanted())
                s.listReadTakesList()
                s.otherProcessSignsIn("carol")
            case .listed:
                s.run(s.machine.listWanted())
                s.listReadAnswers()
            case .unavailable:
                s.run(s.machine.listWanted())
                s.listReadAnswers(unavailable: true)
            }
            return s
        }
    }

    enum ListEvent: String, CaseIterable, CustomStringConvertible {
        case storeChanged, stateChangedWhileStoreReading, stateChangedStoreRead, answer, answerUnavailable, sessionsNotMade
        case retryFires, close
        var description: String { rawValue }

        func apply(to s: inout Storage) {
            switch self {
            case .storeChanged: s.otherProcessSignsIn("dave")
            case .stateChangedWhileStoreReading: s.run(s.machine.sessionStateChanged(storeReading: true))
            case .stateChangedStoreRead: s.run(s.machine.sessionStateChanged(storeReading: false))
            case .answer: s.listReadAnswers()
            case .answerUnavailable: s.listReadAnswers(unavailable: true)
            case .sessionsNotMade: s.run(s.machine.sessionsNotMade())
            case .retryFires: s.listRetryFires()
            case .close:
                s.run(s.machine.close())
                s.listRetryArmed = false  // the manager cancels its timer
            }
        }
    }

    /// Columns: unread, reading, readingStale, listed, unavailable. "listed/0": the list taken,
    /// no read on the worker; "+retry": the list retry timer armed.
    static let listExpected: [ListEvent: [String]] = [
        .storeChanged: ["unlisted/1", "unlisted/2", "unlisted/3", "unlisted/1", "unlisted/1+retry"],
        .stateChangedWhileStoreReading: ["unlisted/0", "unlisted/1", "unlisted/2", "listed/0", "unlisted/0+retry"],
        .stateChangedStoreRead: ["unlisted/1", "unlisted/2", "unlisted/3", "listed/0", "unlisted/1+retry"],
        .answer: ["unlisted/0", "listed/0", "unlisted/1", "listed/0", "unlisted/0+retry"],
        .answerUnavailable: ["unlisted/0", "unlisted/0+retry", "unlisted/1", "listed/0", "unlisted/0+retry"],
        .sessionsNotMade: ["unlisted/0", "unlisted/1", "unlisted/2", "unlisted/0", "unlisted/0+retry"],
        .retryFires: ["unlisted/0", "unlisted/1", "unlisted/2", "listed/0", "unlisted/1"],
        .close: ["unlisted/0+closed", "unlisted/1+closed", "unlisted/2+closed", "listed/0+closed", "unlisted/0+closed"],
    ]

    @Test("every list state × every event leads to the expected state, the pointer untouched",
          arguments: ListState.allCases)
    func everyListStateTimesEveryEvent(state: ListState) {
        for event in ListEvent.allCases {
            var s = state.make()
            s.checkConsistency("\(state) before \(event)")
            let pointerBefore = s.machine.pointer
            event.apply(to: &s)
            let column = ListState.allCases.firstIndex(of: state)!
            #expect(s.listName == Self.listExpected[event]![column], "\(state) + \(event) → \(s.listName)")
            #expect(s.machine.pointer == pointerBefore, "\(state) + \(event) moved the pointer")
            s.checkConsistency("\(state) + \(event)")
            // Whatever is still on the worker answers, the timer fires: the list ends up taken
            // and complete, with no help from a state change. Closed: nothing more is read or
            // taken, whatever answers.
            let sessionsAtClose = s.sessions
            for _ in 0..<3 {
                while !s.listReads.isEmpty { s.listReadAnswers() }
                s.listRetryFires()
            }
            if s.machine.closed {
                s.otherProcessSignsIn("erin")
                s.run(s.machine.sessionStateChanged(storeReading: false))
                #expect(s.listReads.isEmpty && !s.listRetryArmed && s.sessions == sessionsAtClose,
                        "\(state) + close: \(s.listName), sessions \(s.sessions.sorted())")
                continue
            }
            if !s.machine.listed, !s.latestListReadUnavailable {
                // Never asked for (or the sessions not made): the next state change asks. After
                // an unavailable read the timer alone must have brought the list.
                s.run(s.machine.sessionStateChanged(storeReading: false))
                while !s.listReads.isEmpty { s.listReadAnswers() }
            }
            #expect(s.machine.listed && s.sessions.isSuperset(of: s.storeKeys), "\(state) + \(event), drained: \(s.listName)")
            s.checkConsistency("\(state) + \(event), drained")
        }
    }

    // MARK: - The active-account pointer: every state × every event

    enum PointerState: String, CaseIterable, CustomStringConvertible {
        case recorded, writing, writingTwo, writingStoreTookWrite, owed
        var description: String { rawValue }

        func make() -> Storage {
            var s = Storage()
            switch self {
            case .recorded:
                s.switchTo("alice")
                s.pointerWriteAnswers(failing: false)
            case .writing: s.switchTo("alice")
            case .writingTwo:
                s.switchTo("alice")
                s.switchTo("bob")
            case .writingStoreTookWrite:
                s.switchTo("alice")
                s.activeWriteLands()
            case .owed:
                s.switchTo("alice")
                s.pointerWriteAnswers(failing: true)
            }
            return s
        }
    }

    enum PointerEvent: String, CaseIterable, CustomStringConvertible {
        case switchAccount, writeLands, writeFails, activeWriteLands, followAnotherProcess
        var description: String { rawValue }

        func apply(to s: inout Storage) {
            switch self {
            case .switchAccount: s.switchTo("carol")
            case .followAnotherProcess:
                // A change read submitted now finds carol, whom another process made active;
                // the signed-out active session follows it to carol's session here.
                let mark = s.machine.pointerMark
                s.otherProcessPoints(to: "carol")
                s.follow(to: "carol", readAt: mark)
            case .writeLands: s.pointerWriteAnswers(failing: false)
            case .writeFails: s.pointerWriteAnswers(failing: true)
            case .activeWriteLands: s.activeWriteLands()
            }
        }
    }

    /// Columns: recorded, writing, writingTwo, writingStoreTookWrite, owed.
    static let pointerExpected: [PointerEvent: [String]] = [
        .switchAccount: ["writing/1", "writing/2", "writing/3", "writing/2", "writing/1"],
        .writeLands: ["recorded", "recorded", "writing/1", "recorded", "owed"],
        .writeFails: ["recorded", "owed", "writing/1", "writing/1", "owed"],
        .activeWriteLands: ["recorded", "writing/1+landed", "writing/2+landed", "writing/1+landed", "writing/1"],
        // Written only if a write of ours was on its way at the read (it may land over carol).
        .followAnotherProcess: ["recorded", "writing/2", "writing/3", "writing/2", "recorded"],
    ]

    @Test("every pointer state × every event leads to the expected state, the list untouched",
          arguments: PointerState.allCases)
    func everyPointerStateTimesEveryEvent(state: PointerState) {
        for event in PointerEvent.allCases {
            var s = state.make()
            s.checkConsistency("\(state) before \(event)")
            let (listed, listRequest) = (s.machine.listed, s.machine.listRequest)
            event.apply(to: &s)
            let column = PointerState.allCases.firstIndex(of: state)!
            #expect(s.pointerName == Self.pointerExpected[event]![column], "\(state) + \(event) → \(s.pointerName)")
            #expect(s.machine.listed == listed && s.machine.listRequest == listRequest, "\(state) + \(event) moved the list")
            s.checkConsistency("\(state) + \(event)")
            // The store comes back: every write lands, and one active write repays a debt.
            while !s.pointerWrites.isEmpty { s.pointerWriteAnswers(failing: false) }
            s.activeWriteLands()
            while !s.pointerWrites.isEmpty { s.pointerWriteAnswers(failing: false) }
            #expect(s.machine.pointer == .recorded && s.storePointer == s.lastActive, "\(state) + \(event), drained: \(s.pointerName)")
        }
    }

    // MARK: - The races, step by step

    /// 64beb70: a read of the list took it before another process signed carol in; its answer
    /// arrives after the read that change asked for was made. Taking it would mark the list
    /// read and drop the later answer: carol would never get a session.
    @Test func aListReadAnsweredAfterALaterChangeOfTheStoreIsNotTaken() {
        var s = Storage()
        s.run(s.machine.storeChanged())
        s.listReadTakesList()  // [bob]
        s.otherProcessSignsIn("carol")

        s.listReadAnswers()  // the first read's [bob]
        #expect(!s.machine.listed, "an earlier read's answer was taken")
        s.checkConsistency("after the stale answer")

        s.listReadAnswers()  // the second read's [bob, carol]
        #expect(s.machine.listed)
        #expect(s.sessions == ["bob", "carol"])
    }

    /// The owed flag cleared by a stale answer: the switch to alice and then to carol are both
    /// on the pointer's worker; alice's write lands, carol's fails. Alice's success says
    /// nothing about carol's write: carol is owed, and written with the next active write.
    @Test func aStaleSuccessOfAnEarlierPointerWriteDoesNotClearTheLatestWritesDebt() {
        var s = Storage()
        s.switchTo("alice")
        s.switchTo("carol")

        s.pointerWriteAnswers(failing: false)  // alice's: lands
        s.checkConsistency("after alice's write")
        s.pointerWriteAnswers(failing: true)  // carol's: fails
        #expect(s.machine.pointer == .owed(key: "carol"))
        s.checkConsistency("after carol's failure")

        s.activeWriteLands()
        #expect(s.pointerWrites.map(\.key) == ["carol"], "the owed pointer is written again with the next active write")
        s.pointerWriteAnswers(failing: false)
        #expect(s.storePointer == "carol")
        s.checkConsistency("repaid")
    }

    /// The owed flag cleared too early: the pointer write is on its way when the store takes
    /// a write of the active session (it came back), and the pointer write's failure is known
    /// only after that landing. Waiting for the next active write could mean an hour (the
    /// next refresh): the pointer is written again at once.
    @Test func aPointerWriteThatFailsAfterTheStoreTookAnActiveWriteIsMadeAgainAtOnce() {
        var s = Storage()
        s.switchTo("alice")
        s.activeWriteLands()  // the landing reaches the loop before the pointer's failure
        s.pointerWriteAnswers(failing: true)
        #expect(s.pointerWrites.map(\.key) == ["alice"], "written again at once")
        s.checkConsistency("after the failure")
        s.pointerWriteAnswers(failing: false)
        #expect(s.machine.pointer == .recorded && s.storePointer == "alice")
    }

    /// The signed-out active session follows another process's sign-in of bob (its read of
    /// the store found the pointer on bob); before the switch is made, the other process moves
    /// on to carol. Writing bob again would undo carol: the followed switch writes nothing.
    @Test func aSwitchFollowingAnotherProcessWritesNoPointerSoTheirLaterChangeStands() {
        var s = Storage()
        s.otherProcessPoints(to: "bob")
        let mark = s.machine.pointerMark  // our change read is submitted, and finds bob
        s.otherProcessPoints(to: "carol")  // the other process moves on
        s.follow(to: "bob", readAt: mark)
        #expect(s.pointerWrites.isEmpty)
        #expect(s.storePointer == "carol" && s.machine.pointer == .recorded)
        s.checkConsistency("after the followed switch")
        // Unknown where the read stood: written as any switch is.
        s.follow(to: "bob", readAt: .unknown)
        #expect(s.pointerWrites.map(\.key) == ["bob"])
    }

    /// A write of ours on its way when the read was submitted may land after it, over the
    /// other process's pointer: then the followed switch writes its key, so the store does not
    /// name an account this process left.
    @Test func aSwitchFollowingAnotherProcessWritesThePointerIfOursMayHaveLandedOverTheirs() {
        var s = Storage()
        s.switchTo("alice")  // on the pointer's worker
        let mark = s.machine.pointerMark
        s.otherProcessPoints(to: "bob")  // our read finds bob
        s.pointerWriteAnswers(failing: false)  // then alice lands over it
        #expect(s.storePointer == "alice")
        s.follow(to: "bob", readAt: mark)
        s.pointerWriteAnswers(failing: false)
        #expect(s.storePointer == "bob")
        s.checkConsistency("in flight at the read")

        // A write asked for after the read (an owed one, repaid) is the same case.
        var t = Storage()
        t.switchTo("alice")
        t.pointerWriteAnswers(failing: true)  // owed
        let clean = t.machine.pointerMark
        t.otherProcessPoints(to: "bob")  // our read finds bob
        t.activeWriteLands()  // the debt is written now: alice, after the read
        t.pointerWriteAnswers(failing: false)
        #expect(t.storePointer == "alice")
        t.follow(to: "bob", readAt: clean)
        t.pointerWriteAnswers(failing: false)
        #expect(t.storePointer == "bob")
        t.checkConsistency("asked for since the read")
    }

    /// A debt of ours (a failed write of alice) is void once the active session follows the
    /// store to bob: the store names the account this process is on.
    @Test func aFollowedSwitchVoidsAnOwedPointer() {
        var s = Storage()
        s.switchTo("alice")
        s.pointerWriteAnswers(failing: true)
        #expect(s.machine.pointer == .owed(key: "alice"))
        s.otherProcessPoints(to: "bob")
        let mark = s.machine.pointerMark
        s.follow(to: "bob", readAt: mark)
        s.activeWriteLands()
        #expect(s.pointerWrites.isEmpty, "alice is not written over bob")
        #expect(s.machine.pointer == .recorded && s.storePointer == "bob")
        s.checkConsistency("debt void")
    }

    @Test func anOwedPointerWaitsForTheNextActiveWriteAndIsWrittenOnce() {
        var s = Storage()
        s.switchTo("alice")
        s.pointerWriteAnswers(failing: true)
        #expect(s.pointerWrites.isEmpty, "nothing is retried before the store takes a write")
        s.activeWriteLands()
        s.activeWriteLands()
        #expect(s.pointerWrites.map(\.key) == ["alice"], "one write however many active writes land")
        s.pointerWriteAnswers(failing: false)
        #expect(s.machine.pointer == .recorded)
    }

    @Test func aStateChangeReadsTheListOnlyOnceTheActiveSessionsStoreHasAnswered() {
        var s = Storage()
        s.run(s.machine.sessionStateChanged(storeReading: true))
        #expect(s.listReads.isEmpty)
        s.run(s.machine.sessionStateChanged(storeReading: false))
        #expect(s.listReads.count == 1)
        s.listReadAnswers()
        s.run(s.machine.sessionStateChanged(storeReading: false))
        #expect(s.listReads.isEmpty, "a taken list is not read again for a state change")
    }
}
