import Foundation

/// Polls `condition` every `interval` until it holds or `timeout` passes; returns whether it
/// held (looking once more at the deadline). The one polling helper of every test target.
package func eventually(
    timeout: Duration = .seconds(20),
    every interval: Duration = .milliseconds(1),
    _ condition: () async throws -> Bool
) async rethrows -> Bool {
    let clock = ContinuousClock()
    let deadline = clock.now + timeout
    while clock.now < deadline {
        if try await condition() { return true }
        try? await Task.sleep(for: interval)
    }
    return try await condition()
}

/// Runs blocking work (waiting for a process, reading a pipe to its end) on a thread of its
/// own and awaits its result. An async test must not block a thread of the cooperative pool:
/// it has as many threads as cores (two here), and every test and every Task of the library
/// (an `AsyncAuthority`'s refresh, say) waits behind it.
package func offThePool<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { continuation in
        let thread = Thread { continuation.resume(returning: body()) }
        thread.name = "off-the-pool"
        thread.start()
    }
}
