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

/// A string behind a mutex: the floor of asking for a token that is still valid. Made at run
/// time, as a token is (received from the network): a literal of this length is immortal, and
/// its copy touches no reference count — the floor had no shared count for four tasks to
/// contend on, where any token read has one (ours: the token's).
private final class GuardedString: Sendable {
    let value = Mutex(String(decoding: Array("bench-access-token".utf8), as: UTF8.self))
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
/// session (key file store). Each run in a fresh process of the C host (Tools/CHost/c_host.c):
/// what a host pays once, when it starts — the library's pages faulted in, the Swift runtime's
/// caches cold. (In this process the runs after the first found everything warm, and the Swift
/// runtime warm from the start: 0.6 ms against 2.7 ms in a fresh C process, measured.) Without
/// a C compiler, the runs are made in this process and the rows say so.
func startupRows(library: String, runs: Int, executable: String) -> [Row] {
    let hostDirectory = temporaryDirectory("sessionflow-bench-c-host")
    defer { removeTree(hostDirectory) }
    let host = cHost(in: hostDirectory)
    var rows: [Row] = []
    var floors: [Double] = []
    for _ in 0..<runs {
        if let host {
            if let ns = runCHost(host, "startup - -", expecting: "STARTUP ") { floors.append(ns / 1e6) }
        } else {
            floors.append(bl_uv_startup_ns() / 1e6)
        }
    }
    let floor = floors.isEmpty ? .nan : median(floors)
    for stored in [true, false] {
        var times: [Double] = []
        var failure: String?
        for _ in 0..<runs {
            let directory = temporaryDirectory("sessionflow-bench-startup")
            defer { removeTree(directory) }
            if let host {
                if stored, runCHost(host, "sign-in '\(library)' '\(directory)'", expecting: nil) == nil {
                    failure = "the C host's sign-in failed"
                    continue
                }
                if let ns = runCHost(host, "startup '\(library)' '\(directory)'", expecting: "STARTUP ") {
                    times.append(ns / 1e6)
                } else {
                    failure = "the C host's start-up failed"
                }
                continue
            }
            var value = 0.0
            var error = [CChar](repeating: 0, count: 256)
            if bl_sf_startup(library, directory, stored ? 1 : 0, 0, &value, &error, error.count) == 0 {
                times.append(value / 1e6)
            } else {
                failure = string(fromC: error)
            }
        }
        let note = times.isEmpty ? failure : host == nil ? "no cc: in this Swift process, warm (flatters)" : nil
        rows.append(Row(
            name: "start-up, sf_runtime_create → first on_state, \(stored ? "stored session" : "empty store") (key file)",
            ours: times.isEmpty ? .nan : median(times), floor: floor, unit: "ms",
            target: stored ? .atMost(5) : nil, baseline: "uv_loop_init + thread + async", note: note))
    }
    rows.append(secretServiceStartupRow(library: library, runs: runs, floor: floor, executable: executable))
    return rows
}

/// Runs the C host with `arguments`: nil if it fails; else the number after `prefix` on its
/// output's line that starts with it (0 when `prefix` is nil).
func runCHost(_ host: String, _ arguments: String, expecting prefix: String?) -> Double? {
    guard let pipe = popen("'\(host)' \(arguments)", "r") else { return nil }
    let (output, status) = drain(pipe)
    guard status == 0 else { return nil }
    guard let prefix else { return 0 }
    return output.split(separator: "\n").first { $0.hasPrefix(prefix) }.flatMap { Double($0.dropFirst(prefix.count)) }
}

/// The start-up with a stored session whose key is in the Secret Service: a gnome-keyring-daemon
/// of its own (a fresh keyring in a temporary HOME, unlocked) on a private session bus
/// (dbus-run-session), never the desktop's; the runs in a process of this executable
/// (`--startup-host`) inside that session. The floor is the one measured in this process.
func secretServiceStartupRow(library: String, runs: Int, floor: Double, executable: String) -> Row {
    let name = "start-up, sf_runtime_create → first on_state, stored session (Secret Service)"
    func absent(_ why: String) -> Row {
        Row(name: name, ours: .nan, floor: floor, unit: "ms", baseline: "uv_loop_init + thread + async", note: why)
    }
    for tool in ["dbus-run-session", "dbus-send", "gnome-keyring-daemon"] where !onPath(tool) {
        return absent("no \(tool) (Debian: apt-get install dbus gnome-keyring libsecret-1-0)")
    }
    let directory = temporaryDirectory("sessionflow-bench-keyring")
    defer { removeTree(directory) }
    let root = parentDirectory(parentDirectory(parentDirectory(parentDirectory(#filePath))))
    let command = "bash '\(root)/scripts/with-private-keyring.sh' '\(directory)/home' "
        + "'\(executable)' --startup-host '\(library)' '\(directory)' \(runs) 2>&1"
    guard let pipe = popen(command, "r") else { return absent("popen failed") }
    let output = drain(pipe).output
    let lines = output.split(separator: "\n")
    let times = lines.filter { $0.hasPrefix("STARTUP ") }.compactMap { Double($0.dropFirst(8)) }
    guard times.count == runs else {
        let why = lines.first { $0.hasPrefix("FAIL") }.map(String.init) ?? "the Secret Service host printed: \(output.prefix(200))"
        return absent(why)
    }
    return Row(name: name, ours: median(times), floor: floor, unit: "ms", baseline: "uv_loop_init + thread + async")
}

/// `--startup-host LIBRARY DIRECTORY RUNS`, inside the private session bus: each run a store of
/// its own in DIRECTORY, its key in the Secret Service; prints "STARTUP <ms>" per run.
func startupHost(library: String, directory: String, runs: Int) -> Int32 {
    for run in 0..<runs {
        let store = directory + "/store-\(run)"
        var value = 0.0
        var error = [CChar](repeating: 0, count: 256)
        guard bl_sf_startup(library, store, 1, 1, &value, &error, error.count) == 0 else {
            print("FAIL \(string(fromC: error))")
            return 1
        }
        print("STARTUP \(value / 1e6)")
    }
    return 0
}

/// Whether `tool` is an executable on PATH.
func onPath(_ tool: String) -> Bool {
    let path = getenv("PATH").map { String(cString: $0) } ?? "/usr/bin:/bin"
    return path.split(separator: ":").contains { access("\($0)/\(tool)", X_OK) == 0 }
}

/// The idle host against the idle floor: two processes of this executable (`--idle-host`),
/// at once, each sleeping `seconds`.
func idleRows(library: String, shipped: String?, seconds: Double, executable: String) -> [Row] {
    let directory = temporaryDirectory("sessionflow-bench-idle")
    defer { removeTree(directory) }
    let shippedDirectory = temporaryDirectory("sessionflow-bench-idle-shipped")
    defer { removeTree(shippedDirectory) }
    // The host is C alone (Tools/CHost/c_host.c, compiled now): a Swift process would have
    // the Swift runtime mapped and partly touched on the floor's side too, and RSS above that
    // floor would leave out what a C host pays for the runtime the library brings (measured:
    // 8.1 MiB above a Swift floor, 15.1 above a C one, the same library). Without a C compiler
    // the rows say so and the Swift process stands in.
    let hostDirectory = temporaryDirectory("sessionflow-bench-c-host")
    defer { removeTree(hostDirectory) }
    let host = cHost(in: hostDirectory)
    func start(_ arguments: String) -> UnsafeMutablePointer<FILE>? {
        if let host { return popen("'\(host)' idle \(arguments) \(seconds)", "r") }
        return popen("'\(executable)' --idle-host \(arguments) \(seconds)", "r")
    }
    // All at once, for the same seconds (idle processes do not compete).
    let oursPipe = start("'\(library)' '\(directory)'")
    let shippedPipe = shipped.map { start("'\($0)' '\(shippedDirectory)'") }
    let floorPipe = start("- -")
    func read(_ pipe: UnsafeMutablePointer<FILE>?) -> IdleReading? {
        guard let pipe else { return nil }
        let output = drain(pipe).output
        guard let line = output.split(separator: "\n").first(where: { $0.hasPrefix("IDLE ") }) else { return nil }
        let fields = line.split(separator: " ").dropFirst().compactMap { Double($0) }
        guard fields.count == 5 else { return nil }
        return IdleReading(switches: fields[0], cpu: fields[1], rss: fields[2], library: fields[3], anonymous: fields[4])
    }
    let ours = read(oursPipe), floor = read(floorPipe)
    let shippedReading = shippedPipe.flatMap { read($0) }
    let perMinute = 60 / seconds
    let flatters = host == nil ? "no cc: a Swift host (flatters RSS)" : nil
    let why = ours == nil || floor == nil ? "the idle host failed" : flatters
    let extraWakeUps = ours.flatMap { o in floor.map { (o.switches - $0.switches) * perMinute } } ?? .nan
    var rows = [
        Row(name: "idle, signed in (1-hour token): context switches per minute",
            ours: ours.map { $0.switches * perMinute } ?? .nan, floor: floor.map { $0.switches * perMinute } ?? .nan,
            unit: "", baseline: "libuv loop + 1-hour timer", note: why),
        Row(name: "  … above the floor (target: ≤ 2 per minute)", ours: extraWakeUps, floor: .nan, unit: "",
            target: .atMost(2), note: why),
        Row(name: "idle, CPU time per minute", ours: ours.map { $0.cpu * perMinute } ?? .nan,
            floor: floor.map { $0.cpu * perMinute } ?? .nan, unit: "ms", baseline: "libuv loop + 1-hour timer", note: why),
    ]
    // The target (≤ 8 MiB) is the shipped library's: what a host installs (Bindings/install.sh,
    // the packages). The development build's row is for comparison — the Swift runtime in
    // shared libraries of its own, every one of them loaded whole.
    rows += memoryRows(ours, floor, what: " (development build)", target: shipped == nil ? .atMost(8) : nil, why: why)
    if shipped != nil {
        let why = shippedReading == nil || floor == nil ? "the idle host failed" : flatters
        rows += memoryRows(shippedReading, floor, what: ", the shipped library", target: .atMost(8), why: why)
    }
    return rows
}

/// What one idle host printed (`IDLE switches cpu-ms rss-kib library-kib anonymous-kib`).
struct IdleReading {
    var switches, cpu, rss, library, anonymous: Double
}

/// RSS above the floor, the library's mapped pages and the anonymous memory above the floor's.
private func memoryRows(_ ours: IdleReading?, _ floor: IdleReading?, what: String, target: Row.Target?, why: String?) -> [Row] {
    [
        Row(name: "idle, RSS above a libuv + libcurl host\(what)",
            ours: ours.flatMap { o in floor.map { (o.rss - $0.rss) / 1024 } } ?? .nan,
            floor: .nan, unit: "MiB", target: target, note: why),
        Row(name: "  … of which libsessionflow.so's mapped pages", ours: ours.map { $0.library / 1024 } ?? .nan,
            floor: .nan, unit: "MiB", note: why),
        // The rest of the RSS above is clean file pages (the library's code, the Swift runtime's
        // and FoundationEssentials' that the floor does not touch): shared by every process that
        // maps them, and dropped by the kernel under pressure. Anonymous memory is the session's own.
        Row(name: "  … anonymous (private) memory above the floor",
            ours: ours.flatMap { o in floor.map { (o.anonymous - $0.anonymous) / 1024 } } ?? .nan,
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
    // Interleaved, so that the disk's moods (other writers, the journal) hit all alike.
    var ours: [Double] = [], floor: [Double] = [], spare: [Double] = []
    for index in 1...writes {
        var start = bl_now_ns()
        try store.write(session(index))
        ours.append(Double(bl_now_ns() - start) / 1000)
        start = bl_now_ns()
        durableWrite(size, in: directory)
        floor.append(Double(bl_now_ns() - start) / 1000)
        start = bl_now_ns()
        bl_spare_write(directory, Int32(size))
        spare.append(Double(bl_now_ns() - start) / 1000)
    }
    return [
        Row(
            name: "store write, one session record (\(size) bytes: seal + atomic replace + fsync)",
            ours: median(ours), floor: median(floor), unit: "µs", target: .ratioAtMost(1.3),
            baseline: "write + fsync + rename + fsync(dir)"),
        // The store replaces its file through a spare (no inode made or freed per write): the
        // same file operations in C are the floor of what is ours alone — sealing, the write
        // lock, reading the record and the key, the orphan scan.
        Row(
            name: "  … against the store's own file operations in C",
            ours: median(ours), floor: median(spare), unit: "µs",
            baseline: "fsync(dir) + pwrite + fsync over a spare + exchange + fsync(dir)"),
    ]
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

/// The C host (Tools/CHost/c_host.c, with the C baseline's host code) built into `directory`
/// with the system's C compiler (`CC`, else `cc`); nil if that fails.
func cHost(in directory: String) -> String? {
    let tools = parentDirectory(parentDirectory(parentDirectory(#filePath)))
    let baseline = tools + "/Sources/CBaseline"
    let output = directory + "/c-host"
    let compiler = getenv("CC").map { String(cString: $0) } ?? "cc"
    let command = "'\(compiler)' -O2 -I'\(baseline)/include' -o '\(output)' '\(tools)/CHost/c_host.c' "
        + "'\(baseline)/sessionflow_host.c' '\(baseline)/baseline.c' -luv -ldl -lpthread >/dev/null 2>&1"
    return system(command) == 0 && access(output, X_OK) == 0 ? output : nil
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
