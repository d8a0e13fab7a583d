/* Issue 17, points 2 and 3: requests are bounded (SF_EBUSY beyond the limit, nothing
 * queued), and no waiter gets a token once an earlier waiter has logged out. */
#include "harness.h"

/* A token callback that holds the loop thread until released (a host stuck in a callback). */
typedef struct blocker {
    atomic_int inside;
    atomic_int release;
} blocker;

static void block_the_loop(int result, const char *access_token, void *userdata) {
    (void)result;
    (void)access_token;
    blocker *b = userdata;
    atomic_store(&b->inside, 1);
    while (!atomic_load(&b->release)) sf_test_sleep_ms(1);
}

typedef struct tally {
    atomic_int calls;
    atomic_int ok;
    atomic_int other;
} tally;

static void count_answer(int result, const char *access_token, void *userdata) {
    tally *t = userdata;
    if (result == SF_OK && access_token != NULL) atomic_fetch_add(&t->ok, 1);
    else atomic_fetch_add(&t->other, 1);
    atomic_fetch_add(&t->calls, 1);
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000.0 + ts.tv_nsec / 1e6;
}

/* Floods a runtime whose loop is stuck until a call is refused; returns how many were
 * accepted and stores the refusing code. */
static int flood(sf_runtime *runtime, tally *t, int *refused_with) {
    int accepted = 0;
    *refused_with = SF_OK;
    for (int i = 0; i < 200000; i++) {
        int rc = sf_session_fresh_token(runtime, count_answer, t);
        if (rc != SF_OK) {
            *refused_with = rc;
            break;
        }
        accepted++;
    }
    return accepted;
}

/* A signed-in runtime whose loop is held by a host callback (`b`), flooded with token
 * requests until one is refused: returns the runtime; `accepted` and the refusing code out. */
static sf_runtime *stuck_and_flooded(blocker *b, tally *t, int *accepted, int *refused_with) {
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(NULL, &runtime), SF_OK);
    sf_tokens tokens = test_tokens("access-1", "refresh-1", 3600, NULL);
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    memset(b, 0, sizeof *b);
    CHECK_CODE(sf_session_fresh_token(runtime, block_the_loop, b), SF_OK);
    WAIT_FOR(atomic_load(&b->inside));
    memset(t, 0, sizeof *t);
    *accepted = flood(runtime, t, refused_with);
    return runtime;
}

void test_limits_token_requests_beyond_the_limit_are_ebusy(void) {
    blocker b;
    tally t;
    int accepted = 0, refused_with = SF_OK;
    sf_runtime *runtime = stuck_and_flooded(&b, &t, &accepted, &refused_with);
    /* 10 000 token requests may wait (SessionConfiguration.tokenRequestLimit's default);
     * the next is refused with SF_EBUSY, and its callback never runs. */
    CHECK_EQ_INT(accepted, 10000);
    CHECK_CODE(refused_with, SF_EBUSY);
    atomic_store(&b.release, 1);
    WAIT_FOR(atomic_load(&t.calls) == accepted);
    CHECK_EQ_INT(atomic_load(&t.calls), accepted);
    CHECK_EQ_INT(atomic_load(&t.ok), accepted);
    /* The places are given back as the answers run: accepted again. */
    CHECK_CODE(sf_session_fresh_token(runtime, count_answer, &t), SF_OK);
    WAIT_FOR(atomic_load(&t.calls) == accepted + 1);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_EQ_INT(atomic_load(&t.calls), accepted + 1);
}

typedef struct releaser {
    blocker *b;
    long after_ms;
} releaser;

static void *release_later(void *arg) {
    releaser *r = arg;
    sf_test_sleep_ms(r->after_ms);
    atomic_store(&r->b->release, 1);
    return NULL;
}

void test_limits_destroy_with_a_full_queue_answers_everyone_and_returns(void) {
    blocker b;
    tally t;
    int accepted = 0, refused_with = SF_OK;
    sf_runtime *runtime = stuck_and_flooded(&b, &t, &accepted, &refused_with);
    CHECK_CODE(refused_with, SF_EBUSY);
    /* Destroy while the queue is full; the host's callback lets go of the loop shortly. */
    releaser r = {&b, 20};
    pthread_t thread;
    pthread_create(&thread, NULL, release_later, &r);
    double start = now_ms();
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    double took = now_ms() - start;
    pthread_join(thread, NULL);
    /* Every accepted request was answered exactly once before destroy returned. */
    CHECK_EQ_INT(atomic_load(&t.calls), accepted);
    fprintf(stderr, "    (destroy with %d requests queued returned in %.1f ms, 20 of them the host's)\n", accepted,
            took);
}

/* A refresher that keeps its request for the test to answer. */
typedef struct held_refresh {
    atomic_intptr_t request;
} held_refresh;

static void keep_request(sf_refresh_request *request, const char *refresh_token, void *userdata) {
    (void)refresh_token;
    held_refresh *h = userdata;
    atomic_store(&h->request, (intptr_t)request);
}

typedef struct waiters {
    sf_runtime *runtime;
    atomic_int calls;
    atomic_int results[3];
    atomic_int tokens_seen[3];
    atomic_int logout_result;
} waiters;

static void waiter_answer(waiters *w, int result, const char *access_token) {
    int index = atomic_fetch_add(&w->calls, 1);
    if (index < 3) {
        atomic_store(&w->results[index], result);
        atomic_store(&w->tokens_seen[index], access_token != NULL);
    }
}

static void waiter_that_logs_out(int result, const char *access_token, void *userdata) {
    waiters *w = userdata;
    waiter_answer(w, result, access_token);
    atomic_store(&w->logout_result, sf_session_logout(w->runtime));
}

static void plain_waiter(int result, const char *access_token, void *userdata) {
    waiter_answer(userdata, result, access_token);
}

void test_limits_no_waiter_gets_a_token_after_a_logout(void) {
    held_refresh host;
    memset(&host, 0, sizeof host);
    sf_options options;
    sf_options_init(&options);
    options.refresh = keep_request;
    options.refresh_userdata = &host;
    options.refresh_timeout_ms = 60000;
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    /* expires_in 0: the token requests wait for one refresh */
    sf_tokens tokens = test_tokens("access-1", "refresh-1", 0, "m");
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    waiters w;
    memset(&w, 0, sizeof w);
    w.runtime = runtime;
    atomic_store(&w.logout_result, 1);
    CHECK_CODE(sf_session_fresh_token(runtime, waiter_that_logs_out, &w), SF_OK);
    CHECK_CODE(sf_session_fresh_token(runtime, plain_waiter, &w), SF_OK);
    CHECK_CODE(sf_session_fresh_token(runtime, plain_waiter, &w), SF_OK);
    WAIT_FOR(atomic_load(&host.request) != 0);
    sf_tokens rotated = test_tokens("access-2", "refresh-2", 3600, NULL);
    CHECK_CODE(sf_refresh_request_succeed((sf_refresh_request *)atomic_load(&host.request), &rotated), SF_OK);
    WAIT_FOR(atomic_load(&w.calls) == 3);
    CHECK_EQ_INT(atomic_load(&w.calls), 3);
    /* The first waiter got the token and logged out from inside its callback; */
    CHECK_CODE(atomic_load(&w.results[0]), SF_OK);
    CHECK_CODE(atomic_load(&w.logout_result), SF_OK);
    /* the two after it were told no one is signed in, and got no token. */
    for (int i = 1; i < 3; i++) {
        CHECK_CODE(atomic_load(&w.results[i]), SF_ENOTLOGGEDIN);
        CHECK_EQ_INT(atomic_load(&w.tokens_seen[i]), 0);
    }
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}
