// The store's keys: where they live (a key file, the Secret Service, a key file wrapped with the
// host's key), the key ring that makes rotation crash-safe, and the store file's header that
// names the key a file was sealed with. One file (over 400 lines: 404) because the three go
// together: a header names a key of the ring, and the ring is read and written per source.

import CSecretService
import Crypto
import FoundationEssentials
import SessionCore

#if canImport(Glibc)
import Glibc
#endif

/// Where a store file's key lives, as its (authenticated) header records it.
@_spi(Fuzzing) public enum KeySourceTag: UInt8, Sendable {
    /// `<store>.key`, the key ring in plain (0600).
    case keyFile = 1
    /// The desktop Secret Service (libsecret), one item per store.
    case secretService = 2
    /// `<store>.key`, the key ring sealed with the key the host provides.
    case provided = 3

    var wording: String {
        switch self {
        case .keyFile: "the key file"
        case .secretService: "the Secret Service"
        case .provided: "a key the host provides"
        }
    }
}

/// A store file's header. Version 1 (`SFSTORE` 1): the magic alone, sealed with the key
/// file's single key. Version 2 (`SFSTORE` 2): the magic, the key source, the 8-byte id of the
/// key it is sealed with. The sealed box authenticates the header and the store file's name.
@_spi(Fuzzing) public struct StoreHeader: Equatable, Sendable {
    public var version: UInt8
    public var source: KeySourceTag?
    public var keyID: [UInt8]

    static let magic: [UInt8] = Array("SFSTORE".utf8)
    static let size2 = magic.count + 1 + 1 + 8

    /// The header at the start of `bytes`, nil when they are not a store file.
    public init?(_ bytes: some Collection<UInt8>) {
        let bytes = Array(bytes.prefix(Self.size2))
        guard bytes.count > Self.magic.count, Array(bytes.prefix(Self.magic.count)) == Self.magic else { return nil }
        switch bytes[Self.magic.count] {
        case 1:
            version = 1
            source = nil
            keyID = []
        case 2:
            guard bytes.count == Self.size2, let source = KeySourceTag(rawValue: bytes[Self.magic.count + 1]) else {
                return nil
            }
            version = 2
            self.source = source
            keyID = Array(bytes.suffix(8))
        default:
            return nil
        }
    }

    init(source: KeySourceTag, keyID: [UInt8]) {
        version = 2
        self.source = source
        self.keyID = keyID
    }

    var bytes: [UInt8] {
        version == 1 ? Self.magic + [1] : Self.magic + [2, source?.rawValue ?? 0] + keyID
    }

    var count: Int { version == 1 ? Self.magic.count + 1 : Self.size2 }

    /// What the sealed box authenticates besides the plaintext: the header, and (version 2)
    /// the store file's name, so that a store file copied over another store's name — sharing
    /// its key — does not open.
    func authenticatedData(name: String) -> [UInt8] {
        version == 1 ? bytes : bytes + Array(name.utf8)
    }
}

/// Keys and their ids. An id is the first 8 bytes of SHA-256 over a label and the key (a key
/// check value: it tells keys apart, and reveals nothing usable about the key).
@_spi(Fuzzing) public enum StoreKeyID {
    public static func of(_ key: SymmetricKey) -> [UInt8] {
        withCipherStateScrubbed(.digest) {
            var hash = SHA256()
            hash.update(data: Array("SessionFlow store key id".utf8))
            key.withUnsafeBytes { hash.update(bufferPointer: $0) }
            return Array(hash.finalize().prefix(8))
        }
    }

    static func hex(_ id: [UInt8]) -> String {
        id.map { byte in
            let text = String(byte, radix: 16)
            return text.count == 1 ? "0" + text : text
        }.joined()
    }
}

/// Where this store's key ring lives (decided from the header and the configured `Key`).
enum KeyHome {
    /// `<store>.key`, the ring in plain: 32 bytes per key, newest first (one key: the format
    /// of every key file before rotation existed).
    case file
    /// `<store>.key` holding the ring sealed (AES-GCM) with the host's key-encryption key.
    case wrapped(SymmetricKey)
    /// The Secret Service item of this store: the ring in hex.
    case secretService

    var tag: KeySourceTag {
        switch self {
        case .file: .keyFile
        case .wrapped: .provided
        case .secretService: .secretService
        }
    }
}

/// Bounds every Secret Service call (a service that does not answer, a keyring that prompts).
let secretServiceTimeoutMilliseconds: Int32 = 5_000

private let wrappedMagic: [UInt8] = Array("SFKEYW".utf8) + [1]

extension FileCredentialStore {
    /// The key ring's bytes: the keys, newest first.
    private static func ringBytes(_ keys: [SymmetricKey]) -> [UInt8] {
        // Sized up front and filled in place: no intermediate array holds a key.
        var bytes = [UInt8](repeating: 0, count: keys.count * 32)
        bytes.withUnsafeMutableBytes { out in
            for (index, key) in keys.enumerated() {
                key.withUnsafeBytes { out.baseAddress!.advanced(by: index * 32).copyMemory(from: $0.baseAddress!, byteCount: 32) }
            }
        }
        return bytes
    }

    private static func ring(from bytes: [UInt8]) -> [SymmetricKey]? {
        guard !bytes.isEmpty, bytes.count % 32 == 0 else { return nil }
        return stride(from: 0, to: bytes.count, by: 32).map { SymmetricKey(data: bytes[$0..<$0 + 32]) }
    }

    /// The absolute directory that names this store in the Secret Service (with `name`).
    var secretServiceDirectory: String {
        if directory.hasPrefix("/") { return TrustedDirectory.normalized(directory) }
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        guard getcwd(&buffer, buffer.count) != nil else { return TrustedDirectory.normalized(directory) }
        let cwd = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return TrustedDirectory.normalized(cwd + "/" + directory)
    }

    /// The header of the store file as it is now; nil when there is none (or it is no store
    /// file: a damaged one was moved aside by the load before).
    func currentHeader(in directory: TrustedDirectory) throws(StoreFailure) -> StoreHeader? {
        switch FileIO.readAll(name, in: directory) {
        case .missing: return nil
        case .failed(let message): throw .unavailable(message)
        case .read(let bytes): return StoreHeader(bytes)
        }
    }

    /// Where the keys of a store file with `header` (nil: no store file yet) are, given the
    /// configured source. A store sealed with a key from elsewhere than configured is
    /// unavailable — never re-keyed, never overwritten.
    func keyHome(for header: StoreHeader?, in directory: TrustedDirectory) throws(StoreFailure) -> KeyHome {
        // Version 1 files were sealed with the key file's key (or the host's key itself).
        let recorded: KeySourceTag? = header.map { $0.version == 1 ? nil : $0.source } ?? nil
        func mismatch(_ tag: KeySourceTag, _ configured: String) -> StoreFailure {
            .unavailable("\(path) is sealed with \(tag.wording), but the store was opened with \(configured)")
        }
        switch keySource {
        case .provided(let key):
            if let recorded, recorded != .provided { throw mismatch(recorded, "a key the host provides") }
            return .wrapped(key)
        case .keyFile:
            if let recorded, recorded != .keyFile { throw mismatch(recorded, "the key file") }
            return .file
        case .secretService:
            if header?.version == 1 { throw mismatch(.keyFile, "the Secret Service") }
            if let recorded, recorded != .secretService { throw mismatch(recorded, "the Secret Service") }
            return .secretService
        case .automatic:
            if header?.version == 1 { return .file }
            switch recorded {
            case .keyFile: return .file
            case .secretService: return .secretService
            case .provided: throw mismatch(.provided, "no key from the host")
            case nil: break
            }
            // A new store: an existing key file (whatever it is: its checks apply) is used;
            // else the Secret Service when a session bus and the service answer; else a new
            // key file.
            if case .missing = FileIO.readAll(keyName, in: directory) {
                if Self.secretServiceDisabled { return .file }
                var message = [CChar](repeating: 0, count: 512)
                var secret: UnsafeMutablePointer<CChar>?
                let result = sfss_lookup(
                    secretServiceDirectory, name, secretServiceTimeoutMilliseconds, &secret, &message, message.count)
                sfss_free_secret(secret)
                return result == Int32(SFSS_UNAVAILABLE) ? .file : .secretService
            }
            return .file
        }
    }

    /// `SESSIONFLOW_SECRET_SERVICE=off` (or 0, no): `.automatic` never uses the Secret Service.
    static var secretServiceDisabled: Bool {
        guard let value = getenv("SESSIONFLOW_SECRET_SERVICE") else { return false }
        return ["off", "0", "no", "false"].contains(String(cString: value).lowercased())
    }

    /// The key ring at `home`, newest first; empty when there is none yet.
    func loadRing(_ home: KeyHome, in directory: TrustedDirectory) throws(StoreFailure) -> [SymmetricKey] {
        switch home {
        case .file, .wrapped:
            var bytes: [UInt8]
            switch FileIO.readAll(keyName, in: directory) {
            case .missing: return []
            case .failed(let message): throw .unavailable("the key file cannot be used: \(message)")
            case .read(let content): bytes = content
            }
            defer { wipe(&bytes) }
            if case .wrapped(let kek) = home {
                guard bytes.count > wrappedMagic.count, Array(bytes.prefix(wrappedMagic.count)) == wrappedMagic else {
                    throw .unavailable("the key file \(keyPath) is not sealed with a host's key, but the store was opened with one")
                }
                guard let box = try? AES.GCM.SealedBox(combined: bytes.dropFirst(wrappedMagic.count)),
                    var plain = try? withCipherStateScrubbed(.cipher, { try AES.GCM.open(box, using: kek, authenticating: wrappedMagic + Array(name.utf8)) })
                else {
                    throw .unavailable("the key file \(keyPath) does not open with the key the host provided (another key?)")
                }
                defer { plain.withUnsafeMutableBytes { zeroSecretMemory($0) } }
                var ringBytes = Array(plain)
                defer { wipe(&ringBytes) }
                guard let keys = Self.ring(from: ringBytes) else {
                    throw .unavailable("the key file \(keyPath) does not open with the key the host provided (another key?)")
                }
                return keys
            }
            guard let keys = Self.ring(from: bytes) else {
                if bytes.count > wrappedMagic.count, Array(bytes.prefix(wrappedMagic.count)) == wrappedMagic {
                    throw .unavailable("the key file \(keyPath) is sealed with a key the host provides, which this store was not given")
                }
                throw .unavailable("the key file \(keyPath) is not a 256-bit key")
            }
            return keys
        case .secretService:
            var message = [CChar](repeating: 0, count: 512)
            var secret: UnsafeMutablePointer<CChar>?
            let result = sfss_lookup(secretServiceDirectory, name, secretServiceTimeoutMilliseconds, &secret, &message, message.count)
            defer { sfss_free_secret(secret) }
            switch result {
            case Int32(SFSS_NOT_FOUND): return []
            case Int32(SFSS_OK):
                guard let secret, let keys = Self.ring(fromHex: secret) else {
                    throw .unavailable("the Secret Service item of \(path) is not a SessionFlow key")
                }
                return keys
            default:
                throw .unavailable("the key of \(path) is in the Secret Service, which cannot be reached: \(text(message))")
            }
        }
    }

    private static func ring(fromHex pointer: UnsafeMutablePointer<CChar>) -> [SymmetricKey]? {
        let count = strlen(pointer)
        guard count > 0, count % 64 == 0 else { return nil }
        var bytes = [UInt8](repeating: 0, count: count / 2)
        defer { wipe(&bytes) }
        func nibble(_ c: CChar) -> UInt8? {
            switch UInt8(bitPattern: c) {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): UInt8(bitPattern: c) - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): UInt8(bitPattern: c) - UInt8(ascii: "a") + 10
            default: nil
            }
        }
        for index in 0..<bytes.count {
            guard let high = nibble(pointer[2 * index]), let low = nibble(pointer[2 * index + 1]) else { return nil }
            bytes[index] = high << 4 | low
        }
        return ring(from: bytes)
    }

    /// Writes the ring to `home`. `create`: only if there is none yet (false: one exists,
    /// nothing written — the first key another writer made wins); else it replaces the ring
    /// atomically.
    @discardableResult
    func storeRing(_ keys: [SymmetricKey], _ home: KeyHome, create: Bool, in directory: TrustedDirectory) throws(StoreFailure) -> Bool {
        var plain = Self.ringBytes(keys)
        defer { wipe(&plain) }
        switch home {
        case .file, .wrapped:
            var content = plain
            defer { wipe(&content) }
            if case .wrapped(let kek) = home {
                guard let box = try? withCipherStateScrubbed(.cipher, { try AES.GCM.seal(plain, using: kek, authenticating: wrappedMagic + Array(name.utf8)) }),
                    let combined = box.combined
                else { throw .unavailable("cannot seal the store's key with the host's key") }
                content = wrappedMagic + Array(combined)
            }
            if create { return try FileIO.createExclusively(keyName, with: content, in: directory) }
            try FileIO.replaceAtomically(keyName, with: content, in: directory)
            return true
        case .secretService:
            let digits = Array("0123456789abcdef".utf8)
            var hex = [CChar](repeating: 0, count: plain.count * 2 + 1)
            defer { wipe(&hex) }
            for (index, byte) in plain.enumerated() {
                hex[2 * index] = CChar(bitPattern: digits[Int(byte >> 4)])
                hex[2 * index + 1] = CChar(bitPattern: digits[Int(byte & 15)])
            }
            var message = [CChar](repeating: 0, count: 512)
            let result = sfss_store(
                secretServiceDirectory, name, "SessionFlow store key (\(path))", hex, secretServiceTimeoutMilliseconds,
                &message, message.count)
            guard result == Int32(SFSS_OK) else {
                throw .unavailable("cannot keep the key of \(path) in the Secret Service: \(text(message))")
            }
            return true
        }
    }

    /// The ring at `home`, with a first key made if there is none.
    func ringCreatingKey(_ home: KeyHome, in directory: TrustedDirectory) throws(StoreFailure) -> [SymmetricKey] {
        let keys = try loadRing(home, in: directory)
        if !keys.isEmpty { return keys }
        let key = SymmetricKey(size: .bits256)
        if try storeRing([key], home, create: true, in: directory) { return [key] }
        let again = try loadRing(home, in: directory)
        guard !again.isEmpty else { throw .unavailable("no encryption key") }
        return again
    }
}

/// Overwrites a buffer that held key material (best effort: copies made on the way are not reached).
func wipe<T: FixedWidthInteger>(_ bytes: inout [T]) {
    bytes.withUnsafeMutableBytes { zeroSecretMemory($0) }
}

private func text(_ message: [CChar]) -> String {
    String(decoding: message.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

extension FileCredentialStore.Key {
    /// A host's 256-bit key from raw bytes (copied; the caller may wipe its buffer after).
    public static func provided(copying bytes: UnsafeRawBufferPointer) -> Self {
        .provided(SymmetricKey(data: bytes))
    }

    /// A host's key from a file: 32 bytes, or 64 hex digits (`openssl rand -hex 32`, a trailing
    /// newline allowed). The file must pass the store's own checks: its directory the user's and
    /// not writable by group or others; the file regular, the user's, one link, no group or
    /// other permission — a key others could read or swap is refused. The error names the
    /// path and the reason, never the content.
    public static func fromFile(_ path: String) throws(StoreError) -> Self {
        let slash = path.lastIndex(of: "/")
        let directoryPath = slash.map { $0 == path.startIndex ? "/" : String(path[..<$0]) } ?? "."
        let fileName = slash.map { String(path[path.index(after: $0)...]) } ?? path
        guard !fileName.isEmpty, fileName != ".", fileName != ".." else {
            throw StoreError("the key file \(path) is not a file name")
        }
        let directory: TrustedDirectory
        switch TrustedDirectory.open(directoryPath, create: false) {
        case .opened(let opened): directory = opened
        case .missing: throw StoreError("the key file \(path) does not exist")
        case .unreachable(_, let message), .refused(let message): throw StoreError("the key file \(path) cannot be used: \(message)")
        }
        var bytes: [UInt8]
        switch FileIO.readAll(fileName, in: directory) {
        case .missing: throw StoreError("the key file \(path) does not exist")
        case .failed(let message): throw StoreError(message)
        case .read(let content): bytes = content
        }
        defer { wipe(&bytes) }
        if bytes.count == 32 { return .provided(SymmetricKey(data: bytes)) }
        var digits = bytes
        defer { wipe(&digits) }
        while let last = digits.last, last == UInt8(ascii: "\n") || last == UInt8(ascii: "\r") { digits.removeLast() }
        guard digits.count == 64 else {
            throw StoreError("the key file \(path) holds neither 32 bytes nor 64 hex digits")
        }
        var key = [UInt8](repeating: 0, count: 32)
        defer { wipe(&key) }
        func nibble(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
            default: nil
            }
        }
        for index in 0..<32 {
            guard let high = nibble(digits[2 * index]), let low = nibble(digits[2 * index + 1]) else {
                throw StoreError("the key file \(path) holds neither 32 bytes nor 64 hex digits")
            }
            key[index] = high << 4 | low
        }
        return .provided(SymmetricKey(data: key))
    }
}
