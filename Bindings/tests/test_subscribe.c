/* Subscriptions: the close contract and release ownership, from C. */
#include "harness.h"

#include <stdlib.h>

static sf_runtime *make_runtime(void) {
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(NULL, &runtime), SF_OK);
    return runtime;
}

void test_subscribe_state_gets_the_current_state_first(void) {
    sf_runtime *runtime = make_runtime();
    sf_tokens tokens = test_tokens("a-1", "r-1", 3600, "m-1");
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    recorder r;
    recorder_init(&r);
    sf_observer observer = recorder_observer(&r);
    sf_subscription subscription = 0;
    CHECK_CODE(sf_subscribe_session_state(runtime, &observer, &subscription), SF_OK);
    CHECK(subscription != 0);
    WAIT_FOR(atomic_load(&r.state_count) >= 1);
    CHECK_EQ_INT(atomic_load(&r.states[0]), SF_LOGGED_IN);
    CHECK_CODE(sf_session_logout(runtime), SF_OK);
    WAIT_FOR(atomic_load(&r.state_count) >= 2);
    CHECK_EQ_INT(atomic_load(&r.states[1]), SF_LOGGED_OUT);
    CHECK_EQ_INT(atomic_load(&r.wrong_thread), 0);
    CHECK_CODE(sf_subscription_close(subscription), SF_OK);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_EQ_INT(atomic_load(&r.releases), 1);
    CHECK_EQ_INT(atomic_load(&r.completes), 0); /* closed by the host: no terminal */
}

void test_subscribe_bad_input_takes_no_ownership(void) {
    sf_runtime *runtime = make_runtime();
    recorder r;
    recorder_init(&r);
    sf_observer observer = recorder_observer(&r);
    sf_subscription subscription = 0;
    CHECK_CODE(sf_subscribe_session_state(runtime, NULL, &subscription), SF_EINVAL);
    CHECK_CODE(sf_subscribe_session_state(runtime, &observer, NULL), SF_EINVAL);
    CHECK_CODE(sf_subscribe_session_state(NULL, &observer, &subscription), SF_EINVAL);
    sf_event_observer events;
    memset(&events, 0, sizeof events);
    events.size = sizeof events;
    CHECK_CODE(sf_subscribe_events(runtime, NULL, &subscription), SF_EINVAL);
    CHECK_CODE(sf_subscribe_events(NULL, &events, &subscription), SF_EINVAL);
    CHECK_EQ_INT(subscription, 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_EQ_INT(atomic_load(&r.state_count) + atomic_load(&r.releases) + atomic_load(&r.completes), 0);
}

void test_subscription_close_twice_and_unknown_handles(void) {
    sf_runtime *runtime = make_runtime();
    recorder r;
    recorder_init(&r);
    sf_observer observer = recorder_observer(&r);
    sf_subscription subscription = 0;
    CHECK_CODE(sf_subscribe_session_state(runtime, &observer, &subscription), SF_OK);
    CHECK_CODE(sf_subscription_close(subscription), SF_OK);
    CHECK_CODE(sf_subscription_close(subscription), SF_ECLOSED);
    CHECK_CODE(sf_subscription_close(0), SF_ECLOSED);
    CHECK_CODE(sf_subscription_close(UINT64_MAX), SF_ECLOSED);
    WAIT_FOR(atomic_load(&r.releases) == 1);
    CHECK_EQ_INT(atomic_load(&r.releases), 1);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_EQ_INT(atomic_load(&r.releases), 1);
}

void test_release_runs_once_after_the_last_callback(void) {
    sf_runtime *runtime = make_runtime();
    recorder r;
    recorder_init(&r);
    sf_observer observer = recorder_observer(&r);
    sf_subscription subscription = 0;
    CHECK_CODE(sf_subscribe_session_state(runtime, &observer, &subscription), SF_OK);
    WAIT_FOR(atomic_load(&r.state_count) == 1);
    CHECK_CODE(sf_subscription_close(subscription), SF_OK);
    atomic_store(&r.closed, 1);
    sf_tokens tokens = test_tokens("a-1", "r-1", 3600, NULL);
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    WAIT_FOR(atomic_load(&r.releases) == 1);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_EQ_INT(atomic_load(&r.releases), 1);
    CHECK_EQ_INT(atomic_load(&r.callbacks_after_close), 0);
    CHECK_EQ_INT(atomic_load(&r.state_count), 1);
}

/* Closes its own subscription from inside its first callback. */
typedef struct self_closer {
    recorder r;
    atomic_ullong handle;
    atomic_int close_result;
    atomic_int finished_after_close;
} self_closer;

static void close_self(sf_session_state state, void *userdata) {
    (void)state;
    self_closer *s = userdata;
    atomic_fetch_add(&s->r.state_count, 1);
    while (atomic_load(&s->handle) == 0) sf_test_sleep_ms(1);
    atomic_store(&s->close_result, sf_subscription_close(atomic_load(&s->handle)) == SF_OK ? 1 : -1);
    atomic_store(&s->finished_after_close, 1); /* the callback runs on after closing itself */
}

static void count_release(void *userdata) {
    self_closer *s = userdata;
    atomic_fetch_add(&s->r.releases, 1);
}

void test_close_from_inside_its_own_callback(void) {
    sf_runtime *runtime = make_runtime();
    self_closer s;
    memset(&s, 0, sizeof s);
    sf_observer observer;
    memset(&observer, 0, sizeof observer);
    observer.size = sizeof observer;
    observer.on_state = close_self;
    observer.release = count_release;
    observer.userdata = &s;
    sf_subscription subscription = 0;
    CHECK_CODE(sf_subscribe_session_state(runtime, &observer, &subscription), SF_OK);
    atomic_store(&s.handle, subscription);
    WAIT_FOR(atomic_load(&s.r.releases) == 1);
    sf_tokens tokens = test_tokens("a-1", "r-1", 3600, NULL);
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_EQ_INT(atomic_load(&s.close_result), 1);
    CHECK_EQ_INT(atomic_load(&s.finished_after_close), 1);
    CHECK_EQ_INT(atomic_load(&s.r.state_count), 1); /* nothing after */
    CHECK_EQ_INT(atomic_load(&s.r.releases), 1);
}

/* A long callback; the test closes from the main thread while it runs. */
typedef struct slow {
    atomic_int entered;
    atomic_int finished;
    atomic_int releases;
} slow;

static void slow_state(sf_session_state state, void *userdata) {
    slow *s = userdata;
    if (state != SF_LOGGED_IN) return;
    atomic_store(&s->entered, 1);
    sf_test_sleep_ms(100);
    atomic_store(&s->finished, 1);
}

static void slow_release(void *userdata) {
    slow *s = userdata;
    atomic_fetch_add(&s->releases, 1);
}

void test_close_from_another_thread_waits_for_the_running_callback(void) {
    sf_runtime *runtime = make_runtime();
    slow s;
    memset(&s, 0, sizeof s);
    sf_observer observer;
    memset(&observer, 0, sizeof observer);
    observer.size = sizeof observer;
    observer.on_state = slow_state;
    observer.release = slow_release;
    observer.userdata = &s;
    sf_subscription subscription = 0;
    CHECK_CODE(sf_subscribe_session_state(runtime, &observer, &subscription), SF_OK);
    sf_tokens tokens = test_tokens("a-1", "r-1", 3600, NULL);
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    WAIT_FOR(atomic_load(&s.entered));
    CHECK_CODE(sf_subscription_close(subscription), SF_OK);
    CHECK_EQ_INT(atomic_load(&s.finished), 1); /* close returned only after the callback */
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_EQ_INT(atomic_load(&s.releases), 1);
}

void test_destroy_completes_and_releases_open_subscriptions(void) {
    sf_runtime *runtime = make_runtime();
    recorder a, b, c;
    recorder_init(&a);
    recorder_init(&b);
    recorder_init(&c);
    sf_observer oa = recorder_observer(&a), ob = recorder_observer(&b), oc = recorder_observer(&c);
    sf_subscription sa = 0, sb = 0, sc = 0;
    CHECK_CODE(sf_subscribe_session_state(runtime, &oa, &sa), SF_OK);
    CHECK_CODE(sf_subscribe_session_state(runtime, &ob, &sb), SF_OK);
    CHECK_CODE(sf_subscribe_session_state(runtime, &oc, &sc), SF_OK);
    CHECK_CODE(sf_subscription_close(sb), SF_OK);
    size_t unclosed = 0;
    CHECK_CODE(sf_runtime_destroy_report(runtime, &unclosed), SF_OK);
    CHECK_EQ_INT(unclosed, 2);
    CHECK_EQ_INT(atomic_load(&a.completes), 1);
    CHECK_EQ_INT(atomic_load(&a.releases), 1);
    CHECK_EQ_INT(atomic_load(&b.completes), 0);
    CHECK_EQ_INT(atomic_load(&b.releases), 1);
    CHECK_EQ_INT(atomic_load(&c.completes), 1);
    CHECK_EQ_INT(atomic_load(&c.releases), 1);
    CHECK_EQ_INT(atomic_load(&a.errors) + atomic_load(&c.errors), 0);
    /* completed subscriptions are closed handles now */
    CHECK_CODE(sf_subscription_close(sa), SF_ECLOSED);
}

/* Events: what arrived, copied out of the borrowed event. */
typedef struct event_log {
    atomic_int count;
    int kinds[32];
    int states[32];
    char members[32][32];
    char reasons[32][64];
    atomic_int releases;
} event_log;

static void log_event(const sf_event *event, void *userdata) {
    event_log *log = userdata;
    int index = atomic_load(&log->count);
    if (index >= 32) return;
    log->kinds[index] = (int)event->kind;
    log->states[index] = (int)event->state;
    snprintf(log->members[index], sizeof log->members[index], "%s", event->member_id ? event->member_id : "");
    snprintf(log->reasons[index], sizeof log->reasons[index], "%s", event->reason ? event->reason : "");
    atomic_store(&log->count, index + 1);
}

static void log_release(void *userdata) {
    event_log *log = userdata;
    atomic_fetch_add(&log->releases, 1);
}

/* Subscribes a fresh event_log to the runtime's events; the caller frees the log after
 * the subscription was released. */
static event_log *subscribe_event_log(sf_runtime *runtime, sf_subscription *subscription) {
    event_log *log = calloc(1, sizeof *log);
    sf_event_observer observer;
    memset(&observer, 0, sizeof observer);
    observer.size = sizeof observer;
    observer.on_event = log_event;
    observer.release = log_release;
    observer.userdata = log;
    CHECK_CODE(sf_subscribe_events(runtime, &observer, subscription), SF_OK);
    return log;
}

void test_events_carry_kind_member_and_reason(void) {
    sf_runtime *runtime = make_runtime();
    sf_subscription subscription = 0;
    event_log *log = subscribe_event_log(runtime, &subscription);
    sf_tokens tokens = test_tokens("a-1", "r-1", 3600, "member-7");
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    CHECK_CODE(sf_session_logout(runtime), SF_OK);
    WAIT_FOR(atomic_load(&log->count) >= 2 && log->kinds[atomic_load(&log->count) - 1] == SF_EVENT_SIGNED_OUT);
    /* initialSession comes first only if the subscription beat the runtime's first loop turn */
    int first = log->kinds[0] == SF_EVENT_INITIAL_SESSION ? 1 : 0;
    if (first) CHECK_EQ_INT(log->states[0], SF_LOGGED_OUT);
    CHECK_EQ_INT(atomic_load(&log->count), first + 2);
    CHECK_EQ_INT(log->kinds[first], SF_EVENT_SIGNED_IN);
    CHECK(strcmp(log->members[first], "member-7") == 0);
    CHECK_EQ_INT(log->kinds[first + 1], SF_EVENT_SIGNED_OUT);
    CHECK(strcmp(log->reasons[first + 1], "userRequested") == 0);
    CHECK_CODE(sf_subscription_close(subscription), SF_OK);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_EQ_INT(atomic_load(&log->releases), 1);
    free(log);
}

/* start_manually: an observer that subscribes long after create (the loop has turned many
 * times) still sees the start-up event, because the session waits for sf_runtime_start. */
void test_events_start_up_event_waits_for_sf_runtime_start(void) {
    sf_options options;
    sf_options_init(&options);
    options.start_manually = 1;
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    sf_test_sleep_ms(50); /* the runtime's loop has long had its first turn */
    sf_subscription subscription = 0;
    event_log *log = subscribe_event_log(runtime, &subscription);
    sf_test_sleep_ms(20);
    CHECK_EQ_INT(atomic_load(&log->count), 0); /* nothing before the start */
    CHECK_CODE(sf_runtime_start(runtime), SF_OK);
    WAIT_FOR(atomic_load(&log->count) >= 1);
    CHECK_EQ_INT(atomic_load(&log->count), 1);
    CHECK_EQ_INT(log->kinds[0], SF_EVENT_INITIAL_SESSION);
    CHECK_EQ_INT(log->states[0], SF_LOGGED_OUT);
    /* A second start does nothing; bad handles are refused. */
    CHECK_CODE(sf_runtime_start(runtime), SF_OK);
    CHECK_CODE(sf_runtime_start(NULL), SF_EINVAL);
    sf_test_sleep_ms(20);
    CHECK_EQ_INT(atomic_load(&log->count), 1);
    CHECK_CODE(sf_subscription_close(subscription), SF_OK);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_CODE(sf_runtime_start(runtime), SF_ECLOSED);
    CHECK_EQ_INT(atomic_load(&log->releases), 1);
    free(log);
}
