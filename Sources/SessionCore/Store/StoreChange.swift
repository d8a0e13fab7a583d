/// What to do about a change another process made to a shared store: a pure decision from
/// what the store holds now and where this session stands.
enum StoreChange: Equatable {
    /// Nothing to follow (unavailable, our own write, a record without tokens).
    case ignore
    /// The store is damaged: report it and write our session back.
    case damaged(StoreError)
    /// Logged out elsewhere: log out here too.
    case logout
    /// The session expired elsewhere.
    case expire
    /// The same session with tokens another process refreshed.
    case adoptTokens(StoredSession, access: Secret)
    /// Someone else signed in elsewhere: log out, then follow the sign-in.
    case switchSession(StoredSession, access: Secret)
    /// Signed in elsewhere while this process had no session.
    case signIn(StoredSession, access: Secret)

    /// - Parameter account: the record the session keeps in a store of several accounts (nil:
    ///   none, or a store of one session). What that record holds is this session's, whatever
    ///   member id a refresh reported.
    static func decide(_ read: StoreRead, state: SessionState, memberID: String?, account: String? = nil) -> StoreChange {
        switch read {
        case .unavailable:
            return .ignore
        case .damaged(let error):
            return .damaged(error)
        case .absent:
            return state == .loggedOut ? .ignore : .logout
        case .present(let stored):
            let same = stored.memberID == memberID || (account != nil && stored.account == account)
            if stored.expired {
                return state == .loggedIn && same ? .expire : .ignore
            }
            guard let access = stored.accessToken, !access.isBlank else { return .ignore }
            switch state {
            case .loggedIn where same:
                return .adoptTokens(stored, access: access)
            case .loggedIn:
                return .switchSession(stored, access: access)
            case .loggedOut, .sessionExpired:
                return .signIn(stored, access: access)
            }
        }
    }
}
