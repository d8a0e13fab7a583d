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
                } catch {
                    logger.warning("cannot watch the shared store; other processes' changes will be seen at the next refresh",
                        metadata: ["error": "\(error.message)"])
                }
            }
        }
    }

    /// Runs an event of the store-sync machine, then performs its actions in order.
    func storeEvent(_ event: (inout StoreSyncMachine) -> [StoreSyncMachine.Action]) {
        loop.assertInEventLoop()
        let actions = event(&storeMachine)
        assert(storeMachine.checkInvariants() == nil, "store-sync machine: \(storeMachine.checkInvariants() ?? "")")
        for action in actions {
            switch action {
            case .read(let purpose):
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
}
