import LoopFlow
import Synchronization

/// An authority's answer that is not a success.
public struct AuthorityError: Error, Sendable, Hashable, CustomStringConvertible {
    public enum Kind: String, Sendable, Hashable {
        /// The grant is dead (`invalid_grant` and equivalents): the session is over.
        case terminal
        /// Try again later (network, timeout, 5xx, 429): tokens and state are kept.
        case transient
        /// The client is misconfigured (`invalid_client`, `unauthorized_client`,
        /// `unsupported_grant_type`): never retried automatically.
        case configuration
    }

    public let kind: Kind
    /// The protocol's error code (e.g. `invalid_grant`), if there was one.
    public let code: String?
    /// A human-readable reason. Must never contain a token.
    public let message: String
    /// The server's `Retry-After`, if any: no retry comes sooner.
    public let retryAfter: Duration?

    public init(_ kind: Kind, code: String? = nil, message: String, retryAfter: Duration? = nil) {
        self.kind = kind
        self.code = code
        self.message = message
        self.retryAfter = retryAfter
    }

    public static func terminal(_ code: String = "invalid_grant", _ message: String = "the grant was refused") -> Self {
        AuthorityError(.terminal, code: code, message: message)
    }

    public static func transient(_ message: String, retryAfter: Duration? = nil) -> Self {
        AuthorityError(.transient, message: message, retryAfter: retryAfter)
    }

    public static func configuration(_ code: String, _ message: String) -> Self {
        AuthorityError(.configuration, code: code, message: message)
    }

    public var description: String {
        var text = "\(kind)"
        if let code { text += " \(code)" }
        text += ": \(message)"
        if let retryAfter { text += " (retry after \(retryAfter))" }
        return text
    }
}

/// Why a refresh was started.
public enum RefreshReason: String, Sendable, Hashable, CustomStringConvertible {
    /// The proactive timer, before expiry.
    case proactive
    /// A caller asked for a token within the margin of expiry.
    case onDemand
    /// A 401 with the current token.
    case unauthorized
    /// A retry after a transient failure.
    case retry
    /// `resume()` found the token due, or the authority said it is no longer active.
    case resume
    /// A stored session was restored expired or nearly so.
    case restore
    /// The fallback after a terminal refresh failure: signing in again by external user id.
    case reauthentication
    /// Another process sharing the store refreshed; this one adopted its tokens.
    case sharedStore

    public var description: String { rawValue }
}

/// What the session asks an authority to refresh.
public struct RefreshRequest: Sendable, CustomStringConvertible {
    public let refreshToken: Secret
    public let memberID: String?
    public let reason: RefreshReason
    /// The session's refresh timeout (`RefreshPolicy.timeout`; nil: none was given). An
    /// authority that can tell when its answer has started to arrive
    /// (`AuthorityCompletion.answerArriving(within:)`) lets that answer run past it: no byte
    /// for this long (a stall), or four times it from the start (the cap), ends it instead.
    public let timeout: Duration?
    /// The session's DPoP key (RFC 9449): the refresh token is bound to it, so the request
    /// carries a proof by it. Nil: a bearer session.
    public let dpopKey: DPoPKey?
    /// The profile of the session whose refresh token this is (nil: it has none — bare tokens,
    /// or a record stored before profiles): which issuer minted it, for an authority that
    /// serves a store holding sessions of several issuers.
    public let profile: SessionProfile?

    public init(
        refreshToken: Secret, memberID: String?, reason: RefreshReason, timeout: Duration? = nil, dpopKey: DPoPKey? = nil,
        profile: SessionProfile? = nil
    ) {
        self.refreshToken = refreshToken
        self.memberID = memberID
        self.reason = reason
        self.timeout = timeout
        self.dpopKey = dpopKey
        self.profile = profile
    }

    public var description: String {
        "RefreshRequest(refreshToken: <redacted>, memberID: \(memberID ?? "nil"), reason: \(reason))"
    }
}

/// The one-shot answer to an authority request. Complete it exactly once, from any thread,
/// at any time (even inside the call that handed it to you); later completions are refused
/// and return false. The session hears the answer on its loop thread, never inline.
///
/// Cancellation: an authority whose requests can be cancelled says how with `onCancel`.
/// The session asks for it when a refresh outlives its timeout, and then waits for the
/// request to *end* — the completion must still be completed, with whatever arrived (tokens
/// that came in after all are kept) or with `AuthorityError.cancelled`. Until then no
/// second request with the same refresh token is sent, in this process or another sharing
/// the store: the first one may have rotated it. An authority that registers no handler
/// cannot be cancelled; its attempt is given up at the timeout as before.
public final class AuthorityCompletion<Output: Sendable>: Sendable {
    private let completed = Atomic<Bool>(false)
    private let abandoned = Atomic<Bool>(false)
    private let deliver: @Sendable (Result<Output, AuthorityError>, _ receivedAt: Duration) -> Void
    private let clock: @Sendable () -> Duration
    private let cancellation = LockedBox(Cancellation())

    private struct Cancellation {
        var requested = false
        var handler: (@Sendable () -> Void)?
        /// `answerArriving(within:)`: the loop time by which the request ends by itself.
        var arrivingBy: Duration?
        /// A completion that relays to another (`relaying(to:)`) tells it too.
        var relay: (@Sendable (Duration) -> Void)?
    }

    init(
        clock: @escaping @Sendable () -> Duration,
        deliver: @escaping @Sendable (Result<Output, AuthorityError>, Duration) -> Void
    ) {
        self.clock = clock
        self.deliver = deliver
    }

    /// A completion that is not tied to a session: `handle` gets the answer on whatever
    /// thread completes it. For one-off exchanges (a tool trading a refresh token for a
    /// first access token).
    public static func standalone(
        _ handle: @escaping @Sendable (Result<Output, AuthorityError>) -> Void
    ) -> AuthorityCompletion<Output> {
        AuthorityCompletion(clock: { .zero }) { result, _ in handle(result) }
    }

    /// A completion whose answer, and whose `answerArriving` notes, go to `outer` (an
    /// authority that hands the request on to another: discovery first, say). Cancelling
    /// `outer` is the caller's to wire (`outer.onCancel { inner.requestCancellation() }`).
    public static func relaying(to outer: AuthorityCompletion<Output>) -> AuthorityCompletion<Output> {
        let inner = AuthorityCompletion(clock: outer.clock) { result, _ in outer.complete(result) }
        inner.cancellation.withLockedValue { $0.relay = { limit in outer.answerArriving(within: limit) } }
        return inner
    }

    /// Whether it was completed already.
    public var isCompleted: Bool { completed.load(ordering: .acquiring) }

    /// Says that the answer has started to arrive and that it is one the session must not
    /// lose by cancelling — a refresh answered 2xx: the server has rotated the refresh token,
    /// so the tokens on their way are the only valid ones — and that the request ends by
    /// itself within `limit` (its stall rule and cap). The session then does not cancel it at
    /// its refresh timeout; it waits for the end. Any thread, at most once meaningfully.
    public func answerArriving(within limit: Duration) {
        let relay = cancellation.withLockedValue { state -> (@Sendable (Duration) -> Void)? in
            guard !isCompleted, state.arrivingBy == nil else { return nil }
            state.arrivingBy = clock() + limit
            return state.relay
        }
        relay?(limit)
    }

    /// The loop time by which an answer that has started to arrive ends by itself (nil: none
    /// is arriving, or it was completed).
    public var answerArrivingBy: Duration? {
        guard !isCompleted else { return nil }
        return cancellation.withLockedValue { $0.arrivingBy }
    }

    @discardableResult
    public func succeed(_ output: Output) -> Bool { complete(.success(output)) }

    @discardableResult
    public func fail(_ error: AuthorityError) -> Bool { complete(.failure(error)) }

    @discardableResult
    public func complete(_ result: Result<Output, AuthorityError>) -> Bool {
        guard !completed.exchange(true, ordering: .acquiringAndReleasing) else { return false }
        // The receipt time, on the loop's monotonic clock, is what expiry is computed from.
        deliver(result, clock())
        // Nothing to cancel any more: the handler (and what it captured) is let go.
        cancellation.withLockedValue { $0.handler = nil }
        return true
    }

    /// Says how to cancel the request this completion answers; call it once, from any
    /// thread, before or after starting the request. `handler` runs at most once, on the
    /// thread that asks for the cancellation (the session's loop thread) and never under a
    /// lock — or at once, inside this call, if cancellation was already asked for. After
    /// it, complete the completion as soon as the request has ended.
    public func onCancel(_ handler: @escaping @Sendable () -> Void) {
        let runNow = cancellation.withLockedValue { state -> Bool in
            guard !isCompleted else { return false }
            if state.requested { return true }
            state.handler = handler
            return false
        }
        if runNow { handler() }
    }

    /// Whether cancellation was asked for (a request not started yet need not start).
    public var isCancellationRequested: Bool {
        cancellation.withLockedValue { $0.requested }
    }

    /// Asks the authority to end the request. True when it registered a way to cancel and
    /// has not answered yet: an answer is then on its way, and the caller waits for it.
    @discardableResult
    public func requestCancellation() -> Bool {
        let handler = cancellation.withLockedValue { state -> (@Sendable () -> Void)? in
            state.requested = true
            defer { state.handler = nil }
            return state.handler
        }
        guard let handler, !isCompleted else { return false }
        handler()
        return true
    }

    /// The session that asked has ended (logout, a new sign-in, another account): its answer
    /// will be discarded, whatever it is. Asks for cancellation too.
    @discardableResult
    public func abandon() -> Bool {
        abandoned.store(true, ordering: .releasing)
        return requestCancellation()
    }

    /// Whether the session that asked has ended (`abandon`): an answer now is discarded — the
    /// tokens of a late success are never used or stored. (A cancellation for a timeout is
    /// not an abandonment: tokens that arrive after it are kept.)
    public var isAbandoned: Bool { abandoned.load(ordering: .acquiring) }

    /// Whether the authority said how to cancel and has not answered yet.
    public var isCancellable: Bool {
        !isCompleted && cancellation.withLockedValue { $0.handler != nil }
    }
}

extension AuthorityError {
    /// The answer of a request that was cancelled before it ended (transient).
    public static var cancelled: AuthorityError {
        AuthorityError(.transient, code: "cancelled", message: "the request was cancelled")
    }

    /// Whether this is the answer of a cancelled request.
    public var isCancellation: Bool { kind == .transient && code == "cancelled" }

    /// A refresh the server accepted (its 2xx status line arrived: the refresh token was
    /// rotated) whose answer was then lost — the connection dropped, the answer stalled or
    /// outlived its cap. The session sends the same refresh token once more at once: servers
    /// that rotate allow that within a grace period (Auth0's leeway, Okta's grace period,
    /// Cognito's), the only way such a session survives. Transient.
    public static func answerLost(_ message: String) -> AuthorityError {
        AuthorityError(.transient, code: "answer_lost", message: message)
    }

    /// Whether this is `answerLost`.
    public var isAnswerLost: Bool { kind == .transient && code == "answer_lost" }
}

/// How tokens are refreshed, validated and revoked. The built-in OAuth 2.0 authority is one;
/// a host can supply its own. Every method is called on the session's loop thread and must
/// not block: answer through the completion, now or later, from any thread.
public protocol SessionAuthority: Sendable {
    /// Exchanges a refresh token for new tokens (RFC 6749 §6 for OAuth 2.0).
    func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>)

    /// Whether `validate` asks the authority (e.g. RFC 7662 introspection).
    var canValidate: Bool { get }
    /// Answers whether the access token is still active.
    func validate(accessToken: Secret, completion: AuthorityCompletion<Bool>)

    /// Whether `revoke` does anything (e.g. RFC 7009).
    var canRevoke: Bool { get }
    /// Revokes the tokens, best effort: the session is already logged out locally.
    func revoke(refreshToken: Secret?, accessToken: Secret?, completion: AuthorityCompletion<Void>)
    /// The same for a session whose profile is `profile` (nil: it has none), which says the
    /// issuer that minted the tokens. The session calls this one; by default it is the call
    /// above (an authority of one issuer has no use for the profile).
    func revoke(refreshToken: Secret?, accessToken: Secret?, profile: SessionProfile?, completion: AuthorityCompletion<Void>)

    /// Whether the authority can sign a user in again by external user id.
    var canReauthenticate: Bool { get }
    /// The fallback tried once before SESSION_EXPIRED.
    func reauthenticate(externalUserID: String, completion: AuthorityCompletion<TokenGrant>)
}

extension SessionAuthority {
    public var canValidate: Bool { false }
    public func validate(accessToken: Secret, completion: AuthorityCompletion<Bool>) {
        completion.fail(.configuration("unsupported", "this authority cannot validate"))
    }

    public var canRevoke: Bool { false }
    public func revoke(refreshToken: Secret?, accessToken: Secret?, completion: AuthorityCompletion<Void>) {
        completion.succeed(())
    }
    public func revoke(
        refreshToken: Secret?, accessToken: Secret?, profile: SessionProfile?, completion: AuthorityCompletion<Void>
    ) {
        revoke(refreshToken: refreshToken, accessToken: accessToken, completion: completion)
    }

    public var canReauthenticate: Bool { false }
    public func reauthenticate(externalUserID: String, completion: AuthorityCompletion<TokenGrant>) {
        completion.fail(.configuration("unsupported", "this authority cannot re-authenticate"))
    }
}
