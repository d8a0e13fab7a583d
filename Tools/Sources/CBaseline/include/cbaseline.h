/* The raw libuv floor the benchmarks compare against: a producer stores the latest value
 * under a mutex and wakes the loop with uv_async_send; the loop thread hands it to a C
 * array of callbacks (a function and its userdata, a slot of the subscriber's own). No flows,
 * no subscriptions, no safety — just the floor. */
#ifndef SESSIONFLOW_CBASELINE_H
#define SESSIONFLOW_CBASELINE_H
#include <stddef.h>
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
/* The bytes of each subscriber's own slot (its userdata), which bl_create allocates beside its
 * entries: the subscriber's state, not the observer list's. */
size_t bl_userdata_bytes_per_subscriber(void);
/* Nanoseconds between the first and the last callback of the last delivery, per callback. */
double bl_last_fanout_ns_per_callback(bl_runtime *runtime);
/* The fan-out of libsessionflow's C API: loads the library at `path` (dlopen), subscribes
 * `subscribers` C observers to the session state of a new runtime, then alternates sign-in
 * and logout `updates` times; per_update[i] receives the ns per callback of update i
 * (measured between subscriber 0 and the last, as bl_runtime does). Returns 0, or -1 with
 * a message in `error`. */
int bl_sessionflow_fanout(const char *path, int subscribers, int updates, double *per_update,
                          char *error, size_t error_length);
/* Gives the free heap back to the system (malloc_trim), before an RSS reading. */
void bl_trim_heap(void);
/* One malloc and one free that no compiler removes (checks an allocation counter is live). */
void bl_heap_probe(void);
/* The least a thread-safe subscribe+close can cost: one malloc of `size` bytes, one mutex
 * lock/unlock, one free — per second, over `pairs` rounds. */
double bl_alloc_lock_pairs_per_second(int pairs, size_t size);
/* Monotonic nanoseconds. */
uint64_t bl_now_ns(void);

/* `size` bytes (at most 4096) replaced through a spare file in `directory` as the store does
 * it: fsync of the directory, pwrite over the spare, ftruncate, fsync, renameat2
 * (RENAME_EXCHANGE) with the file (a rename where the filesystem cannot), fsync of the
 * directory. */
void bl_spare_write(const char *directory, int size);

/* What a C host pays outside the hot path (sessionflow_host.c; libsessionflow at `path`,
 * loaded with dlopen). Each returns 0, or -1 with a message in `error`.
 * The valid-token path: `threads` threads each make `calls` sf_session_fresh_token calls on a
 * signed-in runtime (1-hour token), each waiting for its callback; *ns_per_call is the wall
 * time per call of one thread. */
int bl_sf_fresh_token(const char *path, int threads, int calls, double *ns_per_call, char *error, size_t length);
/* Its floor: the same with a request posted to a libuv loop (mutex-protected queue +
 * uv_async_send) and answered there by waking the caller (a semaphore, as ours waits). */
double bl_async_roundtrip_ns(int threads, int calls);
/* sf_runtime_create (store in `store_directory`, start_manually) -> first on_state, with a
 * stored session when `sign_in_first` (written by a runtime before); the store's key in a key
 * file, or in the Secret Service when `secret_service` (the process must have a session bus
 * with one: the bench runs those in a process of its own under dbus-run-session). */
int bl_sf_startup(const char *path, const char *store_directory, int sign_in_first, int secret_service, double *ns,
                  char *error, size_t length);
/* Its floor: uv_loop_init + a thread running the loop + one uv_async_send answered. */
double bl_uv_startup_ns(void);
/* The idle host, in a process of its own (it exits): libcurl loaded and initialized; with
 * `path`, a runtime signed in (1-hour token, key file store in `store_directory`), without, a
 * bare libuv loop with one 1-hour timer on a thread. After 1 s of settling it sleeps
 * `seconds` and prints "IDLE <context switches> <cpu ms> <rss KiB> <libsessionflow.so RSS KiB> <anonymous RSS KiB>". */
int bl_idle_host(const char *path, const char *store_directory, double seconds);

/* A token endpoint on 127.0.0.1 that answers every POST at once with a new token pair
 * (token_server.c), and libcurl (dlopen) posting a form to it. */
typedef struct bl_token_server bl_token_server;
bl_token_server *bl_token_server_start(void);
int bl_token_server_port(const bl_token_server *server);
long bl_token_server_answered(bl_token_server *server);
void bl_token_server_stop(bl_token_server *server);
/* The median ns of `runs` POSTs of `form` to `url` with libcurl's easy interface, a new
 * connection each (as ours); -1 if libcurl cannot be loaded or a request failed. */
double bl_curl_post_ns(const char *url, const char *form, int runs);
#endif
