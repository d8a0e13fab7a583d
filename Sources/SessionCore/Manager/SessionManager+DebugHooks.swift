// Debug builds only: where a test stops a thread between two steps of the manager's.
#if DEBUG
extension SessionManager {
    /// Tests only: runs in `addBackgroundSessions` between the making of the sessions and
    /// their insertion, on the thread that made them.
    @TaskLocal static var beforeBackgroundInsertion: (@Sendable (SessionManager) -> Void)?
    /// Tests only: runs in `init` (a store of several accounts) between the making of the
    /// active account's session and the setting of the callbacks it calls the manager with.
    @TaskLocal static var beforeFirstSessionCallbacks: (@Sendable (SessionEngine) -> Void)?
}
#endif
