#ifndef SESSIONFLOW_CLIBUV_SHIM_H
#define SESSIONFLOW_CLIBUV_SHIM_H
#include <uv.h>
#include <pthread.h>

/* glibc declares this only under _GNU_SOURCE, which a module map cannot set. */
extern int pthread_setname_np(pthread_t thread, const char *name);
#endif
