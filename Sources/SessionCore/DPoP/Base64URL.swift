/// base64url without padding (RFC 4648 §5; RFC 7515 §2): the JOSE encoding of DPoP proofs and
/// keys, and PKCE's (RFC 7636 Appendix A). Written here once, without Foundation.
package enum Base64URL {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// The encoded length of `count` bytes.
    package static func encodedCount(_ count: Int) -> Int { (count * 4 + 2) / 3 }

    /// Writes the encoding of `bytes` into `out` (exactly `encodedCount(bytes.count)` bytes):
    /// no intermediate copy, so a secret can be encoded into a secret's own buffer.
    package static func encode(_ bytes: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer) {
        precondition(out.count == encodedCount(bytes.count), "base64url: wrong output size")
        var index = 0
        var at = 0
        while index + 3 <= bytes.count {
            let value = UInt32(bytes[index]) << 16 | UInt32(bytes[index + 1]) << 8 | UInt32(bytes[index + 2])
            for shift in [18, 12, 6, 0] {
                out[at] = alphabet[Int(value >> UInt32(shift) & 63)]
                at += 1
            }
            index += 3
        }
        let rest = bytes.count - index
        if rest > 0 {
            var value = UInt32(bytes[index]) << 16
            if rest == 2 { value |= UInt32(bytes[index + 1]) << 8 }
            for shift in [18, 12, 6].prefix(rest + 1) {
                out[at] = alphabet[Int(value >> UInt32(shift) & 63)]
                at += 1
            }
        }
    }

    /// The encoding of `bytes`.
    package static func encode<Bytes: Sequence>(_ bytes: Bytes) -> String where Bytes.Element == UInt8 {
        let array = Array(bytes)
        var out = [UInt8](repeating: 0, count: encodedCount(array.count))
        array.withUnsafeBytes { input in out.withUnsafeMutableBytes { encode(input, into: $0) } }
        return String(decoding: out, as: UTF8.self)
    }

    /// The decoded length of `count` encoded bytes, nil when no encoding has that length.
    package static func decodedCount(_ count: Int) -> Int? {
        count % 4 == 1 ? nil : count * 3 / 4
    }

    /// Decodes `text` into `out` (exactly `decodedCount(text.count)` bytes); false for a byte
    /// outside the alphabet or non-zero trailing bits (a non-canonical encoding).
    package static func decode(_ text: UnsafeRawBufferPointer, into out: UnsafeMutableRawBufferPointer) -> Bool {
        guard let count = decodedCount(text.count), out.count == count else { return false }
        func value(_ byte: UInt8) -> UInt32? {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): UInt32(byte - UInt8(ascii: "A"))
            case UInt8(ascii: "a")...UInt8(ascii: "z"): UInt32(byte - UInt8(ascii: "a") + 26)
            case UInt8(ascii: "0")...UInt8(ascii: "9"): UInt32(byte - UInt8(ascii: "0") + 52)
            case UInt8(ascii: "-"): 62
            case UInt8(ascii: "_"): 63
            default: nil
            }
        }
        var bits: UInt32 = 0
        var held = 0
        var at = 0
        for byte in text {
            guard let six = value(byte) else { return false }
            bits = bits << 6 | six
            held += 6
            if held >= 8 {
                held -= 8
                out[at] = UInt8(truncatingIfNeeded: bits >> UInt32(held))
                at += 1
                bits &= (1 << UInt32(held)) - 1
            }
        }
        return bits == 0
    }
}
