/* A host-supplied refresher: requests on the loop thread, completed from any thread. */
#include "harness.h"

typedef struct refresher {
    pthread_mutex_t lock;
    sf_refresh_request *requests[16];
    char refresh_tokens[16][32];
    int count;
    pthread_t thread;
} refresher;

static void host_refresh(sf_refresh_request *request, const char *refresh_token, void *userdata) {
    refresher *host = userdata;
    pthread_mutex_lock(&host->lock);
    if (host->count < 16) {
        host->requests[host->count] = request;
        snprintf(host->refresh_tokens[host->count], 32, "%s", refresh_token);
        host->count++;
    }
    host->thread = pthread_self();
    pthread_mutex_unlock(&host->lock);
}

static int request_count(refresher *host) {
    pthread_mutex_lock(&host->lock);
    int count = host->count;
    pthread_mutex_unlock(&host->lock);
    return count;
}

static sf_runtime *runtime_with(refresher *host) {
    memset(host, 0, sizeof *host);
    pthread_mutex_init(&host->lock, NULL);
    sf_options options;
    sf_options_init(&options);
    options.refresh = host_refresh;
    options.refresh_userdata = host;
    options.refresh_timeout_ms = 60000;
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    return runtime;
}

typedef struct answers {
    atomic_int calls;
    atomic_int results[8];
    char tokens[8][32];
} answers;

static void on_answer(int result, const char *access_token, void *userdata) {
    answers *a = userdata;
    int index = atomic_load(&a->calls);
    if (index < 8) {
        snprintf(a->tokens[index], 32, "%s", access_token ? access_token : "");
        atomic_store(&a->results[index], result);
    }
    atomic_fetch_add(&a->calls, 1);
}

void test_refresher_single_flight_and_rotation(void) {
    refresher host;
    sf_runtime *runtime = runtime_with(&host);
    /* expires_in 0: every token request needs a refresh */
    sf_tokens tokens = test_tokens("access-1", "refresh-1", 0, "m");
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    answers a;
    memset(&a, 0, sizeof a);
    for (int i = 0; i < 5; i++) CHECK_CODE(sf_session_fresh_token(runtime, on_answer, &a), SF_OK);
    WAIT_FOR(request_count(&host) >= 1);
    sf_test_sleep_ms(20);
    CHECK_EQ_INT(request_count(&host), 1); /* five callers, one refresh */
    CHECK(strcmp(host.refresh_tokens[0], "refresh-1") == 0);
    CHECK(!pthread_equal(host.thread, pthread_self()));
    sf_tokens rotated = test_tokens("access-2", "refresh-2", 3600, NULL);
    CHECK_CODE(sf_refresh_request_succeed(host.requests[0], &rotated), SF_OK);
    WAIT_FOR(atomic_load(&a.calls) == 5);
    CHECK_EQ_INT(atomic_load(&a.calls), 5);
    for (int i = 0; i < 5; i++) {
        CHECK_EQ_INT(atomic_load(&a.results[i]), SF_OK);
        CHECK(strcmp(a.tokens[i], "access-2") == 0);
    }
    char member[8];
    CHECK_CODE(sf_session_member_id(runtime, member, sizeof member), SF_OK);
    CHECK(strcmp(member, "m") == 0); /* kept: the refresh named no member */
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_refresher_completed_twice_is_eclosed(void) {
    refresher host;
    sf_runtime *runtime = runtime_with(&host);
    sf_tokens tokens = test_tokens("access-1", "refresh-1", 0, NULL);
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    answers a;
    memset(&a, 0, sizeof a);
    CHECK_CODE(sf_session_fresh_token(runtime, on_answer, &a), SF_OK);
    WAIT_FOR(request_count(&host) == 1);
    sf_tokens bad = test_tokens("", NULL, 10, NULL);
    CHECK_CODE(sf_refresh_request_succeed(host.requests[0], &bad), SF_EINVAL); /* stays open */
    CHECK_CODE(sf_refresh_request_fail(host.requests[0], SF_EINVAL, -1), SF_EINVAL);
    sf_tokens good = test_tokens("access-2", NULL, 3600, NULL);
    CHECK_CODE(sf_refresh_request_succeed(host.requests[0], &good), SF_OK);
    CHECK_CODE(sf_refresh_request_succeed(host.requests[0], &good), SF_ECLOSED);
    CHECK_CODE(sf_refresh_request_fail(host.requests[0], SF_EAUTH, -1), SF_ECLOSED);
    WAIT_FOR(atomic_load(&a.calls) == 1);
    CHECK(strcmp(a.tokens[0], "access-2") == 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_refresher_terminal_failure_expires_the_session(void) {
    refresher host;
    sf_runtime *runtime = runtime_with(&host);
    recorder r;
    recorder_init(&r);
    sf_observer observer = recorder_observer(&r);
    sf_subscription subscription = 0;
    CHECK_CODE(sf_subscribe_session_state(runtime, &observer, &subscription), SF_OK);
    sf_tokens tokens = test_tokens("access-1", "refresh-1", 0, "m-9");
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    answers a;
    memset(&a, 0, sizeof a);
    CHECK_CODE(sf_session_fresh_token(runtime, on_answer, &a), SF_OK);
    WAIT_FOR(request_count(&host) == 1);
    CHECK_CODE(sf_refresh_request_fail(host.requests[0], SF_EAUTH, -1), SF_OK);
    WAIT_FOR(atomic_load(&a.calls) == 1);
    CHECK_EQ_INT(atomic_load(&a.results[0]), SF_EAUTH);
    WAIT_FOR(atomic_load(&r.last_state) == SF_SESSION_EXPIRED);
    CHECK_EQ_INT(atomic_load(&r.last_state), SF_SESSION_EXPIRED);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 0);
    char member[8];
    CHECK_CODE(sf_session_member_id(runtime, member, sizeof member), SF_OK);
    CHECK(strcmp(member, "m-9") == 0); /* kept through expiry */
    CHECK_CODE(sf_session_reconfigure(runtime), SF_OK);
    CHECK_CODE(sf_session_member_id(runtime, member, sizeof member), SF_OK);
    CHECK(strcmp(member, "") == 0);
    CHECK_CODE(sf_subscription_close(subscription), SF_OK);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_refresher_transient_failure_keeps_the_session(void) {
    refresher host;
    sf_runtime *runtime = runtime_with(&host);
    sf_tokens tokens = test_tokens("access-1", "refresh-1", 0, NULL);
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    answers a;
    memset(&a, 0, sizeof a);
    CHECK_CODE(sf_session_fresh_token(runtime, on_answer, &a), SF_OK);
    WAIT_FOR(request_count(&host) == 1);
    CHECK_CODE(sf_refresh_request_fail(host.requests[0], SF_ENETWORK, 50), SF_OK);
    WAIT_FOR(atomic_load(&a.calls) == 1);
    CHECK_EQ_INT(atomic_load(&a.results[0]), SF_ENETWORK);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 1);
    /* retried by itself after the backoff (1 s), with the same refresh token */
    WAIT_FOR(request_count(&host) == 2);
    CHECK_EQ_INT(request_count(&host), 2);
    CHECK(strcmp(host.refresh_tokens[1], "refresh-1") == 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    /* the request left open when the runtime went can no longer be completed */
    sf_tokens late = test_tokens("late", NULL, 10, NULL);
    CHECK_CODE(sf_refresh_request_succeed(host.requests[1], &late), SF_ECLOSED);
}

void test_refresher_unauthorized_refreshes_only_the_current_token(void) {
    refresher host;
    sf_runtime *runtime = runtime_with(&host);
    sf_tokens tokens = test_tokens("access-1", "refresh-1", 3600, NULL);
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    CHECK_CODE(sf_session_notify_unauthorized(runtime, "some-older-token"), SF_OK);
    sf_test_sleep_ms(30);
    CHECK_EQ_INT(request_count(&host), 0);
    for (int i = 0; i < 5; i++) CHECK_CODE(sf_session_notify_unauthorized(runtime, "access-1"), SF_OK);
    WAIT_FOR(request_count(&host) == 1);
    sf_test_sleep_ms(30);
    CHECK_EQ_INT(request_count(&host), 1);
    CHECK_CODE(sf_session_notify_unauthorized(runtime, NULL), SF_EINVAL);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_refresher_missing_is_a_configuration_error(void) {
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(NULL, &runtime), SF_OK);
    sf_tokens tokens = test_tokens("access-1", "refresh-1", 0, NULL);
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    answers a;
    memset(&a, 0, sizeof a);
    CHECK_CODE(sf_session_fresh_token(runtime, on_answer, &a), SF_OK);
    WAIT_FOR(atomic_load(&a.calls) == 1);
    CHECK_EQ_INT(atomic_load(&a.results[0]), SF_ECONFIG);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 1);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

typedef struct retries {
    atomic_llong retry_in_ms;
    atomic_int failures;
} retries;

static void on_retry_event(const sf_event *event, void *userdata) {
    retries *r = userdata;
    if (event->kind == SF_EVENT_REFRESH_FAILED) {
        atomic_store(&r->retry_in_ms, event->retry_in_ms);
        atomic_fetch_add(&r->failures, 1);
    }
}

void test_refresher_absurd_retry_after_is_capped(void) {
    /* A host (or server) asking to retry in INT64_MAX ms: honoured up to an hour, and the
     * event's retry_in_ms is that hour (converting it used to trap). */
    refresher host;
    sf_runtime *runtime = runtime_with(&host);
    retries r;
    memset(&r, 0, sizeof r);
    sf_event_observer observer = {.size = sizeof(sf_event_observer), .on_event = on_retry_event, .userdata = &r};
    sf_subscription subscription = 0;
    CHECK_CODE(sf_subscribe_events(runtime, &observer, &subscription), SF_OK);
    sf_tokens tokens = test_tokens("access-1", "refresh-1", 0, NULL);
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    answers a;
    memset(&a, 0, sizeof a);
    CHECK_CODE(sf_session_fresh_token(runtime, on_answer, &a), SF_OK);
    WAIT_FOR(request_count(&host) == 1);
    CHECK_CODE(sf_refresh_request_fail(host.requests[0], SF_ENETWORK, INT64_MAX), SF_OK);
    WAIT_FOR(atomic_load(&r.failures) == 1);
    CHECK_EQ_INT(atomic_load(&r.retry_in_ms), 3600000);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 1);
    CHECK_CODE(sf_subscription_close(subscription), SF_OK);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

/* A host refresher that can be cancelled (sf_options.refresh_cancel). */
typedef struct cancellable {
    refresher base; /* first: host_refresh sees a refresher */
    atomic_int cancels;
    sf_refresh_request *cancelled;
    pthread_t cancel_thread;
} cancellable;

static void host_cancel(sf_refresh_request *request, void *userdata) {
    cancellable *host = userdata;
    pthread_mutex_lock(&host->base.lock);
    host->cancelled = request;
    host->cancel_thread = pthread_self();
    pthread_mutex_unlock(&host->base.lock);
    atomic_fetch_add(&host->cancels, 1);
}

static sf_runtime *cancellable_runtime(cancellable *host, int64_t timeout_ms) {
    memset(host, 0, sizeof *host);
    pthread_mutex_init(&host->base.lock, NULL);
    sf_options options;
    sf_options_init(&options);
    CHECK(options.refresh_cancel == NULL);
    options.refresh = host_refresh;
    options.refresh_cancel = host_cancel;
    options.refresh_userdata = host;
    options.refresh_timeout_ms = timeout_ms;
    options.min_backoff_ms = 50;
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    return runtime;
}

/* Signs in with a token that needs a refresh and asks for a token: one refresh starts. */
static void ask_for_a_refreshed_token(sf_runtime *runtime, answers *a) {
    sf_tokens tokens = test_tokens("access-1", "refresh-1", 0, NULL);
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    memset(a, 0, sizeof *a);
    CHECK_CODE(sf_session_fresh_token(runtime, on_answer, a), SF_OK);
}

/* The refresh timeout of the two tests below: the library asks to cancel at it and gives the
 * request up one timeout later, and each test must act between the two (a few calls and a
 * 60 ms pause). 2 s: under a sanitizer on a loaded machine, 150 ms was a race with the clock. */
#define CANCEL_TIMEOUT_MS 2000

void test_refresher_cancel_waits_for_the_request_to_end(void) {
    /* At the timeout the host is asked to cancel; until it completes the request, nobody is
     * answered and no second refresh is sent (the first may have rotated the token). */
    cancellable host;
    sf_runtime *runtime = cancellable_runtime(&host, CANCEL_TIMEOUT_MS);
    answers a;
    ask_for_a_refreshed_token(runtime, &a);
    WAIT_FOR(atomic_load(&host.cancels) == 1);
    CHECK_EQ_INT(atomic_load(&host.cancels), 1);
    pthread_mutex_lock(&host.base.lock);
    CHECK(host.cancelled == host.base.requests[0]);
    CHECK(!pthread_equal(host.cancel_thread, pthread_self()));
    pthread_mutex_unlock(&host.base.lock);
    /* Another caller joins the attempt being cancelled; nothing is sent, nobody answered. */
    CHECK_CODE(sf_session_fresh_token(runtime, on_answer, &a), SF_OK);
    sf_test_sleep_ms(60);
    CHECK_EQ_INT(request_count(&host.base), 1);
    CHECK_EQ_INT(atomic_load(&a.calls), 0);
    /* The host stopped its request: the callers hear the timeout. */
    CHECK_CODE(sf_refresh_request_fail(host.base.requests[0], SF_ENETWORK, -1), SF_OK);
    WAIT_FOR(atomic_load(&a.calls) == 2);
    CHECK_EQ_INT(atomic_load(&a.calls), 2);
    CHECK_EQ_INT(atomic_load(&a.results[0]), SF_ENETWORK);
    CHECK_EQ_INT(atomic_load(&a.results[1]), SF_ENETWORK);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 1);
    CHECK_EQ_INT(atomic_load(&host.cancels), 1); /* asked once */
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_refresher_tokens_after_cancel_are_kept(void) {
    cancellable host;
    sf_runtime *runtime = cancellable_runtime(&host, CANCEL_TIMEOUT_MS);
    answers a;
    ask_for_a_refreshed_token(runtime, &a);
    WAIT_FOR(atomic_load(&host.cancels) == 1);
    /* Too late to stop it: the server answered, with a rotated refresh token. */
    sf_tokens rotated = test_tokens("access-2", "refresh-2", 3600, NULL);
    CHECK_CODE(sf_refresh_request_succeed(host.base.requests[0], &rotated), SF_OK);
    WAIT_FOR(atomic_load(&a.calls) == 1);
    CHECK_EQ_INT(atomic_load(&a.results[0]), SF_OK);
    CHECK(strcmp(a.tokens[0], "access-2") == 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_refresher_never_ended_cancel_is_given_up(void) {
    /* A host that never completes a cancelled request: given up after one more timeout,
     * then retried with backoff (a second request, with the same refresh token). */
    cancellable host;
    sf_runtime *runtime = cancellable_runtime(&host, 100);
    answers a;
    ask_for_a_refreshed_token(runtime, &a);
    WAIT_FOR(atomic_load(&a.calls) == 1);
    CHECK_EQ_INT(atomic_load(&a.results[0]), SF_ENETWORK);
    CHECK_EQ_INT(atomic_load(&host.cancels), 1);
    WAIT_FOR(request_count(&host.base) == 2);
    CHECK_EQ_INT(request_count(&host.base), 2);
    CHECK(strcmp(host.base.refresh_tokens[1], "refresh-1") == 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}
