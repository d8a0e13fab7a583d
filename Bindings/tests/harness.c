#include "harness.h"

#include <stdlib.h>

int sf_test_failures = 0;

void sf_test_sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Every callback of one recorder must come from one thread, and not the test's main one. */
static pthread_t main_thread;

void recorder_note_main_thread(void) { main_thread = pthread_self(); }

static void note_thread(recorder *r) {
    if (pthread_equal(pthread_self(), main_thread)) atomic_fetch_add(&r->wrong_thread, 1);
    if (!atomic_load(&r->first_thread_known)) {
        r->first_thread = pthread_self();
        atomic_store(&r->first_thread_known, 1);
    } else if (!pthread_equal(r->first_thread, pthread_self())) {
        atomic_fetch_add(&r->wrong_thread, 1);
    }
}

static void on_state(sf_session_state state, void *userdata) {
    recorder *r = userdata;
    note_thread(r);
    if (atomic_load(&r->closed)) atomic_fetch_add(&r->callbacks_after_close, 1);
    int index = atomic_fetch_add(&r->state_count, 1);
    if (index < 64) atomic_store(&r->states[index], (int)state);
    atomic_store(&r->last_state, (int)state);
}

static void on_error(int code, const char *message, void *userdata) {
    (void)code;
    (void)message;
    recorder *r = userdata;
    note_thread(r);
    if (atomic_load(&r->closed)) atomic_fetch_add(&r->callbacks_after_close, 1);
    atomic_fetch_add(&r->errors, 1);
}

static void on_complete(void *userdata) {
    recorder *r = userdata;
    note_thread(r);
    if (atomic_load(&r->closed)) atomic_fetch_add(&r->callbacks_after_close, 1);
    atomic_fetch_add(&r->completes, 1);
}

static void on_release(void *userdata) {
    recorder *r = userdata;
    note_thread(r);
    atomic_fetch_add(&r->releases, 1);
}

void recorder_init(recorder *r) {
    memset(r, 0, sizeof *r);
    atomic_store(&r->last_state, -1);
}

sf_observer recorder_observer(recorder *r) {
    sf_observer observer;
    memset(&observer, 0, sizeof observer);
    observer.size = sizeof observer;
    observer.on_state = on_state;
    observer.on_error = on_error;
    observer.on_complete = on_complete;
    observer.release = on_release;
    observer.userdata = r;
    return observer;
}

sf_tokens test_tokens(const char *access, const char *refresh, int64_t expires_in, const char *member) {
    sf_tokens tokens;
    memset(&tokens, 0, sizeof tokens);
    tokens.size = sizeof tokens;
    tokens.access_token = access;
    tokens.refresh_token = refresh;
    tokens.expires_in = expires_in;
    tokens.member_id = member;
    return tokens;
}
