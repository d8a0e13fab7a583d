import LoopFlow

#if canImport(Glibc)
import Glibc
#endif

/// swift-crypto's AES-GCM keeps BoringSSL's `EVP_AEAD_CTX` inline in an object it frees
/// after every seal and open, and `EVP_AEAD_CTX_cleanup` does not cleanse it: the AES-256
/// key schedule left in that freed block begins with the raw key (measured: one copy of
/// each store key found in the worker thread's heap after logout and destroy,
/// `Bindings/tests/test_memory.c`). Until that is fixed upstream, every seal and open runs
/// through `withCipherStateScrubbed(.cipher)`, which afterwards takes back the blocks glibc's
/// per-thread cache hands out first in the size classes around that object's (the most
/// recently freed of each, LIFO), zeroes them whole and frees them again.
///
/// In an optimized build the compiler may keep those objects on the stack instead (they do
/// not escape): the 32 KiB of stack below this frame, where the call's frames were, are
/// zeroed too (measured: one copy of a store key on the I/O worker's stack, release build).
func withCipherStateScrubbed<T, E: Error>(_ state: CipherState, _ body: () throws(E) -> T) throws(E) -> T {
    defer {
        scrubRecentlyFreedBlocks(state.requestSizes)
        scrubStack(bytes: 32 * 1024)
    }
    return try body()
}

/// What a scrub takes back: the size classes of one kind of object swift-crypto frees
/// uncleansed.
///
/// The same holds for a key's id (`StoreKeyID.of`, `.digest`): SHA-256 over a label and the
/// key keeps both in its context's partial-block buffer, and swift-crypto's `finalize()`
/// frees copies of that context uncleansed.
///
/// Measured (perf probes on malloc between scrubs, swift-crypto 4.5): the cipher object is a
/// 592-byte request (16 bytes of Swift header and the `EVP_AEAD_CTX`), the digest object a
/// 128-byte one (16 and a 112-byte `SHA256_CTX`). Each kind takes the classes from 48 bytes
/// below to 64 above its own, room for another layout of a later version; a layout outside
/// it fails `test_memory.c` (a store key found in the heap), which is how a too-narrow
/// range shows. (A heuristic, as it was with 28 classes: a freed block glibc has merged into a
/// neighbour is out of any scrub's reach.) One range per kind, not both for every call: a store write makes three of
/// these calls, and the scrub of 28 classes was a fifth of its time with fsync set aside
/// (docs/benchmarks.md).
enum CipherState {
    case cipher
    case digest

    fileprivate var requestSizes: StrideThrough<Int> {
        switch self {
        case .cipher: stride(from: 544, through: 656, by: 16)
        case .digest: stride(from: 80, through: 192, by: 16)
        }
    }
}

/// Sixteen blocks of each class are taken before any is given back (the per-thread cache
/// holds seven of a class; blocks freed after the cipher's, of the same class, would
/// otherwise come out first).
private func scrubRecentlyFreedBlocks(_ sizes: StrideThrough<Int>) {
    let perClass = 16
    var classes = 0
    for _ in sizes { classes += 1 }
    withUnsafeTemporaryAllocation(of: UnsafeMutableRawPointer?.self, capacity: classes * perClass) { blocks in
        var taken = 0
        for size in sizes {
            for _ in 0..<perClass where taken < blocks.count {
                guard let block = malloc(size) else { continue }
                explicit_bzero(block, size)
                blocks[taken] = block
                taken += 1
            }
        }
        for index in 0..<taken { free(blocks[index]) }
    }
}
