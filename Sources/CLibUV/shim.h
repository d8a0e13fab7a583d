#ifndef SESSIONFLOW_CLIBUV_SHIM_H
#define SESSIONFLOW_CLIBUV_SHIM_H
#include <uv.h>
#include <pthread.h>

/* glibc declares this only under _GNU_SOURCE, which a module map cannot set. */
extern int pthread_setname_np(pthread_t thread, const char *name);

/* A read prefetch hint (Swift has none): a flow's walk asks for the callback context of a
   subscriber a few records ahead while it calls the current one. */
static inline void sf_prefetch(const void *address) { __builtin_prefetch(address, 0, 3); }
#endif
