// SessionFlow against the raw libuv floor (CBaseline, C in this package), the Swift peers
// a user would pick instead and Node.js's EventEmitter (when node is installed), measured in one
// run; every figure printed with its ratio to the floor of the same run.
//
//   bash scripts/bench.sh                       builds the release products below, then runs
//   .build/release/loopflow-bench               full sizes (about 2 minutes)
//   .build/release/loopflow-bench --smoke       tiny sizes (the test suite runs this so it cannot rot)
//   ... --json                                  one JSON array instead of the table
//   ... --only latency,fanout,...               some sections: latency fanout setrate subscribe
//                                               memory allocations singleflight errortext dpop cli
//                                               token startup store refresh idle (HostCosts.swift,
//                                               RefreshCost.swift; idle takes 60 s)
//   ... --no-peers                              without the OpenCombine, AsyncStream and Node.js rows
//   ... --node PATH, --node-script PATH         the node executable (default $SESSIONFLOW_NODE, else
//                                               node on PATH; absent: the Node rows say "node not
//                                               installed") and Tools/node/eventemitter-bench.js
//                                               (default $SESSIONFLOW_NODE_SCRIPT, else found
//                                               above this executable); NodePeer.swift
//   ... --sessionflow-lib PATH                  the libsessionflow.so for the C fan-out
//                                               (default: beside this executable)
//   ... --shipped-lib PATH                      the library as Bindings/install.sh ships it (the
//                                               runtime linked in): idle rows of its own, in the
//                                               same 60 s (absent: no such rows)
//   ... --watch-session PATH                    the CLI for the cli section (token vs --version,
//                                               stripped size; default: beside this executable;
//                                               absent: the rows say so); CLICost.swift
//
// Progress and skipped measurements go to stderr; stdout carries only the report.
import CBaseline
import LoopFlow

#if canImport(Glibc)
import Glibc
#endif

let arguments = CommandLine.arguments
// A process of its own for the idle rows (HostCosts.swift): --idle-host LIBRARY|- STORE|- SECONDS.
if arguments.count == 5, arguments[1] == "--idle-host", let seconds = Double(arguments[4]) {
    exit(bl_idle_host(arguments[2] == "-" ? nil : arguments[2], arguments[3], seconds))
}
// The Secret Service start-up, inside a private session bus (HostCosts.swift):
// --startup-host LIBRARY DIRECTORY RUNS.
if arguments.count == 5, arguments[1] == "--startup-host", let runs = Int(arguments[4]) {
    exit(startupHost(library: arguments[2], directory: arguments[3], runs: runs))
}
let smoke = arguments.contains("--smoke")
let json = arguments.contains("--json")
let peers = !arguments.contains("--no-peers")

func option(_ name: String) -> String? {
    guard let index = arguments.firstIndex(of: name), index + 1 < arguments.count else { return nil }
    return arguments[index + 1]
}

let sections = [
    "latency", "fanout", "setrate", "subscribe", "memory", "allocations", "singleflight", "errortext", "dpop", "cli",
    "token", "startup", "idle", "store", "refresh",
]
let only = option("--only").map { Set($0.split(separator: ",").map(String.init)) } ?? Set(sections)
if let unknown = only.subtracting(sections).first {
    note("loopflow-bench: unknown section '\(unknown)' (known: \(sections.joined(separator: ", ")))")
    exit(64)
}
let directory = executableDirectory()
let sessionFlowLibrary = option("--sessionflow-lib") ?? directory + "/libsessionflow.so"
var node = NodePeer(nodeOption: option("--node"), scriptOption: option("--node-script"), executableDirectory: directory)
if peers, case .absent(let why) = node.availability { note("Node.js rows without figures: \(why)") }

let latencySamples = smoke ? 200 : 16_000
let latencyRounds = smoke ? 1 : 8
let fanOutSizes = smoke ? [1, 100] : [1, 100, 10_000, 1_000_000]
let fanOutUpdates = smoke ? 5 : 41
let rateSeconds = smoke ? 0.05 : 0.5
let pairs = smoke ? 1_000 : 1_000_000
let memorySubscriptions = smoke ? 10_000 : 1_000_000
let allocationUpdates = smoke ? 200 : 20_000
let callers = smoke ? 100 : 10_000
/// Samples each node process discards first (V8 compiles the hot paths meanwhile).
let nodeLatencyWarmup = smoke ? 20 : 200

/// Rows for a Node.js figure: `value`, or the reason there is none.
@MainActor func nodeRow(_ name: String, _ value: Double, floor: Double, unit: String, baseline: String = "raw libuv C") -> Row {
    Row(name: name, ours: value, floor: floor, unit: unit, baseline: baseline, note: value.isFinite ? nil : node.failure ?? "node failed")
}

var rows: [Row] = []

// First, while the heap is fresh: memory freed by later sections would be reused without
// growing the RSS and hide part of the cost.
if only.contains("memory") {
    note("bytes per subscription…")
    rows.append(try bytesPerSubscriptionRow(count: memorySubscriptions))
}

func percentiles(_ paced: Bool) -> [(String, Double)] {
    paced ? [("p50", 0.5), ("p99", 0.99), ("p99.9", 0.999)] : [("p10", 0.1), ("p50", 0.5)]
}

if only.contains("latency") {
    // Paced (the figure the targets are about): a pause after each sample lets the receiving
    // thread go idle, so each sample is a wake-up from idle, as when sets come now and then.
    // Back to back: the next set follows the previous callback at once and races the receiver
    // going idle; its p10 is the path's own cost, its median depends on who wins that race.
    for paced in [true, false] {
        note("latency (\(paced ? "paced" : "back to back"))…")
        // Interleaved rounds: machine noise hits every contender and the floor alike.
        var ours: [UInt64] = [], combine: [UInt64] = [], stream: [UInt64] = [], nodeSamples: [UInt64] = []
        var floor: [UInt64] = []
        let perRound = (paced ? latencySamples : latencySamples / 2) / latencyRounds
        for _ in 0..<latencyRounds {
            ours += try loopFlowLatencies(perRound, paced: paced)
            floor += baselineLatencies(perRound, paced: paced)
            if peers {
                combine += combineLatencies(perRound, paced: paced)
                floor += baselineLatencies(perRound, paced: paced)
                stream += asyncStreamLatencies(perRound, paced: paced)
                floor += baselineLatencies(perRound, paced: paced)
                if node.isAvailable {
                    nodeSamples += node.latencies(perRound, warmup: nodeLatencyWarmup, paced: paced)
                    floor += baselineLatencies(perRound, paced: paced)
                }
            }
        }
        floor.sort()
        let kind = paced ? "paced" : "back to back"
        for (label, samples, target) in [
            ("set→callback", ours, paced),
            ("OpenCombine CurrentValueSubject + receive(on: DispatchQueue)", combine, false),
            ("AsyncStream(.bufferingNewest(1)) + consumer task", stream, false),
        ] where !samples.isEmpty {
            let sorted = samples.sorted()
            for (name, p) in percentiles(paced) {
                rows.append(Row(
                    name: "\(label) latency \(name), \(kind)", ours: percentile(sorted, p),
                    floor: percentile(floor, p), unit: "ns",
                    target: target && (p == 0.5 || p == 0.99) ? .ratioAtMost(1.2) : nil))
            }
        }
        if peers {
            // A worker_threads Worker posts to the main thread; its 'message' listener publishes.
            let sorted = nodeSamples.sorted()
            for (name, p) in percentiles(paced) {
                rows.append(nodeRow(
                    "Node.js Worker postMessage → main-thread listener latency \(name), \(kind)",
                    sorted.isEmpty ? .nan : percentile(sorted, p), floor: percentile(floor, p), unit: "ns"))
            }
        }
    }
}

if only.contains("fanout") {
    for subscribers in fanOutSizes {
        note("fan-out, \(subscribers) subscribers…")
        let floor = baselineFanOut(subscribers, updates: fanOutUpdates)
        let label = "fan-out per callback, \(subscribers) subscriber\(subscribers == 1 ? "" : "s")"
        rows.append(Row(
            name: label, ours: try loopFlowFanOut(subscribers, updates: fanOutUpdates), floor: floor, unit: "ns",
            target: .ratioAtMost(2)))
        rows.append(Row(
            name: "  … from C through libsessionflow",
            ours: sessionFlowCFanOut(subscribers, updates: fanOutUpdates, library: sessionFlowLibrary),
            floor: floor, unit: "ns", target: .ratioAtMost(2)))
        rows.append(Row(
            name: "  … Swift closures capturing nothing (the walk's own share)",
            ours: try loopFlowFanOutWithoutCaptures(subscribers, updates: fanOutUpdates), floor: floor, unit: "ns"))
        guard peers else { continue }
        rows.append(Row(
            name: "  … OpenCombine CurrentValueSubject (sync sinks)",
            ours: combineFanOut(subscribers, updates: fanOutUpdates), floor: floor, unit: "ns"))
        rows.append(Row(
            name: "  … AsyncStream(.bufferingNewest(1)), a task each",
            ours: await asyncStreamFanOut(subscribers, updates: fanOutUpdates), floor: floor, unit: "ns"))
        let nodeFanOut = node.isAvailable ? node.fanOut(subscribers, updates: fanOutUpdates) : []
        rows.append(nodeRow(
            "  … Node.js EventEmitter (emit to sync listeners)", nodeFanOut.isEmpty ? .nan : median(nodeFanOut),
            floor: floor, unit: "ns"))
    }
}

if only.contains("setrate") {
    note("set rate…")
    for producers in [1, 4] {
        rows.append(try setRateRow(producers: producers, seconds: rateSeconds))
    }
}

if only.contains("subscribe") {
    note("subscribe+close…")
    rows += try subscribeCloseRows(pairs: pairs, batches: smoke ? 1 : 5)
    if peers {
        // The same background as ours (no other listener live): removeListener scans the
        // event's listeners from the newest, so LIFO on/off pairs never pay its O(n).
        let floor = rows.last { $0.baseline == "malloc+lock+free" }?.floor ?? .nan
        rows.append(nodeRow(
            "Node.js EventEmitter on+off (main thread)",
            node.isAvailable ? node.churn(pairs: pairs, background: 0) / 1e6 : .nan, floor: floor, unit: "M/s",
            baseline: "malloc+lock+free"))
    }
}

if only.contains("allocations") {
    note("allocations per update…")
    rows += allocationRows(updates: allocationUpdates, sizes: [1, 100], directory: directory)
}

if only.contains("singleflight") {
    note("token single-flight…")
    rows += try await singleFlightRows(callers: callers, roundTrip: .milliseconds(2))
}

if only.contains("errortext") {
    note("error description, worst case…")
    rows += errorTextRows(repetitions: smoke ? 3 : 200)
}

if only.contains("dpop") {
    note("DPoP proofs…")
    rows += dpopProofRows(repetitions: smoke ? 20 : 2_000)
}

if only.contains("cli") {
    let watchSession = option("--watch-session") ?? directory + "/watch-session"
    if access(watchSession, X_OK) == 0 {
        note("watch-session token vs --version, stripped size…")
        rows += cliRows(watchSession: watchSession, runs: smoke ? 3 : 41)
    } else {
        rows.append(Row(name: "watch-session token (valid stored token), median wall", ours: .nan, floor: .nan, unit: "ms",
                        note: "no watch-session at \(watchSession)"))
    }
}

if only.contains("token") {
    note("the valid-token path…")
    rows += try await validTokenRows(library: sessionFlowLibrary, calls: smoke ? 200 : 20_000)
}

if only.contains("startup") {
    note("start-up…")
    rows += startupRows(library: sessionFlowLibrary, runs: smoke ? 3 : 21, executable: directory + "/loopflow-bench")
}

if only.contains("store") {
    note("a store write…")
    rows += try storeWriteRows(writes: smoke ? 5 : 51)
}

if only.contains("refresh") {
    note("a refresh end to end, against curl…")
    rows += try await refreshRows(runs: smoke ? 5 : 101)
}

if only.contains("idle") {
    let seconds = smoke ? 1.0 : 60
    note("the idle host (\(Int(seconds)) s)…")
    rows += idleRows(
        library: sessionFlowLibrary, shipped: option("--shipped-lib"), seconds: seconds,
        executable: directory + "/loopflow-bench")
}

report(rows, json: json)
