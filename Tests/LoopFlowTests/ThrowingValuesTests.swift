import Foundation
import SessionFlowTestSupport
import Testing

@testable import LoopFlow

/// Issue 17, point 7: `values` ends a terminal error exactly like completion; `throwingValues`
/// throws it.
@Suite("Async views that throw")
struct ThrowingValuesTests {
    struct Broken: Error, Equatable { let why: String }

    @Test func aSharedFlowsFailureIsThrownAfterTheEventsBeforeIt() async throws {
        try await withLoop { loop in
            let flow = try MutableSharedFlow<Int>(on: loop)
            var iterator = flow.throwingValues.makeAsyncIterator()
            try await loop.submit {}  // subscribed
            flow.emit(1)
            flow.emit(2)
            flow.finish(throwing: Broken(why: "server gone"))
            #expect(try await iterator.next() == 1)
            #expect(try await iterator.next() == 2)
            await #expect(throws: Broken(why: "server gone")) { _ = try await iterator.next() }
            // Thrown once; the sequence has ended.
            #expect(try await iterator.next() == nil)
        }
    }

    @Test func aStateFlowsFailureIsThrownAndCompletionIsNot() async throws {
        try await withLoop { loop in
            try await loop.submit {}
            let failing = MutableStateFlow(0, on: loop)
            var failingIterator = failing.throwingValues.makeAsyncIterator()
            #expect(try await failingIterator.next() == 0)
            failing.finish(throwing: Broken(why: "expired"))
            await #expect(throws: Broken(why: "expired")) { _ = try await failingIterator.next() }

            let completing = MutableStateFlow(0, on: loop)
            var completingIterator = completing.throwingValues.makeAsyncIterator()
            #expect(try await completingIterator.next() == 0)
            completing.finish()
            #expect(try await completingIterator.next() == nil)
        }
    }

    @Test func theNonThrowingViewStillEndsOnAFailure() async throws {
        try await withLoop { loop in
            let flow = try MutableSharedFlow<Int>(on: loop)
            var iterator = flow.values.makeAsyncIterator()
            try await loop.submit {}
            flow.emit(7)
            flow.finish(throwing: Broken(why: "x"))
            #expect(await iterator.next() == 7)
            #expect(await iterator.next() == nil)
        }
    }

    @Test func cancellingTheConsumerEndsWithoutAnError() async throws {
        try await withLoop { loop in
            let flow = try MutableSharedFlow<Int>(on: loop)
            let consumer = Task {
                var seen: [Int] = []
                for try await event in flow.throwingValues { seen.append(event) }
                return seen
            }
            #expect(await eventually { flow.subscriptionCount.value == 1 })
            flow.emit(1)
            #expect(await eventually { flow.droppedEvents == 0 })
            consumer.cancel()
            let seen = try await consumer.value
            #expect(seen.count <= 1)
            #expect(await eventually { flow.subscriptionCount.value == 0 })
        }
    }

    /// Whether `task` ends within `limit`, without awaiting it past that (a deadlocked task is
    /// left behind: awaiting it would hang the suite).
    static func ends<T: Sendable, F: Error>(_ task: Task<T, F>, within limit: Duration) async -> Bool {
        let answer = LockedBox<CheckedContinuation<Bool, Never>?>(nil)
        return await withCheckedContinuation { continuation in
            answer.withLockedValue { $0 = continuation }
            Task { _ = try? await task.value; answer.withLockedValue { $0.take() }?.resume(returning: true) }
            Task {
                try? await Task.sleep(for: limit)
                answer.withLockedValue { $0.take() }?.resume(returning: false)
            }
        }
    }

    /// Found under CI-like load: cancelling the consuming task while the loop thread hands it
    /// an element deadlocked both threads — the cancellation handler closed the subscription
    /// and waited for the loop's walk, under the task's status lock; the loop, inside that
    /// walk, resumed the task's continuation and needed that lock. Elements stream without a
    /// pause and each round cancels a consumer that is receiving them, so the two meet.
    ///
    /// Under ThreadSanitizer it once starved beside the whole suite (other suites then blocked
    /// the cooperative pool's threads on child processes); the TSan stage now runs LoopFlow's
    /// tests apart and those waits are off the pool, so it runs there too.
    @Test func cancellingAConsumerTheLoopIsHandingAnElementNeverDeadlocks() async throws {
        let loop = try EventLoop(name: "cancel-race")
        let flow = try MutableSharedFlow<Int>(on: loop, replay: 0, bufferCapacity: 64, overflow: .dropOldest)
        let streaming = Flag()
        streaming.set()
        let producer = Thread {
            var next = 0
            // An element every 200 µs: the loop is often handing one over, and never flooded
            // (a tighter stream starved the suites running beside it under ThreadSanitizer).
            while streaming.isSet {
                flow.emit(next)
                next &+= 1
                usleep(200)
            }
        }
        producer.start()
        var deadlocked = false
        for round in 0..<200 where !deadlocked {
            let received = Counter()
            let consumer = Task {
                var seen = 0
                for await _ in flow.values {
                    seen += 1
                    received.increment()
                }
                return seen
            }
            // A hang guard only: elements stream continuously.
            #expect(await eventually(timeout: .seconds(20)) { received.current >= 1 }, "round \(round): no element")
            // Cancelled from a thread of its own: a deadlocked canceller (the bug) then blocks
            // that thread, not one of the test's, and the guard below still runs.
            Thread { consumer.cancel() }.start()
            if await !Self.ends(consumer, within: .seconds(20)) {
                Issue.record("round \(round): the cancelled consumer never ended (deadlock with the loop thread)")
                deadlocked = true
            }
        }
        streaming.set(false)
        // A deadlocked loop cannot be shut down: it is left behind, as the consumer is.
        if !deadlocked {
            #expect(await eventually { flow.subscriptionCount.value == 0 })
            _ = try? loop.shutdown()
        }
    }

    @Test func aLoopShutDownBeforeIterationThrowsLoopShutDown() async throws {
        let loop = try EventLoop(name: "gone")
        let flow = try MutableSharedFlow<Int>(on: loop)
        try loop.shutdown()
        var iterator = flow.throwingValues.makeAsyncIterator()
        let error = await #expect(throws: LoopFlowError.self) { _ = try await iterator.next() }
        #expect(error?.code == .loopShutDown)
    }
}
