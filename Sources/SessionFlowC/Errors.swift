import CSessionFlow
import SessionCore

#if canImport(Glibc)
import Glibc
#endif

// The version and the C codes of Swift errors. The error names and texts are not here:
// sf_strerror and sf_err_name are expanded in C from the header's SF_ERRNO_MAP (target
// SessionFlowErrors), so the table exists once.

/// A C string that lives as long as the process (made once, never freed, never written).
struct StaticCString: @unchecked Sendable {
    let pointer: UnsafePointer<CChar>
    init(_ text: String) { pointer = UnsafePointer(strdup(text)!) }
}

private let versionText = StaticCString("\(SF_VERSION_MAJOR).\(SF_VERSION_MINOR).\(SF_VERSION_PATCH)")

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
    case .storeUnavailable: SF_ESTORE.code
    case .shutDown: SF_ESHUTDOWN.code
    case .busy: SF_EBUSY.code
    case .invalidArgument: SF_EINVAL.code
    case .cancelled: SF_ECANCELLED.code
    case .accessDenied: SF_EDENIED.code
    case .signInExpired: SF_EEXPIRED.code
    default: SF_EINVAL.code
    }
}
