/// Where the credential store stands against the session, as a pure value: whether the
/// store has answered the session's first read (held until the session starts, which it does
/// once), whether it missed a write (it is *behind*), the one read that follows another
/// process's change, and the retry timer.
///
/// - Write-behind: a failed write or clear never logs anyone out. The session goes on in
///   memory, the store is behind, and the retry timer brings it up to date (`catchUp`).
/// - The initial read: a store that could not be read at start is read again on the same
///   timer until it answers; while it has not, the stored session is unknown.
/// - Another process's change is read one read at a time (a change seen meanwhile reads
///   again after it); a read answered after a save of ours was submitted is stale (the save
///   lands after it, and its own directory event reads again), and is not followed — nor is
///   anything while the store is behind us (following it would undo our write).
///
/// Every `mutating` event function returns the actions the caller must perform, in order;
/// nothing here does I/O or reads a clock. `SessionEngine` performs them on the loop thread
/// (`SessionEngine+Store.swift`). Tested state × event without a loop (`StoreSyncMachineTests`).
struct StoreSyncMachine: Sendable, Equatable {
    /// The session's first read of the store.
    enum InitialRead: Sendable, Equatable {
        /// Answered: the stored session is known.
        case answered
        /// On the worker (the session was made on its loop thread, which never waits).
        case onWorker
        /// The store could not be read: read again on the retry timer.
        case unavailable
    }

    /// The read that follows another process's change.
    enum ChangeRead: Sendable, Equatable {
        case idle
        /// On the worker since `savesBefore` saves were submitted; `again`: another change was
        /// seen meanwhile.
        case reading(savesBefore: UInt64, again: Bool)
    }

    enum Purpose: Sendable, Equatable {
        /// The retry timer's read of a store whose first read has not answered.
        case retry
        /// The read of another process's change.
        case change
    }

    enum Action: Sendable, Equatable {
        /// The session starts: watch the shared store's directory.
        case watchStore
        /// The session starts from the first read: emit the start-up events for it.
        case startUp(StoreRead)
        /// Read the store on the worker; its answer comes back as `retryReadAnswered` or
        /// `changeReadAnswered`.
        case read(Purpose)
        case armRetry
        case cancelRetry
        /// The store answered the first read at last: take what it holds.
        case takeInitialRead(StoreRead)
        /// The retry's read found the store still unavailable (say so; the timer is armed).
        case stillUnavailable(StoreError)
        /// Follow what another process left in the store.
        case follow(StoreRead)
        /// A change was seen while the last change read was on the worker: see it now (after
        /// following the read that answered, which may have saved or found the store behind).
        case seeChangeAgain
        /// Write what the store missed: the clears it owes, then the session.
        case catchUp
        /// Send again the clears still owed (the session's own record is up to date).
        case clearOwed
    }

    private(set) var initialRead = InitialRead.answered
    /// The session has started (`SessionEngine.start`): its start-up events are out, or come
    /// with the first read's answer.
    private(set) var started = false
    /// The first read, held from its answer until the session starts.
    private(set) var heldRead: StoreRead?
    private(set) var isBehind = false
    /// Saves handed to the worker and not merged into one still waiting there.
    private(set) var savesSubmitted: UInt64 = 0
    private(set) var changeRead = ChangeRead.idle
    /// Another process changed the store while the first read had not answered: once it does,
    /// the store is read again (that answer may be older than the change).
    private(set) var changeSeenUnread = false
    private(set) var retryArmed = false
    private(set) var closed = false

    /// The stored session is not known yet.
    var awaitingInitialRead: Bool { initialRead != .answered }

    // MARK: - The first read, and the start

    /// The first read answered before the session started (at creation, or on the worker):
    /// held for the start, which emits the start-up events for it. An unavailable store is
    /// reported at the start too, and read again from then on; until it answers, what it
    /// holds is unknown (not "signed out").
    mutating func firstReadHeld(_ read: StoreRead) -> [Action] {
        precondition(!started, "a first read held after the start")
        if case .unavailable = read { initialRead = .unavailable } else { initialRead = .answered }
        heldRead = read
        return []
    }

    /// The session starts (once; never after close). Without a first read held or on the
    /// worker there is nothing to start from yet.
    mutating func startRequested() -> [Action] {
        guard !started, !closed, heldRead != nil || awaitingInitialRead else { return [] }
        started = true
        // The first read still on the worker: the start-up events come with its answer.
        guard let read = heldRead else { return [.watchStore] }
        heldRead = nil
        return [.watchStore, .startUp(read)]
    }

    /// The session was made on its loop thread: its first read is on the worker.
    mutating func initialReadOnWorker() -> [Action] {
        initialRead = .onWorker
        return []
    }

    /// The first read found the store unavailable: read it again on the retry timer.
    mutating func initialReadUnavailable() -> [Action] {
        initialRead = .unavailable
        return armRetry()
    }

    /// The first read answered (and the session took what it found).
    mutating func initialReadAnswered() -> [Action] {
        initialRead = .answered
        return changeSeenBeforeTheRead()
    }

    /// The retry's read answered.
    mutating func retryReadAnswered(_ read: StoreRead) -> [Action] {
        // Closed meanwhile, or the first read answered by another way (the creation's read).
        guard !closed, awaitingInitialRead else { return [] }
        if case .unavailable(let error) = read {
            return armRetry() + [.stillUnavailable(error)]
        }
        initialRead = .answered
        return [.takeInitialRead(read)] + changeSeenBeforeTheRead()
    }

    /// A change seen while the first read was awaited is seen now, after the read was taken.
    private mutating func changeSeenBeforeTheRead() -> [Action] {
        guard changeSeenUnread else { return [] }
        changeSeenUnread = false
        return closed ? [] : [.seeChangeAgain]
    }

    // MARK: - Writes

    /// What the store holds is older than the session (a damaged file moved aside, a first
    /// read answered after the user acted).
    mutating func markBehind() -> [Action] {
        isBehind = true
        return []
    }

    /// A save (a write, or a clear) goes to the worker.
    mutating func saveSubmitted() -> [Action] {
        savesSubmitted &+= 1
        return []
    }

    /// The save just submitted was merged into one still waiting: its answer is that one's.
    mutating func saveMerged() -> [Action] {
        precondition(savesSubmitted > 0, "a merged save that was never submitted")
        savesSubmitted &-= 1
        return []
    }

    /// The worker answered a save.
    mutating func saveAnswered(failed: Bool) -> [Action] {
        isBehind = failed
        return failed ? armRetry() : []
    }

    /// A clear the store failed is still owed (a later write landed): keep retrying.
    mutating func clearStillOwed() -> [Action] {
        armRetry()
    }

    /// The retry timer fired. `owesClears`: the session still owes the store a clear.
    mutating func retryFired(owesClears: Bool) -> [Action] {
        retryArmed = false
        guard !closed else { return [] }
        if awaitingInitialRead { return [.read(.retry)] }
        // A clear still owed keeps the retries going even when a later write landed.
        return isBehind || owesClears ? [.catchUp] : []
    }

    // MARK: - Other processes' changes

    /// Another process changed the store (or the session wants to know what it holds now).
    mutating func storeChangeSeen() -> [Action] {
        guard !closed else { return [] }
        // The first read's answer (on the worker, or the retry's) may be older than this change.
        if awaitingInitialRead {
            changeSeenUnread = true
            return []
        }
        guard !isBehind else { return [] }
        switch changeRead {
        case .reading(let savesBefore, _):
            changeRead = .reading(savesBefore: savesBefore, again: true)
            return []
        case .idle:
            changeRead = .reading(savesBefore: savesSubmitted, again: false)
            return [.read(.change)]
        }
    }

    /// The change read answered.
    mutating func changeReadAnswered(_ read: StoreRead) -> [Action] {
        guard case .reading(let savesBefore, let again) = changeRead else { return [] }
        changeRead = .idle
        var actions: [Action] = []
        // A save submitted after the read makes it stale; a store behind us is older than us.
        if savesSubmitted == savesBefore, !closed, !awaitingInitialRead, !isBehind {
            actions.append(.follow(read))
        }
        if again { actions.append(.seeChangeAgain) }
        return actions
    }

    // MARK: - The end

    /// The session is closed: no retry from now on — but one last try to bring a store that
    /// missed a write up to date, and to land a clear still owed even when a later write
    /// landed (a logout it missed must not come back at the next start). `owesClears` as for
    /// `retryFired`.
    mutating func close(owesClears: Bool) -> [Action] {
        guard !closed else { return [] }
        let read = !awaitingInitialRead
        closed = true
        retryArmed = false
        if read && isBehind { return [.cancelRetry, .catchUp] }
        return [.cancelRetry] + (read && owesClears ? [.clearOwed] : [])
    }

    private mutating func armRetry() -> [Action] {
        guard !retryArmed, !closed else { return [] }
        retryArmed = true
        return [.armRetry]
    }

    /// Why the machine is inconsistent, or nil.
    func checkInvariants() -> String? {
        if closed && retryArmed { return "a retry armed after close" }
        if changeSeenUnread && !awaitingInitialRead { return "a change seen before the first read kept after it" }
        if started && heldRead != nil { return "a first read held after the start" }
        if case .reading(let savesBefore, _) = changeRead, savesBefore > savesSubmitted {
            return "a change read counting saves never submitted"
        }
        return nil
    }
}
