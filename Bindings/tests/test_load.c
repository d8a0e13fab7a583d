/* Issue 32 (idle memory): the library's relocation tables — a MiB of R_X86_64_RELATIVE entries
 * for the Swift metadata linked in — are read by the loader once and released by the library
 * after it is relocated (Sources/CLinkShims/relocation_release.c): none of their whole pages
 * is resident in the process any more, and the library works. Checked in a process of its own
 * (the suite runs itself again for this test alone): other tests read all of their memory
 * (test_memory.c), which brings the pages back. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <stdlib.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

/* Whether the page at `address` is in this process's memory (/proc/self/pagemap bit 63). */
static int resident(int pagemap, uintptr_t address, long page) {
    uint64_t entry = 0;
    off_t offset = (off_t)(address / (uintptr_t)page) * (off_t)sizeof entry;
    if (pread(pagemap, &entry, sizeof entry, offset) != (ssize_t)sizeof entry) return -1;
    return (int)(entry >> 63);
}

static void check_in_this_process(void);

void test_load_relocation_tables_are_released_after_load(void) {
    if (getenv("SF_TEST_FRESH_PROCESS")) {
        check_in_this_process();
        return;
    }
    /* This suite again, this test alone, its verdict line kept out of this suite's output
     * (what fails goes to stderr); it exits non-zero if its filter matches no test. */
    extern char **environ;
    size_t count = 0;
    while (environ[count]) count++;
    char **environment = calloc(count + 2, sizeof *environment);
    CHECK(environment != NULL);
    if (!environment) return;
    for (size_t i = 0; i < count; i++) environment[i] = environ[i];
    environment[count] = "SF_TEST_FRESH_PROCESS=1";
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    char *arguments[] = {"sessionflow-tests", "load_relocation_tables_are_released_after_load", NULL};
    pid_t child = 0;
    int spawned = posix_spawn(&child, "/proc/self/exe", &actions, NULL, arguments, environment);
    posix_spawn_file_actions_destroy(&actions);
    free(environment);
    CHECK(spawned == 0);
    if (spawned != 0) return;
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void check_in_this_process(void) {
    Dl_info info;
    struct link_map *map = NULL;
    CHECK(dladdr1((void *)&sf_runtime_create, &info, (void **)&map, RTLD_DL_LINKMAP) && map);
    if (!map) return;
    uintptr_t rela = 0, size = 0;
    for (const ElfW(Dyn) *entry = map->l_ld; entry->d_tag != DT_NULL; entry++) {
        if (entry->d_tag == DT_RELA) rela = entry->d_un.d_ptr;
        if (entry->d_tag == DT_RELASZ) size = entry->d_un.d_val;
    }
    CHECK(rela != 0 && size > 0);
    if (rela < map->l_addr) rela += map->l_addr;
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t first = (rela + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1);
    uintptr_t end = (rela + size) & ~(uintptr_t)(page - 1);
    int pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    CHECK(pagemap >= 0);
    if (pagemap < 0) return;

    /* The library in use (a runtime, a sign-in, a token), and its tables still away. */
    sf_runtime *runtime = NULL;
    CHECK_CODE(sf_runtime_create(NULL, &runtime), SF_OK);
    sf_tokens tokens = test_tokens("load-access", "load-refresh", 3600, "load");
    CHECK_CODE(sf_session_sign_in(runtime, &tokens), SF_OK);
    CHECK(sf_session_is_logged_in(runtime) == 1);
    CHECK_CODE(sf_runtime_destroy(runtime), SF_OK);

    long pages = 0, kept = 0;
    for (uintptr_t address = first; address < end; address += (uintptr_t)page) {
        pages++;
        int present = resident(pagemap, address, page);
        CHECK(present >= 0);
        if (present == 1) kept++;
    }
    close(pagemap);
    /* The shipped library's table is ~250 pages, the debug build's ~80. */
    CHECK(pages > 16);
    if (kept) fprintf(stderr, "  %ld of %ld pages of the relocation table are resident\n", kept, pages);
    CHECK(kept == 0);
}
