extension SecretJSON {
    /// Writes JSON straight into a `Secret`'s memory: no copy of the document, nor of any
    /// secret in it, exists anywhere else. `SecretJSON.parse` reads what it writes.
    ///
    ///     let json = SecretJSON.Writer.secret { json in
    ///         json.beginObject()
    ///         json.key("token"); json.secret(token)
    ///         json.endObject()
    ///     }
    ///
    /// `secret(_:)` runs its body twice, once to count the bytes and once to write them
    /// into the secret's buffer, so the body must write the same both times (it is given
    /// the same state: iterate a dictionary in a fixed order). Strings are written as UTF-8
    /// with `"`, `\` and control characters escaped; separators are the writer's.
    public struct Writer {
        /// Nil while counting.
        private let out: UnsafeMutableRawBufferPointer?
        /// Bytes written (or counted) so far.
        private var count = 0
        /// Whether the next member or element needs a comma first.
        private var needsComma = false

        private init(out: UnsafeMutableRawBufferPointer?) {
            self.out = out
        }

        /// The JSON `write` writes, in a secret of its exact size.
        public static func secret(_ write: (inout Writer) -> Void) -> Secret {
            var counter = Writer(out: nil)
            write(&counter)
            let length = counter.count
            return Secret(count: length) { buffer in
                var writer = Writer(out: buffer)
                write(&writer)
                precondition(writer.count == length, "SecretJSON.Writer: the body wrote differently the second time")
            }
        }

        public mutating func beginObject() {
            separate()
            append(UInt8(ascii: "{"))
            needsComma = false
        }

        public mutating func endObject() {
            append(UInt8(ascii: "}"))
            needsComma = true
        }

        public mutating func beginArray() {
            separate()
            append(UInt8(ascii: "["))
            needsComma = false
        }

        public mutating func endArray() {
            append(UInt8(ascii: "]"))
            needsComma = true
        }

        /// A member's name; its value is written next.
        public mutating func key(_ name: String) {
            separate()
            quoted(name)
            append(UInt8(ascii: ":"))
            needsComma = false
        }

        public mutating func string(_ text: String) {
            separate()
            quoted(text)
            needsComma = true
        }

        /// A secret's bytes as a JSON string (escaped as `string` escapes).
        public mutating func secret(_ secret: Secret) {
            separate()
            append(UInt8(ascii: "\""))
            secret.withUnsafeBytes { bytes in
                for byte in bytes { escaped(byte) }
            }
            append(UInt8(ascii: "\""))
            needsComma = true
        }

        public mutating func integer(_ value: Int64) {
            separate()
            for byte in String(value).utf8 { append(byte) }
            needsComma = true
        }

        public mutating func bool(_ value: Bool) {
            separate()
            for byte in (value ? "true" : "false").utf8 { append(byte) }
            needsComma = true
        }

        public mutating func null() {
            separate()
            for byte in "null".utf8 { append(byte) }
            needsComma = true
        }

        // MARK: Bytes

        private mutating func separate() {
            if needsComma { append(UInt8(ascii: ",")) }
        }

        private mutating func quoted(_ text: String) {
            append(UInt8(ascii: "\""))
            for byte in text.utf8 { escaped(byte) }
            append(UInt8(ascii: "\""))
        }

        private mutating func escaped(_ byte: UInt8) {
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"):
                append(UInt8(ascii: "\\"))
                append(byte)
            case 0..<0x20, 0x7F:
                let hex: StaticString = "0123456789abcdef"
                for escape in "\\u00".utf8 { append(escape) }
                append(hex.utf8Start[Int(byte >> 4)])
                append(hex.utf8Start[Int(byte & 0xF)])
            default:
                append(byte)
            }
        }

        private mutating func append(_ byte: UInt8) {
            // The second run writes what the first counted; past that, nothing (and
            // `secret(_:)` stops on the count).
            if let out, count < out.count { out[count] = byte }
            count += 1
        }
    }
}
