// Standard library only: SessionOAuth is leaving Foundation (issue 13).
import SessionCore

/// What of a server's error answer may reach a message (issue 13, point 5). A token,
/// revocation or introspection endpoint is told our secrets (the refresh token, the client
/// secret, the token being revoked or introspected), and whatever it writes back may end in
/// a log, an `AuthorityError`, a C host's error callback or a terminal. So:
///
/// - the `error` code passes only if it is one an endpoint of ours can answer (RFC 6749
///   §5.2 and §4.1.2.1, RFC 6750 §3.1, RFC 7009 §2.2.1, RFC 8628 §3.5); anything else
///   becomes `unrecognisedCode`, never the server's text;
/// - `error_description` is scrubbed of every secret in every form a server might echo it
///   (raw, percent-encoded, form-encoded, JSON-escaped: see `scrub`), then kept to the
///   characters RFC 6749 allows there (%x20-21 / %x23-5B / %x5D-7E: printable ASCII without
///   `"` and `\`; so no terminal escape sequence, control character or look-alike letter
///   survives), then cut to `maximumDescriptionLength` characters;
/// - `scrub` applies the same secret forms to any text (an HTTP client's error text, say).
///
/// Pure functions: no I/O, no locale, no Foundation.
@_spi(Fuzzing) public enum ErrorText {
    /// What an unrecognised `error` code becomes.
    public static let unrecognisedCode = "unrecognised_error"
    /// What every form of a secret becomes (what `Secret` itself prints).
    public static let redacted = "<redacted>"
    /// What a description ends with when it was cut.
    public static let ellipsis = "..."
    /// The longest description `description(_:secrets:)` returns, ellipsis included.
    public static let maximumDescriptionLength = 200
    /// What stands for a run of characters RFC 6749 does not allow in `error_description`.
    public static let placeholder: Character = "?"
    /// How much of a description is read at all (bytes of UTF-8): far more than can reach
    /// the 200 characters kept, and a bound on the scrubbing work a server can cause with a
    /// megabyte of text. A secret cut by this bound is redacted as if whole.
    public static let maximumDescriptionInput = 4096

    /// The codes an endpoint of ours may answer with, passed through as they are.
    public static let knownCodes: Set<String> = [
        // RFC 6749 §5.2 (token endpoint)
        "invalid_request", "invalid_client", "invalid_grant", "unauthorized_client",
        "unsupported_grant_type", "invalid_scope",
        // RFC 6749 §4.1.2.1 (also answered by token endpoints in practice)
        "access_denied", "unsupported_response_type", "server_error", "temporarily_unavailable",
        // RFC 7009 §2.2.1 (revocation)
        "unsupported_token_type",
        // RFC 6750 §3.1 (bearer token use; introspection and resource servers)
        "invalid_token", "insufficient_scope",
        // RFC 8628 §3.5 (device authorization grant)
        "authorization_pending", "slow_down", "expired_token",
        // RFC 9449 §7.1, §8 (DPoP)
        "invalid_dpop_proof", "use_dpop_nonce",
    ]

    /// The `error` code as a message may show it: nil when the server sent none, the code
    /// itself when it is in `knownCodes` (exactly: codes are case-sensitive), otherwise
    /// `unrecognisedCode`.
    public static func code(_ raw: String?) -> String? {
        guard let raw else { return nil }
        return knownCodes.contains(raw) ? raw : unrecognisedCode
    }

    /// The `error_description` as a message may show it, or nil when the server sent none.
    /// In order: every form of every secret becomes `redacted`; each run of characters
    /// outside %x20-21 / %x23-5B / %x5D-7E becomes one `placeholder` (a `"` becomes `'`);
    /// scrubbed again (a secret with a `?` or `'` in it may only now appear);
    /// cut to `maximumDescriptionLength` characters with `ellipsis`. Should a secret still be
    /// found in the result (a secret containing `?` or `...` can be formed by those steps),
    /// the whole description is `redacted` (or empty, if a secret is part of `redacted`).
    public static func description(_ raw: String?, secrets: [Secret]) -> String? {
        guard let raw else { return nil }
        let patterns = secrets.compactMap(SecretPattern.init)
        var bytes = Array(raw.utf8)
        let cut = bytes.count > maximumDescriptionInput
        if cut {
            var end = maximumDescriptionInput
            while end > 0 && bytes[end] & 0xC0 == 0x80 { end -= 1 }  // a scalar boundary
            bytes.removeSubrange(end...)
        }
        var text = replace(bytes, patterns, redactingCutTail: cut)
        text = allowedCharacters(text)
        text = replace(text, patterns, redactingCutTail: false)
        if text.count > maximumDescriptionLength {
            text = Array(text.prefix(maximumDescriptionLength - ellipsis.utf8.count)) + Array(ellipsis.utf8)
        }
        let readings = ScalarReadings(text)
        if patterns.contains(where: { $0.firstMatch(in: text, readings: readings) != nil }) {
            return fallback(patterns)
        }
        return String(decoding: text, as: UTF8.self)
    }

    /// `text` with every form of every non-empty secret replaced by `redacted`. A secret
    /// matches when each of its characters appears, one after another, as itself or as:
    /// - percent-encoding of its UTF-8 bytes, `%2F` or `%2f` (any mix of cases), also
    ///   percent-encoded twice (`%252F`);
    /// - `+` for a space (form encoding; `%20` is covered above);
    /// - a JSON escape: `\uXXXX` in either case (UTF-16, so a surrogate pair beyond U+FFFF),
    ///   `\/`, `\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`.
    /// So a secret is found however an encoder chose which characters to escape, and when
    /// the forms are mixed. Short secrets are scrubbed too (a one-character secret removes
    /// that character everywhere); empty ones are ignored.
    ///
    /// Nothing of what it returns is a form of a secret: should a replacement make one (the
    /// end of `<redacted>` and what follows it spelling another secret), it scrubs again, and
    /// after four rounds gives `redacted` alone (or nothing, if a secret is part of `redacted`).
    public static func scrub(_ text: String, secrets: [Secret]) -> String {
        let patterns = secrets.compactMap(SecretPattern.init)
        guard !patterns.isEmpty else { return text }
        var bytes = Array(text.utf8)
        for _ in 0..<4 {
            bytes = replace(bytes, patterns, redactingCutTail: false)
            let readings = ScalarReadings(bytes)
            if !patterns.contains(where: { $0.firstMatch(in: bytes, readings: readings) != nil }) {
                return String(decoding: bytes, as: UTF8.self)
            }
        }
        return fallback(patterns)
    }

    /// `redacted`, or nothing when a secret is part of it (a secret "<" or "d").
    static func fallback(_ patterns: [SecretPattern]) -> String {
        let marker = Array(redacted.utf8)
        return patterns.contains(where: { $0.firstMatch(in: marker) != nil }) ? "" : redacted
    }

    /// Whether any form `scrub` knows of any non-empty secret appears in `text` (for tests,
    /// fuzzers and assertions).
    public static func containsSecret(_ text: String, secrets: [Secret]) -> Bool {
        let bytes = Array(text.utf8)
        return secrets.compactMap(SecretPattern.init).contains { $0.firstMatch(in: bytes) != nil }
    }

    // MARK: Steps

    /// Every match of any pattern replaced by `redacted` (the longest match at each place).
    /// With `redactingCutTail`, a match the end of `bytes` interrupts counts as a match to
    /// the end: the text was cut there, and the rest of that secret was in what was cut.
    static func replace(_ bytes: [UInt8], _ patterns: [SecretPattern], redactingCutTail: Bool) -> [UInt8] {
        guard !patterns.isEmpty else { return bytes }
        var candidates: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)  // bytes that can begin a match
        for pattern in patterns {
            candidates.0 |= pattern.firstBytes.0
            candidates.1 |= pattern.firstBytes.1
            candidates.2 |= pattern.firstBytes.2
            candidates.3 |= pattern.firstBytes.3
        }
        var scratch = SecretPattern.Scratch()
        // Where each secret can match at all (one linear pass per secret): `match` runs only
        // there, so a text of near misses costs no more than any other.
        let readings = ScalarReadings(bytes)
        let starts = patterns.map { $0.matchStarts(in: bytes, readings: readings, cutTailMatches: redactingCutTail) }
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var index = 0
        while index < bytes.count {
            let byte = bytes[index]
            if !SecretPattern.contains(candidates, byte) {
                out.append(byte)
                index += 1
                continue
            }
            var end: Int? = nil
            for (number, pattern) in patterns.enumerated() where starts[number][index] {
                if let e = pattern.match(bytes, at: index, cutTailMatches: redactingCutTail, &scratch), e > index,
                   e > (end ?? index)
                {
                    end = e
                }
            }
            if let end {
                out += redacted.utf8
                index = end
            } else {
                out.append(bytes[index])
                index += 1
            }
        }
        return out
    }

    /// Only %x20-21 / %x23-5B / %x5D-7E; `"` becomes `'`; each run of anything else (control
    /// characters, DEL, `\`, every non-ASCII scalar) becomes one `placeholder`.
    static func allowedCharacters(_ bytes: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var inRun = false
        for byte in bytes {
            let allowed = (0x20...0x7E).contains(byte) && byte != 0x22 && byte != 0x5C
            if allowed {
                out.append(byte)
                inRun = false
            } else if byte == 0x22 {
                out.append(UInt8(ascii: "'"))
                inRun = false
            } else if !inRun {
                out.append(placeholder.asciiValue!)
                inRun = true
            }
        }
        return out
    }
}
