import Foundation

/// A child process's output, collected as it comes (any thread).
package final class LockedText: @unchecked Sendable {
    private let lock = NSLock()
    private var data = Data()
    private var finished = false
    package init() {}

    /// Whether the pipe reached its end: everything the child wrote is in `text`.
    package var ended: Bool { lock.withLock { finished } }
    package func append(_ chunk: Data) { lock.withLock { data.append(chunk) } }
    package var text: String { lock.withLock { String(decoding: data, as: UTF8.self) } }

    /// Collects what `pipe` carries, as it comes, until its end (the child exited): blocking
    /// reads on a thread of its own. Not `readabilityHandler`: its dispatch read source,
    /// registered with libdispatch's epoll while the child still holds the pipe, is how a
    /// Linux libdispatch bug crashes the test process (a segfault in
    /// `_dispatch_event_loop_drain`, seen in a full run; swiftlang/swift-subprocess#47).
    package func collect(_ pipe: Pipe) {
        let handle = pipe.fileHandleForReading
        let thread = Thread { [self] in
            while true {
                let chunk = handle.availableData
                if chunk.isEmpty {
                    lock.withLock { finished = true }
                    return
                }
                append(chunk)
            }
        }
        thread.name = "test output reader"
        thread.start()
    }
}
