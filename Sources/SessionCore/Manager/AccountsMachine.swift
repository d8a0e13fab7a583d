/// The bookkeeping of a manager with several accounts, as a pure value: whether the store's
/// account list has been taken (and which read of it may still be taken), and whether the
/// store records the active account.
///
/// Every `mutating` event function returns the actions the caller must perform, in order;
/// nothing here does I/O. `SessionManager` is the storage: it keeps this value in its locked
/// box, and performs the actions after releasing the lock (reads and writes on the store's
/// workers, sessions made for listed accounts). Tested state × event without a loop
/// (`AccountsMachineTests`).
///
/// Two rules that each once were a race:
/// - **Only the latest requested list read is taken.** A read made before a change of the
///   store can be answered after it (a slow disk); taking it would mark the list read and
///   drop the later read's answer, hiding the change for good (64beb70).
/// - **Only the latest pointer write's answer counts.** The active-account pointer is
///   written on one worker, in order: an earlier write's answer says nothing about the
///   later one still on its way. A failed latest write leaves the pointer *owed*, written
///   again when the store next takes a write of the active session — or at once, if the
///   store took such a write while the failing write was on its way (the store was
///   reachable again, and that write's landing came before the failure was known).
///
/// And one rule that once was a wrong write:
/// - **A switch that follows another process writes the pointer only if ours may be over
///   theirs.** The signed-out active session follows a sign-in it read in the store (the
///   pointer names that account: another process wrote it); writing the same key again would
///   undo a later change of that other process (it moved on: bob → carol, and this process
///   wrote bob back). So the switch writes nothing — and a debt of ours is void: the store
///   names the account this process is on — unless a write of ours was on its way when that
///   read was submitted, or was requested since (`PointerMark`): it may have landed after the
///   read, over theirs, and the store would name an account this process left.
///
/// Invariants (`checkInvariants`): a pointer write in flight is the latest requested one;
/// requests are numbered from 1 and never reused.
struct AccountsMachine: Sendable, Equatable {
    /// Whether the store records the active account.
    enum Pointer: Sendable, Equatable {
        /// The store took the last change (or there was none).
        case recorded
        /// The write of request `request` is on the pointer's worker. `storeTookWrite`: the
        /// store took a write of the active session meanwhile.
        case writing(request: UInt64, key: String, storeTookWrite: Bool)
        /// The store did not take the last change: `key` is written again with its next write.
        case owed(key: String)
    }

    enum Action: Sendable, Equatable {
        /// Read the store's account list on the active session's worker; answer with
        /// `listAnswered(_:request:)`.
        case readList(request: UInt64)
        /// Make a session for each listed account that has none (then, if that fails,
        /// `sessionsNotMade()`).
        case addSessions(StoredAccounts)
        /// Record `key` as the store's active account on the pointer's worker; answer with
        /// `pointerAnswered(request:failed:)`.
        case writePointer(key: String, request: UInt64)
        /// The list could not be read: call `listRetryFired()` after the store's retry interval.
        case readListLater
    }

    /// The store's account list was taken (a session made for each account).
    private(set) var listed = false
    /// The latest list read requested: only its answer is taken.
    private(set) var listRequest: UInt64 = 0
    /// The latest list read found the store unavailable: it is read again on a timer (nothing
    /// else may ask for it for hours: a steady session changes no state).
    private(set) var listRetryArmed = false
    /// The manager closed: no list is read or taken any more (a read on the worker at the
    /// close answers into nothing; no session is made for a closed manager).
    private(set) var closed = false
    private(set) var pointer = Pointer.recorded
    /// The latest pointer write requested.
    private(set) var pointerRequest: UInt64 = 0

    /// Where the pointer's writes stood when a read of the store was submitted: the latest
    /// write requested, and whether one was on its way (its landing unordered with the read).
    struct PointerMark: Sendable, Equatable {
        let request: UInt64
        let writing: Bool

        /// Not known (no manager asked): taken as a write on its way, so a followed switch
        /// writes as any switch does.
        static let unknown = PointerMark(request: 0, writing: true)
    }

    /// The mark of a read submitted now (see `activeFollowed(to:readAt:)`).
    var pointerMark: PointerMark {
        let writing = if case .writing = pointer { true } else { false }
        return PointerMark(request: pointerRequest, writing: writing)
    }

    // MARK: - The account list

    /// A read of the list is wanted now (the manager was made, or must read again).
    mutating func listWanted() -> [Action] {
        guard !closed else { return [] }
        listRequest &+= 1
        return [.readList(request: listRequest)]
    }

    /// Another process changed the store: what was listed may be stale.
    mutating func storeChanged() -> [Action] {
        listed = false
        return listWanted()
    }

    /// A session's state changed. The list is read if it was not taken yet, once the active
    /// session's store has answered its own read (`storeReading` false): the list read goes
    /// after it, on the same worker, and the active account's key is known by then.
    mutating func sessionStateChanged(storeReading: Bool) -> [Action] {
        guard !listed, !storeReading else { return [] }
        return listWanted()
    }

    /// The store answered the list read of `request`.
    mutating func listAnswered(_ answer: AccountsRead, request: UInt64) -> [Action] {
        // An earlier read answered after a later one was asked for: the later one tells.
        guard !closed, !listed, request == listRequest else { return [] }
        guard case .present(let list) = answer else {
            guard !listRetryArmed else { return [] }
            listRetryArmed = true
            return [.readListLater]
        }
        listed = true
        return [.addSessions(list)]
    }

    /// The retry timer `readListLater` asked for fired: the list is read again unless taken.
    mutating func listRetryFired() -> [Action] {
        guard listRetryArmed, !closed else { return [] }
        listRetryArmed = false
        return listed ? [] : listWanted()
    }

    /// The manager closes (its timer is cancelled by the caller).
    mutating func close() -> [Action] {
        closed = true
        listRetryArmed = false
        return []
    }

    /// The sessions of a taken list could not be made: the list counts as not read.
    mutating func sessionsNotMade() -> [Action] {
        listed = false
        return []
    }

    // MARK: - The active-account pointer

    /// The manager made `key` the active account: the store records it.
    mutating func activeChanged(to key: String) -> [Action] {
        writePointer(key)
    }

    /// The manager made `key` the active account because the active session followed another
    /// process's sign-in of it, found by a read of the store submitted at `mark`. See the rule
    /// above.
    mutating func activeFollowed(to key: String, readAt mark: PointerMark) -> [Action] {
        guard !mark.writing, mark.request == pointerRequest else { return writePointer(key) }
        // No write of ours was on its way at the read or asked for since (the pointer is
        // recorded or owed): the store names `key`, as the read found.
        pointer = .recorded
        return []
    }

    /// The pointer's worker answered the write of `request`.
    mutating func pointerAnswered(request: UInt64, failed: Bool) -> [Action] {
        // An earlier write's answer: the latest write, later on the same worker, decides.
        guard case .writing(let latest, let key, let storeTookWrite) = pointer, request == latest else { return [] }
        if !failed {
            pointer = .recorded
            return []
        }
        if storeTookWrite {
            // The store took a write while this one was on its way: reachable again, and the
            // landing that would have repaid the debt came before the debt was known.
            return writePointer(key)
        }
        pointer = .owed(key: key)
        return []
    }

    /// The store took a write of the active session: a pointer it owes is written again.
    mutating func activeWriteLanded() -> [Action] {
        switch pointer {
        case .recorded:
            return []
        case .writing(let request, let key, _):
            pointer = .writing(request: request, key: key, storeTookWrite: true)
            return []
        case .owed(let key):
            return writePointer(key)
        }
    }

    private mutating func writePointer(_ key: String) -> [Action] {
        pointerRequest &+= 1
        pointer = .writing(request: pointerRequest, key: key, storeTookWrite: false)
        return [.writePointer(key: key, request: pointerRequest)]
    }

    /// Why the machine is inconsistent, or nil.
    func checkInvariants() -> String? {
        if case .writing(let request, _, _) = pointer, request != pointerRequest {
            return "a pointer write in flight (\(request)) that is not the latest (\(pointerRequest))"
        }
        if listed && listRequest == 0 { return "listed without a read" }
        return nil
    }
}
