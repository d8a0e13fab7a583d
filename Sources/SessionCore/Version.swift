/// The library's version: the same as `SF_VERSION_MAJOR.MINOR.PATCH` in
/// `Bindings/include/sessionflow.h` (a test holds them equal).
public enum SessionFlowVersion {
    public static let string = "0.2.0"
}
