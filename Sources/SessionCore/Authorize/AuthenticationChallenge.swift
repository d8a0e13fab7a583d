/// One challenge of a `WWW-Authenticate` field (RFC 9110 §11.6.1): its scheme and its
/// parameters. Parsed from what a resource server sent, so nothing is trusted: the field is
/// read up to `maximumFieldLength` bytes, a challenge that does not parse ends the parse
/// (what came before it is kept), and values are only ever compared, never shown.
public struct AuthenticationChallenge: Sendable, Hashable {
    /// The scheme, lowercased (`bearer`, `dpop`).
    public let scheme: String
    /// The auth-params, names lowercased, values unquoted.
    public let parameters: [String: String]

    /// `error` (RFC 6750 §3: `invalid_token`, `insufficient_scope`, `invalid_request`).
    public var error: String? { parameters["error"] }

    /// How much of a field is read.
    public static let maximumFieldLength = 8192

    /// The challenges of `field` (nil or empty: none).
    public static func parse(_ field: String?) -> [AuthenticationChallenge] {
        guard let field else { return [] }
        var parser = Parser(Array(field.utf8.prefix(maximumFieldLength)))
        return parser.challenges()
    }

    private struct Parser {
        let bytes: [UInt8]
        var index = 0

        init(_ bytes: [UInt8]) { self.bytes = bytes }

        static let tchar = Set("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz".utf8)

        var atEnd: Bool { index >= bytes.count }
        var current: UInt8? { atEnd ? nil : bytes[index] }

        mutating func skipSpaces() {
            while let byte = current, byte == 0x20 || byte == 0x09 { index += 1 }
        }

        mutating func skipSeparators() {
            while let byte = current, byte == 0x20 || byte == 0x09 || byte == UInt8(ascii: ",") { index += 1 }
        }

        mutating func token() -> String? {
            let start = index
            while let byte = current, Self.tchar.contains(byte) { index += 1 }
            return index > start ? String(decoding: bytes[start..<index], as: UTF8.self) : nil
        }

        mutating func quoted() -> String? {
            guard current == UInt8(ascii: "\"") else { return nil }
            index += 1
            var value: [UInt8] = []
            while let byte = current {
                index += 1
                switch byte {
                case UInt8(ascii: "\""): return String(decoding: value, as: UTF8.self)
                case UInt8(ascii: "\\"):
                    guard let next = current else { return nil }
                    index += 1
                    value.append(next)
                default: value.append(byte)
                }
            }
            return nil  // unterminated
        }

        /// Whether a `name =` follows (an auth-param), without consuming it.
        func paramFollows() -> Bool {
            var probe = self
            guard probe.token() != nil else { return false }
            probe.skipSpaces()
            return probe.current == UInt8(ascii: "=")
        }

        mutating func challenges() -> [AuthenticationChallenge] {
            var found: [AuthenticationChallenge] = []
            challenge: while true {
                skipSeparators()
                guard !atEnd, let scheme = token() else { return found }
                var parameters: [String: String] = [:]
                skipSpaces()
                while paramFollows() {
                    let name = token()!.lowercased()
                    skipSpaces()
                    index += 1  // "="
                    skipSpaces()
                    guard let value = current == UInt8(ascii: "\"") ? quoted() : token() else {
                        // A token68 (`abc==`) or a broken value: this challenge ends here.
                        found.append(AuthenticationChallenge(scheme: scheme.lowercased(), parameters: parameters))
                        while let byte = current, byte != UInt8(ascii: ",") { index += 1 }
                        continue challenge
                    }
                    if parameters[name] == nil { parameters[name] = value }
                    skipSpaces()
                    guard current == UInt8(ascii: ",") else { break }
                    // A comma: another param of this challenge, or the next challenge.
                    var probe = self
                    probe.skipSeparators()
                    guard probe.paramFollows() else { break }
                    self = probe
                }
                found.append(AuthenticationChallenge(scheme: scheme.lowercased(), parameters: parameters))
                // Anything else here (a token68, stray bytes) up to the next comma is skipped.
                while let byte = current, byte != UInt8(ascii: ",") { index += 1 }
            }
        }
    }
}
