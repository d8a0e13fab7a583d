// LoopFlow against the raw libuv floor (CBaseline), measured in the same run.
//
//   swift run -c release loopflow-bench            full sizes
//   swift run -c release loopflow-bench --smoke    tiny sizes (the test suite runs this so it cannot rot)
//   ... --json                                     one JSON object instead of the table
//
// Figures: cross-thread set→callback latency (paced, one in flight: p50/p99/p99.9), fan-out
// ns per callback (time from the first to the last subscriber of one update), foreign-thread set
// rate with 1 and 4 producers (one observer attached), subscribe+close rate (absolute: no C
// equivalent). Still to come: memory and allocations per update, single-flight, the peers.
import CBaseline
import LoopFlow
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

let arguments = CommandLine.arguments
let smoke = arguments.contains("--smoke")
let json = arguments.contains("--json")
let samples = smoke ? 200 : 20_000
let fanOutSizes = smoke ? [1, 100] : [1, 100, 10_000, 1_000_000]
let fanOutUpdates = smoke ? 5 : 50

func percentile(_ sorted: [UInt64], _ p: Double) -> Double {
    Double(sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))])
}

/// Loop-thread scratch state read back after a happens-before edge.
final class Box<T>: @unchecked Sendable {
    var value: T
    init(_ value: T) { self.value = value }
}

final class Published: Sendable {
    let value = Atomic<Int>(0)
    let fanOut = Mutex<Double>(0)
}

struct Row {
    let name: String
    let ours: Double
    let floor: Double
    let unit: String
    var ratio: Double { floor > 0 ? ours / floor : .nan }

}

var rows: [Row] = []

// MARK: latency

func loopFlowLatencies() throws -> [UInt64] {
    let loop = try EventLoop(name: "bench")
    defer { _ = try? loop.shutdown() }
    let flow = MutableStateFlow(0, on: loop)
    let published = Published()
    let subscription = try flow.subscribe(onState: { published.value.store($0, ordering: .releasing) })
    defer { subscription.close() }
    while published.value.load(ordering: .acquiring) != 0 {}
    var latencies: [UInt64] = []
    latencies.reserveCapacity(samples)
    for i in 1...samples {
        let start = bl_now_ns()
        flow.value = i
        while published.value.load(ordering: .acquiring) != i {}
        latencies.append(bl_now_ns() - start)
    }
    return latencies.sorted()
}

func baselineLatencies() -> [UInt64] {
    let runtime = bl_create(1)!
    defer { bl_destroy(runtime) }
    var latencies: [UInt64] = []
    latencies.reserveCapacity(samples)
    for i in 1...samples {
        let start = bl_now_ns()
        bl_set(runtime, Int64(i))
        while bl_published(runtime) != Int64(i) {}
        latencies.append(bl_now_ns() - start)
    }
    return latencies.sorted()
}

// Interleave the two so that machine noise hits both alike.
var ours: [UInt64] = []
var floor: [UInt64] = []
for _ in 0..<2 {
    ours += try loopFlowLatencies()
    floor += baselineLatencies()
}
ours.sort()
floor.sort()
for (label, p) in [("p50", 0.5), ("p99", 0.99), ("p99.9", 0.999)] {
    rows.append(Row(name: "set→callback latency \(label)", ours: percentile(ours, p), floor: percentile(floor, p), unit: "ns"))
}

// MARK: fan-out

func loopFlowFanOut(_ subscribers: Int) throws -> Double {
    let loop = try EventLoop(name: "bench")
    defer { _ = try? loop.shutdown() }
    let flow = MutableStateFlow(0, on: loop)
    let first = Box<UInt64>(0)
    let published = Published()
    var subscriptions: [FlowSubscription] = []
    subscriptions.reserveCapacity(subscribers)
    for index in 0..<subscribers {
        let isFirst = index == 0
        let isLast = index == subscribers - 1
        subscriptions.append(try flow.subscribe(onState: { value in
            if isFirst { first.value = bl_now_ns() }
            if isLast {
                if subscribers > 1 {
                    let perCallback = Double(bl_now_ns() - first.value) / Double(subscribers - 1)
                    published.fanOut.withLock { $0 = perCallback }
                }
                published.value.store(value, ordering: .releasing)
            }
        }))
    }
    while published.value.load(ordering: .acquiring) != 0 {}
    var measured: [Double] = []
    for update in 1...fanOutUpdates {
        flow.value = update
        while published.value.load(ordering: .acquiring) != update {}
        measured.append(published.fanOut.withLock { $0 })
    }
    for subscription in subscriptions { subscription.close() }
    return measured.sorted()[measured.count / 2]
}

func baselineFanOut(_ subscribers: Int) -> Double {
    let runtime = bl_create(Int32(subscribers))!
    defer { bl_destroy(runtime) }
    var measured: [Double] = []
    for update in 1...fanOutUpdates {
        bl_set(runtime, Int64(update))
        while bl_published(runtime) != Int64(update) {}
        measured.append(bl_last_fanout_ns_per_callback(runtime))
    }
    return measured.sorted()[measured.count / 2]
}

for subscribers in fanOutSizes where subscribers > 1 {
    rows.append(Row(
        name: "fan-out per callback, \(subscribers) subscribers",
        ours: try loopFlowFanOut(subscribers), floor: baselineFanOut(subscribers), unit: "ns"))
}

// MARK: set rate (conflated; never slowed by observers)

/// Sets per second from `producers` threads for `seconds`, with one observer attached.
func setRate(producers: Int, seconds: Double, set: @escaping @Sendable (Int) -> Void) -> Double {
    let stop = Published()
    let counts = Mutex<[Int]>(Array(repeating: 0, count: producers))
    var threads: [pthread_t] = []
    final class Work: @unchecked Sendable {
        let body: () -> Void
        init(_ body: @escaping () -> Void) { self.body = body }
    }
    for index in 0..<producers {
        let work = Work {
            var n = 0
            while stop.value.load(ordering: .relaxed) == 0 {
                n += 1
                set(index * 1_000_000_000 + n)
            }
            counts.withLock { $0[index] = n }
        }
        var thread = pthread_t()
        pthread_create(&thread, nil, { raw in
            Unmanaged<Work>.fromOpaque(raw!).takeRetainedValue().body()
            return nil
        }, Unmanaged.passRetained(work).toOpaque())
        threads.append(thread)
    }
    let start = bl_now_ns()
    while Double(bl_now_ns() - start) < seconds * 1e9 { usleep(1000) }
    stop.value.store(1, ordering: .relaxed)
    for thread in threads { pthread_join(thread, nil) }
    let elapsed = Double(bl_now_ns() - start) / 1e9
    return Double(counts.withLock { $0.reduce(0, +) }) / elapsed
}

let rateSeconds = smoke ? 0.05 : 0.5
for producers in [1, 4] {
    let loop = try EventLoop(name: "bench")
    let flow = MutableStateFlow(0, on: loop)
    let subscription = try flow.subscribe(onState: { _ in })
    let ours = setRate(producers: producers, seconds: rateSeconds) { flow.value = $0 }
    subscription.close()
    _ = try? loop.shutdown()
    nonisolated(unsafe) let runtime = bl_create(1)!  // the C floor is thread-safe for bl_set
    let floor = setRate(producers: producers, seconds: rateSeconds) { bl_set(runtime, Int64($0)) }
    bl_destroy(runtime)
    rows.append(Row(name: "set rate, \(producers) producer thread(s)", ours: ours / 1e6, floor: floor / 1e6, unit: "M/s"))
}

// MARK: subscribe + close (no C equivalent: the target is absolute, ≥ 20 M/s on the loop thread)

let pairs = smoke ? 1_000 : 200_000
do {
    let loop = try EventLoop(name: "bench")
    let flow = MutableStateFlow(0, on: loop)
    let onLoop = try await loop.submit { () -> Double in
        let start = bl_now_ns()
        for _ in 0..<pairs {
            let subscription = try flow.subscribe(onState: { _ in })
            subscription.close()
        }
        return Double(pairs) / (Double(bl_now_ns() - start) / 1e9)
    }
    let start = bl_now_ns()
    for _ in 0..<pairs {
        let subscription = try flow.subscribe(onState: { _ in })
        subscription.close()
    }
    let foreign = Double(pairs) / (Double(bl_now_ns() - start) / 1e9)
    try await loop.submit {}
    _ = try? loop.shutdown()
    rows.append(Row(name: "subscribe+close on the loop thread", ours: onLoop / 1e6, floor: .nan, unit: "M/s"))
    rows.append(Row(name: "subscribe+close from a foreign thread", ours: foreign / 1e6, floor: .nan, unit: "M/s"))
}

// MARK: report

if json {
    func number(_ value: Double) -> String { value.isFinite ? "\(value)" : "null" }
    let items = rows.map {
        "{\"name\":\"\($0.name)\",\"sessionflow\":\(number($0.ours)),\"baseline\":\(number($0.floor)),"
            + "\"unit\":\"\($0.unit)\",\"ratio\":\(number($0.ratio))}"
    }
    print("[" + items.joined(separator: ",") + "]")
} else {
    func pad(_ text: String, _ width: Int) -> String {
        text.count >= width ? text : text + String(repeating: " ", count: width - text.count)
    }
    print(pad("measure", 44) + pad("SessionFlow", 14) + pad("raw libuv", 14) + "ratio")
    /// `value` with `decimals` digits after the point (no Foundation here).
    func fixed(_ value: Double, _ decimals: Int) -> String {
        guard value.isFinite else { return "n/a" }
        var scale = 1.0
        for _ in 0..<decimals { scale *= 10 }
        let scaled = Int64((value * scale).rounded())
        let whole = scaled / Int64(scale)
        let fraction = abs(scaled % Int64(scale))
        guard decimals > 0 else { return "\(whole)" }
        let digits = String(fraction)
        return "\(whole)." + String(repeating: "0", count: decimals - digits.count) + digits
    }
    for row in rows {
        let ours = fixed(row.ours, row.ours < 100 ? 1 : 0) + " " + row.unit
        let floor = row.floor.isFinite ? fixed(row.floor, row.floor < 100 ? 1 : 0) + " " + row.unit : "—"
        let ratio = row.ratio.isFinite ? fixed(row.ratio, 2) + "×" : "—"
        print(pad(row.name, 44) + pad(ours, 14) + pad(floor, 14) + ratio)
    }
}
