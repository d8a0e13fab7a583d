// libFuzzer target for the error text allow-list of SessionOAuth (issue 13): `ErrorText.code`,
// `ErrorText.description(_:secrets:)`, `ErrorText.scrub(_:secrets:)` and
// `ErrorText.containsSecret(_:secrets:)`, with fuzzed secrets as well as fuzzed text.
//
// Build and run (see Fuzz/README.md and scripts/fuzz.sh):
//   swift build --package-path Tools --product fuzz-error-text --sanitize=fuzzer --sanitize=address \
//       -Xswiftc -sanitize=fuzzer,address --scratch-path .build-fuzz
//   .build-fuzz/debug/fuzz-error-text -dict=Fuzz/error-text.dict CORPUS_COPY
//
// One file, not named main.swift, and no top-level code but one global (see
// FuzzTokenResponse.swift for why).
//
// Input layout:
//   byte 0        how the first secret is planted in the middle of the text (value % 8):
//                 0 raw, 1 %XX, 2 %xx, 3 \uXXXX, 4 form-encoded (+ for space, %XX), 5 JSON
//                 short escapes (\/ \" \\ \n...), 6 and 7 not planted
//   byte 1        the first secret's length in bytes (mod 33; 0 = an empty secret)
//   next bytes    the first secret (UTF-8, repaired)
//   next byte     the second secret's length (mod 9)
//   next bytes    the second secret
//   the rest      the text (UTF-8, repaired)
//
// Properties, each a trap with its own message:
//   - code: an allowed code passes as itself, anything else becomes "unrecognised_error";
//   - description: at most 200 bytes, only %x20-21 / %x23-5B / %x5D-7E, no form of any secret;
//   - scrub: no form of any secret; with no (non-empty) secret, the text unchanged;
//   - a planted secret is found by containsSecret (the matcher knows the form).

import SessionCore
@_spi(Fuzzing) import SessionOAuth
import FuzzReplay

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzErrorText(_ start: UnsafeRawPointer?, _ count: Int) -> CInt {
    var input = UnsafeRawBufferPointer(start: start, count: count)[...]
    guard input.count >= 3 else { return 0 }
    let plant = input.removeFirst() % 8
    let first = take(&input, Int(input.removeFirst()) % 33)
    let second = input.isEmpty ? "" : take(&input, Int(input.removeFirst()) % 9)
    let secrets = [Secret(first), Secret(second)]
    let nonEmpty = secrets.filter { !$0.reveal().isEmpty }
    var text = String(decoding: input, as: UTF8.self)
    if plant < 6, !first.isEmpty {
        let scalars = Array(text.unicodeScalars)
        let middle = scalars.count / 2
        var planted = String.UnicodeScalarView(scalars[..<middle])
        planted.append(contentsOf: encode(first, plant).unicodeScalars)
        planted.append(contentsOf: scalars[middle...])
        text = String(planted)
        if !ErrorText.containsSecret(text, secrets: [Secret(first)]) {
            fatalError("property violated: a secret planted in form \(plant) is not found")
        }
    }

    let code = ErrorText.code(text)
    if code != (ErrorText.knownCodes.contains(text) ? text : ErrorText.unrecognisedCode) {
        fatalError("property violated: ErrorText.code let an unknown code through, or changed a known one")
    }

    guard let described = ErrorText.description(text, secrets: secrets) else {
        fatalError("property violated: ErrorText.description lost a description")
    }
    if described.utf8.count > ErrorText.maximumDescriptionLength {
        fatalError("property violated: a description of \(described.utf8.count) bytes")
    }
    if let byte = described.utf8.first(where: { !(0x20...0x7E).contains($0) || $0 == 0x22 || $0 == 0x5C }) {
        fatalError("property violated: a description holds the byte \(byte)")
    }
    if ErrorText.containsSecret(described, secrets: secrets) {
        fatalError("property violated: a description holds a form of a secret (plant \(plant))")
    }

    let scrubbed = ErrorText.scrub(text, secrets: secrets)
    if ErrorText.containsSecret(scrubbed, secrets: secrets) {
        fatalError("property violated: scrub left a form of a secret (plant \(plant))")
    }
    if nonEmpty.isEmpty && scrubbed != text {
        fatalError("property violated: scrub changed a text with no secret to scrub")
    }
    return 0
}

/// The next `length` bytes (or what is left) as a string.
private func take(_ input: inout Slice<UnsafeRawBufferPointer>, _ length: Int) -> String {
    let bytes = input.prefix(length)
    input = input.dropFirst(bytes.count)
    return String(decoding: bytes, as: UTF8.self)
}

/// `secret` written the way an encoder would (see the input layout), by code of its own.
private func encode(_ secret: String, _ form: UInt8) -> String {
    let hex = Array("0123456789ABCDEF")
    func percent(_ byte: UInt8, lower: Bool) -> String {
        let text = "%" + String(hex[Int(byte >> 4)]) + String(hex[Int(byte & 0xF)])
        return lower ? text.lowercased() : text
    }
    switch form {
    case 0:
        return secret
    case 1, 2:
        return secret.utf8.map { percent($0, lower: form == 2) }.joined()
    case 3:
        return secret.utf16.map { unit in
            "\\u" + [12, 8, 4, 0].map { String(hex[Int((unit >> UInt16($0)) & 0xF)]).lowercased() }.joined()
        }.joined()
    case 4:
        return secret.utf8.map { byte -> String in
            switch byte {
            case UInt8(ascii: " "): return "+"
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"):
                return String(UnicodeScalar(byte))
            default: return percent(byte, lower: false)
            }
        }.joined()
    default:
        return secret.unicodeScalars.map { scalar -> String in
            switch scalar {
            case "/": return "\\/"
            case "\"": return "\\\""
            case "\\": return "\\\\"
            case "\n": return "\\n"
            case "\r": return "\\r"
            case "\t": return "\\t"
            case "\u{08}": return "\\b"
            case "\u{0C}": return "\\f"
            default: return String(scalar)
            }
        }.joined()
    }
}

// A plain build: the entry point runs this global's initializer, which replays the inputs named
// on the command line (Tools/Sources/FuzzReplay). The fuzzer's build (-parse-as-library) has no
// top-level code: this is a lazy global nobody reads, so it never runs there.
let replayed: Never = replay(fuzzErrorText)
