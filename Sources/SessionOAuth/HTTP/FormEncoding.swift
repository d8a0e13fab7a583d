import SessionCore

/// A form field's value: text, or a secret that is percent-encoded straight into the body.
enum FormValue {
    case text(String)
    case secret(Secret)
}

/// `application/x-www-form-urlencoded`.
enum FormEncoding {
    static func encode(_ fields: [(String, String)]) -> String {
        fields.map { "\(escape($0.0))=\(escape($0.1))" }.joined(separator: "&")
    }

    /// The body of `fields`, written into a `Secret` (its length counted first, so no
    /// buffer that held a secret is ever grown, copied or left unzeroed).
    static func body(_ fields: [(String, FormValue)]) -> Secret {
        func encodedLength(_ bytes: UnsafeRawBufferPointer) -> Int {
            bytes.reduce(0) { $0 + (unreserved.contains($1) || $1 == UInt8(ascii: " ") ? 1 : 3) }
        }
        func length(_ value: FormValue) -> Int {
            switch value {
            case .text(var text): return text.withUTF8 { encodedLength(UnsafeRawBufferPointer($0)) }
            case .secret(let secret): return secret.withUnsafeBytes { encodedLength($0) }
            }
        }
        var total = max(fields.count - 1, 0)
        for (name, value) in fields { total += escape(name).utf8.count + 1 + length(value) }
        return Secret(count: total) { out in
            var at = 0
            func put(_ byte: UInt8) {
                out[at] = byte
                at += 1
            }
            func put(encoding bytes: UnsafeRawBufferPointer) {
                let hex = Array("0123456789ABCDEF".utf8)
                for byte in bytes {
                    if unreserved.contains(byte) {
                        put(byte)
                    } else if byte == UInt8(ascii: " ") {
                        put(UInt8(ascii: "+"))
                    } else {
                        put(UInt8(ascii: "%"))
                        put(hex[Int(byte >> 4)])
                        put(hex[Int(byte & 0xF)])
                    }
                }
            }
            for (index, (name, value)) in fields.enumerated() {
                if index > 0 { put(UInt8(ascii: "&")) }
                var name = name
                name.withUTF8 { put(encoding: UnsafeRawBufferPointer($0)) }
                put(UInt8(ascii: "="))
                switch value {
                case .text(var text): text.withUTF8 { put(encoding: UnsafeRawBufferPointer($0)) }
                case .secret(let secret): secret.withUnsafeBytes { put(encoding: $0) }
                }
            }
        }
    }

    private static let unreserved = Set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._*".utf8)

    static func escape(_ text: String) -> String {
        var out = ""
        for byte in text.utf8 {
            if unreserved.contains(byte) {
                out.append(Character(UnicodeScalar(byte)))
            } else if byte == UInt8(ascii: " ") {
                out.append("+")
            } else {
                let hex = Array("0123456789ABCDEF".utf8)
                out.unicodeScalars.append("%")
                out.unicodeScalars.append(UnicodeScalar(hex[Int(byte >> 4)]))
                out.unicodeScalars.append(UnicodeScalar(hex[Int(byte & 0xF)]))
            }
        }
        return out
    }
}
