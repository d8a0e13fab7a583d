import Foundation
import Synchronization
import SessionFlowTestSupport
import Testing

@testable import LoopFlow

/// A value whose `==` (run by `set` under the flow's lock) can be made to block once,
/// to hold a race window open deterministically.
final class EqualityGate: Sendable {
    static let shared = EqualityGate()
    let armed = Atomic<Bool>(false)
    let entered = Latch()
    let proceed = Latch()
}

struct GatedValue: Equatable, Sendable {
    let n: Int
    static func == (a: GatedValue, b: GatedValue) -> Bool {
        if a.n == 99 || b.n == 99, EqualityGate.shared.armed.exchange(false, ordering: .acquiringAndReleasing) {
            EqualityGate.shared.entered.signal()
            EqualityGate.shared.proceed.wait()
        }
        return a.n == b.n
    }
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
        EqualityGate.shared.armed.store(true, ordering: .releasing)
        let setterDone = Latch()
        Thread { flow.value = GatedValue(n: 99); setterDone.signal() }.start()  // holds the flow's lock in ==
        EqualityGate.shared.entered.wait()

        let subscriberDone = Latch()
        Thread {
            let subscription = try! flow.subscribe(onState: { _ in }, onRelease: { releases.increment() })
            target.withLockedValue { $0 = subscription }
            subscriberDone.signal()
        }.start()
        // The subscriber passed the loop's check and waits for the flow's lock.
        #expect(await eventually { flow.core.admissionsBegun.load(ordering: .sequentiallyConsistent) == 1 })

        let stoppingEntered = Latch()
        let stoppingGate = Latch()
        try loop.execute { stoppingEntered.signal(); stoppingGate.wait() }
        let shutdownDone = Latch()
        Thread { _ = try? loop.shutdown(); shutdownDone.signal() }.start()
        #expect(await eventually { !loop.acceptsWork })
        blocker.open()
        stoppingEntered.wait()

        other.value = 1  // delivered in teardown's last batch, where it closes the target
        EqualityGate.shared.proceed.signal()
        setterDone.wait()
        subscriberDone.wait()
        stoppingGate.signal()
        shutdownDone.wait()

        #expect(target.withLockedValue { $0 }?.isClosed == true)
        #expect(releases.current == 1)
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
