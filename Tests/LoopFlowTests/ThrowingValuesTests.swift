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

    @Test func aLoopShutDownBeforeIterationThrowsLoopShutDown() async throws {
        let loop = try EventLoop(name: "gone")
        let flow = try MutableSharedFlow<Int>(on: loop)
        try loop.shutdown()
        var iterator = flow.throwingValues.makeAsyncIterator()
        let error = await #expect(throws: LoopFlowError.self) { _ = try await iterator.next() }
        #expect(error?.code == .loopShutDown)
    }
}
