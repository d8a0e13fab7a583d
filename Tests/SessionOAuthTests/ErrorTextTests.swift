import SessionCore
import Testing

@_spi(Fuzzing) @testable import SessionOAuth

/// Every form a test writes a secret in, built independently of ErrorText (so a bug in its
/// matcher is not repeated here): raw, form-encoded with `+` and upper/lower hex, every byte
/// percent-encoded (upper, lower), %20 for space, percent-encoded twice, JSON-escaped the way
/// different encoders do it (`\/`, every character as `\u00XX` upper and lower, non-ASCII
/// as UTF-16 `\uXXXX` and surrogate pairs), and mixed.
enum SecretForms {
    static let hexUpper = Array("0123456789ABCDEF")
    static let hexLower = Array("0123456789abcdef")

    static func percent(_ byte: UInt8, lower: Bool) -> String {
        let digits = lower ? hexLower : hexUpper
        return "%" + String(digits[Int(byte >> 4)]) + String(digits[Int(byte & 0xF)])
    }

    /// application/x-www-form-urlencoded as FormEncoding writes it (unreserved kept, space `+`).
    static func form(_ text: String, lower: Bool = false) -> String {
        let unreserved = Set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._*".utf8)
        return text.utf8.map { byte in
            unreserved.contains(byte) ? String(UnicodeScalar(byte)) : byte == 0x20 ? "+" : percent(byte, lower: lower)
        }.joined()
    }

    /// RFC 3986 style: unreserved kept, everything else (space too) as %XX.
    static func uri(_ text: String, lower: Bool = false) -> String {
        let unreserved = Set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~".utf8)
        return text.utf8.map { unreserved.contains($0) ? String(UnicodeScalar($0)) : percent($0, lower: lower) }.joined()
    }

    /// Every byte encoded.
    static func everyByte(_ text: String, lower: Bool = false) -> String {
        text.utf8.map { percent($0, lower: lower) }.joined()
    }

    static func twice(_ text: String) -> String {
        uri(uri(text))
    }

    static func unicodeEscape(_ unit: UInt16, lower: Bool) -> String {
        let digits = lower ? hexLower : hexUpper
        return "\\u" + [12, 8, 4, 0].map { String(digits[Int((unit >> UInt16($0)) & 0xF)]) }.joined()
    }

    /// A JSON encoder that escapes `/` and `"` and `\` shortly, and non-ASCII as \uXXXX.
    static func json(_ text: String) -> String {
        text.unicodeScalars.map { scalar -> String in
            switch scalar {
            case "/": return "\\/"
            case "\"": return "\\\""
            case "\\": return "\\\\"
            case "\n": return "\\n"
            case "\t": return "\\t"
            default:
                if scalar.isASCII && scalar.value >= 0x20 { return String(scalar) }
                return String(scalar).utf16.map { unicodeEscape($0, lower: false) }.joined()
            }
        }.joined()
    }

    /// Every character as \u00XX (an encoder that escapes everything it may).
    static func jsonEverything(_ text: String, lower: Bool) -> String {
        text.utf16.map { unicodeEscape($0, lower: lower) }.joined()
    }

    /// Halves in different forms.
    static func mixed(_ text: String) -> String {
        let half = text.count / 2
        return uri(String(text.prefix(half)), lower: true) + json(String(text.dropFirst(half)))
    }

    static func all(_ text: String) -> [(String, String)] {
        [
            ("raw", text),
            ("form, upper hex", form(text)), ("form, lower hex", form(text, lower: true)),
            ("uri %20, upper", uri(text)), ("uri %20, lower", uri(text, lower: true)),
            ("every byte, upper", everyByte(text)), ("every byte, lower", everyByte(text, lower: true)),
            ("percent-encoded twice", twice(text)),
            ("JSON short escapes", json(text)),
            ("JSON \\u00XX upper", jsonEverything(text, lower: false)),
            ("JSON \\u00xx lower", jsonEverything(text, lower: true)),
            ("mixed", mixed(text)),
        ]
    }
}

@Suite("Error text from an allow-list (issue 13)")
struct ErrorTextTests {
    /// Secrets with characters every encoder treats differently.
    static let secrets = [
        "rt-S3NT1NEL-9f8e7d",
        "a/b+c d=e&f%g\"h\\i",
        "tok.ü€𝄞~*",
        "client secret/with spaces",
    ]
    static let shortSecrets = ["x7", "Q", "%", "a b"]

    func isAllowed(_ text: String) -> Bool {
        text.utf8.allSatisfy { (0x20...0x7E).contains($0) && $0 != 0x22 && $0 != 0x5C }
    }

    // MARK: code

    @Test(arguments: [
        "invalid_request", "invalid_client", "invalid_grant", "unauthorized_client", "unsupported_grant_type",
        "invalid_scope", "access_denied", "unsupported_response_type", "server_error", "temporarily_unavailable",
        "unsupported_token_type", "invalid_token", "insufficient_scope", "authorization_pending", "slow_down",
        "expired_token",
    ])
    func eachAllowedCodePasses(_ code: String) {
        #expect(ErrorText.code(code) == code)
    }

    @Test(arguments: [
        "", "INVALID_GRANT", "invalid_grant ", " invalid_grant", "invalid_grant\u{1B}[2J", "Invalid_Grant",
        "invalid-grant", "rt-S3NT1NEL-9f8e7d", "\u{1B}]0;pwned\u{07}", "server_error\n", "ｉnvalid_grant",
        "mfa_required", "login_required", String(repeating: "x", count: 10_000),
    ])
    func anUnknownCodeBecomesTheMarker(_ code: String) {
        #expect(ErrorText.code(code) == ErrorText.unrecognisedCode)
        #expect(ErrorText.code(code) == "unrecognised_error")
    }

    @Test func noCodeStaysNone() {
        #expect(ErrorText.code(nil) == nil)
        #expect(ErrorText.description(nil, secrets: [Secret("s")]) == nil)
    }

    // MARK: scrub

    @Test(arguments: ErrorTextTests.secrets + ErrorTextTests.shortSecrets)
    func everyFormOfEverySecretIsScrubbed(_ value: String) {
        let secret = Secret(value)
        for (name, form) in SecretForms.all(value) {
            let text = "before \(form) after"
            let scrubbed = ErrorText.scrub(text, secrets: [Secret("unrelated"), secret])
            #expect(!scrubbed.contains(value), "\(name): \(scrubbed)")
            #expect(!scrubbed.contains(form), "\(name): \(scrubbed)")
            #expect(scrubbed.contains("<redacted>"), "\(name): \(scrubbed)")
            #expect(!ErrorText.containsSecret(scrubbed, secrets: [secret]), "\(name): \(scrubbed)")
            #expect(ErrorText.containsSecret(text, secrets: [secret]), "\(name)")
            // The words around it are left alone (a one-letter secret may eat into them).
            if value.count > 2 {
                #expect(scrubbed == "before <redacted> after", "\(name): \(scrubbed)")
            }
            let described = ErrorText.description(text, secrets: [secret])
            #expect(described.map { !ErrorText.containsSecret($0, secrets: [secret]) } == true, "\(name): \(described ?? "nil")")
            #expect(described.map(isAllowed) == true, "\(name): \(described ?? "nil")")
        }
    }

    @Test func severalSecretsAndRepeatsAreAllScrubbed() {
        let secrets = Self.secrets.map(Secret.init)
        let text = Self.secrets.flatMap { value in SecretForms.all(value).map(\.1) }.joined(separator: " | ")
        let scrubbed = ErrorText.scrub(text, secrets: secrets)
        #expect(!ErrorText.containsSecret(scrubbed, secrets: secrets))
        let count = Self.secrets.count * SecretForms.all("x").count
        #expect(scrubbed == Array(repeating: "<redacted>", count: count).joined(separator: " | "), "\(scrubbed)")
    }

    @Test func emptySecretsAreIgnoredAndNothingIsTouchedWithoutSecrets() {
        let text = "nothing secret here: \u{1B}[2J é"
        #expect(ErrorText.scrub(text, secrets: []) == text)
        #expect(ErrorText.scrub(text, secrets: [Secret("")]) == text)
        #expect(ErrorText.scrub("", secrets: [Secret("a")]) == "")
        #expect(!ErrorText.containsSecret(text, secrets: [Secret("")]))
        #expect(ErrorText.description("", secrets: [Secret("")]) == "")
    }

    @Test func aShortSecretIsStillScrubbed() {
        #expect(ErrorText.scrub("pin 42 is wrong", secrets: [Secret("42")]) == "pin <redacted> is wrong")
        #expect(ErrorText.scrub("b", secrets: [Secret("b")]) == "<redacted>")
        // A letter of the marker itself: the marker would spell it, so nothing is shown.
        #expect(ErrorText.scrub("a", secrets: [Secret("a")]) == "")
        #expect(ErrorText.description("code=x7&y=%78%37", secrets: [Secret("x7")]) == "code=<redacted>&y=<redacted>")
    }

    @Test func aSecretSpelledByAReplacementIsScrubbedToo() {
        // "zz" becomes "<redacted>", whose ">" and the "abc" after it spell the other secret.
        let secrets = [Secret("zz"), Secret(">abc")]
        let scrubbed = ErrorText.scrub("1 zzabc 2", secrets: secrets)
        #expect(!ErrorText.containsSecret(scrubbed, secrets: secrets), "\(scrubbed)")
        #expect(scrubbed == "1 <redacted<redacted> 2")
        // A secret inside the marker itself: nothing is left to show.
        #expect(ErrorText.scrub("x", secrets: [Secret("x"), Secret("<")]) == "")
        #expect(ErrorText.description("x", secrets: [Secret("x"), Secret("d")]) == "")
    }

    @Test func aCurlErrorTextIsScrubbedToo() {
        let secret = Secret("p@ss word/1")
        let text = "Failed to connect to user:p%40ss+word%2F1@127.0.0.1 port 1: Connection refused"
        #expect(ErrorText.scrub(text, secrets: [secret])
            == "Failed to connect to user:<redacted>@127.0.0.1 port 1: Connection refused")
    }

    // MARK: description

    @Test func aPlainDescriptionIsKept() {
        let text = "The refresh token is expired, revoked or was issued to another client."
        #expect(ErrorText.description(text, secrets: [Secret("rt-1")]) == text)
    }

    @Test func terminalEscapeSequencesAreRemoved() {
        let text = "\u{1B}]0;pwned\u{07}\u{1B}[2J session OK\u{1B}[31mred\u{9B}2J\r\nnext\u{7F}line\u{00}"
        let described = ErrorText.description(text, secrets: [])!
        #expect(isAllowed(described), "\(described)")
        #expect(!described.utf8.contains(0x1B) && !described.utf8.contains(0x07))
        #expect(described == "?]0;pwned?[2J session OK?[31mred?2J?next?line?")
    }

    @Test func nonASCIIAndTheExcludedCharactersAreReplaced() {
        let described = ErrorText.description("caf\u{E9} \"quoted\" back\\slash ｉd \u{202E}evil \u{200B}z", secrets: [])!
        #expect(described == "caf? 'quoted' back?slash ?d ?evil ?z")
        #expect(isAllowed(described))
    }

    @Test func aLongDescriptionIsCutWithTheMarker() {
        let text = String(repeating: "abcdefghij", count: 100)
        let described = ErrorText.description(text, secrets: [])!
        #expect(described.count == ErrorText.maximumDescriptionLength)
        #expect(described.hasSuffix("..."))
        #expect(described == String(text.prefix(197)) + "...")
        let exactly = String(repeating: "y", count: 200)
        #expect(ErrorText.description(exactly, secrets: []) == exactly)
        #expect(ErrorText.description(exactly + "z", secrets: [])!.hasSuffix("yyy..."))
    }

    /// A secret around the cut at 200 characters (and at the bound of what is read), in each
    /// form: never a piece of it in the answer.
    @Test(arguments: ErrorTextTests.secrets)
    func aSecretStraddlingTheCutLeavesNoPiece(_ value: String) {
        let secret = Secret(value)
        for (name, form) in SecretForms.all(value) {
            for start in stride(from: 180, through: 205, by: 1) {
                let text = String(repeating: "w", count: start) + form + String(repeating: "z", count: 300)
                let described = ErrorText.description(text, secrets: [secret])!
                #expect(described.count <= ErrorText.maximumDescriptionLength)
                #expect(isAllowed(described))
                // No prefix of the secret (of at least 3 characters) after the w's.
                let tail = String(described.drop { $0 == "w" })
                let pieces = (3...max(3, value.count)).map { String(value.prefix($0)) }
                #expect(!pieces.contains { tail.hasPrefix($0) }, "\(name) at \(start): \(described)")
                #expect(!pieces.contains { tail.hasPrefix(SecretForms.uri($0)) && $0.count > 3 }, "\(name) at \(start): \(described)")
            }
            // Cut at the input bound: what is read ends inside the secret.
            let bound = ErrorText.maximumDescriptionInput
            let cutText = String(repeating: "w", count: bound - 4) + form
            let cutScrubbed = ErrorText.replace(
                Array(cutText.utf8.prefix(bound)), [SecretPattern(secret)!], redactingCutTail: true)
            #expect(String(decoding: cutScrubbed, as: UTF8.self).hasSuffix("w<redacted>"), "\(name)")
        }
    }

    /// Only `maximumDescriptionInput` bytes are read. How long the worst text takes is the
    /// benchmark's row (`loopflow-bench --only errortext`), not this test's: its time limit is
    /// a hang guard. That the matcher does no quadratic work on near misses is
    /// `SecretPatternStartsTests.nearMissesOfALongSecretLeaveNoStartToTry`.
    @Test(.timeLimit(.minutes(1)))
    func aHugeDescriptionIsReadOnlyToItsBound() {
        let secret = Secret("rt-S3NT1NEL-9f8e7d")
        let text = String(repeating: "\u{1B}", count: 1 << 20) + "rt-S3NT1NEL-9f8e7d"
        let described = ErrorText.description(text, secrets: [secret])
        #expect(described == "?")
        // Adversarial for the matcher: many near-misses of a long secret.
        let long = String(repeating: "a", count: 1000) + "b"
        let near = String(repeating: "a", count: 1 << 20)
        let huge = ErrorText.description(near, secrets: [Secret(long)])!
        #expect(huge.count == ErrorText.maximumDescriptionLength)
    }

    /// Pieces that only become the secret once control characters are removed, or once a
    /// replaced character turns into the placeholder: caught by the second scrub.
    @Test func aSecretFormedByFilteringIsCaught() {
        let secret = Secret("ab?cd")
        #expect(ErrorText.description("x ab\u{01}cd y", secrets: [secret]) == "x <redacted> y")
        let joined = Secret("abcd")
        #expect(ErrorText.description("x ab\u{01}\u{02}cd y", secrets: [joined]) == "x ab?cd y")
        // A secret ending in the ellipsis, formed by the cut: the whole description goes.
        let dots = Secret("wwww...")
        let described = ErrorText.description(String(repeating: "w", count: 400), secrets: [dots])
        #expect(described == "<redacted>")
    }

    @Test func theServersEchoIsScrubbedFilteredAndShort() {
        // What oauth_server.py's `echo` fault sends (the refresh token raw, percent-encoded,
        // JSON-escaped, the client secret, then a terminal sequence).
        let refresh = "rt/+ü é\"x"
        let client = "s3cret"
        let text = [refresh, SecretForms.form(refresh), SecretForms.uri(refresh, lower: true),
                    SecretForms.json(refresh), client, "\u{1B}]0;pwned\u{07}\u{1B}[2J session OK"].joined(separator: " ")
        let described = ErrorText.description(text, secrets: [Secret(refresh), Secret(client)])!
        #expect(described == "<redacted> <redacted> <redacted> <redacted> <redacted> ?]0;pwned?[2J session OK")
    }
}
