/* The browser sign-in (authorization code + PKCE on a loopback redirect) through the C API
 * against the real test server: the test plays the browser (it follows the authorization
 * URL, submits the consent form and follows the redirect to the library's listener). */
#define _DEFAULT_SOURCE
#include "harness.h"
#include "oauth_fixture.h"

#include <stdlib.h>

typedef struct browser_probe {
    atomic_int prompts;
    atomic_int dones;
    atomic_int releases;
    atomic_int result;
    atomic_int after_release;
    atomic_int on_main_thread;
    atomic_int prompt_not_browser;
    _Atomic(sf_sign_in) handle;
    pthread_t main_thread;
    int no_start_page; /* the sign-in was started with it: the prompt has no start URL */
    sf_sign_in out;            /* the starting call's *out: written before any callback runs */
    sf_sign_in seen_in_prompt; /* `out` as on_prompt read it (plainly: TSan sees a race) */
    char authorization_url[4096];
    char redirect_uri[512];
    int64_t expires_in_ms;
    int64_t interval_ms;
    char message[1024];
} browser_probe;

static void note(browser_probe *p) {
    if (pthread_equal(pthread_self(), p->main_thread)) atomic_fetch_add(&p->on_main_thread, 1);
    if (atomic_load(&p->releases)) atomic_fetch_add(&p->after_release, 1);
}

static void on_prompt(const sf_sign_in_prompt *prompt, void *userdata) {
    browser_probe *p = userdata;
    note(p);
    if (prompt->size < sizeof *prompt || !prompt->authorization_url || !prompt->redirect_uri || prompt->user_code ||
        prompt->verification_uri || prompt->verification_uri_complete)
        atomic_fetch_add(&p->prompt_not_browser, 1);
    /* The start URL: the listener's /start, nothing of the state in it (issue 29, point 4);
     * none with no_start_page. */
    if (p->no_start_page ? prompt->start_url != NULL
                         : !prompt->start_url || strncmp(prompt->start_url, "http://127.0.0.1:", 17) != 0 ||
                               strstr(prompt->start_url, "/start") == NULL || strstr(prompt->start_url, "state=") != NULL)
        atomic_fetch_add(&p->prompt_not_browser, 1);
    p->seen_in_prompt = p->out;
    snprintf(p->authorization_url, sizeof p->authorization_url, "%s",
             prompt->authorization_url ? prompt->authorization_url : "");
    snprintf(p->redirect_uri, sizeof p->redirect_uri, "%s", prompt->redirect_uri ? prompt->redirect_uri : "");
    p->expires_in_ms = prompt->expires_in_ms;
    p->interval_ms = prompt->interval_ms;
    atomic_fetch_add(&p->prompts, 1);
}

static void on_done(int result, const char *message, void *userdata) {
    browser_probe *p = userdata;
    note(p);
    snprintf(p->message, sizeof p->message, "%s", message ? message : "(null)");
    atomic_store(&p->result, result);
    atomic_fetch_add(&p->dones, 1);
}

static void on_release(void *userdata) {
    browser_probe *p = userdata;
    note(p);
    atomic_fetch_add(&p->releases, 1);
}

static int start_browser_with(sf_runtime *runtime, const char *issuer, int64_t timeout_ms, int no_start_page,
                              browser_probe *p) {
    memset(p, 0, sizeof *p);
    p->main_thread = pthread_self();
    p->no_start_page = no_start_page;
    atomic_store(&p->result, 1);
    sf_sign_in_observer observer;
    memset(&observer, 0, sizeof observer);
    observer.on_prompt = on_prompt;
    observer.on_done = on_done;
    observer.release = on_release;
    observer.userdata = p;
    sf_sign_in_options options;
    sf_sign_in_options_init(&options);
    options.issuer = issuer;
    if (timeout_ms) options.timeout_ms = timeout_ms;
    CHECK_EQ_INT(options.no_start_page, 0); /* the default serves the start URL */
    options.no_start_page = no_start_page;
    int rc = sf_session_sign_in_browser(runtime, &options, &observer, &p->out);
    atomic_store(&p->handle, p->out);
    return rc;
}

static int start_browser(sf_runtime *runtime, const char *issuer, int64_t timeout_ms, browser_probe *p) {
    return start_browser_with(runtime, issuer, timeout_ms, 0, p);
}

static void check_finished_once(browser_probe *p) {
    WAIT_FOR(atomic_load(&p->releases) == 1);
    sf_test_sleep_ms(20);
    CHECK_EQ_INT(atomic_load(&p->dones), 1);
    CHECK_EQ_INT(atomic_load(&p->releases), 1);
    CHECK(atomic_load(&p->prompts) <= 1);
    CHECK_EQ_INT(atomic_load(&p->after_release), 0);
    CHECK_EQ_INT(atomic_load(&p->on_main_thread), 0);
    CHECK_EQ_INT(atomic_load(&p->prompt_not_browser), 0);
    CHECK_CODE(sf_sign_in_cancel(atomic_load(&p->handle)), SF_ECLOSED);
}

static sf_runtime *browser_runtime(const char *base) {
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

#define NEED_SERVER(base)              \
    const char *base = oauth_server(); \
    CHECK(base != NULL);               \
    if (!base) return

void test_sign_in_browser_approved_through_discovery(void) {
    NEED_SERVER(base);
    sf_runtime *runtime = browser_runtime(base);
    long exchanges = oauth_stat("/__authorize/stats", "code_exchanges");
    browser_probe p;
    CHECK_CODE(start_browser(runtime, base, 0, &p), SF_OK);
    WAIT_FOR(atomic_load(&p.prompts) == 1);
    CHECK_EQ_INT(atomic_load(&p.prompts), 1);
    /* The handle was in *out before on_prompt ran (on the loop thread). */
    CHECK(p.seen_in_prompt != 0 && p.seen_in_prompt == atomic_load(&p.handle));
    char authorize[256];
    snprintf(authorize, sizeof authorize, "%s/oauth/authorize?", base);
    CHECK(strncmp(p.authorization_url, authorize, strlen(authorize)) == 0);
    CHECK(strstr(p.authorization_url, "code_challenge=") != NULL);
    CHECK(strstr(p.authorization_url, "code_challenge_method=S256") != NULL);
    CHECK(strncmp(p.redirect_uri, "http://127.0.0.1:", 17) == 0);
    CHECK(strstr(p.redirect_uri, "/callback") != NULL);
    CHECK_EQ_INT(p.expires_in_ms, 300000);
    CHECK_EQ_INT(p.interval_ms, -1);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 0);
    char page[4096];
    CHECK_EQ_INT(play_browser(p.authorization_url, "allow", page, sizeof page), 200);
    check_finished_once(&p);
    CHECK_EQ_INT(atomic_load(&p.result), SF_OK);
    CHECK(strcmp(p.message, "") == 0);
    sf_session_state state;
    CHECK_CODE(sf_session_state_get(runtime, &state), SF_OK);
    CHECK_EQ_INT(state, SF_LOGGED_IN);
    char member[64];
    CHECK_CODE(sf_session_member_id(runtime, member, sizeof member), SF_OK);
    CHECK(strcmp(member, "alice") == 0);
    CHECK_EQ_INT(oauth_stat("/__authorize/stats", "code_exchanges"), exchanges + 1);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

/* A host that shows the person authorization_url sets no_start_page: the prompt has no start
 * URL, and /start is not found (nothing legitimate would fetch it, so another local program
 * could, once and unnoticed, to read the state). Fetched anyway, it reveals nothing and does
 * not end the sign-in, which the authorization URL completes. */
void test_sign_in_browser_without_start_page(void) {
    NEED_SERVER(base);
    sf_runtime *runtime = browser_runtime(base);
    browser_probe p;
    CHECK_CODE(start_browser_with(runtime, base, 0, 1, &p), SF_OK);
    WAIT_FOR(atomic_load(&p.prompts) == 1);
    CHECK_EQ_INT(atomic_load(&p.prompt_not_browser), 0);
    char start[600];
    const char *callback = strstr(p.redirect_uri, "/callback");
    CHECK(callback != NULL);
    if (!callback) return;
    snprintf(start, sizeof start, "%.*s/start", (int)(callback - p.redirect_uri), p.redirect_uri);
    for (int i = 0; i < 2; i++) {
        char body[2048], location[1024];
        CHECK_EQ_INT(http_request(start, NULL, body, sizeof body, location, sizeof location), 404);
        CHECK(strcmp(location, "") == 0);
        CHECK(strstr(body, "state=") == NULL);
    }
    char page[4096];
    CHECK_EQ_INT(play_browser(p.authorization_url, "allow", page, sizeof page), 200);
    check_finished_once(&p);
    CHECK_EQ_INT(atomic_load(&p.result), SF_OK);
    sf_session_state state;
    CHECK_CODE(sf_session_state_get(runtime, &state), SF_OK);
    CHECK_EQ_INT(state, SF_LOGGED_IN);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_sign_in_browser_denied_is_edenied(void) {
    NEED_SERVER(base);
    sf_runtime *runtime = browser_runtime(base);
    browser_probe p;
    CHECK_CODE(start_browser(runtime, base, 0, &p), SF_OK);
    WAIT_FOR(atomic_load(&p.prompts) == 1);
    play_browser(p.authorization_url, "deny", NULL, 0);
    check_finished_once(&p);
    CHECK_EQ_INT(atomic_load(&p.result), SF_EDENIED);
    CHECK(strlen(p.message) > 0);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_sign_in_browser_timeout_is_eexpired(void) {
    NEED_SERVER(base);
    sf_runtime *runtime = browser_runtime(base);
    browser_probe p;
    CHECK_CODE(start_browser(runtime, base, 1000, &p), SF_OK);
    WAIT_FOR(atomic_load(&p.dones) == 1);
    check_finished_once(&p);
    CHECK_EQ_INT(atomic_load(&p.prompts), 1);
    CHECK_EQ_INT(p.expires_in_ms, 1000);
    CHECK_EQ_INT(atomic_load(&p.result), SF_EEXPIRED);
    /* The listener is closed: the browser coming back late finds no one. */
    CHECK(http_request(p.redirect_uri, NULL, NULL, 0, NULL, 0) != 200);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_sign_in_browser_cancelled_closes_the_listener(void) {
    NEED_SERVER(base);
    sf_runtime *runtime = browser_runtime(base);
    long exchanges = oauth_stat("/__authorize/stats", "code_exchanges");
    browser_probe p;
    CHECK_CODE(start_browser(runtime, base, 0, &p), SF_OK);
    WAIT_FOR(atomic_load(&p.prompts) == 1);
    CHECK_CODE(sf_sign_in_cancel(atomic_load(&p.handle)), SF_OK);
    CHECK_CODE(sf_sign_in_cancel(atomic_load(&p.handle)), SF_ECLOSED);
    check_finished_once(&p);
    CHECK_EQ_INT(atomic_load(&p.result), SF_ECANCELLED);
    /* The user consents after the cancel: the redirect finds no listener, no code is redeemed. */
    CHECK(play_browser(p.authorization_url, "allow", NULL, 0) != 200);
    sf_test_sleep_ms(200);
    CHECK_EQ_INT(oauth_stat("/__authorize/stats", "code_exchanges"), exchanges);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_sign_in_browser_bad_input_and_destroy(void) {
    NEED_SERVER(base);
    sf_runtime *runtime = browser_runtime(base);
    browser_probe p;
    CHECK_CODE(start_browser(runtime, base, -5, &p), SF_EINVAL);
    CHECK_CODE(start_browser(runtime, NULL, 0, &p), SF_EINVAL); /* no authorization endpoint */
    CHECK_CODE(start_browser(runtime, "ftp://127.0.0.1/", 0, &p), SF_EINVAL);
    sf_test_sleep_ms(20);
    CHECK_EQ_INT(atomic_load(&p.prompts) + atomic_load(&p.dones) + atomic_load(&p.releases), 0);
    /* Destroyed while waiting for the browser: done (SF_ESHUTDOWN) and released before destroy returns. */
    CHECK_CODE(start_browser(runtime, base, 0, &p), SF_OK);
    WAIT_FOR(atomic_load(&p.prompts) == 1);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_EQ_INT(atomic_load(&p.dones), 1);
    CHECK_EQ_INT(atomic_load(&p.releases), 1);
    CHECK_EQ_INT(atomic_load(&p.result), SF_ESHUTDOWN);
    check_finished_once(&p);
    CHECK(http_request(p.redirect_uri, NULL, NULL, 0, NULL, 0) != 200);
}
