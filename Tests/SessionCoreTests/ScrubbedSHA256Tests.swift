import Testing

@testable import SessionCore

/// The SHA-256 of DPoP's `ath` (computed in place, no copy of the token left): FIPS 180-4's
/// example vectors, and every padding case around the 56- and 64-byte block boundaries.
@Suite("SHA-256 without a copy of its input")
struct ScrubbedSHA256Tests {
    static func hex(_ text: String) -> String {
        Array(text.utf8).withUnsafeBytes { ScrubbedSHA256.hash($0) }.map {
            String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16)
        }.joined()
    }

    @Test func theStandardVectors() {
        #expect(Self.hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(Self.hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(Self.hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")
            == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
        #expect(Self.hex(String(repeating: "a", count: 1_000_000))
            == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
        // Two blocks of padding (a 64-byte message) and a 55/56-byte boundary.
        #expect(Self.hex(String(repeating: "a", count: 64))
            == "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb")
        #expect(Self.hex(String(repeating: "a", count: 55))
            == "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318")
        #expect(Self.hex(String(repeating: "a", count: 56))
            == "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a")
    }
}
