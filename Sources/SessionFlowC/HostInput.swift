import CSessionFlow
import SessionCore

#if canImport(Glibc)
import Glibc
#endif

/// What a C host hands in, bounded and checked before anything is copied (issue 29, point 7:
/// a 64 MiB token with a 16 MiB member id was taken and written as a 128 MiB store; a member
/// id of invalid UTF-8 came back with replacement characters, so two different ids became one
/// account). One rule for every string: at most its field's limit in bytes, valid UTF-8 (a
/// token's bytes are kept exactly as they are: the session hands back what it was given).
/// A string that breaks the rule is `SF_EINVAL`, naming the field.
enum HostInput {
    /// Access and refresh tokens (RFC 6749 sets no length; JWT-shaped ones run to a few KiB).
    static let maximumTokenLength = 64 * 1024
    /// Member ids and account keys (an account key is a member id).
    static let maximumMemberIDLength = 1024
    /// An issuer URL (RFC 9110 §4.1 recommends supporting 8 000 octets in a URI).
    static let maximumURLLength = 8192

    /// Why the C string `text` cannot be taken as `field`, or nil (nil `text` is fine: absent).
    /// Reads at most `limit + 1` bytes of it.
    static func problem(_ text: UnsafePointer<CChar>?, _ field: String, limit: Int, utf8: Bool = true) -> String? {
        guard let text else { return nil }
        let length = strnlen(text, limit + 1)
        guard length <= limit else { return "\(field) is longer than \(limit) bytes" }
        guard utf8 else { return nil }
        let bytes = UnsafeRawBufferPointer(start: text, count: length)
        guard String(validating: bytes, as: UTF8.self) != nil else {
            return "\(field) is not valid UTF-8 (it would come back changed)"
        }
        return nil
    }

    /// Why `tokens` (as `readTokens` read them) cannot be taken, or nil.
    static func problem(_ tokens: sf_tokens) -> String? {
        problem(tokens.access_token, "sf_tokens.access_token", limit: maximumTokenLength, utf8: false)
            ?? problem(tokens.refresh_token, "sf_tokens.refresh_token", limit: maximumTokenLength, utf8: false)
            ?? problem(tokens.member_id, "sf_tokens.member_id", limit: maximumMemberIDLength)
    }
}
