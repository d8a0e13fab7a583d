import CLibUV
import Foundation
import Synchronization
import SessionFlowTestSupport
import Testing

@_spi(Testing) @testable import LoopFlow

@Suite("EventLoop")
struct EventLoopTests {
    @Test func executeRunsOnTheLoopThreadAndNeverInline() async throws {
        try await withLoop { loop in
            // Given a job posted from inside another job on the loop thread
            let order = Recorder<String>()
            let onLoop = Recorder<Bool>()
            try loop.execute {
                onLoop.append(loop.inEventLoop)
                try! loop.execute {
                    onLoop.append(loop.inEventLoop)
                    order.append("inner")
                }
                order.append("outer returned")
            }
            // Then the inner job ran after the outer one returned, both on the loop thread
            #expect(await eventually { order.count == 2 })
            #expect(order.all == ["outer returned", "inner"])
            #expect(onLoop.all == [true, true])
            #expect(!loop.inEventLoop)
        }
    }

    @Test func jobsFromManyThreadsAllRunInPostingOrderPerThreadWithCoalescedWakeups() async throws {
        try await withLoop { loop in
            let perThread = 2_000
            let seen = LockedBox([[Int]](repeating: [], count: 8))
            let wakeupsBefore = loop.wakeups.load(ordering: .relaxed)
            // When 8 threads post 2000 jobs each
            onThreads(8) { thread in
                for sequence in 0..<perThread {
                    try! loop.execute { seen.withLockedValue { $0[thread].append(sequence) } }
                }
            }
            #expect(await eventually { seen.withLockedValue { $0.allSatisfy { $0.count == perThread } } })
            // Then each thread's jobs ran in the order it posted them
            for sequences in seen.withLockedValue({ $0 }) {
                #expect(sequences == Array(0..<perThread))
            }
            // And the loop woke far fewer times than there were jobs (the queue is drained whole)
            let wakeups = loop.wakeups.load(ordering: .relaxed) - wakeupsBefore
            #expect(wakeups < 8 * perThread)
        }
    }

    @Test func submitReturnsTheResultFromTheLoopThread() async throws {
        try await withLoop { loop in
            let onLoop = try await loop.submit { loop.inEventLoop }
            #expect(onLoop)
            await #expect(throws: TestError(tag: "x")) {
                try await loop.submit { throw TestError(tag: "x") }
            }
        }
    }

    @Test func oneShotTimerFiresOnceOnTheLoopThread() async throws {
        try await withLoop { loop in
            let fired = Recorder<Bool>()
            let timer = try loop.scheduleTimer(after: .milliseconds(5)) { fired.append(loop.inEventLoop) }
            #expect(await eventually { fired.count == 1 })
            try await Task.sleep(for: .milliseconds(30))
            #expect(fired.all == [true])
            #expect(timer.isCancelled)
        }
    }

    @Test func repeatingTimerFiresUntilCancelled() async throws {
        try await withLoop { loop in
            let ticks = Counter()
            let timer = try loop.scheduleTimer(after: .milliseconds(1), repeating: .milliseconds(1)) {
                ticks.increment()
            }
            #expect(await eventually { ticks.current >= 5 })
            // Cancelling on the loop thread guarantees nothing fires afterwards
            let atCancel = try await loop.submit { () -> Int in
                timer.cancel()
                return ticks.current
            }
            try await Task.sleep(for: .milliseconds(30))
            #expect(ticks.current == atCancel)
        }
    }

    @Test func timerCancelledBeforeItFiresNeverRuns() async throws {
        try await withLoop { loop in
            let fired = Counter()
            let timer = try loop.scheduleTimer(after: .milliseconds(20)) { fired.increment() }
            timer.cancel()
            timer.cancel()
            try await Task.sleep(for: .milliseconds(60))
            #expect(fired.current == 0)
        }
    }

    @Test func repeatingTimerNeedsAPositiveInterval() async throws {
        try await withLoop { loop in
            #expect(throws: LoopFlowError.self) {
                try loop.scheduleTimer(after: .zero, repeating: .zero) {}
            }
        }
    }

    @Test func ownedShutdownClosesEveryHandleAndTheLoop() throws {
        // Given a loop with work done, a pending timer and a repeating timer
        let loop = try EventLoop()
        let ran = Latch()
        try loop.execute { ran.signal() }
        ran.wait()
        try loop.scheduleTimer(after: .seconds(3600)) {}
        try loop.scheduleTimer(after: .milliseconds(1), repeating: .milliseconds(1)) {}
        // When it shuts down
        let report = try loop.shutdown()
        // Then uv_loop_close succeeded: no handle was left open
        #expect(loop.loopCloseResult == 0)
        #expect(report.unclosedSubscriptions == 0)
    }

    @Test func nothingIsAcceptedAfterShutdown() throws {
        let loop = try EventLoop()
        try loop.shutdown()
        let ran = Counter()
        #expect(throws: LoopFlowError(.loopShutDown, "the event loop 'loopflow' is shut down")) {
            try loop.execute { ran.increment() }
        }
        #expect(throws: LoopFlowError.self) { try loop.scheduleTimer(after: .zero) { ran.increment() } }
        let error = #expect(throws: LoopFlowError.self) { try loop.shutdown() }
        #expect(error?.code == .alreadyShutDown)
        #expect(ran.current == 0)
    }

    @Test func ownedLoopCannotBeShutDownFromItsOwnThread() async throws {
        try await withLoop { loop in
            let code = try await loop.submit { () -> LoopFlowError.Code? in
                do {
                    try loop.shutdown()
                    return nil
                } catch let error as LoopFlowError {
                    return error.code
                } catch {
                    return nil
                }
            }
            #expect(code == .busy)
            // and the loop still works
            #expect(try await loop.submit { 42 } == 42)
        }
    }

    @Test func workAcceptedBeforeShutdownStillRuns() throws {
        let loop = try EventLoop()
        let blocker = try LoopBlocker(loop)
        let ran = Counter()
        for _ in 0..<100 { try loop.execute { ran.increment() } }
        let shutdown = Thread { _ = try? loop.shutdown() }
        shutdown.start()
        Thread.sleep(forTimeInterval: 0.01)
        blocker.open()
        while loop.loopCloseResult == nil { Thread.sleep(forTimeInterval: 0.001) }
        #expect(ran.current == 100)
    }
}

@Suite("EventLoop, borrowed mode")
struct BorrowedLoopTests {
    /// A host program: its own uv loop on its own thread, with a timer of its own.
    final class Host: @unchecked Sendable {
        let uvLoop = UnsafeMutablePointer<uv_loop_t>.allocate(capacity: 1)
        let hostTimer = UnsafeMutablePointer<uv_timer_t>.allocate(capacity: 1)
        let hostTicks = Counter()
        let loopReady = Latch()
        let finished = Latch()
        var loop: EventLoop!
        var runReturned = false
        var closeResult: Int32 = -1
        var hostTicksAfterShutdown = 0
        var thread: Thread!

        func start(_ whileRunning: @escaping @Sendable (Host) -> Void) {
            thread = Thread { [self] in
                uv_loop_init(uvLoop)
                uv_timer_init(uvLoop, hostTimer)
                hostTimer.pointee.data = Unmanaged.passUnretained(self).toOpaque()
                uv_timer_start(hostTimer, { timer in
                    let host = Unmanaged<Host>.fromOpaque(timer!.pointee.data).takeUnretainedValue()
                    let ticks = host.hostTicks.increment()
                    if host.loop == nil, ticks > 1_000_000 { return }
                }, 1, 1)
                loop = try! EventLoop(borrowing: uvLoop)
                loopReady.signal()
                whileRunning(self)
                uv_run(uvLoop, UV_RUN_DEFAULT)
                runReturned = true
                closeResult = uv_loop_close(uvLoop)
                finished.signal()
            }
            thread.start()
        }

        /// Host side: stop its own timer (the host closes what it owns).
        func closeHostTimer() {
            uv_close(UnsafeMutableRawPointer(hostTimer).assumingMemoryBound(to: uv_handle_t.self), nil)
        }
    }

    @Test func borrowedLoopRunsWorkOnTheHostThreadAndLetsUvRunReturnAfterShutdown() throws {
        let host = Host()
        host.start { _ in }
        host.loopReady.wait()
        let loop = host.loop!
        // Work posted from a foreign thread runs on the host's loop thread
        let ranOnHostLoop = LockedBox<Bool?>(nil)
        let state = MutableStateFlow(0, on: loop)
        let seen = Recorder<Int>()
        let completed = Counter()
        let released = Counter()
        _ = try state.subscribe(
            onState: { seen.append($0) },
            onComplete: { completed.increment() },
            onRelease: { released.increment() })
        try loop.execute { ranOnHostLoop.withLockedValue { $0 = loop.inEventLoop } }
        // A timer of the library's own still pending at shutdown must not keep uv_run alive
        let libraryTimerFired = Counter()
        try loop.scheduleTimer(after: .seconds(3600)) { libraryTimerFired.increment() }
        state.value = 7
        while seen.last != 7 { Thread.sleep(forTimeInterval: 0.001) }
        #expect(ranOnHostLoop.withLockedValue { $0 } == true)
        // Shutting down off the loop thread is refused
        let offThread = #expect(throws: LoopFlowError.self) { try loop.shutdown() }
        #expect(offThread?.code == .wrongThread)

        // When the host shuts the library down on its loop thread, then later closes its timer
        let report = LockedBox<EventLoop.ShutdownReport?>(nil)
        try loop.execute {
            report.withLockedValue { $0 = try? loop.shutdown() }
            let ticksAtShutdown = host.hostTicks.current
            // The host's own timer keeps running after the library is gone
            let check = UnsafeMutablePointer<uv_timer_t>.allocate(capacity: 1)
            uv_timer_init(host.uvLoop, check)
            check.pointee.data = Unmanaged.passRetained(Box((host, ticksAtShutdown))).toOpaque()
            uv_timer_start(check, { timer in
                let box = Unmanaged<Box<(Host, Int)>>.fromOpaque(timer!.pointee.data).takeRetainedValue()
                let (host, ticksAtShutdown) = box.value
                host.hostTicksAfterShutdown = host.hostTicks.current - ticksAtShutdown
                host.closeHostTimer()
                uv_close(UnsafeMutableRawPointer(timer!).assumingMemoryBound(to: uv_handle_t.self)) { handle in
                    handle!.deallocate()
                }
            }, 20, 0)
        }
        host.finished.wait()
        // Then the host's uv_run returned, its loop closed cleanly, its timer was untouched
        #expect(host.runReturned)
        #expect(host.closeResult == 0)
        #expect(host.hostTicksAfterShutdown > 0)
        // And the open subscription was completed, released and reported
        #expect(report.withLockedValue { $0 }?.unclosedSubscriptions == 1)
        #expect(completed.current == 1)
        #expect(released.current == 1)
        #expect(throws: LoopFlowError.self) { try loop.execute {} }
        #expect(libraryTimerFired.current == 0)
    }

    final class Box<T>: @unchecked Sendable {
        let value: T
        init(_ value: T) { self.value = value }
    }
}

@Suite("ManualClock")
struct ManualClockTests {
    /// `nowNanoseconds` (the valid-token path's clock) is `now` in nanoseconds, on the system
    /// clock (read directly) and on a manual one (through the backend); conversions clamp.
    @Test func nowInNanosecondsIsNowOnEitherClock() async throws {
        try await withLoop { loop in
            let before = EventLoop.nanoseconds(loop.now)
            let now = loop.nowNanoseconds
            let after = EventLoop.nanoseconds(loop.now)
            #expect(before <= now && now <= after)
            var boot = timespec()
            clock_gettime(CLOCK_BOOTTIME, &boot)
            // The loop clock is CLOCK_BOOTTIME (suspended time counts toward expiry).
            #expect(abs(Int64(boot.tv_sec) * 1_000_000_000 + Int64(boot.tv_nsec) - now) < 60_000_000_000)
        }
        let clock = ManualClock()
        try await withLoop(clock: .manual(clock)) { loop in
            #expect(loop.nowNanoseconds == 0)
            await clock.advance(by: .seconds(90) + .nanoseconds(7))
            #expect(loop.nowNanoseconds == 90_000_000_007)
        }
        #expect(EventLoop.nanoseconds(.seconds(Int64.max)) == .max)
        #expect(EventLoop.nanoseconds(.seconds(Int64.min)) == .min)
        #expect(EventLoop.nanoseconds(.milliseconds(-1500)) == -1_500_000_000)
    }

    @Test func timersFireOnlyWhenTimeIsAdvancedInDeadlineOrder() async throws {
        let clock = ManualClock()
        try await withLoop(clock: .manual(clock)) { loop in
            let fired = Recorder<(String, Duration)>()
            try await loop.submit {
                try loop.scheduleTimer(after: .seconds(5)) { fired.append(("b", loop.now)) }
                try loop.scheduleTimer(after: .seconds(2)) { fired.append(("a", loop.now)) }
                try loop.scheduleTimer(after: .seconds(5)) { fired.append(("c", loop.now)) }
            }
            try await Task.sleep(for: .milliseconds(20))
            #expect(fired.count == 0)
            await clock.advance(by: .seconds(1))
            #expect(fired.count == 0)
            #expect(clock.now == .seconds(1))
            await clock.advance(by: .seconds(4))
            #expect(fired.all.map(\.0) == ["a", "b", "c"])
            #expect(fired.all.map(\.1) == [.seconds(2), .seconds(5), .seconds(5)])
            #expect(loop.now == .seconds(5))
        }
    }

    @Test func repeatingTimersAndTheWorkTheyPostPlayOutInVirtualTime() async throws {
        let clock = ManualClock()
        try await withLoop(clock: .manual(clock)) { loop in
            let log = Recorder<String>()
            try await loop.submit {
                try loop.scheduleTimer(after: .seconds(3), repeating: .seconds(3)) {
                    log.append("tick@\(loop.now)")
                    try! loop.execute { log.append("job@\(loop.now)") }
                }
            }
            await clock.advance(by: .seconds(10))
            #expect(log.all == [
                "tick@3.0 seconds", "job@3.0 seconds",
                "tick@6.0 seconds", "job@6.0 seconds",
                "tick@9.0 seconds", "job@9.0 seconds",
            ])
            #expect(clock.nextDeadline == .seconds(12))
        }
    }

    @Test func concurrentAdvancesShareOneStepperAndEachReturnsAtItsTarget() async throws {
        let clock = ManualClock()
        try await withLoop(clock: .manual(clock)) { loop in
            let fired = Recorder<Duration>()
            try await loop.submit {
                try loop.scheduleTimer(after: .seconds(1), repeating: .seconds(1)) { fired.append(loop.now) }
            }
            // Concurrent: both advances are made at time 0 (each target is now + its duration),
            // before any step runs — the loop thread is held until both wait.
            let hold = DispatchSemaphore(value: 0)
            try loop.execute { hold.wait() }
            // Each returns once time reached its target: `a` after the 2 s tick at the least.
            async let a: Int = { await clock.advance(by: .seconds(2)); return fired.count }()
            async let b: Void = clock.advance(by: .seconds(3))
            let bothWaiting = await eventually { clock.waitingAdvances == 2 }
            hold.signal()
            #expect(bothWaiting)
            let (firedWhenAReturned, _) = await (a, b)
            #expect(firedWhenAReturned >= 2)
            #expect(clock.now == .seconds(3))
            #expect(fired.all == [.seconds(1), .seconds(2), .seconds(3)])
        }
    }

    @Test func aClockDrivesOneLoopOnly() async throws {
        let clock = ManualClock()
        try await withLoop(clock: .manual(clock)) { _ in
            #expect(throws: LoopFlowError.self) { try EventLoop(clock: .manual(clock)) }
        }
    }
}

/// Issue 17, point 2: the loop's queue had no limit, so a loop stuck in a callback could be
/// buried under requests. `executeBounded` admits at most `boundedJobLimit` waiting jobs.
@Suite("EventLoop: bounded jobs")
struct BoundedJobTests {
    @Test func boundedJobsBeyondTheLimitAreRefusedAndTheOthersStillRun() async throws {
        let loop = try EventLoop(name: "bounded", boundedJobLimit: 8)
        defer { _ = try? loop.shutdown() }
        // Given a loop stuck in a callback,
        let stuck = DispatchSemaphore(value: 0)
        let inside = DispatchSemaphore(value: 0)
        try loop.execute { inside.signal(); stuck.wait() }
        inside.wait()
        let ran = LockedBox(0)
        // eight bounded jobs are accepted and the ninth refused: overloaded, not queued;
        for _ in 0..<8 { try loop.executeBounded { ran.withLockedValue { $0 += 1 } } }
        let refused = #expect(throws: LoopFlowError.self) { try loop.executeBounded { ran.withLockedValue { $0 += 100 } } }
        #expect(refused?.code == .overloaded)
        #expect(loop.boundedJobsPending == 8)
        // unbounded work (the answers of admitted work) is still accepted.
        let answered = LockedBox(false)
        try loop.execute { answered.withLockedValue { $0 = true } }
        stuck.signal()
        try await loop.submit {}
        #expect(ran.withLockedValue { $0 } == 8)
        #expect(answered.withLockedValue { $0 })
        #expect(loop.boundedJobsPending == 0)
        // Room again once they ran.
        try loop.executeBounded { ran.withLockedValue { $0 += 1 } }
        try await loop.submit {}
        #expect(ran.withLockedValue { $0 } == 9)
    }

    @Test func aFullQueueIsRunAtShutdownAndShutdownReturns() throws {
        let loop = try EventLoop(name: "bounded-stop", boundedJobLimit: 1_000)
        let stuck = DispatchSemaphore(value: 0)
        let inside = DispatchSemaphore(value: 0)
        try loop.execute { inside.signal(); stuck.wait() }
        inside.wait()
        let ran = LockedBox(0)
        while (try? loop.executeBounded({ ran.withLockedValue { $0 += 1 } })) != nil {}
        #expect(loop.boundedJobsPending == 1_000)
        stuck.signal()
        try loop.shutdown()
        #expect(ran.withLockedValue { $0 } == 1_000)
        let afterShutdown = #expect(throws: LoopFlowError.self) { try loop.executeBounded {} }
        #expect(afterShutdown?.code == .loopShutDown)
    }

    @Test func aLimitBelowOneIsRefused() {
        let error = #expect(throws: LoopFlowError.self) { _ = try EventLoop(name: "bad", boundedJobLimit: 0) }
        #expect(error?.code == .invalidConfiguration)
    }
}
