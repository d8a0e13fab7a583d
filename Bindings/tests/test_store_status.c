/* The store status from C (issue 14.5): an unreadable store is told apart from "no session",
 * a sign-in does not replace it unless the host asks, and the stored session comes back when
 * the store can be read again. A real file store; the fault is a key file open to its group
 * (refused even when the tests run as root, who ignores permission bits). */
#include "harness.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* The bytes of `path` (at most sizeof buffer); -1 if it cannot be read. */
static long file_bytes(const char *path, unsigned char *buffer, size_t size) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    long total = 0;
    for (;;) {
        ssize_t got = read(fd, buffer + total, size - (size_t)total);
        if (got <= 0) break;
        total += got;
    }
    close(fd);
    return total;
}

typedef struct store_fixture {
    char directory[64];
    char store[128];
    char key[128];
    unsigned char before[8192];
    long before_size;
} store_fixture;

/* A store holding alice's session, its key then made unreadable (mode 0640). */
static void make_unreadable_store(store_fixture *fixture) {
    strcpy(fixture->directory, "/tmp/sf-c-store-XXXXXX");
    CHECK(mkdtemp(fixture->directory) != NULL);
    chmod(fixture->directory, 0700);
    snprintf(fixture->store, sizeof fixture->store, "%s/session.sfstore", fixture->directory);
    snprintf(fixture->key, sizeof fixture->key, "%s/session.sfstore.key", fixture->directory);
    sf_options options;
    sf_options_init(&options);
    options.store_directory = fixture->directory;
    sf_runtime *writer = NULL;
    CHECK_CODE(sf_runtime_create(&options, &writer), SF_OK);
    sf_tokens alice = test_tokens("alice-access", "alice-refresh", 3600, "alice");
    CHECK_CODE(sf_session_sign_in(writer, &alice), SF_OK);
    CHECK_CODE(sf_runtime_destroy(writer), SF_OK); /* the write has landed */
    fixture->before_size = file_bytes(fixture->store, fixture->before, sizeof fixture->before);
    CHECK(fixture->before_size > 0);
    CHECK_EQ_INT(chmod(fixture->key, 0640), 0);
}

/* The store file is byte for byte what alice's sign-in wrote. */
static int store_unchanged(const store_fixture *fixture) {
    unsigned char now[8192];
    long size = file_bytes(fixture->store, now, sizeof now);
    return size == fixture->before_size && memcmp(now, fixture->before, (size_t)size) == 0;
}

static void remove_store(const store_fixture *fixture) {
    char command[160];
    snprintf(command, sizeof command, "rm -rf '%s'", fixture->directory);
    CHECK_EQ_INT(system(command), 0);
}

typedef struct status_log {
    atomic_int count;
    atomic_int last;
    atomic_int unavailable_with_reason; /* an UNAVAILABLE status came with a reason naming the key */
    atomic_int empty_reason_otherwise;  /* every other status came with "" */
    atomic_int completes;
    atomic_int releases;
} status_log;

static void log_status(sf_store_status status, const char *reason, void *userdata) {
    status_log *log = userdata;
    if (status == SF_STORE_UNAVAILABLE && reason && strstr(reason, "session.sfstore.key")) {
        atomic_fetch_add(&log->unavailable_with_reason, 1);
    }
    if (status != SF_STORE_UNAVAILABLE && reason && reason[0] == 0) {
        atomic_fetch_add(&log->empty_reason_otherwise, 1);
    }
    atomic_store(&log->last, (int)status);
    atomic_fetch_add(&log->count, 1);
}

static void log_complete(void *userdata) { atomic_fetch_add(&((status_log *)userdata)->completes, 1); }
static void log_release(void *userdata) { atomic_fetch_add(&((status_log *)userdata)->releases, 1); }

void test_store_status_tells_an_unreadable_store_from_no_session(void) {
    store_fixture fixture;
    make_unreadable_store(&fixture);
    sf_options options;
    sf_options_init(&options);
    options.store_directory = fixture.directory;
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);

    /* The state alone says logged out; the store status says why there is no session. */
    sf_session_state state;
    CHECK_CODE(sf_session_state_get(runtime, &state), SF_OK);
    CHECK_EQ_INT(state, SF_LOGGED_OUT);
    sf_store_status status = SF_STORE_READING;
    char reason[512];
    WAIT_FOR(sf_session_store_status(runtime, &status, NULL, 0) == SF_OK && status == SF_STORE_UNAVAILABLE);
    CHECK_CODE(sf_session_store_status(runtime, &status, reason, sizeof reason), SF_OK);
    CHECK_EQ_INT(status, SF_STORE_UNAVAILABLE);
    CHECK(strstr(reason, fixture.key) != NULL);
    CHECK(strstr(reason, "alice-access") == NULL);

    /* Buffers and handles, as the other functions with buffers. */
    char small[4];
    memset(small, 'x', sizeof small);
    CHECK_CODE(sf_session_store_status(runtime, &status, small, sizeof small), SF_ERANGE);
    CHECK(small[0] == 'x');
    CHECK_CODE(sf_session_store_status(runtime, NULL, reason, sizeof reason), SF_EINVAL);
    CHECK_CODE(sf_session_store_status(NULL, &status, reason, sizeof reason), SF_EINVAL);

    /* Observed: the current status first, with its reason. */
    status_log log;
    memset(&log, 0, sizeof log);
    atomic_store(&log.last, -1);
    sf_store_observer observer;
    memset(&observer, 0, sizeof observer);
    observer.size = sizeof observer;
    observer.on_status = log_status;
    observer.on_complete = log_complete;
    observer.release = log_release;
    observer.userdata = &log;
    sf_subscription subscription = 0;
    CHECK_CODE(sf_subscribe_store_status(runtime, &observer, &subscription), SF_OK);
    CHECK(subscription != 0);
    WAIT_FOR(atomic_load(&log.count) >= 1);
    CHECK_EQ_INT(atomic_load(&log.last), SF_STORE_UNAVAILABLE);
    CHECK(atomic_load(&log.unavailable_with_reason) >= 1);
    CHECK_CODE(sf_subscribe_store_status(runtime, NULL, &subscription), SF_EINVAL);

    /* A sign-in would replace a session it has not read: refused, nothing changes. */
    sf_tokens bob = test_tokens("bob-access", "bob-refresh", 3600, "bob");
    CHECK_CODE(sf_session_sign_in(runtime, &bob), SF_ESTORE);
    CHECK_CODE(sf_session_state_get(runtime, &state), SF_OK);
    CHECK_EQ_INT(state, SF_LOGGED_OUT);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 0);
    sf_test_sleep_ms(100);
    CHECK(store_unchanged(&fixture));

    /* The fault goes: the read is retried (every 5 s) and alice's session is restored. */
    CHECK_EQ_INT(chmod(fixture.key, 0600), 0);
    WAIT_FOR(atomic_load(&log.last) == SF_STORE_AVAILABLE);
    CHECK_EQ_INT(atomic_load(&log.last), SF_STORE_AVAILABLE);
    CHECK(atomic_load(&log.empty_reason_otherwise) >= 1);
    WAIT_FOR(sf_session_is_logged_in(runtime) == 1);
    char member[32];
    CHECK_CODE(sf_session_member_id(runtime, member, sizeof member), SF_OK);
    CHECK(strcmp(member, "alice") == 0);
    CHECK_CODE(sf_session_store_status(runtime, &status, reason, sizeof reason), SF_OK);
    CHECK_EQ_INT(status, SF_STORE_AVAILABLE);
    CHECK(strcmp(reason, "") == 0);
    /* With the store read, a sign-in is an ordinary one again (alice is signed in). */
    CHECK_CODE(sf_session_sign_in(runtime, &bob), SF_ESTATE);

    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK_EQ_INT(atomic_load(&log.completes), 1);
    CHECK_EQ_INT(atomic_load(&log.releases), 1);
    CHECK_CODE(sf_session_store_status(runtime, &status, NULL, 0), SF_ECLOSED);
    remove_store(&fixture);
}

void test_store_status_sign_in_replacing_store_is_the_hosts_choice(void) {
    store_fixture fixture;
    make_unreadable_store(&fixture);
    sf_options options;
    sf_options_init(&options);
    options.store_directory = fixture.directory;
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    sf_store_status status = SF_STORE_READING;
    WAIT_FOR(sf_session_store_status(runtime, &status, NULL, 0) == SF_OK && status == SF_STORE_UNAVAILABLE);
    CHECK_EQ_INT(status, SF_STORE_UNAVAILABLE);
    sf_tokens bob = test_tokens("bob-access", "bob-refresh", 3600, "bob");
    CHECK_CODE(sf_session_sign_in_replacing_store(runtime, NULL), SF_EINVAL);
    CHECK_CODE(sf_session_sign_in_replacing_store(NULL, &bob), SF_EINVAL);
    CHECK_CODE(sf_session_sign_in_replacing_store(runtime, &bob), SF_OK);
    CHECK_EQ_INT(sf_session_is_logged_in(runtime), 1);
    char member[32];
    CHECK_CODE(sf_session_member_id(runtime, member, sizeof member), SF_OK);
    CHECK(strcmp(member, "bob") == 0);
    /* The file store refuses to write over a file it cannot read: still alice's bytes. */
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    CHECK(store_unchanged(&fixture));
    CHECK_CODE(sf_session_sign_in_replacing_store(runtime, &bob), SF_ECLOSED);
    remove_store(&fixture);
}
