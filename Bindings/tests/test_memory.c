/* Issue 17, point 1: after logout and destroy, no copy of a token or of the store's key is
 * left anywhere in the process's memory. The test reads its own memory (/proc/self/mem,
 * every readable region of /proc/self/maps) and counts the copies of each secret.
 *
 * The secrets are known to the test only masked (each byte XOR MASK), so the test's own
 * bookkeeping is not a copy: every buffer that held one in the clear (the host's side of
 * the password grant, the token callback's argument, a key file read) is masked and zeroed
 * at once. The tokens are the server's (Authlib, random): the signed-in pair, the pair the
 * library's refresh rotated to (the new access token seen in the token callback, the new
 * refresh token read back from the server's record of the revocation at logout), and
 * every key the store's key file held before and after logout (which rotates it).
 * The session is DPoP-bound (issue 31): the host hands over a DPoP private key with the
 * tokens; the refresh proves it, an authorization carries a proof by it, and its bytes — raw,
 * reversed (how BoringSSL's big-number words hold it), and the base64url text the host gave
 * and the store seals — are looked for too. */
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"
#include "oauth_fixture.h"

#define MASK 0xA5
#define MAX_SECRETS 16
#define MAX_LENGTH 512

/* Under a sanitizer the allocator is the sanitizer's: freed blocks wait in its quarantine
 * and are never handed out again soon, so the library's scrub of the cipher state that
 * swift-crypto frees uncleansed (Sources/SessionFileStore/CipherScrub.swift) cannot reach
 * them. There the store keys are reported, not held to 0; the tokens are held to 0 everywhere. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define UNDER_SANITIZER 1
#endif
#endif
#ifndef UNDER_SANITIZER
#define UNDER_SANITIZER 0
#endif

typedef struct masked_secret {
    const char *what;
    int is_key;
    unsigned char bytes[MAX_LENGTH];
    size_t length;
} masked_secret;

static masked_secret secrets[MAX_SECRETS];
static int secret_count;

/* Keeps `length` bytes at `clear` masked, then zeroes them. */
static void remember(const char *what, void *clear, size_t length) {
    if (secret_count == MAX_SECRETS || length == 0 || length > MAX_LENGTH) return;
    masked_secret *s = &secrets[secret_count++];
    s->what = what;
    s->is_key = strstr(what, "key") != NULL && strstr(what, "token") == NULL;
    s->length = length;
    unsigned char *bytes = clear;
    for (size_t i = 0; i < length; i++) s->bytes[i] = bytes[i] ^ MASK;
    explicit_bzero(clear, length);
}

/* The string value of "name" in a flat JSON object, copied into `out` (no escapes in the
 * server's tokens); its length, or 0. */
static size_t json_string(const char *json, const char *name, char *out, size_t size) {
    char key[64];
    snprintf(key, sizeof key, "\"%s\"", name);
    const char *at = strstr(json, key);
    if (!at) return 0;
    at = strchr(at + strlen(key), '"');
    if (!at) return 0;
    at++;
    size_t length = strcspn(at, "\"");
    if (length == 0 || length >= size) return 0;
    memcpy(out, at, length);
    out[length] = 0;
    return length;
}

/* Counts the copies of secret `s` in [start, end) of this process, read through `mem`
 * into `scan` in chunks that overlap by length-1 bytes (no copy straddles two reads). */
static long copies_in_range(int mem, const masked_secret *s, uintptr_t start, uintptr_t end, unsigned char *scan,
                            size_t scan_size) {
    long found = 0;
    for (uintptr_t at = start; at < end;) {
        size_t want = (size_t)(end - at) < scan_size ? (size_t)(end - at) : scan_size;
        ssize_t got = pread(mem, scan, want, (off_t)at);
        if (got <= 0) break;
        for (ssize_t i = 0; i + (ssize_t)s->length <= got; i++) {
            if ((scan[i] ^ MASK) != s->bytes[0]) continue;
            size_t k = 1;
            while (k < s->length && (scan[i + k] ^ MASK) == s->bytes[k]) k++;
            if (k == s->length) found++;
        }
        if ((size_t)got < s->length || at + (uintptr_t)got >= end) break;
        at += (uintptr_t)got - (s->length - 1);
    }
    explicit_bzero(scan, scan_size);
    return found;
}

/* Counts the copies of secret `s` in every readable region of this process, except the
 * scan's own buffer. */
static long copies_in_memory(const masked_secret *s, unsigned char *scan, size_t scan_size) {
    FILE *maps = fopen("/proc/self/maps", "r");
    int mem = open("/proc/self/mem", O_RDONLY);
    if (!maps || mem < 0) {
        if (maps) fclose(maps);
        if (mem >= 0) close(mem);
        return -1;
    }
    long found = 0;
    char line[512];
    long before;
    uintptr_t own_start = (uintptr_t)scan, own_end = own_start + scan_size;
    while (fgets(line, sizeof line, maps)) {
        uintptr_t start, end;
        char perms[5];
        if (sscanf(line, "%lx-%lx %4s", &start, &end, perms) != 3 || perms[0] != 'r') continue;
        if (strstr(line, "[vvar") || strstr(line, "[vsyscall]")) continue;
        /* Sanitizer shadow and reserved address space: terabytes of nothing. */
        if (end - start > ((uintptr_t)1 << 30)) continue;
        before = found;
        if (own_start < end && start < own_end) {
            /* The region holds the scan buffer (the kernel may merge it with a neighbour). */
            if (start < own_start) found += copies_in_range(mem, s, start, own_start, scan, scan_size);
            if (own_end < end) found += copies_in_range(mem, s, own_end, end, scan, scan_size);
        } else {
            found += copies_in_range(mem, s, start, end, scan, scan_size);
        }
        if (found > before) fprintf(stderr, "    %ld in %s", found - before, line);
    }
    fclose(maps);
    close(mem);
    return found;
}

/* Every 32-byte key of the store's key file (`directory`/session.sfstore.key or whatever
 * *.key file the store keeps), masked. */
static void remember_keys(const char *directory, const char *what) {
    DIR *dir = opendir(directory);
    if (!dir) return;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        size_t name_length = strlen(entry->d_name);
        if (name_length < 4 || strcmp(entry->d_name + name_length - 4, ".key") != 0) continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", directory, entry->d_name);
        int fd = open(path, O_RDONLY);
        if (fd < 0) continue;
        unsigned char key[32];
        while (read(fd, key, sizeof key) == (ssize_t)sizeof key) remember(what, key, sizeof key);
        explicit_bzero(key, sizeof key);
        close(fd);
    }
    closedir(dir);
}

typedef struct seen_token {
    atomic_int calls;
    atomic_int result;
} seen_token;

void dpop_test_key(char out[44], unsigned char raw[32]); /* test_dpop.c */

static void on_authorized_dpop(int result, const sf_authorization *authorization, void *userdata) {
    (void)authorization;
    atomic_int *calls = userdata;
    atomic_store(calls, result == SF_OK && authorization && authorization->header_count == 2 ? 1 : -1);
}

static void keep_masked(int result, const char *access_token, void *userdata) {
    seen_token *seen = userdata;
    if (result == SF_OK && access_token) {
        /* The argument is the library's buffer (borrowed): masked from it, never copied. */
        size_t length = strlen(access_token);
        if (secret_count < MAX_SECRETS && length <= MAX_LENGTH) {
            masked_secret *s = &secrets[secret_count++];
            s->what = "the refreshed access token";
            s->length = length;
            for (size_t i = 0; i < length; i++) s->bytes[i] = (unsigned char)access_token[i] ^ MASK;
        }
    }
    atomic_store(&seen->result, result);
    atomic_fetch_add(&seen->calls, 1);
}

void test_memory_no_token_or_key_is_left_after_logout_and_destroy(void) {
    const char *base = oauth_server();
    CHECK(base != NULL);
    if (!base) return;
    secret_count = 0;
    char directory[] = "/tmp/sf-memory-XXXXXX";
    CHECK(mkdtemp(directory) != NULL);

    /* The host signs a user in itself (a password grant), hands the tokens over, and wipes
     * its copies. */
    char url[512];
    snprintf(url, sizeof url, "%s/oauth/token", base);
    char *answer = calloc(1, 8192);
    int status = http_request(
        url, "grant_type=password&username=alice&password=correct+horse&client_id=sessionflow-public", answer, 8192,
        NULL, 0);
    CHECK_EQ_INT(status, 200);
    char access[MAX_LENGTH], refresh[MAX_LENGTH];
    size_t access_length = json_string(answer, "access_token", access, sizeof access);
    size_t refresh_length = json_string(answer, "refresh_token", refresh, sizeof refresh);
    explicit_bzero(answer, 8192);
    free(answer);
    CHECK(access_length > 0 && refresh_length > 0);

    sf_options options;
    sf_options_init(&options);
    char token_endpoint[512], revocation_endpoint[512];
    snprintf(token_endpoint, sizeof token_endpoint, "%s/oauth/token", base);
    snprintf(revocation_endpoint, sizeof revocation_endpoint, "%s/oauth/revoke", base);
    options.token_endpoint = token_endpoint;
    options.revocation_endpoint = revocation_endpoint;
    options.client_id = "sessionflow-public";
    options.store_directory = directory;
    options.store_key_source = SF_STORE_KEY_FILE;
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(&options, &runtime), SF_OK);
    if (!runtime) return;
    /* expires_in 0: the first token request refreshes through the network. */
    sf_tokens tokens = test_tokens(access, refresh, 0, "alice");
    char dpop_text[44];
    unsigned char dpop_raw[32], dpop_reversed[32];
    dpop_test_key(dpop_text, dpop_raw);
    for (int i = 0; i < 32; i++) dpop_reversed[i] = dpop_raw[31 - i];
    CHECK_CODE(sf_session_sign_in_dpop(runtime, &tokens, dpop_text), SF_OK);
    remember("the signed-in access token", access, access_length);
    remember("the signed-in refresh token", refresh, refresh_length);
    remember("the DPoP private key (raw)", dpop_raw, sizeof dpop_raw);
    remember("the DPoP private key (reversed)", dpop_reversed, sizeof dpop_reversed);
    remember("the DPoP private key (base64url)", dpop_text, strlen(dpop_text));
    explicit_bzero(&tokens, sizeof tokens);

    seen_token seen;
    memset(&seen, 0, sizeof seen);
    CHECK_CODE(sf_session_fresh_token(runtime, keep_masked, &seen), SF_OK);
    WAIT_FOR(atomic_load(&seen.calls) == 1);
    CHECK_CODE(atomic_load(&seen.result), SF_OK);
    /* A resource authorization: a proof by the DPoP key. */
    atomic_int authorized = 0;
    char resource[512];
    snprintf(resource, sizeof resource, "%s/api/resource", base);
    CHECK_CODE(sf_session_authorize(runtime, "GET", resource, on_authorized_dpop, &authorized), SF_OK);
    WAIT_FOR(atomic_load(&authorized) != 0);
    CHECK_EQ_INT(atomic_load(&authorized), 1);
    remember_keys(directory, "a store key before logout");

    long revocations = oauth_stat("/__stats", "revocations");
    CHECK_CODE(sf_session_logout(runtime), SF_OK);
    /* The revocation is sent after logout returns (best effort): wait for it. */
    WAIT_FOR(oauth_stat("/__stats", "revocations") > revocations);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);
    remember_keys(directory, "a store key after logout");

    /* The refresh token the refresh rotated to: the one the logout revoked. */
    char *last = calloc(1, 16384);
    char last_url[512];
    snprintf(last_url, sizeof last_url, "%s/__last_request", base);
    CHECK_EQ_INT(http_request(last_url, NULL, last, 16384, NULL, 0), 200);
    CHECK(strstr(last, "/oauth/revoke") != NULL);
    char rotated[MAX_LENGTH];
    size_t rotated_length = json_string(strstr(last, "\"form\"") ? strstr(last, "\"form\"") : last, "token", rotated,
                                        sizeof rotated);
    explicit_bzero(last, 16384);
    free(last);
    CHECK(rotated_length > 0);
    remember("the rotated refresh token", rotated, rotated_length);

    /* Secrets found: the four tokens, the DPoP key's three forms and at least two keys (the
     * key rotates at logout). */
    CHECK(secret_count >= 9);
    size_t scan_size = 1 << 20;
    unsigned char *scan = mmap(NULL, scan_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(scan != MAP_FAILED);
    if (scan == MAP_FAILED) return;
    long total = 0, keys_under_sanitizer = 0;
    for (int i = 0; i < secret_count; i++) {
        long copies = copies_in_memory(&secrets[i], scan, scan_size);
        if (copies != 0) fprintf(stderr, "    %ld copies of %s (%zu bytes)\n", copies, secrets[i].what, secrets[i].length);
        CHECK(copies >= 0);
        if (UNDER_SANITIZER && secrets[i].is_key) {
            keys_under_sanitizer += copies;
        } else {
            total += copies;
        }
    }
    CHECK_EQ_INT(total, 0);
    munmap(scan, scan_size);
    fprintf(stderr, "    (%d secrets looked for in the whole process: %ld copies", secret_count, total);
    if (UNDER_SANITIZER) fprintf(stderr, "; store keys in the sanitizer's quarantine, not counted: %ld", keys_under_sanitizer);
    fprintf(stderr, ")\n");
    char command[1100];
    snprintf(command, sizeof command, "rm -rf '%s'", directory);
    CHECK_EQ_INT(system(command), 0);
}
