/* The access token's details (sf_session_token_info, sf_session_token_scope) against the real
 * test server: a device sign-in asking "read write" while the server grants only "read"
 * (POST /__resource/config grant_scope=read) reports "read"; a refresh keeps it; the expiry
 * on both clocks; bad arguments. */
#define _DEFAULT_SOURCE
#include "harness.h"
#include "oauth_fixture.h"

#include <stdint.h>
#include <stdlib.h>
#include <time.h>

typedef struct device_probe {
    atomic_int prompts;
    atomic_int dones;
    atomic_int releases;
    atomic_int result;
    char user_code[128];
} device_probe;

static void on_prompt(const sf_sign_in_prompt *prompt, void *userdata) {
    device_probe *p = userdata;
    snprintf(p->user_code, sizeof p->user_code, "%s", prompt->user_code ? prompt->user_code : "");
    atomic_fetch_add(&p->prompts, 1); /* last: the test reads the code once it sees this */
}

static void on_done(int result, const char *message, void *userdata) {
    (void)message;
    device_probe *p = userdata;
    atomic_store(&p->result, result);
    atomic_fetch_add(&p->dones, 1);
}

static void on_release(void *userdata) {
    device_probe *p = userdata;
    atomic_fetch_add(&p->releases, 1);
}

typedef struct refresh_answer {
    atomic_int calls;
    atomic_int result;
} refresh_answer;

static void on_refreshed(int result, const char *access_token, void *userdata) {
    (void)access_token;
    refresh_answer *a = userdata;
    atomic_store(&a->result, result);
    atomic_fetch_add(&a->calls, 1);
}

static int64_t now_unix_ms(void) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

/* Signs `runtime` in with the device flow at `base`, asking `scope`, approved by alice. */
static void device_sign_in(sf_runtime *runtime, const char *base, const char *scope) {
    CHECK_EQ_INT(oauth_post("/__device/config", "reset=1&interval=1&expires_in=60"), 200);
    sf_sign_in_options options;
    sf_sign_in_options_init(&options);
    options.issuer = base;
    options.scope = scope;
    device_probe p;
    memset(&p, 0, sizeof p);
    atomic_store(&p.result, 1);
    sf_sign_in_observer observer;
    memset(&observer, 0, sizeof observer);
    observer.on_prompt = on_prompt;
    observer.on_done = on_done;
    observer.release = on_release;
    observer.userdata = &p;
    sf_sign_in handle = 0;
    CHECK_CODE(sf_session_sign_in_device(runtime, &options, &observer, &handle), SF_OK);
    WAIT_FOR(atomic_load(&p.prompts) == 1);
    char code[256], form[300];
    form_encode(p.user_code, code, sizeof code);
    snprintf(form, sizeof form, "user_code=%s", code);
    CHECK_EQ_INT(oauth_post("/__device/approve", form), 200);
    WAIT_FOR(atomic_load(&p.releases) == 1);
    CHECK_EQ_INT(atomic_load(&p.dones), 1);
    CHECK_EQ_INT(atomic_load(&p.result), SF_OK);
}

static sf_runtime *server_runtime(const char *base) {
    char token[256];
    snprintf(token, sizeof token, "%s/oauth/token", base);
    sf_options options;
    sf_options_init(&options);
    options.token_endpoint = token;
    options.client_id = "sessionflow-public";
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    return runtime;
}

void test_token_info_a_narrower_scope_is_reported_as_granted(void) {
    const char *base = oauth_server();
    CHECK(base != NULL);
    if (!base) return;
    CHECK_EQ_INT(oauth_post("/__resource/config", "grant_scope=read"), 200);
    sf_runtime *runtime = server_runtime(base);
    if (!runtime) return;

    /* Signed out: no token, no scope. */
    sf_token_info info;
    memset(&info, 0, sizeof info);
    info.size = sizeof info;
    CHECK_CODE(sf_session_token_info(runtime, &info), SF_ESTATE);
    char scope[64] = "untouched";
    CHECK_CODE(sf_session_token_scope(runtime, scope, sizeof scope), SF_OK);
    CHECK(strcmp(scope, "") == 0);

    device_sign_in(runtime, base, "read write");
    CHECK_CODE(sf_session_token_scope(runtime, scope, sizeof scope), SF_OK);
    CHECK(strcmp(scope, "read") == 0);
    memset(&info, 0x5a, sizeof info);
    info.size = sizeof info;
    int64_t before = now_unix_ms();
    CHECK_CODE(sf_session_token_info(runtime, &info), SF_OK);
    CHECK_EQ_INT(info.size, sizeof info);
    CHECK(strcmp(info.token_type, "Bearer") == 0);
    CHECK(info.expires_in_ms > 3500 * 1000 && info.expires_in_ms <= 3600 * 1000);
    CHECK(llabs(info.expires_at_unix_ms - (before + info.expires_in_ms)) < 5000);

    /* The buffer convention of sf_session_member_id. */
    char small[4] = "abc";
    CHECK_CODE(sf_session_token_scope(runtime, small, sizeof small), SF_ERANGE);
    CHECK(strcmp(small, "abc") == 0); /* nothing written */
    char exact[5];
    CHECK_CODE(sf_session_token_scope(runtime, exact, sizeof exact), SF_OK);
    CHECK(strcmp(exact, "read") == 0);

    /* A refresh (its answer says "read" again) keeps it. */
    long refreshes = oauth_stat("/__stats", "refresh_grants");
    refresh_answer answer;
    memset(&answer, 0, sizeof answer);
    CHECK_CODE(sf_session_refresh_now(runtime, on_refreshed, &answer), SF_OK);
    WAIT_FOR(atomic_load(&answer.calls) == 1);
    CHECK_EQ_INT(atomic_load(&answer.result), SF_OK);
    CHECK_EQ_INT(oauth_stat("/__stats", "refresh_grants"), refreshes + 1);
    CHECK_CODE(sf_session_token_scope(runtime, scope, sizeof scope), SF_OK);
    CHECK(strcmp(scope, "read") == 0);

    /* Logged out: SF_ESTATE, and no scope. */
    CHECK_CODE(sf_session_logout(runtime), SF_OK);
    CHECK_CODE(sf_session_token_info(runtime, &info), SF_ESTATE);
    CHECK_CODE(sf_session_token_scope(runtime, scope, sizeof scope), SF_OK);
    CHECK(strcmp(scope, "") == 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_CODE(sf_session_token_info(runtime, &info), SF_ECLOSED);
    CHECK_CODE(sf_session_token_scope(runtime, scope, sizeof scope), SF_ECLOSED);
    /* Empty: as asked again, for the tests that follow. */
    CHECK_EQ_INT(oauth_post("/__resource/config", "grant_scope="), 200);
}

void test_token_info_the_scope_asked_for_when_granted_whole(void) {
    const char *base = oauth_server();
    CHECK(base != NULL);
    if (!base) return;
    CHECK_EQ_INT(oauth_post("/__resource/config", "grant_scope="), 200);
    sf_runtime *runtime = server_runtime(base);
    if (!runtime) return;
    device_sign_in(runtime, base, "read write");
    char scope[64];
    CHECK_CODE(sf_session_token_scope(runtime, scope, sizeof scope), SF_OK);
    CHECK(strcmp(scope, "read write") == 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_token_info_bad_arguments_are_einval(void) {
    sf_token_info info;
    memset(&info, 0, sizeof info);
    info.size = sizeof info;
    char scope[16];
    CHECK_CODE(sf_session_token_info(NULL, &info), SF_EINVAL);
    CHECK_CODE(sf_session_token_scope(NULL, scope, sizeof scope), SF_EINVAL);
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(NULL, &runtime), SF_OK);
    if (!runtime) return;
    CHECK_CODE(sf_session_token_info(runtime, NULL), SF_EINVAL);
    CHECK_CODE(sf_session_token_scope(runtime, NULL, 16), SF_EINVAL);
    /* Signed in with sf_tokens (no scope): the details, and "" for the scope. */
    sf_tokens tokens = test_tokens("access-token-info", "refresh-token-info", 600, "member");
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    info.size = sizeof info - 1;
    CHECK_CODE(sf_session_token_info(runtime, &info), SF_EINVAL);
    info.size = 0;
    CHECK_CODE(sf_session_token_info(runtime, &info), SF_EINVAL);
    info.size = sizeof info + 8;
    CHECK_CODE(sf_session_token_info(runtime, &info), SF_EINVAL);
    info.size = sizeof info;
    CHECK_CODE(sf_session_token_info(runtime, &info), SF_OK);
    CHECK(strcmp(info.token_type, "Bearer") == 0);
    CHECK(info.expires_in_ms > 590 * 1000 && info.expires_in_ms <= 600 * 1000);
    CHECK(info.expires_at_unix_ms > now_unix_ms());
    CHECK_CODE(sf_session_token_scope(runtime, scope, sizeof scope), SF_OK);
    CHECK(strcmp(scope, "") == 0);
    CHECK_CODE(sf_session_token_scope(runtime, scope, 0), SF_ERANGE);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}
