import Foundation
import SessionFlowTestSupport
import Testing

@testable import LoopFlow

/// The contract under real threads: setters, subscribers and closers all at once.
@Suite("Concurrency stress")
struct ConcurrencyStressTests {
    /// What one short-lived observer saw.
    final class Observer: @unchecked Sendable {
        let lock = Lock()
        var values: [Int] = []
        var releases = 0
        var callbacksAfterClose = 0
        var releasedBeforeLastCallback = false
        let closeReturned = Flag()
    }

    @Test func eightSettersWhileObserversSubscribeAndCloseAtRandom() async throws {
        try await withLoop { loop in
            let flow = MutableStateFlow(0, on: loop)
            let settersPerThread = 5_000
            let setters = 8
            let final = settersPerThread * setters

            // A long-lived observer
            let longLived = Recorder<Int>()
            let keeper = try flow.subscribe(onState: { longLived.append($0) })

            // Churners subscribe and close at random while the setters run
            let observers = LockedBox<[Observer]>([])
            let settersDone = Flag()
            let churn: @Sendable (Int) -> Void = { _ in
                var rng = SystemRandomNumberGenerator()
                // Until the setters are through, and at least 40 observers have come and gone
                // (fast setters must not leave the churn nearly empty).
                while !settersDone.isSet || observers.withLockedValue({ $0.count }) < 40 {
                    let observer = Observer()
                    observers.withLockedValue { $0.append(observer) }
                    let subscription = try! flow.subscribe(
                        onState: { value in
                            observer.lock.withLock {
                                if observer.closeReturned.isSet { observer.callbacksAfterClose += 1 }
                                if observer.releases > 0 { observer.releasedBeforeLastCallback = true }
                                observer.values.append(value)
                            }
                        },
                        onRelease: { observer.lock.withLock { observer.releases += 1 } })
                    if Bool.random(using: &rng) { Thread.sleep(forTimeInterval: Double.random(in: 0...0.0005)) }
                    subscription.close()
                    observer.closeReturned.set()
                }
            }
            onThreads(setters + 4) { thread in
                if thread < setters {
                    // The churn is under way before the first set.
                    while observers.withLockedValue({ $0.count }) < 8 { Thread.sleep(forTimeInterval: 0.0002) }
                    for _ in 0..<settersPerThread { flow.update { $0 + 1 } }
                } else {
                    churn(thread)
                }
                if thread == 0 {
                    // the churners stop once every setter is through
                    while flow.value < final { Thread.sleep(forTimeInterval: 0.001) }
                    settersDone.set()
                }
            }

            #expect(flow.value == final)
            #expect(await eventually { longLived.last == final })
            let all = observers.withLockedValue { $0 }
            #expect(await eventually { all.allSatisfy { observer in observer.lock.withLock { observer.releases } == 1 } })
            try await loop.submit {}

            // Per observer: values never go backwards and never repeat
            let kept = longLived.all
            #expect(zip(kept, kept.dropFirst()).allSatisfy { $0 < $1 })
            #expect(all.count >= 40)
            for observer in all {
                observer.lock.withLock {
                    #expect(zip(observer.values, observer.values.dropFirst()).allSatisfy { $0 < $1 })
                    #expect(observer.callbacksAfterClose == 0)
                    #expect(observer.releases == 1)
                    #expect(!observer.releasedBeforeLastCallback)
                }
            }
            keeper.close()
            #expect(await eventually { flow.subscriptionCount.value == 0 })
        }
    }

    @Test func eventsFromManyThreadsKeepEachProducersOrderForEveryObserver() async throws {
        try await withLoop { loop in
            let producers = 8
            let perProducer = 2_000
            let flow = try MutableSharedFlow<(Int, Int)>(on: loop, bufferCapacity: producers * perProducer)
            let seen = Recorder<(Int, Int)>()
            let subscription = try flow.subscribe(onEvent: { seen.append($0) })
            try await loop.submit {}
            onThreads(producers) { producer in
                for sequence in 0..<perProducer { flow.emit((producer, sequence)) }
            }
            #expect(await eventually { seen.count == producers * perProducer })
            var next = [Int](repeating: 0, count: producers)
            for (producer, sequence) in seen.all {
                #expect(sequence == next[producer])
                next[producer] = sequence + 1
            }
            #expect(flow.droppedEvents == 0)
            subscription.close()
        }
    }
}
