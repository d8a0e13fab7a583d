#define _GNU_SOURCE
#include "cbaseline.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The hand-written header of the C API, for its types only (the library is loaded with dlopen).
   Included by its path from here: SwiftPM takes no header search path outside the package. */
#include "../../../Bindings/include/sessionflow.h"

/* The fan-out of libsessionflow's C API, measured from C exactly as bl_runtime measures
 * the floor: subscriber 0 notes the time, the last one computes the time per callback. The
 * library is loaded with dlopen so that the benchmark measures the shared object a C host
 * links, not a copy compiled into the benchmark. */

typedef struct sf_api {
    void (*options_init)(sf_options *);
    int (*runtime_create)(const sf_options *, sf_runtime **);
    int (*runtime_destroy)(sf_runtime *);
    int (*subscribe_session_state)(sf_runtime *, const sf_observer *, sf_subscription *);
    int (*subscription_close)(sf_subscription);
    int (*sign_in)(sf_runtime *, const sf_tokens *);
    int (*logout)(sf_runtime *);
} sf_api;

/* What the callbacks read and write during a walk (`subscribers`, `first_ns`) is kept off the
 * cache line the measuring thread spins on (`deliveries`), as in the floor's runtime: on a
 * shared line each spin read takes the line back from the loop thread, and the last
 * subscriber's read before its clock paid a cross-core miss (~80-130 ns here) the walk does not
 * cost.
 *
 * And it lives on the heap, as the floor's runtime does, not on the measuring thread's stack:
 * `sf_session_sign_in` and `sf_session_logout` return while the loop walks (they wait for the
 * loop's job, which wakes them just before the delivery), and on the stack the callbacks paid
 * ~70 ns in about half the updates (2 subscribers, 400 updates: each ~30 or ~100 ns; from an
 * aligned heap block, ~30 ns) — most likely the lines beside it, written as the woken caller
 * unwinds (the adjacent-line prefetcher pairs lines). The floor's caller does not wait. */
typedef struct fanout_shared {
    _Alignas(64) int subscribers;
    uint64_t first_ns;
    _Alignas(64) _Atomic double fanout_ns;
    _Atomic int64_t deliveries; /* deliveries seen by the last subscriber */
} fanout_shared;

typedef struct fanout_slot {
    fanout_shared *shared;
    int index;
} fanout_slot;

static void on_state(sf_session_state state, void *userdata) {
    (void)state;
    fanout_slot *slot = userdata;
    fanout_shared *shared = slot->shared;
    if (slot->index == 0) shared->first_ns = bl_now_ns();
    if (slot->index == shared->subscribers - 1) {
        if (shared->subscribers > 1) {
            atomic_store(&shared->fanout_ns, (double)(bl_now_ns() - shared->first_ns) / (shared->subscribers - 1));
        }
        atomic_fetch_add_explicit(&shared->deliveries, 1, memory_order_release);
    }
}

static int fail(char *error, size_t length, const char *what, int code) {
    snprintf(error, length, "%s failed (%d)", what, code);
    return -1;
}

#define LOAD(field, name)                                                        \
    do {                                                                         \
        *(void **)(&api.field) = dlsym(library, name);                           \
        if (!api.field) {                                                        \
            snprintf(error, error_length, "%s: no symbol %s", path, name);       \
            return -1;                                                           \
        }                                                                        \
    } while (0)

static void wait_for(fanout_shared *shared, int64_t deliveries) {
    while (atomic_load_explicit(&shared->deliveries, memory_order_acquire) < deliveries) {
    }
}

int bl_sessionflow_fanout(const char *path, int subscribers, int updates, double *per_update,
                          char *error, size_t error_length) {
    void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!library) {
        snprintf(error, error_length, "%s", dlerror());
        return -1;
    }
    sf_api api;
    LOAD(options_init, "sf_options_init");
    LOAD(runtime_create, "sf_runtime_create");
    LOAD(runtime_destroy, "sf_runtime_destroy");
    LOAD(subscribe_session_state, "sf_subscribe_session_state");
    LOAD(subscription_close, "sf_subscription_close");
    LOAD(sign_in, "sf_session_sign_in");
    LOAD(logout, "sf_session_logout");

    int result = 0;
    sf_options options;
    api.options_init(&options);
    sf_runtime *runtime = NULL;
    int rc = api.runtime_create(&options, &runtime);
    if (rc != SF_OK) {
        return fail(error, error_length, "sf_runtime_create", rc);
    }
    fanout_shared *shared = aligned_alloc(_Alignof(fanout_shared), sizeof *shared);
    fanout_slot *slots = calloc((size_t)subscribers, sizeof *slots);
    sf_subscription *handles = calloc((size_t)subscribers, sizeof *handles);
    if (!shared || !slots || !handles) {
        api.runtime_destroy(runtime);
        free(shared);
        free(slots);
        free(handles);
        snprintf(error, error_length, "out of memory");
        return -1;
    }
    memset(shared, 0, sizeof *shared);
    shared->subscribers = subscribers;
    int opened = 0;
    for (; opened < subscribers; opened++) {
        slots[opened] = (fanout_slot){.shared = shared, .index = opened};
        sf_observer observer = {.size = sizeof(sf_observer), .on_state = on_state, .userdata = &slots[opened]};
        rc = api.subscribe_session_state(runtime, &observer, &handles[opened]);
        if (rc != SF_OK) {
            result = fail(error, error_length, "sf_subscribe_session_state", rc);
            goto done;
        }
    }
    /* Every subscriber first receives the current state. */
    wait_for(shared, 1);
    sf_tokens tokens = {.size = sizeof tokens, .access_token = "bench-access", .expires_in = 3600};
    for (int update = 0; update < updates; update++) {
        rc = (update % 2 == 0) ? api.sign_in(runtime, &tokens) : api.logout(runtime);
        if (rc != SF_OK) {
            result = fail(error, error_length, update % 2 == 0 ? "sf_session_sign_in" : "sf_session_logout", rc);
            goto done;
        }
        wait_for(shared, update + 2);
        per_update[update] = atomic_load(&shared->fanout_ns);
    }
done:
    for (int i = 0; i < opened; i++) api.subscription_close(handles[i]);
    api.runtime_destroy(runtime);
    free(handles);
    free(slots);
    free(shared);
    /* The library stays loaded: a Swift image cannot be unloaded safely. */
    return result;
}
