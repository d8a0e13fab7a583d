import LoopFlow

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A token or other secret. It prints as `<redacted>` everywhere — `description`,
/// `debugDescription`, string interpolation, `dump`, `Mirror` — so it cannot reach a
/// log, an error message or CLI output by accident.
///
/// Its bytes live in memory the secret owns (`SecretBytes`): pages of their own, left out
/// of core dumps (`MADV_DONTDUMP`), zeroed (`explicit_bzero`) when the last copy of the
/// secret goes. Copies of a `Secret` share those bytes. Read them where they must leave the
/// process (a form body, the encrypted store, a C host's callback) with `withUnsafeBytes`
/// or `withCString`, which make no copy; `reveal()` makes a `String` the secret cannot
/// zero, for tests and for hosts that need one.
public struct Secret: Sendable, Hashable, CustomStringConvertible, CustomDebugStringConvertible,
    CustomReflectable
{
    private let bytes: SecretBytes

    /// A secret holding the UTF-8 of `text`. The `String` itself stays the caller's (and
    /// is not zeroed); code that receives a secret as bytes uses `init(copying:)`.
    public init(_ text: String) {
        var text = text
        bytes = text.withUTF8 { SecretBytes(copying: UnsafeRawBufferPointer($0)) }
    }

    /// A secret holding a copy of `bytes` (the caller zeroes its own buffer).
    public init(copying bytes: UnsafeRawBufferPointer) {
        self.bytes = SecretBytes(copying: bytes)
    }

    /// A secret of `count` bytes written in place by `fill` (which gets the secret's own
    /// buffer: no intermediate copy exists).
    public init(count: Int, fill: (UnsafeMutableRawBufferPointer) -> Void) {
        bytes = SecretBytes(count: count)
        fill(UnsafeMutableRawBufferPointer(start: bytes.base, count: count))
    }

    /// The secret's bytes (UTF-8, no terminator), for the duration of `body`. Never copy
    /// them into memory that is not zeroed after.
    public func withUnsafeBytes<R, E: Error>(_ body: (UnsafeRawBufferPointer) throws(E) -> R) throws(E) -> R {
        try body(UnsafeRawBufferPointer(start: bytes.base, count: bytes.count))
    }

    /// The secret as a NUL-terminated C string, for the duration of `body` (no copy: the
    /// terminator is part of the secret's buffer).
    public func withCString<R>(_ body: (UnsafePointer<CChar>) throws -> R) rethrows -> R {
        try body(bytes.base.assumingMemoryBound(to: CChar.self))
    }

    /// Whether the secret's bytes occur in `text` (a server that shows a secret where it is
    /// not one). An empty secret occurs nowhere.
    public func occurs(in text: String) -> Bool {
        guard count > 0 else { return false }
        var text = text
        return text.withUTF8 { haystack in
            withUnsafeBytes { needle in
                guard haystack.count >= needle.count else { return false }
                for start in 0...(haystack.count - needle.count) {
                    var index = 0
                    while index < needle.count && haystack[start + index] == needle[index] { index += 1 }
                    if index == needle.count { return true }
                }
                return false
            }
        }
    }

    /// Its length in bytes (UTF-8).
    public var count: Int { bytes.count }

    /// The secret as a `String`. The copy is the caller's and is never zeroed: prefer
    /// `withUnsafeBytes`. Never log it.
    public func reveal() -> String {
        String(decoding: UnsafeRawBufferPointer(start: bytes.base, count: bytes.count), as: UTF8.self)
    }

    /// Whether it is empty or only white space (a "blank" token counts as no token).
    public var isBlank: Bool {
        withUnsafeBytes { raw in
            var iterator = raw.makeIterator()
            var parser = Unicode.UTF8.ForwardParser()
            while true {
                switch parser.parseScalar(from: &iterator) {
                case .valid(let encoded):
                    if !Unicode.UTF8.decode(encoded).properties.isWhitespace { return false }
                case .error:
                    return false
                case .emptyInput:
                    return true
                }
            }
        }
    }

    public static func == (lhs: Secret, rhs: Secret) -> Bool {
        lhs.bytes === rhs.bytes || lhs.withUnsafeBytes { a in rhs.withUnsafeBytes { b in a.elementsEqual(b) } }
    }

    public func hash(into hasher: inout Hasher) {
        withUnsafeBytes { hasher.combine(bytes: $0) }
    }

    public var description: String { "<redacted>" }
    public var debugDescription: String { "<redacted>" }
    public var customMirror: Mirror { Mirror(self, children: [], displayStyle: .struct) }
}

/// Bytes of a secret in memory of their own: whole pages mapped for them, marked
/// `MADV_DONTDUMP` (a core dump leaves them out) and zeroed with `explicit_bzero` before
/// they are unmapped (or, a single page, kept for the next secret: `SecretPages`). A NUL
/// follows the bytes (C hosts read them in place). Should `mmap`
/// fail (the process's map limit), the bytes go to the heap — still zeroed at the end.
final class SecretBytes: @unchecked Sendable {
    let base: UnsafeMutableRawPointer
    let count: Int
    private let mapped: Int
    private let pages: SecretPages

    init(count: Int, pages: SecretPages = .shared) {
        self.count = count
        self.pages = pages
        let page = SecretPages.size
        let length = (count + 1 + page - 1) / page * page
        if length == page, let kept = pages.take() {
            base = kept
            mapped = length
            return  // zeroed when it was given back: the NUL is there
        }
        let region = mmap(nil, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        if let region, region != MAP_FAILED {
            _ = madvise(region, length, MADV_DONTDUMP)
            base = region
            mapped = length
        } else {
            base = UnsafeMutableRawPointer.allocate(byteCount: count + 1, alignment: 16)
            mapped = 0
        }
        base.storeBytes(of: 0, toByteOffset: count, as: UInt8.self)
    }

    convenience init(copying source: UnsafeRawBufferPointer) {
        self.init(count: source.count)
        if let from = source.baseAddress, source.count > 0 { base.copyMemory(from: from, byteCount: source.count) }
    }

    deinit {
        if mapped > 0 {
            explicit_bzero(base, mapped)
            if mapped == SecretPages.size, pages.give(base) { return }
            munmap(base, mapped)
        } else {
            explicit_bzero(base, count + 1)
            base.deallocate()
        }
    }
}

/// Pages that secrets of one page gave back, zeroed, kept for the next ones (at most
/// `capacity`). Without them every secret cost three system calls (mmap, madvise, munmap),
/// and a munmap while another thread of the process runs also costs an interrupt to every
/// core that thread ran on (its TLB is flushed): a store write made five secrets. A kept
/// page stays mapped and out of core dumps, and holds nothing but zeros.
final class SecretPages: @unchecked Sendable {
    /// The process's pages (every secret's, but a test's own).
    static let shared = SecretPages(capacity: 16)
    static let size = Int(sysconf(Int32(_SC_PAGESIZE)))

    let capacity: Int
    /// The kept pages' addresses. Behind pthread's mutex (`Lock`), not the standard library's
    /// `Mutex`: ThreadSanitizer does not see `Mutex`'s atomics (they run in the uninstrumented
    /// Synchronization library) and reports every access under it as a race.
    private let kept: LockedBox<[UInt]>

    init(capacity: Int) {
        self.capacity = capacity
        var pages: [UInt] = []
        pages.reserveCapacity(capacity)
        kept = LockedBox(pages)
    }

    func take() -> UnsafeMutableRawPointer? {
        kept.withLockedValue { $0.popLast() }.flatMap { UnsafeMutableRawPointer(bitPattern: $0) }
    }

    /// Keeps `page` (already zeroed) unless `capacity` are kept; whether it did.
    func give(_ page: UnsafeMutableRawPointer) -> Bool {
        kept.withLockedValue { pages in
            guard pages.count < capacity else { return false }
            pages.append(UInt(bitPattern: page))
            return true
        }
    }

    /// The kept pages' addresses (tests).
    var keptPages: [UInt] { kept.withLockedValue { $0 } }
}

/// Zeroes `bytes` in a way the compiler keeps (the buffers a secret passed through).
public func zeroSecretMemory(_ bytes: UnsafeMutableRawBufferPointer) {
    guard let base = bytes.baseAddress, bytes.count > 0 else { return }
    explicit_bzero(base, bytes.count)
}

extension Array where Element == UInt8 {
    /// Zeroes the array's bytes in place (before it is let go: a buffer a secret passed through).
    public mutating func zeroSecretBytes() {
        withUnsafeMutableBytes { zeroSecretMemory($0) }
    }
}
