/// A `Duration` as the HTTP layer (milliseconds for libcurl) and the sign-in arithmetic
/// (fractional seconds) need it.
extension Duration {
    /// Seconds, fractions included.
    var seconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) / 1e18
    }

    /// Whole milliseconds, rounded up (a deadline never shrinks to 0).
    var milliseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000
    }
}
