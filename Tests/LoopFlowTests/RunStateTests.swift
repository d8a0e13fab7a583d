import Testing

@testable import LoopFlow

/// `RunState` is a pure value: every state × every transition, without a loop.
@Suite("RunState")
struct RunStateTests {
    typealias Phase = RunState.Phase

    /// Every state there is: each phase, with and without a wake-up pending.
    static let allStates: [RunState] = [Phase.running, .stopRequested, .stopped].flatMap { phase in
        [false, true].map { RunState(phase: phase, wakePending: $0) }
    }

    @Test func aNewLoopRunsAcceptsWorkAndHasNoWakeUpPending() {
        let state = RunState()
        #expect(state.phase == .running)
        #expect(!state.wakePending)
        #expect(state.acceptsWork)
    }

    @Test(arguments: allStates)
    func onlyARunningLoopAcceptsPublicWork(state: RunState) {
        #expect(state.acceptsWork == (state.phase == .running))
    }

    @Test(arguments: allStates)
    func publicWorkIsAppendedOnlyWhileRunningAndClaimsTheWakeUpOncePerBatch(state: RunState) {
        // Given any state
        var next = state
        // When a public job is posted
        let action = next.enqueue(isInternal: false)
        // Then it is appended only while running, waking the loop unless a wake-up is pending
        switch state.phase {
        case .running:
            #expect(action == .append(wake: !state.wakePending))
            #expect(next == RunState(phase: .running, wakePending: true))
        case .stopRequested, .stopped:
            #expect(action == .refuse)
            #expect(next == state)
        }
    }

    @Test(arguments: allStates)
    func internalWorkIsAppendedUntilTeardownBegins(state: RunState) {
        // Given any state
        var next = state
        // When an internal job (delivery, retirement) is posted
        let action = next.enqueue(isInternal: true)
        // Then it is appended while running or stopping, refused once stopped
        switch state.phase {
        case .running, .stopRequested:
            #expect(action == .append(wake: !state.wakePending))
            #expect(next == RunState(phase: state.phase, wakePending: true))
        case .stopped:
            #expect(action == .refuse)
            #expect(next == state)
        }
    }

    @Test(arguments: allStates)
    func aStopRequestIsRecordedOnceAndWakesTheLoopUnlessAWakeUpIsPending(state: RunState) {
        // Given any state
        var next = state
        // When shutdown() asks the loop to stop
        let action = next.requestStop()
        // Then only a running loop records it; a later request is told it came before
        switch state.phase {
        case .running:
            #expect(action == .stop(wake: !state.wakePending))
            #expect(next == RunState(phase: .stopRequested, wakePending: true))
            #expect(!next.acceptsWork)
        case .stopRequested, .stopped:
            #expect(action == .alreadyStopping)
            #expect(next == state)
        }
    }

    @Test(arguments: allStates)
    func takingABatchClearsTheWakeUpAndTearsDownOnlyAfterAStopRequest(state: RunState) {
        // Given any state
        var next = state
        // When the loop wakes up and takes the queued batch
        let action = next.takeBatch()
        // Then the next post needs a new wake-up, and a requested stop tears down after it
        #expect(!next.wakePending)
        #expect(next.phase == state.phase)
        #expect(action == (state.phase == .stopRequested ? .runThenTearDown : .run))
    }

    @Test(arguments: allStates)
    func teardownBeginsOnlyAfterAStopRequestAndOnlyOnce(state: RunState) {
        // Given any state
        var next = state
        // When teardown begins
        let began = next.beginTeardown()
        // Then only a stop request leads to it; the phase becomes stopped, the wake-up flag stays
        if state.phase == .stopRequested {
            #expect(began)
            #expect(next == RunState(phase: .stopped, wakePending: state.wakePending))
        } else {
            #expect(!began)
            #expect(next == state)
        }
    }

    @Test func manyPostsBetweenTwoBatchesCostOneWakeUp() {
        // Given a running loop
        var state = RunState()
        // When three jobs are posted before the loop takes them
        let actions = (0..<3).map { _ in state.enqueue(isInternal: false) }
        // Then only the first one wakes the loop; after the batch, the next post wakes it again
        #expect(actions == [.append(wake: true), .append(wake: false), .append(wake: false)])
        let batch = state.takeBatch()
        #expect(batch == .run)
        let next = state.enqueue(isInternal: true)
        #expect(next == .append(wake: true))
    }

    @Test func aShutdownRunsTheWholeLifeInOrder() {
        // Given a running loop with work queued
        var state = RunState()
        let first = state.enqueue(isInternal: false)
        #expect(first == .append(wake: true))
        // When shutdown() is called, the stop request rides on the pending wake-up
        let stop = state.requestStop()
        #expect(stop == .stop(wake: false))
        // Then public work is refused, internal bookkeeping still lands
        let publicJob = state.enqueue(isInternal: false)
        let internalJob = state.enqueue(isInternal: true)
        #expect(publicJob == .refuse)
        #expect(internalJob == .append(wake: false))
        // And the batch that sees the request is followed by teardown, after which nothing lands
        let lastBatch = state.takeBatch()
        let began = state.beginTeardown()
        #expect(lastBatch == .runThenTearDown)
        #expect(began)
        let late = state.enqueue(isInternal: true)
        let secondStop = state.requestStop()
        let secondTeardown = state.beginTeardown()
        let strayWakeUp = state.takeBatch()
        #expect(late == .refuse)
        #expect(secondStop == .alreadyStopping)
        #expect(!secondTeardown)
        #expect(strayWakeUp == .run)
    }
}
