// Counts heap allocations per update in steady state, for loopflow-bench (which runs this
// with LD_PRELOAD=libMallocInterposerSwift.so: the interposer prefixes every allocation, so
// it must not be loaded into the process that measures time and memory).
//
//   loopflow-allocs UPDATES SUBSCRIBERS...   prints "SUBSCRIBERS OURS FLOOR" per size, then
//                                            "pairs ON-LOOP FOREIGN" (per subscribe+close)
//
// An update is a set on this (foreign) thread delivered to every subscriber on the loop
// thread; counting covers both threads, after a warm-up of the same updates. A pair is a
// subscribe and a close, on the loop thread or from this one, with the loop's deferred
// retire work included (counted until the loop has run it), after a warm-up of the same.
import CBaseline
import LoopFlow
import MallocInterposerSwift
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The value the last subscriber saw.
final class Seen: Sendable {
    let value = Atomic<Int>(-1)
}

func fail(_ message: String, _ status: Int32) -> Never {
    let line = Array((message + "\n").utf8)
    _ = line.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
    exit(status)
}

let arguments = CommandLine.arguments.dropFirst().compactMap { Int($0) }
guard arguments.count >= 2 else {
    fail("usage: loopflow-allocs UPDATES SUBSCRIBERS...", 64)
}
let updates = arguments[0]

/// Mallocs made while `body` runs (every thread).
func mallocs(_ body: () throws -> Void) rethrows -> Int {
    MallocInterposerSwift.initialize()
    MallocInterposerSwift.hook()
    try body()
    MallocInterposerSwift.unhook()
    return MallocInterposerSwift.getStatistics().mallocCount
}

// The interposer must be loaded, or every count below would read 0 and look like success.
let probe = mallocs { bl_heap_probe() }
guard probe >= 1 else {
    fail("loopflow-allocs: the malloc interposer is not loaded (run with LD_PRELOAD)", 69)
}

/// Mallocs per update with `subscribers` subscribers; `allocating` makes the last one
/// allocate once per callback (on the loop thread), the control that proves the loop
/// thread's allocations are counted.
func perUpdate(subscribers: Int, allocating: Bool = false) throws -> Double {
    let loop = try EventLoop(name: "allocs")
    let flow = MutableStateFlow(0, on: loop)
    let seen = Seen()
    var subscriptions: [FlowSubscription] = []
    for index in 0..<subscribers {
        let isLast = index == subscribers - 1
        subscriptions.append(try flow.subscribe(onState: { value in
            if isLast {
                if allocating { bl_heap_probe() }
                seen.value.store(value, ordering: .releasing)
            }
        }))
    }
    func run(from: Int) {
        for update in from..<(from + updates) {
            flow.value = update
            while seen.value.load(ordering: .acquiring) != update {}
        }
    }
    run(from: 1)   // warm-up: queues, buffers and caches reach their steady size
    let count = mallocs { run(from: 1 + updates) }
    for subscription in subscriptions { subscription.close() }
    _ = try? loop.shutdown()
    return Double(count) / Double(updates)
}

/// The same for the C floor.
func floorPerUpdate(subscribers: Int) -> Double {
    let runtime = bl_create(Int32(subscribers))!
    func runFloor(from: Int) {
        for update in from..<(from + updates) {
            bl_set(runtime, Int64(update))
            while bl_published(runtime) != Int64(update) {}
        }
    }
    runFloor(from: 1)
    let floor = mallocs { runFloor(from: 1 + updates) }
    bl_destroy(runtime)
    return Double(floor) / Double(updates)
}

let control = try perUpdate(subscribers: 1, allocating: true)
guard control >= 1 else {
    fail("loopflow-allocs: allocations on the loop thread are not counted (control: \(control) per update)", 70)
}
for subscribers in arguments.dropFirst() {
    print("\(subscribers) \(try perUpdate(subscribers: subscribers)) \(floorPerUpdate(subscribers: subscribers))")
}

/// Mallocs per subscribe+close pair in steady state (UPDATES pairs, a closure without
/// context like most subscribers'), on the loop thread and from this one, retire work included.
func perPair() throws -> (onLoop: Double, foreign: Double) {
    let loop = try EventLoop(name: "allocs")
    defer { _ = try? loop.shutdown() }
    let flow = MutableStateFlow(0, on: loop)
    let done = Atomic<Int>(0)
    /// Runs `body` on the loop thread, then waits until the loop ran everything it queued.
    func onLoop(_ body: @escaping @Sendable () -> Void) throws {
        let before = done.load(ordering: .acquiring)
        try loop.execute {
            body()
            try? loop.execute { done.add(1, ordering: .releasing) }
        }
        while done.load(ordering: .acquiring) == before {}
    }
    let pairs = updates
    let loopPairs: @Sendable () -> Void = {
        for _ in 0..<pairs {
            let subscription = try! flow.subscribe(onState: { _ in })
            subscription.close()
        }
    }
    func foreignPairs() throws {
        for _ in 0..<pairs {
            try flow.subscribe(onState: { _ in }).close()
        }
        try onLoop {}
    }
    try onLoop(loopPairs)  // warm-up: the pool, the queues and their buffers reach their size
    try onLoop(loopPairs)
    // What the measurement's own hops to the loop allocate (their jobs' closures), taken off.
    try onLoop {}
    let hop = try mallocs { try onLoop {} }
    let onLoopCount = try mallocs { try onLoop(loopPairs) } - hop
    // Fifty rounds: how many arrivals a delivery takes depends on how the loop thread keeps up,
    // so the buffers (and the pool) reach their steady size only over many.
    for _ in 0..<50 { try foreignPairs() }
    let foreignCount = try mallocs { try foreignPairs() } - hop
    return (Double(max(0, onLoopCount)) / Double(pairs), Double(max(0, foreignCount)) / Double(pairs))
}

let (pairOnLoop, pairForeign) = try perPair()
print("pairs \(pairOnLoop) \(pairForeign)")
