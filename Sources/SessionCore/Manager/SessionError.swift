/// Why a session call failed. A struct with an extensible `Code` (new codes can be added
/// without breaking anyone's `switch`). Messages never contain a token.
public struct SessionError: Error, Hashable, Sendable, CustomStringConvertible {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        public let name: String
        private init(_ name: String) { self.name = name }

        /// The request is not allowed from the current state (the legal transitions of SessionStateMachine).
        public static let illegalTransition = Code("illegalTransition")
        /// No one is signed in.
        public static let notLoggedIn = Code("notLoggedIn")
        /// The session expired; the user must sign in again.
        public static let sessionExpired = Code("sessionExpired")
        /// The session this request belonged to ended (logout, or a new sign-in) before it
        /// was answered.
        public static let sessionEnded = Code("sessionEnded")
        /// A transient failure (network, timeout, 5xx, 429): the tokens are kept and the
        /// refresh is retried with backoff. `retryAfter` says when.
        public static let transient = Code("transient")
        /// The authority rejected the client's configuration (e.g. `invalid_client`):
        /// nothing is retried automatically.
        public static let configuration = Code("configuration")
        /// A token fresh from a 401-triggered refresh got a 401 again: no further refresh.
        public static let unauthorized = Code("unauthorized")
        /// The credential store failed.
        public static let store = Code("store")
        /// The store has not answered the initial read (it cannot be read, or its read is still
        /// on the worker), so the stored session is not known: a sign-in that would replace it
        /// is refused unless the host asks to replace the store. See `storeStatus`.
        public static let storeUnavailable = Code("storeUnavailable")
        /// An argument was unusable (e.g. a blank access token).
        public static let invalidArgument = Code("invalidArgument")
        /// The event loop is shut down.
        public static let shutDown = Code("shutDown")
        /// Too many requests are waiting already (the loop's limit of waiting requests, or
        /// `SessionConfiguration.tokenRequestLimit`): nothing was queued, no callback will run.
        /// The loop is stuck in a callback or far behind, or the authority is slow; retry later.
        public static let busy = Code("busy")
        /// A sign-in was cancelled (its flow stopped; nothing was signed in).
        public static let cancelled = Code("cancelled")
        /// The user (or the authority for them) refused the sign-in (`access_denied`).
        public static let accessDenied = Code("accessDenied")
        /// The sign-in took too long: its code expired (`expired_token`, or its lifetime ran
        /// out here) before the user approved it. Start again.
        public static let signInExpired = Code("signInExpired")

        public var description: String { name }
    }

    public let code: Code
    public let message: String
    /// For `transient`: when the next attempt is due, if one is scheduled.
    public let retryAfter: Duration?

    public init(_ code: Code, _ message: String, retryAfter: Duration? = nil) {
        self.code = code
        self.message = message
        self.retryAfter = retryAfter
    }

    public var description: String {
        if let retryAfter {
            return "SessionError.\(code): \(message) (retry in \(retryAfter))"
        }
        return "SessionError.\(code): \(message)"
    }

    public static func illegalTransition(from state: SessionState, request: SessionRequest) -> SessionError {
        SessionError(.illegalTransition, "cannot \(request) while \(state)")
    }
}
