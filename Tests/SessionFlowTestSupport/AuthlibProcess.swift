import Foundation

/// The Authlib server of Tests/Fixtures/oauth_server.py as a child process on a loopback port
/// of its own (its hooks and faults are in its docstring). It ends when this object goes: its
/// stdin (the lifeline) is closed, and SIGKILL follows in case it is stuck; it also ends by
/// itself if this process dies first (the lifeline closes).
package final class AuthlibProcess: @unchecked Sendable {
    package let process = Process()
    private let lifeline = Pipe()
    package let port: Int

    package struct Failure: Error, CustomStringConvertible {
        package let description: String
    }

    package static var script: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Fixtures/oauth_server.py").path
    }

    /// Starts it (`arguments` go to the script, e.g. `--expires-in 8`) and waits for its
    /// "PORT n" line — on a thread of its own (`offThePool`): Python's start-up reads many
    /// files, and on a machine busy writing to disk it took seconds, which, on a thread of
    /// the cooperative pool, held up the tasks of every other test (the async views' hang
    /// guards fired).
    package init(arguments: [String]) async throws {
        let output = Pipe()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", Self.script] + arguments
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        process.standardInput = lifeline
        try process.run()
        let reading = output.fileHandleForReading
        let line: Data? = await offThePool {
            var line = Data()
            while !line.contains(UInt8(ascii: "\n")) {
                let chunk = reading.availableData
                if chunk.isEmpty { return nil }
                line.append(chunk)
            }
            return line
        }
        guard let line else {
            throw Failure(description: "the OAuth server exited before listening (is authlib installed?)")
        }
        let text = String(decoding: line, as: UTF8.self)
        guard let port = text.split(separator: " ").last.flatMap({ Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) }) else {
            throw Failure(description: "unexpected first line: \(text)")
        }
        self.port = port
    }

    deinit {
        // Foundation reaps the child (waitUntilExit can hang here, on a run loop this thread
        // does not run).
        try? lifeline.fileHandleForWriting.close()
        kill(process.processIdentifier, SIGKILL)
    }
}
