/* The host runs its own libuv loop; the runtime borrows it. */
#define _DEFAULT_SOURCE
#include <uv.h>

#include "harness.h"

#include <stdlib.h>

typedef struct host {
    uv_loop_t loop;
    uv_timer_t own_timer;   /* the host's own handle, beside the session */
    uv_timer_t script;      /* drives the test from the loop thread */
    sf_runtime *runtime;
    recorder r;
    sf_subscription subscription;
    atomic_int own_ticks;
    atomic_int step;
    atomic_int ticks_after_destroy;
    int ticks_at_destroy;
    int destroy_result;
    int sign_in_result;
    int run_returned;
    int close_result;
    atomic_int created;
    atomic_int off_thread_checked;
    pthread_t thread;
} host;

static void on_own_timer(uv_timer_t *timer) {
    host *h = timer->data;
    atomic_fetch_add(&h->own_ticks, 1);
    if (h->ticks_at_destroy > 0 && atomic_load(&h->own_ticks) > h->ticks_at_destroy + 3) {
        atomic_store(&h->ticks_after_destroy, atomic_load(&h->own_ticks) - h->ticks_at_destroy);
        uv_close((uv_handle_t *)&h->own_timer, NULL); /* the host closes what it owns */
    }
}

static void on_script(uv_timer_t *timer) {
    host *h = timer->data;
    switch (atomic_load(&h->step)) {
    case 0: { /* on the loop thread: sign in */
        sf_tokens tokens = test_tokens("access-1", "refresh-1", 3600, "m-1");
        h->sign_in_result = sf_session_sign_in(h->runtime, &tokens);
        atomic_store(&h->step, 1);
        break;
    }
    case 1: /* wait for the state callback, and for the off-thread checks of the main thread */
        if (atomic_load(&h->r.last_state) == SF_LOGGED_IN && atomic_load(&h->off_thread_checked)) {
            atomic_store(&h->step, 2);
        }
        break;
    case 2: /* destroy on the loop thread; the host keeps running its own timer */
        h->ticks_at_destroy = atomic_load(&h->own_ticks) > 0 ? atomic_load(&h->own_ticks) : 1;
        h->destroy_result = sf_runtime_destroy(h->runtime);
        uv_close((uv_handle_t *)&h->script, NULL);
        atomic_store(&h->step, 3);
        break;
    }
}

static void *host_thread(void *arg) {
    host *h = arg;
    uv_loop_init(&h->loop);
    uv_timer_init(&h->loop, &h->own_timer);
    h->own_timer.data = h;
    uv_timer_start(&h->own_timer, on_own_timer, 1, 1);
    uv_timer_init(&h->loop, &h->script);
    h->script.data = h;
    uv_timer_start(&h->script, on_script, 5, 5);
    CHECK_CODE(sf_runtime_create_on_loop(&h->loop, NULL, &h->runtime), SF_OK);
    recorder_init(&h->r);
    sf_observer observer = recorder_observer(&h->r);
    CHECK_CODE(sf_subscribe_session_state(h->runtime, &observer, &h->subscription), SF_OK);
    atomic_store(&h->created, 1);
    uv_run(&h->loop, UV_RUN_DEFAULT);
    h->run_returned = 1;
    h->close_result = uv_loop_close(&h->loop);
    return NULL;
}

void test_borrowed_loop_runs_beside_the_hosts_own_timer(void) {
    host *h = calloc(1, sizeof *h);
    atomic_store(&h->off_thread_checked, 1);
    pthread_create(&h->thread, NULL, host_thread, h);
    pthread_join(h->thread, NULL);
    CHECK_CODE(h->sign_in_result, SF_OK);
    CHECK_CODE(h->destroy_result, SF_OK);
    CHECK(h->run_returned);
    CHECK_EQ_INT(h->close_result, 0);             /* every handle of the library was closed */
    CHECK(atomic_load(&h->ticks_after_destroy) > 0); /* the host's timer was untouched */
    CHECK_EQ_INT(atomic_load(&h->r.completes), 1);   /* the open subscription was completed */
    CHECK_EQ_INT(atomic_load(&h->r.releases), 1);
    CHECK_EQ_INT(atomic_load(&h->r.wrong_thread), 0);
    free(h);
}

void test_borrowed_loop_calls_off_its_thread_are_ethread(void) {
    host *h = calloc(1, sizeof *h);
    pthread_create(&h->thread, NULL, host_thread, h);
    WAIT_FOR(atomic_load(&h->created));
    /* From this (foreign) thread: calls that wait for an answer are refused... */
    sf_tokens tokens = test_tokens("x", "y", 60, NULL);
    CHECK_CODE(sf_session_sign_in(h->runtime, &tokens), SF_ETHREAD);
    CHECK_CODE(sf_session_logout(h->runtime), SF_ETHREAD);
    CHECK_CODE(sf_runtime_destroy(h->runtime), SF_ETHREAD);
    /* ...calls that only read or post are fine */
    sf_session_state state;
    CHECK_CODE(sf_session_state_get(h->runtime, &state), SF_OK);
    CHECK_CODE(sf_session_resume(h->runtime), SF_OK);
    atomic_store(&h->off_thread_checked, 1);
    pthread_join(h->thread, NULL);
    CHECK_CODE(h->destroy_result, SF_OK);
    CHECK_EQ_INT(h->close_result, 0);
    free(h);
}
