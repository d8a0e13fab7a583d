/* What a host hands in is bounded and checked (issue 29, point 7): tokens and member ids have
 * size limits, a member id or account key must be valid UTF-8 (it would come back changed),
 * every refusal names its field in sf_last_error_message, and a host's string with control
 * characters reaches the log function escaped (one call, one line). */
#define _GNU_SOURCE
#include "harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static sf_runtime *host_input_runtime(sf_options *options) {
    sf_runtime *rt = NULL;
    CHECK_CODE(sf_runtime_create(options, &rt), SF_OK);
    return rt;
}

static int last_error_says(const char *needle) {
    const char *message = sf_last_error_message();
    int found = message && strstr(message, needle) != NULL;
    if (!found) fprintf(stderr, "    sf_last_error_message: %s (wanted \"%s\")\n", message ? message : "(null)", needle);
    return found;
}

void test_host_input_tokens_over_their_limit_are_refused_naming_the_field(void) {
    sf_options options;
    sf_options_init(&options);
    sf_runtime *rt = host_input_runtime(&options);
    if (!rt) return;
    size_t length = 64 * 1024 + 1;
    char *huge = malloc(length + 1);
    memset(huge, 'a', length);
    huge[length] = '\0';
    sf_tokens tokens = test_tokens(huge, "refresh", 3600, "member");
    CHECK_CODE(sf_session_sign_in(rt, &tokens), SF_EINVAL);
    CHECK(last_error_says("sf_tokens.access_token is longer than 65536 bytes"));
    tokens = test_tokens("access", huge, 3600, "member");
    CHECK_CODE(sf_session_sign_in(rt, &tokens), SF_EINVAL);
    CHECK(last_error_says("sf_tokens.refresh_token"));
    huge[1025] = '\0'; /* a member id of 1 025 bytes */
    tokens = test_tokens("access", "refresh", 3600, huge);
    CHECK_CODE(sf_session_sign_in(rt, &tokens), SF_EINVAL);
    CHECK(last_error_says("sf_tokens.member_id is longer than 1024 bytes"));
    CHECK_EQ_INT(sf_session_is_logged_in(rt), 0);
    /* At the limits: taken. */
    huge[1024] = '\0';
    tokens = test_tokens("access", "refresh", 3600, huge);
    CHECK_CODE(sf_session_sign_in(rt, &tokens), SF_OK);
    free(huge);
    CHECK_CODE(sf_runtime_destroy(rt), SF_OK);
}

void test_host_input_member_ids_and_account_keys_must_be_utf8(void) {
    sf_options options;
    sf_options_init(&options);
    sf_runtime *rt = host_input_runtime(&options);
    if (!rt) return;
    sf_tokens tokens = test_tokens("access", "refresh", 3600, "m\xff\xfe");
    CHECK_CODE(sf_session_sign_in(rt, &tokens), SF_EINVAL);
    CHECK(last_error_says("sf_tokens.member_id is not valid UTF-8"));
    tokens = test_tokens("access", "refresh", 3600, "m\xc3\x28"); /* a broken 2-byte sequence */
    CHECK_CODE(sf_session_sign_in(rt, &tokens), SF_EINVAL);
    CHECK_EQ_INT(sf_session_is_logged_in(rt), 0);
    CHECK_CODE(sf_session_switch_account(rt, "k\xff"), SF_EINVAL);
    CHECK(last_error_says("account is not valid UTF-8"));
    CHECK_CODE(sf_session_logout_account(rt, NULL), SF_EINVAL);
    CHECK(last_error_says("account is NULL"));
    /* Valid UTF-8 beyond ASCII is a member id like any other. */
    tokens = test_tokens("access", "refresh", 3600, "m\xc3\xa9lanie");
    CHECK_CODE(sf_session_sign_in(rt, &tokens), SF_OK);
    char member[64];
    CHECK_CODE(sf_session_member_id(rt, member, sizeof member), SF_OK);
    CHECK(strcmp(member, "m\xc3\xa9lanie") == 0);
    CHECK_CODE(sf_runtime_destroy(rt), SF_OK);
}

void test_host_input_a_wrong_tokens_size_names_the_expected_size(void) {
    sf_options options;
    sf_options_init(&options);
    sf_runtime *rt = host_input_runtime(&options);
    if (!rt) return;
    sf_tokens tokens = test_tokens("access", "refresh", 3600, "member");
    tokens.size = sizeof tokens - 8;
    CHECK_CODE(sf_session_sign_in(rt, &tokens), SF_EINVAL);
    char expected[64];
    snprintf(expected, sizeof expected, "this library takes %zu", sizeof tokens);
    CHECK(last_error_says("sf_tokens.size is"));
    CHECK(last_error_says(expected));
    CHECK_CODE(sf_session_sign_in(rt, NULL), SF_EINVAL);
    CHECK(last_error_says("tokens is NULL"));
    CHECK_CODE(sf_runtime_destroy(rt), SF_OK);
}

typedef struct log_lines {
    pthread_mutex_t lock;
    char text[16384];
    size_t used;
    int lines;
} log_lines;

static void keep_line(int level, const char *line, void *userdata) {
    (void)level;
    log_lines *l = userdata;
    pthread_mutex_lock(&l->lock);
    int written = snprintf(l->text + l->used, sizeof l->text - l->used, "%s\n", line);
    if (written > 0 && l->used + (size_t)written < sizeof l->text) l->used += (size_t)written;
    l->lines++;
    pthread_mutex_unlock(&l->lock);
}

void test_host_input_control_characters_reach_the_log_escaped(void) {
    log_lines l;
    memset(&l, 0, sizeof l);
    pthread_mutex_init(&l.lock, NULL);
    sf_options options;
    sf_options_init(&options);
    options.log = keep_line;
    options.log_userdata = &l;
    options.log_level = SF_LOG_TRACE;
    sf_runtime *rt = host_input_runtime(&options);
    if (!rt) return;
    /* The session's events are logged with the member id the host signed in with. */
    sf_tokens tokens = test_tokens("access", "refresh", 3600, "evil\n2026-11-26 FORGED line \x1b[2J\xe2\x80\xae");
    CHECK_CODE(sf_session_sign_in(rt, &tokens), SF_OK);
    CHECK_CODE(sf_session_logout(rt), SF_OK);
    CHECK_CODE(sf_runtime_destroy(rt), SF_OK);
    CHECK(l.lines > 0);
    CHECK(strstr(l.text, "\n2026-11-26 FORGED") == NULL); /* no line of the key's making */
    CHECK(strchr(l.text, '\x1b') == NULL);
    CHECK(strstr(l.text, "\xe2\x80\xae") == NULL); /* RIGHT-TO-LEFT OVERRIDE */
    CHECK(strstr(l.text, "\\u{a}2026-11-26 FORGED") != NULL);
    if (sf_test_failures) fprintf(stderr, "    log: %s\n", l.text);
    pthread_mutex_destroy(&l.lock);
}

void test_host_input_control_characters_reach_standard_error_escaped(void) {
    /* Without a log function the lines go to standard error (SESSIONFLOW_LOG=debug shows the
     * member id): escaped there too. Standard error is a file for the while. */
    char path[] = "/tmp/sessionflow-stderr-XXXXXX";
    int file = mkstemp(path);
    CHECK(file >= 0);
    if (file < 0) return;
    fflush(stderr);
    int saved = dup(2);
    dup2(file, 2);
    setenv("SESSIONFLOW_LOG", "debug", 1);
    sf_options options;
    sf_options_init(&options);
    sf_runtime *rt = host_input_runtime(&options);
    unsetenv("SESSIONFLOW_LOG");
    if (rt) {
        sf_tokens tokens = test_tokens("access", "refresh", 3600, "evil\n2026-11-26 FORGED line \x1b[2J\xe2\x80\xae");
        CHECK_CODE(sf_session_sign_in(rt, &tokens), SF_OK);
        CHECK_CODE(sf_session_logout(rt), SF_OK);
        CHECK_CODE(sf_runtime_destroy(rt), SF_OK);
    }
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    static char text[65536];
    ssize_t length = pread(file, text, sizeof text - 1, 0);
    close(file);
    unlink(path);
    text[length > 0 ? length : 0] = '\0';
    CHECK(strstr(text, "\\u{a}2026-11-26 FORGED") != NULL); /* the line was written, escaped */
    CHECK(strstr(text, "\n2026-11-26 FORGED") == NULL);
    CHECK(strchr(text, '\x1b') == NULL);
    CHECK(strstr(text, "\xe2\x80\xae") == NULL);
    if (sf_test_failures) fprintf(stderr, "    standard error: %s\n", text);
}

void test_host_input_an_issuer_over_its_limit_is_refused(void) {
    size_t length = 8193;
    char *issuer = malloc(length + 1);
    memcpy(issuer, "https://as.example/", 19);
    memset(issuer + 19, 'a', length - 19);
    issuer[length] = '\0';
    sf_options options;
    sf_options_init(&options);
    options.issuer = issuer;
    options.client_id = "client";
    sf_runtime *rt = NULL;
    CHECK_CODE(sf_runtime_create(&options, &rt), SF_EINVAL);
    CHECK(rt == NULL);
    CHECK(last_error_says("issuer is longer than 8192 bytes"));
    issuer[1000] = '\0'; /* within the limit: taken */
    CHECK_CODE(sf_runtime_create(&options, &rt), SF_OK);
    if (rt) CHECK_CODE(sf_runtime_destroy(rt), SF_OK);
    free(issuer);
}
