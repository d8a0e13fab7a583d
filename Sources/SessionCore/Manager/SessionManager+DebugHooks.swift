// Debug builds only: where a test stops a thread between two steps of the manager's, and
// what a test waits for before it acts.
import LoopFlow
#if DEBUG
extension SessionManager {
    /// Tests only: runs in `addBackgroundSessions` between the making of the sessions and
    /// their insertion, on the thread that made them.
    @TaskLocal static var beforeBackgroundInsertion: (@Sendable (SessionManager) -> Void)?
    /// Tests only: runs in `init` (a store of several accounts) between the making of the
    /// active account's session and the setting of the callbacks it calls the manager with.
    @TaskLocal static var beforeFirstSessionCallbacks: (@Sendable (SessionEngine) -> Void)?

    /// Tests only: whether the active session watches its shared store's directory. Its start
    /// sets the watch up on its worker, then on the loop: another writer's change made before
    /// then is never seen, so a test waits for this before it changes the store behind the
    /// session's back (a fixed sleep was too short on a loaded machine).
    package func watchesStore() async -> Bool {
        (try? await loop.submit { [self] in engine.storeWatch != nil }) ?? false
    }
}

extension SessionEngine {
    /// Tests only: runs in `signIn`, on the loop thread, once the session has taken the record
    /// of the account it signs into and before it publishes that account. Set by one test for
    /// its own loop (every session of every loop calls it while set: the test checks the loop).
    /// Behind a lock: every sign-in of every test reads it.
    static let afterTakingRecordInSignIn = LockedBox<(@Sendable (SessionEngine) -> Void)?>(nil)
}
#endif
