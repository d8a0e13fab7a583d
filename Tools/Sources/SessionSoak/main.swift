// Soak: random sets, subscribes, closes, sign-ins, logouts and refreshes against a flaky
// authority from many threads, checking the threading and lifetime contract (docs/ARCHITECTURE.md) on
// every callback and sampling the resident memory. Exits 1 on any violation or if memory
// grows; prints the figures. One file (~460 lines) on purpose: a tool read top to bottom, each
// workload beside the checks it feeds.
//
//   session-soak [--seconds 600] [--threads 8] [--sample-every 5]
//
// Checked throughout (each breach counts as a violation, with its first few described):
//  1. every callback runs on the loop thread;
//  2. no callback of a subscription starts after its close() returned (closed off the loop);
//  3. onRelease runs exactly once per successful subscribe, after the last callback;
//  4. a state observer never gets the same value twice in a row, and the counter flow's
//     values only go up (each set is an increment): distinct and conflated, never stale;
//  5. an event observer sees each producer's events in order;
//  6. at most one terminal callback per subscription;
//  7. every accepted token request is answered exactly once, on the loop thread, with a
//     token or an error; a token is never the blank one;
//  8. single-flight: a refresh token is never sent twice at once (unless the first attempt
//     timed out, which frees the slot by design);
//  9. a session token is never handed out after logout completed in the same thread.
// At the end every subscription is closed and every release must have run.
// (Locks are pthread ones (LockedBox.swift), not Synchronization.Mutex, so ThreadSanitizer sees them.)
import Dispatch
import Logging
import LoopFlow
import SessionCore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

// MARK: options

let arguments = CommandLine.arguments
func option(_ name: String, _ fallback: Double) -> Double {
    guard let index = arguments.firstIndex(of: name), index + 1 < arguments.count,
          let value = Double(arguments[index + 1]) else { return fallback }
    return value
}
let seconds = option("--seconds", 600)
let threadCount = Int(option("--threads", 8))
let sampleEvery = option("--sample-every", max(1, min(5, seconds / 10)))

func say(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
}

func now() -> Double {
    var time = timespec()
    clock_gettime(CLOCK_MONOTONIC, &time)
    return Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
}

func residentBytes() -> Int {
    guard let file = fopen("/proc/self/statm", "r") else { return 0 }
    defer { fclose(file) }
    var buffer = [CChar](repeating: 0, count: 128)
    guard fgets(&buffer, Int32(buffer.count), file) != nil else { return 0 }
    let text = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    let fields = text.split(separator: " ")
    guard fields.count >= 2, let pages = Int(fields[1]) else { return 0 }
    return pages * sysconf(Int32(_SC_PAGESIZE))
}

// MARK: violations

final class Violations: Sendable {
    let count = Atomic<Int>(0)
    let first = LockedBox<[String]>([])

    func record(_ what: @autoclosure () -> String) {
        let number = count.add(1, ordering: .relaxed).newValue
        if number <= 10 {
            let text = what()
            first.withLockedValue { $0.append(text) }
        }
    }
}
let violations = Violations()

final class Counters: Sendable {
    let operations = Atomic<Int>(0)
    let callbacks = Atomic<Int>(0)
    let subscribes = Atomic<Int>(0)
    let closes = Atomic<Int>(0)
    let releases = Atomic<Int>(0)
    let signIns = Atomic<Int>(0)
    let logouts = Atomic<Int>(0)
    let tokenRequests = Atomic<Int>(0)
    let tokenAnswers = Atomic<Int>(0)
    let refreshes = Atomic<Int>(0)
}
let counters = Counters()

// MARK: the flaky authority

/// Answers refreshes from another thread after 0–3 ms: 75% new tokens (rotated), 20%
/// transient failures (some with Retry-After), 5% refusals (the session expires). Checks
/// single-flight: the same refresh token is never sent again while a refresh with it is in
/// flight — unless the session gave that one up (its timeout passed, or the session was
/// logged out and signed in since, which changes the token anyway).
final class FlakyAuthority: SessionAuthority {
    let timeout: Double
    let inFlight = LockedBox<[String: Double]>([:])   // refresh token → when it was sent
    let serial = Atomic<Int>(0)
    let queue = DispatchQueue(label: "soak-authority", attributes: .concurrent)

    init(timeout: Duration) {
        self.timeout = Double(timeout.components.seconds) + Double(timeout.components.attoseconds) / 1e18
    }

    func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
        counters.refreshes.add(1, ordering: .relaxed)
        let token = request.refreshToken.reveal()
        let sent = now()
        inFlight.withLockedValue { flying in
            if let earlier = flying[token], sent - earlier < timeout {
                violations.record("a second refresh with the same token while the first was in flight")
            }
            flying[token] = sent
        }
        let number = serial.add(1, ordering: .relaxed).newValue
        let roll = Int.random(in: 0..<100)
        queue.asyncAfter(deadline: .now() + .microseconds(Int.random(in: 0...3000))) { [self] in
            inFlight.withLockedValue { flying in
                if flying[token] == sent { flying[token] = nil }
            }
            if roll < 75 {
                completion.succeed(TokenGrant(
                    accessToken: Secret("soak-access-\(number)"), refreshToken: Secret("soak-refresh-\(number)"),
                    expiresIn: .milliseconds(Int64.random(in: 20...400))))
            } else if roll < 95 {
                completion.fail(.transient("flaky", retryAfter: roll < 80 ? .milliseconds(5) : nil))
            } else {
                completion.fail(.terminal())
            }
        }
    }
}

// MARK: observers

/// What one subscription has seen, checked on every callback.
final class Observer: @unchecked Sendable {
    let loop: EventLoop
    let lock = LockedBox<State>(State())
    struct State {
        var last: Int?
        var closeReturned = false
        var released = false
        var terminals = 0
        var lastPerProducer: [Int: Int] = [:]
    }

    init(loop: EventLoop) { self.loop = loop }

    func callback(_ what: String, _ body: (inout State) -> Void = { _ in }) {
        counters.callbacks.add(1, ordering: .relaxed)
        if !loop.inEventLoop { violations.record("\(what) off the loop thread") }
        lock.withLockedValue { state in
            if state.closeReturned { violations.record("\(what) after close() returned") }
            if state.released { violations.record("\(what) after release") }
            body(&state)
        }
    }

    /// A counter value: strictly increasing per observer.
    func counter(_ value: Int) {
        callback("counter") { state in
            if let last = state.last, value <= last { violations.record("counter went \(last) → \(value)") }
            state.last = value
        }
    }

    /// A session state: never twice the same in a row.
    func sessionState(_ value: SessionState) {
        let code = value == .loggedOut ? 0 : value == .loggedIn ? 1 : 2
        callback("session state") { state in
            if state.last == code { violations.record("session state \(value) delivered twice in a row") }
            state.last = code
        }
    }

    /// An event `producer * 1_000_000 + sequence`: in order per producer.
    func event(_ value: Int) {
        callback("event") { state in
            let producer = value / 1_000_000
            if let last = state.lastPerProducer[producer], value <= last {
                violations.record("events of producer \(producer) out of order: \(last) then \(value)")
            }
            state.lastPerProducer[producer] = value
        }
    }

    func terminal() {
        callback("terminal") { state in
            state.terminals += 1
            if state.terminals > 1 { violations.record("two terminal callbacks") }
        }
    }

    func release() {
        counters.releases.add(1, ordering: .relaxed)
        if !loop.inEventLoop { violations.record("release off the loop thread") }
        lock.withLockedValue { state in
            if state.released { violations.record("release ran twice") }
            state.released = true
        }
    }

    func closed() {
        counters.closes.add(1, ordering: .relaxed)
        lock.withLockedValue { $0.closeReturned = true }
    }
}

// MARK: the world

let loop = try EventLoop(name: "soak")
var configuration = SessionConfiguration()
// The session's own logs are not what the soak checks (they would flood the output).
configuration.logger = Logger(label: "soak", factory: { _ in SwiftLogNoOpLogHandler() })
configuration.policy.minimumInterval = .milliseconds(20)
configuration.policy.initialBackoff = .milliseconds(5)
configuration.policy.maximumBackoff = .milliseconds(50)
configuration.policy.timeout = .milliseconds(200)
let authority = FlakyAuthority(timeout: configuration.policy.timeout)
let settings = configuration
let manager = try await loop.submit { try SessionManager(loop: loop, authority: authority, configuration: settings) }
let counter = MutableStateFlow(0, on: loop)
let bus = try MutableSharedFlow<Int>(on: loop, replay: 2, bufferCapacity: 64, overflow: .dropOldest)

/// Every open subscription with its observer, so the end can close them all.
final class Registry: Sendable {
    let open = LockedBox<[UInt64: (FlowSubscription, Observer)]>([:])
}
let registry = Registry()

func subscribeSomething() {
    let observer = Observer(loop: loop)
    let subscription: FlowSubscription
    do {
        switch Int.random(in: 0..<3) {
        case 0:
            // One in eight closes itself from inside its own callback (the other close path).
            let selfClosing = Int.random(in: 0..<8) == 0
            let handle = LockedBox<FlowSubscription?>(nil)
            subscription = try counter.subscribe(
                onState: { value in
                    observer.counter(value)
                    if selfClosing, let own = handle.withLockedValue({ $0 }) { own.close() }
                },
                onError: { _ in observer.terminal() },
                onComplete: { observer.terminal() }, onRelease: { observer.release() })
            handle.withLockedValue { $0 = subscription }
        case 1:
            subscription = try bus.subscribe(
                onEvent: { observer.event($0) }, onError: { _ in observer.terminal() },
                onComplete: { observer.terminal() }, onRelease: { observer.release() })
        default:
            subscription = try manager.state.subscribe(
                onState: { observer.sessionState($0) }, onError: { _ in observer.terminal() },
                onComplete: { observer.terminal() }, onRelease: { observer.release() })
        }
    } catch {
        violations.record("subscribe failed: \(error)")
        return
    }
    counters.subscribes.add(1, ordering: .relaxed)
    registry.open.withLockedValue { $0[subscription.id] = (subscription, observer) }
}

func closeSomething() {
    let victim: (FlowSubscription, Observer)? = registry.open.withLockedValue { open in
        guard let key = open.keys.randomElement() else { return nil }
        return open.removeValue(forKey: key)
    }
    guard let (subscription, observer) = victim else { return }
    subscription.close()
    observer.closed()
}

/// Runs an async session call from a plain thread and waits for it.
func blocking(_ body: @escaping @Sendable () async -> Void) {
    let done = DispatchSemaphore(value: 0)
    Task {
        await body()
        done.signal()
    }
    done.wait()
}

let signInSerial = Atomic<Int>(0)

func sessionOperation() {
    switch Int.random(in: 0..<10) {
    case 0...1:
        blocking {
            let number = signInSerial.add(1, ordering: .relaxed).newValue
            do {
                try await manager.signIn(SessionTokens(
                    accessToken: Secret("soak-signin-\(number)"), refreshToken: Secret("soak-signin-refresh-\(number)"),
                    expiresIn: .milliseconds(Int64.random(in: 0...300)), memberID: "m\(number % 4)"))
                counters.signIns.add(1, ordering: .relaxed)
            } catch {
                // illegalTransition while signed in: expected under races
            }
        }
    case 2:
        blocking {
            do {
                try await manager.logout()
                counters.logouts.add(1, ordering: .relaxed)
            } catch {}
        }
    case 3:
        try? manager.resume()
    default:
        counters.tokenRequests.add(1, ordering: .relaxed)
        let answered = Atomic<Int>(0)
        let completion: TokenCompletion = { result in
            if answered.add(1, ordering: .relaxed).newValue != 1 { violations.record("a token request answered twice") }
            if !loop.inEventLoop { violations.record("a token answer off the loop thread") }
            if case .success(let token) = result, token.isBlank { violations.record("a blank token") }
            counters.tokenAnswers.add(1, ordering: .relaxed)
        }
        do {
            switch Int.random(in: 0..<3) {
            case 0: try manager.freshAccessToken(completion)
            case 1: try manager.handleUnauthorized(token: Secret("soak-access-\(Int.random(in: 0...50))"), completion)
            default:
                // refreshNow has no completion form: through a task
                Task {
                    do { _ = try await manager.refreshNow() } catch {}
                    counters.tokenAnswers.add(1, ordering: .relaxed)
                }
            }
        } catch {
            violations.record("a token request was refused: \(error)")
            counters.tokenAnswers.add(1, ordering: .relaxed)
        }
    }
}

// MARK: run

let deadline = now() + seconds
let stop = Atomic<Bool>(false)
let emitted = LockedBox<[Int: Int]>([:])

func work(_ thread: Int) {
    var sequence = 0
    while !stop.load(ordering: .relaxed) {
        counters.operations.add(1, ordering: .relaxed)
        switch Int.random(in: 0..<100) {
        case 0..<30: counter.update { $0 + 1 }
        case 30..<40:
            sequence += 1
            bus.emit(thread * 1_000_000 + sequence)
        case 40..<60: subscribeSomething()
        case 60..<80: closeSomething()
        case 80..<83: sessionOperation()
        default:
            // Keep the open population bounded around a few thousand.
            if registry.open.withLockedValue({ $0.count }) > 4_000 { closeSomething() } else { subscribeSomething() }
        }
    }
    emitted.withLockedValue { $0[thread] = sequence }
}

let started = now()
var samples: [(Double, Int)] = [(0, residentBytes())]
let workers = (0..<threadCount).map { thread in
    Thread { work(thread) }
}
final class Thread: @unchecked Sendable {
    var handle = pthread_t()
    init(_ body: @escaping @Sendable () -> Void) {
        final class Box { let body: @Sendable () -> Void; init(_ b: @escaping @Sendable () -> Void) { body = b } }
        let box = Unmanaged.passRetained(Box(body)).toOpaque()
        pthread_create(&handle, nil, { raw in
            Unmanaged<Box>.fromOpaque(raw!).takeRetainedValue().body()
            return nil
        }, box)
    }
    func join() { pthread_join(handle, nil) }
}

var nextSample = started + sampleEvery
while now() < deadline {
    usleep(50_000)
    if now() >= nextSample {
        samples.append((now() - started, residentBytes()))
        nextSample += sampleEvery
    }
}
stop.store(true, ordering: .relaxed)
for worker in workers { worker.join() }

// Close everything that is still open, then check that every release ran.
let remaining = registry.open.withLockedValue { open in
    defer { open.removeAll() }
    return Array(open.values)
}
for (subscription, observer) in remaining {
    subscription.close()
    observer.closed()
}
try await loop.submit {}
try await loop.submit {}   // retire jobs queued by the closes above ran in between
let expectedReleases = counters.subscribes.load(ordering: .relaxed)
var releases = counters.releases.load(ordering: .relaxed)
let releaseDeadline = now() + 5
while releases != expectedReleases && now() < releaseDeadline {
    usleep(10_000)
    releases = counters.releases.load(ordering: .relaxed)
}
if releases != expectedReleases {
    violations.record("\(expectedReleases) subscriptions but \(releases) releases")
}
// Every accepted token request answered (give the last refreshes time to land).
let answerDeadline = now() + 5
while counters.tokenAnswers.load(ordering: .relaxed) < counters.tokenRequests.load(ordering: .relaxed) && now() < answerDeadline {
    usleep(10_000)
}
let requests = counters.tokenRequests.load(ordering: .relaxed)
let answers = counters.tokenAnswers.load(ordering: .relaxed)
if answers != requests { violations.record("\(requests) token requests but \(answers) answers") }
samples.append((now() - started, residentBytes()))
await manager.close()
let report = try loop.shutdown()
if report.unclosedSubscriptions != 0 { violations.record("\(report.unclosedSubscriptions) subscriptions were never closed") }

// Memory: after the first quarter (warm-up: caches, buffers, the open population), the
// resident size must stay within 10% + 4 MiB of where it was.
let warm = samples.first { $0.0 >= seconds / 4 } ?? samples[samples.count / 2]
let peakAfterWarm = samples.filter { $0.0 >= warm.0 }.map(\.1).max() ?? warm.1
let allowed = Double(warm.1) * 1.10 + 4 * 1024 * 1024
let flat = Double(peakAfterWarm) <= allowed

say("soak: \(fixed1(seconds)) s, \(threadCount) threads")
say("operations: \(counters.operations.load(ordering: .relaxed))"
    + " (subscribes \(counters.subscribes.load(ordering: .relaxed)), closes \(counters.closes.load(ordering: .relaxed)),"
    + " sign-ins \(counters.signIns.load(ordering: .relaxed)), logouts \(counters.logouts.load(ordering: .relaxed)),"
    + " token requests \(requests), refreshes \(counters.refreshes.load(ordering: .relaxed)))")
say("callbacks checked: \(counters.callbacks.load(ordering: .relaxed)), releases: \(releases)")
say("rss MiB: " + samples.map { "\(Int($0.0))s=\(fixed1(Double($0.1) / 1_048_576))" }.joined(separator: " "))
say("memory: \(flat ? "flat" : "GREW") (after warm-up \(fixed1(Double(warm.1) / 1_048_576)) MiB, peak \(fixed1(Double(peakAfterWarm) / 1_048_576)) MiB)")
let total = violations.count.load(ordering: .relaxed)
say("violations: \(total)")
for text in violations.first.withLockedValue({ $0 }) { say("  - \(text)") }
exit(total == 0 && flat ? 0 : 1)

func fixed1(_ value: Double) -> String {
    let tenths = Int((value * 10).rounded())
    return "\(tenths / 10).\(abs(tenths % 10))"
}
