// One file: `redact` and `parse` share one private byte scanner, which must
// read exactly what `Writer` (SecretJSONWriter.swift) writes; apart, its parts would be
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
/// - `parse` reads the JSON into a `Value` tree whose secret members hold `Secret`s: a
///   document of our own (the store's plaintext) read without a general decoder.
/// - `Writer` (SecretJSONWriter.swift) writes JSON straight into a `Secret`'s memory.
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
        guard scanner.document() != nil else {
            scanner.discard()
            return nil
        }
        return Redacted(json: scanner.output, secrets: scanner.secrets)
    }

    /// `json` read into a `Value`: the string values of members named in `secretKeys` (at any
    /// depth) as `.secret`, decoded straight into secret memory. Nil if `json` is not one
    /// well-formed JSON value (strict RFC 8259), if an object names a member twice, or if it
    /// holds more than `maximumSecrets` secret values.
    public static func parse(
        _ json: UnsafeRawBufferPointer, secretKeys: Set<String>, maximumSecrets: Int = .max
    ) -> Value? {
        var scanner = Scanner(input: json, keys: secretKeys, nonce: "", maximumSecrets: maximumSecrets, building: true)
        return scanner.document()
    }

    /// A JSON value as `parse` reads it.
    public indirect enum Value: Sendable {
        case object([String: Value])
        case array([Value])
        case string(String)
        /// The string value of a secret member.
        case secret(Secret)
        /// A number, as its JSON text (the reader picks the type).
        case number(String)
        case bool(Bool)
        case null
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

    /// A strict JSON (RFC 8259) scanner. Redacting, it copies its input to `output`, except the
    /// string values of members named in `keys`, which it decodes into secrets and replaces;
    /// building (`parse`), it returns the value it read, those string values as secrets. A
    /// redacting scan returns `.null` for every value it accepted (it builds nothing).
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
        let building: Bool
        var secretCount = 0

        init(input: UnsafeRawBufferPointer, keys: Set<String>, nonce: String, maximumSecrets: Int, building: Bool = false) {
            self.input = input
            self.keys = keys
            self.nonce = nonce
            self.maximumSecrets = maximumSecrets
            self.building = building
            if !building { output.reserveCapacity(input.count) }
        }

        mutating func discard() {
            secrets = [:]
            output = []
        }

        mutating func document() -> Value? {
            skipSpace()
            guard let value = value(secretKey: false) else { return nil }
            skipSpace()
            guard at == input.count else { return nil }
            if !building { flush(to: at) }
            return value
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

        private mutating func value(secretKey: Bool) -> Value? {
            guard let byte = current else { return nil }
            switch byte {
            case UInt8(ascii: "{"): return object()
            case UInt8(ascii: "["): return array()
            case UInt8(ascii: "\""):
                if secretKey { return secretString() }
                return string(decoding: building).map { building ? .string($0) : .null }
            case UInt8(ascii: "t"): return literal("true") ? (building ? .bool(true) : .null) : nil
            case UInt8(ascii: "f"): return literal("false") ? (building ? .bool(false) : .null) : nil
            case UInt8(ascii: "n"): return literal("null") ? .null : nil
            default: return number()
            }
        }

        private mutating func object() -> Value? {
            depth += 1
            defer { depth -= 1 }
            guard depth <= Self.maximumDepth else { return nil }
            var members: [String: Value] = [:]
            at += 1
            skipSpace()
            if current == UInt8(ascii: "}") {
                at += 1
                return building ? .object(members) : .null
            }
            while true {
                skipSpace()
                guard current == UInt8(ascii: "\""), let key = string(decoding: true) else { return nil }
                skipSpace()
                guard current == UInt8(ascii: ":") else { return nil }
                at += 1
                skipSpace()
                guard let value = value(secretKey: keys.contains(key)) else { return nil }
                if building {
                    // A member named twice: which one a reader takes differs between readers.
                    guard members.updateValue(value, forKey: key) == nil else { return nil }
                }
                skipSpace()
                switch current {
                case UInt8(ascii: ","): at += 1
                case UInt8(ascii: "}"):
                    at += 1
                    return building ? .object(members) : .null
                default: return nil
                }
            }
        }

        private mutating func array() -> Value? {
            depth += 1
            defer { depth -= 1 }
            guard depth <= Self.maximumDepth else { return nil }
            var elements: [Value] = []
            at += 1
            skipSpace()
            if current == UInt8(ascii: "]") {
                at += 1
                return building ? .array(elements) : .null
            }
            while true {
                skipSpace()
                guard let element = value(secretKey: false) else { return nil }
                if building { elements.append(element) }
                skipSpace()
                switch current {
                case UInt8(ascii: ","): at += 1
                case UInt8(ascii: "]"):
                    at += 1
                    return building ? .array(elements) : .null
                default: return nil
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

        private mutating func number() -> Value? {
            let start = at
            if current == UInt8(ascii: "-") { at += 1 }
            guard let first = current, (0x30...0x39).contains(first) else { return nil }
            if first == 0x30 {
                at += 1
            } else {
                while let byte = current, (0x30...0x39).contains(byte) { at += 1 }
            }
            if current == UInt8(ascii: ".") {
                at += 1
                guard let byte = current, (0x30...0x39).contains(byte) else { return nil }
                while let byte = current, (0x30...0x39).contains(byte) { at += 1 }
            }
            if current == UInt8(ascii: "e") || current == UInt8(ascii: "E") {
                at += 1
                if current == UInt8(ascii: "+") || current == UInt8(ascii: "-") { at += 1 }
                guard let byte = current, (0x30...0x39).contains(byte) else { return nil }
                while let byte = current, (0x30...0x39).contains(byte) { at += 1 }
            }
            guard at > start else { return nil }
            return building ? .number(String(decoding: UnsafeRawBufferPointer(rebasing: input[start..<at]), as: UTF8.self)) : .null
        }

        /// Scans a string at `at` (its opening quote). With `decoding`, returns its text
        /// (a key); otherwise "" for a valid string. Nil if malformed.
        private mutating func string(decoding: Bool) -> String? {
            var sink = decoding ? [UInt8]() : nil
            guard scanString(into: &sink) else { return nil }
            return sink.map { String(decoding: $0, as: UTF8.self) } ?? ""
        }

        /// A secret value: decoded twice over the same bytes (once to count, once into the
        /// secret's own buffer); redacting, replaced by a placeholder in the output.
        private mutating func secretString() -> Value? {
            guard secretCount < maximumSecrets else { return nil }
            let start = at
            var counter = ByteCounter()
            guard scanString(into: &counter) else { return nil }
            let end = at
            at = start
            var failed = false
            let secret = Secret(count: counter.count) { buffer in
                var writer = ByteWriter(buffer: buffer)
                failed = !scanString(into: &writer)
            }
            guard !failed, at == end else { return nil }
            secretCount += 1
            if building { return .secret(secret) }
            let placeholder = "sfsecret-\(nonce)-\(secrets.count)"
            flush(to: start)
            output.append(UInt8(ascii: "\""))
            output.append(contentsOf: placeholder.utf8)
            output.append(UInt8(ascii: "\""))
            copiedUpTo = end
            secrets[placeholder] = secret
            return .null
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
