// libFuzzer target for the store file format: `FileCredentialStore.decode(_:key:)` (header,
// AES-GCM, JSON `Document`) and its inverse `encode(_:key:)`.
//
// Build and run (see Fuzz/README.md and scripts/fuzz.sh):
//   swift build --package-path Tools --product fuzz-store-decoder --sanitize=fuzzer --sanitize=address \
//       -Xswiftc -sanitize=fuzzer,address --scratch-path .build-fuzz
//   .build-fuzz/debug/fuzz-store-decoder CORPUS_COPY
//
// One file, not named main.swift, and no top-level code but one global: under
// `--sanitize=fuzzer` SwiftPM compiles it with -parse-as-library and libFuzzer's `main` runs; in
// a plain build SwiftPM treats the lone file as the entry point, which initializes that global:
// it replays the inputs named on the command line (FuzzReplay).
//
// Byte 0 picks the mode (mod 4); the rest is the payload:
//   0 raw       the payload is a store file: decode it with the fixed key and with none
//               (must throw or return, never crash); a document must round-trip.
//   1 sealed    the payload is plaintext, sealed with the fixed key: decode reaches the
//               JSON decoder behind valid authentication; it may only fail as a
//               DecodingError or as a record filed under another account than its own
//               (StoreDecodeFailure .binding), and a document must round-trip.
//   2 tampered  byte 1-2 pick a bit of the sealed payload (header included) to flip:
//               decode must throw; the untouched file must not open with another key, nor
//               under another store file's name (the name is authenticated).
//   3 truncated byte 1-2 pick a length to cut the sealed payload to: decode must throw.
// Round trip: decode(encode(doc)) == doc, field by field (version — 1 becomes 2 —, active,
// each account's session).
//
// FUZZ_STORE_EMIT=DIR: every document that decodes is also written to DIR as a mode-0
// input holding `encode(doc)`; Fuzz/README.md says how the seed corpus was made with it.

import Crypto
import Foundation
import SessionCore
@_spi(Fuzzing) import SessionFileStore
import FuzzReplay

enum FuzzStore {
    /// The fixed 256-bit key of the fuzz target and its seed corpus.
    static let key = SymmetricKey(data: (0..<32).map { UInt8(truncatingIfNeeded: 0xA5 ^ ($0 &* 29)) })
    static let otherKey = SymmetricKey(data: [UInt8](repeating: 0x5A, count: 32))
    static let emitDirectory: String? = ProcessInfo.processInfo.environment["FUZZ_STORE_EMIT"]
}

private typealias Store = FileCredentialStore

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzStoreDecoder(_ start: UnsafeRawPointer?, _ count: Int) -> CInt {
    let input = UnsafeRawBufferPointer(start: start, count: count)
    guard let mode = input.first else { return 0 }
    switch mode % 4 {
    case 0:
        let bytes = Array(input.dropFirst())
        if let document = try? Store.decode(bytes, key: FuzzStore.key) {
            checkRoundTrip(document)
        }
        if (try? Store.decode(bytes, key: nil)) != nil {
            fatalError("property violated: a store file decoded without a key")
        }
    case 1:
        let sealed = seal(input.dropFirst())
        do {
            checkRoundTrip(try Store.decode(sealed, key: FuzzStore.key))
        } catch is DecodingError {
            // Not a document: one of the two ways a correctly sealed file may fail.
        } catch let failure as StoreDecodeFailure where failure.kind == .binding {
            // A document whose record carries another account than it is filed under.
        } catch {
            fatalError("property violated: a correctly sealed file failed with \(type(of: error)): \(error)")
        }
    case 2:
        guard input.count >= 3 else { return 0 }
        var sealed = seal(input.dropFirst(3))
        if (try? Store.decode(sealed, key: FuzzStore.otherKey)) != nil {
            fatalError("property violated: a store file opened with the wrong key")
        }
        if (try? Store.decode(sealed, name: "other.sfstore", keys: [FuzzStore.key])) != nil {
            fatalError("property violated: a store file opened under another store's name")
        }
        let bit = (Int(input[1]) | Int(input[2]) << 8) % (sealed.count * 8)
        sealed[bit / 8] ^= 1 << UInt8(bit % 8)
        if (try? Store.decode(sealed, key: FuzzStore.key)) != nil {
            fatalError("property violated: a store file with bit \(bit) flipped still decoded")
        }
    default:
        guard input.count >= 3 else { return 0 }
        let sealed = seal(input.dropFirst(3))
        let length = (Int(input[1]) | Int(input[2]) << 8) % sealed.count
        if (try? Store.decode(Array(sealed.prefix(length)), key: FuzzStore.key)) != nil {
            fatalError("property violated: a store file cut to \(length) of \(sealed.count) bytes decoded")
        }
    }
    return 0
}

/// The payload as the plaintext of a store file sealed with the fixed key.
private func seal(_ plaintext: UnsafeRawBufferPointer.SubSequence) -> [UInt8] {
    do {
        return try Store.seal(Array(plaintext), key: FuzzStore.key)
    } catch {
        fatalError("sealing failed: \(error)")
    }
}

/// decode(encode(document)) must give the same document back.
private func checkRoundTrip(_ document: Store.Document) {
    let bytes: [UInt8]
    let again: Store.Document
    do {
        bytes = try Store.encode(document, key: FuzzStore.key)
        again = try Store.decode(bytes, key: FuzzStore.key)
    } catch {
        fatalError("property violated: a decoded document does not encode and decode again: \(error)")
    }
    // encode writes version 2 (records stamped with their account); a version-1 document
    // comes back as version 2, nothing else changed.
    guard again.version == max(document.version, 2) else {
        fatalError("property violated: round trip changed version \(document.version) to \(again.version)")
    }
    guard again.active == document.active else {
        fatalError("property violated: round trip changed the active account")
    }
    guard Set(again.accounts.keys) == Set(document.accounts.keys) else {
        fatalError("property violated: round trip changed the accounts \(document.accounts.count) → \(again.accounts.count)")
    }
    for (account, record) in document.accounts where again.accounts[account]?.session != record.session {
        fatalError("property violated: round trip changed the session of account \(String(reflecting: account))")
    }
    guard again.cleared == document.cleared else {
        fatalError("property violated: round trip changed the accounts logged out beside damaged copies (cleared)")
    }
    if let directory = FuzzStore.emitDirectory {
        emit([0] + bytes, to: directory)
    }
}

/// Writes a mode-0 input to `directory`, named by its content (FUZZ_STORE_EMIT).
private func emit(_ input: [UInt8], to directory: String) {
    let name = String(SHA256.hash(data: input).map { String(format: "%02x", $0) }.joined().prefix(16))
    let url = URL(fileURLWithPath: directory).appendingPathComponent("store-\(name)")
    do {
        try Data(input).write(to: url)
    } catch {
        fatalError("cannot write \(url.path): \(error)")
    }
}

// A plain build: the entry point runs this global's initializer, which replays the inputs named
// on the command line (Tools/Sources/FuzzReplay). The fuzzer's build (-parse-as-library) has no
// top-level code: this is a lazy global nobody reads, so it never runs there.
let replayed: Never = replay(fuzzStoreDecoder)
