/* Creating and destroying runtimes, and what bad input gets. */
#include "harness.h"

void test_runtime_create_and_destroy(void) {
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(NULL, &runtime), SF_OK);
    CHECK(runtime != NULL);
    sf_session_state state = SF_SESSION_EXPIRED;
    CHECK_CODE(sf_session_state_get(runtime, &state), SF_OK);
    CHECK_EQ_INT(state, SF_LOGGED_OUT);
    size_t unclosed = 99;
    CHECK_CODE(sf_runtime_destroy_report(runtime, &unclosed), SF_OK);
    CHECK_EQ_INT(unclosed, 0);
}

void test_runtime_bad_input_never_crashes(void) {
    CHECK_CODE(sf_runtime_create(NULL, NULL), SF_EINVAL);
    CHECK_CODE(sf_runtime_destroy(NULL), SF_OK);
    sf_session_state state;
    CHECK_CODE(sf_session_state_get(NULL, &state), SF_EINVAL);
    CHECK_CODE(sf_session_state_get((sf_runtime *)(uintptr_t)0xdeadbeef, &state), SF_ECLOSED);
    CHECK_CODE(sf_runtime_destroy((sf_runtime *)(uintptr_t)0xdeadbeef), SF_ECLOSED);
    CHECK_EQ_INT(sf_session_is_logged_in(NULL), SF_EINVAL);
    CHECK_CODE(sf_session_logout(NULL), SF_EINVAL);
    CHECK_CODE(sf_session_resume(NULL), SF_EINVAL);
    CHECK_CODE(sf_refresh_request_fail(NULL, SF_EAUTH, -1), SF_ECLOSED);
    CHECK_CODE(sf_refresh_request_succeed((sf_refresh_request *)(uintptr_t)77, NULL), SF_ECLOSED);
    sf_options_init(NULL);
}

void test_runtime_destroy_twice_is_eclosed(void) {
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(NULL, &runtime), SF_OK);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_ECLOSED);
}

static sf_runtime *current_runtime;

static void destroy_from_callback(sf_session_state state, void *userdata) {
    (void)state;
    atomic_int *result = userdata;
    int rc = sf_runtime_destroy(current_runtime);
    atomic_store(result, rc == 0 ? 1 : rc);
}

void test_runtime_destroy_from_its_loop_thread_is_ebusy(void) {
    CHECK_CODE(sf_runtime_create(NULL, &current_runtime), SF_OK);
    atomic_int result = 0;
    sf_observer observer;
    memset(&observer, 0, sizeof observer);
    observer.size = sizeof observer;
    observer.on_state = destroy_from_callback;
    observer.userdata = &result;
    sf_subscription subscription = 0;
    CHECK_CODE(sf_subscribe_session_state(current_runtime, &observer, &subscription), SF_OK);
    WAIT_FOR(atomic_load(&result) != 0);
    CHECK_EQ_INT(atomic_load(&result), SF_EBUSY);
    CHECK_CODE(sf_subscription_close(subscription), SF_OK);
    CHECK_CODE(sf_runtime_destroy(current_runtime), SF_OK);
}

void test_runtime_calls_after_destroy_are_eclosed(void) {
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(NULL, &runtime), SF_OK);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    sf_session_state state;
    recorder r;
    recorder_init(&r);
    sf_observer observer = recorder_observer(&r);
    sf_subscription subscription = 0;
    sf_tokens tokens = test_tokens("access", "refresh", 3600, "m");
    char buffer[16];
    CHECK_CODE(sf_session_state_get(runtime, &state), SF_ECLOSED);
    CHECK_CODE(sf_subscribe_session_state(runtime, &observer, &subscription), SF_ECLOSED);
    CHECK_EQ_INT(subscription, 0);
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_ECLOSED);
    CHECK_CODE(sf_session_logout(runtime), SF_ECLOSED);
    CHECK_CODE(sf_session_member_id(runtime, buffer, sizeof buffer), SF_ECLOSED);
    CHECK_CODE(sf_session_resume(runtime), SF_ECLOSED);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), SF_ECLOSED);
    sf_test_sleep_ms(20);
    CHECK_EQ_INT(atomic_load(&r.releases), 0); /* a failed subscribe took no ownership */
}

void test_runtime_options_are_validated(void) {
    sf_options options;
    sf_options_init(&options);
    CHECK_EQ_INT(options.size, sizeof options);
    CHECK_EQ_INT(options.refresh_margin_ms, 300000);
    CHECK_EQ_INT(options.refresh_timeout_ms, 30000);
    sf_runtime *runtime = NULL;
    options.refresh_timeout_ms = 0;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_EINVAL);
    options.refresh_timeout_ms = 600001; /* above 10 minutes: a lease record lasts at most an hour */
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_EINVAL);
    sf_options_init(&options);
    options.max_backoff_ms = 10;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_EINVAL);
    sf_options_init(&options);
    options.size = 0;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_EINVAL);
    CHECK(runtime == NULL);
    /* An older, shorter struct (the first released layout, which ended before
     * min_refresh_interval_ms): the missing fields take their defaults. */
    sf_options_init(&options);
    options.size = offsetof(sf_options, min_refresh_interval_ms);
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_runtime_oauth_endpoints_must_be_https_or_loopback(void) {
    /* Refused at create, before any connection: plain http to a host that is not
     * loopback (the refresh token and client secret would travel in clear), another
     * scheme, credentials inside the URL, something that is not a URL. */
    const char *refused[] = {
        "http://auth.example.com/token", "http://10.0.0.1/token", "http://localhost.example.com/t",
        "ftp://auth.example.com/token", "https://user:pw@auth.example.com/token", "not a url", "",
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        sf_options options;
        sf_options_init(&options);
        options.token_endpoint = refused[i];
        options.client_id = "client";
        sf_runtime *runtime = NULL;
        int rc = sf_runtime_create(&options, &runtime);
        if (rc != SF_EINVAL) fprintf(stderr, "    token_endpoint %s\n", refused[i]);
        CHECK_CODE(rc, SF_EINVAL);
        CHECK(runtime == NULL);
    }
    /* A bad revocation or introspection endpoint is refused too. */
    sf_options options;
    sf_options_init(&options);
    options.token_endpoint = "https://auth.example.com/token";
    options.client_id = "client";
    options.revocation_endpoint = "http://auth.example.com/revoke";
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_EINVAL);
    options.revocation_endpoint = NULL;
    options.introspection_endpoint = "http://auth.example.com/introspect";
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_EINVAL);
    /* https anywhere, and http to loopback (development), are accepted. */
    const char *accepted[] = {
        "https://auth.example.com/token", "http://127.0.0.1:9/token", "http://127.8.9.10:9/token",
        "http://localhost:9/token", "http://[::1]:9/token",
    };
    for (size_t i = 0; i < sizeof accepted / sizeof accepted[0]; i++) {
        sf_options_init(&options);
        options.token_endpoint = accepted[i];
        options.client_id = "client";
        runtime = NULL;
        int rc = sf_runtime_create(&options, &runtime);
        if (rc != SF_OK) fprintf(stderr, "    token_endpoint %s\n", accepted[i]);
        CHECK_CODE(rc, SF_OK);
        if (runtime) CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    }
}
