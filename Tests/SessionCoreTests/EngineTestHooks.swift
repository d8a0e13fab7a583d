@testable import SessionCore

/// Hooks the engine's tests drive it through. Here, not in SessionCore: test-only code has no
/// place in the shipped module (issue 26, point 5). They reach the engine's internals through
/// `@testable import`, on the loop thread like every entry point.
extension SessionEngine {
    /// Callers waiting on the refresh in flight.
    var waitingCallers: Int { refresh.waiterCount }

    /// Plays a token whose proactive refresh never happened.
    func cancelProactiveRefreshForTesting() {
        loop.assertInEventLoop()
        perform(refresh.proactiveCancelled())
    }
}
