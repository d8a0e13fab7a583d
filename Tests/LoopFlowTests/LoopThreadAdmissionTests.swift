import Foundation
import Synchronization
import SessionFlowTestSupport
import Testing

@testable import LoopFlow

/// A StateFlow's admissions on the loop thread (`FlowCore.admit`, `reclaimLocally`): kept in
/// the loop's own arrival list for the pending delivery; a loop-thread close of the latest of
/// them frees its record at once, and the next loop-thread subscribe takes that record without
/// the lock.
@Suite("Loop-thread admissions")
struct LoopThreadAdmissionTests {
    /// Something a callback captures, to see when the library lets go of the callback.
    final class Canary: Sendable {}

    /// A weak reference to a canary, set on the loop thread and read after a hop back.
    final class WeakCanary: @unchecked Sendable {
        weak var object: Canary?
    }

    @Test func subscribeAndCloseOnTheLoopThreadReuseOneRecord() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let calls = Counter()
            let highWater = try await loop.submit {
                for _ in 0..<1_000 {
                    let handle = try state.subscribe(onState: { _ in calls.increment() })
                    #expect(handle.close())
                }
                return state.core.recordHighWater
            }
            // One record served all thousand (it was 1 000 records, freed a loop turn later).
            #expect(highWater == 1)
            // The delivery the first one claimed returns the spare: the pool is empty again.
            try await loop.submit {}
            #expect(state.core.recordHighWater == 0)
            #expect(state.core.lock.withLock { state.core.liveCount } == 0)
            state.value = 1
            try await loop.submit {}
            #expect(calls.current == 0)
        }
    }

    @Test func aReclaimedRecordsCallbackIsLetGoOfByTheDeliveryNotInsideClose() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let canary = WeakCanary()
            let (heldAfterClose, reused) = try await loop.submit {
                let handle: FlowSubscription
                do {
                    let captured = Canary()
                    canary.object = captured
                    handle = try state.subscribe(onState: { _ in withExtendedLifetime(captured) {} })
                }
                handle.close()
                let next = try state.subscribe(onState: { _ in })
                next.close()
                return (canary.object != nil, next.slot == handle.slot)
            }
            // The record was freed in the close (the next subscriber took it), its closure not:
            // a captured object's deinit is user code, run by the delivery.
            #expect(heldAfterClose && reused)
            try await loop.submit {}
            #expect(canary.object == nil)
        }
    }

    @Test func theNextSubscriberTakesTheSpareRecordAndOnlyItIsCalled() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(7, on: loop)
            let first = Recorder<Int>()
            let second = Recorder<Int>()
            let (old, new) = try await loop.submit {
                let old = try state.subscribe(onState: { first.append($0) })
                old.close()
                let new = try state.subscribe(onState: { second.append($0) })
                return (old, new)
            }
            // The same record, another id: the old handle neither closes nor sees the new one.
            #expect(new.slot == old.slot && new.entry.raw == old.entry.raw && new.id != old.id)
            #expect(old.isClosed && !old.close() && !new.isClosed)
            #expect(await eventually { second.all == [7] })
            state.value = 8
            #expect(await eventually { second.all == [7, 8] })
            #expect(first.all.isEmpty)
            #expect(new.close())
        }
    }

    @Test func aCloseOfAnEarlierArrivalTakesTheUsualPath() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let calls = Counter()
            let highWater = try await loop.submit {
                let a = try state.subscribe(onState: { _ in calls.increment() })
                let b = try state.subscribe(onState: { _ in calls.increment() })
                a.close()  // not the latest: released when the delivery registers it
                b.close()  // the latest: freed now
                let c = try state.subscribe(onState: { _ in calls.increment() })  // b's record
                #expect(c.slot == b.slot)
                c.close()
                // a's record is still a's, closed, waiting for the delivery.
                let aTag = a.entry.tag.pointee.load(ordering: .acquiring)
                #expect(aTag == a.id << SubscriberEntry.idShift | SubscriberEntry.closedBit)
                let d = try state.subscribe(onState: { _ in calls.increment() })
                #expect(d.slot == c.slot)
                d.close()
                return state.core.recordHighWater
            }
            #expect(highWater == 2)
            try await loop.submit {}
            #expect(state.core.recordHighWater == 0)
            #expect(calls.current == 0)
        }
    }

    @Test func aLoopArrivalClosedFromAnotherThreadIsNotReused() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(3, on: loop)
            let first = Recorder<Int>()
            let second = Recorder<Int>()
            let (old, new, closedElsewhere) = try await loop.submit {
                let old = try state.subscribe(onState: { first.append($0) })
                let closed = Flag()
                // A copy of the handle closed on a thread of its own, before the delivery.
                onThreads(1) { _ in closed.set(old.close()) }
                let new = try state.subscribe(onState: { second.append($0) })
                return (old, new, closed.isSet)
            }
            #expect(closedElsewhere)
            // Its record waits for the delivery to release it: the next one got another.
            #expect(new.slot != old.slot)
            #expect(await eventually { second.all == [3] })
            try await loop.submit {}
            #expect(first.all.isEmpty)
            #expect(state.core.recordHighWater == 2)
            new.close()
        }
    }

    @Test func subscribersWithARecordSideTakeTheUsualPath() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let released = Counter()
            let releasedInsideClose = try await loop.submit {
                var inside = 0
                for _ in 0..<10 {
                    let handle = try state.subscribe(onState: { _ in }, onRelease: { released.increment() })
                    handle.close()
                    inside += released.current
                }
                return (inside, state.core.recordHighWater)
            }
            // `onRelease` never runs inside `close()`; each record waits for the delivery.
            #expect(releasedInsideClose == (0, 10))
            #expect(await eventually { released.current == 10 })
        }
    }

    @Test func whileTheCountIsObservedAClosedRecordCountsUntilTheLoopReleasesIt() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let count = state.subscriptionCount
            let (afterClose, afterSecond) = try await loop.submit {
                let a = try state.subscribe(onState: { _ in })
                a.close()
                let closedCounted = count.value
                let b = try state.subscribe(onState: { _ in })
                let bothCounted = count.value
                b.close()
                return (closedCounted, bothCounted)
            }
            #expect(afterClose == 1)
            #expect(afterSecond == 2)
            #expect(await eventually { count.value == 0 })
        }
    }

    @Test func aShutdownRightAfterLoopThreadChurnCompletesTheOpenOneAndFreesTheFlow() async throws {
        weak var weakCore: FlowCore?
        let report: EventLoop.ShutdownReport
        do {
            let loop = try EventLoop(name: "test-loop")
            let state = MutableStateFlow(0, on: loop)
            weakCore = state.core
            let completed = Counter()
            try await loop.submit {
                for _ in 0..<10 {
                    try state.subscribe(onState: { _ in }).close()
                }
                // Left open: the teardown completes it.
                _ = try state.subscribe(onState: { _ in }, onComplete: { completed.increment() })
                for _ in 0..<10 {
                    try state.subscribe(onState: { _ in }).close()
                }
            }
            report = try loop.shutdown()
            #expect(completed.current == 1)
        }
        #expect(report.unclosedSubscriptions == 1)
        #expect(weakCore == nil)
    }

    @Test func aCountFirstObservedWhileASpareWaitsRisesWithTheNextSubscribe() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let counts = try await loop.submit {
                let a = try state.subscribe(onState: { _ in })
                a.close()  // reclaimed: a spare, counted until the delivery returns it
                let count = state.subscriptionCount
                let before = count.value
                let b = try state.subscribe(onState: { _ in })
                let after = count.value
                b.close()
                return (before, after)
            }
            #expect(counts == (1, 2))
            #expect(await eventually { state.subscriptionCount.value == 0 })
        }
    }

    @Test func aCSubscribersLatestArrivalIsNotReclaimed() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let invoker = ForeignCallback<Int> { _, _, _ in }
            let highWater = try await loop.submit {
                let function = UnsafeRawPointer(bitPattern: 0x10)!
                for _ in 0..<10 {
                    try state.subscribe(foreign: invoker, function: function, userdata: nil).close()
                }
                return state.core.recordHighWater
            }
            // Its side record holds the invoker: released by the delivery, one record each.
            #expect(highWater == 10)
            try await loop.submit {}
            #expect(state.core.recordHighWater == 0)
        }
    }

    /// Runs `body` when let go of.
    final class DeinitHook: @unchecked Sendable {
        let body: () -> Void
        init(_ body: @escaping () -> Void) { self.body = body }
        deinit { body() }
    }

    @Test func aDeinitOfAReclaimedCallbackMaySubscribeAndCloseOnTheSameFlow() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(5, on: loop)
            let seen = Recorder<Int>()
            let keeper = LockedBox<FlowSubscription?>(nil)
            try await loop.submit {
                let hook = DeinitHook {
                    // On the loop thread, inside the delivery that lets go of it.
                    try! state.subscribe(onState: { _ in seen.append(-1) }).close()
                    keeper.withLockedValue { $0 = try! state.subscribe(onState: { seen.append($0) }) }
                    try! state.subscribe(onState: { _ in seen.append(-1) }).close()
                }
                try state.subscribe(onState: { _ in withExtendedLifetime(hook) {} }).close()
            }
            // The keeper admitted in the deinit gets the value from the next delivery; the
            // ones closed there get nothing.
            #expect(await eventually { seen.all == [5] })
            _ = keeper.withLockedValue { $0?.close() }
            try await loop.submit {}
            try await loop.submit {}
            #expect(seen.all == [5])
            #expect(state.core.recordHighWater == 0)
        }
    }

    @Test func subscribeAndCloseInsideACallbackWaitForTheNextDelivery() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let inner = Recorder<Int>()
            let innerHandles = LockedBox<[FlowSubscription]>([])
            let outer = try state.subscribe(onState: { value in
                guard value == 1 else { return }
                for _ in 0..<3 {
                    try! state.subscribe(onState: { _ in inner.append(-1) }).close()
                }
                let kept = try! state.subscribe(onState: { inner.append($0) })
                innerHandles.withLockedValue { $0.append(kept) }
            })
            state.value = 1
            // The one kept gets 1 from the delivery its admission claimed, not in this walk.
            #expect(await eventually { inner.all == [1] })
            state.value = 2
            #expect(await eventually { inner.all == [1, 2] })
            outer.close()
            for handle in innerHandles.withLockedValue({ $0 }) { handle.close() }
            try await loop.submit {}
            #expect(state.core.recordHighWater == 0)
        }
    }

    @Test func closesRacingFromOtherThreadsCloseEachSubscriptionOnce() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let latest = LockedBox<FlowSubscription?>(nil)
            let closedByThisCall = Counter()
            let subscribed = Counter()
            let calls = Counter()
            let stop = Flag()
            let stopped = Counter()
            // Two closers, each pausing between tries: spinning, they took both of this
            // machine's cores from the suites running beside this test (the async views' 20 s
            // hang guards fired in a loaded CI run).
            for _ in 0..<2 {
                Thread {
                    while !stop.isSet {
                        if let handle = latest.withLockedValue({ $0 }) {
                            if handle.close() { closedByThisCall.increment() }
                            _ = handle.isClosed
                        }
                        _ = state.core.openSubscriptionCount()
                        usleep(20)
                    }
                    stopped.increment()
                }.start()
            }
            for round in 0..<40 {
                try await loop.submit {
                    for _ in 0..<250 {
                        let handle = try state.subscribe(onState: { _ in calls.increment() })
                        subscribed.increment()
                        latest.withLockedValue { $0 = handle }
                        if handle.close() { closedByThisCall.increment() }
                    }
                }
                state.value = round + 1
            }
            stop.set()
            #expect(await eventually { stopped.current == 2 })
            // Every subscription closed by exactly one call, wherever it came from; none called.
            #expect(closedByThisCall.current == subscribed.current)
            try await loop.submit {}
            #expect(calls.current == 0)
            #expect(state.core.recordHighWater == 0)
            #expect(state.core.lock.withLock { state.core.liveCount } == 0)
        }
    }

    @Test func aLoopThreadSubscribeOnceShutdownIsRequestedIsRefusedEvenWithASpare() async throws {
        let loop = try EventLoop(name: "test-loop")
        let state = MutableStateFlow(0, on: loop)
        let refused = LockedBox<Bool?>(nil)
        let spareMade = Flag()
        try loop.execute {
            try! state.subscribe(onState: { _ in }).close()  // a spare, a delivery pending
            spareMade.set()
            // The test thread asks for the shutdown meanwhile (it waits for this job).
            while loop.acceptsWork { usleep(100) }
            do {
                _ = try state.subscribe(onState: { _ in })
                refused.withLockedValue { $0 = false }
            } catch {
                refused.withLockedValue { $0 = (error as? LoopFlowError)?.code == .loopShutDown }
            }
        }
        #expect(await eventually { spareMade.isSet })
        let report = try loop.shutdown()
        #expect(refused.withLockedValue { $0 } == true)
        #expect(report.unclosedSubscriptions == 0)
    }
}
