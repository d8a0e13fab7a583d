// fleet-sim: the refresh policy at scale, in virtual time, no network.
//
// N clients against one authorization server with a capacity (requests per second; above it a
// request fails as 503, which the client treats as a transient failure and backs off). Every
// client decision comes from SessionCore's real `RefreshPolicy` (`proactiveDelay` after a
// success, `backoffDelay` after a failure), fed by a seeded random generator, and follows the
// refresh state machine's rules: a success stores the new lifetime, sets `lastRefresh` and
// resets the failure count; a transient failure counts one more consecutive failure and arms
// the backoff. (`RefreshStateMachine` itself is internal to SessionCore and carries a logger,
// secrets and waiters per session; this tool replays its refresh arithmetic, not its
// bookkeeping.) `--law old` replays the law before issue 16 (a copy, below) and `--law kubelet`
// a uniform 70–90 % proactive window, for comparison.
//
// Two scenarios, each measured per second at the server:
// - issuance: every client gets its tokens in the same second (after a deploy or an outage);
//   after the first refresh wave, peak ≤ 3 × mean, at ≤ 1.3 × the minimum refreshes per client
//   per hour (one per token lifetime).
// - outage: every client needs a refresh in the same second and the server is down for 10
//   minutes; the recovery peak (requests per second in the 5 minutes after it comes back)
//   against 1.5 × N / backoff cap.
//
//   swift build -c release --package-path Tools --product fleet-sim && Tools/.build/release/fleet-sim

import SessionCore
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

// MARK: - Options

struct Options {
    var clients = 100_000
    var hours = 12.0
    var seed: UInt64 = 16
    var laws: [LawName] = [.old, .new]
    var scenarios: [Scenario] = [.issuance, .outage]
    var capacity = 1_000
    var lifetime = 3600.0
    var outageMinutes = 10.0
    var json = false
    var width = 60
    var proactiveJitter: Double? = nil
    var backoffJitter: Double? = nil

    static let usage = """
        usage: fleet-sim [--clients N] [--hours H] [--seed S] [--law old|new|kubelet|both|all]
                         [--scenario issuance|outage|both] [--capacity REQ_PER_S]
                         [--lifetime SECONDS] [--outage-minutes M] [--width COLUMNS]
                         [--proactive-jitter F] [--backoff-jitter F] [--json]
        """

    static func parse(_ arguments: [String]) -> Options {
        var options = Options()
        var iterator = arguments.makeIterator()
        func value(_ name: String) -> String {
            guard let v = iterator.next() else { fail("\(name) needs a value") }
            return v
        }
        func number<T: LosslessStringConvertible>(_ name: String, _: T.Type) -> T {
            let text = value(name)
            guard let v = T(text) else { fail("\(name): not a number: \(text)") }
            return v
        }
        while let argument = iterator.next() {
            switch argument {
            case "--clients": options.clients = number(argument, Int.self)
            case "--hours": options.hours = number(argument, Double.self)
            case "--seed": options.seed = number(argument, UInt64.self)
            case "--capacity": options.capacity = number(argument, Int.self)
            case "--lifetime": options.lifetime = number(argument, Double.self)
            case "--outage-minutes": options.outageMinutes = number(argument, Double.self)
            case "--width": options.width = number(argument, Int.self)
            case "--proactive-jitter": options.proactiveJitter = number(argument, Double.self)
            case "--backoff-jitter": options.backoffJitter = number(argument, Double.self)
            case "--json": options.json = true
            case "--law":
                switch value(argument) {
                case "old": options.laws = [.old]
                case "new": options.laws = [.new]
                case "kubelet": options.laws = [.kubelet]
                case "both": options.laws = [.old, .new]
                case "all": options.laws = [.old, .kubelet, .new]
                case let other: fail("--law: old, new, kubelet, both (old and new) or all, not \(other)")
                }
            case "--scenario":
                switch value(argument) {
                case "issuance": options.scenarios = [.issuance]
                case "outage": options.scenarios = [.outage]
                case "both": options.scenarios = [.issuance, .outage]
                case let other: fail("--scenario: issuance, outage or both, not \(other)")
                }
            case "-h", "--help": print(usage); exit(0)
            default: fail("unknown argument \(argument)\n\(usage)")
            }
        }
        if options.clients < 1 || options.hours <= 0 || options.capacity < 1 || options.lifetime <= 0
            || options.outageMinutes < 0 || options.width < 10
        {
            fail("clients, hours, capacity and lifetime must be positive, width at least 10")
        }
        return options
    }
}

enum LawName: String { case old, new, kubelet }
enum Scenario: String { case issuance, outage }

func fail(_ message: String) -> Never {
    var stderr = StandardError()
    print("fleet-sim: \(message)", to: &stderr)
    exit(2)
}

struct StandardError: TextOutputStream {
    mutating func write(_ string: String) {
        var bytes = Array(string.utf8)
        _ = bytes.withUnsafeMutableBytes { Glibc.write(2, $0.baseAddress, $0.count) }
    }
}

// MARK: - The laws

/// What a client asks the policy.
protocol Law {
    var policy: RefreshPolicy { get }
    func proactiveDelay(now: Duration, expiresAt: Duration, lifetime: Duration, lastRefresh: Duration?, unitRandom: Double) -> Duration
    func backoffDelay(failures: Int, retryAfter: Duration?, unitRandom: Double) -> Duration
}

/// SessionCore's policy as it is: the law under test.
struct CurrentLaw: Law {
    let policy: RefreshPolicy
    func proactiveDelay(now: Duration, expiresAt: Duration, lifetime: Duration, lastRefresh: Duration?, unitRandom: Double) -> Duration {
        policy.proactiveDelay(now: now, expiresAt: expiresAt, lifetime: lifetime, lastRefresh: lastRefresh, unitRandom: unitRandom)
    }
    func backoffDelay(failures: Int, retryAfter: Duration?, unitRandom: Double) -> Duration {
        policy.backoffDelay(failures: failures, retryAfter: retryAfter, unitRandom: unitRandom)
    }
}

/// The law before issue 16, copied from RefreshPolicy at commit cbd7bba for comparison: the
/// proactive refresh up to 10 % of the margin before expiry − margin, each backoff delay up
/// to 10 % shorter than its base. Margin, minimum interval and base backoff are the policy's.
struct OldLaw: Law {
    let policy: RefreshPolicy
    let proactiveJitter = 0.1
    let backoffJitter = 0.1
    func proactiveDelay(now: Duration, expiresAt: Duration, lifetime: Duration, lastRefresh: Duration?, unitRandom: Double) -> Duration {
        let margin = policy.effectiveMargin(lifetime: lifetime)
        let jitter = margin * (proactiveJitter * unitRandom)
        var due = expiresAt - margin - jitter
        if let lastRefresh { due = max(due, lastRefresh + policy.minimumInterval) }
        return max(due - now, .zero)
    }
    func backoffDelay(failures: Int, retryAfter: Duration?, unitRandom: Double) -> Duration {
        let base = policy.baseBackoff(failures: failures)
        let jittered = base - base * (backoffJitter * unitRandom)
        return max(jittered, min(retryAfter ?? .zero, policy.maximumRetryAfter))
    }
}

/// For comparison only: the proactive refresh uniform in 70–90 % of the lifetime (as kubelet's
/// certificate manager rotates), `minimumInterval` kept; the backoff is the current policy's.
struct KubeletLaw: Law {
    let policy: RefreshPolicy
    func proactiveDelay(now: Duration, expiresAt: Duration, lifetime: Duration, lastRefresh: Duration?, unitRandom: Double) -> Duration {
        var due = expiresAt - lifetime + lifetime * (0.7 + 0.2 * unitRandom)
        if let lastRefresh { due = max(due, lastRefresh + policy.minimumInterval) }
        return max(due - now, .zero)
    }
    func backoffDelay(failures: Int, retryAfter: Duration?, unitRandom: Double) -> Duration {
        policy.backoffDelay(failures: failures, retryAfter: retryAfter, unitRandom: unitRandom)
    }
}

// MARK: - Random numbers and the event queue

/// SplitMix64: small, fast, seeded, good enough for jitter.
struct SplitMix64 {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
    /// A number in [0, 1).
    mutating func unit() -> Double { Double(next() >> 11) * 0x1p-53 }
}

/// A binary min-heap of (time, client): each client has exactly one pending attempt.
struct EventQueue {
    private var times: [Double] = []
    private var clients: [Int32] = []
    var isEmpty: Bool { times.isEmpty }
    var count: Int { times.count }

    init(capacity: Int) {
        times.reserveCapacity(capacity)
        clients.reserveCapacity(capacity)
    }

    mutating func push(_ time: Double, _ client: Int32) {
        times.append(time)
        clients.append(client)
        var i = times.count - 1
        while i > 0 {
            let parent = (i - 1) / 2
            if times[parent] <= time { break }
            times[i] = times[parent]; clients[i] = clients[parent]
            i = parent
        }
        times[i] = time; clients[i] = client
    }

    mutating func pop() -> (time: Double, client: Int32) {
        let top = (times[0], clients[0])
        let lastTime = times.removeLast(), lastClient = clients.removeLast()
        let n = times.count
        if n > 0 {
            var i = 0
            while true {
                var child = 2 * i + 1
                if child >= n { break }
                if child + 1 < n && times[child + 1] < times[child] { child += 1 }
                if lastTime <= times[child] { break }
                times[i] = times[child]; clients[i] = clients[child]
                i = child
            }
            times[i] = lastTime; clients[i] = lastClient
        }
        return top
    }
}

extension Duration {
    var seconds: Double {
        let c = components
        return Double(c.seconds) + Double(c.attoseconds) * 1e-18
    }
}

// MARK: - The simulation

struct Result {
    let law: LawName
    let scenario: Scenario
    let clients: Int
    let seconds: Int
    let capacity: Int
    let lifetime: Double
    /// Requests that reached the server (or, while it is down, tried to), per second.
    let requests: [Int32]
    /// Of those, the ones that got tokens.
    let successes: [Int32]
    /// When the wave the criteria start after ended (every client past its first cycle), in s.
    let firstCycleEnd: Double?
    let recoveryStart: Double?
    let recoveredAt: Double?
    let backoffCap: Double
    /// The mean time between two refreshes of one client (s): the fleet's refresh cost.
    let meanInterval: Double?
    let events: Int
    let elapsed: Duration

    var totalRequests: Int { requests.reduce(0) { $0 + Int($1) } }

    /// Peak and mean requests per second from `start` (s) to the end.
    func window(from start: Double, to end: Double? = nil) -> (peak: Int, mean: Double, successes: Int, seconds: Int) {
        let from = min(max(Int(start.rounded(.up)), 0), seconds)
        let to = min(Int(end ?? Double(seconds)), seconds)
        guard to > from else { return (0, 0, 0, 0) }
        var peak: Int32 = 0, sum = 0, ok = 0
        for s in from..<to {
            peak = max(peak, requests[s]); sum += Int(requests[s]); ok += Int(successes[s])
        }
        return (Int(peak), Double(sum) / Double(to - from), ok, to - from)
    }
}

func simulate(_ options: Options, law lawName: LawName, scenario: Scenario) -> Result {
    let started = ContinuousClock.now
    var policy = RefreshPolicy()
    if let j = options.proactiveJitter { policy.proactiveJitter = j }
    if let j = options.backoffJitter { policy.backoffJitter = j }
    if let problem = policy.problem { fail(problem) }
    let law: any Law = switch lawName {
    case .new: CurrentLaw(policy: policy)
    case .old: OldLaw(policy: policy)
    case .kubelet: KubeletLaw(policy: policy)
    }

    let n = options.clients
    let horizon = options.hours * 3600
    let seconds = Int(horizon.rounded(.up))
    let lifetime = Duration.seconds(options.lifetime)
    let outageEnd = scenario == .outage ? options.outageMinutes * 60 : -1
    var random = SplitMix64(state: options.seed &* 0x2545_F491_4F6C_DD1D &+ (scenario == .outage ? 1 : 0))

    var expiresAt = [Duration](repeating: .zero, count: n)
    var lastRefresh = [Duration?](repeating: nil, count: n)
    var failures = [Int32](repeating: 0, count: n)
    var refreshed = [Int32](repeating: 0, count: n)
    var firstSuccess = [Double](repeating: 0, count: n)
    var lastSuccess = [Double](repeating: 0, count: n)
    var requests = [Int32](repeating: 0, count: seconds)
    var successes = [Int32](repeating: 0, count: seconds)
    var queue = EventQueue(capacity: n)

    // Every client starts in the same second.
    for client in 0..<n {
        let t = random.unit()
        switch scenario {
        case .issuance:
            // Signed in at t: the proactive refresh is scheduled from the fresh tokens.
            let now = Duration.seconds(t)
            expiresAt[client] = now + lifetime
            lastRefresh[client] = now
            let delay = law.proactiveDelay(
                now: now, expiresAt: now + lifetime, lifetime: lifetime, lastRefresh: now, unitRandom: random.unit())
            queue.push(t + delay.seconds, Int32(client))
        case .outage:
            // A session whose token is due: refreshed at once.
            expiresAt[client] = Duration.seconds(t)
            queue.push(t, Int32(client))
        }
    }

    // The milestone the criteria start after: every client refreshed once more after the start
    // (issuance: its first proactive refresh; outage: its first refresh after the recovery, then
    // one proactive refresh on top).
    let cycleTarget: Int32 = scenario == .issuance ? 1 : 2
    var pastCycle = 0
    var firstCycleEnd: Double?
    var recovered = 0
    var recoveredAt: Double?
    var served = 0, servedSecond = -1
    var events = 0

    while !queue.isEmpty {
        let (t, c) = queue.pop()
        if t >= horizon { break }
        events += 1
        let client = Int(c)
        let second = Int(t)
        requests[second] += 1
        if second != servedSecond { servedSecond = second; served = 0 }
        let now = Duration.seconds(t)
        let up = t >= outageEnd
        if up && served < options.capacity {
            // Tokens: the state machine's `apply`.
            served += 1
            successes[second] += 1
            expiresAt[client] = now + lifetime
            lastRefresh[client] = now
            failures[client] = 0
            refreshed[client] += 1
            lastSuccess[client] = t
            if refreshed[client] == 1 {
                firstSuccess[client] = t
                recovered += 1
                if recovered == n { recoveredAt = t }
            }
            if refreshed[client] == cycleTarget {
                pastCycle += 1
                if pastCycle == n { firstCycleEnd = t }
            }
            let delay = law.proactiveDelay(
                now: now, expiresAt: expiresAt[client], lifetime: lifetime, lastRefresh: lastRefresh[client],
                unitRandom: random.unit())
            queue.push(t + delay.seconds, c)
        } else {
            // Down, or over capacity (503 without Retry-After): a transient failure.
            failures[client] += 1
            let delay = law.backoffDelay(failures: Int(failures[client]), retryAfter: nil, unitRandom: random.unit())
            queue.push(t + delay.seconds, c)
        }
    }
    // The mean time between one client's refreshes, over every client with two or more.
    var intervals = 0, spanned = 0.0
    for client in 0..<n where refreshed[client] > 1 {
        intervals += Int(refreshed[client]) - 1
        spanned += lastSuccess[client] - firstSuccess[client]
    }
    return Result(
        law: lawName, scenario: scenario, clients: n, seconds: seconds, capacity: options.capacity,
        lifetime: options.lifetime, requests: requests, successes: successes, firstCycleEnd: firstCycleEnd,
        recoveryStart: scenario == .outage ? outageEnd : nil, recoveredAt: recoveredAt,
        backoffCap: policy.maximumBackoff.seconds, meanInterval: intervals > 0 ? spanned / Double(intervals) : nil,
        events: events, elapsed: ContinuousClock.now - started)
}

// MARK: - Report

struct Figures {
    var peakAfterFirstCycle = 0
    var meanAfterFirstCycle = 0.0
    var peakToMean = 0.0
    var refreshesPerClientHour = 0.0
    var minimumPerClientHour = 0.0
    var refreshRatio = 0.0
    var firstWavePeak = 0
    var recoveryPeak = 0
    var recoveryBound = 0.0
    var recoveryRatio = 0.0

    var meetsSpread: Bool { peakToMean <= 3 && refreshRatio <= 1.3 }
    var meetsRecovery: Bool { Double(recoveryPeak) <= recoveryBound }
}

func figures(_ r: Result) -> Figures {
    var f = Figures()
    f.minimumPerClientHour = 3600 / r.lifetime
    if let end = r.firstCycleEnd {
        let w = r.window(from: end)
        f.peakAfterFirstCycle = w.peak
        f.meanAfterFirstCycle = w.mean
        f.peakToMean = w.mean > 0 ? Double(w.peak) / w.mean : 0
        f.refreshesPerClientHour = r.meanInterval.map { 3600 / $0 } ?? 0
        f.refreshRatio = f.refreshesPerClientHour / f.minimumPerClientHour
        f.firstWavePeak = r.window(from: r.recoveryStart ?? 0, to: end).peak
    }
    if let start = r.recoveryStart {
        f.recoveryPeak = r.window(from: start, to: start + 300).peak
        f.recoveryBound = 1.5 * Double(r.clients) / r.backoffCap
        f.recoveryRatio = Double(f.recoveryPeak) / (Double(r.clients) / r.backoffCap)
    }
    return f
}

func fmt(_ x: Double, _ digits: Int = 2) -> String {
    guard x.isFinite else { return "\(x)" }
    var scale = 1.0
    for _ in 0..<digits { scale *= 10 }
    let v = (x * scale).rounded() / scale
    var s = "\(v)"
    if let dot = s.firstIndex(of: ".") {
        let decimals = s.distance(from: dot, to: s.endIndex) - 1
        if decimals < digits { s += String(repeating: "0", count: digits - decimals) }
    } else if digits > 0 {
        s += "." + String(repeating: "0", count: digits)
    }
    return s
}

func clock(_ seconds: Double) -> String {
    let s = Int(seconds)
    let h = s / 3600, m = (s % 3600) / 60, sec = s % 60
    func two(_ x: Int) -> String { x < 10 ? "0\(x)" : "\(x)" }
    return "\(h):\(two(m)):\(two(sec))"
}

/// Requests per second from `start` to `end` (s): each column the busiest second of its slice,
/// in `height` rows. The scale tops at the busiest second once the server is up (an outage's
/// own retries against a dead server would flatten the rest); a column above it ends in `^`.
func plot(_ r: Result, from start: Int = 0, to end: Int? = nil, width: Int, height: Int = 8) -> String {
    let end = min(end ?? r.seconds, r.seconds)
    let per = max(1, (end - start + width - 1) / width)
    var columns: [Int32] = []
    var s = start
    while s < end {
        columns.append(r.requests[s..<min(s + per, end)].max() ?? 0)
        s += per
    }
    let up = max(Int((r.recoveryStart ?? 0).rounded(.up)), start)
    let top = max(Int(r.requests[min(up, end)..<end].max() ?? 1), 1)
    let label = "\(top)".count
    var lines: [String] = []
    for row in stride(from: height, through: 1, by: -1) {
        let threshold = Double(top) * (Double(row) - 0.5) / Double(height)
        let axis = row == height ? "\(top)" : row == 1 ? "0" : ""
        var line = String(repeating: " ", count: label - axis.count) + axis + " |"
        for c in columns {
            line += Int(c) > top && row == height ? "^" : Double(c) >= threshold ? "#" : " "
        }
        lines.append(line)
    }
    lines.append(String(repeating: " ", count: label) + " +" + String(repeating: "-", count: columns.count))
    let first = clock(Double(start)), last = clock(Double(end))
    let pad = max(1, columns.count - first.count - last.count)
    lines.append(String(repeating: " ", count: label) + "  " + first + String(repeating: " ", count: pad) + last
        + "  (busiest second of each \(per) s, requests/s)")
    return lines.joined(separator: "\n")
}

func text(_ r: Result, _ f: Figures, width: Int) -> String {
    var out = "== \(r.scenario.rawValue), \(r.law.rawValue) law: \(r.clients) clients, \(Int(r.lifetime)) s tokens, "
    out += "capacity \(r.capacity)/s, \(clock(Double(r.seconds))) simulated\n"
    if let start = r.recoveryStart {
        out += "  outage until \(clock(start)); recovery peak \(f.recoveryPeak)/s in the 5 min after "
        out += "(bound 1.5 × N / cap = \(Int(f.recoveryBound))/s: \(fmt(f.recoveryRatio)) × N/cap) "
        out += f.meetsRecovery ? "ok\n" : "OVER\n"
        if let at = r.recoveredAt { out += "  every client had tokens again at \(clock(at))\n" }
    }
    if let end = r.firstCycleEnd {
        out += r.recoveryStart == nil ? "  first wave over" : "  recovery and the next proactive wave over"
        out += " at \(clock(end)) (peak \(f.firstWavePeak)/s); after it: peak \(f.peakAfterFirstCycle)/s, "
        out += "mean \(fmt(f.meanAfterFirstCycle))/s, peak/mean \(fmt(f.peakToMean)) (≤ 3 "
        out += f.peakToMean <= 3 ? "ok)\n" : "OVER)\n"
        out += "  refreshes per client per hour \(fmt(f.refreshesPerClientHour, 3)) vs minimum \(fmt(f.minimumPerClientHour, 3)): "
        out += "\(fmt(f.refreshRatio, 3)) × (≤ 1.3 " + (f.refreshRatio <= 1.3 ? "ok)\n" : "OVER)\n")
    } else {
        out += "  the first wave did not end within the run\n"
    }
    out += "  \(r.totalRequests) requests, \(r.events) events in \(fmt(Double(r.elapsed.components.seconds) + Double(r.elapsed.components.attoseconds) * 1e-18, 2)) s\n"
    out += plot(r, width: width) + "\n"
    if let start = r.recoveryStart {
        out += "  the recovery, closer:\n"
        out += plot(r, from: max(Int(start) - 60, 0), to: Int(start) + 300, width: width) + "\n"
    }
    return out
}

func json(_ r: Result, _ f: Figures) -> String {
    var fields: [(String, String)] = [
        ("scenario", "\"\(r.scenario.rawValue)\""), ("law", "\"\(r.law.rawValue)\""),
        ("clients", "\(r.clients)"), ("lifetimeSeconds", fmt(r.lifetime, 0)), ("capacity", "\(r.capacity)"),
        ("simulatedSeconds", "\(r.seconds)"), ("requests", "\(r.totalRequests)"),
    ]
    if let end = r.firstCycleEnd {
        fields += [
            ("firstCycleEndSeconds", fmt(end, 1)), ("firstWavePeak", "\(f.firstWavePeak)"),
            ("peakAfterFirstCycle", "\(f.peakAfterFirstCycle)"), ("meanAfterFirstCycle", fmt(f.meanAfterFirstCycle, 3)),
            ("peakToMean", fmt(f.peakToMean, 3)), ("refreshesPerClientHour", fmt(f.refreshesPerClientHour, 4)),
            ("minimumRefreshesPerClientHour", fmt(f.minimumPerClientHour, 4)), ("refreshRatio", fmt(f.refreshRatio, 4)),
            ("meetsSpread", "\(f.meetsSpread)"),
        ]
    }
    if let start = r.recoveryStart {
        fields += [
            ("recoveryStartSeconds", fmt(start, 1)), ("recoveryPeak", "\(f.recoveryPeak)"),
            ("recoveryBound", fmt(f.recoveryBound, 1)), ("recoveryPeakOverNPerCap", fmt(f.recoveryRatio, 3)),
            ("meetsRecovery", "\(f.meetsRecovery)"),
        ]
        if let at = r.recoveredAt { fields.append(("recoveredAtSeconds", fmt(at, 1))) }
    }
    fields.append(("requestsPerSecond", "[" + r.requests.map { "\($0)" }.joined(separator: ",") + "]"))
    return "{" + fields.map { "\"\($0.0)\":\($0.1)" }.joined(separator: ",") + "}"
}

let options = Options.parse(Array(CommandLine.arguments.dropFirst()))
var results: [String] = []
for scenario in options.scenarios {
    for law in options.laws {
        let r = simulate(options, law: law, scenario: scenario)
        let f = figures(r)
        if options.json { results.append(json(r, f)) } else { print(text(r, f, width: options.width)) }
    }
}
if options.json { print("[" + results.joined(separator: ",\n") + "]") }
