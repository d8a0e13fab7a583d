import Foundation
import SessionFlowTestSupport
import Synchronization
import Testing

@testable import LoopFlow

/// Admissions off the loop thread (`FlowCore.admit`, `reclaimElsewhere`): an off-loop close of
/// the latest arrival no delivery has taken frees its record at once, under the lock, and the
/// next off-loop subscribe takes that record back; the pending delivery returns the spares to
/// the pool and lets go of their callbacks, on the loop thread.
///
/// Most tests hold the loop thread in a job (`LoopBlocker`) while the test's thread subscribes
/// and closes, so that no delivery can take the arrivals meanwhile (what the spares need),
/// however the threads are scheduled; one lets real threads race the loop's deliveries.
@Suite("Off-loop admissions")
struct OffLoopAdmissionTests {
    /// Records whether its last reference went on the loop thread.
    final class ThreadCanary: Sendable {
        let loop: EventLoop
        let releasedOnLoop: LockedBox<Bool?>
        init(loop: EventLoop, releasedOnLoop: LockedBox<Bool?>) {
            self.loop = loop
            self.releasedOnLoop = releasedOnLoop
        }
        deinit {
            let onLoop = loop.inEventLoop
            releasedOnLoop.withLockedValue { $0 = onLoop }
        }
    }

    @Test func subscribeAndCloseOffTheLoopReuseOneRecord() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let calls = Counter()
            let hold = try LoopBlocker(loop)
            var slots = Set<Int32>()
            for _ in 0..<1_000 {
                let handle = try state.subscribe(onState: { _ in calls.increment() })
                slots.insert(handle.slot)
                #expect(handle.close())
            }
            // One record served all thousand (without the reclaim: a thousand records, all
            // waiting for the loop to free them).
            #expect(slots.count == 1)
            #expect(state.core.recordHighWater == 1)
            hold.open()
            // The delivery the first one claimed returns the spare: the pool is empty again.
            try await loop.submit {}
            #expect(state.core.recordHighWater == 0)
            #expect(state.core.lock.withLock { state.core.liveCount } == 0)
            state.value = 1
            try await loop.submit {}
            #expect(calls.current == 0)
        }
    }

    @Test func aReclaimedRecordsCallbackIsLetGoOfOnTheLoopByTheDelivery() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let releasedOnLoop = LockedBox<Bool?>(nil)
            let hold = try LoopBlocker(loop)
            let handle: FlowSubscription
            do {
                let captured = ThreadCanary(loop: loop, releasedOnLoop: releasedOnLoop)
                handle = try state.subscribe(onState: { _ in withExtendedLifetime(captured) {} })
            }
            #expect(handle.close())
            let next = try state.subscribe(onState: { _ in })
            // The record was freed in the close (the next subscriber took it), its closure not:
            // a captured object's deinit is user code, run on the loop by the delivery.
            #expect(next.slot == handle.slot)
            #expect(releasedOnLoop.withLockedValue { $0 } == nil)
            #expect(next.close())
            hold.open()
            try await loop.submit {}
            #expect(releasedOnLoop.withLockedValue { $0 } == true)
        }
    }

    @Test func theNextSubscriberTakesTheSpareRecordAndOnlyItIsCalled() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(7, on: loop)
            let first = Recorder<Int>()
            let second = Recorder<Int>()
            let hold = try LoopBlocker(loop)
            let old = try state.subscribe(onState: { first.append($0) })
            #expect(old.close())
            let new = try state.subscribe(onState: { second.append($0) })
            // The same record, another id: the old handle neither closes nor sees the new one.
            #expect(new.slot == old.slot && new.id != old.id)
            #expect(old.isClosed && !new.isClosed)
            #expect(!old.close())
            #expect(!new.isClosed)
            hold.open()
            #expect(await eventually { second.all == [7] })
            state.value = 8
            #expect(await eventually { second.all == [7, 8] })
            #expect(first.all.isEmpty)
            #expect(new.close())
        }
    }

    @Test func aSharedFlowsNextSubscriberOnTheSpareGetsWhatWasEmittedAfterIt() async throws {
        try await withLoop { loop in
            let events = try MutableSharedFlow<Int>(on: loop, replay: 0)
            let first = Recorder<Int>()
            let second = Recorder<Int>()
            let hold = try LoopBlocker(loop)
            #expect(events.emit(1))  // before either: neither receives it
            let old = try events.subscribe(onEvent: { first.append($0) })
            #expect(old.close())
            let new = try events.subscribe(onEvent: { second.append($0) })
            #expect(new.slot == old.slot)
            #expect(events.emit(2))
            hold.open()
            #expect(await eventually { second.all == [2] })
            #expect(events.emit(3))
            #expect(await eventually { second.all == [2, 3] })
            #expect(first.all.isEmpty)
            #expect(new.close())
        }
    }

    /// The interleaving a reviewer found: a close's compare-and-swap, then (before the close
    /// takes the lock) a delivery frees the record and a newer subscriber takes the same slot,
    /// its arrival the latest again. The late close must leave the newer one alone.
    @Test func aLateCloseLeavesTheNewerSubscriberOnItsSlotAlone() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(5, on: loop)
            let first = Recorder<Int>()
            let second = Recorder<Int>()
            let armed = Flag()
            let paused = Flag()
            let resume = Latch()
            state.core.beforeReclaimElsewhere = {
                guard armed.isSet else { return }
                armed.set(false)
                paused.set()
                resume.wait()
            }
            let holdOld = try LoopBlocker(loop)
            let old = try state.subscribe(onState: { first.append($0) })
            armed.set()
            let closedOld = LockedBox<Bool?>(nil)
            let closer = Thread { closedOld.withLockedValue { $0 = old.close() } }
            closer.start()
            #expect(await eventually { paused.isSet })
            // The delivery takes the old arrival, finds it closed and frees its record.
            holdOld.open()
            #expect(await eventually { state.core.recordHighWater == 0 })
            // A newer subscriber on the same slot, its arrival the latest (the loop held again).
            let holdNew = try LoopBlocker(loop)
            let new = try state.subscribe(onState: { second.append($0) })
            #expect(new.slot == old.slot)
            resume.signal()
            #expect(await eventually { closedOld.withLockedValue { $0 } != nil })
            #expect(closedOld.withLockedValue { $0 } == true)
            #expect(!new.isClosed)
            holdNew.open()
            #expect(await eventually { second.all == [5] })
            #expect(first.all.isEmpty)
            #expect(new.close())
        }
    }

    /// Real threads, the loop free: two threads subscribe and close at once (their records
    /// reclaimed in their closes, or freed by deliveries that meet them) while a third keeps
    /// subscribing with an `onRelease` and checks its own handle. No close may close or free
    /// another subscription: each of the third's is open until its own close, which closes it,
    /// and every one is released once.
    @Test func churningThreadsCloseNothingOfAnotherSubscriber() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let churnersDone = Counter()
            let closedByOthers = Counter()
            let subscribed = Counter()
            let released = Counter()
            // On threads of their own, waited for off the cooperative pool.
            await offThePool {
                onThreads(3) { index in
                    if index < 2 {
                        for _ in 0..<20_000 {
                            try! state.subscribe(onState: { _ in }).close()
                        }
                        churnersDone.increment()
                    } else {
                        while churnersDone.current < 2 {
                            let handle = try! state.subscribe(onState: { _ in }, onRelease: { released.increment() })
                            subscribed.increment()
                            if handle.isClosed || !handle.close() { closedByOthers.increment() }
                        }
                    }
                }
            }
            #expect(closedByOthers.current == 0)
            #expect(await eventually { released.current == subscribed.current })
            try await loop.submit {}
            #expect(state.core.lock.withLock { state.core.liveCount } == 0)
        }
    }

    @Test func aSpareLeftAtShutdownIsReturnedAndItsCallbackLetGoOfOnTheLoop() async throws {
        let loop = try EventLoop(name: "test-loop")
        let state = MutableStateFlow(0, on: loop)
        let releasedOnLoop = LockedBox<Bool?>(nil)
        let running = Flag()
        // Holds the loop until the shutdown is asked for: the delivery the spare needs is still
        // pending then (its job accepted before the shutdown, it runs before the sweep).
        try loop.execute {
            running.set()
            while loop.acceptsWork { usleep(100) }
        }
        #expect(await eventually { running.isSet })
        do {
            let captured = ThreadCanary(loop: loop, releasedOnLoop: releasedOnLoop)
            let handle = try state.subscribe(onState: { _ in withExtendedLifetime(captured) {} })
            #expect(handle.close())
        }
        #expect(state.core.recordHighWater == 1)
        let report = try loop.shutdown()
        #expect(report.unclosedSubscriptions == 0)
        #expect(releasedOnLoop.withLockedValue { $0 } == true)
        #expect(state.core.lock.withLock { state.core.liveCount } == 0)
    }

    @Test func withItsCountObservedAFlowFreesNoRecordInAnOffLoopClose() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let counts = Recorder<Int>()
            let counter = try state.subscriptionCount.subscribe(onState: { counts.append($0) })
            #expect(await eventually { counts.last == 0 })
            let hold = try LoopBlocker(loop)
            let old = try state.subscribe(onState: { _ in })
            #expect(old.close())
            let new = try state.subscribe(onState: { _ in })
            // Not reclaimed: a closed subscription counts until the loop releases it.
            #expect(new.slot != old.slot)
            hold.open()
            #expect(await eventually { counts.last == 1 })
            #expect(new.close())
            #expect(await eventually { counts.last == 0 })
            counter.close()
        }
    }
}
