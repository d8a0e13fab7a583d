import SessionFlowTestSupport
import Testing

@testable import LoopFlow

/// Issue 17, point 7: the replay a newcomer has not received yet counts against the buffer,
/// as in kotlinx.coroutines (`SharedFlowImpl`: the replay cache is the head of the one buffer,
/// and a subscriber that has not collected a replayed value holds that slot). Before, a
/// newcomer of `replay: 1, bufferCapacity: 1, .dropOldest` received the replayed and the new
/// event — two waiting in a buffer of one.
@Suite("SharedFlow: a newcomer's replay and the buffer")
struct SharedFlowOverflowTests {
    /// Subscribes to `flow` (holding `replayed` for replay), and emits `emits` before the
    /// newcomer's first delivery; returns what the newcomer received, the emits' results and
    /// the drop count.
    private func newcomer(
        replay: Int, capacity: Int, overflow: BufferOverflow, replayed: [String], emits: [String]
    ) async throws -> (received: [String], accepted: [Bool], dropped: Int) {
        var outcome: (received: [String], accepted: [Bool], dropped: Int) = ([], [], 0)
        try await withLoop { loop in
            let flow = try MutableSharedFlow<String>(on: loop, replay: replay, bufferCapacity: capacity, overflow: overflow)
            for event in replayed { flow.emit(event) }  // nobody listens: kept for replay only
            let received = Recorder<String>()
            // Admission and the emits in one loop job: no delivery between them.
            let (subscription, accepted) = try await loop.submit {
                let subscription = try flow.subscribe(onEvent: { received.append($0) })
                return (subscription, emits.map { flow.emit($0) })
            }
            try await loop.submit {}
            try await loop.submit {}
            outcome = (received.all, accepted, flow.droppedEvents)
            subscription.close()
        }
        return outcome
    }

    @Test func dropOldestDropsTheReplayedValueTheNewcomerHasNotReceived() async throws {
        let run = try await newcomer(replay: 1, capacity: 1, overflow: .dropOldest, replayed: ["a"], emits: ["b"])
        #expect(run.received == ["b"])
        #expect(run.accepted == [true])
        #expect(run.dropped == 1)
    }

    @Test func dropOldestKeepsAsMuchOfTheReplayAsTheBufferHolds() async throws {
        let run = try await newcomer(
            replay: 3, capacity: 4, overflow: .dropOldest, replayed: ["a", "b", "c"], emits: ["d", "e", "f"])
        // Six waiting for a buffer of four: the two oldest go.
        #expect(run.received == ["c", "d", "e", "f"])
        #expect(run.dropped == 2)
    }

    @Test func dropLatestRefusesTheNewEventWhileTheNewcomerHoldsTheBuffer() async throws {
        let run = try await newcomer(replay: 1, capacity: 1, overflow: .dropLatest, replayed: ["a"], emits: ["b"])
        #expect(run.received == ["a"])
        #expect(run.accepted == [false])
        #expect(run.dropped == 1)
    }

    @Test func aBufferLargeEnoughDeliversTheReplayThenTheNewEvents() async throws {
        for overflow in [BufferOverflow.dropOldest, .dropLatest] {
            let run = try await newcomer(replay: 1, capacity: 2, overflow: overflow, replayed: ["a"], emits: ["b"])
            #expect(run.received == ["a", "b"])
            #expect(run.accepted == [true])
            #expect(run.dropped == 0)
        }
    }

    @Test func onceTheReplayIsDeliveredTheBufferIsTheLiveEventsAlone() async throws {
        try await withLoop { loop in
            let flow = try MutableSharedFlow<String>(on: loop, replay: 1, bufferCapacity: 1, overflow: .dropOldest)
            flow.emit("a")
            let received = Recorder<String>()
            let subscription = try flow.subscribe(onEvent: { received.append($0) })
            #expect(await eventually { received.all == ["a"] })
            flow.emit("b")
            #expect(await eventually { received.all == ["a", "b"] })
            #expect(flow.droppedEvents == 0)
            subscription.close()
        }
    }
}
