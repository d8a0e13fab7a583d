/* Sign-in flows through the C API against the real test server (Authlib's RFC 8628 and
 * RFC 8414 metadata): the device flow approved, denied, expired and cancelled; bad input;
 * destroy with a sign-in running. The probe checks every callback's thread and order:
 * on_prompt at most once and before on_done, on_done exactly once, release once right
 * after it, nothing after release. */
#define _DEFAULT_SOURCE
#include "harness.h"
#include "oauth_fixture.h"

#include <stdlib.h>
#include <uv.h>

typedef struct probe {
    atomic_int prompts;
    atomic_int dones;
    atomic_int releases;
    atomic_int result;
    atomic_int after_release;   /* a callback after release */
    atomic_int prompt_after_done;
    atomic_int on_main_thread;  /* a callback on the test's thread: never inside the call */
    atomic_int prompt_not_device; /* the device prompt had browser fields, or lacked its own */
    atomic_int cancel_in_prompt; /* set by the test: cancel from inside on_prompt */
    atomic_int cancel_in_prompt_result;
    atomic_int cancel_in_done_result;
    _Atomic(sf_sign_in) handle;
    pthread_t main_thread;
    pthread_t done_thread;
    char user_code[128];
    char verification_uri[512];
    int64_t expires_in_ms;
    int64_t interval_ms;
    char message[1024];
} probe;

static void note(probe *p) {
    if (pthread_equal(pthread_self(), p->main_thread)) atomic_fetch_add(&p->on_main_thread, 1);
    if (atomic_load(&p->releases)) atomic_fetch_add(&p->after_release, 1);
}

static void on_prompt(const sf_sign_in_prompt *prompt, void *userdata) {
    probe *p = userdata;
    note(p);
    if (atomic_load(&p->dones)) atomic_fetch_add(&p->prompt_after_done, 1);
    if (prompt->size < sizeof *prompt || !prompt->user_code || !prompt->verification_uri ||
        prompt->authorization_url || prompt->redirect_uri)
        atomic_fetch_add(&p->prompt_not_device, 1);
    snprintf(p->user_code, sizeof p->user_code, "%s", prompt->user_code ? prompt->user_code : "");
    snprintf(p->verification_uri, sizeof p->verification_uri, "%s",
             prompt->verification_uri ? prompt->verification_uri : "");
    p->expires_in_ms = prompt->expires_in_ms;
    p->interval_ms = prompt->interval_ms;
    if (atomic_load(&p->cancel_in_prompt)) {
        /* The test stores the handle once its call returned; a test thread descheduled past
         * the sign-in's first round trips must not make this a cancel of handle 0 (10 s at
         * most: a hang guard). */
        for (int waited = 0; waited < 10000 && atomic_load(&p->handle) == 0; waited++) sf_test_sleep_ms(1);
        atomic_store(&p->cancel_in_prompt_result, sf_sign_in_cancel(atomic_load(&p->handle)));
    }
    atomic_fetch_add(&p->prompts, 1); /* last: the test reads the fields once it sees this */
}

static void on_done(int result, const char *message, void *userdata) {
    probe *p = userdata;
    note(p);
    snprintf(p->message, sizeof p->message, "%s", message ? message : "(null)");
    p->done_thread = pthread_self();
    atomic_store(&p->result, result);
    /* The handle is finished already: cancelling it now is SF_ECLOSED. */
    atomic_store(&p->cancel_in_done_result, sf_sign_in_cancel(atomic_load(&p->handle)));
    atomic_fetch_add(&p->dones, 1);
}

static void on_release(void *userdata) {
    probe *p = userdata;
    note(p);
    atomic_fetch_add(&p->releases, 1);
}

static sf_sign_in_observer probe_observer(probe *p) {
    memset(p, 0, sizeof *p);
    p->main_thread = pthread_self();
    atomic_store(&p->result, 1);
    sf_sign_in_observer observer;
    memset(&observer, 0, sizeof observer);
    observer.on_prompt = on_prompt;
    observer.on_done = on_done;
    observer.release = on_release;
    observer.userdata = p;
    return observer;
}

/* The checks every finished sign-in passes. */
static void check_finished_once(probe *p) {
    WAIT_FOR(atomic_load(&p->releases) == 1);
    sf_test_sleep_ms(20); /* nothing follows */
    CHECK_EQ_INT(atomic_load(&p->dones), 1);
    CHECK_EQ_INT(atomic_load(&p->releases), 1);
    CHECK(atomic_load(&p->prompts) <= 1);
    CHECK_EQ_INT(atomic_load(&p->after_release), 0);
    CHECK_EQ_INT(atomic_load(&p->prompt_after_done), 0);
    CHECK_EQ_INT(atomic_load(&p->on_main_thread), 0);
    CHECK_EQ_INT(atomic_load(&p->prompt_not_device), 0);
    CHECK_EQ_INT(atomic_load(&p->cancel_in_done_result), SF_ECLOSED);
    CHECK_CODE(sf_sign_in_cancel(atomic_load(&p->handle)), SF_ECLOSED);
}

/* A runtime whose built-in authority is the test server (refreshes, introspection). */
static sf_runtime *server_runtime(const char *base) {
    char token[256], introspect[256];
    snprintf(token, sizeof token, "%s/oauth/token", base);
    snprintf(introspect, sizeof introspect, "%s/oauth/introspect", base);
    sf_options options;
    sf_options_init(&options);
    options.token_endpoint = token;
    options.introspection_endpoint = introspect;
    options.client_id = "sessionflow-public";
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    return runtime;
}

/* The device endpoint announces `interval` and `expires_in` (seconds). */
static void device_config(int interval, int expires_in) {
    char form[128];
    snprintf(form, sizeof form, "reset=1&interval=%d&expires_in=%d", interval, expires_in);
    CHECK_EQ_INT(oauth_post("/__device/config", form), 200);
}

static int start_device(sf_runtime *runtime, const char *issuer, probe *p) {
    sf_sign_in_options options;
    sf_sign_in_options_init(&options);
    options.issuer = issuer;
    sf_sign_in_observer observer = probe_observer(p);
    sf_sign_in handle = 0;
    int rc = sf_session_sign_in_device(runtime, &options, &observer, &handle);
    atomic_store(&p->handle, handle);
    return rc;
}

static void user_decides(const char *path, const char *user_code) {
    char code[256], form[300];
    form_encode(user_code, code, sizeof code);
    snprintf(form, sizeof form, "user_code=%s", code);
    CHECK_EQ_INT(oauth_post(path, form), 200);
}

#define NEED_SERVER(base)                                  \
    const char *base = oauth_server();                     \
    CHECK(base != NULL);                                   \
    if (!base) return

void test_sign_in_device_approved_through_discovery(void) {
    NEED_SERVER(base);
    device_config(1, 60);
    sf_runtime *runtime = server_runtime(base);
    probe p;
    CHECK_CODE(start_device(runtime, base, &p), SF_OK);
    CHECK(atomic_load(&p.handle) != 0);
    WAIT_FOR(atomic_load(&p.prompts) == 1);
    CHECK_EQ_INT(atomic_load(&p.prompts), 1);
    CHECK(strlen(p.user_code) > 0);
    CHECK(strncmp(p.verification_uri, base, strlen(base)) == 0);
    CHECK_EQ_INT(p.interval_ms, 1000);
    CHECK_EQ_INT(p.expires_in_ms, 60000);
    sf_session_state state;
    CHECK_CODE(sf_session_state_get(runtime, &state), SF_OK);
    CHECK_EQ_INT(state, SF_LOGGED_OUT); /* not before the user approved */
    user_decides("/__device/approve", p.user_code);
    check_finished_once(&p);
    CHECK_EQ_INT(atomic_load(&p.result), SF_OK);
    CHECK(strcmp(p.message, "") == 0);
    CHECK_CODE(sf_session_state_get(runtime, &state), SF_OK);
    CHECK_EQ_INT(state, SF_LOGGED_IN);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 1);
    char member[64];
    CHECK_CODE(sf_session_member_id(runtime, member, sizeof member), SF_OK);
    CHECK(strcmp(member, "alice") == 0); /* the introspection's sub */
    /* Signed in now: another sign-in is refused at once, calling nothing. */
    probe again;
    CHECK_CODE(start_device(runtime, base, &again), SF_ESTATE);
    sf_test_sleep_ms(20);
    CHECK_EQ_INT(atomic_load(&again.dones) + atomic_load(&again.releases) + atomic_load(&again.prompts), 0);
    CHECK_CODE(sf_session_logout(runtime), SF_OK);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_sign_in_device_with_the_runtimes_endpoints(void) {
    NEED_SERVER(base);
    device_config(1, 60);
    sf_runtime *runtime = server_runtime(base);
    char device[256];
    snprintf(device, sizeof device, "%s/oauth/device_authorization", base);
    sf_sign_in_options options;
    sf_sign_in_options_init(&options);
    options.device_authorization_endpoint = device;
    probe p;
    sf_sign_in_observer observer = probe_observer(&p);
    sf_sign_in handle = 0;
    CHECK_CODE(sf_session_sign_in_device(runtime, &options, &observer, &handle), SF_OK);
    atomic_store(&p.handle, handle);
    WAIT_FOR(atomic_load(&p.prompts) == 1);
    user_decides("/__device/approve", p.user_code);
    check_finished_once(&p);
    CHECK_EQ_INT(atomic_load(&p.result), SF_OK);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 1);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

typedef struct token_answer {
    atomic_int calls;
    atomic_int result;
    char token[512];
} token_answer;

static void on_token(int result, const char *access_token, void *userdata) {
    token_answer *a = userdata;
    snprintf(a->token, sizeof a->token, "%s", access_token ? access_token : "");
    atomic_store(&a->result, result);
    atomic_fetch_add(&a->calls, 1);
}

static void fresh_token(sf_runtime *runtime, token_answer *a) {
    memset(a, 0, sizeof *a);
    CHECK_CODE(sf_session_fresh_token(runtime, on_token, a), SF_OK);
    WAIT_FOR(atomic_load(&a->calls) == 1);
    CHECK_EQ_INT(atomic_load(&a->result), SF_OK);
}

/* A runtime that names only the issuer (sf_options.issuer, no token endpoint): a sign-in
 * without an issuer of its own uses it, and the session then refreshes through the
 * endpoints discovered from it. */
void test_sign_in_with_the_runtimes_issuer_then_refresh(void) {
    NEED_SERVER(base);
    device_config(1, 60);
    sf_options options;
    sf_options_init(&options);
    options.issuer = base;
    options.client_id = "sessionflow-public";
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    long metadata = oauth_stat("/__stats", "metadata_requests");
    long refreshes = oauth_stat("/__stats", "refresh_grants");
    probe p;
    CHECK_CODE(start_device(runtime, NULL, &p), SF_OK);
    WAIT_FOR(atomic_load(&p.prompts) == 1);
    CHECK(strncmp(p.verification_uri, base, strlen(base)) == 0);
    user_decides("/__device/approve", p.user_code);
    check_finished_once(&p);
    CHECK_EQ_INT(atomic_load(&p.result), SF_OK);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 1);
    /* A 401 with the current token: a refresh, through the discovered token endpoint. */
    token_answer before, after;
    fresh_token(runtime, &before);
    CHECK_CODE(sf_session_notify_unauthorized(runtime, before.token), SF_OK);
    WAIT_FOR(oauth_stat("/__stats", "refresh_grants") == refreshes + 1);
    fresh_token(runtime, &after);
    CHECK(strcmp(before.token, after.token) != 0);
    /* One discovery for the sign-in, one for the session's authority. */
    CHECK_EQ_INT(oauth_stat("/__stats", "metadata_requests"), metadata + 2);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);

    /* An issuer that breaks the rule, or one without a client: create refuses. */
    sf_options bad;
    sf_options_init(&bad);
    bad.issuer = "http://auth.example.com";
    bad.client_id = "c";
    runtime = NULL;
    CHECK_CODE(sf_runtime_create(&bad, &runtime), SF_EINVAL);
    CHECK(runtime == NULL);
    bad.issuer = base;
    bad.client_id = NULL;
    CHECK_CODE(sf_runtime_create(&bad, &runtime), SF_EINVAL);
    bad.issuer = "https://auth.example.com/?tenant=a";
    bad.client_id = "c";
    CHECK_CODE(sf_runtime_create(&bad, &runtime), SF_EINVAL);
}

void test_sign_in_device_denied_is_edenied(void) {
    NEED_SERVER(base);
    device_config(1, 60);
    sf_runtime *runtime = server_runtime(base);
    probe p;
    CHECK_CODE(start_device(runtime, base, &p), SF_OK);
    WAIT_FOR(atomic_load(&p.prompts) == 1);
    user_decides("/__device/deny", p.user_code);
    check_finished_once(&p);
    CHECK_EQ_INT(atomic_load(&p.result), SF_EDENIED);
    CHECK(strlen(p.message) > 0);
    sf_session_state state;
    CHECK_CODE(sf_session_state_get(runtime, &state), SF_OK);
    CHECK_EQ_INT(state, SF_LOGGED_OUT);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_sign_in_device_expired_is_eexpired(void) {
    NEED_SERVER(base);
    device_config(1, 2); /* the code lives 2 s; no one approves */
    sf_runtime *runtime = server_runtime(base);
    probe p;
    CHECK_CODE(start_device(runtime, base, &p), SF_OK);
    WAIT_FOR(atomic_load(&p.dones) == 1);
    check_finished_once(&p);
    CHECK_EQ_INT(atomic_load(&p.prompts), 1);
    CHECK_EQ_INT(atomic_load(&p.result), SF_EEXPIRED);
    CHECK(strlen(p.message) > 0);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_sign_in_device_cancelled_mid_poll_sends_nothing_more(void) {
    NEED_SERVER(base);
    device_config(1, 60);
    sf_runtime *runtime = server_runtime(base);
    long polls_before = oauth_stat("/__device/stats", "polls");
    probe p;
    CHECK_CODE(start_device(runtime, base, &p), SF_OK);
    WAIT_FOR(atomic_load(&p.prompts) == 1);
    /* Wait for the first poll (pending), then cancel between polls. */
    for (int i = 0; i < 5000 && oauth_stat("/__device/stats", "polls") < polls_before + 1; i += 20) sf_test_sleep_ms(20);
    CHECK(oauth_stat("/__device/stats", "polls") >= polls_before + 1);
    CHECK_CODE(sf_sign_in_cancel(atomic_load(&p.handle)), SF_OK);
    CHECK_CODE(sf_sign_in_cancel(atomic_load(&p.handle)), SF_ECLOSED); /* twice */
    check_finished_once(&p);
    CHECK_EQ_INT(atomic_load(&p.result), SF_ECANCELLED);
    long polls_after = oauth_stat("/__device/stats", "polls");
    /* The user approves after the cancel: nothing signs in, nothing polls. */
    user_decides("/__device/approve", p.user_code);
    sf_test_sleep_ms(2500); /* two intervals and more */
    CHECK_EQ_INT(oauth_stat("/__device/stats", "polls"), polls_after);
    sf_session_state state;
    CHECK_CODE(sf_session_state_get(runtime, &state), SF_OK);
    CHECK_EQ_INT(state, SF_LOGGED_OUT);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_sign_in_cancel_inside_on_prompt_and_before_the_start(void) {
    NEED_SERVER(base);
    device_config(1, 60);
    sf_runtime *runtime = server_runtime(base);
    long polls_before = oauth_stat("/__device/stats", "polls");
    probe p;
    sf_sign_in_options options;
    sf_sign_in_options_init(&options);
    options.issuer = base;
    sf_sign_in_observer observer = probe_observer(&p);
    atomic_store(&p.cancel_in_prompt, 1);
    /* The handle must be known to on_prompt: it runs after an HTTP round trip, long after
     * the call returned. */
    sf_sign_in handle = 0;
    CHECK_CODE(sf_session_sign_in_device(runtime, &options, &observer, &handle), SF_OK);
    atomic_store(&p.handle, handle);
    check_finished_once(&p);
    CHECK_EQ_INT(atomic_load(&p.prompts), 1);
    CHECK_EQ_INT(atomic_load(&p.cancel_in_prompt_result), SF_OK);
    CHECK_EQ_INT(atomic_load(&p.result), SF_ECANCELLED);
    sf_test_sleep_ms(1500);
    CHECK_EQ_INT(oauth_stat("/__device/stats", "polls"), polls_before); /* never polled */

    /* Cancelled right after the start: no prompt, ECANCELLED. */
    probe q;
    CHECK_CODE(start_device(runtime, base, &q), SF_OK);
    CHECK_CODE(sf_sign_in_cancel(atomic_load(&q.handle)), SF_OK);
    check_finished_once(&q);
    CHECK_EQ_INT(atomic_load(&q.prompts), 0);
    CHECK_EQ_INT(atomic_load(&q.result), SF_ECANCELLED);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_sign_in_discovery_refused_is_econfig_naming_the_member(void) {
    NEED_SERVER(base);
    device_config(1, 60);
    CHECK_EQ_INT(oauth_post("/__fault", "endpoint=metadata&mode=set:issuer=https://other.example&count=1"), 200);
    sf_runtime *runtime = server_runtime(base);
    probe p;
    CHECK_CODE(start_device(runtime, base, &p), SF_OK);
    check_finished_once(&p);
    CHECK_EQ_INT(atomic_load(&p.prompts), 0);
    CHECK_EQ_INT(atomic_load(&p.result), SF_ECONFIG);
    CHECK(strstr(p.message, "issuer") != NULL);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_sign_in_bad_input_calls_nothing(void) {
    probe p;
    sf_sign_in_observer observer = probe_observer(&p);
    sf_sign_in handle = 0;
    sf_sign_in_options options;
    sf_sign_in_options_init(&options);
    CHECK_EQ_INT(options.size, sizeof options);
    CHECK_EQ_INT(options.timeout_ms, 300000);
    options.issuer = "http://127.0.0.1:9";
    sf_options_init(NULL);
    sf_sign_in_options_init(NULL); /* ignored */

    sf_options runtime_options;
    sf_options_init(&runtime_options);
    runtime_options.client_id = "sessionflow-public";
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&runtime_options, &runtime), SF_OK);

    CHECK_CODE(sf_session_sign_in_device(NULL, &options, &observer, &handle), SF_EINVAL);
    CHECK_CODE(sf_session_sign_in_device(runtime, &options, NULL, &handle), SF_EINVAL);
    CHECK_CODE(sf_session_sign_in_device(runtime, &options, &observer, NULL), SF_EINVAL);
    /* Neither an issuer nor the runtime's endpoints. */
    CHECK_CODE(sf_session_sign_in_device(runtime, NULL, &observer, &handle), SF_EINVAL);
    sf_sign_in_options bad = options;
    bad.size = 0;
    CHECK_CODE(sf_session_sign_in_device(runtime, &bad, &observer, &handle), SF_EINVAL);
    bad = options;
    bad.issuer = "ftp://127.0.0.1/";
    CHECK_CODE(sf_session_sign_in_device(runtime, &bad, &observer, &handle), SF_EINVAL);
    bad.issuer = "http://example.com"; /* plain http, not loopback */
    CHECK_CODE(sf_session_sign_in_device(runtime, &bad, &observer, &handle), SF_EINVAL);
    bad.issuer = "not a url";
    CHECK_CODE(sf_session_sign_in_device(runtime, &bad, &observer, &handle), SF_EINVAL);
    bad = options;
    bad.device_authorization_endpoint = "http://example.com/device";
    CHECK_CODE(sf_session_sign_in_device(runtime, &bad, &observer, &handle), SF_EINVAL);
    CHECK_EQ_INT(handle, 0); /* untouched */

    /* An issuer needs sf_options.client_id. */
    sf_runtime *no_client = NULL;
    CHECK_CODE(sf_runtime_create(NULL, &no_client), SF_OK);
    CHECK_CODE(sf_session_sign_in_device(no_client, &options, &observer, &handle), SF_EINVAL);
    CHECK_CODE(sf_runtime_destroy(no_client), SF_OK);

    /* Signed in already: SF_ESTATE. */
    sf_tokens tokens = test_tokens("access", "refresh", 3600, "bob");
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    CHECK_CODE(sf_session_sign_in_device(runtime, &options, &observer, &handle), SF_ESTATE);

    CHECK_CODE(sf_sign_in_cancel(0), SF_ECLOSED);
    CHECK_CODE(sf_sign_in_cancel(UINT64_C(1) << 60), SF_ECLOSED);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_CODE(sf_session_sign_in_device(runtime, &options, &observer, &handle), SF_ECLOSED);
    CHECK_EQ_INT(handle, 0);
    sf_test_sleep_ms(20);
    CHECK_EQ_INT(atomic_load(&p.prompts) + atomic_load(&p.dones) + atomic_load(&p.releases), 0);
}

void test_sign_in_destroy_with_a_sign_in_running(void) {
    NEED_SERVER(base);
    device_config(1, 60);
    /* Waiting for the user. */
    sf_runtime *runtime = server_runtime(base);
    probe p;
    CHECK_CODE(start_device(runtime, base, &p), SF_OK);
    WAIT_FOR(atomic_load(&p.prompts) == 1);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    /* Owned runtime: done and released before destroy returned. */
    CHECK_EQ_INT(atomic_load(&p.dones), 1);
    CHECK_EQ_INT(atomic_load(&p.releases), 1);
    CHECK_EQ_INT(atomic_load(&p.result), SF_ESHUTDOWN);
    check_finished_once(&p);

    /* Destroyed right after the start (discovery in flight, or not yet started). */
    runtime = server_runtime(base);
    probe q;
    CHECK_CODE(start_device(runtime, base, &q), SF_OK);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_EQ_INT(atomic_load(&q.dones), 1);
    CHECK_EQ_INT(atomic_load(&q.releases), 1);
    CHECK(atomic_load(&q.result) == SF_ESHUTDOWN || atomic_load(&q.result) == SF_ECANCELLED);
    check_finished_once(&q);
}

/* ---- Borrowed loop: the host's thread runs the loop; the sign-in lives on it ---------- */

typedef struct sign_in_host {
    uv_loop_t loop;
    uv_timer_t script;
    sf_runtime *runtime;
    const char *base;
    pthread_t test_thread;
    pthread_t thread;
    probe first, second;
    int step;
    int start_first, logout_result, start_second, destroy_result;
    int dones_inside_destroy;
    int run_returned, close_result;
    atomic_int started_first; /* the first probe is set up: the test thread may read it */
} sign_in_host;

static void sign_in_script(uv_timer_t *timer) {
    sign_in_host *h = timer->data;
    switch (h->step) {
    case 0: /* on the loop thread: start; the test thread plays the user */
        h->start_first = start_device(h->runtime, h->base, &h->first);
        h->first.main_thread = h->test_thread;
        atomic_store(&h->started_first, 1);
        h->step = 1;
        break;
    case 1: /* signed in: log out, start again */
        if (atomic_load(&h->first.releases) == 1) {
            h->logout_result = sf_session_logout(h->runtime);
            h->start_second = start_device(h->runtime, h->base, &h->second);
            h->second.main_thread = h->test_thread;
            h->step = 2;
        }
        break;
    case 2: /* waiting for the user: destroy; its teardown runs on a later iteration */
        if (atomic_load(&h->second.prompts) == 1) {
            h->destroy_result = sf_runtime_destroy(h->runtime);
            h->dones_inside_destroy = atomic_load(&h->second.dones) + atomic_load(&h->second.releases);
            uv_close((uv_handle_t *)&h->script, NULL);
            h->step = 3;
        }
        break;
    }
}

static void *sign_in_host_thread(void *arg) {
    sign_in_host *h = arg;
    uv_loop_init(&h->loop);
    uv_timer_init(&h->loop, &h->script);
    h->script.data = h;
    uv_timer_start(&h->script, sign_in_script, 5, 5);
    sf_options options;
    sf_options_init(&options);
    char token[256], introspect[256];
    snprintf(token, sizeof token, "%s/oauth/token", h->base);
    snprintf(introspect, sizeof introspect, "%s/oauth/introspect", h->base);
    options.token_endpoint = token;
    options.introspection_endpoint = introspect;
    options.client_id = "sessionflow-public";
    CHECK_CODE(sf_runtime_create_on_loop(&h->loop, &options, &h->runtime), SF_OK);
    uv_run(&h->loop, UV_RUN_DEFAULT);
    h->run_returned = 1;
    h->close_result = uv_loop_close(&h->loop);
    return NULL;
}

void test_sign_in_on_a_borrowed_loop_and_its_teardown(void) {
    NEED_SERVER(base);
    device_config(1, 60);
    sign_in_host *h = calloc(1, sizeof *h);
    h->base = base;
    h->test_thread = pthread_self();
    pthread_create(&h->thread, NULL, sign_in_host_thread, h);
    WAIT_FOR(atomic_load(&h->started_first));
    WAIT_FOR(atomic_load(&h->first.prompts) == 1);
    CHECK_EQ_INT(atomic_load(&h->first.prompts), 1);
    user_decides("/__device/approve", h->first.user_code);
    pthread_join(h->thread, NULL);
    CHECK_CODE(h->start_first, SF_OK);
    CHECK_EQ_INT(atomic_load(&h->first.result), SF_OK);
    CHECK(pthread_equal(h->first.done_thread, h->thread));
    CHECK_CODE(h->logout_result, SF_OK);
    CHECK_CODE(h->start_second, SF_OK);
    CHECK_CODE(h->destroy_result, SF_OK);
    CHECK_EQ_INT(h->dones_inside_destroy, 0); /* never inside the destroy call */
    CHECK_EQ_INT(atomic_load(&h->second.dones), 1); /* but before uv_run returned */
    CHECK_EQ_INT(atomic_load(&h->second.releases), 1);
    CHECK_EQ_INT(atomic_load(&h->second.result), SF_ESHUTDOWN);
    CHECK(pthread_equal(h->second.done_thread, h->thread));
    CHECK(h->run_returned);
    CHECK_EQ_INT(h->close_result, 0);
    check_finished_once(&h->first);
    check_finished_once(&h->second);
    free(h);
}
