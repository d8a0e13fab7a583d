import Foundation
import Testing

/// Runs the built watch-session binary (beside this test binary) and returns its output.
func watchSession(_ arguments: [String]) throws -> (status: Int32, stdout: String, stderr: String) {
    let me = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    let process = Process()
    process.executableURL = URL(fileURLWithPath: me).deletingLastPathComponent().appendingPathComponent("watch-session")
    process.arguments = arguments
    var environment = ProcessInfo.processInfo.environment
    environment["NO_COLOR"] = "1"
    process.environment = environment
    let out = Pipe()
    let err = Pipe()
    process.standardOutput = out
    process.standardError = err
    try process.run()
    let stdout = out.fileHandleForReading.readDataToEndOfFile()
    let stderr = err.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return (process.terminationStatus, String(decoding: stdout, as: UTF8.self), String(decoding: stderr, as: UTF8.self))
}

func objects(_ ndjson: String) throws -> [[String: Any]] {
    try ndjson.split(separator: "\n").map {
        try JSONSerialization.jsonObject(with: Data($0.utf8)) as! [String: Any]
    }
}

@Suite("watch-session", .serialized)
struct WatchSessionTests {
    @Test func theDemoStoryPlaysEventByEventAndExitsZero() throws {
        let run = try watchSession(["--json", "--speed", "20"])
        #expect(run.status == 0)
        let lines = try objects(run.stdout)
        let trail = lines.map { line -> String in
            switch line["kind"] as? String {
            case "state": "state:\(line["state"]!)"
            case "event": "event:\(line["event"]!)"
            default: "note"
            }
        }
        // signed in → proactive refreshes → failures with backoff → a retry that works → expired
        let states = trail.filter { $0.hasPrefix("state:") }
        #expect(states == ["state:loggedOut", "state:loggedIn", "state:sessionExpired"])
        let proactive = lines.filter { $0["event"] as? String == "tokenRefreshed" && $0["reason"] as? String == "proactive" }
        #expect(proactive.count >= 2)
        let failures = lines.filter { $0["event"] as? String == "refreshFailed" }
        #expect(failures.map { $0["attempt"] as? Int } == [1, 2, 3])
        let delays = failures.compactMap { $0["retryInMs"] as? Int }
        #expect(delays.count == 3 && delays == delays.sorted() && delays[2] > delays[0])  // backoff grows
        #expect(lines.contains { $0["event"] as? String == "tokenRefreshed" && $0["reason"] as? String == "retry" })
        #expect(lines.contains { $0["event"] as? String == "sessionExpired" })
        #expect(lines.contains { ($0["text"] as? String) == "Your session has expired. Please sign in again." })
        let expiredAt = trail.firstIndex(of: "state:sessionExpired")!
        #expect(trail.firstIndex(of: "state:loggedIn")! < trail.firstIndex(where: { $0 == "event:refreshFailed" })!)
        #expect(trail.lastIndex(where: { $0 == "event:refreshFailed" })! < expiredAt)
        // every line is dated
        #expect(lines.allSatisfy { $0["time"] is String })
        // no token value, ever
        #expect(!run.stdout.contains("demo-token") && !run.stderr.contains("demo-token"))
    }

    @Test func theHumanFormatHighlightsStatesAndSaysTheSessionExpired() throws {
        let run = try watchSession(["--speed", "40"])
        #expect(run.status == 0)
        #expect(run.stdout.contains("STATE → loggedIn"))
        #expect(run.stdout.contains("retrying in"))
        #expect(run.stdout.contains("Your session has expired. Please sign in again."))
        #expect(!run.stdout.contains("\u{1B}["))  // NO_COLOR and not a terminal: no colour
        #expect(!run.stdout.contains("demo-token"))
    }

    @Test func anOfflineStartLogsNobodyOut() throws {
        let run = try watchSession(["--json", "--speed", "20", "--scenario", "offline-start"])
        #expect(run.status == 0)
        let lines = try objects(run.stdout)
        let states = lines.compactMap { $0["kind"] as? String == "state" ? $0["state"] as? String : nil }
        #expect(states == ["loggedIn", "sessionExpired"])
        #expect(lines.filter { $0["event"] as? String == "refreshFailed" }.count == 2)
        #expect(!run.stdout.contains("demo-token"))
    }

    @Test func badInputGetsOneClearLineAndANonZeroExit() throws {
        let speed = try watchSession(["--speed", "0"])
        #expect(speed.status != 0)
        #expect(speed.stderr.contains("--speed must be above 0"))
        let unknown = try watchSession(["--bogus"])
        #expect(unknown.status != 0)
        #expect(unknown.stderr.contains("Unknown option '--bogus'"))
        let scenario = try watchSession(["--scenario", "nope"])
        #expect(scenario.status != 0)
    }

    @Test func helpHasExamples() throws {
        let help = try watchSession(["--help"])
        #expect(help.status == 0)
        #expect(help.stdout.contains("Examples:"))
        #expect(help.stdout.contains("--json"))
    }
}
