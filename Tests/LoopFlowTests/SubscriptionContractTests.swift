import Foundation
import InMemoryLogging
import Logging
import Synchronization
import SessionFlowTestSupport
import Testing

@testable import LoopFlow

/// docs/ARCHITECTURE.md "The threading and lifetime contract", rules 1–6, one test per promise.
@Suite("FlowSubscription contract")
struct SubscriptionContractTests {
    @Test func everyCallbackRunsOnTheLoopThread() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let events = try MutableSharedFlow<Int>(on: loop)
            let offLoop = Counter()
            let calls = Counter()
            let releases = Counter()
            let check: @Sendable () -> Void = {
                calls.increment()
                if !loop.inEventLoop { offLoop.increment() }
            }
            let release: @Sendable () -> Void = {
                check()
                releases.increment()
            }
            let a = try state.subscribe(onState: { _ in check() }, onComplete: check, onRelease: release)
            let b = try events.subscribe(onEvent: { _ in check() }, onError: { _ in check() }, onRelease: release)
            try await loop.submit {}
            state.value = 1
            events.emit(1)
            state.finish()
            events.finish(throwing: TestError(tag: "end"))
            // states 0 and 1, complete, release; event, error, release
            #expect(await eventually { releases.current == 2 })
            #expect(calls.current == 7)
            #expect(offLoop.current == 0)
            a.close()
            b.close()
        }
    }

    @Test func aCallbackNeverRunsInsideTheCallThatCausedIt() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let events = try MutableSharedFlow<Int>(on: loop)
            let insideCall = Flag()
            let violations = Counter()
            let calls = Counter()
            let observe: @Sendable () -> Void = {
                calls.increment()
                if insideCall.isSet { violations.increment() }
            }
            // On the loop thread, where running a callback inline would be possible
            try await loop.submit {
                insideCall.set(true)
                let a = try state.subscribe(onState: { _ in observe() }, onRelease: observe)
                let b = try events.subscribe(onEvent: { _ in observe() })
                state.value = 1
                events.emit(1)
                a.close()
                b.close()
                insideCall.set(false)
            }
            try await loop.submit {}
            #expect(await eventually { calls.current >= 1 })
            #expect(violations.current == 0)
        }
    }

    @Test func callbacksMayCallEveryAPIBecauseNoLibraryLockIsHeld() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let events = try MutableSharedFlow<Int>(on: loop)
            let other = try state.subscribe(onState: { _ in })
            let done = Counter()
            let subscription = try state.subscribe(onState: { value in
                guard value == 1 else { return }
                // Each of these takes a lock a held lock would deadlock on.
                _ = state.value
                state.value = 2
                state.update { $0 }
                _ = state.subscriptionCount.value
                events.emit(1)
                _ = events.droppedEvents
                let inner = try! state.subscribe(onState: { _ in })
                inner.close()
                other.close()
                try! loop.execute {}
                done.increment()
            })
            state.value = 1
            #expect(await eventually { done.current == 1 })
            #expect(await eventually { state.value == 2 })
            subscription.close()
        }
    }

    @Test func closeFromAnotherThreadReturnsOnlyAfterTheRunningCallbackFinished() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let entered = Latch()
            let finished = Flag()
            let afterClose = Counter()
            let closed = Flag()
            let subscription = try state.subscribe(onState: { value in
                if closed.isSet { afterClose.increment() }
                guard value == 1 else { return }
                entered.signal()
                Thread.sleep(forTimeInterval: 0.1)  // a long callback
                finished.set()
            })
            state.value = 1
            entered.wait()
            // When another thread closes while the callback runs
            subscription.close()
            // Then the callback had finished before close returned
            #expect(finished.isSet)
            closed.set()
            state.value = 2
            try await loop.submit {}
            #expect(afterClose.current == 0)
        }
    }

    @Test func closeFromInsideItsOwnCallbackLetsItFinishAndNothingFollows() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let seen = Recorder<String>()
            let holder = LockedBox<FlowSubscription?>(nil)
            let subscription = try state.subscribe(
                onState: { value in
                    seen.append("begin \(value)")
                    if value == 1 {
                        #expect(holder.withLockedValue { $0 }!.close())  // does not wait for itself
                    }
                    seen.append("end \(value)")
                },
                onComplete: { seen.append("complete") },
                onRelease: { seen.append("release") })
            holder.withLockedValue { $0 = subscription }
            #expect(await eventually { seen.count == 2 })
            state.value = 1
            #expect(await eventually { seen.last == "release" })
            state.value = 2
            state.finish()
            try await loop.submit {}
            #expect(seen.all == ["begin 0", "end 0", "begin 1", "end 1", "release"])
        }
    }

    @Test func closeIsSafeAnyNumberOfTimesFromAnyThread() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let released = Counter()
            let subscription = try state.subscribe(onState: { _ in }, onRelease: { released.increment() })
            let firstCloses = Counter()
            onThreads(8) { _ in
                for _ in 0..<100 where subscription.close() { firstCloses.increment() }
            }
            #expect(firstCloses.current == 1)
            #expect(!subscription.close())
            #expect(subscription.isClosed)
            #expect(await eventually { released.current == 1 })
            try await loop.submit {}
            #expect(released.current == 1)
        }
    }

    @Test func releaseRunsExactlyOnceOnTheLoopThreadAfterTheLastCallback() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let log = Recorder<String>()
            let subscription = try state.subscribe(
                onState: { value in
                    log.append("state")
                    Thread.sleep(forTimeInterval: 0.01)
                    _ = value
                },
                onRelease: { log.append(loop.inEventLoop ? "release" : "release off loop") })
            state.value = 1
            subscription.close()
            #expect(await eventually { log.last == "release" })
            try await loop.submit {}
            #expect(log.all.filter { $0.hasPrefix("release") } == ["release"])
            #expect(log.all.last == "release")
        }
    }

    @Test func aSubscriptionClosedBeforeItWasRegisteredIsReleasedWithoutCallbacks() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let log = Recorder<String>()
            let blocker = try LoopBlocker(loop)
            let subscription = try state.subscribe(
                onState: { _ in log.append("state") },
                onComplete: { log.append("complete") },
                onRelease: { log.append("release") })
            #expect(subscription.close())
            blocker.open()
            #expect(await eventually { log.count == 1 })
            try await loop.submit {}
            #expect(log.all == ["release"])
            #expect(state.subscriptionCount.value == 0)
        }
    }

    @Test func terminalCallbacksComeAtMostOnce() async throws {
        try await withLoop { loop in
            let events = try MutableSharedFlow<Int>(on: loop)
            let terminals = Counter()
            let released = Counter()
            let subscription = try events.subscribe(
                onEvent: { _ in },
                onError: { _ in terminals.increment() },
                onComplete: { terminals.increment() },
                onRelease: { released.increment() })
            try await loop.submit {}
            events.finish()
            events.finish(throwing: TestError(tag: "late"))
            #expect(await eventually { released.current == 1 })
            #expect(!subscription.close())
            try await loop.submit {}
            #expect(terminals.current == 1)
            #expect(released.current == 1)
        }
    }

    @Test func teardownCompletesOpenSubscriptionsAndReportsTheUnclosedOnes() throws {
        // Given a loop whose logger we capture
        let logs = InMemoryLogHandler()
        let loop = try EventLoop(logger: Logger(label: "test", factory: { _ in logs }))
        let state = MutableStateFlow(0, on: loop)
        let events = try MutableSharedFlow<String>(on: loop)
        let log = Recorder<String>()
        _ = try state.subscribe(
            onState: { _ in }, onComplete: { log.append("complete a") }, onRelease: { log.append("release a") })
        let b = try state.subscribe(
            onState: { _ in }, onComplete: { log.append("complete b") }, onRelease: { log.append("release b") })
        _ = try events.subscribe(
            onEvent: { _ in }, onComplete: { log.append("complete c") }, onRelease: { log.append("release c") })
        b.close()
        // When the loop is torn down with two subscriptions never closed
        let report = try loop.shutdown()
        // Then both were completed then released, the closed one only released, and reported
        #expect(report.unclosedSubscriptions == 2)
        #expect(Set(log.all) == ["complete a", "release a", "release b", "complete c", "release c"])
        #expect(log.all.firstIndex(of: "complete a")! < log.all.firstIndex(of: "release a")!)
        #expect(log.all.firstIndex(of: "complete c")! < log.all.firstIndex(of: "release c")!)
        #expect(logs.entries.contains { $0.level == .warning && $0.metadata["unclosed"] == "2" })
        #expect(loop.loopCloseResult == 0)
    }

    @Test func aSubscribeThatFailsCallsNothingAndTakesNothing() throws {
        let loop = try EventLoop()
        let state = MutableStateFlow(0, on: loop)
        let events = try MutableSharedFlow<Int>(on: loop)
        try loop.shutdown()
        let called = Counter()
        let error = #expect(throws: LoopFlowError.self) {
            try state.subscribe(
                onState: { _ in called.increment() }, onComplete: { called.increment() },
                onRelease: { called.increment() })
        }
        #expect(error?.code == .loopShutDown)
        #expect(throws: LoopFlowError.self) {
            try events.subscribe(onEvent: { _ in called.increment() }, onRelease: { called.increment() })
        }
        // A flow made after shutdown refuses too
        let late = MutableStateFlow(0, on: loop)
        #expect(throws: LoopFlowError.self) { try late.subscribe(onState: { _ in called.increment() }) }
        Thread.sleep(forTimeInterval: 0.02)
        #expect(called.current == 0)
        #expect(state.subscriptionCount.value == 0)
    }

    @Test func subscriptionIDsAreNeverReused() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            var ids = Set<UInt64>()
            for _ in 0..<1_000 {
                let subscription = try state.subscribe(onState: { _ in })
                #expect(ids.insert(subscription.id).inserted)
                subscription.close()
            }
        }
    }

    @Test func aCallbackThatHoldsItsOwnHandleDoesNotLeakIt() async throws {
        // The user's closure captures the subscription (a cycle through the handle): once
        // the subscription is released the library lets go of the closure, so both go.
        final class Holder: @unchecked Sendable {
            var subscription: FlowSubscription?
        }
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let events = try MutableSharedFlow<Int>(on: loop)
            // The handles are values now; what the cycle would keep alive is the closure's
            // context and what it captured (the holder of the handle).
            weak var stateHolder: Holder?
            weak var eventHolder: Holder?
            do {
                let ownState = Holder()
                let ownEvents = Holder()
                ownState.subscription = try state.subscribe(onState: { value in
                    if value == 1 { ownState.subscription?.close() }
                })
                ownEvents.subscription = try events.subscribe(onEvent: { _ in ownEvents.subscription?.close() })
                stateHolder = ownState
                eventHolder = ownEvents
                state.value = 1
                events.emit(1)
            }
            #expect(await eventually { stateHolder == nil && eventHolder == nil })
        }
    }
}
