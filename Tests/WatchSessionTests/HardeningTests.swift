import Foundation
import SessionCore
import SessionFlowTestSupport
import Testing

/// Issue 17, points 5 and 6 (and the CLI's part of point 1): outside text never drives the
/// terminal, the demo ends cleanly on Ctrl-C and SIGTERM, `--version`, a non-dumpable process.
@Suite("watch-session hardening", .serialized)
struct WatchSessionHardeningTests {
    /// A running watch-session whose output is collected.
    final class Running: @unchecked Sendable {
        let process = Process()
        let collected = LockedText()

        init(_ arguments: [String], environment extra: [String: String] = [:], launcher: [String] = []) throws {
            if launcher.isEmpty {
                process.executableURL = URL(fileURLWithPath: binary("watch-session"))
                process.arguments = arguments
            } else {
                process.executableURL = URL(fileURLWithPath: launcher[0])
                process.arguments = Array(launcher.dropFirst()) + [binary("watch-session")] + arguments
            }
            var environment = ProcessInfo.processInfo.environment
            environment["NO_COLOR"] = "1"
            environment.merge(extra) { $1 }
            process.environment = environment
            let out = Pipe()
            process.standardOutput = out
            process.standardError = out
            collected.collect(out)
            try process.run()
        }

        func waitFor(_ text: String) async -> Bool {
            await eventually(timeout: .seconds(10), every: .milliseconds(20)) { self.collected.text.contains(text) }
        }

        /// Sends `signal` and waits for the exit: the status, and whether it was an exit (not
        /// a death by signal).
        func stop(with signal: Int32) -> (status: Int32, exited: Bool) {
            kill(process.processIdentifier, signal)
            process.waitUntilExit()
            return (process.terminationStatus, process.terminationReason == .exit)
        }
    }

    private func privateDirectory(mode: mode_t = 0o700) throws -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("wsh-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false)
        chmod(path, mode)
        return path
    }

    @Test func versionPrintsTheLibrarysVersion() async throws {
        let run = try await watchSession(["--version"])
        #expect(run.status == 0)
        // The header's macros are the library's version: the CLI says the same.
        let header = try String(contentsOfFile: "Bindings/include/sessionflow.h", encoding: .utf8)
        func macro(_ name: String) -> String {
            header.split(separator: "\n").first { $0.hasPrefix("#define \(name) ") }.map {
                String($0.split(separator: " ").last!)
            } ?? "?"
        }
        let version = "\(macro("SF_VERSION_MAJOR")).\(macro("SF_VERSION_MINOR")).\(macro("SF_VERSION_PATCH"))"
        #expect(run.stdout == "watch-session \(version)\n")
        #expect(SessionFlowVersion.string == version)
    }

    @Test(arguments: [SIGINT, SIGTERM])
    func theDemoEndsOnASignalWithExit130AndLeavesNoTemporaryStore(signal: Int32) async throws {
        let temporary = try privateDirectory()
        defer { try? FileManager.default.removeItem(atPath: temporary) }
        let demo = try Running(["demo", "--json"], environment: ["TMPDIR": temporary])
        // The demo has signed in, and its store is in TMPDIR (made with the sign-in's write,
        // on the store's worker: the state can be shown before it lands, as a full run saw).
        #expect(await demo.waitFor(#""state":"loggedIn""#), "\(demo.collected.text)")
        #expect(await eventually(timeout: .seconds(10)) {
            ((try? FileManager.default.contentsOfDirectory(atPath: temporary)) ?? []).contains { $0.hasPrefix("watch-session-demo-") }
        })
        let ending = demo.stop(with: signal)
        // An exit (not a death by the signal), with 130 like the live mode, and the store gone.
        #expect(ending.exited)
        #expect(ending.status == 130)
        #expect(try FileManager.default.contentsOfDirectory(atPath: temporary).isEmpty)
        // Its last words may reach the pipe's reader after the exit was seen: wait for them.
        #expect(await demo.waitFor("demo interrupted"), "\(demo.collected.text)")
    }

    /// What reaches the terminal from outside: here a store directory whose name carries a
    /// title change, a screen clear, an 8-bit CSI and a right-to-left override, refused by the
    /// store (open to others), so its reason — naming the path — is shown.
    @Test(arguments: [false, true])
    func outsideTextIsShownNeverObeyed(json: Bool) async throws {
        let parent = try privateDirectory()
        defer { try? FileManager.default.removeItem(atPath: parent) }
        let hostile = "store-\u{1B}]0;pwned\u{07}\u{1B}[2J\u{9B}31m\u{202E}txt.exe\nSTATE → loggedIn"
        let directory = parent + "/" + hostile
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
        chmod(directory, 0o777)  // refused by the store: writable by others
        let watch = try Running(["--store", directory] + (json ? ["--json"] : []))
        #expect(await watch.waitFor("unavailable"), "\(watch.collected.text)")
        #expect(await watch.waitFor("txt.exe"), "\(watch.collected.text)")
        _ = watch.stop(with: SIGINT)
        let output = watch.collected.text
        // Nothing of it acts: no ESC, BEL, C1 or bidi control, and no forged line.
        for scalar: Unicode.Scalar in ["\u{1B}", "\u{07}", "\u{9B}", "\u{202E}"] {
            #expect(!output.unicodeScalars.contains(scalar), "U+\(String(scalar.value, radix: 16)) reached the output")
        }
        #expect(!output.split(separator: "\n").contains { $0.hasPrefix("STATE → loggedIn") })
        // It is shown, escaped, where it is mentioned.
        if json {
            #expect(output.contains(#"\u001b]0;pwned"#) && output.contains(#"\u009b31m"#) && output.contains(#"\u202e"#))
        } else {
            #expect(output.contains(#"\u{1B}]0;pwned\u{7}\u{1B}[2J\u{9B}31m\u{202E}txt.exe\u{A}STATE → loggedIn"#), "\(output)")
        }
    }

    /// The process holds tokens: no core dump, and no other process of the user may read its
    /// memory. Checked from outside as an unprivileged user (root may read anything): such a
    /// user reads /proc/<pid>/environ of its own dumpable process, never watch-session's.
    @Test func watchSessionIsNotDumpable() async throws {
        let asNobody = getuid() == 0 ? ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] : []
        if !asNobody.isEmpty && !FileManager.default.isExecutableFile(atPath: asNobody[0]) {
            Issue.record("setpriv is needed to check dumpability as an unprivileged user")
            return
        }
        func readable(_ pid: Int32) throws -> Bool {
            let reader = Process()
            reader.executableURL = URL(fileURLWithPath: asNobody.first ?? "/bin/cat")
            reader.arguments = Array(asNobody.dropFirst()) + (asNobody.isEmpty ? [] : ["/bin/cat"]) + ["/proc/\(pid)/environ"]
            reader.standardOutput = FileHandle.nullDevice
            reader.standardError = FileHandle.nullDevice
            try reader.run()
            reader.waitUntilExit()
            return reader.terminationStatus == 0
        }
        // The control: an ordinary process of that user is readable.
        let control = Process()
        control.executableURL = URL(fileURLWithPath: asNobody.first ?? "/bin/sleep")
        control.arguments = Array(asNobody.dropFirst()) + (asNobody.isEmpty ? [] : ["/bin/sleep"]) + ["20"]
        try control.run()
        defer { control.terminate() }
        #expect(await eventually(timeout: .seconds(20), every: .milliseconds(20)) { (try? readable(control.processIdentifier)) == true })
        // watch-session (the demo, as the same user; its temporary store in a directory that
        // user may write).
        let temporary = try privateDirectory(mode: 0o1777)
        defer { try? FileManager.default.removeItem(atPath: temporary) }
        let demo = try Running(["demo", "--json"], environment: ["TMPDIR": temporary], launcher: asNobody)
        #expect(await demo.waitFor(#""state":"loggedIn""#), "\(demo.collected.text)")
        #expect(try readable(demo.process.processIdentifier) == false)
        #expect(demo.stop(with: SIGINT).status == 130)
    }
}
