#define _DEFAULT_SOURCE
#include "cbaseline.h"
#include "fanout_visit.h"

#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

/* A registered callback, as any C observer list keeps one: a function and its userdata. */
typedef void (*bl_callback)(int64_t value, void *userdata);
typedef struct bl_entry {
    bl_callback callback;
    void *userdata;
} bl_entry;

struct bl_runtime {
    uv_loop_t loop;
    uv_async_t wake;
    uv_async_t stop;
    pthread_t thread;
    pthread_mutex_t lock;
    int64_t latest;      /* guarded by lock */
    int64_t delivered;   /* loop thread: last value handed out */
    int subscribers;
    bl_entry *entries;
    fanout_slot *slots;  /* the subscribers' userdata */
    fanout_shared shared;
};

uint64_t bl_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The same body as libsessionflow's C subscribers in sessionflow_fanout.c. */
static void on_value(int64_t value, void *userdata) {
    fanout_visit(userdata, value);
}

static void on_wake(uv_async_t *handle) {
    bl_runtime *rt = handle->data;
    pthread_mutex_lock(&rt->lock);
    int64_t value = rt->latest;
    pthread_mutex_unlock(&rt->lock);
    if (value == rt->delivered) return; /* conflated: nothing new */
    rt->delivered = value;
    for (int i = 0; i < rt->subscribers; i++) rt->entries[i].callback(value, rt->entries[i].userdata);
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
    rt->shared.subscribers = subscribers;
    rt->entries = malloc(sizeof(bl_entry) * (size_t)subscribers);
    rt->slots = malloc(sizeof(fanout_slot) * (size_t)subscribers);
    for (int i = 0; i < subscribers; i++) {
        rt->slots[i] = (fanout_slot){.shared = &rt->shared, .index = i};
        rt->entries[i] = (bl_entry){.callback = on_value, .userdata = &rt->slots[i]};
    }
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
    free(rt->entries);
    free(rt->slots);
    free(rt);
}

void bl_set(bl_runtime *rt, int64_t value) {
    pthread_mutex_lock(&rt->lock);
    rt->latest = value;
    pthread_mutex_unlock(&rt->lock);
    uv_async_send(&rt->wake);
}

int64_t bl_published(bl_runtime *rt) {
    return atomic_load_explicit(&rt->shared.published, memory_order_acquire);
}

double bl_last_fanout_ns_per_callback(bl_runtime *rt) {
    return atomic_load(&rt->shared.fanout_ns);
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

size_t bl_userdata_bytes_per_subscriber(void) {
    return sizeof(fanout_slot);
}
