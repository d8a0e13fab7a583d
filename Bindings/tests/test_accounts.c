/* Several accounts from C: listed, switched, signed out one at a time (a store directory). */
#include "harness.h"

#include <stdlib.h>
#include <unistd.h>

/* A runtime on the store in `directory`. */
static sf_runtime *open_runtime(const char *directory) {
    sf_options options;
    sf_options_init(&options);
    options.store_directory = directory;
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    return runtime;
}

/* A runtime on a new store (its directory written into `directory`). */
static sf_runtime *accounts_runtime(char *directory) {
    strcpy(directory, "/tmp/sf-accounts-XXXXXX");
    CHECK(mkdtemp(directory) != NULL);
    strcat(directory, "/store");
    return open_runtime(directory);
}

static void remove_directory(char *directory) {
    char command[128];
    *strrchr(directory, '/') = 0;
    snprintf(command, sizeof command, "rm -rf '%s'", directory);
    CHECK_EQ_INT(system(command), 0);
}

void test_accounts_listed_switched_and_signed_out_one_by_one(void) {
    char directory[64];
    sf_runtime *runtime = accounts_runtime(directory);
    char list[64];
    size_t needed = 0;
    CHECK_CODE(sf_session_accounts(runtime, list, sizeof list, &needed), SF_OK);
    CHECK_EQ_INT((int)needed, 1);
    CHECK(list[0] == 0);

    sf_tokens alice = test_tokens("alice-access", "alice-refresh", 3600, "alice");
    sf_tokens bob = test_tokens("bob-access", "bob-refresh", 3600, "bob");
    CHECK_CODE(sf_session_sign_in(runtime, &alice), SF_OK);
    CHECK_CODE(sf_session_add_account(runtime, &bob), SF_OK);
    CHECK_CODE(sf_session_accounts(runtime, list, sizeof list, &needed), SF_OK);
    CHECK_EQ_INT((int)needed, 11);
    CHECK(memcmp(list, "alice\0bob\0\0", 11) == 0);
    char active[16];
    CHECK_CODE(sf_session_active_account(runtime, active, sizeof active), SF_OK);
    CHECK(strcmp(active, "bob") == 0);
    char member[16];
    CHECK_CODE(sf_session_member_id(runtime, member, sizeof member), SF_OK);
    CHECK(strcmp(member, "bob") == 0);

    CHECK_CODE(sf_session_switch_account(runtime, "alice"), SF_OK);
    CHECK_CODE(sf_session_active_account(runtime, active, sizeof active), SF_OK);
    CHECK(strcmp(active, "alice") == 0);
    CHECK_CODE(sf_session_member_id(runtime, member, sizeof member), SF_OK);
    CHECK(strcmp(member, "alice") == 0);
    sf_session_state state;
    CHECK_CODE(sf_session_account_state(runtime, "bob", &state), SF_OK);
    CHECK_EQ_INT(state, SF_LOGGED_IN);

    /* bob (in the background) signs out; alice stays signed in and active */
    CHECK_CODE(sf_session_logout_account(runtime, "bob"), SF_OK);
    CHECK_CODE(sf_session_accounts(runtime, list, sizeof list, &needed), SF_OK);
    CHECK(memcmp(list, "alice\0\0", 7) == 0);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 1);
    CHECK_CODE(sf_session_account_state(runtime, "bob", &state), SF_EINVAL);

    CHECK_CODE(sf_session_logout_all(runtime), SF_OK);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 0);
    CHECK_CODE(sf_session_accounts(runtime, list, sizeof list, &needed), SF_OK);
    CHECK_EQ_INT((int)needed, 1);
    CHECK_CODE(sf_session_logout_all(runtime), SF_OK); /* nobody left: still fine */
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);

    /* a new runtime on the same store finds what the last one left: nothing */
    runtime = open_runtime(directory);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    remove_directory(directory);
}

void test_accounts_restart_restores_the_active_one_and_lists_the_others(void) {
    char directory[64];
    sf_runtime *runtime = accounts_runtime(directory);
    sf_tokens alice = test_tokens("alice-access", "alice-refresh", 3600, "alice");
    sf_tokens bob = test_tokens("bob-access", "bob-refresh", 3600, "bob");
    CHECK_CODE(sf_session_sign_in(runtime, &alice), SF_OK);
    CHECK_CODE(sf_session_add_account(runtime, &bob), SF_OK);
    CHECK_CODE(sf_session_switch_account(runtime, "alice"), SF_OK);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK); /* waits for the store's last write */

    runtime = open_runtime(directory);
    char active[16];
    CHECK_CODE(sf_session_active_account(runtime, active, sizeof active), SF_OK);
    CHECK(strcmp(active, "alice") == 0);
    char list[64];
    size_t needed = 0;
    CHECK_CODE(sf_session_accounts(runtime, list, sizeof list, &needed), SF_OK);
    CHECK(memcmp(list, "alice\0bob\0\0", 11) == 0);
    CHECK_CODE(sf_session_switch_account(runtime, "bob"), SF_OK);
    char member[16];
    CHECK_CODE(sf_session_member_id(runtime, member, sizeof member), SF_OK);
    CHECK(strcmp(member, "bob") == 0);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    remove_directory(directory);
}

void test_accounts_bad_input_is_einval_and_changes_nothing(void) {
    char directory[64];
    sf_runtime *runtime = accounts_runtime(directory);
    sf_tokens alice = test_tokens("alice-access", "alice-refresh", 3600, "alice");
    CHECK_CODE(sf_session_sign_in(runtime, &alice), SF_OK);
    char list[8];
    size_t needed = 0;
    memset(list, 'x', sizeof list);
    CHECK_CODE(sf_session_accounts(runtime, list, 6, &needed), SF_ERANGE); /* needs 7 */
    CHECK_EQ_INT((int)needed, 7);
    CHECK(list[0] == 'x');
    CHECK_CODE(sf_session_accounts(runtime, NULL, 0, &needed), SF_ERANGE); /* asks the size */
    CHECK_EQ_INT((int)needed, 7);
    CHECK_CODE(sf_session_accounts(runtime, NULL, 4, &needed), SF_EINVAL);
    CHECK_CODE(sf_session_accounts(NULL, list, sizeof list, &needed), SF_EINVAL);
    CHECK_CODE(sf_session_switch_account(runtime, "carol"), SF_EINVAL);
    CHECK_CODE(sf_session_switch_account(runtime, NULL), SF_EINVAL);
    CHECK_CODE(sf_session_logout_account(runtime, "carol"), SF_EINVAL);
    CHECK_CODE(sf_session_logout_account(runtime, NULL), SF_EINVAL);
    sf_session_state state;
    CHECK_CODE(sf_session_account_state(runtime, NULL, &state), SF_EINVAL);
    CHECK_CODE(sf_session_account_state(runtime, "alice", NULL), SF_EINVAL);
    CHECK_CODE(sf_session_add_account(runtime, NULL), SF_EINVAL);
    CHECK_CODE(sf_session_add_account(runtime, &alice), SF_ESTATE); /* signed in already */
    char active[3];
    CHECK_CODE(sf_session_active_account(runtime, active, sizeof active), SF_ERANGE);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 1);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_CODE(sf_session_switch_account(runtime, "alice"), SF_ECLOSED);
    remove_directory(directory);
}
