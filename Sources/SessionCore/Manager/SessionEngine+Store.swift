import LoopFlow
import Logging

/// What the store's worker answers: every answer enters the engine through one entry point,
/// `storeAnswered(_:)`, as an event for the store-sync machine (or the refresh machine's lock).
enum StoreAnswer: Sendable {
    /// The read made at creation, on the loop thread (which never waits for it).
    case initialRead(StoreRead)
    /// The retry timer's read of a store whose first read has not answered.
    case retryRead(StoreRead)
    /// The read of another process's change.
    case changeRead(StoreRead)
    /// A save landed (nil) or failed.
    case saved(StoreError?, SaveKind)
    /// Every job submitted before a clear of `key`'s record has answered (its own answer too).
    case clearSettled(key: String)
    /// The look at the shared store before a refresh (`acquireLock`), for `attempt`.
    case lockLooked(LockLook, attempt: UInt64)
    /// The shared store's directory, to watch (nil: none).
    case directoryFound(String?)

    enum SaveKind: Sendable {
        /// The session's own record (a write, or the clear of a store of one session).
        case session
        /// The clear of an account's record.
        case clear
    }
}

/// The store side of `SessionEngine`: the store-sync machine's events and actions, saves, the
/// retry timer. Loop thread only, like the whole engine.
extension SessionEngine {
    /// The one entry point of the store's answers.
    func storeAnswered(_ answer: StoreAnswer) {
        // `afterPendingWork` answers on the worker thread when the loop is gone: the session
        // is closed then and tracks nothing.
        guard loop.inEventLoop else { return }
        answerEntry {
            switch answer {
            case .initialRead(let read):
                initialReadArrived(read)
            case .retryRead(let read):
                storeEvent { $0.retryReadAnswered(read) }
            case .changeRead(let read):
                // Debug: why a change read is or is not followed (no secret: kinds and counts).
                logger.debug("store change read answered", metadata: [
                    "read": "\(Self.kind(of: read))", "changeRead": "\(storeMachine.changeRead)",
                    "savesSubmitted": "\(storeMachine.savesSubmitted)", "behind": "\(storeMachine.isBehind)",
                ])
                storeEvent { $0.changeReadAnswered(read) }
            case .saved(let failure, let kind):
                saveAnswered(failure, kind)
            case .clearSettled(let key):
                // The clear's own answer came just before (the same worker, in order): behind
                // means it failed. Still owed: retried on the store's timer, whatever later
                // writes answer.
                guard !closed else { return }
                if storeMachine.isBehind {
                    storeEvent { $0.clearStillOwed() }
                } else {
                    recordsToClear.remove(key)
                }
            case .lockLooked(let look, let attempt):
                lockLooked(look, attempt: attempt)
            case .directoryFound(let directory):
                guard let directory, !closed, storeWatch == nil else { return }
                do throws(LoopFlowError) {
                    storeWatch = try loop.watchDirectoryNow(directory) { [weak self] in self?.storeChanged() }
                } catch where error.code == .loopShutDown {
                    // The host is shutting the loop down: there is nothing left to watch for.
                } catch {
                    logger.warning("cannot watch the shared store; other processes' changes will be seen at the next refresh",
                        metadata: ["error": "\(error.message)"])
                }
            }
        }
    }

    /// A read's kind for the debug log (never its contents).
    static func kind(of read: StoreRead) -> String {
        switch read {
        case .present: "present"
        case .absent: "absent"
        case .unavailable: "unavailable"
        case .damaged: "damaged"
        }
    }

    /// Runs an event of the store-sync machine, then performs its actions in order.
    func storeEvent(_ event: (inout StoreSyncMachine) -> [StoreSyncMachine.Action]) {
        loop.assertInEventLoop()
        let actions = event(&storeMachine)
        assert(storeMachine.checkInvariants() == nil, "store-sync machine: \(storeMachine.checkInvariants() ?? "")")
        for action in actions {
            switch action {
            case .watchStore:
                watchSharedStore()
            case .startUp(let read):
                start(from: read)
            case .read(let purpose):
                logger.debug("store read submitted", metadata: [
                    "purpose": "\(purpose)", "savesSubmitted": "\(storeMachine.savesSubmitted)"])
                if purpose == .change { changeReadPointerMark = onStoreReadSubmitted?() ?? .unknown }
                worker.read { [weak self] read in
                    self?.storeAnswered(purpose == .retry ? .retryRead(read) : .changeRead(read))
                }
            case .armRetry:
                // A loop shutting down refuses the timer: the session is closed next.
                retryTimer = try? loop.scheduleTimer(after: configuration.storeRetryInterval) { [weak self] in
                    self?.storeRetryDue()
                }
            case .cancelRetry:
                retryTimer?.cancel()
                retryTimer = nil
            case .takeInitialRead(let read):
                initialReadAnswered(read)
            case .stillUnavailable(let error):
                storeStatus.value = .unavailable(error)
            case .follow(let read):
                follow(read)
            case .seeChangeAgain:
                readAndFollowStore()
            case .catchUp:
                retryOwedClears()
                persist()
            case .clearOwed:
                retryOwedClears()
            }
        }
    }

    /// Writes `session` (or clears, for nil) on the worker: to the session's record, or to
    /// `target`. The answer enters as `.saved`. A store that never blocks answers inline.
    func save(_ session: StoredSession?, to target: (any CredentialStore)? = nil, kind: StoreAnswer.SaveKind) {
        // Counted before the call: an inline store answers inside it.
        storeEvent { $0.saveSubmitted() }
        let counted = worker.save(session, to: target) { [weak self] failure in self?.storeAnswered(.saved(failure, kind)) }
        if !counted { storeEvent { $0.saveMerged() } }
    }

    private func saveAnswered(_ failure: StoreError?, _ kind: StoreAnswer.SaveKind) {
        storeEvent { $0.saveAnswered(failed: failure != nil) }
        if let failure {
            logger.warning("credential store write failed", metadata: ["error": "\(failure.message)"])
            storeStatus.value = .unavailable(failure)
            if !closed { emit(.storeError(failure)) }
            return
        }
        guard kind == .session else { return }
        // A write the store takes makes it `available` again — unless the first read has not
        // answered (the stored session is still unknown).
        if !storeMachine.awaitingInitialRead, !storeMachine.isBehind, case .unavailable = storeStatus.value {
            storeStatus.value = .available
        }
        onWriteLanded?()
    }

    /// The store retry timer: the first read of a store that was unavailable at start, and
    /// the write-behind of one that missed a write.
    func storeRetryDue() {
        entry {
            retryTimer = nil
            storeEvent { $0.retryFired(owesClears: !recordsToClear.isEmpty) }
        }
    }

    /// Another process changed the store (or the session wants what it holds now): read it
    /// on the worker and follow it, one such read at a time.
    func readAndFollowStore() {
        storeEvent { $0.storeChangeSeen() }
    }

    // MARK: - What the store held

    /// The start-up events for what the store answered, and the restored session resumed.
    func startUp(with read: StoreRead) {
        defer { publishSnapshot() }
        switch read {
        case .unavailable(let error):
            logger.warning("credential store unavailable at start", metadata: ["error": "\(error.message)"])
            emit(.storeError(error))
            storeStatus.value = .unavailable(error)
            storeEvent { $0.initialReadUnavailable() }
            return
        case .damaged(let error):
            logger.error("credential store was damaged; moved aside, starting logged out", metadata: ["error": "\(error.message)"])
            emit(.storeError(error))
        case .present, .absent:
            break
        }
        storeStatus.value = .available
        emit(.initialSession(machine.state))
        perform(refresh.resumeRestored(now: loop.now, unitRandom: configuration.random()))
    }

    /// The initial read of a session made on its loop thread answered (`storeAnswered`).
    func initialReadArrived(_ read: StoreRead) {
        guard !closed else { return }
        if !storeMachine.started {
            // As if read at creation: nothing has happened to the session yet (any request
            // starts it first). `start()` emits the start-up events.
            storeEvent { $0.firstReadHeld(read) }
            if case .unavailable(let error) = read {
                storeStatus.value = .unavailable(error)
            } else {
                restore(from: read)
                publish(machine.state)
                storeStatus.value = .available
            }
            publishSnapshot()
            return
        }
        answerEntry {
            if case .unavailable(let error) = read {
                // As at start with an unavailable store: reported, and read again later.
                logger.warning("credential store unavailable at start", metadata: ["error": "\(error.message)"])
                emit(.storeError(error))
                storeStatus.value = .unavailable(error)
                storeEvent { $0.initialReadUnavailable() }
                return
            }
            initialReadAnswered(read)
        }
    }

    /// Follows what another process left in the store (the store-sync machine took the read:
    /// not stale, and the store not behind us — following it then would undo ours).
    func follow(_ read: StoreRead) {
            // A record whose clear (a logout) the store still owes is not a session to follow.
            if case .present(let stored) = read, let account = stored.account, recordsToClear.contains(account) { return }
            switch StoreChange.decide(read, state: machine.state, memberID: memberID, account: accountKey) {
            case .ignore:
                return
            case .damaged(let error):
                emit(.storeError(error))
                // Written back from memory — if there is anything of ours to write. Signed out,
                // there is not: marked behind, the session would ignore every later change (the
                // save that clears "behind" never comes), and a plain store's save would be a
                // clear, which could remove a sign-in another process made meanwhile.
                guard machine.state != .loggedOut else { return }
                storeEvent { $0.markBehind() }
                persist()
            case .logout:
                followLogout()
            case .expire:
                expire(reason: "the session expired in another process")
            case .adoptTokens(let stored, let access):
                profile = stored.profile ?? profile
                perform(refresh.storedTokensChanged(
                    liveSession(from: stored, access: access, lastRefresh: loop.now),
                    now: loop.now, unitRandom: configuration.random()))
            case .switchSession(let stored, let access):
                followLogout()
                followSignIn(stored, access: access)
            case .signIn(let stored, let access):
                followSignIn(stored, access: access)
            }
    }

    /// The store answered the initial read at last (it was unavailable at start, or the read
    /// was on the worker when the session started).
    func initialReadAnswered(_ read: StoreRead) {
        storeEvent { $0.initialReadAnswered() }
        storeStatus.value = .available
        if case .damaged(let error) = read {
            emit(.storeError(error))
        }
        if machine.state == .loggedOut, refresh.generation == 0 {
            // Nothing happened meanwhile: the stored session is the starting point.
            restore(from: read)
            publish(machine.state)
            emit(.initialSession(machine.state))
            perform(refresh.resumeRestored(now: loop.now, unitRandom: configuration.random()))
        } else {
            // The user acted meanwhile: what they did wins over what was stored.
            emit(.initialSession(machine.state))
            storeEvent { $0.markBehind() }
        }
        if storeMachine.isBehind {
            persist()
        }
        // The manager reads the snapshot (no longer awaiting the store) from its callback.
        publishSnapshot()
        onStateChange?()
    }
}
