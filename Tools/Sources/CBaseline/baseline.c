#define _DEFAULT_SOURCE
#include "cbaseline.h"

#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

typedef void (*bl_callback)(bl_runtime *runtime, int64_t value, int index);

struct bl_runtime {
    uv_loop_t loop;
    uv_async_t wake;
    uv_async_t stop;
    pthread_t thread;
    pthread_mutex_t lock;
    int64_t latest;      /* guarded by lock */
    int64_t delivered;   /* loop thread: last value handed out */
    int subscribers;
    bl_callback *callbacks;
    uint64_t first_ns;   /* loop thread */
    /* What the measuring thread spins on, on a line of its own (see sessionflow_fanout.c). */
    _Alignas(64) _Atomic double fanout_ns;
    _Atomic int64_t published;
};

uint64_t bl_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void on_value(bl_runtime *rt, int64_t value, int index) {
    if (index == 0) rt->first_ns = bl_now_ns();
    if (index == rt->subscribers - 1) {
        if (rt->subscribers > 1) {
            atomic_store(&rt->fanout_ns, (double)(bl_now_ns() - rt->first_ns) / (rt->subscribers - 1));
        }
        atomic_store_explicit(&rt->published, value, memory_order_release);
    }
}

static void on_wake(uv_async_t *handle) {
    bl_runtime *rt = handle->data;
    pthread_mutex_lock(&rt->lock);
    int64_t value = rt->latest;
    pthread_mutex_unlock(&rt->lock);
    if (value == rt->delivered) return; /* conflated: nothing new */
    rt->delivered = value;
    for (int i = 0; i < rt->subscribers; i++) rt->callbacks[i](rt, value, i);
}

static void on_stop(uv_async_t *handle) {
    bl_runtime *rt = handle->data;
    uv_close((uv_handle_t *)&rt->wake, NULL);
    uv_close((uv_handle_t *)&rt->stop, NULL);
}

static void *run(void *arg) {
    bl_runtime *rt = arg;
    uv_run(&rt->loop, UV_RUN_DEFAULT);
    return NULL;
}

bl_runtime *bl_create(int subscribers) {
    /* Aligned as its type is (a line of its own for what the measuring thread spins on). */
    bl_runtime *rt = aligned_alloc(_Alignof(bl_runtime), sizeof *rt);
    memset(rt, 0, sizeof *rt);
    rt->subscribers = subscribers;
    rt->callbacks = malloc(sizeof(bl_callback) * (size_t)subscribers);
    for (int i = 0; i < subscribers; i++) rt->callbacks[i] = on_value;
    rt->delivered = -1;
    pthread_mutex_init(&rt->lock, NULL);
    uv_loop_init(&rt->loop);
    uv_async_init(&rt->loop, &rt->wake, on_wake);
    uv_async_init(&rt->loop, &rt->stop, on_stop);
    rt->wake.data = rt;
    rt->stop.data = rt;
    pthread_create(&rt->thread, NULL, run, rt);
    return rt;
}

void bl_destroy(bl_runtime *rt) {
    uv_async_send(&rt->stop);
    pthread_join(rt->thread, NULL);
    uv_loop_close(&rt->loop);
    pthread_mutex_destroy(&rt->lock);
    free(rt->callbacks);
    free(rt);
}

void bl_set(bl_runtime *rt, int64_t value) {
    pthread_mutex_lock(&rt->lock);
    rt->latest = value;
    pthread_mutex_unlock(&rt->lock);
    uv_async_send(&rt->wake);
}

int64_t bl_published(bl_runtime *rt) {
    return atomic_load_explicit(&rt->published, memory_order_acquire);
}

double bl_last_fanout_ns_per_callback(bl_runtime *rt) {
    return atomic_load(&rt->fanout_ns);
}

void bl_trim_heap(void) {
    malloc_trim(0);
}

void bl_heap_probe(void) {
    void *volatile block = malloc(32);
    free(block);
}

double bl_alloc_lock_pairs_per_second(int pairs, size_t size) {
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    uint64_t start = bl_now_ns();
    for (int i = 0; i < pairs; i++) {
        void *volatile block = malloc(size);
        pthread_mutex_lock(&lock);
        ((char *)block)[0] = (char)i;
        pthread_mutex_unlock(&lock);
        free(block);
    }
    return pairs / ((double)(bl_now_ns() - start) / 1e9);
}
