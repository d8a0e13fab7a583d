/* The file store's key from the host: sf_options.store_key / store_key_file / store_key_source. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static int create_with(const sf_options *options, sf_runtime **runtime) {
    *runtime = NULL;
    return sf_runtime_create(options, runtime);
}

static void write_file(const char *path, const void *bytes, size_t count, mode_t mode) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
    CHECK(fd >= 0);
    if (fd < 0) return;
    CHECK_EQ_INT(write(fd, bytes, count), (long long)count);
    fchmod(fd, mode);
    close(fd);
}

/* The bytes of `path` into `buffer` (up to `size`); the count, -1 if it cannot be read. */
static long read_file(const char *path, unsigned char *buffer, size_t size) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    long count = (long)read(fd, buffer, size);
    close(fd);
    return count;
}

void test_store_key_options_are_validated(void) {
    unsigned char key[32];
    memset(key, 0x42, sizeof key);
    sf_options options;
    sf_runtime *runtime;

    /* Defaults: no key, automatic source. */
    sf_options_init(&options);
    CHECK(options.store_key == NULL);
    CHECK_EQ_INT(options.store_key_size, 0);
    CHECK(options.store_key_file == NULL);
    CHECK_EQ_INT(options.store_key_source, SF_STORE_KEY_AUTOMATIC);

    /* A key without a store. */
    options.store_key = key;
    options.store_key_size = sizeof key;
    CHECK_CODE(create_with(&options, &runtime), SF_EINVAL);
    CHECK(runtime == NULL);

    sf_options_init(&options);
    options.store_directory = "/tmp/sessionflow-c-store-key-never-made";
    options.store_key = key;
    options.store_key_size = 16; /* not a 256-bit key */
    CHECK_CODE(create_with(&options, &runtime), SF_EINVAL);
    options.store_key_size = 0; /* a pointer without a size */
    CHECK_CODE(create_with(&options, &runtime), SF_EINVAL);
    options.store_key = NULL;
    options.store_key_size = 32; /* a size without a pointer */
    CHECK_CODE(create_with(&options, &runtime), SF_EINVAL);
    options.store_key = key;
    options.store_key_file = "/nonexistent/key"; /* both */
    CHECK_CODE(create_with(&options, &runtime), SF_EINVAL);
    options.store_key = NULL;
    options.store_key_size = 0; /* a key file that does not exist */
    CHECK_CODE(create_with(&options, &runtime), SF_EINVAL);
    options.store_key_file = NULL;
    options.store_key_source = 7;
    CHECK_CODE(create_with(&options, &runtime), SF_EINVAL);
    CHECK(runtime == NULL);
    CHECK(access("/tmp/sessionflow-c-store-key-never-made", F_OK) != 0);

    /* An older host (a size that ends before these fields) gets the defaults. */
    sf_options_init(&options);
    options.size = offsetof(sf_options, store_key);
    options.store_key_size = 5; /* beyond its size: never read */
    CHECK_CODE(create_with(&options, &runtime), SF_OK);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

/* Signs `member` in on a store keyed with `options` (the sign-in answering `expected`),
 * then destroys the runtime. */
static void sign_in_and_destroy(const sf_options *options, const char *member, int expected) {
    sf_runtime *runtime;
    CHECK_CODE(create_with(options, &runtime), SF_OK);
    if (runtime == NULL) return;
    sf_tokens tokens = test_tokens("store-key-access", "store-key-refresh", 3600, member);
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), expected);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
}

/* 1 if a runtime with `options` restores a session of `member` within `ms`. */
static int restores(const sf_options *options, const char *member, int ms) {
    sf_runtime *runtime;
    if (create_with(options, &runtime) != SF_OK) return 0;
    for (int i = 0; i < ms && sf_session_is_logged_in(runtime) != 1; i++) sf_test_sleep_ms(1);
    char buffer[64] = "";
    int restored = sf_session_is_logged_in(runtime) == 1 &&
                   sf_session_member_id(runtime, buffer, sizeof buffer) == SF_OK && strcmp(buffer, member) == 0;
    sf_runtime_destroy(runtime);
    return restored;
}

void test_store_key_from_the_host_opens_the_store_and_no_other_key_does(void) {
    char directory[] = "/tmp/sessionflow-c-store-key-XXXXXX";
    CHECK(mkdtemp(directory) != NULL);
    char store[128], store_file[160];
    snprintf(store, sizeof store, "%s/store", directory);
    snprintf(store_file, sizeof store_file, "%s/session.sfstore", store);

    unsigned char key[32];
    for (int i = 0; i < 32; i++) key[i] = (unsigned char)(i * 11 + 3);
    unsigned char host_copy[32];
    memcpy(host_copy, key, sizeof key);

    sf_options options;
    sf_options_init(&options);
    options.store_directory = store;
    options.store_key = host_copy;
    options.store_key_size = sizeof host_copy;
    sf_runtime *runtime;
    CHECK_CODE(create_with(&options, &runtime), SF_OK);
    /* The key was copied: the host may wipe its buffer at once. */
    memset(host_copy, 0, sizeof host_copy);
    if (runtime != NULL) {
        sf_tokens tokens = test_tokens("store-key-access", "store-key-refresh", 3600, "member-c");
        CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
        CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    }
    unsigned char before[4096];
    long size_before = read_file(store_file, before, sizeof before);
    CHECK(size_before > 0);

    /* The same key (from a key file of the host's this time: 64 hex digits) restores it. */
    char key_file[160], hex[66];
    snprintf(key_file, sizeof key_file, "%s/host.key", directory);
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", key[i]);
    hex[64] = '\n';
    write_file(key_file, hex, 65, 0600);
    sf_options_init(&options);
    options.store_directory = store;
    options.store_key_file = key_file;
    CHECK(restores(&options, "member-c", 5000));

    /* Another key does not open it, and does not overwrite it. */
    unsigned char other[32];
    memset(other, 0x5a, sizeof other);
    sf_options_init(&options);
    options.store_directory = store;
    options.store_key = other;
    options.store_key_size = sizeof other;
    CHECK(!restores(&options, "member-c", 300));
    /* a store it cannot read: the sign-in is refused (it would replace a session nobody read) */
    sign_in_and_destroy(&options, "mallory", SF_ESTORE);
    /* asked to replace it all the same: its write fails (the store never writes over a file it
     * cannot open), a store error, not a new store */
    sf_runtime *replacing;
    CHECK_CODE(create_with(&options, &replacing), SF_OK);
    if (replacing != NULL) {
        sf_tokens tokens = test_tokens("store-key-access", "store-key-refresh", 3600, "mallory");
        CHECK_CODE(sf_session_sign_in_replacing_store(replacing, &tokens), SF_OK);
        CHECK_CODE(sf_runtime_destroy(replacing), SF_OK);
    }
    unsigned char after[4096];
    long size_after = read_file(store_file, after, sizeof after);
    CHECK_EQ_INT(size_after, size_before);
    CHECK(size_after == size_before && memcmp(before, after, (size_t)size_after) == 0);

    /* A key file others may read is refused at create. */
    chmod(key_file, 0644);
    sf_options_init(&options);
    options.store_directory = store;
    options.store_key_file = key_file;
    CHECK_CODE(create_with(&options, &runtime), SF_EINVAL);

    char command[256];
    snprintf(command, sizeof command, "rm -rf '%s'", directory);
    CHECK_EQ_INT(system(command), 0);
}
