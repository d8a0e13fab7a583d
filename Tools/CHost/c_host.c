/* The host of the idle and start-up rows (issue 32: "a C host"): a process of C alone, so
 * that neither side of a comparison has the Swift runtime mapped, touched and warmed before
 * the library brings it. The benchmark compiles it with `cc` when it runs (SwiftPM's link of
 * an executable adds the Swift runtime) and starts one process per measurement:
 *
 *   c-host idle LIBRARY|- STORE|- SECONDS   a runtime signed in (1-hour token) on a key file
 *                                           store in STORE, or (`-`) a libuv loop with one
 *                                           1-hour timer; both load and initialize libcurl.
 *                                           Prints `IDLE switches cpu-ms rss-kib lib-kib anon-kib`.
 *   c-host sign-in LIBRARY DIRECTORY        a session signed in and stored in DIRECTORY.
 *   c-host startup LIBRARY|- DIRECTORY      sf_runtime_create → first on_state, once, in this
 *                                           fresh process (what a host pays when it starts),
 *                                           or (`-`) the floor: uv_loop_init + thread + one
 *                                           uv_async_send round trip. Prints `STARTUP ns`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cbaseline.h"

static const char *library_or_null(const char *argument) { return strcmp(argument, "-") == 0 ? NULL : argument; }

int main(int argc, char **argv) {
    char error[256] = {0};
    double ns = 0;
    if (argc == 5 && strcmp(argv[1], "idle") == 0) {
        return bl_idle_host(library_or_null(argv[2]), library_or_null(argv[3]), atof(argv[4]));
    }
    if (argc == 4 && strcmp(argv[1], "sign-in") == 0) {
        if (bl_sf_startup(argv[2], argv[3], 1, 0, &ns, error, sizeof error) != 0) {
            fprintf(stderr, "c-host sign-in: %s\n", error);
            return 1;
        }
        return 0;
    }
    if (argc == 4 && strcmp(argv[1], "startup") == 0) {
        if (library_or_null(argv[2]) == NULL) {
            ns = bl_uv_startup_ns();
        } else if (bl_sf_startup(argv[2], argv[3], 0, 0, &ns, error, sizeof error) != 0) {
            fprintf(stderr, "c-host startup: %s\n", error);
            return 1;
        }
        printf("STARTUP %.0f\n", ns);
        return 0;
    }
    fprintf(stderr, "usage: %s idle LIBRARY|- STORE|- SECONDS | sign-in LIBRARY DIRECTORY | startup LIBRARY|- DIRECTORY\n",
            argv[0]);
    return 2;
}
