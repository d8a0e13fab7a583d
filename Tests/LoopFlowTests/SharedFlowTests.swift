import SessionFlowTestSupport
import Testing

@testable import LoopFlow

@Suite("SharedFlow")
struct SharedFlowTests {
    @Test func everyObserverReceivesEveryEventInOrder() async throws {
        try await withLoop { loop in
            let flow = try MutableSharedFlow<Int>(on: loop, bufferCapacity: 1_000)
            let first = Recorder<Int>()
            let second = Recorder<Int>()
            let a = try flow.subscribe(onEvent: { first.append($0) })
            let b = try flow.subscribe(onEvent: { second.append($0) })
            for event in 1...500 { flow.emit(event) }
            #expect(await eventually { first.count == 500 && second.count == 500 })
            #expect(first.all == Array(1...500))
            #expect(second.all == Array(1...500))
            #expect(flow.droppedEvents == 0)
            a.close()
            b.close()
        }
    }

    @Test func aSubscriberReceivesOnlyEventsEmittedAfterItSubscribed() async throws {
        try await withLoop { loop in
            let flow = try MutableSharedFlow<String>(on: loop)
            let early = Recorder<String>()
            let a = try flow.subscribe(onEvent: { early.append($0) })
            // Given the loop busy so "before" has not been delivered to anyone yet
            let blocker = try LoopBlocker(loop)
            flow.emit("before")
            let late = Recorder<String>()
            let b = try flow.subscribe(onEvent: { late.append($0) })
            flow.emit("after")
            blocker.open()
            #expect(await eventually { early.count == 2 && late.count == 1 })
            #expect(early.all == ["before", "after"])
            #expect(late.all == ["after"])
            a.close()
            b.close()
        }
    }

    @Test func replayHandsANewSubscriberTheLatestEventsFirst() async throws {
        try await withLoop { loop in
            let flow = try MutableSharedFlow<Int>(on: loop, replay: 3)
            for event in 1...10 { flow.emit(event) }
            #expect(flow.replayCache == [8, 9, 10])
            let seen = Recorder<Int>()
            let subscription = try flow.subscribe(onEvent: { seen.append($0) })
            flow.emit(11)
            #expect(await eventually { seen.count == 4 })
            #expect(seen.all == [8, 9, 10, 11])
            subscription.close()
        }
    }

    @Test func dropOldestKeepsTheNewestEventsAndCountsTheRest() async throws {
        try await withLoop { loop in
            let flow = try MutableSharedFlow<Int>(on: loop, bufferCapacity: 4, overflow: .dropOldest)
            let seen = Recorder<Int>()
            let subscription = try flow.subscribe(onEvent: { seen.append($0) })
            try await loop.submit {}  // registered
            let blocker = try LoopBlocker(loop)
            let accepted = (1...10).map { flow.emit($0) }
            blocker.open()
            #expect(await eventually { seen.count == 4 })
            try await loop.submit {}
            #expect(accepted.allSatisfy { $0 })
            #expect(seen.all == [7, 8, 9, 10])
            #expect(flow.droppedEvents == 6)
            subscription.close()
        }
    }

    @Test func dropLatestKeepsTheOldestEventsAndRefusesTheRest() async throws {
        try await withLoop { loop in
            let flow = try MutableSharedFlow<Int>(on: loop, bufferCapacity: 4, overflow: .dropLatest)
            let seen = Recorder<Int>()
            let subscription = try flow.subscribe(onEvent: { seen.append($0) })
            try await loop.submit {}
            let blocker = try LoopBlocker(loop)
            let accepted = (1...10).map { flow.emit($0) }
            blocker.open()
            #expect(await eventually { seen.count == 4 })
            try await loop.submit {}
            #expect(accepted == [true, true, true, true] + Array(repeating: false, count: 6))
            #expect(seen.all == [1, 2, 3, 4])
            #expect(flow.droppedEvents == 6)
            subscription.close()
        }
    }

    @Test func withoutObserversNothingIsBufferedOrCountedAsDropped() async throws {
        try await withLoop { loop in
            let flow = try MutableSharedFlow<Int>(on: loop, bufferCapacity: 2)
            for event in 1...100 { #expect(flow.emit(event)) }
            #expect(flow.droppedEvents == 0)
            #expect(flow.replayCache.isEmpty)
        }
    }

    @Test(arguments: [
        (-1, 8, "replay must not be negative"),
        (0, -1, "bufferCapacity must not be negative"),
        (0, 0, "needs a buffer to drop from"),
        (4, 0, "needs a buffer to drop from"),
    ])
    func anInvalidConfigurationIsRejectedWithAClearError(replay: Int, capacity: Int, message: String) async throws {
        try await withLoop { loop in
            let error = #expect(throws: LoopFlowError.self) {
                try MutableSharedFlow<Int>(on: loop, replay: replay, bufferCapacity: capacity, overflow: .dropLatest)
            }
            #expect(error?.code == .invalidConfiguration)
            #expect(error?.message.contains(message) == true)
        }
    }

    @Test func finishDeliversBufferedEventsThenCompletes() async throws {
        try await withLoop { loop in
            let flow = try MutableSharedFlow<Int>(on: loop, replay: 1)
            let log = Recorder<String>()
            _ = try flow.subscribe(
                onEvent: { log.append("event \($0)") },
                onComplete: { log.append("complete") },
                onRelease: { log.append("release") })
            try await loop.submit {}
            flow.emit(1)
            flow.emit(2)
            #expect(flow.finish())
            #expect(!flow.emit(3))
            #expect(await eventually { log.last == "release" })
            #expect(log.all == ["event 1", "event 2", "complete", "release"])
            let late = Recorder<String>()
            _ = try flow.subscribe(onEvent: { late.append("event \($0)") }, onComplete: { late.append("complete") })
            #expect(await eventually { late.count == 2 })
            #expect(late.all == ["event 2", "complete"])
        }
    }
}
