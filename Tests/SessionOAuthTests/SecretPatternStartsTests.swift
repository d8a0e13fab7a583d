import SessionCore
import Testing

@_spi(Fuzzing) @testable import SessionOAuth

/// `SecretPattern.matchStarts` — the linear pass that says where a secret can match — agrees
/// with `match` tried at every start (the scan it replaces), on texts made of the secret's
/// forms, pieces of them, near misses and noise. Should it ever say "no" where `match` says
/// "yes", a secret would pass unscrubbed: the comparison below fails on that.
@Suite struct SecretPatternStartsTests {
    /// A small deterministic generator (SplitMix64): the same texts on every run.
    struct Generator: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    static let alphabet: [Unicode.Scalar] = ["a", "b", "%", "\\", " ", "+", "/", "\"", "\n", "é", "€", "😀", "2", "5", "u"]

    /// One scalar in a form chosen at random: any form `ErrorText.scrub` documents.
    static func form(of scalar: Unicode.Scalar, _ random: inout Generator) -> String {
        let utf8 = Array(String(scalar).utf8)
        let lower = Bool.random(using: &random)
        switch Int.random(in: 0..<6, using: &random) {
        case 1: return utf8.map { SecretForms.percent($0, lower: lower) }.joined()
        case 2: return utf8.map { "%25" + SecretForms.percent($0, lower: lower).dropFirst() }.joined()
        case 3 where scalar == " ": return "+"
        case 4:
            return String(scalar).utf16.map { unit in
                let digits = lower ? SecretForms.hexLower : SecretForms.hexUpper
                return "\\u" + [12, 8, 4, 0].map { String(digits[Int(unit >> $0) & 0xF]) }.joined()
            }.joined()
        case 5:
            let short: [Unicode.Scalar: String] = ["/": "\\/", "\"": "\\\"", "\\": "\\\\", "\n": "\\n"]
            return short[scalar] ?? String(scalar)
        default: return String(scalar)
        }
    }

    /// Every start where `match` finds a match: the reference.
    static func startsByTryingEach(_ pattern: SecretPattern, _ bytes: [UInt8], cutTail: Bool) -> [Bool] {
        var scratch = SecretPattern.Scratch()
        return bytes.indices.map { pattern.match(bytes, at: $0, cutTailMatches: cutTail, &scratch) != nil }
    }

    @Test func theLinearPassFindsExactlyTheStartsWhereMatchMatches() {
        var random = Generator(state: 2026)
        var compared = 0, matching = 0
        for _ in 0..<600 {
            let length = Int.random(in: 1...6, using: &random)
            let secret = String(String.UnicodeScalarView((0..<length).map { _ in Self.alphabet.randomElement(using: &random)! }))
            let pattern = SecretPattern(Secret(secret))!
            var text = ""
            for _ in 0..<Int.random(in: 0...8, using: &random) {
                switch Int.random(in: 0..<4, using: &random) {
                case 0:  // the secret, each scalar in its own form
                    text += secret.unicodeScalars.map { Self.form(of: $0, &random) }.joined()
                case 1:  // a near miss: the secret without its last scalar
                    text += secret.unicodeScalars.dropLast().map { Self.form(of: $0, &random) }.joined()
                case 2:  // noise from the same alphabet
                    text += Self.form(of: Self.alphabet.randomElement(using: &random)!, &random)
                default:
                    text += "w"
                }
            }
            var bytes = Array(text.utf8)
            // Cut anywhere, even inside a form (the description's input bound does that).
            if !bytes.isEmpty && Bool.random(using: &random) {
                bytes.removeSubrange(Int.random(in: 0..<bytes.count, using: &random)...)
            }
            let readings = ScalarReadings(bytes)
            for cutTail in [false, true] {
                let expected = Self.startsByTryingEach(pattern, bytes, cutTail: cutTail)
                let found = pattern.matchStarts(in: bytes, readings: readings, cutTailMatches: cutTail)
                #expect(found == expected, "secret \(secret.debugDescription) in \(String(decoding: bytes, as: UTF8.self).debugDescription), cut tail \(cutTail)")
                compared += 1
                matching += expected.filter { $0 }.count
            }
        }
        // The texts exercised both answers.
        #expect(compared == 1200 && matching > 500)
    }

    /// The case that was quadratic: a 4 KiB text of near misses of a 1 000-character secret
    /// leaves no start for `match` to try (and one, the longest tail, when the text was cut).
    @Test func nearMissesOfALongSecretLeaveNoStartToTry() {
        let pattern = SecretPattern(Secret(String(repeating: "a", count: 1000) + "b"))!
        let bytes = Array(String(repeating: "a", count: 4096).utf8)
        let readings = ScalarReadings(bytes)
        #expect(!pattern.matchStarts(in: bytes, readings: readings, cutTailMatches: false).contains(true))
        let cut = pattern.matchStarts(in: bytes, readings: readings, cutTailMatches: true)
        #expect(cut.firstIndex(of: true) == 4096 - 1000)
    }
}
