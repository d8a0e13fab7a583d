// One file (over 400 lines): `redact` and `splice` share one private byte scanner and one escaping
// rule, which must agree exactly (what one writes the other reads); apart, both would be
// visible to the whole module.

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// JSON that carries secrets (a token answer, the store's plaintext), read and written
/// without the secrets ever becoming `String`s: a general JSON parser (Foundation's)
/// copies every string it decodes into memory nobody zeroes.
///
/// - `redact` finds every string value of a member named in `keys` (at any depth),
///   decodes it straight into a `Secret`, and returns the JSON with each such value
///   replaced by a placeholder — ordinary JSON, holding no secret, for any decoder.
/// - `splice` does the reverse for writing: JSON holding placeholders becomes bytes, in a
///   `Secret`, with each secret JSON-escaped in its place.
///
/// Placeholders carry a random nonce of the call (`sfsecret-<nonce>-<n>`), so text from
/// elsewhere (a member id a server chose) can never be taken for one.
public enum SecretJSON {
    /// What `redact` found.
    public struct Redacted: Sendable {
        /// The JSON with every secret value replaced by its placeholder.
        public var json: [UInt8]
        /// The secrets, by placeholder.
        public var secrets: [String: Secret]

        /// The secret a decoded placeholder stands for (nil for any other string).
        public func secret(for placeholder: String) -> Secret? { secrets[placeholder] }
    }

    /// Placeholders for one encoding: `placeholder(for:)` hands out one per secret.
    public final class Placeholders: @unchecked Sendable {
        private let nonce = SecretJSON.nonce()
        private(set) var secrets: [String: Secret] = [:]

        public init() {}

        public func placeholder(for secret: Secret) -> String {
            let text = "sfsecret-\(nonce)-\(secrets.count)"
            secrets[text] = secret
            return text
        }
    }

    /// Replaces the string values of members named in `keys` (at any depth) with
    /// placeholders; nil if `json` is not one well-formed JSON value, or holds more than
    /// `maximumSecrets` of them.
    ///
    /// Each secret is memory of its own (at least a page: `SecretBytes`), so a document of
    /// someone else's (a server's answer) must bound how many it makes: 1 MiB of
    /// `"id_token":"",` made 74 896 secrets, 316 MB. The scan stops at the first secret over
    /// the bound, having made no more than `maximumSecrets`.
    public static func redact(
        _ json: UnsafeRawBufferPointer, keys: Set<String>, maximumSecrets: Int = .max
    ) -> Redacted? {
        var scanner = Scanner(input: json, keys: keys, nonce: nonce(), maximumSecrets: maximumSecrets)
        guard scanner.document() else {
            scanner.discard()
            return nil
        }
        return Redacted(json: scanner.output, secrets: scanner.secrets)
    }

    /// `json` (holding the placeholders of `placeholders`, as JSON strings) with each
    /// placeholder string replaced by its secret, JSON-escaped, written into a `Secret`.
    public static func splice(_ json: [UInt8], _ placeholders: Placeholders) -> Secret {
        let secrets = placeholders.secrets
        // Where each placeholder (with its quotes) occurs, in order.
        var hits: [(range: Range<Int>, secret: Secret)] = []
        if !secrets.isEmpty {
            let prefix = Array("\"sfsecret-".utf8)
            var index = 0
            while index + prefix.count <= json.count {
                if json[index] == UInt8(ascii: "\""), json[index..<index + prefix.count].elementsEqual(prefix),
                    let close = json[(index + 1)...].firstIndex(of: UInt8(ascii: "\"")),
                    let secret = secrets[String(decoding: json[(index + 1)..<close], as: UTF8.self)]
                {
                    hits.append((index..<close + 1, secret))
                    index = close + 1
                } else {
                    index += 1
                }
            }
        }
        var length = json.count
        for hit in hits { length += escapedLength(hit.secret) + 2 - hit.range.count }
        return Secret(count: length) { out in
            var at = 0
            var from = 0
            func copy(_ range: Range<Int>) {
                json.withUnsafeBytes { source in
                    out.baseAddress!.advanced(by: at).copyMemory(
                        from: source.baseAddress!.advanced(by: range.lowerBound), byteCount: range.count)
                }
                at += range.count
            }
            for hit in hits {
                copy(from..<hit.range.lowerBound)
                out[at] = UInt8(ascii: "\"")
                at += 1
                hit.secret.withUnsafeBytes { bytes in
                    for byte in bytes { escape(byte, into: out, at: &at) }
                }
                out[at] = UInt8(ascii: "\"")
                at += 1
                from = hit.range.upperBound
            }
            copy(from..<json.count)
        }
    }

    // MARK: - Escaping

    private static func escapedLength(_ secret: Secret) -> Int {
        secret.withUnsafeBytes { bytes in
            bytes.reduce(0) { total, byte in
                switch byte {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"): total + 2
                case 0..<0x20, 0x7F: total + 6
                default: total + 1
                }
            }
        }
    }

    private static func escape(_ byte: UInt8, into out: UnsafeMutableRawBufferPointer, at: inout Int) {
        switch byte {
        case UInt8(ascii: "\""), UInt8(ascii: "\\"):
            out[at] = UInt8(ascii: "\\")
            out[at + 1] = byte
            at += 2
        case 0..<0x20, 0x7F:
            let hex = Array("0123456789abcdef".utf8)
            out[at] = UInt8(ascii: "\\")
            out[at + 1] = UInt8(ascii: "u")
            out[at + 2] = UInt8(ascii: "0")
            out[at + 3] = UInt8(ascii: "0")
            out[at + 4] = hex[Int(byte >> 4)]
            out[at + 5] = hex[Int(byte & 0xF)]
            at += 6
        default:
            out[at] = byte
            at += 1
        }
    }

    static func nonce() -> String {
        // Two 64-bit draws (one getrandom each), not one per byte.
        var generator = SystemRandomNumberGenerator()
        let words: [UInt64] = [generator.next(), generator.next()]
        let bytes = words.flatMap { word in (0..<8).map { UInt8(truncatingIfNeeded: word >> ($0 * 8)) } }.prefix(12)
        return bytes.map { byte in
            let hex = Array("0123456789abcdef".utf8)
            return String(decoding: [hex[Int(byte >> 4)], hex[Int(byte & 0xF)]], as: UTF8.self)
        }.joined()
    }

    // MARK: - The scanner

    /// A strict JSON (RFC 8259) scanner that copies its input to `output`, except the string
    /// values of members named in `keys`, which it decodes into secrets and replaces.
    private struct Scanner {
        let input: UnsafeRawBufferPointer
        let keys: Set<String>
        let nonce: String
        var at = 0
        var copiedUpTo = 0
        var output: [UInt8] = []
        var secrets: [String: Secret] = [:]
        var depth = 0
        static let maximumDepth = 512
        let maximumSecrets: Int

        init(input: UnsafeRawBufferPointer, keys: Set<String>, nonce: String, maximumSecrets: Int) {
            self.input = input
            self.keys = keys
            self.nonce = nonce
            self.maximumSecrets = maximumSecrets
            output.reserveCapacity(input.count)
        }

        mutating func discard() {
            secrets = [:]
            output = []
        }

        mutating func document() -> Bool {
            skipSpace()
            guard value(secretKey: false) else { return false }
            skipSpace()
            guard at == input.count else { return false }
            flush(to: at)
            return true
        }

        private var current: UInt8? { at < input.count ? input[at] : nil }

        private mutating func skipSpace() {
            while let byte = current, byte == 0x20 || byte == 0x0A || byte == 0x0D || byte == 0x09 { at += 1 }
        }

        private mutating func flush(to end: Int) {
            if end > copiedUpTo {
                output.append(contentsOf: UnsafeRawBufferPointer(rebasing: input[copiedUpTo..<end]))
            }
            copiedUpTo = end
        }

        private mutating func value(secretKey: Bool) -> Bool {
            guard let byte = current else { return false }
            switch byte {
            case UInt8(ascii: "{"): return object()
            case UInt8(ascii: "["): return array()
            case UInt8(ascii: "\""):
                if secretKey { return secretString() }
                return string(decoding: false) != nil
            case UInt8(ascii: "t"): return literal("true")
            case UInt8(ascii: "f"): return literal("false")
            case UInt8(ascii: "n"): return literal("null")
            default: return number()
            }
        }

        private mutating func object() -> Bool {
            depth += 1
            defer { depth -= 1 }
            guard depth <= Self.maximumDepth else { return false }
            at += 1
            skipSpace()
            if current == UInt8(ascii: "}") {
                at += 1
                return true
            }
            while true {
                skipSpace()
                guard current == UInt8(ascii: "\""), let key = string(decoding: true) else { return false }
                skipSpace()
                guard current == UInt8(ascii: ":") else { return false }
                at += 1
                skipSpace()
                guard value(secretKey: keys.contains(key)) else { return false }
                skipSpace()
                switch current {
                case UInt8(ascii: ","): at += 1
                case UInt8(ascii: "}"):
                    at += 1
                    return true
                default: return false
                }
            }
        }

        private mutating func array() -> Bool {
            depth += 1
            defer { depth -= 1 }
            guard depth <= Self.maximumDepth else { return false }
            at += 1
            skipSpace()
            if current == UInt8(ascii: "]") {
                at += 1
                return true
            }
            while true {
                skipSpace()
                guard value(secretKey: false) else { return false }
                skipSpace()
                switch current {
                case UInt8(ascii: ","): at += 1
                case UInt8(ascii: "]"):
                    at += 1
                    return true
                default: return false
                }
            }
        }

        private mutating func literal(_ word: StaticString) -> Bool {
            let count = word.utf8CodeUnitCount
            guard at + count <= input.count else { return false }
            for index in 0..<count where input[at + index] != word.utf8Start[index] { return false }
            at += count
            return true
        }

        private mutating func number() -> Bool {
            let start = at
            if current == UInt8(ascii: "-") { at += 1 }
            guard let first = current, (0x30...0x39).contains(first) else { return false }
            if first == 0x30 {
                at += 1
            } else {
                while let byte = current, (0x30...0x39).contains(byte) { at += 1 }
            }
            if current == UInt8(ascii: ".") {
                at += 1
                guard let byte = current, (0x30...0x39).contains(byte) else { return false }
                while let byte = current, (0x30...0x39).contains(byte) { at += 1 }
            }
            if current == UInt8(ascii: "e") || current == UInt8(ascii: "E") {
                at += 1
                if current == UInt8(ascii: "+") || current == UInt8(ascii: "-") { at += 1 }
                guard let byte = current, (0x30...0x39).contains(byte) else { return false }
                while let byte = current, (0x30...0x39).contains(byte) { at += 1 }
            }
            return at > start
        }

        /// Scans a string at `at` (its opening quote). With `decoding`, returns its text
        /// (a key); otherwise "" for a valid string. Nil if malformed.
        private mutating func string(decoding: Bool) -> String? {
            var sink = decoding ? [UInt8]() : nil
            guard scanString(into: &sink) else { return nil }
            return sink.map { String(decoding: $0, as: UTF8.self) } ?? ""
        }

        /// A secret value: decoded twice over the same bytes (once to count, once into the
        /// secret's own buffer), then replaced by a placeholder in the output.
        private mutating func secretString() -> Bool {
            guard secrets.count < maximumSecrets else { return false }
            let start = at
            var counter = ByteCounter()
            guard scanString(into: &counter) else { return false }
            let end = at
            at = start
            let placeholder = "sfsecret-\(nonce)-\(secrets.count)"
            var failed = false
            let secret = Secret(count: counter.count) { buffer in
                var writer = ByteWriter(buffer: buffer)
                failed = !scanString(into: &writer)
            }
            guard !failed, at == end else { return false }
            flush(to: start)
            output.append(UInt8(ascii: "\""))
            output.append(contentsOf: placeholder.utf8)
            output.append(UInt8(ascii: "\""))
            copiedUpTo = end
            secrets[placeholder] = secret
            return true
        }

        /// Scans the string at `at`, handing each decoded byte (UTF-8) to `sink`.
        private mutating func scanString<Sink: ByteSink>(into sink: inout Sink) -> Bool {
            at += 1
            while let byte = current {
                switch byte {
                case UInt8(ascii: "\""):
                    at += 1
                    return true
                case UInt8(ascii: "\\"):
                    at += 1
                    guard let escape = current else { return false }
                    at += 1
                    switch escape {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): sink.append(escape)
                    case UInt8(ascii: "b"): sink.append(0x08)
                    case UInt8(ascii: "f"): sink.append(0x0C)
                    case UInt8(ascii: "n"): sink.append(0x0A)
                    case UInt8(ascii: "r"): sink.append(0x0D)
                    case UInt8(ascii: "t"): sink.append(0x09)
                    case UInt8(ascii: "u"):
                        guard var scalar = hex4() else { return false }
                        if (0xD800...0xDBFF).contains(scalar) {
                            // A surrogate pair, or a lone high surrogate (U+FFFD, as Foundation does).
                            if at + 1 < input.count, input[at] == UInt8(ascii: "\\"), input[at + 1] == UInt8(ascii: "u") {
                                let save = at
                                at += 2
                                if let low = hex4(), (0xDC00...0xDFFF).contains(low) {
                                    scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                                } else {
                                    at = save
                                    scalar = 0xFFFD
                                }
                            } else {
                                scalar = 0xFFFD
                            }
                        } else if (0xDC00...0xDFFF).contains(scalar) {
                            scalar = 0xFFFD
                        }
                        for unit in UTF8.encode(Unicode.Scalar(scalar)!)! { sink.append(unit) }
                    default:
                        return false
                    }
                case 0..<0x20:
                    return false
                default:
                    sink.append(byte)
                    at += 1
                }
            }
            return false
        }

        private mutating func hex4() -> UInt32? {
            guard at + 4 <= input.count else { return nil }
            var value: UInt32 = 0
            for _ in 0..<4 {
                let byte = input[at]
                let digit: UInt32
                switch byte {
                case 0x30...0x39: digit = UInt32(byte - 0x30)
                case 0x41...0x46: digit = UInt32(byte - 0x41 + 10)
                case 0x61...0x66: digit = UInt32(byte - 0x61 + 10)
                default: return nil
                }
                value = value << 4 | digit
                at += 1
            }
            return value
        }
    }
}

private protocol ByteSink {
    mutating func append(_ byte: UInt8)
}

extension Optional: ByteSink where Wrapped == [UInt8] {
    mutating func append(_ byte: UInt8) { self?.append(byte) }
}

private struct ByteCounter: ByteSink {
    var count = 0
    mutating func append(_ byte: UInt8) { count += 1 }
}

private struct ByteWriter: ByteSink {
    let buffer: UnsafeMutableRawBufferPointer
    var at = 0
    mutating func append(_ byte: UInt8) {
        guard at < buffer.count else { return }
        buffer[at] = byte
        at += 1
    }
}
