/* Secrets (rule 7 of the header: tokens never in logs or errors) seen from C: every string the library hands a host — event reasons,
 * member ids, error messages — and everything it writes to stderr (its logs) while a session
 * signs in, fails a refresh, rotates its tokens, expires and logs out, scanned for every token
 * it held. */
#define _GNU_SOURCE
#include "harness.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#define ACCESS "SENTINEL-C-ACCESS-9a1f"
#define REFRESH "SENTINEL-C-REFRESH-4e7d"
#define ROTATED_ACCESS "SENTINEL-C-ACCESS-ROTATED-2b6c"
#define ROTATED_REFRESH "SENTINEL-C-REFRESH-ROTATED-7c3a"

typedef struct seen {
    pthread_mutex_t lock;
    char text[32768]; /* every string the library handed over, one per line */
    size_t used;
    int strings;
    sf_refresh_request *requests[8];
    int request_count;
} seen;

static void note(seen *s, const char *text) {
    if (!text) return;
    pthread_mutex_lock(&s->lock);
    size_t length = strlen(text);
    if (s->used + length + 2 < sizeof s->text) {
        memcpy(s->text + s->used, text, length);
        s->used += length;
        s->text[s->used++] = '\n';
        s->text[s->used] = '\0';
    }
    s->strings++;
    pthread_mutex_unlock(&s->lock);
}

static void on_event(const sf_event *event, void *userdata) {
    note(userdata, event->reason);
    note(userdata, event->member_id);
}

static void on_error(int code, const char *message, void *userdata) {
    (void)code;
    note(userdata, message);
}

static void host_refresh(sf_refresh_request *request, const char *refresh_token, void *userdata) {
    (void)refresh_token; /* the host's to send; the test does not print it */
    seen *s = userdata;
    pthread_mutex_lock(&s->lock);
    if (s->request_count < 8) s->requests[s->request_count++] = request;
    pthread_mutex_unlock(&s->lock);
}

static sf_refresh_request *request_at(seen *s, int index) {
    pthread_mutex_lock(&s->lock);
    sf_refresh_request *request = index < s->request_count ? s->requests[index] : NULL;
    pthread_mutex_unlock(&s->lock);
    return request;
}

static void ignore_answer(int result, const char *access_token, void *userdata) {
    (void)result;
    (void)access_token;
    (void)userdata;
}

static int holds_a_token(const char *text) {
    const char *tokens[] = {ACCESS, REFRESH, ROTATED_ACCESS, ROTATED_REFRESH};
    for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; i++) {
        if (strstr(text, tokens[i])) return 1;
    }
    return 0;
}

void test_secrets_never_reach_a_host_or_the_logs(void) {
    /* The library's logs go to stderr: capture them in a file for the scan. */
    char path[] = "/tmp/sessionflow-secrets-XXXXXX";
    int capture = mkstemp(path);
    CHECK(capture >= 0);
    if (capture < 0) return;
    fflush(stderr);
    int saved = dup(2);
    dup2(capture, 2);

    setenv("SESSIONFLOW_LOG", "trace", 1); /* everything the library would ever log */
    seen s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.lock, NULL);
    sf_options options;
    sf_options_init(&options);
    options.refresh = host_refresh;
    options.refresh_userdata = &s;
    options.min_backoff_ms = 10;
    options.min_refresh_interval_ms = 10;
    sf_runtime *runtime = NULL;
    int created = sf_runtime_create(&options, &runtime);
    sf_event_observer events = {.size = sizeof(sf_event_observer), .on_event = on_event, .on_error = on_error, .userdata = &s};
    sf_subscription subscription = 0;
    int subscribed = sf_subscribe_events(runtime, &events, &subscription);

    sf_tokens tokens = test_tokens(ACCESS, REFRESH, 0, "member-c");
    int signed_in = sf_session_sign_in(runtime, &tokens);
    sf_session_fresh_token(runtime, ignore_answer, NULL);
    WAIT_FOR(request_at(&s, 0) != NULL);
    int failed = sf_refresh_request_fail(request_at(&s, 0), SF_ENETWORK, -1); /* retried */
    WAIT_FOR(request_at(&s, 1) != NULL);
    sf_tokens rotated = test_tokens(ROTATED_ACCESS, ROTATED_REFRESH, 3600, NULL);
    int succeeded = sf_refresh_request_succeed(request_at(&s, 1), &rotated);
    sf_test_sleep_ms(50);
    sf_session_notify_unauthorized(runtime, ROTATED_ACCESS); /* refreshes the current token */
    WAIT_FOR(request_at(&s, 2) != NULL);
    int refused = sf_refresh_request_fail(request_at(&s, 2), SF_EAUTH, -1); /* the session expires */
    sf_session_state state = SF_LOGGED_IN;
    for (int i = 0; i < 2000 && state != SF_SESSION_EXPIRED; i++) {
        sf_session_state_get(runtime, &state);
        sf_test_sleep_ms(1);
    }
    int logged_out = sf_session_logout(runtime);
    sf_test_sleep_ms(50);
    sf_subscription_close(subscription);
    int destroyed = sf_runtime_destroy(runtime);
    unsetenv("SESSIONFLOW_LOG");

    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char logs[65536];
    ssize_t length = pread(capture, logs, sizeof logs - 1, 0);
    logs[length > 0 ? length : 0] = '\0';
    close(capture);
    unlink(path);

    CHECK_EQ_INT(created, SF_OK);
    CHECK_EQ_INT(subscribed, SF_OK);
    CHECK_EQ_INT(signed_in, SF_OK);
    CHECK_EQ_INT(failed, SF_OK);
    CHECK_EQ_INT(succeeded, SF_OK);
    CHECK_EQ_INT(refused, SF_OK);
    CHECK_EQ_INT(state, SF_SESSION_EXPIRED);
    CHECK_EQ_INT(logged_out, SF_OK);
    CHECK_EQ_INT(destroyed, SF_OK);
    /* Enough was said to mean something: reasons and member ids, and the debug-level logs. */
    CHECK(s.strings >= 5);
    if (s.strings < 5 || length <= 0) fprintf(stderr, "    %d strings:\n%s\n    %zd bytes of logs\n", s.strings, s.text, length);
    CHECK(strstr(s.text, "member-c") != NULL);
    CHECK(length > 0 && strstr(logs, "refresh started") != NULL);
    if (length <= 0 || !strstr(logs, "refresh started")) fprintf(stderr, "    logs (%zd bytes):\n%s\n", length, logs);
    CHECK(!holds_a_token(s.text));
    CHECK(!holds_a_token(logs));
    if (holds_a_token(s.text) || holds_a_token(logs)) {
        fprintf(stderr, "    strings:\n%s\n    logs:\n%s\n", s.text, logs);
    }
}
