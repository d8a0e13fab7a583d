import Foundation
import Synchronization
import SessionFlowTestSupport
import Testing

@testable import LoopFlow

/// A value whose `==` (run by `set` under the flow's lock) can be made to block once,
/// to hold a race window open deterministically. A gate's latches open once: each test arms
/// a fresh one (the suite is serialized).
final class EqualityGate: Sendable {
    private static let current = LockedBox<EqualityGate?>(nil)
    private let armed = Atomic<Bool>(true)
    let entered = Latch()
    let proceed = Latch()

    /// A fresh gate: the next `==` involving 99 signals `entered` and waits for `proceed`.
    static func arm() -> EqualityGate {
        let gate = EqualityGate()
        current.withLockedValue { $0 = gate }
        return gate
    }

    /// The armed gate, disarmed (nil if none is armed).
    static func take() -> EqualityGate? {
        guard let gate = current.withLockedValue({ $0 }),
            gate.armed.exchange(false, ordering: .acquiringAndReleasing)
        else { return nil }
        return gate
    }
}

struct GatedValue: Equatable, Sendable {
    let n: Int
    static func == (a: GatedValue, b: GatedValue) -> Bool {
        if a.n == 99 || b.n == 99, let gate = EqualityGate.take() {
            gate.entered.signal()
            gate.proceed.wait()
        }
        return a.n == b.n
    }
}

/// A shutdown requested while `blocker` holds the loop, on a thread of its own: once the
/// loop runs the batch that saw the request, a job of it waits for `gate` (teardown begins
/// after it); `done` is signalled, and `report` set, when `shutdown()` returns.
struct HeldShutdown {
    let gate: Latch
    let done: Latch
    let report: LockedBox<EventLoop.ShutdownReport?>
}

/// Requests the shutdown and opens `blocker`; returns once the held job waits for its gate.
func requestShutdownHeld(_ loop: EventLoop, opening blocker: LoopBlocker) async throws -> HeldShutdown {
    let entered = Latch()
    let held = HeldShutdown(gate: Latch(), done: Latch(), report: LockedBox(nil))
    try loop.execute { entered.signal(); held.gate.wait() }
    Thread {
        let result = try? loop.shutdown()
        held.report.withLockedValue { $0 = result }
        held.done.signal()
    }.start()
    #expect(await eventually { !loop.acceptsWork })
    blocker.open()
    entered.wait()
    return held
}

/// Races between teardown and subscribers (found in review; each failed before its fix).
@Suite("Teardown races", .serialized)
struct TeardownRaceTests {
    /// Rule 4: a subscription admitted across the stop request and closed after teardown
    /// began is still released exactly once.
    @Test func releaseRunsForASubscriptionClosedDuringTeardown() async throws {
        let loop = try EventLoop(name: "race")
        let flow = MutableStateFlow(GatedValue(n: 0), on: loop)
        let other = MutableStateFlow(0, on: loop)
        let target = LockedBox<FlowSubscription?>(nil)
        let releases = Counter()
        let seen = Counter()
        // Its callback (in teardown's batch) closes the target on the loop thread.
        _ = try other.subscribe(onState: { value in
            seen.increment()
            if value == 1 { target.withLockedValue { $0 }?.close() }
        })
        #expect(await eventually { seen.current == 1 })

        let blocker = try LoopBlocker(loop)
        let gate = EqualityGate.arm()
        let setterDone = Latch()
        Thread { flow.value = GatedValue(n: 99); setterDone.signal() }.start()  // holds the flow's lock in ==
        gate.entered.wait()

        let subscriberDone = Latch()
        Thread {
            let subscription = try! flow.subscribe(onState: { _ in }, onRelease: { releases.increment() })
            target.withLockedValue { $0 = subscription }
            subscriberDone.signal()
        }.start()
        // The subscriber passed the loop's check and waits for the flow's lock.
        #expect(await eventually { flow.core.admissionsBegun.load(ordering: .sequentiallyConsistent) == 1 })

        let stopping = try await requestShutdownHeld(loop, opening: blocker)

        other.value = 1  // delivered in teardown's last batch, where it closes the target
        gate.proceed.signal()
        setterDone.wait()
        subscriberDone.wait()
        stopping.gate.signal()
        stopping.done.wait()

        #expect(target.withLockedValue { $0 }?.isClosed == true)
        #expect(releases.current == 1)
    }

    /// An off-loop subscriber admitted across the stop request, whose delivery the loop
    /// refused (teardown had begun), closes before the sweep: its record is freed as a spare
    /// (`reclaimElsewhere`), and the sweep's delivery returns it to the pool and lets go of its
    /// closure, on the loop thread. Nothing stays in use; nothing is reported unclosed.
    @Test func aSpareAnOffLoopCloseLeftBeforeTheSweepIsReturnedByIt() async throws {
        let loop = try EventLoop(name: "race")
        let flow = MutableStateFlow(GatedValue(n: 0), on: loop)
        // Its callback holds teardown's last batch (teardown has begun, the sweep not yet).
        let other = MutableStateFlow(0, on: loop)
        let seen = Counter()
        let inLastBatch = Latch()
        let lastBatchGate = Latch()
        let otherSubscription = try other.subscribe(onState: { value in
            _ = seen.increment()
            if value == 1 {
                inLastBatch.signal()
                lastBatchGate.wait()
            }
        })
        // A subscriber that keeps the flow's core held by the loop (once teardown has begun a
        // core can no longer be held: a flow's first subscriber is refused).
        let kept = Counter()
        let keeper = try flow.subscribe(onState: { _ in _ = kept.increment() })
        #expect(await eventually { seen.current == 1 && kept.current == 1 })

        let blocker = try LoopBlocker(loop)
        let gate = EqualityGate.arm()
        let setterDone = Latch()
        Thread { flow.value = GatedValue(n: 99); setterDone.signal() }.start()  // holds the flow's lock in ==
        gate.entered.wait()

        let releasedOnLoop = LockedBox<Bool?>(nil)
        let calls = Counter()
        let subscribed = Latch()
        let closeNow = Latch()
        let subscriberDone = Latch()
        let closed = LockedBox(false)
        Thread {
            let subscription: FlowSubscription
            do {  // the closure holds the only reference to the canary
                let canary = OffLoopAdmissionTests.ThreadCanary(loop: loop, releasedOnLoop: releasedOnLoop)
                subscription = try! flow.subscribe(onState: { _ in withExtendedLifetime(canary) { _ = calls.increment() } })
            }
            subscribed.signal()
            closeNow.wait()
            closed.withLockedValue { $0 = subscription.close() }
            subscriberDone.signal()
        }.start()
        // The subscriber passed the loop's check (after the keeper) and waits for the flow's lock.
        #expect(await eventually { flow.core.admissionsBegun.load(ordering: .sequentiallyConsistent) == 2 })

        let stopping = try await requestShutdownHeld(loop, opening: blocker)
        other.value = 1  // delivered in teardown's last batch, where its callback waits
        stopping.gate.signal()
        inLastBatch.wait()

        // Teardown has begun: the setter's delivery and the subscriber's are refused, and the
        // close frees the record (the arrival is the latest, no delivery took it).
        gate.proceed.signal()
        setterDone.wait()
        subscribed.wait()
        closeNow.signal()
        subscriberDone.wait()
        #expect(closed.withLockedValue { $0 })
        #expect(flow.core.foreignSpareCount == 1)
        #expect(releasedOnLoop.withLockedValue { $0 } == nil)  // the sweep's delivery lets go of it

        lastBatchGate.signal()
        stopping.done.wait()
        #expect(flow.core.foreignSpareCount == 0)
        #expect(flow.core.lock.withLock { flow.core.liveCount } == 0)
        #expect(releasedOnLoop.withLockedValue { $0 } == true)
        #expect(calls.current == 0)
        #expect(kept.current == 2)  // the sweep's delivery: 99
        // The keeper and the other flow's subscriber were never closed; the closed one is not
        // counted.
        #expect(stopping.report.withLockedValue { $0 }?.unclosedSubscriptions == 2)
        withExtendedLifetime((otherSubscription, keeper)) {}
    }

    /// Rule 4 without widening: subscribe + close on foreign threads racing shutdown().
    @Test func everySuccessfulSubscribeIsReleasedWhenRacingShutdown() async throws {
        var lost = 0
        for _ in 0..<150 {
            let loop = try EventLoop(name: "race")
            let flow = MutableStateFlow(0, on: loop)
            let subscribed = Counter()
            let released = Counter()
            Thread {
                while subscribed.current < 20 {}
                _ = try? loop.shutdown()
            }.start()
            onThreads(4) { _ in
                while true {
                    guard let subscription = try? flow.subscribe(
                        onState: { _ in }, onRelease: { released.increment() })
                    else { return }
                    subscribed.increment()
                    flow.value = Int.random(in: 0..<1000)
                    subscription.close()
                }
            }
            while loop.loopCloseResult == nil { usleep(100) }
            lost += subscribed.current - released.current
        }
        #expect(lost == 0, "onRelease never ran for \(lost) successful subscribes")
    }

    /// Rule 2: a subscriber admitted just before shutdown gets the current value before
    /// onComplete, never onComplete alone.
    @Test func aSubscriberRacingShutdownGetsTheValueBeforeOnComplete() async throws {
        let bare = Counter()
        for _ in 0..<150 {
            let loop = try EventLoop(name: "race")
            let flow = MutableStateFlow(0, on: loop)
            let started = Counter()
            Thread {
                while started.current < 20 {}
                _ = try? loop.shutdown()
            }.start()
            onThreads(4) { _ in
                while true {
                    let gotValue = Flag()
                    guard (try? flow.subscribe(
                        onState: { _ in gotValue.set() },
                        onComplete: { if !gotValue.isSet { bare.increment() } })) != nil
                    else { return }
                    started.increment()
                }
            }
            while loop.loopCloseResult == nil { usleep(100) }
        }
        #expect(bare.current == 0, "\(bare.current) subscribers got onComplete without a value")
    }

    @Test func updateOnAFinishedFlowReturnsTheFinalValue() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(5, on: loop)
            state.finish()
            let result = LockedBox<Int?>(nil)
            Thread { result.withLockedValue { $0 = state.update { $0 + 1 } } }.start()
            #expect(await eventually(timeout: .seconds(20)) { result.withLockedValue { $0 } != nil })
            #expect(result.withLockedValue { $0 } == 5)
            #expect(!state.compareAndSet(expect: 5, update: 6))
        }
    }
}
