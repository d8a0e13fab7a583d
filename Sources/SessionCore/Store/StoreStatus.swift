/// Whether the session has its store's answer: observed next to `SessionState`, it tells
/// "no session" (`loggedOut`, `available`) from "cannot read the session yet" (`loggedOut`,
/// `reading` or `unavailable`). `SessionManager.storeStatus`. Until the initial read has
/// answered, a sign-in is refused (`SessionError.Code.storeUnavailable`) unless the host asks
/// to replace the store (`signIn(_:replacingUnreadableStore:)`): nothing stored is lost
/// without the host asking.
public enum StoreStatus: Sendable, Equatable, CustomStringConvertible {
    /// The stored session is being read on the store's worker (the session was made on its
    /// loop thread, which never waits for the store): the state says `loggedOut` until the
    /// read answers, then what the store holds.
    case reading
    /// The store answered its last read or write.
    case available
    /// The store did not answer the initial read (the session is restored once it does) or
    /// missed a write (the session goes on in memory); both are retried.
    case unavailable(StoreError)

    public var description: String {
        switch self {
        case .reading: "reading"
        case .available: "available"
        case .unavailable(let error): "unavailable (\(error.message))"
        }
    }
}
