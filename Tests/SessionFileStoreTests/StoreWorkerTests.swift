import CLibUV
import Foundation
import LoopFlow
import SessionFlowTestSupport
import Testing

@testable import SessionCore
@testable import SessionFileStore

// Issue 14, point 1: store work off the loop. A session never calls a blocking store on its loop
// thread: a serial worker does, in order, and the answers come back as loop events.

/// A file store that records, for every call, whether it ran on the session's loop thread, and
/// can be made slow (a filesystem whose fsync takes `delay`) or gated (a call waits until the
/// test opens the gate). The delay and the gate run where the call runs: on the worker.
final class ProbedStore: SharedCredentialStore, @unchecked Sendable {
    let inner: FileCredentialStore
    let delay = LockedBox<Duration>(.zero)
    /// Calls made on a loop thread (the session's `loop`, once set).
    let callsOnLoop = LockedBox<[String]>([])
    /// Every write and clear, in the order they reached the store ("write alice a1", "clear").
    let saves = LockedBox<[String]>([])
    let calls = LockedBox(0)
    private let gate = LockedBox<Bool>(true)
    let loop = LockedBox<EventLoop?>(nil)
    private let blocks: Bool

    init(_ inner: FileCredentialStore, blocks: Bool = true) {
        self.inner = inner
        self.blocks = blocks
    }

    var callsMayBlock: Bool { blocks }

    func close() { gate.withLockedValue { $0 = false } }
    func open() { gate.withLockedValue { $0 = true } }

    private func enter(_ what: String) {
        calls.withLockedValue { $0 += 1 }
        if loop.withLockedValue({ $0 })?.inEventLoop == true {
            callsOnLoop.withLockedValue { $0.append(what) }
        }
        while !gate.withLockedValue({ $0 }) { usleep(1000) }
    }

    private func slow() {
        let pause = delay.withLockedValue { $0 }
        if pause > .zero { Thread.sleep(forTimeInterval: Double(pause.components.seconds) + Double(pause.components.attoseconds) / 1e18) }
    }

    func read() -> StoreRead {
        enter("read")
        return inner.read()
    }

    func write(_ session: StoredSession) throws(StoreError) {
        enter("write")
        slow()
        try inner.write(session)
        saves.withLockedValue { $0.append("write \(session.memberID ?? "-") \(session.accessToken?.reveal() ?? "-")") }
    }

    func clear() throws(StoreError) {
        enter("clear")
        slow()
        try inner.clear()
        saves.withLockedValue { $0.append("clear") }
    }

    func tryAcquireRefreshLease(for duration: Duration) -> RefreshLeaseResult {
        enter("lease")
        return inner.tryAcquireRefreshLease(for: duration)
    }

    func releaseRefreshLease() {
        enter("release")
        inner.releaseRefreshLease()
    }

    func directoryToWatch() -> String? {
        enter("directory")
        return inner.directoryToWatch()
    }
}

/// A host that runs its own libuv loop on a thread of its own (a borrowed loop for the
/// library), with a host timer every 10 ms that measures how late each tick is.
final class LatencyHost: @unchecked Sendable {
    let uvLoop = UnsafeMutablePointer<uv_loop_t>.allocate(capacity: 1)
    private let ticker = UnsafeMutablePointer<uv_timer_t>.allocate(capacity: 1)
    private let ready = DispatchSemaphore(value: 0)
    private let done = DispatchSemaphore(value: 0)
    private(set) var loop: EventLoop!
    /// Lateness of each tick past its 10 ms, in nanoseconds.
    let lateness = LockedBox<[UInt64]>([])
    private var last: UInt64 = 0
    let measuring = LockedBox(false)
    static let period: UInt64 = 10

    init() {
        let thread = Thread { [self] in
            uv_loop_init(uvLoop)
            uv_timer_init(uvLoop, ticker)
            ticker.pointee.data = Unmanaged.passUnretained(self).toOpaque()
            uv_timer_start(ticker, { handle in
                let host = Unmanaged<LatencyHost>.fromOpaque(handle!.pointee.data).takeUnretainedValue()
                host.tick()
            }, Self.period, Self.period)
            loop = try! EventLoop(borrowing: uvLoop)
            ready.signal()
            uv_run(uvLoop, UV_RUN_DEFAULT)
            _ = uv_loop_close(uvLoop)
            done.signal()
        }
        thread.start()
        ready.wait()
    }

    private func tick() {
        let now = uv_hrtime()
        // libuv re-arms a repeating timer from the time its callback runs: each tick is due
        // one period after the previous one ran.
        if last != 0, measuring.withLockedValue({ $0 }) {
            let due = last + Self.period * 1_000_000
            let late = now > due ? now - due : 0
            lateness.withLockedValue { $0.append(late) }
        }
        last = now
    }

    /// The worst lateness and the 99th percentile, in milliseconds, and how many ticks.
    func figures() -> (max: Double, p99: Double, ticks: Int) {
        let sorted = lateness.withLockedValue { $0 }.sorted()
        guard !sorted.isEmpty else { return (0, 0, 0) }
        let p99 = sorted[min(sorted.count - 1, sorted.count * 99 / 100)]
        return (Double(sorted.last!) / 1e6, Double(p99) / 1e6, sorted.count)
    }

    func reset() { lateness.withLockedValue { $0 = [] } }

    func finish() {
        try! loop.execute { [self] in
            _ = try? loop.shutdown()
            uv_close(UnsafeMutableRawPointer(ticker).assumingMemoryBound(to: uv_handle_t.self), nil)
        }
        done.wait()
    }
}

func tokens(_ member: String, _ access: String) -> SessionTokens {
    SessionTokens(accessToken: Secret(access), refreshToken: Secret("refresh-\(access)"), expiresIn: .seconds(3600), memberID: member)
}

/// Timing measurements run alone: the test command runs them in a `swift test` of their own
/// (SESSIONFLOW_MEASURE=1) after the parallel run, where forty other suites would share the
/// two cores and a loop with no session on it is itself tens of milliseconds late.
let measuringAlone = ProcessInfo.processInfo.environment["SESSIONFLOW_MEASURE"] == "1"

@Suite("Store work off the loop (issue 14.1)", .serialized)
struct StoreWorkerTests {
    /// The issue's test: a borrowed loop's host keeps its timers within 5 ms of schedule while
    /// another process holds the store's write lock for 3 s, and while every write takes 300 ms
    /// (a slow filesystem's fsync), as the session signs in, refreshes and logs out.
    @Test(.enabled(if: measuringAlone, "a measurement: run alone (SESSIONFLOW_MEASURE=1)"))
    func aBorrowedLoopKeepsItsTimersOnScheduleWhileTheStoreBlocks() async throws {
        let tmp = TemporaryDirectory()
        let file = FileCredentialStore(directory: tmp.store)
        try file.write(StoredSession(
            accessToken: Secret("stored"), refreshToken: Secret("refresh-stored"),
            accessTokenExpiresAt: SessionConfiguration.realtime() + .seconds(3600), memberID: "alice"))
        let store = ProbedStore(file)
        let host = LatencyHost()
        defer { host.finish() }
        // The same host loop without a session, measured over the same windows: the machine's
        // own noise (a CI run and other work share its two cores).
        let reference = LatencyHost()
        defer { reference.finish() }
        let loop = host.loop!
        store.loop.withLockedValue { $0 = loop }
        let authority = RotatingAuthority()
        var configuration = SessionConfiguration()
        configuration.storeRetryInterval = .milliseconds(200)
        let made = configuration
        // Made on the host's loop thread, as a borrowed-loop host must.
        let manager = try await loop.submit {
            try SessionManager(loop: loop, authority: authority, store: store, configuration: made)
        }
        #expect(await eventually(timeout: .seconds(20), every: .milliseconds(20)) { manager.storeStatus.value == .available })
        #expect(manager.state.value == .loggedIn)
        await manager.storeWorkDone()
        host.measuring.withLockedValue { $0 = true }
        reference.measuring.withLockedValue { $0 = true }
        // Within 5 ms of schedule; on a machine so loaded that a loop with no session on it is
        // itself later than that in the same window, within 5 ms of that loop. (Blocking on the
        // store would be 300 ms to 2 s late.)
        func allowed() -> Double {
            let noise = reference.figures().max
            return noise <= 5 ? 5 : noise + 5
        }
        // Each window is measured up to three times, and one must be within the bound: a loop
        // the store blocks is late in every window (by 300 ms to 2 s), while the scheduler of a
        // 2-core machine running this test, its lock holder and the store worker at once can
        // make one tick of ~300 a few ms late now and then (seen once in CI: 6.6 ms, p99 0.5).

        // 1. Another process holds <store>.wlock for 3 s.
        for attempt in 1...3 {
            host.reset()
            reference.reset()
            let holder = try ChildProcess("/usr/bin/flock", ["-x", file.writeLockPath, "sh", "-c", "echo held; sleep 3"])
            #expect(holder.waitForLine { $0 == "held" } != nil, "\(holder.lines)")
            let lockStart = ContinuousClock.now
            _ = try await manager.refreshNow()  // its write waits for the lock (2 s), fails, is retried
            try await manager.logout()  // returns once the store answered (busy: a storeError)
            try await manager.signIn(tokens("bob", "bob-1"))
            _ = try await manager.refreshNow()
            // Until the holder is gone and the store has caught up. Polled every 50 ms: reading
            // (and decrypting) the store every millisecond would itself be the noise measured
            // on two cores.
            #expect(await eventually(timeout: .seconds(15), every: .milliseconds(50)) {
                if case .present(let stored) = file.read() { return stored.memberID == "bob" && stored.accessToken != Secret("bob-1") }
                return false
            })
            let lockWindow = ContinuousClock.now - lockStart
            let locked = host.figures()
            let lockedNoise = reference.figures()
            let lockedAllowed = allowed()
            print("store-async: write lock held 3 s by another process (window \(attempt)): \(locked.ticks) ticks of 10 ms "
                + "over \(lockWindow), max lateness \(locked.max) ms, p99 \(locked.p99) ms (a loop without a session "
                + "meanwhile: max \(lockedNoise.max) ms, p99 \(lockedNoise.p99) ms)")
            #expect(lockWindow >= .seconds(2), "the store did not wait for the other process's lock")
            #expect(locked.ticks >= 100)
            if locked.max <= lockedAllowed { break }
            if attempt == 3 {
                Issue.record("the loop was held up \(locked.max) ms while another process held the write lock")
            }
        }

        // 2. Every write takes 300 ms (a slow filesystem).
        store.delay.withLockedValue { $0 = .milliseconds(300) }
        for attempt in 1...3 {
            host.reset()
            reference.reset()
            let slowStart = ContinuousClock.now
            for _ in 0..<3 { _ = try await manager.refreshNow() }
            try await manager.logout()
            try await manager.signIn(tokens("carol", "carol-1"))
            await manager.storeWorkDone()
            let slowWindow = ContinuousClock.now - slowStart
            let slow = host.figures()
            let slowNoise = reference.figures()
            let slowAllowed = allowed()
            print("store-async: writes taking 300 ms (window \(attempt)): \(slow.ticks) ticks of 10 ms over \(slowWindow), "
                + "max lateness \(slow.max) ms, p99 \(slow.p99) ms (a loop without a session meanwhile: max "
                + "\(slowNoise.max) ms, p99 \(slowNoise.p99) ms)")
            #expect(slowWindow >= .milliseconds(600), "the slow writes did not happen")
            if slow.max <= slowAllowed { break }
            if attempt == 3 { Issue.record("the loop was held up \(slow.max) ms by slow writes") }
        }
        #expect(store.callsOnLoop.withLockedValue { $0 }.isEmpty, "store calls on the loop thread: \(store.callsOnLoop.withLockedValue { $0 })")
        guard case .present(let final) = file.read() else {
            Issue.record("the last sign-in was not stored")
            return
        }
        #expect(final.memberID == "carol" && final.accessToken == Secret("carol-1"))
        await manager.close()
    }

    /// The control that shows the measurement catches a blocked loop: the same slow store
    /// called inline (as every store was before issue 14) holds the host's timers up.
    @Test(.enabled(if: measuringAlone, "a measurement: run alone (SESSIONFLOW_MEASURE=1)"))
    func theMeasurementCatchesAStoreCalledOnTheLoop() async throws {
        let tmp = TemporaryDirectory()
        let store = ProbedStore(FileCredentialStore(directory: tmp.store), blocks: false)
        let host = LatencyHost()
        defer { host.finish() }
        let loop = host.loop!
        store.loop.withLockedValue { $0 = loop }
        let manager = try await loop.submit { try SessionManager(loop: loop, authority: RotatingAuthority(), store: store) }
        store.delay.withLockedValue { $0 = .milliseconds(100) }
        host.measuring.withLockedValue { $0 = true }
        try await manager.signIn(tokens("alice", "a1"))
        try await manager.logout()
        try await Task.sleep(for: .milliseconds(50))
        let figures = host.figures()
        print("store-async control: a 100 ms store called inline: max lateness \(figures.max) ms")
        #expect(figures.max >= 50)
        #expect(!store.callsOnLoop.withLockedValue { $0 }.isEmpty)
        await manager.close()
    }

    /// (b) Order: a burst of sign-ins, refreshes and logouts, while the store is held up, lands
    /// in the order the session made it; superseded writes of one account are merged, a clear
    /// is never merged with or reordered around a write, and the last state wins.
    @Test func aBurstOfWritesAndClearsLandsInOrderAndTheLastStateWins() async throws {
        let tmp = TemporaryDirectory()
        let store = ProbedStore(FileCredentialStore(directory: tmp.store))
        let loop = try EventLoop(name: "order")
        defer { _ = try? loop.shutdown() }
        store.loop.withLockedValue { $0 = loop }
        let manager = try SessionManager(loop: loop, authority: RotatingAuthority(), store: store)
        store.close()  // every store call waits: the session's saves queue up on the worker
        try await loop.submit {
            let engine = manager.engine
            try engine.signIn(tokens("alice", "a1"))  // runs at once, waits at the gate
            try engine.logout()
            try engine.signIn(tokens("bob", "b1"))
            for n in 2...5 {
                // The same account again and again: only the last one needs to land.
                try engine.logout()
                try engine.signIn(tokens("bob", "b\(n)"))
            }
            try engine.logout()
            try engine.signIn(tokens("carol", "c1"))
            try engine.logout()  // the last word: nothing stored
        }
        #expect(manager.state.value == .loggedOut)
        store.open()
        await manager.storeWorkDone()
        let saves = store.saves.withLockedValue { $0 }
        // Every write followed by the clear the session made after it; the last is a clear.
        #expect(saves.last == "clear", "\(saves)")
        #expect(saves.first == "write alice a1", "\(saves)")
        var expectWrite = true
        for save in saves {
            #expect(save.hasPrefix(expectWrite ? "write" : "clear"), "out of order: \(saves)")
            expectWrite.toggle()
        }
        #expect(saves.contains("write carol c1"), "\(saves)")
        #expect(file(tmp.store).read() == .absent)
        #expect(FileCredentialStore(directory: tmp.store).accounts().isEmpty, "a record survived its logout: \(saves)")
        #expect(store.callsOnLoop.withLockedValue { $0 }.isEmpty)
        await manager.close()
    }

    /// (b) The worker itself: saves of one account waiting in the queue are merged; clears are
    /// merged with clears; a clear and a write never.
    @Test func theWorkerMergesOnlyWhatASaveSupersedes() async throws {
        let tmp = TemporaryDirectory()
        let store = ProbedStore(FileCredentialStore(directory: tmp.store))
        let loop = try EventLoop(name: "merge")
        defer { _ = try? loop.shutdown() }
        store.loop.withLockedValue { $0 = loop }
        let worker = StoreWorker(store: store, loop: loop)
        func session(_ member: String, _ access: String) -> StoredSession {
            StoredSession(accessToken: Secret(access), refreshToken: Secret("r"), memberID: member)
        }
        store.close()
        let answers = LockedBox<[String]>([])
        let saves: [StoredSession?] = [
            session("a", "a1"), session("a", "a2"), session("a", "a3"), nil, nil, session("b", "b1"),
            session("a", "a4"), session("a", "a5"),
        ]
        func submit(_ range: Range<Int>) async throws {
            try await loop.submit {
                for n in range {
                    worker.save(saves[n]) { failure in answers.withLockedValue { $0.append("\(n)\(failure == nil ? "" : "!")") } }
                }
            }
        }
        try await submit(0..<1)
        // The first save has reached the store (and waits at its gate) before the rest come.
        #expect(await eventually { store.calls.withLockedValue { $0 } == 1 })
        try await submit(1..<saves.count)
        store.open()
        worker.waitUntilIdle()
        try await loop.submit {}
        // a1 was running when the rest came: a2 merged into a3, the second clear into the
        // first, a4 into a5.
        #expect(store.saves.withLockedValue { $0 } == ["write a a1", "write a a3", "clear", "write b b1", "write a a5"])
        #expect(answers.withLockedValue { $0 } == ["0", "2", "4", "5", "7"])
        #expect(worker.coalesced == 3)
        #expect(store.callsOnLoop.withLockedValue { $0 }.isEmpty)
    }

    /// (c) No store call on the loop thread, whatever the session does: start-up, the directory
    /// watch, refreshes under the lease, write failures and their retry, logout.
    @Test func noStoreCallRunsOnTheLoopThread() async throws {
        let tmp = TemporaryDirectory()
        try FileCredentialStore(directory: tmp.store).write(StoredSession(
            accessToken: Secret("stored"), refreshToken: Secret("refresh-stored"),
            accessTokenExpiresAt: SessionConfiguration.realtime() - .seconds(1), memberID: "alice"))
        let store = ProbedStore(FileCredentialStore(directory: tmp.store))
        let authority = RotatingAuthority()
        let session = try await SessionHarness(loopName: "off-loop", authority: authority, store: store) {
            $0.storeRetryInterval = .milliseconds(100)
        }
        store.loop.withLockedValue { $0 = session.loop }
        // The restored session was due: it refreshed at start, under the lease.
        #expect(await eventually(timeout: .seconds(20)) { authority.refreshes >= 1 })
        _ = try await session.manager.refreshNow()
        // The refresh's own write lands first (it is queued on the worker: written after the
        // change below, it would simply be the newer one and overwrite it).
        await session.manager.storeWorkDone()
        // Another process's change, seen through the directory watch.
        try FileCredentialStore(directory: tmp.store).write(StoredSession(
            accessToken: Secret("elsewhere"), refreshToken: Secret("refresh-elsewhere"),
            accessTokenExpiresAt: SessionConfiguration.realtime() + .seconds(3600), memberID: "alice"))
        #expect(await eventually(timeout: .seconds(20)) { (try? await session.manager.freshAccessToken()) == Secret("elsewhere") })
        try await session.manager.logout()
        await session.manager.storeWorkDone()
        #expect(store.calls.withLockedValue { $0 } > 5)
        #expect(store.callsOnLoop.withLockedValue { $0 }.isEmpty, "\(store.callsOnLoop.withLockedValue { $0 })")
        await session.stop()
    }

    /// Point 5's seed: made on its loop thread, a session starts `loggedOut` with the store
    /// `reading`, then shows the stored session (`available`), with `initialSession` then; an
    /// unreadable store is `unavailable`, and the session is restored when it answers.
    @Test func theStoreStatusTellsReadingFromNoSession() async throws {
        let tmp = TemporaryDirectory()
        try FileCredentialStore(directory: tmp.store).write(StoredSession(
            accessToken: Secret("stored"), refreshToken: Secret("refresh-stored"),
            accessTokenExpiresAt: SessionConfiguration.realtime() + .seconds(3600), memberID: "alice"))
        let store = ProbedStore(FileCredentialStore(directory: tmp.store))
        store.close()
        let loop = try EventLoop(name: "status")
        defer { _ = try? loop.shutdown() }
        let events = LockedBox<[SessionEvent]>([])
        let (manager, subscription) = try await loop.submit {
            let manager = try SessionManager(loop: loop, authority: RotatingAuthority(), store: store)
            return (manager, try manager.events.subscribe(onEvent: { event in events.withLockedValue { $0.append(event) } }))
        }
        defer { subscription.close() }
        try await Task.sleep(for: .milliseconds(100))
        #expect(manager.storeStatus.value == .reading)
        #expect(manager.state.value == .loggedOut)
        #expect(events.withLockedValue { $0 }.isEmpty, "start-up events before the store answered")
        store.open()
        await manager.storeRead()
        #expect(manager.storeStatus.value == .available)
        #expect(await eventually { manager.state.value == .loggedIn })
        #expect(await eventually { events.withLockedValue { $0 }.contains(.initialSession(.loggedIn)) })

        // Off the loop thread, the manager waits for the read: the stored session at once.
        let again = try SessionManager(loop: loop, authority: RotatingAuthority(), store: ProbedStore(FileCredentialStore(directory: tmp.store)))
        #expect(again.storeStatus.value == .available && again.state.value == .loggedIn)
        await again.close()

        // Unreadable: a key file that is not a key.
        let broken = TemporaryDirectory()
        try FileCredentialStore(directory: broken.store, key: .keyFile).write(StoredSession(accessToken: Secret("x"), memberID: "bob"))
        let unreadable = FileCredentialStore(directory: broken.store, key: .keyFile)
        chmod(unreadable.keyPath, 0o000)
        defer { chmod(unreadable.keyPath, 0o600) }
        if getuid() != 0 {
            let blind = try await loop.submit { try SessionManager(loop: loop, authority: RotatingAuthority(), store: unreadable) }
            #expect(await eventually(timeout: .seconds(20)) {
                if case .unavailable = blind.storeStatus.value { return true }
                return false
            })
            #expect(blind.state.value == .loggedOut)
            await blind.close()
        }
        await manager.close()
    }
}

private func file(_ directory: String) -> FileCredentialStore { FileCredentialStore(directory: directory) }
