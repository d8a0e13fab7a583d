import CLibUV

/// Zeroes `bytes` of the calling thread's stack below the caller's frame (at most 256 KiB):
/// what the calls it just made left there. Threads that handle secrets (the store's worker,
/// after each job; the store's cipher calls) scrub so that a key or a token is not left on a
/// stack that glibc keeps for the next thread.
package func scrubStack(bytes: Int) {
    sf_scrub_stack(bytes)
}
