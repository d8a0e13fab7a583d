/* The host's log function (sf_options.log) and sf_last_error_message: lines reach the host
 * and not standard error, at its level, never with a token, never after destroy; a refused
 * option is named in both; the message is the calling thread's own. */
#define _GNU_SOURCE
#include "harness.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#define ACCESS "SENTINEL-LOG-ACCESS-51c2"
#define REFRESH "SENTINEL-LOG-REFRESH-8d0e"
#define ROTATED_ACCESS "SENTINEL-LOG-ACCESS-ROTATED-3f9a"
#define ROTATED_REFRESH "SENTINEL-LOG-REFRESH-ROTATED-6b14"

typedef struct collected {
    pthread_mutex_t lock;
    char text[65536]; /* "level line\n" for each line */
    size_t used;
    int lines;
    int below_level;      /* lines under the level the host asked for */
    int bad_level;        /* a level that is no sf_log_level */
    int after_destroy;    /* lines handed over after destroy returned */
    int minimum_level;
    atomic_int destroyed;
    int at_once;          /* how many calls are inside the function right now */
    int overlapped;       /* two calls were inside at once */
} collected;

static void collect(int level, const char *line, void *userdata) {
    collected *c = userdata;
    pthread_mutex_lock(&c->lock);
    c->at_once++;
    if (c->at_once > 1) c->overlapped++;
    pthread_mutex_unlock(&c->lock);
    sf_test_sleep_ms(0);
    pthread_mutex_lock(&c->lock);
    c->at_once--;
    if (level < SF_LOG_TRACE || level > SF_LOG_CRITICAL) c->bad_level++;
    if (level < c->minimum_level) c->below_level++;
    if (atomic_load(&c->destroyed)) c->after_destroy++;
    int written = snprintf(c->text + c->used, sizeof c->text - c->used, "%d %s\n", level, line ? line : "(null)");
    if (written > 0 && c->used + (size_t)written < sizeof c->text) c->used += (size_t)written;
    c->lines++;
    pthread_mutex_unlock(&c->lock);
}

static void collected_init(collected *c, int minimum_level) {
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->lock, NULL);
    c->minimum_level = minimum_level;
}

static int collected_contains(collected *c, const char *needle) {
    pthread_mutex_lock(&c->lock);
    int found = strstr(c->text, needle) != NULL;
    pthread_mutex_unlock(&c->lock);
    return found;
}

/* Standard error into a temporary file while a test runs: the library must write nothing there. */
typedef struct captured_stderr {
    int saved;
    char path[64];
} captured_stderr;

static void capture_stderr(captured_stderr *c) {
    fflush(stderr);
    snprintf(c->path, sizeof c->path, "/tmp/sf-log-test-XXXXXX");
    int fd = mkstemp(c->path);
    c->saved = dup(2);
    dup2(fd, 2);
    close(fd);
}

static long release_stderr(captured_stderr *c) {
    fflush(stderr);
    dup2(c->saved, 2);
    close(c->saved);
    FILE *file = fopen(c->path, "r");
    long size = -1;
    if (file) {
        fseek(file, 0, SEEK_END);
        size = ftell(file);
        if (size > 0) {
            char text[512] = {0};
            fseek(file, 0, SEEK_SET);
            size_t n = fread(text, 1, sizeof text - 1, file);
            text[n] = '\0';
            fprintf(stderr, "    written to stderr: %s\n", text);
        }
        fclose(file);
    }
    unlink(c->path);
    return size;
}

/* Options whose log goes to `c` from `level` up. */
static sf_options logging_options(collected *c, int level) {
    sf_options options;
    sf_options_init(&options);
    options.log = collect;
    options.log_userdata = c;
    options.log_level = level;
    return options;
}

static void answer_with_rotated_tokens(sf_refresh_request *request, const char *refresh_token, void *userdata) {
    (void)refresh_token;
    (void)userdata;
    sf_tokens rotated = test_tokens(ROTATED_ACCESS, ROTATED_REFRESH, 3600, "member-log");
    sf_refresh_request_succeed(request, &rotated);
}

static void on_answer(int result, const char *access_token, void *userdata) {
    (void)access_token;
    atomic_store((atomic_int *)userdata, result == SF_OK ? 1 : 2);
}

void test_logs_go_to_the_hosts_function_only_never_with_a_token(void) {
    collected c;
    collected_init(&c, SF_LOG_TRACE);
    captured_stderr err;
    capture_stderr(&err);

    sf_options defaults;
    sf_options_init(&defaults);
    CHECK_EQ_INT(defaults.log_level, SF_LOG_INFO); /* the default */
    sf_options options = logging_options(&c, SF_LOG_TRACE);
    options.refresh = answer_with_rotated_tokens;
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    sf_tokens tokens = test_tokens(ACCESS, REFRESH, 3600, "member-log");
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    /* A refresh through the refresher (a 401 on the current token), then a token request. */
    CHECK_CODE(sf_session_notify_unauthorized(runtime, ACCESS), SF_OK);
    atomic_int answered = 0;
    CHECK_CODE(sf_session_fresh_token(runtime, on_answer, &answered), SF_OK);
    WAIT_FOR(atomic_load(&answered) != 0);
    CHECK_EQ_INT(atomic_load(&answered), 1);
    CHECK_CODE(sf_session_logout(runtime), SF_OK);
    recorder r;
    recorder_init(&r);
    sf_observer observer = recorder_observer(&r);
    sf_subscription never_closed;
    CHECK_CODE(sf_subscribe_session_state(runtime, &observer, &never_closed), SF_OK);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    atomic_store(&c.destroyed, 1);
    sf_test_sleep_ms(100);
    long written = release_stderr(&err);

    CHECK(c.lines >= 5);
    CHECK_EQ_INT(c.bad_level, 0);
    CHECK_EQ_INT(c.after_destroy, 0);
    CHECK_EQ_INT(c.overlapped, 0);
    CHECK_EQ_INT(written, 0);
    /* Debug and trace lines came through (the level asked for), and the leak warning of a
     * subscription never closed, at warning level, before destroy returned. */
    CHECK(collected_contains(&c, "\n0 ") || strncmp(c.text, "0 ", 2) == 0 || collected_contains(&c, "\n1 "));
    CHECK(collected_contains(&c, "4 sessionflow.loopflow: event loop torn down with subscriptions that were never closed") ||
          collected_contains(&c, "4 sessionflow: event loop torn down with subscriptions that were never closed"));
    const char *secrets[] = {ACCESS, REFRESH, ROTATED_ACCESS, ROTATED_REFRESH};
    for (size_t i = 0; i < sizeof secrets / sizeof secrets[0]; i++) CHECK(!collected_contains(&c, secrets[i]));
    pthread_mutex_destroy(&c.lock);
}

void test_logs_below_the_hosts_level_are_not_handed_over(void) {
    collected c;
    collected_init(&c, SF_LOG_WARNING);
    sf_options options = logging_options(&c, SF_LOG_WARNING);
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    sf_tokens tokens = test_tokens(ACCESS, REFRESH, 3600, "member-log");
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    CHECK_CODE(sf_session_logout(runtime), SF_OK);
    recorder r;
    recorder_init(&r);
    sf_observer observer = recorder_observer(&r);
    sf_subscription never_closed;
    CHECK_CODE(sf_subscribe_session_state(runtime, &observer, &never_closed), SF_OK);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_EQ_INT(c.below_level, 0);
    CHECK(c.lines >= 1); /* the warning about the subscription never closed */
    CHECK(collected_contains(&c, "never closed"));
    /* A level that is no sf_log_level is refused, and said. */
    options.log_level = 7;
    runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_EINVAL);
    CHECK(runtime == NULL);
    const char *message = sf_last_error_message();
    CHECK(message != NULL && strstr(message, "sf_runtime_create: sf_options.log_level is 7") == message);
    pthread_mutex_destroy(&c.lock);
}

void test_logs_a_refused_option_is_named_to_the_host_and_in_the_last_error(void) {
    collected c;
    collected_init(&c, SF_LOG_TRACE);
    captured_stderr err;
    capture_stderr(&err);
    sf_options options = logging_options(&c, SF_LOG_INFO);
    options.token_endpoint = "http://auth.example.com/token";
    options.client_id = "c";
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_EINVAL);
    long written = release_stderr(&err);
    CHECK(runtime == NULL);
    CHECK_EQ_INT(written, 0);
    const char *message = sf_last_error_message();
    CHECK(message != NULL);
    if (message) {
        CHECK(strstr(message, "sf_runtime_create: sf_options.token_endpoint ") == message);
        CHECK(strstr(message, "plain http") != NULL);
    }
    CHECK(collected_contains(&c, "5 sessionflow: sf_runtime_create: SF_EINVAL: sf_options.token_endpoint "));
    /* A size no released sf_options has. */
    sf_options_init(&options);
    options.size = 3;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_EINVAL);
    message = sf_last_error_message();
    CHECK(message != NULL && strstr(message, "sf_runtime_create: sf_options.size is 3,") == message);
    pthread_mutex_destroy(&c.lock);
}

static void *first_failure_of_a_new_thread(void *arg) {
    const char **seen = arg;
    seen[0] = sf_last_error_message(); /* nothing failed on this thread yet */
    CHECK_CODE(sf_session_logout(NULL), SF_EINVAL);
    seen[1] = sf_last_error_message();
    return NULL;
}

void test_last_error_message_names_the_call_and_is_the_threads_own(void) {
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(NULL, &runtime), SF_OK);
    sf_tokens tokens = test_tokens(ACCESS, REFRESH, 3600, "member-log");
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    /* Signed in already: the session says why, after the call's name. */
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_ESTATE);
    const char *message = sf_last_error_message();
    CHECK(message != NULL && strncmp(message, "sf_session_sign_in: ", 20) == 0);
    CHECK(message != NULL && strstr(message, sf_strerror(SF_ESTATE)) == NULL); /* more than the code */
    CHECK(message != NULL && strstr(message, ACCESS) == NULL && strstr(message, REFRESH) == NULL);
    /* A call that succeeds leaves it as it was (errno-like). */
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 1);
    CHECK(sf_last_error_message() == message);
    /* Nothing more to say than the code: its text. */
    CHECK_CODE(sf_subscription_close(0), SF_ECLOSED);
    char expected[160];
    snprintf(expected, sizeof expected, "sf_subscription_close: %s", sf_strerror(SF_ECLOSED));
    CHECK(sf_last_error_message() != NULL && strcmp(sf_last_error_message(), expected) == 0);
    /* Another thread has its own. */
    const char *seen[2] = {"unset", "unset"};
    pthread_t thread;
    pthread_create(&thread, NULL, first_failure_of_a_new_thread, seen);
    pthread_join(thread, NULL);
    CHECK(seen[0] == NULL);
    CHECK(seen[1] != NULL); /* (its text went with its thread) */
    CHECK(sf_last_error_message() != NULL && strcmp(sf_last_error_message(), expected) == 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

typedef struct destroying_logger {
    _Atomic(sf_runtime *) runtime;
    atomic_int calls;
    atomic_int destroy_result;
} destroying_logger;

static void destroy_from_the_log(int level, const char *line, void *userdata) {
    (void)level;
    destroying_logger *d = userdata;
    sf_runtime *runtime = atomic_load(&d->runtime);
    if (runtime == NULL || line == NULL || strstr(line, "sf_subscribe_session_state") == NULL) return;
    if (atomic_fetch_add(&d->calls, 1) == 0) atomic_store(&d->destroy_result, sf_runtime_destroy(runtime));
}

void test_logs_destroy_from_inside_the_log_function_is_ebusy(void) {
    /* Forbidden by the header, and answered: SF_EBUSY, never a hang or a crash. */
    destroying_logger d;
    atomic_init(&d.runtime, NULL);
    atomic_init(&d.calls, 0);
    atomic_init(&d.destroy_result, 1);
    sf_options options;
    sf_options_init(&options);
    options.log = destroy_from_the_log;
    options.log_userdata = &d;
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    atomic_store(&d.runtime, runtime);
    /* A refused subscribe logs its reason on this thread, inside which the host destroys. */
    sf_observer observer = {.size = 1};
    sf_subscription sub;
    CHECK_CODE(sf_subscribe_session_state(runtime, &observer, &sub), SF_EINVAL);
    CHECK_EQ_INT(atomic_load(&d.calls), 1);
    CHECK_EQ_INT(atomic_load(&d.destroy_result), SF_EBUSY);
    /* The runtime is still there, and destroys normally from outside. */
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}
