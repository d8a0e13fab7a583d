import SessionFlowTestSupport
import Testing

@testable import LoopFlow

@Suite("Async views")
struct AsyncViewTests {
    @Test func stateValuesYieldTheCurrentValueThenEachChange() async throws {
        try await withLoop { loop in
            let flow = MutableStateFlow(0, on: loop)
            var iterator = flow.values.makeAsyncIterator()
            #expect(await iterator.next() == 0)
            flow.value = 1
            #expect(await iterator.next() == 1)
            flow.value = 2
            #expect(await iterator.next() == 2)
        }
    }

    @Test func aSlowConsumerGetsTheLatestValueAndNeverTheSameOneTwice() async throws {
        try await withLoop { loop in
            let flow = MutableStateFlow("A", on: loop)
            var iterator = flow.values.makeAsyncIterator()
            #expect(await iterator.next() == "A")
            // While the consumer is not asking, the value goes A → B → A
            flow.value = "B"
            try await loop.submit {}
            flow.value = "A"
            try await loop.submit {}
            flow.value = "C"
            #expect(await iterator.next() == "C")
            for value in ["D", "E", "F"] {
                flow.value = value
                try await loop.submit {}
            }
            #expect(await iterator.next() == "F")
        }
    }

    @Test func cancellingTheTaskClosesTheSubscription() async throws {
        try await withLoop { loop in
            let flow = MutableStateFlow(0, on: loop)
            let received = Counter()
            let task = Task {
                for await _ in flow.values { received.increment() }
            }
            #expect(await eventually { flow.subscriptionCount.value == 1 && received.current == 1 })
            task.cancel()
            await task.value
            #expect(await eventually { flow.subscriptionCount.value == 0 })
        }
    }

    @Test func leavingTheLoopClosesTheSubscription() async throws {
        try await withLoop { loop in
            let flow = MutableStateFlow(0, on: loop)
            let released = Counter()
            _ = released
            let producer = Task {
                for value in 1...3 {
                    try await Task.sleep(for: .milliseconds(5))
                    flow.value = value
                }
            }
            var last = -1
            for await value in flow.values {
                last = value
                if value == 3 { break }
            }
            try await producer.value
            #expect(last == 3)
            #expect(await eventually { flow.subscriptionCount.value == 0 })
        }
    }

    @Test func droppingAnUnusedIteratorClosesItsSubscription() async throws {
        try await withLoop { loop in
            let flow = MutableStateFlow(0, on: loop)
            do {
                let iterator = flow.values.makeAsyncIterator()
                #expect(flow.subscriptionCount.value == 1)
                _ = iterator
            }
            #expect(await eventually { flow.subscriptionCount.value == 0 })
        }
    }

    @Test func eventValuesKeepTheFlowsBufferPolicyPerConsumer() async throws {
        try await withLoop { loop in
            let flow = try MutableSharedFlow<Int>(on: loop, bufferCapacity: 4, overflow: .dropOldest)
            var iterator = flow.values.makeAsyncIterator()
            try await loop.submit {}
            for event in 1...10 {
                flow.emit(event)
                try await loop.submit {}  // delivered into the consumer's buffer
            }
            var got: [Int] = []
            for _ in 0..<4 { got.append(await iterator.next()!) }
            #expect(got == [7, 8, 9, 10])
            #expect(flow.droppedEvents == 0)  // the flow kept up; the consumer did not
            #expect(iterator.buffer.droppedElements == 6)
        }
    }

    @Test func theSequenceEndsWhenTheFlowFinishes() async throws {
        try await withLoop { loop in
            let flow = try MutableSharedFlow<Int>(on: loop, replay: 2)
            flow.emit(1)
            flow.emit(2)
            flow.finish()
            var all: [Int] = []
            for await event in flow.values { all.append(event) }
            #expect(all == [1, 2])
        }
    }

    @Test func valuesOfAShutDownLoopAreEmpty() async throws {
        let loop = try EventLoop()
        let flow = MutableStateFlow(0, on: loop)
        try loop.shutdown()
        var iterator = flow.values.makeAsyncIterator()
        #expect(await iterator.next() == nil)
    }
}
