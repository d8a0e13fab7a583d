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

    @Test func spliceWritesEachSecretEscapedIntoItsPlace() throws {
        let placeholders = SecretJSON.Placeholders()
        let one = placeholders.placeholder(for: Secret("t\"o\\k\u{1}en"))
        let two = placeholders.placeholder(for: Secret("second"))
        let template = try JSONSerialization.data(withJSONObject: ["a": one, "b": [two], "c": "sfsecret-not-ours"], options: [.sortedKeys])
        let spliced = SecretJSON.splice(Array(template), placeholders)
        let object = try spliced.withUnsafeBytes {
            try #require(try JSONSerialization.jsonObject(with: Data($0)) as? [String: Any])
        }
        #expect(object["a"] as? String == "t\"o\\k\u{1}en")
        #expect(object["b"] as? [String] == ["second"])
        #expect(object["c"] as? String == "sfsecret-not-ours")
        // And back: redaction finds them again.
        let back = try #require(spliced.withUnsafeBytes { SecretJSON.redact($0, keys: ["a", "b"]) })
        #expect(back.secrets.count == 1)  // "b" holds an array, not a string
        #expect(back.secrets.values.first?.reveal() == "t\"o\\k\u{1}en")
    }
}
