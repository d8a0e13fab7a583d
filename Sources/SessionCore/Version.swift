internal import CSessionFlowVersion

/// The library's version: `SF_VERSION_MAJOR.MINOR.PATCH` of `Bindings/include/sessionflow.h`,
/// the one place the version is written (compiled in from its macros by the
/// `CSessionFlowVersion` C target).
public enum SessionFlowVersion {
    public static let string = String(cString: sessionflow_version_text())
}
