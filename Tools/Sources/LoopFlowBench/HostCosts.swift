// What a host pays outside the hot path (issue 32): the valid-token path, start-up, the idle
// host (wake-ups, CPU, memory) and a store write — each against a floor measured in the same
// run (docs/benchmarks.md says why each floor is the right one).
import CBaseline
import LoopFlow
import SessionCore
import SessionFileStore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// An authority for sessions that never refresh during a measurement (1-hour tokens).
private struct IdleAuthority: SessionAuthority {
    func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
        completion.fail(.transient("the benchmark's authority does not refresh"))
    }
}

/// A string behind a mutex: the floor of asking for a token that is still valid.
private final class GuardedString: Sendable {
    let value = Mutex("bench-access-token")
    func read() -> String { value.withLock { $0 } }
}

/// Wall time per call of one caller, `callers` callers at once (Swift: tasks; C: threads).
func validTokenRows(library: String, calls: Int) async throws -> [Row] {
    let loop = try EventLoop(name: "bench-token")
    let manager = try SessionManager(loop: loop, authority: IdleAuthority(), store: MemoryCredentialStore())
    try await manager.signIn(SessionTokens(
        accessToken: Secret("bench-access-token"), refreshToken: Secret("bench-refresh"), expiresIn: .seconds(3600)))
    let guarded = GuardedString()
    var rows: [Row] = []
    for callers in [1, 4] {
        func perCall(_ body: @escaping @Sendable () async throws -> Void) async throws -> Double {
            var best = Double.infinity
            for _ in 0..<3 {
                let start = bl_now_ns()
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for _ in 0..<callers {
                        group.addTask { for _ in 0..<calls { try await body() } }
                    }
                    try await group.waitForAll()
                }
                best = min(best, Double(bl_now_ns() - start) / Double(calls))
            }
            return best
        }
        let ours = try await perCall { _ = try await manager.freshAccessToken() }
        let floor = try await perCall { _ = guarded.read() }
        rows.append(Row(
            name: "valid token, Swift freshAccessToken(), \(callers) task\(callers == 1 ? "" : "s") (per call)",
            ours: ours, floor: floor, unit: "ns", target: .ratioAtMost(2), baseline: "mutex + String read"))
        rows.append(Row(
            name: "  … calls per second, all \(callers) task\(callers == 1 ? "" : "s")",
            ours: Double(callers) * 1e9 / ours / 1e6, floor: Double(callers) * 1e9 / floor / 1e6, unit: "M/s",
            baseline: "mutex + String read"))
    }
    await manager.close()
    try loop.shutdown()
    for threads in [1, 4] {
        var ours = Double.infinity, floor = Double.infinity
        var failure: String?
        for _ in 0..<3 {
            var value = 0.0
            var error = [CChar](repeating: 0, count: 256)
            if bl_sf_fresh_token(library, Int32(threads), Int32(calls), &value, &error, error.count) == 0 {
                ours = min(ours, value)
            } else {
                failure = string(fromC: error)
            }
            floor = min(floor, bl_async_roundtrip_ns(Int32(threads), Int32(calls)))
        }
        rows.append(Row(
            name: "valid token, C sf_session_fresh_token, \(threads) foreign thread\(threads == 1 ? "" : "s") (per call)",
            ours: ours.isFinite ? ours : .nan, floor: floor, unit: "ns", target: .ratioAtMost(2),
            baseline: "uv_async_send round trip", note: ours.isFinite ? nil : failure))
        rows.append(Row(
            name: "  … calls per second, all \(threads) thread\(threads == 1 ? "" : "s")",
            ours: ours.isFinite ? Double(threads) * 1e9 / ours / 1e3 : .nan, floor: Double(threads) * 1e9 / floor / 1e3,
            unit: "k/s", baseline: "uv_async_send round trip", note: ours.isFinite ? nil : failure))
    }
    return rows
}

/// sf_runtime_create → first on_state, the median of `runs`, with and without a stored
/// session (key file store).
func startupRows(library: String, runs: Int) -> [Row] {
    var rows: [Row] = []
    var floors: [Double] = []
    for _ in 0..<runs { floors.append(bl_uv_startup_ns() / 1e6) }
    let floor = median(floors)
    for stored in [true, false] {
        var times: [Double] = []
        var failure: String?
        for _ in 0..<runs {
            let directory = temporaryDirectory("sessionflow-bench-startup")
            defer { removeTree(directory) }
            var value = 0.0
            var error = [CChar](repeating: 0, count: 256)
            if bl_sf_startup(library, directory, stored ? 1 : 0, &value, &error, error.count) == 0 {
                times.append(value / 1e6)
            } else {
                failure = string(fromC: error)
            }
        }
        rows.append(Row(
            name: "start-up, sf_runtime_create → first on_state, \(stored ? "stored session" : "empty store") (key file)",
            ours: times.isEmpty ? .nan : median(times), floor: floor, unit: "ms",
            target: stored ? .atMost(5) : nil, baseline: "uv_loop_init + thread + async", note: times.isEmpty ? failure : nil))
    }
    return rows
}

/// The idle host against the idle floor: two processes of this executable (`--idle-host`),
/// at once, each sleeping `seconds`.
func idleRows(library: String, seconds: Double, executable: String) -> [Row] {
    let directory = temporaryDirectory("sessionflow-bench-idle")
    defer { removeTree(directory) }
    func start(_ arguments: String) -> UnsafeMutablePointer<FILE>? {
        popen("'\(executable)' --idle-host \(arguments) \(seconds)", "r")
    }
    let oursPipe = start("'\(library)' '\(directory)'")
    let floorPipe = start("- -")
    func read(_ pipe: UnsafeMutablePointer<FILE>?) -> (switches: Double, cpu: Double, rss: Double, library: Double)? {
        guard let pipe else { return nil }
        var output = ""
        var buffer = [CChar](repeating: 0, count: 256)
        while fgets(&buffer, Int32(buffer.count), pipe) != nil { output += string(fromC: buffer) }
        pclose(pipe)
        guard let line = output.split(separator: "\n").first(where: { $0.hasPrefix("IDLE ") }) else { return nil }
        let fields = line.split(separator: " ").dropFirst().compactMap { Double($0) }
        guard fields.count == 4 else { return nil }
        return (fields[0], fields[1], fields[2], fields[3])
    }
    let ours = read(oursPipe), floor = read(floorPipe)
    let perMinute = 60 / seconds
    let why = ours == nil || floor == nil ? "the idle host failed" : nil
    let extraWakeUps = ours.flatMap { o in floor.map { (o.switches - $0.switches) * perMinute } } ?? .nan
    return [
        Row(name: "idle, signed in (1-hour token): context switches per minute",
            ours: ours.map { $0.switches * perMinute } ?? .nan, floor: floor.map { $0.switches * perMinute } ?? .nan,
            unit: "", baseline: "libuv loop + 1-hour timer", note: why),
        Row(name: "  … above the floor (target: ≤ 2 per minute)", ours: extraWakeUps, floor: .nan, unit: "",
            target: .atMost(2), note: why),
        Row(name: "idle, CPU time per minute", ours: ours.map { $0.cpu * perMinute } ?? .nan,
            floor: floor.map { $0.cpu * perMinute } ?? .nan, unit: "ms", baseline: "libuv loop + 1-hour timer", note: why),
        Row(name: "idle, RSS above a libuv + libcurl host", ours: ours.flatMap { o in floor.map { (o.rss - $0.rss) / 1024 } } ?? .nan,
            floor: .nan, unit: "MiB", target: .atMost(8), note: why),
        Row(name: "  … of which libsessionflow.so's mapped pages", ours: ours.map { $0.library / 1024 } ?? .nan,
            floor: .nan, unit: "MiB", note: why),
    ]
}

/// One session record stored (seal + atomic replace + fsync) against write + fsync + rename +
/// fsync of the directory, the same number of bytes in the same directory; the median of
/// `writes`.
func storeWriteRows(writes: Int) throws -> [Row] {
    let directory = temporaryDirectory("sessionflow-bench-store")
    defer { removeTree(directory) }
    let store = FileCredentialStore(directory: directory, key: .keyFile)
    func session(_ index: Int) -> StoredSession {
        StoredSession(
            accessToken: Secret("bench-access-\(index)"), refreshToken: Secret("bench-refresh-\(index)"),
            accessTokenExpiresAt: .seconds(1_900_000_000), memberID: "bench")
    }
    try store.write(session(0))  // the key made, the record's size known
    var info = stat()
    let size = stat(directory + "/session.sfstore", &info) == 0 ? Int(info.st_size) : 512
    // Interleaved, so that the disk's moods (other writers, the journal) hit both alike.
    var ours: [Double] = [], floor: [Double] = []
    for index in 1...writes {
        var start = bl_now_ns()
        try store.write(session(index))
        ours.append(Double(bl_now_ns() - start) / 1000)
        start = bl_now_ns()
        durableWrite(size, in: directory)
        floor.append(Double(bl_now_ns() - start) / 1000)
    }
    return [Row(
        name: "store write, one session record (\(size) bytes: seal + atomic replace + fsync)",
        ours: median(ours), floor: median(floor), unit: "µs", target: .ratioAtMost(1.3),
        baseline: "write + fsync + rename + fsync(dir)")]
}

/// `size` bytes written durably into `directory`: write, fsync, rename over the last copy, and
/// fsync of the directory (the rename is durable only then: a crash before can bring back the
/// old file) — what any durable atomic replace must do.
func durableWrite(_ size: Int, in directory: String) {
    let bytes = [UInt8](repeating: 0x5a, count: size)
    let temporary = directory + "/floor.tmp"
    let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
    _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    fsync(fd)
    close(fd)
    rename(temporary, directory + "/floor.bin")
    let directoryFD = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    fsync(directoryFD)
    close(directoryFD)
}

func temporaryDirectory(_ prefix: String) -> String {
    var template = Array("/tmp/\(prefix)-XXXXXX".utf8CString)
    return template.withUnsafeMutableBufferPointer { buffer in
        mkdtemp(buffer.baseAddress!).map { String(cString: $0) } ?? "/tmp/\(prefix)"
    }
}

func removeTree(_ path: String) {
    _ = system("rm -rf '\(path)'")
}
