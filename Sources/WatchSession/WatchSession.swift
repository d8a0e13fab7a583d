import ArgumentParser
import Foundation
import LoopFlow
import SessionCore
import SessionFileStore

@main
struct WatchSession: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch-session",
        abstract: "Shows a session live: its state, its refreshes, its failures.",
        discussion: """
            With no options it plays an embedded demo: a session signs in, refreshes before its \
            tokens expire, rides out a struggling server with backoff, and ends when its refresh \
            token is revoked.

            Examples:
              watch-session                    the demo, in about a minute
              watch-session --speed 10         the demo, ten times faster
              watch-session --json             one JSON object per event (NDJSON), for scripts
              watch-session --scenario offline-start
            """)

    @Option(help: "Compress time by this factor (the demo's clock runs N times faster).")
    var speed: Double = 1

    @Option(help: "Which demo to play: \(Scenario.allCases.map(\.rawValue).joined(separator: ", ")).")
    var scenario: Scenario = .story

    @Flag(help: "Print one JSON object per event (NDJSON) instead of lines for people.")
    var json = false

    func validate() throws {
        guard speed > 0, speed <= 1000 else {
            throw ValidationError("--speed must be above 0 and at most 1000, got \(speed)")
        }
    }

    func run() async throws {
        let presenter = Presenter(json: json)
        let outcome = try await Demo(scenario: scenario, speed: speed, presenter: presenter).play()
        presenter.note(outcome)
    }
}

enum Scenario: String, CaseIterable, ExpressibleByArgument {
    /// Signed in → proactive refreshes → transient failures with backoff → revoked → expired.
    case story
    /// The network is down when the app starts with a stored session: nobody is logged out.
    case offlineStart = "offline-start"
}

/// One demo run: an in-process authority, a temporary store, a session, and what it says.
struct Demo {
    let scenario: Scenario
    let speed: Double
    let presenter: Presenter

    func play() async throws -> String {
        let lifetime = Duration.seconds(20).compressed(by: speed)
        var configuration = SessionConfiguration()
        configuration.policy.minimumInterval = Duration.milliseconds(500).compressed(by: speed)
        configuration.policy.initialBackoff = Duration.seconds(1).compressed(by: speed)
        configuration.policy.maximumBackoff = Duration.seconds(30).compressed(by: speed)
        configuration.policy.timeout = Duration.seconds(5).compressed(by: speed)
        configuration.storeRetryInterval = Duration.seconds(5).compressed(by: speed)
        configuration.logger.logLevel = .critical
        let latency = Duration.milliseconds(150).compressed(by: speed)

        let directory = FileManager.default.temporaryDirectory
            .appendingPathComponent("watch-session-demo-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = FileCredentialStore(directory: directory)

        let plan: [DemoAuthority.Step]
        switch scenario {
        case .story:
            plan = [.grant, .grant, .transient("503 Service Unavailable"), .silent,
                    .transient("503 Service Unavailable"), .grant, .terminal("the refresh token was revoked")]
        case .offlineStart:
            plan = [.transient("network unreachable"), .transient("network unreachable"), .grant,
                    .terminal("the refresh token was revoked")]
            try store.write(StoredSession(
                accessToken: DemoAuthority.token("access"), refreshToken: DemoAuthority.token("refresh"),
                accessTokenExpiresAt: SessionConfiguration.realtime() - .seconds(1), memberID: "demo-user"))
        }
        let authority = DemoAuthority(plan: plan, lifetime: lifetime, latency: latency)

        let loop = try EventLoop(name: "watch-session")
        let settings = configuration
        let finished = AsyncStream<String>.makeStream()
        let (manager, subscriptions) = try await loop.submit {
            let manager = try SessionManager(loop: loop, authority: authority, store: store, configuration: settings)
            let states = try manager.subscribeToSessionState(onState: { state in
                presenter.state(state)
                if state == .sessionExpired {
                    presenter.note("Your session has expired. Please sign in again.")
                    finished.continuation.yield("demo finished: the session expired")
                }
            })
            let events = try manager.events.subscribe(onEvent: { presenter.event($0) })
            return (manager, [states, events])
        }
        let ticker = try loop.scheduleTimer(after: .milliseconds(200), repeating: .milliseconds(200)) {
            let timing = manager.timing
            presenter.status(expiresIn: timing.expiresIn, nextRefreshIn: timing.nextRefreshIn)
        }

        if scenario == .story {
            try await manager.signIn(SessionTokens(
                accessToken: DemoAuthority.token("access"), refreshToken: DemoAuthority.token("refresh"),
                expiresIn: lifetime, memberID: "demo-user"))
        }
        var outcome = "demo finished"
        for await line in finished.stream {
            outcome = line
            break
        }
        ticker.cancel()
        for subscription in subscriptions { subscription.close() }
        await manager.close()
        try loop.shutdown()
        return outcome
    }
}
