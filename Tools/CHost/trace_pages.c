/* Drives libsessionflow along the path whose code pages Bindings/startup-order.txt packs
 * together (scripts/startup-order.sh): loaded, sf_runtime_create, a sign-in (key-file store
 * in STORE_DIRECTORY), then SECONDS of idling. What it touches is recorded by
 * Tools/CHost/trace_audit.c, loaded as LD_AUDIT: from the moment the library is mapped, so its
 * initializers too (a tracer inside this program could only start after dlopen).
 *
 * Usage: SF_TRACE_OUTPUT=pages.txt LD_AUDIT=trace_audit.so trace_pages LIBRARY STORE_DIRECTORY SECONDS */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "sessionflow.h"

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: trace_pages LIBRARY STORE_DIRECTORY SECONDS\n");
        return 64;
    }
    /* As the idle host does: libcurl loaded and initialized first. */
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
    if (!options_init || !runtime_create || !sign_in) {
        fprintf(stderr, "trace_pages: not a libsessionflow\n");
        return 1;
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
    _exit(0); /* the runtime is left running: what it does after the trace is not traced */
}
