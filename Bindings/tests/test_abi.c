/* Issue 17, points 4 and 7: structs are read only at sizes of released layouts (a size that
 * ends inside a pointer was copied as half a pointer and crashed), handles of one kind are
 * never taken for another, and an observer with no callback at all is refused. */
#include <stddef.h>
#include <stdint.h>

#include "harness.h"

void test_abi_struct_sizes_of_released_layouts_only(void) {
    sf_runtime *runtime = NULL;
    sf_options options;
    /* A size ending inside a pointer (half of `refresh`), one past the end, one between two
     * released layouts: refused, nothing created, no crash. */
    size_t torn[] = {
        offsetof(sf_options, refresh) + 4, sizeof(sf_options) + 8, offsetof(sf_options, client_id),
        offsetof(sf_options, store_key_size), 1, sizeof(size_t),
    };
    for (size_t i = 0; i < sizeof torn / sizeof torn[0]; i++) {
        sf_options_init(&options);
        /* What a torn copy would read as a pointer: a crash if it were called. */
        options.refresh = (sf_refresh_fn)(uintptr_t)0x10;
        options.size = torn[i];
        runtime = NULL;
        CHECK_CODE(sf_runtime_create(&options, &runtime), SF_EINVAL);
        CHECK(runtime == NULL);
    }
    /* Every released layout is accepted. */
    size_t released[] = {
        offsetof(sf_options, min_refresh_interval_ms), offsetof(sf_options, token_endpoint),
        offsetof(sf_options, refresh_release), offsetof(sf_options, start_manually),
        offsetof(sf_options, refresh_cancel), offsetof(sf_options, store_key), offsetof(sf_options, issuer),
        sizeof(sf_options),
    };
    for (size_t i = 0; i < sizeof released / sizeof released[0]; i++) {
        sf_options_init(&options);
        options.size = released[i];
        runtime = NULL;
        CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
        if (runtime) CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    }

    CHECK_CODE(sf_runtime_create(NULL, &runtime), SF_OK);
    /* sf_tokens: its one layout. */
    sf_tokens tokens = test_tokens("a-1", "r-1", 3600, "m");
    tokens.size = offsetof(sf_tokens, member_id) + 4;
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_EINVAL);
    tokens.size = sizeof(sf_tokens) + 8;
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_EINVAL);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 0);
    /* sf_sign_in_options: its one layout (checked before anything starts). */
    sf_sign_in_options sign_in;
    sf_sign_in_options_init(&sign_in);
    sign_in.size = offsetof(sf_sign_in_options, issuer) + 4;
    sf_sign_in_observer sign_in_observer;
    memset(&sign_in_observer, 0, sizeof sign_in_observer);
    sf_sign_in handle = 0;
    CHECK_CODE(sf_session_sign_in_device(runtime, &sign_in, &sign_in_observer, &handle), SF_EINVAL);
    CHECK_EQ_INT(handle, 0);
    /* The observers: `size` first, sizeof only. */
    recorder r;
    recorder_init(&r);
    sf_observer observer = recorder_observer(&r);
    sf_subscription subscription = 0;
    observer.size = offsetof(sf_observer, on_error) + 4;
    CHECK_CODE(sf_subscribe_session_state(runtime, &observer, &subscription), SF_EINVAL);
    observer.size = 0;
    CHECK_CODE(sf_subscribe_session_state(runtime, &observer, &subscription), SF_EINVAL);
    sf_event_observer events = {.size = sizeof(sf_observer) - 8, .on_complete = NULL, .release = NULL};
    events.on_error = NULL;
    events.on_event = NULL;
    events.userdata = &r;
    events.size = 3;
    CHECK_CODE(sf_subscribe_events(runtime, &events, &subscription), SF_EINVAL);
    sf_store_observer store = {.size = 7};
    CHECK_CODE(sf_subscribe_store_status(runtime, &store, &subscription), SF_EINVAL);
    CHECK_EQ_INT(subscription, 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    /* Nothing was called, nothing released: refused subscribes take no ownership. */
    CHECK_EQ_INT(atomic_load(&r.state_count) + atomic_load(&r.releases) + atomic_load(&r.completes), 0);
}

void test_abi_an_observer_without_any_callback_is_refused(void) {
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(NULL, &runtime), SF_OK);
    sf_subscription subscription = 0;
    int userdata = 0;
    sf_observer observer = {.size = sizeof(sf_observer), .userdata = &userdata};
    CHECK_CODE(sf_subscribe_session_state(runtime, &observer, &subscription), SF_EINVAL);
    sf_event_observer events = {.size = sizeof(sf_event_observer), .userdata = &userdata};
    CHECK_CODE(sf_subscribe_events(runtime, &events, &subscription), SF_EINVAL);
    sf_store_observer store = {.size = sizeof(sf_store_observer), .userdata = &userdata};
    CHECK_CODE(sf_subscribe_store_status(runtime, &store, &subscription), SF_EINVAL);
    CHECK_EQ_INT(subscription, 0);
    /* One callback, any of them, is enough (a release alone: a host that only frees). */
    recorder r;
    recorder_init(&r);
    sf_observer only_release = recorder_observer(&r);
    only_release.on_state = NULL;
    only_release.on_error = NULL;
    only_release.on_complete = NULL;
    CHECK_CODE(sf_subscribe_session_state(runtime, &only_release, &subscription), SF_OK);
    CHECK(subscription != 0);
    CHECK_CODE(sf_subscription_close(subscription), SF_OK);
    WAIT_FOR(atomic_load(&r.releases) == 1);
    CHECK_EQ_INT(atomic_load(&r.releases), 1);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

typedef struct held {
    atomic_intptr_t request;
} held;

static void hold_request(sf_refresh_request *request, const char *refresh_token, void *userdata) {
    (void)refresh_token;
    atomic_store(&((held *)userdata)->request, (intptr_t)request);
}

static void ignore_token(int result, const char *access_token, void *userdata) {
    (void)result;
    (void)access_token;
    atomic_fetch_add((atomic_int *)userdata, 1);
}

/* A runtime whose host refresher keeps its request in `h`, signed in with a token that needs
 * a refresh, and a token request waiting for it (its answers counted in `answers`). */
static sf_runtime *runtime_waiting_for_the_host(held *h, atomic_int *answers) {
    memset(h, 0, sizeof *h);
    sf_options options;
    sf_options_init(&options);
    options.refresh = hold_request;
    options.refresh_userdata = h;
    options.refresh_timeout_ms = 60000;
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    sf_tokens tokens = test_tokens("a-1", "r-1", 0, "m");
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    atomic_store(answers, 0);
    CHECK_CODE(sf_session_fresh_token(runtime, ignore_token, answers), SF_OK);
    WAIT_FOR(atomic_load(&h->request) != 0);
    return runtime;
}

void test_abi_handles_of_one_kind_are_never_taken_for_another(void) {
    held h;
    atomic_int answers;
    sf_runtime *runtime = runtime_waiting_for_the_host(&h, &answers);
    sf_refresh_request *request = (sf_refresh_request *)atomic_load(&h.request);
    recorder r;
    recorder_init(&r);
    sf_observer observer = recorder_observer(&r);
    sf_subscription subscription = 0;
    CHECK_CODE(sf_subscribe_session_state(runtime, &observer, &subscription), SF_OK);

    /* Three handles of three kinds: all different numbers. */
    uint64_t numbers[] = {(uint64_t)(uintptr_t)runtime, (uint64_t)(uintptr_t)request, subscription};
    CHECK(numbers[0] != numbers[1] && numbers[1] != numbers[2] && numbers[0] != numbers[2]);
    /* Each given where another kind is expected: found nothing, changed nothing. */
    sf_tokens rotated = test_tokens("a-2", "r-2", 3600, NULL);
    CHECK_CODE(sf_refresh_request_succeed((sf_refresh_request *)runtime, &rotated), SF_ECLOSED);
    CHECK_CODE(sf_refresh_request_succeed((sf_refresh_request *)(uintptr_t)subscription, &rotated), SF_ECLOSED);
    CHECK_CODE(sf_refresh_request_fail((sf_refresh_request *)runtime, SF_EAUTH, -1), SF_ECLOSED);
    CHECK_CODE(sf_subscription_close((sf_subscription)(uintptr_t)runtime), SF_ECLOSED);
    CHECK_CODE(sf_subscription_close((sf_subscription)(uintptr_t)request), SF_ECLOSED);
    CHECK_CODE(sf_session_logout((sf_runtime *)request), SF_ECLOSED);
    CHECK_CODE(sf_runtime_destroy((sf_runtime *)(uintptr_t)subscription), SF_ECLOSED);
    CHECK_CODE(sf_sign_in_cancel((sf_sign_in)(uintptr_t)runtime), SF_ECLOSED);
    /* The real objects are untouched: the request still completes, the subscription is
     * still open, the runtime still signed in. */
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 1);
    CHECK_EQ_INT(atomic_load(&answers), 0);
    CHECK_CODE(sf_refresh_request_succeed(request, &rotated), SF_OK);
    WAIT_FOR(atomic_load(&answers) == 1);
    CHECK_EQ_INT(atomic_load(&answers), 1);
    CHECK_CODE(sf_subscription_close(subscription), SF_OK);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_abi_a_late_refresh_answer_after_logout_is_eclosed(void) {
    for (int fail = 0; fail <= 1; fail++) {
        held h;
        atomic_int answers;
        sf_runtime *runtime = runtime_waiting_for_the_host(&h, &answers);
        sf_refresh_request *request = (sf_refresh_request *)atomic_load(&h.request);
        /* The user logs out while the host's refresh is under way; its answer comes after. */
        CHECK_CODE(sf_session_logout(runtime), SF_OK);
        sf_tokens rotated = test_tokens("a-2", "r-2", 3600, NULL);
        if (fail) {
            CHECK_CODE(sf_refresh_request_fail(request, SF_ENETWORK, -1), SF_ECLOSED);
        } else {
            CHECK_CODE(sf_refresh_request_succeed(request, &rotated), SF_ECLOSED);
        }
        /* Said so, and nothing of it used: still signed out, the answer not repeatable. */
        CHECK_CODE(sf_refresh_request_succeed(request, &rotated), SF_ECLOSED);
        sf_test_sleep_ms(20);
        CHECK_EQ_INT(sf_session_is_logged_in(runtime), 0);
        sf_session_state state = SF_LOGGED_IN;
        CHECK_CODE(sf_session_state_get(runtime, &state), SF_OK);
        CHECK_EQ_INT(state, SF_LOGGED_OUT);
        CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    }
}
