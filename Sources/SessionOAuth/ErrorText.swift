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
        if patterns.contains(where: { $0.firstMatch(in: text) != nil }) {
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
            if !patterns.contains(where: { $0.firstMatch(in: bytes) != nil }) {
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
            for pattern in patterns {
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

/// One secret as the forms it may take in a text: for each of its Unicode scalars, the byte
/// patterns that stand for it. Matching runs the alternatives as a set of positions (an NFA),
/// so mixed forms and ambiguous prefixes (`%` itself, `\` itself) cost no backtracking. Kept
/// flat (three arrays per secret) and matched with reused scratch space: an error path may
/// run it on every answer, and a fuzzer millions of times.
struct SecretPattern {
    /// One byte of a form: that exact byte, or a hexadecimal digit of that value in either case.
    enum Unit: Equatable {
        case byte(UInt8)
        case hex(UInt8)

        func matches(_ b: UInt8) -> Bool {
            switch self {
            case .byte(let value): return b == value
            case .hex(let value):
                if value < 10 { return b == 0x30 + value }
                return b == 0x41 + value - 10 || b == 0x61 + value - 10
            }
        }
    }

    /// Every form's units, one form after another.
    private let units: [Unit]
    /// Form `f` is `units[formStarts[f]..<formStarts[f + 1]]`.
    private let formStarts: [Int]
    /// The forms of scalar `s` are `scalarStarts[s]..<scalarStarts[s + 1]`.
    private let scalarStarts: [Int]
    /// For scalar `s`, the bytes its forms begin with (a quick rejection inside a match).
    private let scalarFirstBytes: [(UInt64, UInt64, UInt64, UInt64)]
    /// Bytes that can begin a match (a quick rejection): a 256-bit set.
    let firstBytes: (UInt64, UInt64, UInt64, UInt64)

    init?(_ secret: Secret) {
        let text = secret.reveal()
        guard !text.isEmpty else { return nil }
        var units: [Unit] = []
        var formStarts: [Int] = [0]
        var scalarStarts: [Int] = [0]
        for scalar in text.unicodeScalars {
            Self.appendForms(of: scalar, to: &units, &formStarts)
            scalarStarts.append(formStarts.count - 1)
        }
        var scalarFirstBytes: [(UInt64, UInt64, UInt64, UInt64)] = []
        scalarFirstBytes.reserveCapacity(scalarStarts.count - 1)
        for scalar in 0..<(scalarStarts.count - 1) {
            var first: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)
            for form in scalarStarts[scalar]..<scalarStarts[scalar + 1] {
                guard case .byte(let b) = units[formStarts[form]] else {
                    preconditionFailure("a form begins with a hexadecimal digit")
                }
                let bit = UInt64(1) << UInt64(b & 63)
                switch b >> 6 {
                case 0: first.0 |= bit
                case 1: first.1 |= bit
                case 2: first.2 |= bit
                default: first.3 |= bit
                }
            }
            scalarFirstBytes.append(first)
        }
        self.units = units
        self.formStarts = formStarts
        self.scalarStarts = scalarStarts
        self.scalarFirstBytes = scalarFirstBytes
        self.firstBytes = scalarFirstBytes[0]
    }

    func canBegin(_ byte: UInt8) -> Bool {
        Self.contains(firstBytes, byte)
    }

    static func contains(_ set: (UInt64, UInt64, UInt64, UInt64), _ byte: UInt8) -> Bool {
        let bit = UInt64(1) << UInt64(byte & 63)
        switch byte >> 6 {
        case 0: return set.0 & bit != 0
        case 1: return set.1 & bit != 0
        case 2: return set.2 & bit != 0
        default: return set.3 & bit != 0
        }
    }

    /// The forms of one scalar: itself; its UTF-8 bytes percent-encoded, once and twice; `+`
    /// for a space; `\uXXXX` (UTF-16); the JSON short escape, if it has one.
    static func appendForms(of scalar: Unicode.Scalar, to units: inout [Unit], _ formStarts: inout [Int]) {
        func endForm() { formStarts.append(units.count) }
        let percent = UInt8(ascii: "%"), backslash = UInt8(ascii: "\\")
        var utf8: (UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0)
        var count = 0
        UTF8.encode(scalar) { byte in
            switch count {
            case 0: utf8.0 = byte
            case 1: utf8.1 = byte
            case 2: utf8.2 = byte
            default: utf8.3 = byte
            }
            count += 1
        }
        func byte(_ i: Int) -> UInt8 {
            switch i {
            case 0: utf8.0
            case 1: utf8.1
            case 2: utf8.2
            default: utf8.3
            }
        }
        func hex(_ value: UInt8) {
            units.append(.hex(value >> 4))
            units.append(.hex(value & 0xF))
        }
        for i in 0..<count { units.append(.byte(byte(i))) }
        endForm()
        for i in 0..<count {
            units.append(.byte(percent))
            hex(byte(i))
        }
        endForm()
        for i in 0..<count {
            units.append(.byte(percent))
            units.append(.byte(UInt8(ascii: "2")))
            units.append(.byte(UInt8(ascii: "5")))
            hex(byte(i))
        }
        endForm()
        if scalar == " " {
            units.append(.byte(UInt8(ascii: "+")))
            endForm()
        }
        for unit in UTF16.encode(scalar)! {
            units.append(.byte(backslash))
            units.append(.byte(UInt8(ascii: "u")))
            hex(UInt8(unit >> 8))
            hex(UInt8(unit & 0xFF))
        }
        endForm()
        let letter: Unicode.Scalar? = switch scalar {
        case "/", "\"", "\\": scalar
        case "\u{08}": "b"
        case "\u{0C}": "f"
        case "\n": "n"
        case "\r": "r"
        case "\t": "t"
        default: nil
        }
        if let letter {
            units.append(.byte(backslash))
            units.append(.byte(UInt8(letter.value)))
            endForm()
        }
    }

    /// Reusable position sets for `match`.
    struct Scratch {
        var positions: [Int] = []
        var next: [Int] = []

        init() {
            positions.reserveCapacity(8)
            next.reserveCapacity(8)
        }
    }

    /// The end of the longest match starting at `start`, or nil. With `cutTailMatches`, a
    /// match still alive when the bytes run out ends at `bytes.count`.
    func match(_ bytes: [UInt8], at start: Int, cutTailMatches: Bool, _ scratch: inout Scratch) -> Int? {
        guard start < bytes.count, canBegin(bytes[start]) else { return nil }
        scratch.positions.removeAll(keepingCapacity: true)
        scratch.positions.append(start)
        var alive = false  // a form that the end of bytes interrupted
        for scalar in 0..<(scalarStarts.count - 1) {
            scratch.next.removeAll(keepingCapacity: true)
            for position in scratch.positions {
                if position == bytes.count { alive = true; continue }
                guard Self.contains(scalarFirstBytes[scalar], bytes[position]) else { continue }
                for form in scalarStarts[scalar]..<scalarStarts[scalar + 1] {
                    let formStart = formStarts[form], formEnd = formStarts[form + 1]
                    var offset = 0
                    while formStart + offset < formEnd, position + offset < bytes.count,
                          units[formStart + offset].matches(bytes[position + offset]) {
                        offset += 1
                    }
                    if formStart + offset == formEnd {
                        let end = position + offset
                        if !scratch.next.contains(end) { scratch.next.append(end) }
                    } else if position + offset == bytes.count {
                        alive = true
                    }
                }
            }
            if scratch.next.isEmpty {
                return cutTailMatches && alive ? bytes.count : nil
            }
            swap(&scratch.positions, &scratch.next)
        }
        return scratch.positions.max()
    }

    /// The first match anywhere in `bytes` (whole secrets only).
    func firstMatch(in bytes: [UInt8]) -> Range<Int>? {
        var scratch = Scratch()
        for start in bytes.indices where canBegin(bytes[start]) {
            if let end = match(bytes, at: start, cutTailMatches: false, &scratch) { return start..<end }
        }
        return nil
    }
}
