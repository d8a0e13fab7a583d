import Foundation
import InMemoryLogging
import Logging
@_spi(Testing) import LoopFlow
import SessionCore

/// A `SessionManager` on an event loop of its own, with everything it says kept: its events
/// from the first one, its states (when asked) and its log lines. The one session harness of
/// every test target; each adds only its own setup: SessionCoreTests' `Harness` (virtual time,
/// scripted authority), SessionFileStoreTests' `observedSession` and `participant` (file
/// stores), SessionOAuthTests' `LiveSession` (the OAuth authority against a real server).
///
/// With a `ManualClock` the loop runs in virtual time (`advance(by:)`); without one, on the
/// system clock.
package final class SessionHarness<Authority: SessionAuthority, Store: CredentialStore>: @unchecked Sendable {
    /// The virtual clock, when the loop runs on one.
    package let manualClock: ManualClock?
    package let loop: EventLoop
    package let authority: Authority
    package let store: Store
    package let manager: SessionManager
    /// Every log line, at trace level and up.
    package let logs = InMemoryLogHandler()
    package let events = LockedBox<[SessionEvent]>([])
    package let states = LockedBox<[SessionState]>([])
    private let subscriptions: [FlowSubscription]

    /// Makes the manager and subscribes to its events (and states, if `recordStates`) in one loop
    /// job, so nothing it says at start can run in between. `configure` runs after the harness
    /// has set the logger, and may change anything.
    package convenience init(
        loopName: String,
        authority: Authority,
        store: Store,
        manualClock: ManualClock? = nil,
        recordStates: Bool = false,
        configure: (inout SessionConfiguration) -> Void = { _ in }
    ) async throws {
        try await self.init(
            loopName: loopName, makeAuthority: { _ in authority }, store: store, manualClock: manualClock,
            recordStates: recordStates, configure: configure)
    }

    /// For an authority that lives on the session's loop (the OAuth authority's HTTP client).
    package init(
        loopName: String,
        makeAuthority: (EventLoop) throws -> Authority,
        store: Store,
        manualClock: ManualClock? = nil,
        recordStates: Bool = false,
        configure: (inout SessionConfiguration) -> Void = { _ in }
    ) async throws {
        self.manualClock = manualClock
        self.store = store
        loop = try EventLoop(name: loopName, clock: manualClock.map { .manual($0) } ?? .system)
        do {
            authority = try makeAuthority(loop)
        } catch {
            _ = try? loop.shutdown()
            throw error
        }
        let authority = self.authority
        var handler = logs
        handler.logLevel = .trace
        var configuration = SessionConfiguration()
        configuration.logger = Logger(label: loopName, factory: { _ in handler })
        configure(&configuration)
        let loop = self.loop
        let events = self.events
        let states = self.states
        let made = configuration
        do {
            (manager, subscriptions) = try await loop.submit {
                let manager = try SessionManager(loop: loop, authority: authority, store: store, configuration: made)
                var subscriptions = [try manager.events.subscribe(onEvent: { event in events.withLockedValue { $0.append(event) } })]
                if recordStates {
                    subscriptions.append(try manager.subscribeToSessionState(onState: { state in
                        states.withLockedValue { $0.append(state) }
                    }))
                }
                return (manager, subscriptions)
            }
        } catch {
            _ = try? loop.shutdown()
            throw error
        }
        // Made on its loop thread, the manager reads a blocking store on its worker: wait for
        // the stored session, as the tests expect to start from it.
        await manager.storeRead()
    }

    deinit {
        for subscription in subscriptions { subscription.close() }
        // On a thread of its own: the shutdown waits for the loop's last store work (an
        // fsync), and a harness is often let go on a thread of the cooperative pool.
        let loop = loop
        Thread.detachNewThread { _ = try? loop.shutdown() }
    }

    /// Closes the subscriptions and the manager, then shuts the loop down (off the pool).
    package func stop() async {
        for subscription in subscriptions { subscription.close() }
        await manager.close()
        let loop = loop
        await offThePool { _ = try? loop.shutdown() }
    }

    package var recordedEvents: [SessionEvent] { events.withLockedValue { $0 } }
    package var recordedStates: [SessionState] { states.withLockedValue { $0 } }

    /// Lets everything already posted run (the loop and both flows).
    package func settle() async throws {
        for _ in 0..<3 { try await loop.submit {} }
    }

    /// Moves virtual time on, then settles. Only for a harness made with a `ManualClock`.
    package func advance(by duration: Duration) async throws {
        guard let clock = manualClock else { preconditionFailure("advance(by:) needs a harness on a ManualClock") }
        await clock.advance(by: duration)
        try await settle()
    }

    /// Everything this session said — log lines with level, metadata and error, then its
    /// events — as text (for "no secret in any output" checks).
    package var output: String {
        let logText = logs.entries.map { entry in
            "\(entry.level) \(entry.message) \(entry.metadata) \(entry.error.map { "\($0)" } ?? "")"
        }.joined(separator: "\n")
        return logText + "\n" + recordedEvents.map(\.description).joined(separator: "\n")
    }

    /// The store errors reported so far, by message.
    package var storeErrors: [String] {
        recordedEvents.compactMap { if case .storeError(let error) = $0 { error.message } else { nil } }
    }

    /// The first store error whose message contains `text`, waiting up to `timeout` (a hang
    /// guard: it returns as soon as the error is there; the clean-clone CI runs every suite at
    /// once on two cores, where 5 s was once too short).
    package func storeError(containing text: String, within timeout: Duration = .seconds(30)) async -> String? {
        _ = await eventually(timeout: timeout) { self.storeErrors.contains { $0.contains(text) } }
        return storeErrors.first { $0.contains(text) }
    }
}
