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
