/* Which pages of libsessionflow's code a C host touches from sf_runtime_create through a
 * sign-in and SECONDS of idling — the start-up and idle path that Bindings/startup-order.txt
 * packs together (scripts/startup-order.sh).
 *
 * The library is loaded, its code mapping made inaccessible, and each first touch of a page
 * caught (SIGSEGV): the page is recorded and opened again. The kernel's fault-around (which
 * maps 16 neighbours of a faulted page, and is what makes scattered code expensive in RSS) is
 * thereby out of the picture: the pages recorded are the ones executed.
 *
 * Usage: trace_pages LIBRARY STORE_DIRECTORY SECONDS OUTPUT
 * OUTPUT: one line per touched page, its offset from the library's load address (hex); "-"
 * when Tools/CHost/trace_audit.c traces (LD_AUDIT: from the library's mapping on, which
 * includes its load-time code).
 * Prints "TRACE <text KiB> <touched pages>". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "sessionflow.h"

static uintptr_t text_start, text_end;
static unsigned char *touched;

static void on_fault(int signal_number, siginfo_t *info, void *context) {
    (void)context;
    uintptr_t address = (uintptr_t)info->si_addr;
    if (address >= text_start && address < text_end) {
        uintptr_t page = address & ~(uintptr_t)4095;
        touched[(page - text_start) >> 12] = 1;
        /* Failing (too many mappings), the same instruction would fault forever. */
        if (mprotect((void *)page, 4096, PROT_READ | PROT_EXEC) != 0) _exit(2);
        return;
    }
    signal(signal_number, SIG_DFL);
    raise(signal_number);
}

/* The library's executable mapping (one, with lld's layout). */
static int find_text(void) {
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps) return -1;
    char line[1024];
    while (fgets(line, sizeof line, maps)) {
        unsigned long start, end;
        char permissions[8];
        if (strstr(line, "libsessionflow") && sscanf(line, "%lx-%lx %7s", &start, &end, permissions) == 3 &&
            strcmp(permissions, "r-xp") == 0) {
            text_start = start;
            text_end = end;
        }
    }
    fclose(maps);
    return text_start ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: trace_pages LIBRARY STORE_DIRECTORY SECONDS OUTPUT\n");
        return 64;
    }
    void *curl = dlopen("libcurl.so.4", RTLD_NOW | RTLD_GLOBAL);
    if (curl) {
        long (*global_init)(long) = (long (*)(long))dlsym(curl, "curl_global_init");
        if (global_init) global_init(3);
    }
    void *library = dlopen(argv[1], RTLD_NOW);
    if (!library) {
        fprintf(stderr, "trace_pages: %s\n", dlerror());
        return 1;
    }
    void (*options_init)(sf_options *) = (void (*)(sf_options *))dlsym(library, "sf_options_init");
    int (*runtime_create)(const sf_options *, sf_runtime **) =
        (int (*)(const sf_options *, sf_runtime **))dlsym(library, "sf_runtime_create");
    int (*sign_in)(sf_runtime *, const sf_tokens *) =
        (int (*)(sf_runtime *, const sf_tokens *))dlsym(library, "sf_session_sign_in");
    /* OUTPUT "-": Tools/CHost/trace_audit.c (LD_AUDIT) traces, from before the library's
     * initializers; this program only drives the library. */
    int audited = strcmp(argv[4], "-") == 0;
    Dl_info loaded;
    if (!options_init || !runtime_create || !sign_in || !dladdr((void *)runtime_create, &loaded) ||
        (!audited && find_text() != 0)) {
        fprintf(stderr, "trace_pages: not a libsessionflow\n");
        return 1;
    }
    if (!audited) {
        touched = calloc((text_end - text_start) >> 12, 1);
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_sigaction = on_fault;
        action.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigaction(SIGSEGV, &action, NULL);
        mprotect((void *)text_start, text_end - text_start, PROT_NONE);
    }

    sf_options options;
    options_init(&options);
    options.store_directory = argv[2];
    options.store_key_source = SF_STORE_KEY_FILE;
    sf_runtime *runtime = NULL;
    sf_tokens tokens = {.size = sizeof tokens, .access_token = "trace-access", .refresh_token = "trace-refresh",
                        .expires_in = 3600, .member_id = "trace"};
    if (runtime_create(&options, &runtime) != SF_OK || sign_in(runtime, &tokens) != SF_OK) {
        fprintf(stderr, "trace_pages: the runtime did not start\n");
        return 1;
    }
    sleep((unsigned)atoi(argv[3]));
    if (audited) _exit(0); /* the audit library wrote the pages as they were touched */

    FILE *output = fopen(argv[4], "w");
    if (!output) return 1;
    long pages = 0;
    uintptr_t base = (uintptr_t)loaded.dli_fbase;
    for (uintptr_t page = 0; page < (text_end - text_start) >> 12; page++) {
        if (!touched[page]) continue;
        pages++;
        fprintf(output, "%lx\n", (unsigned long)(text_start + (page << 12) - base));
    }
    fclose(output);
    printf("TRACE %lu %ld\n", (unsigned long)((text_end - text_start) >> 10), pages);
    fflush(stdout);
    _exit(0); /* the runtime is left running: what it does after the trace is not traced */
}
