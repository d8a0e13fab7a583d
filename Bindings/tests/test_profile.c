/* An account's profile (sf_session_account_profile) against the real test server: a device
 * sign-in through the issuer keeps issuer, client and scopes; a refresh whose answer names a
 * narrower scope replaces the granted one (POST /__resource/config grant_scope=read); a new
 * runtime on the same store reads it back from the sealed record (and the record's bytes do
 * not show it in the clear); bad arguments, unknown accounts and sessions without a profile. */
#define _DEFAULT_SOURCE
#include "harness.h"
#include "oauth_fixture.h"

#include <stdlib.h>
#include <unistd.h>

typedef struct profile_probe {
    atomic_int prompts;
    atomic_int dones;
    atomic_int releases;
    atomic_int result;
    char user_code[128];
} profile_probe;

static void on_prompt(const sf_sign_in_prompt *prompt, void *userdata) {
    profile_probe *p = userdata;
    snprintf(p->user_code, sizeof p->user_code, "%s", prompt->user_code ? prompt->user_code : "");
    atomic_fetch_add(&p->prompts, 1);
}

static void on_done(int result, const char *message, void *userdata) {
    (void)message;
    profile_probe *p = userdata;
    atomic_store(&p->result, result);
    atomic_fetch_add(&p->dones, 1);
}

static void on_release(void *userdata) {
    profile_probe *p = userdata;
    atomic_fetch_add(&p->releases, 1);
}

typedef struct refreshed {
    atomic_int calls;
    atomic_int result;
} refreshed;

static void on_refreshed(int result, const char *access_token, void *userdata) {
    (void)access_token;
    refreshed *a = userdata;
    atomic_store(&a->result, result);
    atomic_fetch_add(&a->calls, 1);
}

static sf_runtime *store_runtime(const char *base, const char *directory) {
    char token[256];
    snprintf(token, sizeof token, "%s/oauth/token", base);
    sf_options options;
    sf_options_init(&options);
    options.token_endpoint = token;
    options.client_id = "sessionflow-public";
    options.store_directory = directory;
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    return runtime;
}

static void sign_in_through_issuer(sf_runtime *runtime, const char *base, const char *scope) {
    CHECK_EQ_INT(oauth_post("/__device/config", "reset=1&interval=1&expires_in=60"), 200);
    sf_sign_in_options options;
    sf_sign_in_options_init(&options);
    options.issuer = base;
    options.scope = scope;
    profile_probe p;
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
    CHECK_EQ_INT(atomic_load(&p.result), SF_OK);
}

/* Field `field` of `account`'s profile ("<code N>" when the call fails). */
static const char *field_of(sf_runtime *runtime, const char *account, sf_profile_field field, char *buffer, size_t length) {
    int rc = sf_session_account_profile(runtime, account, field, buffer, length, NULL);
    if (rc != SF_OK) snprintf(buffer, length, "<code %d>", rc);
    return buffer;
}

/* Whether any file under `directory` holds `text` in its bytes. */
static int store_shows(const char *directory, const char *text) {
    char command[512];
    snprintf(command, sizeof command, "grep -rqF -- '%s' '%s'", text, directory);
    return system(command) == 0;
}

void test_profile_kept_from_the_issuer_narrowed_by_a_refresh_and_sealed(void) {
    const char *base = oauth_server();
    CHECK(base != NULL);
    if (!base) return;
    CHECK_EQ_INT(oauth_post("/__resource/config", "grant_scope="), 200);
    char directory[64] = "/tmp/sf-profile-XXXXXX";
    CHECK(mkdtemp(directory) != NULL);
    char store[80];
    snprintf(store, sizeof store, "%s/store", directory);
    sf_runtime *runtime = store_runtime(base, store);
    if (!runtime) return;
    char value[256];
    size_t needed = 12345;

    /* No one signed in: no active account, so no profile. */
    CHECK_CODE(sf_session_account_profile(runtime, NULL, SF_PROFILE_ISSUER, value, sizeof value, &needed), SF_ESTATE);

    sign_in_through_issuer(runtime, base, "read write");
    CHECK(strcmp(field_of(runtime, NULL, SF_PROFILE_ISSUER, value, sizeof value), base) == 0);
    CHECK(strcmp(field_of(runtime, NULL, SF_PROFILE_CLIENT_ID, value, sizeof value), "sessionflow-public") == 0);
    CHECK(strcmp(field_of(runtime, NULL, SF_PROFILE_REQUESTED_SCOPE, value, sizeof value), "read write") == 0);
    CHECK(strcmp(field_of(runtime, NULL, SF_PROFILE_GRANTED_SCOPE, value, sizeof value), "read write") == 0);
    /* By its key: the same. */
    char key[64];
    CHECK_CODE(sf_session_active_account(runtime, key, sizeof key), SF_OK);
    CHECK(strcmp(key, "alice") == 0);
    CHECK(strcmp(field_of(runtime, key, SF_PROFILE_ISSUER, value, sizeof value), base) == 0);

    /* The size, asked with a NULL buffer; too small a buffer: SF_ERANGE, nothing written. */
    CHECK_CODE(sf_session_account_profile(runtime, key, SF_PROFILE_ISSUER, NULL, 0, &needed), SF_ERANGE);
    CHECK_EQ_INT((int)needed, (int)strlen(base) + 1);
    char small[8] = "abcdefg";
    CHECK_CODE(sf_session_account_profile(runtime, key, SF_PROFILE_ISSUER, small, sizeof small, &needed), SF_ERANGE);
    CHECK(strcmp(small, "abcdefg") == 0);
    char exact[256];
    CHECK_CODE(sf_session_account_profile(runtime, key, SF_PROFILE_ISSUER, exact, strlen(base) + 1, NULL), SF_OK);
    CHECK(strcmp(exact, base) == 0);

    /* Bad input: SF_EINVAL, named. */
    CHECK_CODE(sf_session_account_profile(runtime, "nobody", SF_PROFILE_ISSUER, value, sizeof value, NULL), SF_EINVAL);
    CHECK(strstr(sf_last_error_message(), "nobody") != NULL);
    CHECK_CODE(sf_session_account_profile(runtime, key, (sf_profile_field)7, value, sizeof value, NULL), SF_EINVAL);
    CHECK(strstr(sf_last_error_message(), "field") != NULL);
    CHECK_CODE(sf_session_account_profile(runtime, key, SF_PROFILE_ISSUER, NULL, 16, NULL), SF_EINVAL);

    /* The server now grants only "read": the refresh's answer says so, and the profile follows. */
    CHECK_EQ_INT(oauth_post("/__resource/config", "grant_scope=read"), 200);
    long refreshes = oauth_stat("/__stats", "refresh_grants");
    refreshed answer;
    memset(&answer, 0, sizeof answer);
    CHECK_CODE(sf_session_refresh_now(runtime, on_refreshed, &answer), SF_OK);
    WAIT_FOR(atomic_load(&answer.calls) == 1);
    CHECK_EQ_INT(atomic_load(&answer.result), SF_OK);
    CHECK_EQ_INT(oauth_stat("/__stats", "refresh_grants"), refreshes + 1);
    CHECK(strcmp(field_of(runtime, NULL, SF_PROFILE_GRANTED_SCOPE, value, sizeof value), "read") == 0);
    CHECK(strcmp(field_of(runtime, NULL, SF_PROFILE_REQUESTED_SCOPE, value, sizeof value), "read write") == 0);
    CHECK_EQ_INT(oauth_post("/__resource/config", "grant_scope="), 200);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_CODE(sf_session_account_profile(runtime, NULL, SF_PROFILE_ISSUER, value, sizeof value, NULL), SF_ECLOSED);

    /* Another runtime on the store: the profile comes from the record, the refresh's scope in it;
     * the record is sealed (the issuer's address is not in the store's bytes). */
    CHECK(!store_shows(store, "sessionflow-public"));
    sf_runtime *again = store_runtime(base, store);
    if (!again) return;
    WAIT_FOR(sf_session_account_profile(again, "alice", SF_PROFILE_ISSUER, value, sizeof value, NULL) == SF_OK);
    CHECK(strcmp(value, base) == 0);
    CHECK(strcmp(field_of(again, "alice", SF_PROFILE_CLIENT_ID, value, sizeof value), "sessionflow-public") == 0);
    CHECK(strcmp(field_of(again, "alice", SF_PROFILE_GRANTED_SCOPE, value, sizeof value), "read") == 0);
    CHECK(strcmp(field_of(again, "alice", SF_PROFILE_REQUESTED_SCOPE, value, sizeof value), "read write") == 0);
    CHECK_CODE(sf_session_logout(again), SF_OK);
    CHECK_CODE(sf_session_account_profile(again, "alice", SF_PROFILE_ISSUER, value, sizeof value, NULL), SF_EINVAL);
    CHECK_CODE(sf_runtime_destroy(again), SF_OK);
    char command[128];
    snprintf(command, sizeof command, "rm -rf '%s'", directory);
    CHECK_EQ_INT(system(command), 0);
}

void test_profile_none_for_bare_tokens_and_bad_handles(void) {
    char value[64];
    CHECK_CODE(sf_session_account_profile(NULL, NULL, SF_PROFILE_ISSUER, value, sizeof value, NULL), SF_EINVAL);
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(NULL, &runtime), SF_OK);
    if (!runtime) return;
    sf_tokens tokens = test_tokens("access-profile", "refresh-profile", 600, "member");
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    /* Signed in with sf_tokens: the account is there, its profile is not. */
    strcpy(value, "untouched");
    CHECK_CODE(sf_session_account_profile(runtime, NULL, SF_PROFILE_ISSUER, value, sizeof value, NULL), SF_ESTATE);
    CHECK(strstr(sf_last_error_message(), "no profile") != NULL);
    CHECK(strcmp(value, "untouched") == 0);
    CHECK_CODE(sf_session_account_profile(runtime, "member", SF_PROFILE_CLIENT_ID, value, sizeof value, NULL), SF_ESTATE);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_CODE(sf_session_account_profile(runtime, NULL, SF_PROFILE_ISSUER, value, sizeof value, NULL), SF_ECLOSED);
}
