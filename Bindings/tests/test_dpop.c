/* DPoP (RFC 9449) through the C API: sf_options.dpop is checked; a host that signed in by
 * itself hands its DPoP key over in sf_tokens.dpop_key; the session's refresh then carries a
 * proof (the test server binds the new tokens to the key) and sf_session_authorize answers
 * scheme "DPoP" with `Authorization: DPoP <token>` and a `DPoP` proof the resource accepts. */
#define _DEFAULT_SOURCE
#include <stdlib.h>
#include <sys/random.h>

#include "harness.h"
#include "oauth_fixture.h"

/* A random P-256 private key as base64url text (43 characters): 32 random bytes are a valid
 * scalar but for a chance of 2^-32. */
void dpop_test_key(char out[44], unsigned char raw[32]) {
    static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    CHECK_EQ_INT((int)getrandom(raw, 32, 0), 32);
    int at = 0;
    for (int i = 0; i < 32; i += 3) {
        unsigned v = (unsigned)raw[i] << 16 | (i + 1 < 32 ? (unsigned)raw[i + 1] << 8 : 0) | (i + 2 < 32 ? raw[i + 2] : 0);
        int chars = i + 2 < 32 ? 4 : 3;  /* 32 = 10 * 3 + 2: the last group is 2 bytes, 3 characters */
        for (int k = 0; k < chars; k++) out[at++] = alphabet[(v >> (18 - 6 * k)) & 63];
    }
    out[at] = 0;
}

typedef struct dpop_answer {
    atomic_int calls;
    atomic_int result;
    char scheme[16];
    char authorization[1024];
    char proof[2048];
    size_t header_count;
} dpop_answer;

static void on_dpop_authorized(int result, const sf_authorization *authorization, void *userdata) {
    dpop_answer *a = userdata;
    if (authorization) {
        snprintf(a->scheme, sizeof a->scheme, "%s", authorization->scheme);
        a->header_count = authorization->header_count;
        for (size_t i = 0; i < authorization->header_count; i++) {
            if (strcmp(authorization->headers[i].name, "Authorization") == 0)
                snprintf(a->authorization, sizeof a->authorization, "%s", authorization->headers[i].value);
            if (strcmp(authorization->headers[i].name, "DPoP") == 0)
                snprintf(a->proof, sizeof a->proof, "%s", authorization->headers[i].value);
        }
    }
    atomic_store(&a->result, result);
    atomic_fetch_add(&a->calls, 1);
}

static void on_token(int result, const char *token, void *userdata) {
    (void)token;
    atomic_int *calls = userdata;
    atomic_store(calls, result == SF_OK ? 1 : -1);
}

void test_dpop_options_and_a_bad_key_are_einval(void) {
    sf_options options;
    sf_options_init(&options);
    CHECK_EQ_INT(options.dpop, SF_DPOP_OFF);
    options.token_endpoint = "http://127.0.0.1:9/oauth/token";
    options.client_id = "sessionflow-public";
    options.dpop = 7;
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_EINVAL);
    CHECK(strstr(sf_last_error_message(), "sf_options.dpop") != NULL);
    options.dpop = SF_DPOP_REQUIRED;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    if (!runtime) return;
    sf_tokens tokens = test_tokens("access", "refresh", 3600, "alice");
    const char *bad[] = {"not a key", "", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA" /* 0: not a P-256 key */,
                         "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA" /* 44 characters */};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_CODE(sf_session_sign_in_dpop(runtime, &tokens, bad[i]), SF_EINVAL);
        CHECK(strstr(sf_last_error_message(), "dpop_key") != NULL);
    }
    CHECK_CODE(sf_session_sign_in_dpop(runtime, &tokens, NULL), SF_EINVAL);
    sf_session_state state = SF_LOGGED_IN;
    CHECK_CODE(sf_session_state_get(runtime, &state), SF_OK);
    CHECK_EQ_INT(state, SF_LOGGED_OUT);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

/* A runtime on the test server's token endpoint (its address in `*base_out`; DPoP settings
 * reset), signed in with alice's tokens from a password grant and a new DPoP key, expires_in
 * 0: its first token request refreshes with a proof, which binds the new tokens to the key.
 * NULL (after a failed CHECK) when that cannot be done. */
static sf_runtime *dpop_signed_in_runtime(const char **base_out) {
    const char *base = *base_out = oauth_server();
    CHECK(base != NULL);
    if (!base) return NULL;
    CHECK_EQ_INT(oauth_post("/__dpop/config", "reset=1"), 200);
    char url[256], body[4096], access[512] = "", refresh[512] = "";
    snprintf(url, sizeof url, "%s/oauth/token", base);
    CHECK_EQ_INT(http_request(url, "grant_type=password&username=alice&password=correct%20horse&client_id=sessionflow-public",
                              body, sizeof body, NULL, 0), 200);
    const char *at = strstr(body, "\"access_token\": \"");
    if (at) sscanf(at + 17, "%511[^\"]", access);
    at = strstr(body, "\"refresh_token\": \"");
    if (at) sscanf(at + 18, "%511[^\"]", refresh);
    CHECK(access[0] && refresh[0]);
    sf_options options;
    sf_options_init(&options);
    options.token_endpoint = url;
    options.client_id = "sessionflow-public";
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    if (!runtime) return NULL;
    char key[44];
    unsigned char raw[32];
    dpop_test_key(key, raw);
    sf_tokens tokens = test_tokens(access, refresh, 0, "alice");
    CHECK_CODE(sf_session_sign_in_dpop(runtime, &tokens, key), SF_OK);
    explicit_bzero(key, sizeof key);
    explicit_bzero(access, sizeof access);
    explicit_bzero(refresh, sizeof refresh);
    return runtime;
}

void test_dpop_host_key_refreshes_with_proofs_and_authorizes_as_dpop(void) {
    /* expires_in 0: the first request refreshes, with a proof by the key. */
    const char *base = NULL;
    sf_runtime *runtime = dpop_signed_in_runtime(&base);
    if (!runtime) return;

    dpop_answer a;
    memset(&a, 0, sizeof a);
    char resource[256];
    snprintf(resource, sizeof resource, "%s/api/resource", base);
    CHECK_CODE(sf_session_authorize(runtime, "GET", resource, on_dpop_authorized, &a), SF_OK);
    WAIT_FOR(atomic_load(&a.calls) == 1);
    CHECK_CODE(atomic_load(&a.result), SF_OK);
    CHECK(strcmp(a.scheme, "DPoP") == 0);
    CHECK_EQ_INT((int)a.header_count, 2);
    CHECK(strncmp(a.authorization, "DPoP ", 5) == 0);
    CHECK(strlen(a.proof) > 100);
    /* The token's details say how it is presented: DPoP, as the authorization does. */
    sf_token_info info;
    memset(&info, 0, sizeof info);
    info.size = sizeof info;
    CHECK_CODE(sf_session_token_info(runtime, &info), SF_OK);
    CHECK(strcmp(info.token_type, "DPoP") == 0);
    CHECK_EQ_INT((int)oauth_stat("/__dpop/stats", "bound_refused"), 0);
    /* The resource takes the two headers as given. */
    char headers[3200];
    snprintf(headers, sizeof headers, "Authorization: %s\r\nDPoP: %s", a.authorization, a.proof);
    char answer[1024];
    CHECK_EQ_INT(http_exchange(resource, NULL, headers, answer, sizeof answer, NULL, NULL, 0), 200);
    CHECK(strstr(answer, "\"scheme\":\"DPoP\"") != NULL || strstr(answer, "\"scheme\": \"DPoP\"") != NULL);
    /* The same proof again is a replay: refused as one (its jti was seen), not for another
     * reason (the token, the signature). */
    char challenge[256];
    CHECK_EQ_INT(http_exchange(resource, NULL, headers, answer, sizeof answer, "WWW-Authenticate", challenge,
                               sizeof challenge),
                 401);
    CHECK(strstr(challenge, "invalid_dpop_proof") != NULL);
    CHECK(strstr(answer, "jti replayed") != NULL);
    explicit_bzero(headers, sizeof headers);
    explicit_bzero(&a, sizeof a);
    atomic_int refreshed = 0;
    CHECK_CODE(sf_session_refresh_now(runtime, on_token, &refreshed), SF_OK);
    WAIT_FOR(atomic_load(&refreshed) != 0);
    CHECK_EQ_INT(atomic_load(&refreshed), 1);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

/* Authorizes GET `resource` and sends it with the answer's two headers; the answer's status,
 * and its DPoP-Nonce header in `nonce` ("" if none). */
static int dpop_get(sf_runtime *runtime, const char *resource, char *nonce, size_t nonce_length) {
    dpop_answer a;
    memset(&a, 0, sizeof a);
    CHECK_CODE(sf_session_authorize(runtime, "GET", resource, on_dpop_authorized, &a), SF_OK);
    WAIT_FOR(atomic_load(&a.calls) == 1);
    CHECK_CODE(atomic_load(&a.result), SF_OK);
    char headers[3200], answer[1024];
    snprintf(headers, sizeof headers, "Authorization: %s\r\nDPoP: %s", a.authorization, a.proof);
    int status = http_exchange(resource, NULL, headers, answer, sizeof answer, "DPoP-Nonce", nonce, nonce_length);
    explicit_bzero(headers, sizeof headers);
    explicit_bzero(&a, sizeof a);
    return status;
}

/* A server that gives a new nonce on every good answer (RFC 9449 §8.2) and accepts only the
 * newest: each answer's DPoP-Nonce handed to sf_session_remember_dpop_nonce serves the next
 * proof, so no request after the first is refused. Bad arguments are SF_EINVAL and change
 * nothing. */
void test_dpop_a_nonce_on_a_good_answer_serves_the_next_proof(void) {
    const char *base = NULL;
    sf_runtime *runtime = dpop_signed_in_runtime(&base);
    if (!runtime) return;
    char resource[256];
    snprintf(resource, sizeof resource, "%s/api/resource", base);

    CHECK_EQ_INT(oauth_post("/__dpop/config", "nonce_resource=rotate"), 200);
    char nonce[1100] = "";
    /* The first proof carries no nonce: refused, with one. */
    CHECK_EQ_INT(dpop_get(runtime, resource, nonce, sizeof nonce), 401);
    CHECK(nonce[0] != 0);
    long demanded = oauth_stat("/__dpop/stats", "nonce_demanded");
    for (int i = 0; i < 3; i++) {
        CHECK_CODE(sf_session_remember_dpop_nonce(runtime, resource, nonce), SF_OK);
        char previous[1100];
        snprintf(previous, sizeof previous, "%s", nonce);
        CHECK_EQ_INT(dpop_get(runtime, resource, nonce, sizeof nonce), 200);
        CHECK(nonce[0] != 0 && strcmp(nonce, previous) != 0); /* rotated on the good answer */
    }
    CHECK_EQ_INT((int)oauth_stat("/__dpop/stats", "nonce_demanded"), (int)demanded);

    /* Refused, nothing remembered: the next proof still carries the last good nonce. */
    CHECK_CODE(sf_session_remember_dpop_nonce(NULL, resource, "n"), SF_EINVAL);
    CHECK_CODE(sf_session_remember_dpop_nonce(runtime, NULL, "n"), SF_EINVAL);
    CHECK(strstr(sf_last_error_message(), "url is NULL") != NULL);
    CHECK_CODE(sf_session_remember_dpop_nonce(runtime, resource, NULL), SF_EINVAL);
    CHECK_CODE(sf_session_remember_dpop_nonce(runtime, "ftp://127.0.0.1/api/resource", "n"), SF_EINVAL);
    CHECK_CODE(sf_session_remember_dpop_nonce(runtime, resource, "bad \"nonce"), SF_EINVAL);
    CHECK(strstr(sf_last_error_message(), "NQCHAR") != NULL);
    CHECK_CODE(sf_session_remember_dpop_nonce(runtime, resource, ""), SF_EINVAL);
    char longest[1026];
    memset(longest, 'n', 1025);
    longest[1025] = 0;
    CHECK_CODE(sf_session_remember_dpop_nonce(runtime, resource, longest), SF_EINVAL);
    CHECK_CODE(sf_session_remember_dpop_nonce(runtime, resource, nonce), SF_OK);
    CHECK_EQ_INT(dpop_get(runtime, resource, nonce, sizeof nonce), 200);

    CHECK_EQ_INT(oauth_post("/__dpop/config", "reset=1"), 200);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_CODE(sf_session_remember_dpop_nonce(runtime, resource, nonce), SF_ECLOSED);
}
