/* The raw libuv floor the benchmarks compare against: a producer stores the latest value
 * under a mutex and wakes the loop with uv_async_send; the loop thread hands it to a C
 * array of function pointers. No flows, no subscriptions, no safety — just the floor. */
#ifndef SESSIONFLOW_CBASELINE_H
#define SESSIONFLOW_CBASELINE_H
#include <stdint.h>

typedef struct bl_runtime bl_runtime;

/* Starts a loop thread with `subscribers` callbacks. */
bl_runtime *bl_create(int subscribers);
/* Stops the loop thread and frees everything. */
void bl_destroy(bl_runtime *runtime);
/* Producer side (any thread): store the latest value, wake the loop. */
void bl_set(bl_runtime *runtime, int64_t value);
/* The value the last subscriber saw (acquire load). */
int64_t bl_published(bl_runtime *runtime);
/* Nanoseconds between the first and the last callback of the last delivery, per callback. */
double bl_last_fanout_ns_per_callback(bl_runtime *runtime);
/* Monotonic nanoseconds. */
uint64_t bl_now_ns(void);
#endif
