/* Authorizing requests (sf_session_authorize, sf_session_unauthorized) and
 * sf_session_refresh_now, against the real test server's protected resource
 * (Tests/Fixtures/oauth_server.py: /api/resource, Authlib's ResourceProtector), and the libcurl
 * example host (Bindings/examples/curl_client.c) run the same way. */
#define _DEFAULT_SOURCE
#include <spawn.h>
#include <strings.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "oauth_fixture.h"

extern char **environ;

#define NEED_SERVER(base)              \
    const char *base = oauth_server(); \
    CHECK(base != NULL);               \
    if (!base) return

/* ---- Helpers --------------------------------------------------------------------------- */

/* Copies the JSON string member `name` of `json` into `out` ("" if absent). */
static void json_string(const char *json, const char *name, char *out, size_t length) {
    char key[64];
    snprintf(key, sizeof key, "\"%s\"", name);
    out[0] = 0;
    const char *found = strstr(json, key);
    if (!found) return;
    found = strchr(found + strlen(key), '"');
    if (!found) return;
    size_t n = strcspn(found + 1, "\"");
    if (n >= length) n = length - 1;
    memcpy(out, found + 1, n);
    out[n] = 0;
}

typedef struct user_tokens {
    char access[512];
    char refresh[512];
} user_tokens;

/* Signs `user` in at the server (the password grant, as the Swift tests do). */
static int password_sign_in(const char *base, const char *user, user_tokens *tokens) {
    char url[256], form[256], body[4096];
    snprintf(url, sizeof url, "%s/oauth/token", base);
    snprintf(form, sizeof form,
             "grant_type=password&username=%s&password=correct%%20horse&client_id=sessionflow-public", user);
    int status = http_request(url, form, body, sizeof body, NULL, 0);
    json_string(body, "access_token", tokens->access, sizeof tokens->access);
    json_string(body, "refresh_token", tokens->refresh, sizeof tokens->refresh);
    explicit_bzero(body, sizeof body);
    return status == 200 && tokens->access[0] && tokens->refresh[0] ? 0 : -1;
}

/* A runtime refreshing at the server, signed in as `user` (tokens in *tokens). */
static sf_runtime *signed_in_runtime(const char *base, const char *user, user_tokens *tokens) {
    char endpoint[256];
    snprintf(endpoint, sizeof endpoint, "%s/oauth/token", base);
    sf_options options;
    sf_options_init(&options);
    options.token_endpoint = endpoint;
    options.client_id = "sessionflow-public";
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    if (!runtime) return NULL;
    CHECK_EQ_INT(password_sign_in(base, user, tokens), 0);
    sf_tokens t = test_tokens(tokens->access, tokens->refresh, 3600, user);
    CHECK_CODE(sf_session_sign_in(runtime, &t), SF_OK);
    return runtime;
}

/* The server, a runtime signed in there as a user, and the resource's URL. */
typedef struct setup {
    const char *base;
    sf_runtime *runtime;
    user_tokens tokens;
    char url[256];
} setup;

/* Sets up `s` for `user`; 0 when it could not (a CHECK said why). */
static int set_up(setup *s, const char *user) {
    memset(s, 0, sizeof *s);
    s->base = oauth_server();
    CHECK(s->base != NULL);
    if (!s->base) return 0;
    s->runtime = signed_in_runtime(s->base, user, &s->tokens);
    snprintf(s->url, sizeof s->url, "%s/api/resource", s->base);
    return s->runtime != NULL;
}

/* One answer of sf_session_authorize / sf_session_unauthorized, waited for. */
typedef struct answer {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done;
    int calls;
    int result;
    int null_authorization;
    size_t size;
    size_t header_count;
    char scheme[16];
    char name[32];
    char value[1024]; /* the Authorization value (a secret: wiped by answer_end) */
    pthread_t asker;  /* the thread that asked */
    int on_asking_thread;
    char message[256]; /* a failing answer: sf_last_error_message read in the callback */
} answer;

static void answer_begin(answer *a) {
    memset(a, 0, sizeof *a);
    pthread_mutex_init(&a->lock, NULL);
    pthread_cond_init(&a->cond, NULL);
    a->asker = pthread_self();
}

static void answer_end(answer *a) {
    explicit_bzero(a->value, sizeof a->value);
    pthread_mutex_destroy(&a->lock);
    pthread_cond_destroy(&a->cond);
}

static void on_authorized(int result, const sf_authorization *authorization, void *userdata) {
    answer *a = userdata;
    pthread_mutex_lock(&a->lock);
    a->calls++;
    a->result = result;
    a->on_asking_thread = pthread_equal(pthread_self(), a->asker);
    a->null_authorization = authorization == NULL;
    if (result < 0) {
        const char *why = sf_last_error_message();
        snprintf(a->message, sizeof a->message, "%s", why ? why : "");
    }
    if (authorization) {
        a->size = authorization->size;
        a->header_count = authorization->header_count;
        snprintf(a->scheme, sizeof a->scheme, "%s", authorization->scheme);
        for (size_t i = 0; i < authorization->header_count; i++) {
            if (strcmp(authorization->headers[i].name, "Authorization") == 0) {
                snprintf(a->name, sizeof a->name, "%s", authorization->headers[i].name);
                snprintf(a->value, sizeof a->value, "%s", authorization->headers[i].value);
            }
        }
    }
    a->done = 1;
    pthread_cond_broadcast(&a->cond);
    pthread_mutex_unlock(&a->lock);
}

/* Waits up to 10 s for the answer; its result (or SF_ECLOSED when none came). */
static int answer_wait(answer *a) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 10;
    pthread_mutex_lock(&a->lock);
    while (!a->done && pthread_cond_timedwait(&a->cond, &a->lock, &deadline) == 0) {
    }
    int result = a->done ? a->result : SF_ECLOSED;
    pthread_mutex_unlock(&a->lock);
    return result;
}

/* GET `url` with "Authorization: <value>"; the status, and WWW-Authenticate in `challenge`. */
static int get_resource(const char *url, const char *value, char *challenge, size_t length) {
    char header[1100];
    snprintf(header, sizeof header, "Authorization: %s", value);
    int status = http_exchange(url, NULL, header, NULL, 0, "WWW-Authenticate", challenge, length);
    explicit_bzero(header, sizeof header);
    return status;
}

/* The resource's counter `name` (/__resource/stats). */
static long resource_stat(const char *name) {
    return oauth_stat("/__resource/stats", name);
}

/* How often the resource was presented `token` (/__resource/stats "presented"). */
static long presented(const char *token) {
    const char *base = oauth_server();
    char url[256], body[65536], key[600];
    snprintf(url, sizeof url, "%s/__resource/stats", base);
    if (http_request(url, NULL, body, sizeof body, NULL, 0) != 200) return -1;
    snprintf(key, sizeof key, "\"%s\":", token);
    const char *found = strstr(body, key);
    long count = found ? strtol(found + strlen(key), NULL, 10) : 0;
    explicit_bzero(body, sizeof body);
    return count;
}

static void revoke_access(const char *token) {
    char form[600];
    snprintf(form, sizeof form, "token=%s", token);
    CHECK_EQ_INT(oauth_post("/__resource/revoke_access", form), 200);
}

static sf_session_state state_of(sf_runtime *runtime) {
    sf_session_state state = SF_LOGGED_OUT;
    CHECK_CODE(sf_session_state_get(runtime, &state), SF_OK);
    return state;
}

/* ---- Bad input ----------------------------------------------------------------------- */

static atomic_int stray_calls;

static void count_call(int result, const sf_authorization *authorization, void *userdata) {
    (void)result, (void)authorization, (void)userdata;
    atomic_fetch_add(&stray_calls, 1);
}

static void count_token(int result, const char *token, void *userdata) {
    (void)result, (void)token, (void)userdata;
    atomic_fetch_add(&stray_calls, 1);
}

void test_authorize_bad_input_calls_nothing(void) {
    setup s;
    if (!set_up(&s, "alice")) return;
    atomic_store(&stray_calls, 0);

    CHECK_CODE(sf_session_authorize(NULL, "GET", s.url, count_call, NULL), SF_EINVAL);
    CHECK_CODE(sf_session_authorize(s.runtime, NULL, s.url, count_call, NULL), SF_EINVAL);
    CHECK(strstr(sf_last_error_message(), "method") != NULL);
    CHECK_CODE(sf_session_authorize(s.runtime, "GET", NULL, count_call, NULL), SF_EINVAL);
    CHECK_CODE(sf_session_authorize(s.runtime, "GET", s.url, NULL, NULL), SF_EINVAL);
    CHECK(strstr(sf_last_error_message(), "on_done") != NULL);
    CHECK_CODE(sf_session_authorize(s.runtime, "", s.url, count_call, NULL), SF_EINVAL);
    CHECK_CODE(sf_session_authorize(s.runtime, "GE T", s.url, count_call, NULL), SF_EINVAL);
    CHECK(strstr(sf_last_error_message(), "method") != NULL);
    char long_method[64];
    memset(long_method, 'A', 33);
    long_method[33] = 0;
    CHECK_CODE(sf_session_authorize(s.runtime, long_method, s.url, count_call, NULL), SF_EINVAL);
    CHECK(strstr(sf_last_error_message(), "32") != NULL);
    CHECK_CODE(sf_session_authorize(s.runtime, "GET", "ftp://127.0.0.1/x", count_call, NULL), SF_EINVAL);
    CHECK(strstr(sf_last_error_message(), "URL") != NULL);
    CHECK_CODE(sf_session_authorize(s.runtime, "GET", "http://example.com/api", count_call, NULL), SF_EINVAL);
    CHECK(strstr(sf_last_error_message(), "loopback") != NULL);
    CHECK_CODE(sf_session_authorize(s.runtime, "GET", "https://example.com/a#b", count_call, NULL), SF_EINVAL);
    static char long_url[9000];
    memset(long_url, 'a', sizeof long_url - 1);
    memcpy(long_url, "https://example.com/", 20);
    CHECK_CODE(sf_session_authorize(s.runtime, "GET", long_url, count_call, NULL), SF_EINVAL);
    CHECK(strstr(sf_last_error_message(), "url is longer than 8192") != NULL);

    char refused[600];
    snprintf(refused, sizeof refused, "Bearer %s", s.tokens.access);
    CHECK_CODE(sf_session_unauthorized(s.runtime, "GET", s.url, NULL, 401, NULL, count_call, NULL), SF_EINVAL);
    CHECK_CODE(sf_session_unauthorized(s.runtime, "GET", s.url, refused, 401, NULL, NULL, NULL), SF_EINVAL);
    CHECK_CODE(sf_session_unauthorized(s.runtime, "GET", s.url, "Basic YWxpY2U6eA==", 401, NULL, count_call, NULL),
               SF_EINVAL);
    CHECK(strstr(sf_last_error_message(), "Bearer") != NULL);
    CHECK_CODE(sf_session_unauthorized(s.runtime, "GET", s.url, "Bearer ", 401, NULL, count_call, NULL), SF_EINVAL);
    CHECK_CODE(sf_session_unauthorized(s.runtime, "GE T", s.url, refused, 401, NULL, count_call, NULL), SF_EINVAL);
    CHECK_CODE(sf_session_unauthorized(s.runtime, "GET", s.url, refused, 500, NULL, count_call, NULL), SF_EINVAL);
    CHECK(strstr(sf_last_error_message(), "500") != NULL);
    static char long_refused[70000];
    memset(long_refused, 'x', sizeof long_refused - 1);
    memcpy(long_refused, "Bearer ", 7);
    CHECK_CODE(sf_session_unauthorized(s.runtime, "GET", s.url, long_refused, 401, NULL, count_call, NULL), SF_EINVAL);
    CHECK(strstr(sf_last_error_message(), "refused is longer than 65536") != NULL);
    /* A 403 is not cured by a new token: refused at once, nothing refreshed, nothing called. */
    long refreshes = oauth_stat("/__stats", "refresh_grants");
    CHECK_CODE(sf_session_unauthorized(s.runtime, "GET", s.url, refused, 403,
                                       "Bearer error=\"insufficient_scope\", scope=\"admin\"", count_call, NULL),
               SF_EUNAUTHORIZED);
    CHECK(strstr(sf_last_error_message(), "insufficient_scope") != NULL);
    CHECK_CODE(sf_session_refresh_now(s.runtime, NULL, NULL), SF_EINVAL);
    CHECK_CODE(sf_session_refresh_now(NULL, count_token, NULL), SF_EINVAL);

    sf_test_sleep_ms(100);
    CHECK_EQ_INT(atomic_load(&stray_calls), 0);
    CHECK_EQ_INT(oauth_stat("/__stats", "refresh_grants"), refreshes);
    CHECK_CODE(sf_runtime_destroy(s.runtime), SF_OK);
    CHECK_CODE(sf_session_authorize(s.runtime, "GET", s.url, count_call, NULL), SF_ECLOSED);
    CHECK_CODE(sf_session_refresh_now(s.runtime, count_token, NULL), SF_ECLOSED);
    sf_test_sleep_ms(20);
    CHECK_EQ_INT(atomic_load(&stray_calls), 0);
    explicit_bzero(&s.tokens, sizeof s.tokens);
    explicit_bzero(refused, sizeof refused);
}

void test_authorize_when_logged_out_is_enotloggedin_in_the_callback(void) {
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(NULL, &runtime), SF_OK);
    answer a;
    answer_begin(&a);
    CHECK_CODE(sf_session_authorize(runtime, "GET", "https://api.example.com/x", on_authorized, &a), SF_OK);
    CHECK_EQ_INT(answer_wait(&a), SF_ENOTLOGGEDIN);
    CHECK_EQ_INT(a.calls, 1);
    CHECK(a.null_authorization);
    CHECK(!a.on_asking_thread);
    /* Inside the callback, the loop thread's sf_last_error_message says why the answer failed. */
    CHECK(strcmp(a.message, "sf_session_authorize (answer): no one is signed in") == 0);
    answer_end(&a);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

static atomic_int refreshed;

static void on_refreshed(int result, const char *token, void *userdata) {
    (void)userdata;
    atomic_store(&refreshed, result == SF_OK && token && token[0] ? SF_OK : (result == SF_OK ? SF_EINVAL : result));
}

/* ---- The header the resource accepts ------------------------------------------------- */

void test_authorize_gives_the_header_the_resource_accepts(void) {
    setup s;
    if (!set_up(&s, "alice")) return;
    char expected[600], challenge[256];
    snprintf(expected, sizeof expected, "Bearer %s", s.tokens.access);
    answer a;
    answer_begin(&a);
    CHECK_CODE(sf_session_authorize(s.runtime, "GET", s.url, on_authorized, &a), SF_OK);
    CHECK_EQ_INT(answer_wait(&a), SF_OK);
    CHECK_EQ_INT(a.calls, 1);
    CHECK(!a.on_asking_thread); /* the loop thread, never inside the call */
    CHECK_EQ_INT(a.size, sizeof(sf_authorization));
    CHECK(strcmp(a.scheme, "Bearer") == 0);
    CHECK_EQ_INT(a.header_count, 1);
    CHECK(strcmp(a.name, "Authorization") == 0);
    CHECK(strcmp(a.value, expected) == 0);
    CHECK_EQ_INT(get_resource(s.url, a.value, challenge, sizeof challenge), 200);
    /* Without a token: the resource's bare challenge. */
    CHECK_EQ_INT(http_exchange(s.url, NULL, NULL, NULL, 0, "WWW-Authenticate", challenge, sizeof challenge), 401);
    CHECK(strncasecmp(challenge, "Bearer", 6) == 0);
    answer_end(&a);

    /* A 401 with a token that is no longer the session's: the current one at once, no refresh. */
    long refreshes = oauth_stat("/__stats", "refresh_grants");
    answer b;
    answer_begin(&b);
    CHECK_CODE(sf_session_unauthorized(s.runtime, "GET", s.url, "bearer someone-elses-token", 401,
                                       "Bearer error=\"invalid_token\"", on_authorized, &b),
               SF_OK);
    CHECK_EQ_INT(answer_wait(&b), SF_OK);
    CHECK(strcmp(b.value, expected) == 0);
    CHECK_EQ_INT(oauth_stat("/__stats", "refresh_grants"), refreshes);
    answer_end(&b);

    /* sf_session_refresh_now: a refresh whatever the margin says; a new token. */
    answer c;
    answer_begin(&c);
    atomic_store(&refreshed, 1);
    CHECK_CODE(sf_session_refresh_now(s.runtime, on_refreshed, NULL), SF_OK);
    WAIT_FOR(atomic_load(&refreshed) != 1);
    CHECK_EQ_INT(atomic_load(&refreshed), SF_OK);
    CHECK_EQ_INT(oauth_stat("/__stats", "refresh_grants"), refreshes + 1);
    CHECK_CODE(sf_session_authorize(s.runtime, "GET", s.url, on_authorized, &c), SF_OK);
    CHECK_EQ_INT(answer_wait(&c), SF_OK);
    CHECK(strcmp(c.value, expected) != 0);
    CHECK_EQ_INT(get_resource(s.url, c.value, challenge, sizeof challenge), 200);
    answer_end(&c);
    CHECK_CODE(sf_runtime_destroy(s.runtime), SF_OK);
    explicit_bzero(&s.tokens, sizeof s.tokens);
    explicit_bzero(expected, sizeof expected);
}

/* ---- Concurrent requests ------------------------------------------------------------- */

typedef struct request_run {
    sf_runtime *runtime;
    const char *url;
    int first_status;
    int final_status;
    int sent;          /* requests sent to the resource */
    int error;         /* the session's answer when it gave no authorization (SF_OK: none) */
    int error_answers; /* how many callbacks carried an error */
} request_run;

/* One request as a host makes it: authorize, send, on 401 unauthorized and retry once. */
static void *run_request(void *argument) {
    request_run *run = argument;
    char challenge[512];
    answer first;
    answer_begin(&first);
    int code = sf_session_authorize(run->runtime, "GET", run->url, on_authorized, &first);
    if (code == SF_OK) code = answer_wait(&first);
    if (code != SF_OK) {
        run->error = code;
        run->error_answers += first.calls;
        answer_end(&first);
        return NULL;
    }
    run->first_status = run->final_status = get_resource(run->url, first.value, challenge, sizeof challenge);
    run->sent++;
    if (run->first_status == 401) {
        answer retry;
        answer_begin(&retry);
        code = sf_session_unauthorized(run->runtime, "GET", run->url, first.value, 401, challenge, on_authorized,
                                       &retry);
        if (code == SF_OK) code = answer_wait(&retry);
        if (code == SF_OK) {
            run->final_status = get_resource(run->url, retry.value, challenge, sizeof challenge);
            run->sent++;
        } else {
            run->error = code;
            run->error_answers += retry.calls;
        }
        answer_end(&retry);
    }
    answer_end(&first);
    return NULL;
}

static void run_concurrently(sf_runtime *runtime, const char *url, request_run *runs, int count) {
    pthread_t threads[64];
    for (int i = 0; i < count; i++) {
        runs[i] = (request_run){.runtime = runtime, .url = url};
        CHECK_EQ_INT(pthread_create(&threads[i], NULL, run_request, &runs[i]), 0);
    }
    for (int i = 0; i < count; i++) pthread_join(threads[i], NULL);
}

void test_authorize_a_revoked_token_under_50_concurrent_requests_refreshes_once(void) {
    setup s;
    if (!set_up(&s, "alice")) return;
    revoke_access(s.tokens.access);
    long refreshes = oauth_stat("/__stats", "refresh_grants");
    long requests = resource_stat("requests"), ok = resource_stat("ok");
    long old_presented = presented(s.tokens.access);

    request_run runs[50];
    run_concurrently(s.runtime, s.url, runs, 50);

    int succeeded = 0, retried = 0, most_sent = 0;
    for (int i = 0; i < 50; i++) {
        succeeded += runs[i].final_status == 200 && runs[i].error == SF_OK;
        retried += runs[i].sent == 2;
        if (runs[i].sent > most_sent) most_sent = runs[i].sent;
    }
    CHECK_EQ_INT(succeeded, 50);
    CHECK(most_sent <= 2); /* every request retried at most once */
    CHECK_EQ_INT(oauth_stat("/__stats", "refresh_grants") - refreshes, 1);
    CHECK_EQ_INT(resource_stat("ok") - ok, 50);
    CHECK_EQ_INT(resource_stat("requests") - requests, 50 + retried);
    CHECK(presented(s.tokens.access) - old_presented <= 50);
    printf("     50 requests: %d retried, %ld refresh(es), %ld resource requests\n", retried,
           oauth_stat("/__stats", "refresh_grants") - refreshes, resource_stat("requests") - requests);
    CHECK_EQ_INT(state_of(s.runtime), SF_LOGGED_IN);
    CHECK_CODE(sf_runtime_destroy(s.runtime), SF_OK);
    explicit_bzero(&s.tokens, sizeof s.tokens);
}

void test_authorize_a_dead_session_is_eauth_once_per_request(void) {
    setup s;
    if (!set_up(&s, "bob")) return;
    CHECK_EQ_INT(oauth_post("/__revoke_user", "user=bob"), 200);
    long token_requests = oauth_stat("/__stats", "token_requests");
    long requests = resource_stat("requests");

    request_run runs[10];
    run_concurrently(s.runtime, s.url, runs, 10);

    for (int i = 0; i < 10; i++) {
        CHECK_EQ_INT(runs[i].error, SF_EAUTH);
        CHECK_EQ_INT(runs[i].error_answers, 1);
        CHECK(runs[i].sent <= 1); /* never retried */
    }
    CHECK(resource_stat("requests") - requests <= 10);
    CHECK_EQ_INT(oauth_stat("/__stats", "token_requests") - token_requests, 1); /* one refresh attempt */
    CHECK_EQ_INT(state_of(s.runtime), SF_SESSION_EXPIRED);
    /* And later: no request is even authorized. */
    answer a;
    answer_begin(&a);
    CHECK_CODE(sf_session_authorize(s.runtime, "GET", s.url, on_authorized, &a), SF_OK);
    CHECK_EQ_INT(answer_wait(&a), SF_EAUTH);
    answer_end(&a);
    sf_test_sleep_ms(50);
    CHECK_EQ_INT(oauth_stat("/__stats", "token_requests") - token_requests, 1);
    CHECK_CODE(sf_runtime_destroy(s.runtime), SF_OK);
    explicit_bzero(&s.tokens, sizeof s.tokens);
}

/* ---- The libcurl example host --------------------------------------------------------- */

/* Runs Bindings/examples/curl_client (its path in SF_TEST_CURL_CLIENT, set by run-tests.sh)
 * for `count` concurrent requests to the resource, signed in with `tokens`; its exit status,
 * and its last line of output in `summary`. */
static int run_curl_client(const char *base, const user_tokens *tokens, int count, char *summary, size_t length) {
    summary[0] = 0;
    const char *client = getenv("SF_TEST_CURL_CLIENT");
    CHECK(client != NULL);
    if (!client) {
        fprintf(stderr, "    SF_TEST_CURL_CLIENT is not set (Bindings/run-tests.sh builds the example)\n");
        return -1;
    }
    char url[256], endpoint[256], requests[16];
    snprintf(url, sizeof url, "%s/api/resource", base);
    snprintf(endpoint, sizeof endpoint, "%s/oauth/token", base);
    snprintf(requests, sizeof requests, "%d", count);
    /* The tokens travel in the environment, never on a command line (ps shows those). */
    static char access[600], refresh[600];
    snprintf(access, sizeof access, "SF_ACCESS_TOKEN=%s", tokens->access);
    snprintf(refresh, sizeof refresh, "SF_REFRESH_TOKEN=%s", tokens->refresh);
    /* Our environment (LD_LIBRARY_PATH for an installed library, sanitizer options) plus the
     * tokens. */
    size_t inherited = 0;
    while (environ[inherited]) inherited++;
    char **envp = calloc(inherited + 3, sizeof *envp);
    CHECK(envp != NULL);
    if (!envp) return -1;
    size_t used_env = 0;
    for (size_t i = 0; i < inherited; i++) {
        if (strncmp(environ[i], "SF_ACCESS_TOKEN=", 16) != 0 && strncmp(environ[i], "SF_REFRESH_TOKEN=", 17) != 0) {
            envp[used_env++] = environ[i];
        }
    }
    envp[used_env++] = access;
    envp[used_env++] = refresh;
    envp[used_env] = NULL;
    char *argv[] = {(char *)client, url, endpoint, "sessionflow-public", requests, NULL};
    int out[2];
    CHECK_EQ_INT(pipe(out), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    pid_t pid;
    int spawned = posix_spawn(&pid, client, &actions, NULL, argv, envp);
    posix_spawn_file_actions_destroy(&actions);
    free(envp);
    close(out[1]);
    explicit_bzero(access, sizeof access);
    explicit_bzero(refresh, sizeof refresh);
    CHECK_EQ_INT(spawned, 0);
    if (spawned != 0) {
        close(out[0]);
        return -1;
    }
    char output[8192];
    size_t used = 0;
    for (;;) {
        ssize_t n = read(out[0], output + used, sizeof output - 1 - used);
        if (n <= 0) break;
        used += (size_t)n;
    }
    close(out[0]);
    output[used] = 0;
    int status = 0;
    waitpid(pid, &status, 0);
    /* The last line. */
    while (used > 0 && output[used - 1] == '\n') output[--used] = 0;
    const char *last = strrchr(output, '\n');
    snprintf(summary, length, "%s", last ? last + 1 : output);
    printf("     curl_client: %s\n", summary);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void test_authorize_curl_client_retries_a_revoked_token_once(void) {
    NEED_SERVER(base);
    user_tokens tokens;
    CHECK_EQ_INT(password_sign_in(base, "alice", &tokens), 0);
    revoke_access(tokens.access);
    long refreshes = oauth_stat("/__stats", "refresh_grants");
    long requests = resource_stat("requests"), ok = resource_stat("ok");
    char summary[512];
    CHECK_EQ_INT(run_curl_client(base, &tokens, 50, summary, sizeof summary), 0);
    int count = 0, succeeded = 0, retried = 0, failed = 0;
    CHECK_EQ_INT(sscanf(summary, "requests=%d ok=%d retried=%d failed=%d", &count, &succeeded, &retried, &failed), 4);
    CHECK_EQ_INT(count, 50);
    CHECK_EQ_INT(succeeded, 50);
    CHECK_EQ_INT(failed, 0);
    CHECK(strstr(summary, "state=SF_LOGGED_IN") != NULL);
    CHECK_EQ_INT(oauth_stat("/__stats", "refresh_grants") - refreshes, 1);
    CHECK_EQ_INT(resource_stat("ok") - ok, 50);
    CHECK_EQ_INT(resource_stat("requests") - requests, 50 + retried); /* at most one retry each */
    explicit_bzero(&tokens, sizeof tokens);
}

void test_authorize_curl_client_on_a_dead_session_fails_each_request_once(void) {
    NEED_SERVER(base);
    user_tokens tokens;
    CHECK_EQ_INT(password_sign_in(base, "bob", &tokens), 0);
    CHECK_EQ_INT(oauth_post("/__revoke_user", "user=bob"), 200);
    long token_requests = oauth_stat("/__stats", "token_requests");
    long requests = resource_stat("requests");
    char summary[512];
    CHECK_EQ_INT(run_curl_client(base, &tokens, 10, summary, sizeof summary), 1);
    int count = 0, succeeded = 0, retried = 0, failed = 0;
    CHECK_EQ_INT(sscanf(summary, "requests=%d ok=%d retried=%d failed=%d", &count, &succeeded, &retried, &failed), 4);
    CHECK_EQ_INT(count, 10);
    CHECK_EQ_INT(succeeded, 0);
    CHECK_EQ_INT(retried, 0);
    CHECK_EQ_INT(failed, 10);
    CHECK(strstr(summary, "error=SF_EAUTH") != NULL);
    CHECK(strstr(summary, "state=SF_SESSION_EXPIRED") != NULL);
    CHECK(resource_stat("requests") - requests <= 10);
    CHECK_EQ_INT(oauth_stat("/__stats", "token_requests") - token_requests, 1);
    explicit_bzero(&tokens, sizeof tokens);
}
