import CSessionFlow
import SessionCore

#if canImport(Glibc)
import Glibc
#endif

// Error codes, names and texts, and the version — all static strings.

/// A C string that lives as long as the process (made once, never freed, never written).
struct StaticCString: @unchecked Sendable {
    let pointer: UnsafePointer<CChar>
    init(_ text: String) { pointer = UnsafePointer(strdup(text)!) }
}

private struct ErrorText: Sendable {
    let name: StaticCString
    let text: StaticCString
}

/// Kept in step with SF_ERRNO_MAP in sessionflow.h (a test compares them).
private let errorTexts: [Int32: ErrorText] = {
    let table: [(Int32, String, String)] = [
        (SF_OK.rawValue, "SF_OK", "success"),
        (SF_EINVAL.rawValue, "SF_EINVAL", "invalid argument"),
        (SF_ECLOSED.rawValue, "SF_ECLOSED", "unknown, closed or already completed handle"),
        (SF_EBUSY.rawValue, "SF_EBUSY", "would wait for itself: called on the loop thread it waits for"),
        (SF_ETHREAD.rawValue, "SF_ETHREAD", "must be called on the thread that runs the borrowed loop"),
        (SF_ESTATE.rawValue, "SF_ESTATE", "not allowed in the current session state"),
        (SF_ESTORE.rawValue, "SF_ESTORE", "credential store failure"),
        (SF_EAUTH.rawValue, "SF_EAUTH", "the authority refused for good: the session has expired"),
        (SF_ENETWORK.rawValue, "SF_ENETWORK", "transient failure (network, timeout, 5xx, 429): retried later"),
        (SF_ERANGE.rawValue, "SF_ERANGE", "buffer too small"),
        (SF_ESHUTDOWN.rawValue, "SF_ESHUTDOWN", "the runtime is shutting down or shut down"),
        (SF_ECONFIG.rawValue, "SF_ECONFIG", "the authority rejected the client configuration"),
        (SF_ENOTLOGGEDIN.rawValue, "SF_ENOTLOGGEDIN", "no one is signed in"),
        (SF_EUNAUTHORIZED.rawValue, "SF_EUNAUTHORIZED", "a freshly refreshed token was refused again"),
        (SF_ESESSIONENDED.rawValue, "SF_ESESSIONENDED", "the session ended (logout or new sign-in) before the answer"),
    ]
    return Dictionary(uniqueKeysWithValues: table.map {
        ($0.0, ErrorText(name: StaticCString($0.1), text: StaticCString($0.2)))
    })
}()

private let unknownName = StaticCString("SF_EUNKNOWN")
private let unknownText = StaticCString("unknown error")
private let versionText = StaticCString("\(SF_VERSION_MAJOR).\(SF_VERSION_MINOR).\(SF_VERSION_PATCH)")

@c @implementation
public func sf_strerror(_ code: Int32) -> UnsafePointer<CChar>! {
    (errorTexts[code]?.text ?? unknownText).pointer
}

@c @implementation
public func sf_err_name(_ code: Int32) -> UnsafePointer<CChar>! {
    (errorTexts[code]?.name ?? unknownName).pointer
}

@c @implementation
public func sf_version() -> UInt32 {
    UInt32((SF_VERSION_MAJOR << 16) | (SF_VERSION_MINOR << 8) | SF_VERSION_PATCH)
}

@c @implementation
public func sf_version_string() -> UnsafePointer<CChar>! {
    versionText.pointer
}

extension sf_error {
    var code: Int32 { rawValue }
}

/// The C code for a session error.
func errorCode(_ error: SessionError) -> Int32 {
    switch error.code {
    case .illegalTransition: SF_ESTATE.code
    case .notLoggedIn: SF_ENOTLOGGEDIN.code
    case .sessionExpired: SF_EAUTH.code
    case .sessionEnded: SF_ESESSIONENDED.code
    case .transient: SF_ENETWORK.code
    case .configuration: SF_ECONFIG.code
    case .unauthorized: SF_EUNAUTHORIZED.code
    case .store: SF_ESTORE.code
    case .shutDown: SF_ESHUTDOWN.code
    case .invalidArgument: SF_EINVAL.code
    default: SF_EINVAL.code
    }
}
