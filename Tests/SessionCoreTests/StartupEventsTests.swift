import LoopFlow
import Testing

@testable import SessionCore

/// Start-up events: with `startsAutomatically` off, an observer subscribes first and then
/// calls `start()`, so it sees `initialSession` and a start-up `storeError` however late it
/// subscribed — no race with the loop's first turn.
@Suite("Start-up events")
struct StartupEventsTests {
    /// A session on a real loop whose store cannot be read at start, or holds a session.
    private static func make(startsAutomatically: Bool, storeFails: Bool = true) throws -> (EventLoop, SessionManager) {
        let loop = try EventLoop(name: "startup-test")
        let store = MemoryCredentialStore(StoredSession(
            accessToken: Sentinel.access(1), refreshToken: Sentinel.refresh(1),
            accessTokenExpiresAt: SessionConfiguration.realtime() + .seconds(3600), memberID: "m"))
        if storeFails { store.failure = StoreError("the keyring is locked") }
        var configuration = SessionConfiguration()
        configuration.startsAutomatically = startsAutomatically
        let manager = try SessionManager(
            loop: loop, authority: ScriptedAuthority(), store: store, configuration: configuration)
        return (loop, manager)
    }

    private static func record(_ manager: SessionManager) throws -> (LockedBox<[SessionEvent]>, FlowSubscription) {
        let events = LockedBox<[SessionEvent]>([])
        let subscription = try manager.events.subscribe(onEvent: { event in events.withLockedValue { $0.append(event) } })
        return (events, subscription)
    }

    private static func settle(_ loop: EventLoop) async throws {
        for _ in 0..<5 { try await loop.submit {} }
    }

    @Test(arguments: [false, true])
    func aLateSubscriberSeesEveryStartUpEventWhenItStartsTheSession(storeFails: Bool) async throws {
        let (loop, manager) = try Self.make(startsAutomatically: false, storeFails: storeFails)
        // Given the loop has run several turns before anyone subscribes,
        try await Self.settle(loop)
        let (events, subscription) = try Self.record(manager)
        // when the observer starts the session after subscribing,
        try manager.start()
        try await Self.settle(loop)
        // then it saw the start-up event: the store error (the initial session follows when
        // the store answers), or the session restored from the store.
        let expected: [SessionEvent] = storeFails
            ? [.storeError(StoreError("the keyring is locked"))] : [.initialSession(.loggedIn)]
        #expect(events.withLockedValue { $0 } == expected)
        // A second start does nothing.
        try manager.start()
        try await Self.settle(loop)
        #expect(events.withLockedValue { $0 } == expected)
        subscription.close()
        await manager.close()
        try loop.shutdown()
    }

    @Test(arguments: [false, true])
    func theSameLateSubscriberMissesThemWhenTheSessionStartsByItself(storeFails: Bool) async throws {
        // The control: this is the race the manual start removes.
        let (loop, manager) = try Self.make(startsAutomatically: true, storeFails: storeFails)
        try await Self.settle(loop)
        let (events, subscription) = try Self.record(manager)
        try manager.start()  // already started: nothing happens
        try await Self.settle(loop)
        #expect(events.withLockedValue { $0 }.isEmpty)
        subscription.close()
        await manager.close()
        try loop.shutdown()
    }

    @Test func aRequestBeforeStartStartsTheSessionFirst() async throws {
        let (loop, manager) = try Self.make(startsAutomatically: false, storeFails: false)
        let (events, subscription) = try Self.record(manager)
        try await manager.logout()
        try await manager.signIn(SessionTokens(
            accessToken: Sentinel.access(1), refreshToken: Sentinel.refresh(1), expiresIn: .seconds(3600), memberID: "m"))
        try await Self.settle(loop)
        let seen = events.withLockedValue { $0 }
        #expect(seen == [.initialSession(.loggedIn), .signedOut(reason: .userRequested), .signedIn(memberID: "m")])
        subscription.close()
        await manager.close()
        try loop.shutdown()
    }
}
