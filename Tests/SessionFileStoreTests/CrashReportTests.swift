import Foundation
import SessionFlowTestSupport
import Testing

/// What docs/storage-and-oauth.md promises about crash reports (issue 29, point 7): a process
/// that handles tokens and starts with `SWIFT_BACKTRACE=enable=no` writes no crash report — no
/// registers, no memory, so no token — when it crashes. (Without it, Swift's backtracer writes
/// one with every register; `prctl(PR_SET_DUMPABLE, 0)` does not stop that, the docs say.)
@Suite(
    "Crash reports of a process holding a token", .serialized,
    // Under ThreadSanitizer (the test command sets TSAN_OPTIONS), the sanitizer's own handler
    // reports a crash instead of Swift's backtracer: what is tested here is the plain run's.
    .enabled(if: ProcessInfo.processInfo.environment["TSAN_OPTIONS"] == nil))
struct CrashReportTests {
    static let token = "SENTINEL-CRASH-ACCESS-7e41c2"

    /// Runs the probe until it crashes; blocking (call it on a thread of its own: `onOwnThread`).
    static func crash(_ environment: [String]) throws -> (status: Int32, output: String) {
        let probe = try sessionProbeExecutable()
        let child = try ChildProcess("/usr/bin/env", environment + [probe, "--crash-holding", Self.token])
        guard child.waitForLine(timeout: .seconds(60), where: { $0.hasPrefix("holding ") }) != nil else {
            return (-1, child.readToEnd().joined(separator: "\n"))
        }
        let output = child.readToEnd(timeout: .seconds(120)).joined(separator: "\n")
        return (child.waitForExit(), output)
    }

    @Test(.timeLimit(.minutes(5)))
    func withBacktracesOffACrashWritesNoReportAndNoToken() async throws {
        let (status, output) = try await onOwnThread { try Self.crash(["SWIFT_BACKTRACE=enable=no"]) }
        #expect(status != 0, "the probe did not crash: \(output)")
        #expect(output.contains("a crash on purpose"))
        #expect(!output.contains("Crash") && !output.contains("Thread 0") && !output.contains("Registers"), "\(output)")
        #expect(!output.contains(Self.token))
    }

    /// The control: with the backtracer on, a report is written (so the test above is about
    /// the setting, not about a machine without a backtracer).
    @Test(.timeLimit(.minutes(5)))
    func withBacktracesOnACrashWritesAReport() async throws {
        let (status, output) = try await onOwnThread { try Self.crash(["SWIFT_BACKTRACE=enable=yes,interactive=no"]) }
        #expect(status != 0)
        #expect(output.contains("Crash") || output.contains("Thread 0"), "\(output)")
    }
}
