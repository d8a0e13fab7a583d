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
    fflush(NULL);
    pid_t child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        setenv("SF_TEST_FRESH_PROCESS", "1", 1);
        /* Its verdict line stays out of this suite's output; what fails goes to stderr. */
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) dup2(null, STDOUT_FILENO);
        execl("/proc/self/exe", "sessionflow-tests", "load_relocation_tables_are_released_after_load", (char *)NULL);
        _exit(127);
    }
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
    /* The shipped library's tables are ~240 pages; the debug build's more. */
    CHECK(pages > 16);
    if (kept) fprintf(stderr, "  %ld of %ld pages of the relocation table are resident\n", kept, pages);
    CHECK(kept == 0);
}
