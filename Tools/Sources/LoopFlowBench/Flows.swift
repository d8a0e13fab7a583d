// LoopFlow's own figures against the raw libuv floor (CBaseline), interleaved in one run.
import CBaseline
import Dispatch
import LoopFlow
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

// MARK: latency: set on a foreign thread → callback on the loop thread (paced, one in flight)

func loopFlowLatencies(_ samples: Int, paced: Bool) throws -> [UInt64] {
    let loop = try EventLoop(name: "bench")
    defer { _ = try? loop.shutdown() }
    let flow = MutableStateFlow(0, on: loop)
    let published = Published()
    let subscription = try flow.subscribe(onState: { published.value.store($0, ordering: .releasing) })
    defer { subscription.close() }
    published.waitFor(value: 0)
    return latencies(samples, paced: paced, set: { flow.value = $0 }, arrived: published.holds)
}

func baselineLatencies(_ samples: Int, paced: Bool) -> [UInt64] {
    let runtime = bl_create(1)!
    defer { bl_destroy(runtime) }
    return latencies(
        samples, paced: paced, set: { bl_set(runtime, Int64($0)) }, arrived: { bl_published(runtime) == Int64($0) })
}

// MARK: fan-out: ns per callback, from subscriber 0 (a probe) to the last of `subscribers` more

/// Median ns per callback over `updates` updates, `subscribers` subscribers after a probe.
/// Each closure captures the two values of a C subscriber's userdata slot (`fanout_slot`:
/// the shared state and its place), so its context — a heap box of those two — is what the
/// slot is to the floor's callbacks. (A closure capturing one object of the subscriber's own
/// has a box too, holding a reference to that object: a second pointer to chase.)
func loopFlowFanOut(_ subscribers: Int, updates: Int) throws -> Double {
    let loop = try EventLoop(name: "bench")
    defer { _ = try? loop.shutdown() }
    let flow = MutableStateFlow(0, on: loop)
    let published = Published()
    let shared = FanOutShared(total: subscribers + 1, published: published)
    var subscriptions: [FlowSubscription] = []
    subscriptions.reserveCapacity(subscribers + 1)
    for index in 0...subscribers {
        subscriptions.append(try flow.subscribe(onState: { fanOutVisit(shared, index, $0) }))
    }
    return measureFanOut(flow, published: published, subscriptions: subscriptions, updates: updates)
}

/// What the fan-out's subscribers share (`fanout_shared` in CBaseline's fanout_visit.h). The
/// padding keeps what the callbacks read and write on lines of this object's own: small
/// objects sit side by side in the heap, and a line shared with `Published` (which the
/// measuring thread spins on and locks) cost the first callbacks a cross-core miss.
final class FanOutShared: @unchecked Sendable {
    private let before: (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0, 0, 0, 0)
    /// Loop thread only; unchecked like `Box`'s value (the floor's is a plain field).
    @exclusivity(unchecked) var first: UInt64 = 0
    let total: Int
    let published: Published
    private let after: (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0, 0, 0, 0)

    init(total: Int, published: Published) {
        self.total = total
        self.published = published
    }
}

/// `fanout_visit` for subscriber `index`: the first notes the time, the last computes the
/// time per callback (the time first, then the bookkeeping).
@inline(__always)
func fanOutVisit(_ shared: FanOutShared, _ index: Int, _ value: Int) {
    if index == 0 { shared.first = bl_now_ns() }
    if index == shared.total - 1 {
        let elapsed = bl_now_ns() - shared.first
        shared.published.fanOut.withLock { $0 = Double(elapsed) / Double(shared.total - 1) }
        shared.published.value.store(value, ordering: .releasing)
    }
}

/// Sets `updates` values and returns the median ns per callback the last subscriber
/// published for each (after the first delivery, of 0); then closes the subscriptions.
private func measureFanOut(
    _ flow: MutableStateFlow<Int>, published: Published, subscriptions: [FlowSubscription], updates: Int
) -> Double {
    published.waitFor(value: 0)
    var measured: [Double] = []
    for update in 1...updates {
        flow.value = update
        published.waitFor(value: update)
        measured.append(published.fanOut.withLock { $0 })
    }
    for subscription in subscriptions { subscription.close() }
    return median(measured)
}

/// The walk's own share of a Swift fan-out: `loopFlowFanOut` with closures that capture
/// nothing (a nil context, like a C subscriber's NULL userdata), which count the callbacks in
/// loop-confined globals instead of knowing their place. What `loopFlowFanOut` pays beyond
/// this is its closures' contexts: at a million subscribers, the memory they take.
func loopFlowFanOutWithoutCaptures(_ subscribers: Int, updates: Int) throws -> Double {
    let loop = try EventLoop(name: "bench")
    defer { _ = try? loop.shutdown() }
    let flow = MutableStateFlow(0, on: loop)
    let published = Published()
    capturelessCalls = 0
    capturelessTotal = subscribers + 1
    capturelessPublished = published
    defer { capturelessPublished = nil }
    var subscriptions: [FlowSubscription] = []
    subscriptions.reserveCapacity(subscribers + 1)
    for _ in 0...subscribers {
        subscriptions.append(try flow.subscribe(onState: { capturelessCallback($0) }))
    }
    return measureFanOut(flow, published: published, subscriptions: subscriptions, updates: updates)
}

// Loop thread only (one loop at a time: the rows run one after another).
private nonisolated(unsafe) var capturelessCalls = 0
private nonisolated(unsafe) var capturelessTotal = 0
private nonisolated(unsafe) var capturelessFirst: UInt64 = 0
private nonisolated(unsafe) var capturelessPublished: Published?

/// Each callback of `loopFlowFanOutWithoutCaptures`: the first notes the time, the last
/// computes the time per callback (as the floor's do, by their index).
private func capturelessCallback(_ value: Int) {
    capturelessCalls &+= 1
    if capturelessCalls == 1 { capturelessFirst = bl_now_ns() }
    if capturelessCalls == capturelessTotal {
        let elapsed = bl_now_ns() - capturelessFirst
        capturelessCalls = 0
        guard let published = capturelessPublished else { return }
        published.fanOut.withLock { $0 = Double(elapsed) / Double(capturelessTotal - 1) }
        published.value.store(value, ordering: .releasing)
    }
}

func baselineFanOut(_ subscribers: Int, updates: Int) -> Double {
    let runtime = bl_create(Int32(subscribers + 1))!
    defer { bl_destroy(runtime) }
    var measured: [Double] = []
    for update in 1...updates {
        bl_set(runtime, Int64(update))
        while bl_published(runtime) != Int64(update) {}
        measured.append(bl_last_fanout_ns_per_callback(runtime))
    }
    return median(measured)
}

/// The same through libsessionflow's C API, from C (nan with a note when the library is absent).
func sessionFlowCFanOut(_ subscribers: Int, updates: Int, library: String) -> Double {
    var perUpdate = [Double](repeating: 0, count: updates)
    var error = [CChar](repeating: 0, count: 512)
    let rc = bl_sessionflow_fanout(library, Int32(subscribers + 1), Int32(updates), &perUpdate, &error, error.count)
    guard rc == 0 else {
        note("C fan-out through libsessionflow skipped: \(string(fromC: error))")
        return .nan
    }
    return median(perUpdate)
}

// MARK: set rate from foreign threads (conflated; never slowed by observers)

/// Sets per second from `producers` threads for `seconds`.
func setRate(producers: Int, seconds: Double, set: @escaping @Sendable (Int) -> Void) -> Double {
    let stop = Atomic<Bool>(false)
    let counts = Mutex<[Int]>(Array(repeating: 0, count: producers))
    let threads = (0..<producers).map { index in
        startThread {
            var n = 0
            while !stop.load(ordering: .relaxed) {
                n += 1
                set(index * 1_000_000_000 + n)
            }
            counts.withLock { $0[index] = n }
        }
    }
    let start = bl_now_ns()
    while Double(bl_now_ns() - start) < seconds * 1e9 { usleep(1000) }
    stop.store(true, ordering: .relaxed)
    for thread in threads { pthread_join(thread, nil) }
    let elapsed = Double(bl_now_ns() - start) / 1e9
    return Double(counts.withLock { $0.reduce(0, +) }) / elapsed
}

/// Set rate with one observer attached, ours and the floor's.
func setRateRow(producers: Int, seconds: Double) throws -> Row {
    let loop = try EventLoop(name: "bench")
    let flow = MutableStateFlow(0, on: loop)
    let subscription = try flow.subscribe(onState: { _ in })
    let ours = setRate(producers: producers, seconds: seconds) { flow.value = $0 }
    subscription.close()
    _ = try? loop.shutdown()
    nonisolated(unsafe) let runtime = bl_create(1)!  // bl_set is thread-safe
    let floor = setRate(producers: producers, seconds: seconds) { bl_set(runtime, Int64($0)) }
    bl_destroy(runtime)
    return Row(
        name: "set rate, \(producers) producer thread\(producers == 1 ? "" : "s")", ours: ours / 1e6,
        floor: floor / 1e6, unit: "M/s", target: .ratioAtLeast(0.5))
}

// MARK: subscribe + close (no C equivalent: the target is absolute)

func subscribeCloseRows(pairs: Int, batches: Int) throws -> [Row] {
    let loop = try EventLoop(name: "bench")
    defer { _ = try? loop.shutdown() }
    let flow = MutableStateFlow(0, on: loop)
    /// Runs `body` on the loop thread and waits for it (and for everything queued before it),
    /// asleep: a thread spinning meanwhile can share a physical core with the loop thread
    /// (two vCPUs may be hyperthread siblings) and halve what it measures.
    func onLoopThread(_ body: @escaping @Sendable () -> Double) throws -> Double {
        let result = Mutex<Double?>(nil)
        let done = DispatchSemaphore(value: 0)
        try loop.execute {
            result.withLock { $0 = body() }
            done.signal()
        }
        done.wait()
        return result.withLock { $0 }!
    }
    let loopPairs: @Sendable () -> Double = {
        let start = bl_now_ns()
        for _ in 0..<pairs {
            let subscription = try! flow.subscribe(onState: { _ in })
            subscription.close()
        }
        return Double(pairs) / (Double(bl_now_ns() - start) / 1e9)
    }
    // Warm-up, untimed: the pool's pages, the queues and their buffers reach their size.
    _ = try onLoopThread(loopPairs)
    _ = try onLoopThread { 0 }
    // Five timed batches of each, alternated, and the median of each: one batch is a window
    // of 40-200 ms, and one preempted vCPU in it was the whole row (the fan-out rows take
    // the median of their updates the same way).
    var callsAlone: [Double] = []
    var withDrain: [Double] = []
    var foreignRates: [Double] = []
    for _ in 0..<batches {
        let onLoop = try onLoopThread(loopPairs)
        // The retire work the pairs left behind is part of their cost: wait for it too.
        var start = bl_now_ns()
        _ = try onLoopThread { 0 }
        let drain = Double(bl_now_ns() - start)
        callsAlone.append(onLoop)
        withDrain.append(Double(pairs) / (Double(pairs) / onLoop + drain / 1e9))
        start = bl_now_ns()
        for _ in 0..<pairs {
            let subscription = try flow.subscribe(onState: { _ in })
            subscription.close()
        }
        _ = try onLoopThread { 0 }
        foreignRates.append(Double(pairs) / (Double(bl_now_ns() - start) / 1e9))
    }
    let onLoop = median(callsAlone)
    let onLoopWithDrain = median(withDrain)
    let foreign = median(foreignRates)
    // No C equivalent of a subscription; the floor is what any thread-safe subscribe+close
    // must pay at least: one allocation of a subscription's size, one lock, one free.
    let floor = bl_alloc_lock_pairs_per_second(Int32(pairs), 48) / 1e6
    let label = "malloc+lock+free"
    return [
        Row(name: "subscribe+close on the loop thread, retire work included", ours: onLoopWithDrain / 1e6,
            floor: floor, unit: "M/s", target: .atLeast(20), baseline: label),
        Row(name: "  … the calls alone (retire work deferred)", ours: onLoop / 1e6, floor: floor,
            unit: "M/s", baseline: label),
        Row(name: "subscribe+close from a foreign thread", ours: foreign / 1e6, floor: floor, unit: "M/s",
            target: .atLeast(5), baseline: label),
    ]
}

// MARK: memory per subscription

/// RSS delta per open subscription over `count` subscriptions, against the floor's C array of
/// `{callback, userdata}` entries (the subscribers' own slots, which the floor allocates too,
/// are not the list's: ours are counted with captureless closures).
func bytesPerSubscriptionRow(count: Int) throws -> Row {
    trimHeap()
    let floorBefore = residentBytes()
    let runtime = bl_create(Int32(count))!
    let floor = Double(residentBytes() - floorBefore) / Double(count) - Double(bl_userdata_bytes_per_subscriber())
    bl_destroy(runtime)

    let loop = try EventLoop(name: "bench")
    defer { _ = try? loop.shutdown() }
    let flow = MutableStateFlow(0, on: loop)
    let published = Published()
    // Warm up the loop and the flow so their own one-time allocations are not counted.
    let warm = try flow.subscribe(onState: { _ in published.count.add(1, ordering: .releasing) })
    published.waitFor(count: 1)
    // The benchmark's own array of handles, touched before the first reading.
    var subscriptions = [FlowSubscription?](repeating: nil, count: count)
    trimHeap()
    let before = residentBytes()
    for index in 0..<count {
        subscriptions[index] = try flow.subscribe(onState: { _ in })
    }
    let last = try flow.subscribe(onState: { _ in published.count.add(1, ordering: .releasing) })
    published.waitFor(count: 2)   // every arrival before `last` is registered too
    let ours = Double(residentBytes() - before) / Double(count)
    last.close()
    warm.close()
    for subscription in subscriptions { subscription?.close() }
    return Row(name: "bytes per open subscription", ours: ours, floor: floor, unit: "B", target: .atMost(64))
}
