#ifndef SESSIONFLOW_CLIBUV_SHIM_H
#define SESSIONFLOW_CLIBUV_SHIM_H
#include <uv.h>
#include <pthread.h>
#include <sys/prctl.h>

/* glibc declares this only under _GNU_SOURCE, which a module map cannot set. */
extern int pthread_setname_np(pthread_t thread, const char *name);

/* A read prefetch hint (Swift has none): a flow's walk asks for the callback context of a
   subscriber a few records ahead while it calls the current one. */
static inline void sf_prefetch(const void *address) { __builtin_prefetch(address, 0, 3); }

/* The calling thread's identity for "am I on the loop thread?": its thread pointer, read
   inline (one move from the thread register) instead of a call to pthread_self. Unique among
   the live threads, as pthread_self is (on x86-64 glibc the two are the same value); compared
   only with values from this same function. */
static inline uintptr_t sf_thread_identity(void) { return (uintptr_t)__builtin_thread_pointer(); }

/* prctl(2) is variadic, which Swift cannot call: the two calls a process that holds tokens
   makes. PR_SET_DUMPABLE 0: no core dump, and no other process of the user (a debugger,
   a crash reporter) may read its memory. */
static inline int sf_set_not_dumpable(void) { return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); }
static inline int sf_is_dumpable(void) { return prctl(PR_GET_DUMPABLE, 0, 0, 0, 0); }

/* Zeroes `bytes` (at most 256 KiB) of this thread's stack below the caller's frame: what
   the calls the caller just made (a cipher, a digest, a store job) left there. Never
   inlined, so the area is the stack those calls used. */
static inline __attribute__((noinline)) void sf_scrub_stack(size_t bytes) {
    if (bytes > 262144) bytes = 262144;
    unsigned char area[bytes];
    __builtin_memset(area, 0, bytes);
    __asm__ volatile("" : : "r"(area) : "memory");
}
#endif
