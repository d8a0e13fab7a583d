import FoundationEssentials
import LoopFlow
import SessionCore
import Synchronization

/// What the host shows the user to approve a device sign-in (RFC 8628 §3.3): go to
/// `verificationURI` and enter `userCode` (or open `verificationURIComplete`, which carries the
/// code, e.g. as a QR code) before `expiresIn` runs out. The device code is not in it: it stays
/// inside the flow (it is never logged or shown).
public struct DevicePrompt: Sendable, Equatable, CustomStringConvertible {
    /// The code the user types in (RFC 8628 `user_code`).
    public let userCode: String
    /// Where the user goes (`verification_uri`; https, or http to loopback).
    public let verificationURI: URL
    /// The same with the code filled in (`verification_uri_complete`), if the server gave one.
    public let verificationURIComplete: URL?
    /// How long the code is good for, from when it was issued (clamped: 1 s ... 3 h).
    public let expiresIn: Duration
    /// How often the token endpoint is asked (clamped: 1 s ... 5 min; grows on `slow_down`).
    public let interval: Duration

    public var description: String {
        "DevicePrompt(userCode: \(userCode), verificationURI: \(verificationURI.absoluteString), "
            + "verificationURIComplete: \(verificationURIComplete?.absoluteString ?? "nil"), "
            + "expiresIn: \(expiresIn), interval: \(interval))"
    }
}

/// The OAuth 2.0 Device Authorization Grant (RFC 8628) as a `SignInFlow`:
/// `SessionManager.signIn(with: DeviceAuthorization(...))`.
///
/// 1. POSTs `client_id` (and `scope`) to the device authorization endpoint.
/// 2. Hands the host a `DevicePrompt` (`onPrompt`, on the loop thread).
/// 3. Polls the token endpoint (`grant_type=urn:ietf:params:oauth:grant-type:device_code`) on
///    loop timers, every `interval` after the previous answer: `authorization_pending` goes on;
///    `slow_down` adds 5 s to the interval for this and every later poll; `access_denied` ends
///    with `accessDenied`; `expired_token`, or the code's lifetime running out here, ends with
///    `signInExpired` (nothing is sent after it). Transient failures (network, timeout, 5xx,
///    429) keep polling within the lifetime; other errors (`invalid_client`...) end with
///    `configuration`.
/// 4. On tokens: the member id is the answer's `member_id` / `user_id` / `sub` if it has one,
///    else the introspection's `sub` / `username`, else the userinfo endpoint's `sub` /
///    `preferred_username` (each when configured; a lookup that fails leaves it unset: the
///    sign-in goes on).
///
/// Everything runs on the loop's HTTP client (libcurl on libuv); `cancel()` ends the request in
/// flight, disarms the timers and completes with `cancelled`. Server-given numbers are clamped
/// (interval 1 s ... 5 min, lifetime 1 s ... 3 h).
public final class DeviceAuthorization: SignInFlow {
    public let configuration: OAuthConfiguration
    /// Requested at the device endpoint (default: the configuration's `scope`).
    public let scope: String?
    let onPrompt: @Sendable (DevicePrompt) -> Void

    /// The bounds server-given values are clamped to.
    public static let intervalRange: ClosedRange<Duration> = .seconds(1) ... .seconds(300)
    public static let lifetimeRange: ClosedRange<Duration> = .seconds(1) ... .seconds(3 * 3600)
    /// RFC 8628 §3.5: added to the interval on each `slow_down`.
    public static let slowDownStep: Duration = .seconds(5)
    static let grantType = "urn:ietf:params:oauth:grant-type:device_code"

    /// - Parameter onPrompt: runs once on the loop thread when the server has issued the codes
    ///   (show them to the user). Calling `cancel()` from inside it is fine.
    /// - Throws: `OAuthConfigurationError` for a configuration without a device authorization
    ///   endpoint, or one `OAuthAuthority` would refuse.
    public init(
        _ configuration: OAuthConfiguration, scope: String? = nil,
        onPrompt: @escaping @Sendable (DevicePrompt) -> Void
    ) throws(OAuthConfigurationError) {
        try configuration.validate()
        guard configuration.deviceAuthorizationEndpoint != nil else {
            throw OAuthConfigurationError(field: "device authorization endpoint", reason: "is not set")
        }
        self.configuration = configuration
        self.scope = scope ?? configuration.scope
        self.onPrompt = onPrompt
    }

    public func start(
        on loop: EventLoop, completion: @escaping @Sendable (Result<SessionTokens, SessionError>) -> Void
    ) -> any SignInCancellable {
        let run = DevicePolling(flow: self, loop: loop, completion: completion)
        run.begin()
        return run
    }
}

/// One run of the device flow. Loop-confined state; `cancel()` from any thread.
final class DevicePolling: SignInRun, @unchecked Sendable {
    private let flow: DeviceAuthorization

    // Loop-confined.
    private var pollTimer: LoopTimer?
    private var expiryTimer: LoopTimer?
    private var deviceCode: Secret?
    private var interval: Duration = .seconds(5)

    init(flow: DeviceAuthorization, loop: EventLoop, completion: @escaping @Sendable (Result<SessionTokens, SessionError>) -> Void) {
        self.flow = flow
        super.init(loop: loop, configuration: flow.configuration, completion: completion)
    }

    // MARK: - Steps (loop thread)

    func begin() {
        loop.assertInEventLoop()
        guard watchTeardown(), makeAuthority(), let endpoint = configuration.deviceAuthorizationEndpoint else { return }
        var form: [(String, FormValue)] = []
        if let scope = flow.scope { form.append(("scope", .text(scope))) }
        post(endpoint, form: form, secrets: []) { [self] outcome in authorized(outcome) }
    }

    /// The device authorization endpoint answered.
    private func authorized(_ outcome: Result<HTTPAnswer, AuthorityError>) {
        let answer: HTTPAnswer
        switch outcome {
        case .failure(let error): return finish(.failure(Self.failure(error, at: "the device authorization endpoint")))
        case .success(let value): answer = value
        }
        guard answer.status == 200 else {
            return finish(.failure(Self.failure(TokenResponse.error(from: answer), at: "the device authorization endpoint")))
        }
        let parsed: (DevicePrompt, Secret)
        guard let origin = configuration.deviceAuthorizationEndpoint else { return }
        switch Self.parse(answer, origin: origin) {
        case .failure(let error): return finish(.failure(error))
        case .success(let value): parsed = value
        }
        let (prompt, code) = parsed
        deviceCode = code
        interval = prompt.interval
        do {
            expiryTimer = try loop.scheduleTimer(after: prompt.expiresIn) { [self] in
                expiryTimer = nil
                finish(.failure(SessionError(
                    .signInExpired, "the device code expired (after \(prompt.expiresIn)) before the sign-in was approved")))
            }
        } catch {
            return finish(.failure(SessionError(.shutDown, "the event loop is shut down")))
        }
        flow.onPrompt(prompt)
        schedulePoll(after: interval)
    }

    private func schedulePoll(after delay: Duration) {
        guard !finished else { return }
        do {
            pollTimer = try loop.scheduleTimer(after: delay) { [self] in
                pollTimer = nil
                poll()
            }
        } catch {
            finish(.failure(SessionError(.shutDown, "the event loop is shut down")))
        }
    }

    private func poll() {
        guard !finished, !isCancelled, let deviceCode else { return }
        let form: [(String, FormValue)] = [("grant_type", .text(DeviceAuthorization.grantType)), ("device_code", .secret(deviceCode))]
        tokenPost(form: form, secrets: [deviceCode]) { [self] outcome in polled(outcome) }
    }

    /// The token endpoint answered a poll.
    private func polled(_ outcome: Result<HTTPAnswer, AuthorityError>) {
        let answer: HTTPAnswer
        switch outcome {
        case .failure(let error) where error.kind == .transient:
            return schedulePoll(after: backOff(error.retryAfter))
        case .failure(let error):
            return finish(.failure(Self.failure(error, at: "the token endpoint")))
        case .success(let value):
            answer = value
        }
        if answer.status == 200 {
            switch grant(from: answer) {
            case .success(let (grant, bound)):
                // Tokens: the code's lifetime no longer matters.
                expiryTimer?.cancel()
                expiryTimer = nil
                return granted(grant, bound: bound, answer: answer, requestedScope: flow.scope)
            case .failure(let error) where error.kind == .transient:
                return schedulePoll(after: retryDelay(error.retryAfter))
            case .failure(let error):
                return finish(.failure(Self.failure(error, at: "the token endpoint")))
            }
        }
        let error = TokenResponse.error(from: answer)
        switch error.code {
        case "authorization_pending":
            schedulePoll(after: interval)
        case "slow_down":
            interval = min(interval + DeviceAuthorization.slowDownStep, DeviceAuthorization.intervalRange.upperBound)
            schedulePoll(after: interval)
        case "access_denied":
            finish(.failure(SessionError(.accessDenied, "the sign-in was denied (\(error.message))")))
        case "expired_token":
            finish(.failure(SessionError(.signInExpired, "the device code expired before the sign-in was approved (\(error.message))")))
        default:
            if error.kind == .transient {
                schedulePoll(after: backOff(error.retryAfter))
            } else {
                finish(.failure(Self.failure(error, at: "the token endpoint")))
            }
        }
    }

    /// A poll failed for a passing reason (a timeout, a lost connection, 5xx, 429): RFC 8628
    /// §3.5 — the client MUST reduce its polling frequency. The interval doubles (up to its
    /// bound) and stays doubled for the rest of the sign-in; the next poll waits for it, or for
    /// the server's `Retry-After` if longer.
    private func backOff(_ retryAfter: Duration?) -> Duration {
        interval = min(interval * 2, DeviceAuthorization.intervalRange.upperBound)
        return retryDelay(retryAfter)
    }

    /// The wait after a transient failure: the interval, or the server's `Retry-After` if longer
    /// (capped by the interval's bound; the code's lifetime ends it anyway).
    private func retryDelay(_ retryAfter: Duration?) -> Duration {
        min(max(interval, retryAfter ?? .zero), DeviceAuthorization.intervalRange.upperBound)
    }

    override func cleanUp() {
        pollTimer?.cancel()
        pollTimer = nil
        expiryTimer?.cancel()
        expiryTimer = nil
        deviceCode = nil
    }

    // MARK: - Parsing

    /// The device authorization answer (RFC 8628 §3.2), bounded.
    /// `origin`: the device authorization endpoint that answered; the verification URIs may be
    /// plain http to loopback only when it is loopback itself.
    static func parse(_ answer: HTTPAnswer, origin: URL) -> Result<(DevicePrompt, Secret), SessionError> {
        func refuse(_ why: String) -> Result<(DevicePrompt, Secret), SessionError> {
            .failure(SessionError(.configuration, "the device authorization answer \(why)"))
        }
        guard let object = answer.json else { return refuse("is not JSON") }
        guard let secret = object.secret("device_code"), secret.count > 0, secret.count <= 4096 else {
            return refuse("has no usable device_code")
        }
        // Format and bidi characters (Cf: U+200E, U+202E, U+2066...) would make the code read
        // differently from what must be typed: removed (issue 29, point 6).
        let shownCode = object["user_code"]?.string.map { code in
            String(String.UnicodeScalarView(code.unicodeScalars.filter { $0.properties.generalCategory != .format }))
        }
        guard let userCode = shownCode, !userCode.isEmpty, userCode.utf8.count <= 128,
              userCode.unicodeScalars.allSatisfy({ $0.value >= 0x20 && $0.value != 0x7F && !(0x80...0x9F).contains($0.value) }),
              !secret.occurs(in: userCode)
        else {
            return refuse("has no usable user_code")
        }
        // (`verification_url`: the name some servers used before the RFC.)
        guard let verification = usableURL(object["verification_uri"]?.string ?? object["verification_url"]?.string, origin: origin),
              !secret.occurs(in: verification.absoluteString)
        else {
            return refuse("has no verification_uri that is https (or http to loopback)")
        }
        let complete = usableURL(object["verification_uri_complete"]?.string, origin: origin).flatMap {
            secret.occurs(in: $0.absoluteString) ? nil : $0
        }
        let lifetime = clamp(seconds(object["expires_in"]) ?? 600, DeviceAuthorization.lifetimeRange)
        let interval = clamp(seconds(object["interval"]) ?? 5, DeviceAuthorization.intervalRange)
        let prompt = DevicePrompt(
            userCode: userCode, verificationURI: verification, verificationURIComplete: complete,
            expiresIn: lifetime, interval: interval)
        return .success((prompt, secret))
    }

    /// A URL the user may be sent to: what the endpoints' rule allows.
    static func usableURL(_ text: String?, origin: URL) -> URL? {
        guard let text, text.utf8.count <= 2048, let url = URL(string: text) else { return nil }
        do {
            try OAuthConfiguration.check(url, "verification URI", namedBy: origin)
            return url
        } catch {
            return nil
        }
    }

    static func seconds(_ member: JSONMember?) -> Double? {
        switch member {
        case .int(let value)?: Double(value)
        case .double(let value)? where value.isFinite: value
        case .string(let text)?: Double(text).flatMap { $0.isFinite ? $0 : nil }
        default: nil
        }
    }

    static func clamp(_ seconds: Double, _ range: ClosedRange<Duration>) -> Duration {
        let low = range.lowerBound.seconds
        let high = range.upperBound.seconds
        return .milliseconds(Int64(min(max(seconds, low), high) * 1000))
    }
}
