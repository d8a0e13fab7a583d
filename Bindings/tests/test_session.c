/* Session calls from C: sign in, logout, local checks, tokens. */
#include "harness.h"

void test_session_sign_in_logout_and_local_checks(void) {
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(NULL, &runtime), SF_OK);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 0);
    sf_tokens tokens = test_tokens("access-1", "refresh-1", 3600, "member-42");
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 1);
    sf_session_state state;
    CHECK_CODE(sf_session_state_get(runtime, &state), SF_OK);
    CHECK_EQ_INT(state, SF_LOGGED_IN);
    char member[32];
    CHECK_CODE(sf_session_member_id(runtime, member, sizeof member), SF_OK);
    CHECK(strcmp(member, "member-42") == 0);
    CHECK_CODE(sf_session_resume(runtime), SF_OK);
    CHECK_CODE(sf_session_logout(runtime), SF_OK);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 0);
    CHECK_CODE(sf_session_member_id(runtime, member, sizeof member), SF_OK);
    CHECK(strcmp(member, "") == 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_session_illegal_transitions_are_estate(void) {
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(NULL, &runtime), SF_OK);
    CHECK_CODE(sf_session_logout(runtime), SF_ESTATE);
    CHECK_CODE(sf_session_reconfigure(runtime), SF_ESTATE);
    sf_tokens tokens = test_tokens("access-1", "refresh-1", 3600, "first");
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    sf_tokens other = test_tokens("access-2", "refresh-2", 3600, "second");
    CHECK_CODE(sf_session_sign_in(runtime, &other), SF_ESTATE);
    char member[32];
    CHECK_CODE(sf_session_member_id(runtime, member, sizeof member), SF_OK);
    CHECK(strcmp(member, "first") == 0); /* nothing changed */
    /* bad tokens: NULL, blank, size not set */
    CHECK_CODE(sf_session_sign_in(runtime, NULL), SF_EINVAL);
    sf_tokens blank = test_tokens("   ", NULL, 60, NULL);
    CHECK_CODE(sf_session_sign_in(runtime, &blank), SF_EINVAL);
    sf_tokens unsized = test_tokens("a", NULL, 60, NULL);
    unsized.size = 0;
    CHECK_CODE(sf_session_sign_in(runtime, &unsized), SF_EINVAL);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

void test_session_member_id_buffer_too_small_is_erange(void) {
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(NULL, &runtime), SF_OK);
    sf_tokens tokens = test_tokens("access-1", "refresh-1", 3600, "abcdef");
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    char buffer[8];
    memset(buffer, 'x', sizeof buffer);
    CHECK_CODE(sf_session_member_id(runtime, buffer, 6), SF_ERANGE); /* needs 7 with the NUL */
    CHECK(buffer[0] == 'x');                                          /* nothing written */
    CHECK_CODE(sf_session_member_id(runtime, buffer, 7), SF_OK);
    CHECK(strcmp(buffer, "abcdef") == 0);
    CHECK_CODE(sf_session_member_id(runtime, NULL, 7), SF_EINVAL);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

typedef struct token_answer {
    atomic_int calls;
    atomic_int result;
    char token[64];
    pthread_t thread;
} token_answer;

static void on_token(int result, const char *access_token, void *userdata) {
    token_answer *answer = userdata;
    answer->thread = pthread_self();
    snprintf(answer->token, sizeof answer->token, "%s", access_token ? access_token : "(null)");
    atomic_store(&answer->result, result);
    atomic_fetch_add(&answer->calls, 1);
}

void test_session_fresh_token_runs_its_callback_on_the_loop_thread(void) {
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(NULL, &runtime), SF_OK);
    sf_tokens tokens = test_tokens("access-1", "refresh-1", 3600, NULL);
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    token_answer answer;
    memset(&answer, 0, sizeof answer);
    CHECK_CODE(sf_session_fresh_token(runtime, on_token, &answer), SF_OK);
    WAIT_FOR(atomic_load(&answer.calls) == 1);
    CHECK_EQ_INT(atomic_load(&answer.calls), 1);
    CHECK_EQ_INT(atomic_load(&answer.result), SF_OK);
    CHECK(strcmp(answer.token, "access-1") == 0);
    CHECK(!pthread_equal(answer.thread, pthread_self()));
    CHECK_CODE(sf_session_fresh_token(runtime, NULL, NULL), SF_EINVAL);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    sf_test_sleep_ms(10);
    CHECK_EQ_INT(atomic_load(&answer.calls), 1);
}

void test_session_fresh_token_when_logged_out(void) {
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(NULL, &runtime), SF_OK);
    token_answer answer;
    memset(&answer, 0, sizeof answer);
    CHECK_CODE(sf_session_fresh_token(runtime, on_token, &answer), SF_OK);
    WAIT_FOR(atomic_load(&answer.calls) == 1);
    CHECK_EQ_INT(atomic_load(&answer.result), SF_ENOTLOGGEDIN);
    CHECK(strcmp(answer.token, "(null)") == 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}
