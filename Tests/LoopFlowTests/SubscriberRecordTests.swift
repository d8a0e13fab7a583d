import Foundation
import Synchronization
import SessionFlowTestSupport
import Testing

@testable import LoopFlow

/// The flat subscriber layout (`SubscriberTable.swift`): pooled records at fixed addresses,
/// slot + id handles, batched retirement, C subscribers called through their function.
@Suite("Subscriber records")
struct SubscriberRecordTests {
    /// Something a callback captures, to see when the library lets go of the callback.
    final class Canary: Sendable {}

    @Test func aStaleHandleWhoseRecordWasRecycledClosesNothing() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let keeper = try state.subscribe(onState: { _ in })  // the pool never empties
            let old = try state.subscribe(onState: { _ in })
            try await loop.submit {}  // registered
            #expect(old.close())
            try await loop.submit {}  // its retire job has run: the record is free
            let seen = Recorder<Int>()
            let new = try state.subscribe(onState: { seen.append($0) })
            // The pool hands the same record out again (the newest free one first)…
            #expect(new.slot == old.slot && new.entry.raw == old.entry.raw)
            #expect(new.id != old.id)
            // …and the old handle, holding another id, neither closes nor sees the new one.
            #expect(old.isClosed)
            #expect(!old.close())
            #expect(!new.isClosed)
            state.value = 1
            #expect(await eventually { seen.last == 1 })
            #expect(new.close())
            keeper.close()
        }
    }

    @Test func aCallbackIsHeldUntilReleaseAndLetGoOnceThen() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let events = try MutableSharedFlow<Int>(on: loop)
            weak var stateCanary: Canary?
            weak var eventCanary: Canary?
            let released = Counter()
            var handles: [FlowSubscription] = []
            do {
                let first = Canary()
                let second = Canary()
                stateCanary = first
                eventCanary = second
                handles.append(try state.subscribe(onState: { _ in withExtendedLifetime(first) {} }))
                handles.append(try events.subscribe(
                    onEvent: { _ in withExtendedLifetime(second) {} }, onRelease: { released.increment() }))
            }
            // The records hold the closures (their contexts retained): alive while open.
            try await loop.submit {}
            #expect(stateCanary != nil && eventCanary != nil)
            for handle in handles { handle.close() }
            #expect(await eventually { stateCanary == nil && eventCanary == nil && released.current == 1 })
            try await loop.submit {}
            #expect(released.current == 1)
        }
    }

    @Test func recordsAreRecycledSoTheTableDoesNotGrowWithChurn() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let keeper = try state.subscribe(onState: { _ in })  // the pool never empties
            for round in 0..<20 {
                let handles = try (0..<500).map { _ in try state.subscribe(onState: { _ in }) }
                for handle in handles { handle.close() }
                try await loop.submit {}
                state.value = round + 1
            }
            // 1 + 500 records at most were ever in use at once.
            #expect(state.core.recordHighWater <= 501)
            keeper.close()
            try await loop.submit {}
            // Empty, the pool starts over from slot 0.
            #expect(state.core.recordHighWater == 0)
        }
    }

    @Test func manyClosesCostOneRetireJob() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let releases = Counter()
            let handles = try (0..<1_000).map { _ in
                try state.subscribe(onState: { _ in }, onRelease: { releases.increment() })
            }
            try await loop.submit {}
            let before = try await loop.submit { state.core.retireJobsRun }
            // 500 closed from this thread while the loop is busy, then 500 on the loop thread.
            let blocker = try LoopBlocker(loop)
            for handle in handles[..<500] { handle.close() }
            blocker.open()
            try await loop.submit { for handle in handles[500...] { handle.close() } }
            #expect(await eventually { releases.current == 1_000 })
            let after = try await loop.submit { state.core.retireJobsRun }
            // One job for the foreign closes, one for the loop's own: not a thousand.
            #expect(after - before == 2)
        }
    }

    @Test func everySubscriberAcrossManyPagesGetsEveryValueInOrder() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            // 16 + 32 + 64 + 128 + 256 + 512 + 1024 + 2048 = 4080: eight pages, and one more.
            let count = 4_100
            // Written on the loop thread only; read after a hop to it.
            let lastSeen = LockedBox([Int](repeating: -1, count: count))
            let outOfOrder = Counter()
            let handles = try (0..<count).map { index in
                try state.subscribe(onState: { value in
                    lastSeen.withLockedValue { seen in
                        if seen[index] >= value { outOfOrder.increment() }
                        seen[index] = value
                    }
                })
            }
            for value in 1...20 { state.value = value }
            #expect(await eventually { lastSeen.withLockedValue { $0.allSatisfy { $0 == 20 } } })
            #expect(outOfOrder.current == 0)
            for handle in handles { handle.close() }
        }
    }

    @Test func aWalkSkipsRecordsClosedBeforeItAndByACallbackAcrossPageBoundaries() async throws {
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            // Pages of 16, 32, 64, …, 512, then 92 of page 6's 1 024 (the first page whose walk
            // prefetches, `SubscriberPages.prefetchFromPage`): the walk ends inside a page.
            let count = 1_100
            let calls = LockedBox([Int](repeating: 0, count: count))
            let handles = LockedBox<[FlowSubscription]>([])
            // What the closes inside the callback returned (checked here, on the test's task).
            let closedInWalk = LockedBox<[Bool]>([])
            // Closed during the walk by slot 15 (the last of page 0): the first and the last
            // of page 1, one of page 3, the first of page 6 and one just ahead of the last;
            // closed before it: holes at either end of page 2, and in page 6.
            let closedByCallback = [16, 47, 150, 1_008, 1_095]
            let closedBefore = [48, 111, 0, 1_009, 1_050]
            handles.withLockedValue { list in
                for index in 0..<count {
                    list.append(try! state.subscribe(onState: { value in
                        guard value == 1 else { return }
                        calls.withLockedValue { $0[index] += 1 }
                        if index == 15 {
                            let targets = handles.withLockedValue { list in closedByCallback.map { list[$0] } }
                            closedInWalk.withLockedValue { $0 = targets.map { $0.close() } }
                        }
                    }))
                }
            }
            try await loop.submit {}  // all registered
            // Slot i is subscriber i (a fresh flow hands slots out in order): the holes and
            // the page boundaries are where the comments say.
            #expect(handles.withLockedValue { $0.enumerated().allSatisfy { Int($1.slot) == $0 } })
            for index in closedBefore { #expect(handles.withLockedValue { $0[index] }.close()) }
            state.value = 1
            #expect(await eventually { calls.withLockedValue { $0[count - 1] } == 1 })
            try await loop.submit {}
            #expect(closedInWalk.withLockedValue { $0 } == [true, true, true, true, true])
            let seen = calls.withLockedValue { $0 }
            for index in 0..<count {
                let expected = closedBefore.contains(index) || closedByCallback.contains(index) ? 0 : 1
                #expect(seen[index] == expected, "slot \(index)")
            }
            for handle in handles.withLockedValue({ $0 }) { handle.close() }
        }
    }

    @Test func aForeignSubscriberIsCalledThroughItsFunctionWithItsUserdata() async throws {
        final class Sink: @unchecked Sendable {
            let values = LockedBox<[Int]>([])
        }
        let record: @convention(c) (Int, UnsafeMutableRawPointer?) -> Void = { value, userdata in
            Unmanaged<Sink>.fromOpaque(userdata!).takeUnretainedValue().values.withLockedValue { $0.append(value) }
        }
        weak var weakInvoker: ForeignCallback<Int>?
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let events = try MutableSharedFlow<Int>(on: loop, replay: 1)
            let function = unsafeBitCast(record, to: UnsafeRawPointer.self)
            let stateSink = Sink()
            let eventSink = Sink()
            events.emit(7)  // replayed to the event subscriber
            let released = Counter()
            let (stateHandle, eventHandle) = try {
                // One invoker per kind of C function, shared by all its subscribers; only the
                // flows hold it from here on (the first a flow is given is its usual one).
                let invoker = cIntInvoker()
                weakInvoker = invoker
                return (
                    try state.subscribe(
                        foreign: invoker, function: function,
                        userdata: Unmanaged.passUnretained(stateSink).toOpaque(),
                        onRelease: { released.increment() }),
                    try events.subscribe(
                        foreign: invoker, function: function,
                        userdata: Unmanaged.passUnretained(eventSink).toOpaque(),
                        onRelease: { released.increment() }))
            }()
            #expect(await eventually { stateSink.values.withLockedValue { $0 } == [0] })
            state.value = 1
            state.value = 2
            events.emit(8)
            #expect(await eventually { stateSink.values.withLockedValue { $0.last } == 2 })
            #expect(await eventually { eventSink.values.withLockedValue { $0 } == [7, 8] })
            #expect(weakInvoker != nil)
            stateHandle.close()
            eventHandle.close()
            #expect(await eventually { released.current == 2 })
            // Each flow keeps its usual invoker while it lives.
            #expect(weakInvoker != nil)
        }
        // Released with the flows.
        #expect(await eventually { weakInvoker == nil })
    }

    @Test func aForeignSubscriberByPointerGetsTheValuesAddress() async throws {
        final class Sink: @unchecked Sendable {
            let values = LockedBox<[String]>([])
        }
        // A C function of the host's kind: (value, userdata); the invoker reads the value
        // through the pointer the walk passes (a non-trivial value: a String).
        let record: @convention(c) (UnsafeRawPointer, UnsafeMutableRawPointer?) -> Void = { value, userdata in
            let text = value.assumingMemoryBound(to: String.self).pointee
            Unmanaged<Sink>.fromOpaque(userdata!).takeUnretainedValue().values.withLockedValue { $0.append(text) }
        }
        let invoker = ForeignCallback<String>.byPointer { value, function, userdata in
            unsafeBitCast(function, to: (@convention(c) (UnsafeRawPointer, UnsafeMutableRawPointer?) -> Void).self)(
                value, userdata)
        }
        try await withLoop { loop in
            let state = MutableStateFlow("first", on: loop)
            let sink = Sink()
            let handle = try state.subscribe(
                foreign: invoker, function: unsafeBitCast(record, to: UnsafeRawPointer.self),
                userdata: Unmanaged.passUnretained(sink).toOpaque())
            #expect(await eventually { sink.values.withLockedValue { $0 } == ["first"] })
            state.value = String(repeating: "long enough to live on the heap ", count: 3)
            #expect(await eventually { sink.values.withLockedValue { $0.count } == 2 })
            #expect(sink.values.withLockedValue { $0.last } == String(repeating: "long enough to live on the heap ", count: 3))
            handle.close()
        }
    }

    /// A StateFlow's records are 24 bytes, a SharedFlow's 32 (with their cursor); the
    /// optional terminal and release callbacks live in side records, made only for a page that
    /// needs them; a record recycled from a C subscriber with extras serves a plain Swift one.
    @Test func recordsAre24BytesOr32WithACursorAndOnlyPagesThatNeedThemGetSideRecords() async throws {
        let record: @convention(c) (Int, UnsafeMutableRawPointer?) -> Void = { value, userdata in
            Unmanaged<Recorder<Int>>.fromOpaque(userdata!).takeUnretainedValue().append(value)
        }
        weak var weakInvoker: ForeignCallback<Int>?
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            // Page 0 (slots 0–15): plain Swift subscribers, no side records.
            var plain: [FlowSubscription] = []
            for _ in 0..<16 { plain.append(try state.subscribe(onState: { _ in })) }
            #expect(plain.map(\.slot) == Array(0..<16))
            for index in 1..<16 {
                #expect(state.core.recordLayout(of: Int32(index)).address
                    - state.core.recordLayout(of: Int32(index - 1)).address == 24)
            }
            #expect(Int(bitPattern: state.core.recordLayout(of: 0).address) % 64 == 0)
            #expect(!state.core.recordLayout(of: 0).hasSidePage)
            let bus = try MutableSharedFlow<Int>(on: loop)
            let busHandles = [try bus.subscribe(onEvent: { _ in }), try bus.subscribe(onEvent: { _ in })]
            #expect(bus.core.recordLayout(of: 1).address - bus.core.recordLayout(of: 0).address == 32)
            for handle in busHandles { handle.close() }

            // Page 1: a C subscriber with a release callback, a Swift one with terminal and
            // release callbacks, a plain Swift one.
            let cSeen = Recorder<Int>()
            let withExtrasSeen = Recorder<Int>()
            let plainSeen = Recorder<Int>()
            let events = Recorder<String>()
            let (cHandle, withExtras, plainHandle) = try {
                let invoker = cIntInvoker()
                weakInvoker = invoker
                return (
                    try state.subscribe(
                        foreign: invoker, function: unsafeBitCast(record, to: UnsafeRawPointer.self),
                        userdata: Unmanaged.passUnretained(cSeen).toOpaque(),
                        onRelease: { events.append("c released") }),
                    try state.subscribe(
                        onState: { withExtrasSeen.append($0) }, onComplete: { events.append("completed") },
                        onRelease: { events.append("swift released") }),
                    try state.subscribe(onState: { plainSeen.append($0) }))
            }()
            #expect([cHandle.slot, withExtras.slot, plainHandle.slot] == [16, 17, 18])
            #expect(state.core.recordLayout(of: 16).hasSidePage)
            #expect(!state.core.recordLayout(of: 0).hasSidePage)
            state.value = 1
            #expect(await eventually { cSeen.last == 1 && withExtrasSeen.last == 1 && plainSeen.last == 1 })

            // The C subscriber's record, recycled for a plain Swift subscriber: called through
            // its closure, and the old release callback is gone for good (the invoker is the
            // flow's usual one: the flow keeps it).
            #expect(cHandle.close())
            #expect(await eventually { events.all == ["c released"] })
            #expect(weakInvoker != nil)
            let recycledSeen = Recorder<Int>()
            let recycled = try state.subscribe(onState: { recycledSeen.append($0) })
            #expect(recycled.slot == 16)
            state.value = 2
            #expect(await eventually { recycledSeen.last == 2 && plainSeen.last == 2 && withExtrasSeen.last == 2 })
            #expect(cSeen.last == 1 && !cSeen.all.contains(2))

            // Completion: only the subscriber that has an onComplete is told; the releases follow.
            #expect(state.finish())
            #expect(await eventually { events.all == ["c released", "completed", "swift released"] })
            for handle in plain + [recycled, withExtras, plainHandle] { #expect(handle.isClosed) }
        }
        #expect(await eventually { weakInvoker == nil })
    }

    /// The first invoker a flow's C subscriber brings is the flow's usual one: the flow holds
    /// it, and a C subscriber using it (without terminal or release callbacks) needs no side
    /// record — its walk reads the invoker from the flow. A subscriber with another invoker
    /// keeps it in its side record, is called through it, and lets go of it when released.
    @Test func aFlowsUsualInvokerNeedsNoSideRecordAndAnotherInvokerIsHeldByItsRecord() async throws {
        let calls = Recorder<String>()
        let record: @convention(c) (Int, UnsafeMutableRawPointer?) -> Void = { _, _ in }
        let function = unsafeBitCast(record, to: UnsafeRawPointer.self)
        func invoker(_ name: String) -> ForeignCallback<Int> {
            ForeignCallback<Int> { value, _, userdata in calls.append("\(name) \(value) \(Int(bitPattern: userdata))") }
        }
        weak var weakUsual: ForeignCallback<Int>?
        weak var weakOther: ForeignCallback<Int>?
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let (usualHandle, otherHandle, plain) = try {
                let usual = invoker("usual")
                let other = invoker("other")
                weakUsual = usual
                weakOther = other
                // Slot 0 (page 0): the usual invoker. Slots 1–15: plain Swift. Slot 16 (page 1):
                // another invoker.
                let usualHandle = try state.subscribe(
                    foreign: usual, function: function, userdata: UnsafeMutableRawPointer(bitPattern: 1))
                let plain = try (1..<16).map { _ in try state.subscribe(onState: { _ in }) }
                let otherHandle = try state.subscribe(
                    foreign: other, function: function, userdata: UnsafeMutableRawPointer(bitPattern: 2))
                return (usualHandle, otherHandle, plain)
            }()
            #expect([usualHandle.slot, otherHandle.slot] == [0, 16])
            #expect(!state.core.recordLayout(of: 0).hasSidePage)
            #expect(state.core.recordLayout(of: 16).hasSidePage)
            #expect(await eventually { calls.all.sorted() == ["other 0 2", "usual 0 1"] })
            state.value = 1
            #expect(await eventually { calls.all.sorted() == ["other 0 2", "other 1 2", "usual 0 1", "usual 1 1"] })

            #expect(otherHandle.close())
            #expect(await eventually { weakOther == nil })
            #expect(usualHandle.close())
            try await loop.submit {}
            #expect(weakUsual != nil)
            for handle in plain { handle.close() }
        }
        #expect(await eventually { weakUsual == nil })
    }

    /// A flow's first C subscriber may be admitted on another thread while a walk runs on the
    /// loop: the walk read the usual invoker (none yet) before it started, the admission sets
    /// it — no data race between them (the ThreadSanitizer run of this suite sees one if the
    /// word is a plain one), and the newcomer gets the next value through it.
    @Test func aFlowsFirstCSubscriberAdmittedDuringAWalkRacesNothing() async throws {
        /// Relaxed flags: no happens-before between the walk's read and the admission's write.
        final class Flags: Sendable {
            let walking = Atomic<Bool>(false)
            let admitted = Atomic<Bool>(false)
        }
        let flags = Flags()
        let calls = Recorder<Int>()
        let record: @convention(c) (Int, UnsafeMutableRawPointer?) -> Void = { _, _ in }
        let function = UInt(bitPattern: unsafeBitCast(record, to: UnsafeRawPointer.self))
        let invoker = ForeignCallback<Int> { value, _, _ in calls.append(value) }
        try await withLoop { loop in
            let state = MutableStateFlow(0, on: loop)
            let swift = try state.subscribe(onState: { value in
                guard value == 1 else { return }
                flags.walking.store(true, ordering: .relaxed)
                // A count, not a clock, as the hang guard (the admission takes microseconds):
                // a clock's first read here ran a one-time initialization the admitting thread
                // passed through too, and ThreadSanitizer took that for an order between them.
                var spins = 0
                while !flags.admitted.load(ordering: .relaxed) && spins < 50_000_000 {
                    sched_yield()
                    spins += 1
                }
            })
            try await loop.submit {}
            state.value = 1
            let foreign = try await offThePool { () -> Result<FlowSubscription, LoopFlowError> in
                while !flags.walking.load(ordering: .relaxed) { sched_yield() }
                defer { flags.admitted.store(true, ordering: .relaxed) }
                return Result { () throws(LoopFlowError) in
                    try state.subscribe(foreign: invoker, function: UnsafeRawPointer(bitPattern: function)!, userdata: nil)
                }
            }.get()
            #expect(await eventually { calls.all == [1] })
            state.value = 2
            #expect(await eventually { calls.all == [1, 2] })
            swift.close()
            foreign.close()
        }
    }

    @Test func anOpenSubscriptionWhoseHandleAndFlowAreGoneIsCompletedAtTeardown() async throws {
        let loop = try EventLoop(name: "records")
        let log = Recorder<String>()
        weak var weakFlow: MutableStateFlow<Int>?
        do {
            let flow = MutableStateFlow(0, on: loop)
            weakFlow = flow
            _ = try flow.subscribe(
                onState: { _ in }, onComplete: { log.append("complete") }, onRelease: { log.append("release") })
            #expect(await eventually { flow.subscriptionCount.value == 1 })
        }
        // The handle and the flow are gone; the loop holds the flow's records (its core)
        // until teardown.
        let report = try loop.shutdown()
        #expect(report.unclosedSubscriptions == 1)
        #expect(log.all == ["complete", "release"])
        // …and lets go of them then: nothing is left holding the flow.
        #expect(weakFlow == nil)
    }

    @Test func aClosedSubscriberBeforeItsFirstDeliveryGetsNothingAndIsReleasedOnce() async throws {
        try await withLoop { loop in
            let events = try MutableSharedFlow<Int>(on: loop, replay: 2)
            events.emit(1)
            events.emit(2)
            let state = MutableStateFlow(0, on: loop)
            let calls = Counter()
            let releases = Recorder<String>()
            weak var weakInvoker: ForeignCallback<Int>?
            let function = UnsafeRawPointer(bitPattern: 0x1)!  // never called
            // The flow's usual invoker (it keeps it), so that the one below is held by its record.
            let usual = ForeignCallback<Int> { _, _, _ in calls.increment() }
            let first = try state.subscribe(
                foreign: usual, function: function, userdata: nil, onRelease: { releases.append("first") })
            #expect(await eventually { calls.current == 1 })
            first.close()
            #expect(await eventually { releases.all == ["first"] })
            let blocker = try LoopBlocker(loop)
            do {
                let invoker = ForeignCallback<Int> { _, _, _ in calls.increment() }
                weakInvoker = invoker
                let handles = [
                    try events.subscribe(onEvent: { _ in calls.increment() }, onRelease: { releases.append("events") }),
                    try state.subscribe(onState: { _ in calls.increment() }, onRelease: { releases.append("state") }),
                    try state.subscribe(
                        foreign: invoker, function: function, userdata: nil, onRelease: { releases.append("foreign") }),
                    try state.subscribe(
                        foreign: usual, function: function, userdata: nil, onRelease: { releases.append("usual") }),
                ]
                // Closed while their first delivery waits behind the blocked loop.
                for handle in handles { #expect(handle.close()) }
            }
            blocker.open()
            // A later subscriber gets the replay the closed one would have, and nothing of it.
            let seen = Recorder<Int>()
            let later = try events.subscribe(onEvent: { seen.append($0) })
            #expect(await eventually { seen.all == [1, 2] })
            try await loop.submit {}
            #expect(calls.current == 1)
            #expect(releases.all.sorted() == ["events", "first", "foreign", "state", "usual"])
            #expect(weakInvoker == nil)
            #expect(events.subscriptionCount.value == 1)
            later.close()
        }
    }

    @Test func aDeliveryRefusedAtTeardownDoesNotKeepItsFlowAlive() async throws {
        // In teardown's last batch: a set whose delivery is refused (the loop stopped
        // accepting work), then the retire job (accepted before) frees the flow's last
        // record. No sweep comes for that flow then, and nothing may keep it alive.
        let loop = try EventLoop(name: "records")
        weak var weakFlow: MutableStateFlow<Int>?
        let other = MutableStateFlow(0, on: loop)
        let inLastBatch = Latch()
        let setDone = Latch()
        let shutdownDone = Latch()
        let watcher = try other.subscribe(onState: { value in
            guard value == 1 else { return }
            inLastBatch.signal()
            setDone.wait()
        })
        try await loop.submit {}
        do {
            let flow = MutableStateFlow(0, on: loop)
            weakFlow = flow
            let subscription = try flow.subscribe(onState: { _ in })
            try await loop.submit {}  // registered
            let blocker = try LoopBlocker(loop)
            // Runs in the batch that sees the stop request; what it posts (both internal
            // jobs) becomes teardown's last batch: other's delivery, then the retire job.
            try loop.execute {
                other.value = 1
                subscription.close()
            }
            Thread { _ = try? loop.shutdown(); shutdownDone.signal() }.start()
            #expect(await eventually { !loop.acceptsWork })
            blocker.open()
            inLastBatch.wait()
            flow.value = 1  // claims a delivery; its job is refused
        }
        setDone.signal()
        shutdownDone.wait()
        #expect(weakFlow == nil)
        _ = watcher
    }
}

/// The invoker of a C subscriber `void (*)(Int, void *)`: a new one each call (the tests watch
/// it go away once no record holds it).
private func cIntInvoker() -> ForeignCallback<Int> {
    ForeignCallback<Int> { value, function, userdata in
        unsafeBitCast(function, to: (@convention(c) (Int, UnsafeMutableRawPointer?) -> Void).self)(value, userdata)
    }
}
