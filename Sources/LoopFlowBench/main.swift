// Rough LoopFlow figures: one cross-thread set→callback hop, and one fan-out callback.
// Run with: swift run -c release loopflow-bench
// (The full benchmark with a raw libuv C baseline in the same run is a later issue.)
import LoopFlow
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

func nanosecondsNow() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}

func percentile(_ sorted: [UInt64], _ p: Double) -> UInt64 {
    sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
}

/// Loop-thread scratch state read back on the main thread after a happens-before edge.
final class Box<T>: @unchecked Sendable {
    var value: T
    init(_ value: T) { self.value = value }
}

/// What the loop thread publishes and the measuring thread spins on.
final class Published: Sendable {
    let value = Atomic<Int>(0)
}

let arguments = CommandLine.arguments
let samples = arguments.count > 1 ? Int(arguments[1]) ?? 20_000 : 20_000

let loop = try EventLoop(name: "bench")

// 1. Cross-thread hop: this thread sets, the loop thread's callback publishes, we spin.
do {
    let flow = MutableStateFlow(0, on: loop)
    let published = Published()
    let subscription = try flow.subscribe(onState: { published.value.store($0, ordering: .releasing) })
    var latencies: [UInt64] = []
    latencies.reserveCapacity(samples)
    for i in 1...samples {
        let start = nanosecondsNow()
        flow.value = i
        while published.value.load(ordering: .acquiring) != i {}
        latencies.append(nanosecondsNow() - start)
    }
    subscription.close()
    latencies.sort()
    print("set→callback hop (foreign thread → loop thread), \(samples) paced samples:")
    print("  p50 \(percentile(latencies, 0.5)) ns, p99 \(percentile(latencies, 0.99)) ns")
}

// 2. Fan-out: time between the first and the last subscriber's callback of one update.
for subscribers in [100, 10_000] {
    let flow = MutableStateFlow(0, on: loop)
    let first = Box<UInt64>(0)
    let perCallback = Box<[Double]>([])
    let done = Published()
    var subscriptions: [FlowSubscription] = []
    for index in 0..<subscribers {
        let isFirst = index == 0
        let isLast = index == subscribers - 1
        subscriptions.append(try flow.subscribe(onState: { value in
            if isFirst { first.value = nanosecondsNow() }
            if isLast {
                if value > 0 {
                    perCallback.value.append(Double(nanosecondsNow() - first.value) / Double(subscribers - 1))
                }
                done.value.store(value, ordering: .releasing)
            }
        }))
    }
    let updates = 200
    for update in 1...updates {
        flow.value = update
        while done.value.load(ordering: .acquiring) != update {}
    }
    for subscription in subscriptions { subscription.close() }
    let sorted = perCallback.value.sorted()
    print("fan-out, \(subscribers) subscribers, \(updates) updates: median \(sorted[sorted.count / 2]) ns per callback")
}

try loop.shutdown()
