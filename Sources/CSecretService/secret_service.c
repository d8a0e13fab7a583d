/* See include/secret_service.h. libsecret and glib are reached only through dlopen/dlsym:
 * their types are declared here as far as the calls need them (ABI-stable since libsecret
 * 0.18 / glib 2.0). The handle is never dlclose-d (glib cannot be unloaded). */
#define _GNU_SOURCE
#include "secret_service.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int gboolean;
typedef unsigned int guint;
typedef struct _GHashTable GHashTable;
typedef struct _GCancellable GCancellable;
typedef guint (*GHashFunc)(const void *key);
typedef gboolean (*GEqualFunc)(const void *a, const void *b);
typedef struct {
    unsigned int domain;
    int code;
    char *message;
} GError;

/* libsecret's SecretSchema, as in secret-schema.h. */
typedef struct {
    const char *name;
    int type; /* SECRET_SCHEMA_ATTRIBUTE_STRING = 0 */
} SecretSchemaAttribute;
typedef struct {
    const char *name;
    int flags; /* SECRET_SCHEMA_NONE = 0 */
    SecretSchemaAttribute attributes[32];
    int reserved;
    void *reserved1, *reserved2, *reserved3, *reserved4, *reserved5, *reserved6, *reserved7;
} SecretSchema;

static const SecretSchema schema = {
    "org.sessionflow.StoreKey",
    0,
    {{"directory", 0}, {"name", 0}, {NULL, 0}},
    0, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
};

static struct {
    int loaded; /* 1 loaded, -1 failed */
    char failure[256];
    gboolean (*storev)(const SecretSchema *, GHashTable *, const char *, const char *, const char *,
                       GCancellable *, GError **);
    char *(*lookupv)(const SecretSchema *, GHashTable *, GCancellable *, GError **);
    gboolean (*clearv)(const SecretSchema *, GHashTable *, GCancellable *, GError **);
    void (*password_free)(char *);
    GHashTable *(*hash_table_new)(GHashFunc, GEqualFunc);
    gboolean (*hash_table_insert)(GHashTable *, void *, void *);
    void (*hash_table_unref)(GHashTable *);
    GHashFunc str_hash;
    GEqualFunc str_equal;
    GCancellable *(*cancellable_new)(void);
    void (*cancellable_cancel)(GCancellable *);
    void (*object_unref)(void *);
    void (*error_free)(GError *);
} lib;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void load(void) {
    void *handle = dlopen("libsecret-1.so.0", RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        snprintf(lib.failure, sizeof lib.failure, "libsecret is not installed (libsecret-1.so.0: %s)", dlerror());
        lib.loaded = -1;
        return;
    }
    /* dlsym on the handle also searches its dependencies (glib, gobject, gio). */
#define SYM(field, symbol)                                                                          \
    do {                                                                                            \
        *(void **)(&lib.field) = dlsym(handle, symbol);                                             \
        if (lib.field == NULL) {                                                                    \
            snprintf(lib.failure, sizeof lib.failure, "libsecret-1.so.0 lacks %s", symbol);         \
            lib.loaded = -1;                                                                        \
            return;                                                                                 \
        }                                                                                           \
    } while (0)
    SYM(storev, "secret_password_storev_sync");
    SYM(lookupv, "secret_password_lookupv_sync");
    SYM(clearv, "secret_password_clearv_sync");
    SYM(password_free, "secret_password_free");
    SYM(hash_table_new, "g_hash_table_new");
    SYM(hash_table_insert, "g_hash_table_insert");
    SYM(hash_table_unref, "g_hash_table_unref");
    SYM(str_hash, "g_str_hash");
    SYM(str_equal, "g_str_equal");
    SYM(cancellable_new, "g_cancellable_new");
    SYM(cancellable_cancel, "g_cancellable_cancel");
    SYM(object_unref, "g_object_unref");
    SYM(error_free, "g_error_free");
#undef SYM
    lib.loaded = 1;
}

int sfss_session_bus_present(void) {
    const char *address = getenv("DBUS_SESSION_BUS_ADDRESS");
    if (address != NULL && address[0] != '\0') return 1;
    const char *runtime = getenv("XDG_RUNTIME_DIR");
    if (runtime == NULL || runtime[0] == '\0') return 0;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/bus", runtime) >= (int)sizeof path) return 0;
    struct stat info;
    return stat(path, &info) == 0 && S_ISSOCK(info.st_mode);
}

static void say(char *message, size_t size, const char *text) {
    if (message != NULL && size > 0) snprintf(message, size, "%s", text);
}

/* Loads libsecret if there is a bus to talk to; 0 when usable, else a message. */
static int ready(char *message, size_t size) {
    if (!sfss_session_bus_present()) {
        say(message, size, "no D-Bus session bus (DBUS_SESSION_BUS_ADDRESS is not set)");
        return -1;
    }
    pthread_once(&load_once, load);
    if (lib.loaded != 1) {
        say(message, size, lib.failure);
        return -1;
    }
    return 0;
}

/* A watchdog thread that cancels `cancellable` when the deadline passes first. */
typedef struct {
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    int done;
    int fired;
    struct timespec deadline;
    GCancellable *cancellable;
} watchdog;

static void *watch(void *argument) {
    watchdog *dog = argument;
    pthread_mutex_lock(&dog->mutex);
    while (!dog->done) {
        if (pthread_cond_timedwait(&dog->cond, &dog->mutex, &dog->deadline) == ETIMEDOUT) {
            if (!dog->done) {
                dog->fired = 1;
                lib.cancellable_cancel(dog->cancellable);
            }
            break;
        }
    }
    pthread_mutex_unlock(&dog->mutex);
    return NULL;
}

typedef struct {
    watchdog dog;
    pthread_t thread;
    int started;
} call_guard;

static void guard_start(call_guard *guard, int timeout_ms) {
    memset(guard, 0, sizeof *guard);
    pthread_condattr_t attributes;
    pthread_condattr_init(&attributes);
    pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC);
    pthread_cond_init(&guard->dog.cond, &attributes);
    pthread_condattr_destroy(&attributes);
    pthread_mutex_init(&guard->dog.mutex, NULL);
    clock_gettime(CLOCK_MONOTONIC, &guard->dog.deadline);
    if (timeout_ms < 1) timeout_ms = 1;
    guard->dog.deadline.tv_sec += timeout_ms / 1000;
    guard->dog.deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (guard->dog.deadline.tv_nsec >= 1000000000L) {
        guard->dog.deadline.tv_sec += 1;
        guard->dog.deadline.tv_nsec -= 1000000000L;
    }
    guard->dog.cancellable = lib.cancellable_new();
    guard->started = pthread_create(&guard->thread, NULL, watch, &guard->dog) == 0;
}

/* Stops the watchdog; 1 if it had fired (the call was cancelled for its deadline). */
static int guard_end(call_guard *guard) {
    if (guard->started) {
        pthread_mutex_lock(&guard->dog.mutex);
        guard->dog.done = 1;
        pthread_cond_signal(&guard->dog.cond);
        pthread_mutex_unlock(&guard->dog.mutex);
        pthread_join(guard->thread, NULL);
    }
    int fired = guard->dog.fired;
    lib.object_unref(guard->dog.cancellable);
    pthread_cond_destroy(&guard->dog.cond);
    pthread_mutex_destroy(&guard->dog.mutex);
    return fired;
}

static GHashTable *attributes(const char *directory, const char *name) {
    GHashTable *table = lib.hash_table_new(lib.str_hash, lib.str_equal);
    lib.hash_table_insert(table, (void *)"directory", (void *)directory);
    lib.hash_table_insert(table, (void *)"name", (void *)name);
    return table;
}

/* The failure's text: glib's message (it names no secret), or the deadline. */
static int failed(GError *error, int fired, int timeout_ms, char *message, size_t size) {
    if (fired) {
        char text[160];
        snprintf(text, sizeof text, "the Secret Service did not answer within %d ms (not running, or locked and prompting)",
                 timeout_ms);
        say(message, size, text);
    } else if (error != NULL && error->message != NULL) {
        char text[512];
        snprintf(text, sizeof text, "the Secret Service failed: %s", error->message);
        say(message, size, text);
    } else {
        say(message, size, "the Secret Service failed");
    }
    if (error != NULL) lib.error_free(error);
    return SFSS_UNAVAILABLE;
}

int sfss_lookup(const char *directory, const char *name, int timeout_ms, char **secret, char *message,
                size_t message_size) {
    if (secret == NULL || directory == NULL || name == NULL) return SFSS_UNAVAILABLE;
    *secret = NULL;
    if (ready(message, message_size) != 0) return SFSS_UNAVAILABLE;
    GHashTable *table = attributes(directory, name);
    call_guard guard;
    guard_start(&guard, timeout_ms);
    GError *error = NULL;
    char *found = lib.lookupv(&schema, table, guard.dog.cancellable, &error);
    int fired = guard_end(&guard);
    lib.hash_table_unref(table);
    if (error != NULL || (fired && found == NULL)) {
        if (found != NULL) lib.password_free(found);
        return failed(error, fired, timeout_ms, message, message_size);
    }
    if (found == NULL) return SFSS_NOT_FOUND;
    /* A copy in our own heap (glib's allocator may differ), wiped and freed by sfss_free_secret. */
    *secret = strdup(found);
    lib.password_free(found);
    if (*secret == NULL) {
        say(message, message_size, "out of memory");
        return SFSS_UNAVAILABLE;
    }
    return SFSS_OK;
}

int sfss_store(const char *directory, const char *name, const char *label, const char *secret, int timeout_ms,
               char *message, size_t message_size) {
    if (directory == NULL || name == NULL || label == NULL || secret == NULL) return SFSS_UNAVAILABLE;
    if (ready(message, message_size) != 0) return SFSS_UNAVAILABLE;
    GHashTable *table = attributes(directory, name);
    call_guard guard;
    guard_start(&guard, timeout_ms);
    GError *error = NULL;
    gboolean stored = lib.storev(&schema, table, NULL, label, secret, guard.dog.cancellable, &error);
    int fired = guard_end(&guard);
    lib.hash_table_unref(table);
    if (!stored || error != NULL) return failed(error, fired, timeout_ms, message, message_size);
    return SFSS_OK;
}

int sfss_clear(const char *directory, const char *name, int timeout_ms, char *message, size_t message_size) {
    if (directory == NULL || name == NULL) return SFSS_UNAVAILABLE;
    if (ready(message, message_size) != 0) return SFSS_UNAVAILABLE;
    GHashTable *table = attributes(directory, name);
    call_guard guard;
    guard_start(&guard, timeout_ms);
    GError *error = NULL;
    (void)lib.clearv(&schema, table, guard.dog.cancellable, &error);
    int fired = guard_end(&guard);
    lib.hash_table_unref(table);
    if (error != NULL || fired) return failed(error, fired, timeout_ms, message, message_size);
    return SFSS_OK;
}

void sfss_free_secret(char *secret) {
    if (secret == NULL) return;
    explicit_bzero(secret, strlen(secret));
    free(secret);
}
