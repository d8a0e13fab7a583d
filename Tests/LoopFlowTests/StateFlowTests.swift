import Foundation
import SessionFlowTestSupport
import Testing

@testable import LoopFlow

@Suite("StateFlow")
struct StateFlowTests {
    @Test func valueIsReadableAndWritableFromAnyThread() async throws {
        try await withLoop { loop in
            let flow = MutableStateFlow(0, on: loop)
            onThreads(4) { thread in flow.value = thread + 10 }
            #expect((10...13).contains(flow.value))
            let seenOnLoop = try await loop.submit { flow.value }
            #expect(seenOnLoop == flow.value)
        }
    }

    @Test func newSubscriberReceivesTheCurrentValueFirst() async throws {
        try await withLoop { loop in
            let flow = MutableStateFlow("a", on: loop)
            flow.value = "b"
            let seen = Recorder<String>()
            let subscription = try flow.subscribe(onState: { seen.append($0) })
            #expect(await eventually { seen.count == 1 })
            flow.value = "c"
            #expect(await eventually { seen.count == 2 })
            #expect(seen.all == ["b", "c"])
            subscription.close()
        }
    }

    @Test func settingAnEqualValueNotifiesNoOne() async throws {
        try await withLoop { loop in
            let flow = MutableStateFlow(1, on: loop)
            let seen = Recorder<Int>()
            let subscription = try flow.subscribe(onState: { seen.append($0) })
            #expect(await eventually { seen.count == 1 })
            flow.value = 1
            #expect(flow.compareAndSet(expect: 1, update: 1))
            flow.value = 2
            #expect(await eventually { seen.count == 2 })
            try await loop.submit {}  // anything pending has run
            #expect(seen.all == [1, 2])
            subscription.close()
        }
    }

    @Test func aValueThatComesBackBeforeTheObserverRunsDeliversNothing() async throws {
        try await withLoop { loop in
            let flow = MutableStateFlow("A", on: loop)
            let seen = Recorder<String>()
            let subscription = try flow.subscribe(onState: { seen.append($0) })
            #expect(await eventually { seen.count == 1 })
            // Given the loop busy while the value goes A → B → A
            let blocker = try LoopBlocker(loop)
            flow.value = "B"
            flow.value = "A"
            blocker.open()
            try await loop.submit {}
            // Then the observer, which last got A, gets nothing; a real change still arrives
            flow.value = "C"
            #expect(await eventually { seen.count == 2 })
            #expect(seen.all == ["A", "C"])
            subscription.close()
        }
    }

    @Test func aSlowObserverIsConflatedButEndsOnTheLatestValue() async throws {
        try await withLoop { loop in
            let flow = MutableStateFlow(0, on: loop)
            let seen = Recorder<Int>()
            let subscription = try flow.subscribe(onState: { value in
                seen.append(value)
                Thread.sleep(forTimeInterval: 0.002)  // slower than the producer
            })
            // When a foreign thread sets 1...2000 without waiting
            for value in 1...2_000 { flow.value = value }
            #expect(await eventually { seen.last == 2_000 })
            // Then the observer skipped values, never went backwards, and ended on the latest
            let values = seen.all
            #expect(values.count < 2_000)
            #expect(zip(values, values.dropFirst()).allSatisfy { $0 < $1 })
            #expect(values.last == 2_000)
            subscription.close()
        }
    }

    @Test func updateIsAtomicUnderContention() async throws {
        try await withLoop { loop in
            let flow = MutableStateFlow(0, on: loop)
            onThreads(8) { _ in
                for _ in 0..<2_000 { flow.update { $0 + 1 } }
            }
            #expect(flow.value == 16_000)
        }
    }

    @Test func compareAndSetIsAtomicUnderContention() async throws {
        try await withLoop { loop in
            let flow = MutableStateFlow(0, on: loop)
            let wins = Counter()
            onThreads(8) { _ in
                var done = 0
                while done < 1_000 {
                    let seen = flow.value
                    if flow.compareAndSet(expect: seen, update: seen + 1) {
                        done += 1
                        wins.increment()
                    }
                }
            }
            #expect(flow.value == 8_000)
            #expect(wins.current == 8_000)
            // A mismatched expectation changes nothing
            #expect(!flow.compareAndSet(expect: 1, update: 99))
            #expect(flow.value == 8_000)
        }
    }

    @Test func subscriptionCountIsItselfObservable() async throws {
        try await withLoop { loop in
            let flow = MutableStateFlow(0, on: loop)
            let counts = Recorder<Int>()
            let watcher = try flow.subscriptionCount.subscribe(onState: { counts.append($0) })
            #expect(await eventually { counts.last == 0 })
            let first = try flow.subscribe(onState: { _ in })
            #expect(await eventually { counts.last == 1 })
            let second = try flow.subscribe(onState: { _ in })
            #expect(await eventually { counts.last == 2 })
            first.close()
            #expect(await eventually { counts.last == 1 })
            second.close()
            #expect(await eventually { counts.last == 0 })
            #expect(counts.all == [0, 1, 2, 1, 0])
            #expect(flow.subscriptionCount.value == 0)
            watcher.close()
        }
    }

    @Test func setFromInsideACallbackNeitherDeadlocksNorRecurses() async throws {
        try await withLoop { loop in
            let flow = MutableStateFlow(0, on: loop)
            let depth = Counter()
            let deepest = LockedBox(0)
            let seen = Recorder<Int>()
            let subscription = try flow.subscribe(onState: { value in
                let current = depth.increment()
                deepest.withLockedValue { $0 = max($0, current) }
                seen.append(value)
                if value < 100 { flow.value = value + 1 }  // re-enters the flow from its own callback
                depth.decrement()
            })
            #expect(await eventually { seen.last == 100 })
            #expect(seen.all == Array(0...100))
            #expect(deepest.withLockedValue { $0 } == 1)
            subscription.close()
        }
    }

    @Test func finishDeliversTheLatestValueThenCompletesEveryoneOnce() async throws {
        try await withLoop { loop in
            let flow = MutableStateFlow(1, on: loop)
            let events = Recorder<String>()
            let subscription = try flow.subscribe(
                onState: { events.append("state \($0)") },
                onError: { _ in events.append("error") },
                onComplete: { events.append("complete") },
                onRelease: { events.append("release") })
            flow.value = 2
            #expect(flow.finish())
            #expect(!flow.finish())
            flow.value = 3  // ignored once finished
            #expect(await eventually { events.last == "release" })
            #expect(events.all.suffix(3) == ["state 2", "complete", "release"])
            #expect(flow.value == 2)
            #expect(!subscription.close())
            // A later subscriber gets the last value, then the same terminal
            let late = Recorder<String>()
            _ = try flow.subscribe(onState: { late.append("state \($0)") }, onComplete: { late.append("complete") })
            #expect(await eventually { late.count == 2 })
            #expect(late.all == ["state 2", "complete"])
        }
    }

    @Test func finishWithAnErrorCallsOnErrorOnly() async throws {
        try await withLoop { loop in
            let flow = MutableStateFlow(1, on: loop)
            let errors = Recorder<TestError>()
            let completions = Counter()
            _ = try flow.subscribe(
                onState: { _ in },
                onError: { errors.append($0 as! TestError) },
                onComplete: { completions.increment() })
            flow.finish(throwing: TestError(tag: "boom"))
            #expect(await eventually { errors.count == 1 })
            try await loop.submit {}
            #expect(errors.all == [TestError(tag: "boom")])
            #expect(completions.current == 0)
        }
    }
}
