/* One file (over 400 lines): the host-cost harnesses share the dlopen table, the clock and the
 * floors they are compared with; each part is a section below. */
#define _GNU_SOURCE
#include "cbaseline.h"

#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "../../../Bindings/include/sessionflow.h"

/* What a C host pays outside the hot path (issue 32): the valid-token path from foreign
 * threads, start-up, and the idle host — each beside the libuv floor it is compared with.
 * libsessionflow is loaded with dlopen, as in sessionflow_fanout.c. */

typedef struct host_api {
    void (*options_init)(sf_options *);
    int (*runtime_create)(const sf_options *, sf_runtime **);
    int (*runtime_start)(sf_runtime *);
    int (*runtime_destroy)(sf_runtime *);
    int (*subscribe_session_state)(sf_runtime *, const sf_observer *, sf_subscription *);
    int (*subscription_close)(sf_subscription);
    int (*sign_in)(sf_runtime *, const sf_tokens *);
    int (*fresh_token)(sf_runtime *, sf_token_fn, void *);
} host_api;

static int load(const char *path, host_api *api, char *error, size_t length) {
    void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!library) {
        snprintf(error, length, "%s", dlerror());
        return -1;
    }
#define SYM(field, name)                                                  \
    *(void **)(&api->field) = dlsym(library, name);                       \
    if (!api->field) {                                                    \
        snprintf(error, length, "%s: no symbol %s", path, name);          \
        return -1;                                                        \
    }
    SYM(options_init, "sf_options_init");
    SYM(runtime_create, "sf_runtime_create");
    SYM(runtime_start, "sf_runtime_start");
    SYM(runtime_destroy, "sf_runtime_destroy");
    SYM(subscribe_session_state, "sf_subscribe_session_state");
    SYM(subscription_close, "sf_subscription_close");
    SYM(sign_in, "sf_session_sign_in");
    SYM(fresh_token, "sf_session_fresh_token");
#undef SYM
    return 0;
}

/* ---- The valid-token path ------------------------------------------------------------ */

/* A caller waits for its answer asleep (a semaphore), in ours and in the floor alike: with
 * more callers than cores a spinning caller would starve the loop thread it waits for. */
typedef struct waiter {
    sem_t done;
    int result;
} waiter;

static void token_arrived(int result, const char *token, void *userdata) {
    (void)token;
    waiter *w = userdata;
    w->result = result;
    sem_post(&w->done);
}

typedef struct caller {
    host_api *api;
    sf_runtime *runtime;
    int calls;
    int failed;
    pthread_t thread;
} caller;

static void *call_fresh_token(void *argument) {
    caller *c = argument;
    waiter w;
    sem_init(&w.done, 0, 0);
    for (int i = 0; i < c->calls; i++) {
        if (c->api->fresh_token(c->runtime, token_arrived, &w) != SF_OK) {
            c->failed = 1;
            break;
        }
        while (sem_wait(&w.done) != 0) {
        }
        if (w.result != SF_OK) c->failed = 1;
    }
    sem_destroy(&w.done);
    return NULL;
}

int bl_sf_fresh_token(const char *path, int threads, int calls, double *ns_per_call, char *error, size_t length) {
    host_api api;
    if (load(path, &api, error, length) != 0) return -1;
    sf_options options;
    api.options_init(&options);
    sf_runtime *runtime = NULL;
    int rc = api.runtime_create(&options, &runtime);
    if (rc != SF_OK) {
        snprintf(error, length, "sf_runtime_create failed (%d)", rc);
        return -1;
    }
    sf_tokens tokens = {.size = sizeof tokens, .access_token = "bench-access", .refresh_token = "bench-refresh",
                        .expires_in = 3600};
    rc = api.sign_in(runtime, &tokens);
    if (rc != SF_OK) {
        snprintf(error, length, "sf_session_sign_in failed (%d)", rc);
        api.runtime_destroy(runtime);
        return -1;
    }
    caller *callers = calloc((size_t)threads, sizeof *callers);
    uint64_t start = bl_now_ns();
    for (int t = 0; t < threads; t++) {
        callers[t] = (caller){.api = &api, .runtime = runtime, .calls = calls};
        pthread_create(&callers[t].thread, NULL, call_fresh_token, &callers[t]);
    }
    int failed = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(callers[t].thread, NULL);
        failed |= callers[t].failed;
    }
    uint64_t elapsed = bl_now_ns() - start;
    free(callers);
    api.runtime_destroy(runtime);
    if (failed) {
        snprintf(error, length, "a token request failed");
        return -1;
    }
    /* Wall time per call of one thread: the round trip a caller waits. */
    *ns_per_call = (double)elapsed / calls;
    return 0;
}

/* The floor: a request posted to a loop (a mutex-protected queue + uv_async_send), answered
 * on the loop by waking the caller — the least a "callback on the loop thread" costs. */
typedef struct floor_loop {
    uv_loop_t loop;
    uv_async_t wake;
    uv_async_t stop;
    pthread_mutex_t lock;
    waiter *queue[64];
    int queued;
    pthread_t thread;
} floor_loop;

static void floor_drain(uv_async_t *handle) {
    floor_loop *f = handle->data;
    waiter *batch[64];
    pthread_mutex_lock(&f->lock);
    int count = f->queued;
    memcpy(batch, f->queue, sizeof(waiter *) * (size_t)count);
    f->queued = 0;
    pthread_mutex_unlock(&f->lock);
    for (int i = 0; i < count; i++) sem_post(&batch[i]->done);
}

static void floor_stop(uv_async_t *handle) {
    floor_loop *f = handle->data;
    uv_close((uv_handle_t *)&f->wake, NULL);
    uv_close((uv_handle_t *)&f->stop, NULL);
}

static void *floor_run(void *argument) {
    floor_loop *f = argument;
    uv_run(&f->loop, UV_RUN_DEFAULT);
    return NULL;
}

static void floor_start(floor_loop *f) {
    memset(f, 0, sizeof *f);
    uv_loop_init(&f->loop);
    uv_async_init(&f->loop, &f->wake, floor_drain);
    uv_async_init(&f->loop, &f->stop, floor_stop);
    f->wake.data = f->stop.data = f;
    pthread_mutex_init(&f->lock, NULL);
    pthread_create(&f->thread, NULL, floor_run, f);
}

static void floor_finish(floor_loop *f) {
    uv_async_send(&f->stop);
    pthread_join(f->thread, NULL);
    uv_loop_close(&f->loop);
    pthread_mutex_destroy(&f->lock);
}

typedef struct floor_caller {
    floor_loop *f;
    int calls;
    pthread_t thread;
} floor_caller;

static void *floor_call(void *argument) {
    floor_caller *c = argument;
    waiter w;
    sem_init(&w.done, 0, 0);
    for (int i = 0; i < c->calls; i++) {
        pthread_mutex_lock(&c->f->lock);
        c->f->queue[c->f->queued++] = &w;
        pthread_mutex_unlock(&c->f->lock);
        uv_async_send(&c->f->wake);
        while (sem_wait(&w.done) != 0) {
        }
    }
    sem_destroy(&w.done);
    return NULL;
}

double bl_async_roundtrip_ns(int threads, int calls) {
    floor_loop f;
    floor_start(&f);
    floor_caller *callers = calloc((size_t)threads, sizeof *callers);
    uint64_t start = bl_now_ns();
    for (int t = 0; t < threads; t++) {
        callers[t] = (floor_caller){.f = &f, .calls = calls};
        pthread_create(&callers[t].thread, NULL, floor_call, &callers[t]);
    }
    for (int t = 0; t < threads; t++) pthread_join(callers[t].thread, NULL);
    uint64_t elapsed = bl_now_ns() - start;
    free(callers);
    floor_finish(&f);
    return (double)elapsed / calls;
}

/* ---- Start-up ------------------------------------------------------------------------ */

static void first_state(sf_session_state state, void *userdata) {
    (void)state;
    atomic_store_explicit((_Atomic uint64_t *)userdata, bl_now_ns(), memory_order_release);
}

int bl_sf_startup(const char *path, const char *store_directory, int sign_in_first, int secret_service, double *ns,
                  char *error, size_t length) {
    host_api api;
    if (load(path, &api, error, length) != 0) return -1;
    sf_options options;
    api.options_init(&options);
    options.store_directory = store_directory;
    options.store_key_source = secret_service ? SF_STORE_KEY_SECRET_SERVICE : SF_STORE_KEY_FILE;
    options.start_manually = 1;
    if (sign_in_first) {
        /* The stored session the measured start finds. */
        sf_runtime *writer = NULL;
        int rc = api.runtime_create(&options, &writer);
        if (rc == SF_OK) rc = api.runtime_start(writer);
        sf_tokens tokens = {.size = sizeof tokens, .access_token = "bench-access", .refresh_token = "bench-refresh",
                            .expires_in = 3600, .member_id = "bench"};
        if (rc == SF_OK) rc = api.sign_in(writer, &tokens);
        if (writer) api.runtime_destroy(writer);
        if (rc != SF_OK) {
            snprintf(error, length, "signing in before the start-up failed (%d)", rc);
            return -1;
        }
    }
    _Atomic uint64_t seen = 0;
    uint64_t start = bl_now_ns();
    sf_runtime *runtime = NULL;
    int rc = api.runtime_create(&options, &runtime);
    if (rc != SF_OK) {
        snprintf(error, length, "sf_runtime_create failed (%d)", rc);
        return -1;
    }
    sf_observer observer = {.size = sizeof observer, .on_state = first_state, .userdata = (void *)&seen};
    sf_subscription subscription;
    rc = api.subscribe_session_state(runtime, &observer, &subscription);
    if (rc == SF_OK) rc = api.runtime_start(runtime);
    if (rc != SF_OK) {
        snprintf(error, length, "subscribing or starting failed (%d)", rc);
        api.runtime_destroy(runtime);
        return -1;
    }
    uint64_t at;
    while ((at = atomic_load_explicit(&seen, memory_order_acquire)) == 0) {
    }
    *ns = (double)(at - start);
    api.subscription_close(subscription);
    api.runtime_destroy(runtime);
    return 0;
}

static void floor_answered(uv_async_t *handle) {
    atomic_store_explicit((_Atomic uint64_t *)handle->data, bl_now_ns(), memory_order_release);
    uv_close((uv_handle_t *)handle, NULL);
}

static void *floor_startup_run(void *argument) {
    uv_run(argument, UV_RUN_DEFAULT);
    return NULL;
}

double bl_uv_startup_ns(void) {
    _Atomic uint64_t seen = 0;
    uint64_t start = bl_now_ns();
    uv_loop_t loop;
    uv_loop_init(&loop);
    uv_async_t async;
    uv_async_init(&loop, &async, floor_answered);
    async.data = (void *)&seen;
    pthread_t thread;
    pthread_create(&thread, NULL, floor_startup_run, &loop);
    uv_async_send(&async);
    uint64_t at;
    while ((at = atomic_load_explicit(&seen, memory_order_acquire)) == 0) {
    }
    pthread_join(thread, NULL);
    uv_loop_close(&loop);
    return (double)(at - start);
}

/* ---- The idle host ------------------------------------------------------------------- */

/* Context switches of every thread of this process (voluntary + involuntary). */
static long long context_switches(void) {
    long long total = 0;
    DIR *tasks = opendir("/proc/self/task");
    if (!tasks) return -1;
    struct dirent *entry;
    while ((entry = readdir(tasks))) {
        if (entry->d_name[0] == '.') continue;
        char path[300];
        snprintf(path, sizeof path, "/proc/self/task/%s/status", entry->d_name);
        FILE *status = fopen(path, "r");
        if (!status) continue;
        char line[256];
        long long value;
        while (fgets(line, sizeof line, status)) {
            if (sscanf(line, "voluntary_ctxt_switches: %lld", &value) == 1 ||
                sscanf(line, "nonvoluntary_ctxt_switches: %lld", &value) == 1)
                total += value;
        }
        fclose(status);
    }
    closedir(tasks);
    return total;
}

/* A "<field>: <n> kB" line of /proc/self/status (VmRSS, RssAnon), KiB; -1 if absent. */
static long long status_kib(const char *field) {
    FILE *status = fopen("/proc/self/status", "r");
    if (!status) return -1;
    char line[256];
    long long value = -1;
    size_t length = strlen(field);
    while (fgets(line, sizeof line, status))
        if (strncmp(line, field, length) == 0 && line[length] == ':' && sscanf(line + length + 1, "%lld", &value) == 1)
            break;
    fclose(status);
    return value;
}

/* RSS of the mappings of files whose path contains `name` (/proc/self/smaps), KiB. */
static long long mapped_rss_kib(const char *name) {
    FILE *smaps = fopen("/proc/self/smaps", "r");
    if (!smaps) return -1;
    char line[512];
    long long total = 0, value;
    int inside = 0;
    while (fgets(line, sizeof line, smaps)) {
        /* A mapping's first line is "start-end perms offset dev inode [path]"; the others are
         * "Name:   value kB". */
        char first[64];
        if (sscanf(line, "%63s", first) == 1 && strchr(first, '-') && first[strlen(first) - 1] != ':') {
            inside = strstr(line, name) != NULL;
            continue;
        }
        if (inside && sscanf(line, "Rss: %lld", &value) == 1) total += value;
    }
    fclose(smaps);
    return total;
}

static double cpu_ms(void) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1e3 +
           (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e3;
}

static void never(uv_timer_t *timer) { (void)timer; }

static void *idle_floor_run(void *argument) {
    uv_run(argument, UV_RUN_DEFAULT);
    return NULL;
}

int bl_idle_host(const char *path, const char *store_directory, double seconds) {
    /* Both hosts load libcurl and initialize it: the floor is "a host that links libuv +
     * libcurl and runs an empty loop". */
    void *curl = dlopen("libcurl.so.4", RTLD_NOW | RTLD_GLOBAL);
    if (curl) {
        long (*global_init)(long) = (long (*)(long))dlsym(curl, "curl_global_init");
        if (global_init) global_init(3);
    }
    sf_runtime *runtime = NULL;
    host_api api;
    uv_loop_t loop;
    pthread_t thread;
    uv_timer_t timer;
    if (path) {
        char error[256];
        if (load(path, &api, error, sizeof error) != 0) {
            fprintf(stderr, "idle host: %s\n", error);
            return 1;
        }
        sf_options options;
        api.options_init(&options);
        options.store_directory = store_directory;
        options.store_key_source = SF_STORE_KEY_FILE;
        if (api.runtime_create(&options, &runtime) != SF_OK) return 1;
        sf_tokens tokens = {.size = sizeof tokens, .access_token = "bench-access", .refresh_token = "bench-refresh",
                            .expires_in = 3600, .member_id = "bench"};
        if (api.sign_in(runtime, &tokens) != SF_OK) return 1;
    } else {
        uv_loop_init(&loop);
        uv_timer_init(&loop, &timer);
        uv_timer_start(&timer, never, 3600 * 1000, 0);
        pthread_create(&thread, NULL, idle_floor_run, &loop);
    }
    /* Settle: the sign-in's store write, the watch set up. */
    struct timespec settle = {.tv_sec = 1, .tv_nsec = 0};
    nanosleep(&settle, NULL);
    long long switches = context_switches();
    double cpu = cpu_ms();
    struct timespec pause = {.tv_sec = (time_t)seconds, .tv_nsec = (long)((seconds - (time_t)seconds) * 1e9)};
    nanosleep(&pause, NULL);
    long long after = context_switches();
    double cpu_after = cpu_ms();
    /* The reading itself: this thread's two wake-ups (nanosleep returns) are the floor's too. */
    printf("IDLE %lld %.3f %lld %lld %lld\n", after - switches, cpu_after - cpu, status_kib("VmRSS"),
           path ? mapped_rss_kib("libsessionflow") : 0, status_kib("RssAnon"));
    fflush(stdout);
    _exit(0);
}
