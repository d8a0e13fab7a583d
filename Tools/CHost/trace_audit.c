/* An LD_AUDIT library for scripts/startup-order.sh: records the code pages of libsessionflow
 * that a process executes, from the moment the library is mapped — before its relocation and
 * its initializers (the Swift runtime's image registration, BoringSSL's set-up), which a tracer
 * that starts after dlopen (as the first one did) never sees, and so never ordered.
 *
 * la_objopen (the object mapped, not yet relocated) makes the library's executable mapping
 * inaccessible; each first touch faults, and the handler writes the page's offset in the
 * library (hex, one per line) to $SF_TRACE_OUTPUT and opens the page again. Written as it
 * happens (write(2) is async-signal-safe), so the traced process may end any way it likes.
 * Usage: SF_TRACE_OUTPUT=pages.txt LD_AUDIT=./trace_audit.so trace_pages LIBRARY STORE SECONDS
 * Test-tooling only (Linux, glibc, 4 KiB pages): not part of the library. Run with
 * SWIFT_BACKTRACE=enable=no: the Swift runtime's backtracer would take SIGSEGV over.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static uintptr_t text_start, text_end, bias;
static unsigned char *touched;
static int output = -1;

static void record(uintptr_t page) {
    char line[24];
    int length = 0;
    uintptr_t offset = page - bias;
    char digits[20];
    int count = 0;
    do {
        digits[count++] = "0123456789abcdef"[offset & 15];
        offset >>= 4;
    } while (offset);
    while (count) line[length++] = digits[--count];
    line[length++] = '\n';
    if (write(output, line, (size_t)length) != length) _exit(3);
}

static void on_fault(int signal_number, siginfo_t *info, void *context) {
    (void)context;
    int saved = errno;
    uintptr_t address = (uintptr_t)info->si_addr;
    if (address >= text_start && address < text_end) {
        uintptr_t page = address & ~(uintptr_t)4095;
        if (!touched[(page - text_start) >> 12]) {
            touched[(page - text_start) >> 12] = 1;
            record(page);
        }
        /* Failing (too many mappings), the same instruction would fault forever. */
        if (mprotect((void *)page, 4096, PROT_READ | PROT_EXEC) != 0) _exit(2);
        errno = saved;
        return;
    }
    signal(signal_number, SIG_DFL);
    raise(signal_number);
}

unsigned int la_version(unsigned int version) {
    return version < LAV_CURRENT ? version : LAV_CURRENT;
}

/* The executable mapping of the file `name` (lld's layout: one). */
static int find_text(const char *name) {
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps) return -1;
    char line[4096];
    while (fgets(line, sizeof line, maps)) {
        unsigned long start, end;
        char permissions[8];
        char *path = strchr(line, '/');
        if (!path) continue;
        path[strcspn(path, "\n")] = 0;
        if (strcmp(path, name) == 0 && sscanf(line, "%lx-%lx %7s", &start, &end, permissions) == 3 &&
            strcmp(permissions, "r-xp") == 0) {
            text_start = start;
            text_end = end;
        }
    }
    fclose(maps);
    return text_start ? 0 : -1;
}

unsigned int la_objopen(struct link_map *map, Lmid_t namespace_id, uintptr_t *cookie) {
    (void)namespace_id;
    (void)cookie;
    if (text_start || !strstr(map->l_name, "libsessionflow")) return 0;
    char resolved[4096];
    if (!realpath(map->l_name, resolved) || find_text(resolved) != 0) {
        fprintf(stderr, "trace_audit: no executable mapping of %s\n", map->l_name);
        _exit(1);
    }
    const char *path = getenv("SF_TRACE_OUTPUT");
    output = path ? open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
    touched = calloc((text_end - text_start) >> 12, 1);
    if (output < 0 || !touched) {
        fprintf(stderr, "trace_audit: set SF_TRACE_OUTPUT to a writable file\n");
        _exit(1);
    }
    bias = map->l_addr;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_fault;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    if (sigaction(SIGSEGV, &action, NULL) != 0 ||
        mprotect((void *)text_start, text_end - text_start, PROT_NONE) != 0) {
        fprintf(stderr, "trace_audit: cannot protect the library's code\n");
        _exit(1);
    }
    return 0;
}
