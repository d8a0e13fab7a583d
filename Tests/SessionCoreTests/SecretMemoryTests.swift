import Foundation
import Testing

@testable import SessionCore

/// Issue 17, point 1: a secret's bytes live in pages of their own, left out of core dumps, and
/// JSON that carries secrets is read and written without the secrets becoming `String`s.
@Suite("Secrets in memory")
struct SecretMemoryTests {
    /// The VmFlags of the mapping that holds `address` (from /proc/self/smaps).
    private func vmFlags(of address: UnsafeRawPointer) throws -> [String] {
        // (Read with read(2): /proc files report a size of 0.)
        let handle = try #require(FileHandle(forReadingAtPath: "/proc/self/smaps"))
        defer { try? handle.close() }
        let smaps = String(decoding: try handle.readToEnd() ?? Data(), as: UTF8.self)
        let target = UInt(bitPattern: address)
        var inside = false
        for line in smaps.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            if let range = fields.first, range.contains("-"), fields.count >= 5,
                let dash = range.firstIndex(of: "-"),
                let start = UInt(range[..<dash], radix: 16), let end = UInt(range[range.index(after: dash)...], radix: 16)
            {
                inside = start <= target && target < end
            } else if inside, line.hasPrefix("VmFlags:") {
                return fields.dropFirst().map(String.init)
            }
        }
        return []
    }

    @Test func aSecretsBytesAreLeftOutOfCoreDumps() throws {
        let secret = Secret("dump-me-not")
        let flags = try secret.withUnsafeBytes { try vmFlags(of: $0.baseAddress!) }
        #expect(flags.contains("dd"), "VmFlags \(flags)")
        // The C string view is the secret's own buffer, NUL-terminated.
        secret.withCString { #expect(strcmp($0, "dump-me-not") == 0) }
        #expect(secret.count == 11)
    }

    @Test func pagesSecretsGiveBackAreZeroedAndKeptForTheNextUpToTheirCapacity() throws {
        let pages = SecretPages(capacity: 2)
        var addresses: [UInt] = []
        do {
            let secrets = (0..<3).map { index in
                let bytes = SecretBytes(count: 20, pages: pages)
                bytes.base.initializeMemory(as: UInt8.self, repeating: UInt8(ascii: "a") + UInt8(index), count: 20)
                return bytes
            }
            addresses = secrets.map { UInt(bitPattern: $0.base) }
            withExtendedLifetime(secrets) { #expect(pages.keptPages.isEmpty) }
        }
        // Let go: two kept (the capacity), the third unmapped.
        let kept = pages.keptPages
        #expect(kept.count == 2)
        #expect(Set(kept).isSubset(of: Set(addresses)))
        for page in kept {
            let pointer = try #require(UnsafeRawPointer(bitPattern: page))
            #expect(UnsafeRawBufferPointer(start: pointer, count: SecretPages.size).allSatisfy { $0 == 0 }, "a kept page holds zeros")
            #expect(try vmFlags(of: pointer).contains("dd"), "a kept page stays out of core dumps")
        }
        // The next secret of a page takes a kept one: its bytes, then the NUL.
        let next = SecretBytes(count: 5, pages: pages)
        "again".utf8.withContiguousStorageIfAvailable { next.base.copyMemory(from: $0.baseAddress!, byteCount: 5) }
        #expect(kept.contains(UInt(bitPattern: next.base)))
        #expect(String(cString: next.base.assumingMemoryBound(to: CChar.self)) == "again")
        #expect(pages.keptPages.count == 1)
        // A secret of more than a page is never kept.
        do { _ = SecretBytes(count: 2 * SecretPages.size, pages: pages) }
        #expect(pages.keptPages.count == 1)
        withExtendedLifetime(next) {}
    }

    @Test func equalityHashingAndBlankLookAtTheBytes() {
        #expect(Secret("a") == Secret("a"))
        #expect(Secret("a") != Secret("b"))
        #expect(Set([Secret("x"), Secret("x"), Secret("y")]).count == 2)
        #expect(Secret(" \t\n\u{00A0}").isBlank)
        #expect(!Secret(" a ").isBlank)
        #expect(Secret("").isBlank)
        #expect(Secret("abc").occurs(in: "xxabcxx"))
        #expect(!Secret("abc").occurs(in: "ab"))
        #expect(!Secret("").occurs(in: "anything"))
    }

    private func redact(_ text: String, keys: Set<String> = ["access_token", "refresh_token"]) -> SecretJSON.Redacted? {
        Array(text.utf8).withUnsafeBytes { SecretJSON.redact($0, keys: keys) }
    }

    @Test func redactionTakesTheSecretsOutAndLeavesJSONForAnyDecoder() throws {
        let json = #"{"access_token": "a\"b\\c\u00e9\ud83d\ude00\/", "n": 1.5e3, "nested": {"refresh_token": "r1", "list": [true, null, "access_token"]}, "refresh_token": 7}"#
        let redacted = try #require(redact(json))
        let text = String(decoding: redacted.json, as: UTF8.self)
        // The secrets are gone from the JSON, placeholders in their place; a non-string value
        // of a secret member stays as it is.
        #expect(!text.contains("r1"))
        #expect(text.contains(#""refresh_token": 7"#))
        let object = try #require(try JSONSerialization.jsonObject(with: Data(redacted.json)) as? [String: Any])
        let placeholder = try #require(object["access_token"] as? String)
        let access = try #require(redacted.secret(for: placeholder))
        #expect(access.reveal() == "a\"b\\c\u{e9}\u{1F600}/")
        let nested = try #require(object["nested"] as? [String: Any])
        #expect(redacted.secret(for: try #require(nested["refresh_token"] as? String))?.reveal() == "r1")
        #expect(redacted.secrets.count == 2)
    }

    @Test(arguments: [
        "", "{", #"{"a":}"#, #"{"a":1,}"#, #"{"access_token":"x}"#, #"{"access_token":"\q"}"#, "[1,]", "01", "1.", "-",
        #"{"a":1} x"#, "\"\u{01}\"", "tru", #"{"access_token":"\u12"}"#,
    ])
    func malformedJSONIsRefused(_ text: String) {
        // Strict RFC 8259 (Foundation lets trailing commas through; the scanner does not).
        #expect(redact(text) == nil)
    }

    @Test func theWriterWritesEachSecretEscapedIntoItsPlaceInSecretMemory() throws {
        let written = SecretJSON.Writer.secret { json in
            json.beginObject()
            json.key("a")
            json.secret(Secret("t\"o\\k\u{1}en"))
            json.key("b")
            json.beginArray()
            json.secret(Secret("second"))
            json.integer(-42)
            json.bool(true)
            json.null()
            json.endArray()
            json.key("c\u{7f}")
            json.string("é/\n")
            json.key("d")
            json.beginObject()
            json.endObject()
            json.endObject()
        }
        // In memory of its own, left out of core dumps, like every secret.
        let flags = try written.withUnsafeBytes { try vmFlags(of: $0.baseAddress!) }
        #expect(flags.contains("dd"), "VmFlags \(flags)")
        let object = try written.withUnsafeBytes {
            try #require(try JSONSerialization.jsonObject(with: Data($0)) as? [String: Any])
        }
        #expect(object["a"] as? String == "t\"o\\k\u{1}en")
        #expect((object["b"] as? [Any])?.count == 4)
        #expect((object["b"] as? [Any])?.first as? String == "second")
        #expect((object["b"] as? [Any])?[1] as? Int == -42)
        #expect(object["c\u{7f}"] as? String == "é/\n")
        #expect((object["d"] as? [String: Any])?.isEmpty == true)
        // And back: parse finds the secrets again, at any depth, only as strings of secret members.
        let back = try #require(written.withUnsafeBytes { SecretJSON.parse($0, secretKeys: ["a", "b"]) })
        guard case .object(let members) = back, case .secret(let a)? = members["a"], case .array(let b)? = members["b"],
            case .string(let c)? = members["c\u{7f}"]
        else {
            Issue.record("parsed as \(back)")
            return
        }
        #expect(a.reveal() == "t\"o\\k\u{1}en")
        #expect(c == "é/\n")
        if case .string("second") = b.first {} else { Issue.record("an array element is not a secret member's value: \(b)") }
    }

    @Test func everyByteOfASecretComesBackThroughTheWriterAndParse() throws {
        let bytes = (0...255).map { UInt8($0) }
        let secret = bytes.withUnsafeBytes { Secret(copying: $0) }
        let written = SecretJSON.Writer.secret { json in
            json.beginObject()
            json.key("k")
            json.secret(secret)
            json.endObject()
        }
        let value = try #require(written.withUnsafeBytes { SecretJSON.parse($0, secretKeys: ["k"]) })
        guard case .object(let members) = value, case .secret(let back)? = members["k"] else {
            Issue.record("parsed as \(value)")
            return
        }
        #expect(back.withUnsafeBytes { Array($0) } == bytes)
    }

    @Test func parseReadsEveryKindOfValueAndRefusesAMemberNamedTwice() throws {
        let json = #"{"s":"x\u00e9\ud83d\ude00","n":-1.5e3,"t":true,"f":false,"z":null,"o":{"access_token":"deep"},"a":[]}"#
        let value = try #require(Array(json.utf8).withUnsafeBytes { SecretJSON.parse($0, secretKeys: ["access_token"]) })
        guard case .object(let members) = value else {
            Issue.record("not an object: \(value)")
            return
        }
        if case .string(let text)? = members["s"] { #expect(text == "xé😀") } else { Issue.record("s: \(String(describing: members["s"]))") }
        if case .number(let text)? = members["n"] { #expect(text == "-1.5e3") } else { Issue.record("n") }
        if case .bool(true)? = members["t"], case .bool(false)? = members["f"], case .null? = members["z"] {} else { Issue.record("t f z") }
        if case .object(let inner)? = members["o"], case .secret(let deep)? = inner["access_token"] {
            #expect(deep.reveal() == "deep")
        } else {
            Issue.record("o")
        }
        if case .array(let elements)? = members["a"] { #expect(elements.isEmpty) } else { Issue.record("a") }
        #expect(Array(#"{"a":1,"a":2}"#.utf8).withUnsafeBytes { SecretJSON.parse($0, secretKeys: []) } == nil)
        #expect(Array(#"{"t":"1","t":"2"}"#.utf8).withUnsafeBytes { SecretJSON.parse($0, secretKeys: ["t"]) } == nil)
        // The bound on secrets holds for parse too.
        #expect(Array(#"[{"t":"1"},{"t":"2"}]"#.utf8).withUnsafeBytes { SecretJSON.parse($0, secretKeys: ["t"], maximumSecrets: 1) } == nil)
    }

    @Test(arguments: [
        "", "{", #"{"a":}"#, #"{"a":1,}"#, #"{"access_token":"x}"#, #"{"access_token":"\q"}"#, "[1,]", "01", "1.", "-",
        #"{"a":1} x"#, "\"\u{01}\"", "tru", #"{"access_token":"\u12"}"#,
    ])
    func parseRefusesMalformedJSON(_ text: String) {
        #expect(Array(text.utf8).withUnsafeBytes { SecretJSON.parse($0, secretKeys: ["access_token"]) } == nil)
    }
}
