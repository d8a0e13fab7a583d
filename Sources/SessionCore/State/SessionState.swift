/// Where a session stands.
public enum SessionState: String, Sendable, Equatable, CaseIterable, CustomStringConvertible {
    /// No one is signed in.
    case loggedOut
    /// Signed in with tokens the library keeps fresh.
    case loggedIn
    /// The authority refused the refresh token for good: the user must sign in again.
    /// The member id is kept so the app can say who.
    case sessionExpired

    public var description: String { rawValue }
}

/// What someone asks the session to do.
public enum SessionRequest: String, Sendable, Equatable, CustomStringConvertible {
    /// Sign in with new tokens.
    case signIn
    /// Sign out on purpose.
    case logout
    /// The authority's terminal answer: the session is over.
    case expire
    /// Forget everything, member id included (only from `sessionExpired`).
    case reconfigure

    public var description: String { rawValue }
}

/// The legal transitions, and nothing else (a pure value: no IO, no clock).
///
/// | from \ request | signIn | logout | expire | reconfigure |
/// | --- | --- | --- | --- | --- |
/// | loggedOut | loggedIn | — | — | — |
/// | loggedIn | — | loggedOut | sessionExpired | — |
/// | sessionExpired | loggedIn | loggedOut | — | loggedOut |
public struct SessionStateMachine: Sendable, Equatable {
    public private(set) var state: SessionState

    public init(state: SessionState = .loggedOut) {
        self.state = state
    }

    /// The state `request` leads to from `state`, or nil if it is not allowed.
    public static func target(of request: SessionRequest, from state: SessionState) -> SessionState? {
        switch (state, request) {
        case (.loggedOut, .signIn), (.sessionExpired, .signIn): .loggedIn
        case (.loggedIn, .logout), (.sessionExpired, .logout), (.sessionExpired, .reconfigure): .loggedOut
        case (.loggedIn, .expire): .sessionExpired
        default: nil
        }
    }

    /// Applies `request`. An illegal request throws `SessionError.illegalTransition` and
    /// changes nothing.
    @discardableResult
    public mutating func apply(_ request: SessionRequest) throws(SessionError) -> SessionState {
        guard let next = Self.target(of: request, from: state) else {
            throw SessionError.illegalTransition(from: state, request: request)
        }
        state = next
        return next
    }
}
