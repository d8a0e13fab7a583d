/* sf_options.refresh_release: the host's refresher userdata is released exactly once, on
 * the loop thread, after the last call of the refresher — and nothing calls it after. The
 * userdata here is malloc'd and freed in refresh_release, so under ASan a late call of the
 * refresher (which reads it) is a use after free; the counters catch it in a plain build. */
#define _DEFAULT_SOURCE
#include <uv.h>

#include "harness.h"

#include <stddef.h>
#include <stdlib.h>

/* What the test keeps (outlives the runtime). */
typedef struct tally {
    atomic_int refresh_calls;
    atomic_int refresh_after_release;   /* the refresher was called after its release */
    atomic_int refresh_off_loop_thread;
    atomic_int releases;
    atomic_int release_off_loop_thread;
    atomic_int refresh_calls_at_release;
    atomic_int release_during_refresh;  /* released while a refresher call was running */
    atomic_int in_refresh;
    atomic_int token_answers;
    _Atomic(sf_refresh_request *) open_request; /* the latest request, never answered */
    pthread_t loop_thread;
    atomic_int loop_thread_known;
} tally;

/* The host's userdata: heap memory that refresh_release frees. */
typedef struct refresher_box {
    tally *t;
    int answered_first; /* the first request is failed (transient) at once; later ones hang */
} refresher_box;

static void note_loop_thread(tally *t, atomic_int *off_thread) {
    if (!atomic_load(&t->loop_thread_known)) return;
    if (!pthread_equal(pthread_self(), t->loop_thread)) atomic_fetch_add(off_thread, 1);
}

/* The tally of the running test (read before the box is touched, so a late call is counted
 * even where it would read freed memory). */
static tally *current;

static void box_refresh(sf_refresh_request *request, const char *refresh_token, void *userdata) {
    (void)refresh_token;
    if (atomic_load(&current->releases) > 0) atomic_fetch_add(&current->refresh_after_release, 1);
    refresher_box *box = userdata; /* freed memory if called after release: ASan stops here */
    tally *t = box->t;
    atomic_store(&t->in_refresh, 1);
    if (!atomic_load(&t->loop_thread_known)) {
        t->loop_thread = pthread_self();
        atomic_store(&t->loop_thread_known, 1);
    }
    note_loop_thread(t, &t->refresh_off_loop_thread);
    atomic_fetch_add(&t->refresh_calls, 1);
    if (!box->answered_first) {
        box->answered_first = 1;
        CHECK_CODE(sf_refresh_request_fail(request, SF_ENETWORK, 1), SF_OK); /* retried soon */
    } else {
        atomic_store(&t->open_request, request); /* hangs: times out, is retried */
    }
    atomic_store(&t->in_refresh, 0);
}

static void box_release(void *userdata) {
    refresher_box *box = userdata;
    tally *t = box->t;
    note_loop_thread(t, &t->release_off_loop_thread);
    if (atomic_load(&t->in_refresh)) atomic_fetch_add(&t->release_during_refresh, 1);
    atomic_store(&t->refresh_calls_at_release, atomic_load(&t->refresh_calls));
    atomic_fetch_add(&t->releases, 1);
    memset(box, 0xdd, sizeof *box);
    free(box);
}

static void on_token(int result, const char *access_token, void *userdata) {
    (void)result;
    (void)access_token;
    tally *t = userdata;
    atomic_fetch_add(&t->token_answers, 1);
}

/* Options whose refresher hangs after one transient failure: refreshes keep coming (a
 * 30 ms timeout, then a retry 10-20 ms later), so timers are pending at any moment. */
static sf_options hanging_refresher_options(tally *t) {
    memset(t, 0, sizeof *t);
    current = t;
    refresher_box *box = calloc(1, sizeof *box);
    box->t = t;
    sf_options options;
    sf_options_init(&options);
    options.refresh = box_refresh;
    options.refresh_userdata = box;
    options.refresh_release = box_release;
    options.refresh_timeout_ms = 30;
    options.min_backoff_ms = 10;
    options.max_backoff_ms = 20;
    options.min_refresh_interval_ms = 0;
    return options;
}

/* The checks every destroyed runtime must pass, once the dust has settled. */
static void check_released_after_the_last_refresh(tally *t, int refresh_calls_at_destroy) {
    CHECK_EQ_INT(atomic_load(&t->releases), 1);
    CHECK_EQ_INT(atomic_load(&t->release_off_loop_thread), 0);
    CHECK_EQ_INT(atomic_load(&t->refresh_off_loop_thread), 0);
    CHECK_EQ_INT(atomic_load(&t->release_during_refresh), 0);
    CHECK_EQ_INT(atomic_load(&t->refresh_after_release), 0);
    CHECK_EQ_INT(atomic_load(&t->refresh_calls), atomic_load(&t->refresh_calls_at_release));
    CHECK_EQ_INT(atomic_load(&t->refresh_calls), refresh_calls_at_destroy); /* none after destroy */
    CHECK(refresh_calls_at_destroy >= 3); /* the test did exercise retries and timeouts */
}

/* ---- Borrowed loop ---------------------------------------------------------------- */

/* On the host's thread: its loop with a script timer (every 5 ms), and the options of a
 * hanging refresher whose calls and release must all come from this thread. */
static sf_options start_host(uv_loop_t *loop, uv_timer_t *script, uv_timer_cb tick, void *data, tally *t) {
    uv_loop_init(loop);
    uv_timer_init(loop, script);
    script->data = data;
    uv_timer_start(script, tick, 5, 5);
    sf_options options = hanging_refresher_options(t);
    t->loop_thread = pthread_self();
    atomic_store(&t->loop_thread_known, 1);
    return options;
}

typedef struct borrowed_host {
    uv_loop_t loop;
    uv_timer_t script;
    tally t;
    sf_runtime *runtime;
    int step;
    int ticks_after_destroy;
    int create_result;
    int sign_in_result;
    int fresh_token_result;
    int destroy_result;
    int releases_when_destroy_returned;
    int refresh_calls_at_destroy;
    int late_succeed_result;
    int late_fail_result;
    int calls_after_destroy_result;
    int close_result;
} borrowed_host;

static void borrowed_script(uv_timer_t *timer) {
    borrowed_host *h = timer->data;
    switch (h->step) {
    case 0: { /* signed in with a token that needs refreshing at once */
        sf_tokens tokens = test_tokens("access-1", "refresh-1", 0, "m-1");
        h->sign_in_result = sf_session_sign_in(h->runtime, &tokens);
        h->fresh_token_result = sf_session_fresh_token(h->runtime, on_token, &h->t);
        h->step = 1;
        break;
    }
    case 1: /* failed once, then hanging requests timed out and were retried */
        if (atomic_load(&h->t.refresh_calls) >= 3 && atomic_load(&h->t.open_request) != NULL) h->step = 2;
        break;
    case 2: /* destroy with a request open and its timeout timer pending */
        h->refresh_calls_at_destroy = atomic_load(&h->t.refresh_calls);
        h->destroy_result = sf_runtime_destroy(h->runtime);
        h->releases_when_destroy_returned = atomic_load(&h->t.releases);
        h->step = 3;
        break;
    case 3: /* the host keeps its loop running: any timer of the runtime would fire by now */
        if (++h->ticks_after_destroy == 10) {
            sf_tokens late = test_tokens("late", NULL, 10, NULL);
            h->late_succeed_result = sf_refresh_request_succeed(atomic_load(&h->t.open_request), &late);
            h->late_fail_result = sf_refresh_request_fail(atomic_load(&h->t.open_request), SF_ENETWORK, -1);
            h->calls_after_destroy_result = sf_session_resume(h->runtime);
        }
        if (h->ticks_after_destroy == 40) uv_close((uv_handle_t *)&h->script, NULL); /* ~200 ms */
        break;
    }
}

static void *borrowed_thread(void *arg) {
    borrowed_host *h = arg;
    sf_options options = start_host(&h->loop, &h->script, borrowed_script, h, &h->t);
    h->create_result = sf_runtime_create_on_loop(&h->loop, &options, &h->runtime);
    uv_run(&h->loop, UV_RUN_DEFAULT);
    h->close_result = uv_loop_close(&h->loop);
    return NULL;
}

void test_refresh_release_borrowed_runs_once_after_the_last_refresh(void) {
    borrowed_host *h = calloc(1, sizeof *h);
    pthread_t thread;
    pthread_create(&thread, NULL, borrowed_thread, h);
    pthread_join(thread, NULL);
    CHECK_CODE(h->create_result, SF_OK);
    CHECK_CODE(h->sign_in_result, SF_OK);
    CHECK_CODE(h->fresh_token_result, SF_OK);
    CHECK_CODE(h->destroy_result, SF_OK);
    /* never inside the call: the teardown runs on the host's next loop iteration */
    CHECK_EQ_INT(h->releases_when_destroy_returned, 0);
    /* the request open at destroy was closed by it; the runtime too */
    CHECK_CODE(h->late_succeed_result, SF_ECLOSED);
    CHECK_CODE(h->late_fail_result, SF_ECLOSED);
    CHECK_CODE(h->calls_after_destroy_result, SF_ECLOSED);
    CHECK_EQ_INT(h->close_result, 0); /* every handle of the runtime was closed */
    check_released_after_the_last_refresh(&h->t, h->refresh_calls_at_destroy);
    CHECK(atomic_load(&h->t.token_answers) >= 1);
    free(h);
}

/* Destroy in the very callback that asked for a refresh: the refresh job was accepted
 * before the destroy and runs in the teardown's batch, after sf_runtime_destroy returned.
 * The refresher must not be called for it; its waiter gets SF_ESHUTDOWN. */
typedef struct racing_host {
    uv_loop_t loop;
    uv_timer_t script;
    tally t;
    recorder r;                 /* an open subscription, completed by the teardown */
    sf_subscription subscription;
    atomic_int token_answers_at_release;
    atomic_int completes_at_release;
    sf_runtime *runtime;
    int ticks;
    int results[3]; /* sign in, fresh token, destroy */
    int answer;
    int close_result;
} racing_host;

static void on_racing_token(int result, const char *access_token, void *userdata) {
    (void)access_token;
    racing_host *h = userdata;
    h->answer = result;
    atomic_fetch_add(&h->t.token_answers, 1);
}

static racing_host *racing;

static void racing_release(void *userdata) {
    atomic_store(&racing->token_answers_at_release, atomic_load(&racing->t.token_answers));
    atomic_store(&racing->completes_at_release, atomic_load(&racing->r.completes));
    box_release(userdata);
}

static void racing_script(uv_timer_t *timer) {
    racing_host *h = timer->data;
    if (h->ticks++ == 0) {
        sf_tokens tokens = test_tokens("access-1", "refresh-1", 0, "m-1");
        h->results[0] = sf_session_sign_in(h->runtime, &tokens);
        h->results[1] = sf_session_fresh_token(h->runtime, on_racing_token, h);
        h->results[2] = sf_runtime_destroy(h->runtime);
    } else if (h->ticks == 20) {
        uv_close((uv_handle_t *)&h->script, NULL);
    }
}

static void *racing_thread(void *arg) {
    racing_host *h = arg;
    sf_options options = start_host(&h->loop, &h->script, racing_script, h, &h->t);
    options.refresh_release = racing_release;
    racing = h;
    CHECK_CODE(sf_runtime_create_on_loop(&h->loop, &options, &h->runtime), SF_OK);
    recorder_init(&h->r);
    sf_observer observer = recorder_observer(&h->r);
    CHECK_CODE(sf_subscribe_session_state(h->runtime, &observer, &h->subscription), SF_OK);
    uv_run(&h->loop, UV_RUN_DEFAULT);
    h->close_result = uv_loop_close(&h->loop);
    return NULL;
}

void test_refresh_release_borrowed_destroy_right_after_asking_for_a_refresh(void) {
    racing_host *h = calloc(1, sizeof *h);
    h->answer = 1;
    pthread_t thread;
    pthread_create(&thread, NULL, racing_thread, h);
    pthread_join(thread, NULL);
    CHECK_CODE(h->results[0], SF_OK);
    CHECK_CODE(h->results[1], SF_OK);
    CHECK_CODE(h->results[2], SF_OK);
    CHECK_EQ_INT(atomic_load(&h->t.refresh_calls), 0); /* never after destroy returned */
    CHECK_EQ_INT(atomic_load(&h->t.releases), 1);
    CHECK_EQ_INT(atomic_load(&h->t.release_off_loop_thread), 0);
    CHECK_EQ_INT(atomic_load(&h->t.refresh_after_release), 0);
    CHECK_EQ_INT(atomic_load(&h->t.token_answers), 1);
    CHECK_CODE(h->answer, SF_ESHUTDOWN);
    /* the teardown's order: token answers, refresh_release, then the subscriptions */
    CHECK_EQ_INT(atomic_load(&h->token_answers_at_release), 1);
    CHECK_EQ_INT(atomic_load(&h->completes_at_release), 0);
    CHECK_EQ_INT(atomic_load(&h->r.completes), 1);
    CHECK_EQ_INT(atomic_load(&h->r.releases), 1);
    CHECK_EQ_INT(h->close_result, 0);
    free(h);
}

/* ---- Owned loop ------------------------------------------------------------------- */

void test_refresh_release_owned_runs_once_before_destroy_returns(void) {
    tally *t = calloc(1, sizeof *t);
    sf_options options = hanging_refresher_options(t);
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    sf_tokens tokens = test_tokens("access-1", "refresh-1", 0, "m-1");
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    CHECK_CODE(sf_session_fresh_token(runtime, on_token, t), SF_OK);
    WAIT_FOR(atomic_load(&t->refresh_calls) >= 3 && atomic_load(&t->open_request) != NULL);
    /* the loop thread (not this one) is the refresher's; releases must come from it too */
    CHECK(atomic_load(&t->loop_thread_known));
    CHECK(!pthread_equal(t->loop_thread, pthread_self()));
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    int refresh_calls_at_destroy = atomic_load(&t->refresh_calls);
    CHECK_EQ_INT(atomic_load(&t->releases), 1); /* owned: done when destroy returns */
    sf_tokens late = test_tokens("late", NULL, 10, NULL);
    CHECK_CODE(sf_refresh_request_succeed(atomic_load(&t->open_request), &late), SF_ECLOSED);
    sf_test_sleep_ms(200); /* any timer of the runtime would have fired by now */
    check_released_after_the_last_refresh(t, refresh_calls_at_destroy);
    free(t);
}

/* ---- Ownership rules ---------------------------------------------------------------- */

static atomic_int plain_releases;

static void count_release(void *userdata) {
    (void)userdata;
    atomic_fetch_add(&plain_releases, 1);
}

void test_refresh_release_failed_create_takes_no_ownership(void) {
    atomic_store(&plain_releases, 0);
    sf_options options;
    sf_options_init(&options);
    options.refresh_release = count_release;
    options.refresh_timeout_ms = -1; /* refused */
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_EINVAL);
    sf_options_init(&options);
    options.refresh_release = count_release;
    options.token_endpoint = "https://auth.example/token"; /* no client_id: refused */
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_EINVAL);
    CHECK(runtime == NULL);
    sf_test_sleep_ms(20);
    CHECK_EQ_INT(atomic_load(&plain_releases), 0);
}

void test_refresh_release_runs_without_a_refresher_and_honours_size(void) {
    /* Set without `refresh` (the userdata is still the host's to free): released once. */
    atomic_store(&plain_releases, 0);
    sf_options options;
    sf_options_init(&options);
    options.refresh_release = count_release;
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    CHECK_EQ_INT(atomic_load(&plain_releases), 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_EQ_INT(atomic_load(&plain_releases), 1);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_ECLOSED);
    CHECK_EQ_INT(atomic_load(&plain_releases), 1);
    /* A host built against the older header: its size ends before the field, so whatever
     * lies there is not read. */
    atomic_store(&plain_releases, 0);
    sf_options_init(&options);
    options.size = offsetof(sf_options, refresh_release);
    options.refresh_release = count_release;
    runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_EQ_INT(atomic_load(&plain_releases), 0);
}
