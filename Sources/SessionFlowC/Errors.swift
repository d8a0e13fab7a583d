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

/// Every `SessionError.Code`, once. `SessionError.Code` is a struct of static lets (it can
/// grow without breaking a Swift caller's `switch`), so a switch over it needs a `default`,
/// and a new code would fall into it unseen. A switch over this enum has none: a case added
/// here must be mapped, or nothing compiles. What adds the case when SessionCore adds a code
/// is `Bindings/run-tests.sh` (the C suite): it compares these cases with the static lets of
/// `SessionError.Code` by name and fails on any difference. The raw value is `Code.name`.
enum MappedSessionErrorCode: String, CaseIterable {
    case illegalTransition, notLoggedIn, sessionExpired, sessionEnded, transient, configuration,
         unauthorized, store, storeUnavailable, invalidArgument, shutDown, busy, cancelled,
         accessDenied, signInExpired

    /// The C code: the one place a session error's code is chosen.
    var c: sf_error {
        switch self {
        case .illegalTransition: SF_ESTATE
        case .notLoggedIn: SF_ENOTLOGGEDIN
        case .sessionExpired: SF_EAUTH
        case .sessionEnded: SF_ESESSIONENDED
        case .transient: SF_ENETWORK
        case .configuration: SF_ECONFIG
        case .unauthorized: SF_EUNAUTHORIZED
        case .store: SF_ESTORE
        case .storeUnavailable: SF_ESTORE
        case .shutDown: SF_ESHUTDOWN
        case .busy: SF_EBUSY
        case .invalidArgument: SF_EINVAL
        case .cancelled: SF_ECANCELLED
        case .accessDenied: SF_EDENIED
        case .signInExpired: SF_EEXPIRED
        }
    }
}

/// The C code for a session error. A code missing from `MappedSessionErrorCode` is a build
/// that skipped the C suite's check: debug builds stop there; a release says SF_EINVAL
/// rather than crash the host.
func errorCode(_ error: SessionError) -> Int32 {
    guard let mapped = MappedSessionErrorCode(rawValue: error.code.name) else {
        assertionFailure("SessionError.Code.\(error.code.name) has no C code: add it to MappedSessionErrorCode")
        return SF_EINVAL.code
    }
    return mapped.c.code
}
