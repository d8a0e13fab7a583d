// What every section of the benchmark shares: the rows it reports, timing and thread helpers.
import CBaseline
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// One figure: SessionFlow's (or a peer's) value against the raw libuv floor of the same run.
struct Row {
    let name: String
    let ours: Double
    /// The floor measured in the same run; nan when there is no C equivalent.
    let floor: Double
    let unit: String
    /// What the issue asks for, e.g. "≤ 2×", "≥ 20 M/s"; nil for context rows (the peers).
    var target: Target? = nil
    /// What `floor` is: the raw libuv C floor unless said otherwise.
    var baseline = "raw libuv C"
    /// Why there is no figure (ours is nan), printed in its place: "node not installed".
    var note: String? = nil

    var ratio: Double { floor.isFinite && floor > 0 ? ours / floor : .nan }

    enum Target {
        case ratioAtMost(Double), ratioAtLeast(Double), atMost(Double), atLeast(Double), exactly(Double)

        var text: String {
            switch self {
            case .ratioAtMost(let value): "≤ \(short(value))×"
            case .ratioAtLeast(let value): "≥ \(short(value))×"
            case .atMost(let value): "≤ \(short(value))"
            case .atLeast(let value): "≥ \(short(value))"
            case .exactly(let value): "= \(short(value))"
            }
        }

        func met(by row: Row) -> Bool? {
            switch self {
            case .ratioAtMost(let value): row.ratio.isFinite ? row.ratio <= value : nil
            case .ratioAtLeast(let value): row.ratio.isFinite ? row.ratio >= value : nil
            case .atMost(let value): row.ours.isFinite ? row.ours <= value : nil
            case .atLeast(let value): row.ours.isFinite ? row.ours >= value : nil
            case .exactly(let value): row.ours.isFinite ? row.ours == value : nil
            }
        }
    }
}

func short(_ value: Double) -> String {
    value == value.rounded() ? "\(Int(value))" : fixed(value, 1)
}

/// `value` with `decimals` digits after the point (no Foundation here).
func fixed(_ value: Double, _ decimals: Int) -> String {
    guard value.isFinite else { return "n/a" }
    var scale = 1.0
    for _ in 0..<decimals { scale *= 10 }
    let scaled = Int64((value * scale).rounded())
    let whole = scaled / Int64(scale)
    let fraction = abs(scaled % Int64(scale))
    let sign = value < 0 && whole == 0 ? "-" : ""
    guard decimals > 0 else { return "\(whole)" }
    let digits = String(fraction)
    return sign + "\(whole)." + String(repeating: "0", count: decimals - digits.count) + digits
}

func percentile(_ sorted: [UInt64], _ p: Double) -> Double {
    Double(sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))])
}

func median(_ values: [Double]) -> Double {
    let sorted = values.sorted()
    return sorted[sorted.count / 2]
}

/// The pause between two latency samples (the "paced, one in flight"): long enough
/// for the receiving thread to go idle, so every sample measures a wake-up from idle rather
/// than a race with the receiver still finishing the previous sample (which, on a virtual
/// machine, made the median flip between two modes ~10 µs apart from run to run).
let pacing: UInt64 = 50_000

@inline(__always)
func pace() {
    let resume = bl_now_ns() + pacing
    while bl_now_ns() < resume {}
}

/// Nanoseconds from each `set(i)` until `arrived(i)` holds, one in flight, for i in 1...samples
/// (paced or back to back).
@inline(__always)
func latencies(_ samples: Int, paced: Bool, set: (Int) -> Void, arrived: (Int) -> Bool) -> [UInt64] {
    var latencies: [UInt64] = []
    latencies.reserveCapacity(samples)
    for i in 1...samples {
        let start = bl_now_ns()
        set(i)
        while !arrived(i) {}
        latencies.append(bl_now_ns() - start)
        if paced { pace() }
    }
    return latencies
}

/// Loop-thread scratch state read back after a happens-before edge.
final class Box<T>: @unchecked Sendable {
    /// Unchecked, like the C floor's plain field: a dynamically checked class property costs
    /// an exclusivity check on every access, which the callbacks measured beside the floor's
    /// must not pay for the benchmark's own bookkeeping.
    @exclusivity(unchecked) var value: T
    init(_ value: T) { self.value = value }
}

/// What a callback publishes for the measuring thread.
final class Published: Sendable {
    let value = Atomic<Int>(0)
    let count = Atomic<Int>(0)
    let fanOut = Mutex<Double>(0)

    /// Whether the published value is `expected` (acquire).
    @inline(__always)
    func holds(_ expected: Int) -> Bool {
        value.load(ordering: .acquiring) == expected
    }

    func waitFor(value expected: Int) {
        while value.load(ordering: .acquiring) != expected {}
    }

    func waitFor(count expected: Int) {
        while count.load(ordering: .acquiring) < expected {}
    }
}

/// A plain thread running `body`; join with `pthread_join`.
func startThread(_ body: @escaping @Sendable () -> Void) -> pthread_t {
    final class Work {
        let body: @Sendable () -> Void
        init(_ body: @escaping @Sendable () -> Void) { self.body = body }
    }
    var thread = pthread_t()
    let rc = pthread_create(&thread, nil, { raw in
        Unmanaged<Work>.fromOpaque(raw!).takeRetainedValue().body()
        return nil
    }, Unmanaged.passRetained(Work(body)).toOpaque())
    precondition(rc == 0, "pthread_create failed: \(rc)")
    return thread
}

/// Resident set size of this process, in bytes (/proc/self/statm).
func residentBytes() -> Int {
    guard let file = fopen("/proc/self/statm", "r") else { return 0 }
    defer { fclose(file) }
    var buffer = [CChar](repeating: 0, count: 128)
    guard fgets(&buffer, Int32(buffer.count), file) != nil else { return 0 }
    let fields = string(fromC: buffer).split(separator: " ")
    guard fields.count >= 2, let pages = Int(fields[1]) else { return 0 }
    return pages * sysconf(Int32(_SC_PAGESIZE))
}

/// The directory holding this executable (its siblings: libsessionflow.so, loopflow-allocs).
func executableDirectory() -> String {
    var buffer = [CChar](repeating: 0, count: 4096)
    let length = readlink("/proc/self/exe", &buffer, buffer.count - 1)
    guard length > 0 else { return "." }
    return parentDirectory(string(fromC: buffer))
}

/// Everything a `popen`ed command wrote, and its `pclose` status.
func drain(_ pipe: UnsafeMutablePointer<FILE>) -> (output: String, status: Int32) {
    var output = ""
    var buffer = [CChar](repeating: 0, count: 512)
    while fgets(&buffer, Int32(buffer.count), pipe) != nil { output += string(fromC: buffer) }
    return (output, pclose(pipe))
}

/// The directory part of `path` ("." if it has none).
func parentDirectory(_ path: String) -> String {
    guard let slash = path.lastIndex(of: "/") else { return "." }
    return String(path[..<slash])
}

/// Trims the process's free heap back to the system so RSS deltas are not hidden by reuse.
func trimHeap() { bl_trim_heap() }

/// A NUL-terminated C buffer as a String.
func string(fromC buffer: [CChar]) -> String {
    String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// Progress and skipped measurements, on stderr (stdout carries only the report).
func note(_ text: String) {
    let line = Array((text + "\n").utf8)
    _ = line.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
}
