import LoopFlow

#if canImport(Glibc)
import Glibc
#endif

/// swift-crypto's AES-GCM keeps BoringSSL's `EVP_AEAD_CTX` inline in an object it frees
/// after every seal and open, and `EVP_AEAD_CTX_cleanup` does not cleanse it: the AES-256
/// key schedule left in that freed block begins with the raw key (measured: one copy of
/// each store key found in the worker thread's heap after logout and destroy,
/// `Bindings/tests/test_memory.c`). Until that is fixed upstream, every seal and open runs
/// through `withCipherStateScrubbed`, which afterwards takes back the blocks glibc's
/// per-thread cache hands out first in the size classes around that object's (the most
/// recently freed of each, LIFO), zeroes them whole and frees them again.
///
/// In an optimized build the compiler may keep those objects on the stack instead (they do
/// not escape): the 32 KiB of stack below this frame, where the call's frames were, are
/// zeroed too (measured: one copy of a store key on the I/O worker's stack, release build).
func withCipherStateScrubbed<T, E: Error>(_ body: () throws(E) -> T) throws(E) -> T {
    defer {
        scrubRecentlyFreedBlocks()
        scrubStack(bytes: 32 * 1024)
    }
    return try body()
}

/// The same holds for a key's id (`StoreKeyID.of`): SHA-256 over a label and the key keeps
/// both in its context's partial-block buffer, and swift-crypto's `finalize()` frees copies
/// of that context uncleansed.
///
/// The cipher object is 16 bytes of Swift header and a ~600-byte `EVP_AEAD_CTX`, the digest
/// object 16 and a 112-byte `SHA256_CTX`: the size classes from 96 to 256 and from 512 to
/// 768 bytes cover both with room for other layouts. Sixteen blocks of each are taken before
/// any is given back (the per-thread cache holds seven of a class; blocks freed after the
/// cipher's, of the same class, would otherwise come out first).
private func scrubRecentlyFreedBlocks() {
    let perClass = 16
    var blocks: [UnsafeMutableRawPointer] = []
    blocks.reserveCapacity(28 * perClass)
    for size in Array(stride(from: 96, through: 256, by: 16)) + Array(stride(from: 512, through: 768, by: 16)) {
        for _ in 0..<perClass {
            guard let block = malloc(size) else { continue }
            explicit_bzero(block, size)
            blocks.append(block)
        }
    }
    for block in blocks { free(block) }
}
