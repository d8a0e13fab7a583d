// The Swift peers a user would pick instead, measured the same way in the same run:
// OpenCombine's CurrentValueSubject and AsyncStream(bufferingPolicy: .bufferingNewest(1)).
import CBaseline
import Dispatch
import OpenCombine
import OpenCombineDispatch
import Synchronization

/// Counts the receipts of one update across its subscribers: the first notes the time, the
/// one that completes the count computes the time per callback.
final class FanOutClock: @unchecked Sendable {
    let subscribers: Int
    private let received = Atomic<Int>(0)
    private var first: UInt64 = 0
    let done = Atomic<Int>(0)
    private(set) var perCallback: Double = 0

    init(subscribers: Int) { self.subscribers = subscribers }

    /// Starts an update whose first receipt is not a callback (AsyncStream: the first yield).
    func start() {
        first = bl_now_ns()
        received.store(0, ordering: .releasing)
    }

    func receipt(_ update: Int, countsFirst: Bool) {
        let count = received.add(1, ordering: .acquiringAndReleasing).newValue
        if count == 1 && countsFirst { first = bl_now_ns() }
        let callbacks = countsFirst ? subscribers - 1 : subscribers
        if count == subscribers {
            perCallback = Double(bl_now_ns() - first) / Double(max(callbacks, 1))
            received.store(0, ordering: .relaxed)
            done.store(update, ordering: .releasing)
        }
    }

    func waitFor(_ update: Int) {
        while done.load(ordering: .acquiring) != update {}
    }
}

// MARK: OpenCombine CurrentValueSubject

/// Combine delivers on the sending thread; a user who wants the callbacks on one thread adds
/// `receive(on:)`, which is what the latency figure measures (a serial DispatchQueue).
func combineLatencies(_ samples: Int, paced: Bool) -> [UInt64] {
    let subject = CurrentValueSubject<Int, Never>(0)
    let published = Published()
    let queue = DispatchQueue(label: "bench-combine")
    let cancellable = subject.receive(on: queue.ocombine).sink { published.value.store($0, ordering: .releasing) }
    defer { cancellable.cancel() }
    return latencies(samples, paced: paced, set: { subject.value = $0 }, arrived: published.holds)
}

/// Synchronous sinks (Combine's cheapest fan-out: no thread hop at all).
func combineFanOut(_ subscribers: Int, updates: Int) -> Double {
    let subject = CurrentValueSubject<Int, Never>(0)
    let clock = FanOutClock(subscribers: subscribers + 1)
    var cancellables: [AnyCancellable] = []
    cancellables.reserveCapacity(subscribers + 1)
    for _ in 0...subscribers {
        cancellables.append(subject.sink { value in
            if value > 0 { clock.receipt(value, countsFirst: true) }
        })
    }
    var measured: [Double] = []
    for update in 1...updates {
        subject.value = update
        clock.waitFor(update)
        measured.append(clock.perCallback)
    }
    for cancellable in cancellables { cancellable.cancel() }
    return median(measured)
}

// MARK: AsyncStream(bufferingPolicy: .bufferingNewest(1))

/// One stream and one consuming task per subscriber (AsyncStream has a single consumer).
func asyncStreamLatencies(_ samples: Int, paced: Bool) -> [UInt64] {
    let (stream, continuation) = AsyncStream.makeStream(of: Int.self, bufferingPolicy: .bufferingNewest(1))
    let published = Published()
    let consumer = Task {
        for await value in stream { published.value.store(value, ordering: .releasing) }
    }
    let measured = latencies(samples, paced: paced, set: { continuation.yield($0) }, arrived: published.holds)
    continuation.finish()
    consumer.cancel()
    return measured
}

/// From the first yield to the last consumer's receipt, per consumer.
func asyncStreamFanOut(_ subscribers: Int, updates: Int) async -> Double {
    let clock = FanOutClock(subscribers: subscribers + 1)
    let ready = Published()
    var continuations: [AsyncStream<Int>.Continuation] = []
    var consumers: [Task<Void, Never>] = []
    continuations.reserveCapacity(subscribers + 1)
    consumers.reserveCapacity(subscribers + 1)
    for _ in 0...subscribers {
        let (stream, continuation) = AsyncStream.makeStream(of: Int.self, bufferingPolicy: .bufferingNewest(1))
        continuations.append(continuation)
        consumers.append(Task {
            for await value in stream {
                if value == 0 { ready.count.add(1, ordering: .releasing) } else { clock.receipt(value, countsFirst: false) }
            }
        })
        continuation.yield(0)
    }
    while ready.count.load(ordering: .acquiring) < subscribers + 1 { await Task.yield() }
    var measured: [Double] = []
    for update in 1...updates {
        clock.start()
        for continuation in continuations { continuation.yield(update) }
        while clock.done.load(ordering: .acquiring) != update { await Task.yield() }
        measured.append(clock.perCallback)
    }
    for continuation in continuations { continuation.finish() }
    for consumer in consumers { await consumer.value }
    return median(measured)
}
