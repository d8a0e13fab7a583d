#define _GNU_SOURCE
#include "cbaseline.h"
#include "fanout_visit.h"

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

/* The callbacks' shared state and slots are fanout_visit.h's, as the floor's are. The shared
 * part lives on the heap, as the floor's runtime does, not on the measuring thread's stack:
 * `sf_session_sign_in` and `sf_session_logout` return while the loop walks (they wait for the
 * loop's job, which wakes them just before the delivery), and on the stack the callbacks paid
 * ~70 ns in about half the updates (2 subscribers, 400 updates: each ~30 or ~100 ns; from an
 * aligned heap block, ~30 ns) — most likely the lines beside it, written as the woken caller
 * unwinds (the adjacent-line prefetcher pairs lines). The floor's caller does not wait. */

static void on_state(sf_session_state state, void *userdata) {
    fanout_visit(userdata, (int64_t)state);
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
