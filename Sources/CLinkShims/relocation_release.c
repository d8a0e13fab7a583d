/* The library's relocation tables, released once the dynamic loader has applied them.
 *
 * libsessionflow.so carries ~42 000 relocations (986 KiB: R_X86_64_RELATIVE, one per absolute
 * pointer in the Swift metadata and witness tables of the runtime and packages linked in). The
 * loader reads every page of them at load, all at once (-z now), and never again: yet they
 * stay mapped, a MiB of an idle host's RSS (issue 32's idle row). Packed relocations
 * (-z pack-relative-relocs, DT_RELR) would shrink them to a few KiB, but need glibc 2.36, and
 * the library runs on 2.34 (link_shims.c).
 *
 * So an initializer — the loader runs it after it relocated the library — tells the kernel the
 * pages inside those tables are not needed (madvise MADV_DONTNEED): they are clean pages of a
 * read-only file mapping, so they leave the process and, if anything ever reads them again (a
 * lazily bound call under LD_AUDIT, a debugger), come back from the file. The PLT's table only
 * where every symbol was bound at load (BIND_NOW: the shipped library), otherwise lazy binding
 * reads it on each first call. Pages the tables share with other sections are left alone. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

/* A dynamic entry's address: glibc rewrites most of them in place to run-time addresses on
 * x86_64, other loaders may not — a value below the load address is a link-time one. */
static uintptr_t run_time_address(const struct link_map *map, uintptr_t value) {
    return value >= map->l_addr ? value : value + map->l_addr;
}

/* What `release` asks `find_segment` (through dl_iterate_phdr): whether a loaded segment
 * of the object at `bias`, without write permission, holds all of [first, end). */
typedef struct segment_query {
    uintptr_t bias, first, end;
    int inside;
} segment_query;

static int find_segment(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    segment_query *query = data;
    if (info->dlpi_addr != query->bias) return 0;
    for (ElfW(Half) index = 0; index < info->dlpi_phnum; index++) {
        const ElfW(Phdr) *segment = &info->dlpi_phdr[index];
        uintptr_t start = query->bias + segment->p_vaddr;
        if (segment->p_type == PT_LOAD && !(segment->p_flags & PF_W) && query->first >= start &&
            query->end <= start + segment->p_memsz)
            query->inside = 1;
    }
    return query->inside;
}

/* The whole pages of [start, start + size), only if they lie in a read-only loaded segment
 * of the object (never written, so nothing is lost: a wrong address would be). */
static void release(const struct link_map *map, uintptr_t start, uintptr_t size) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t first = (start + page - 1) & ~(page - 1);
    uintptr_t end = (start + size) & ~(page - 1);
    if (!size || end <= first) return;
    segment_query query = {.bias = map->l_addr, .first = first, .end = end, .inside = 0};
    dl_iterate_phdr(find_segment, &query);
    if (query.inside) (void)madvise((void *)first, end - first, MADV_DONTNEED);
}

__attribute__((constructor)) static void sessionflow_release_relocation_tables(void) {
    Dl_info info;
    struct link_map *map = NULL;
    if (!dladdr1((void *)&sessionflow_release_relocation_tables, &info, (void **)&map, RTLD_DL_LINKMAP) || !map ||
        !map->l_ld)
        return;
    uintptr_t rela = 0, rela_size = 0, plt = 0, plt_size = 0;
    int bind_now = 0;
    for (const ElfW(Dyn) *entry = map->l_ld; entry->d_tag != DT_NULL; entry++) {
        switch (entry->d_tag) {
        case DT_RELA: rela = entry->d_un.d_ptr; break;
        case DT_RELASZ: rela_size = entry->d_un.d_val; break;
        case DT_JMPREL: plt = entry->d_un.d_ptr; break;
        case DT_PLTRELSZ: plt_size = entry->d_un.d_val; break;
        case DT_BIND_NOW: bind_now = 1; break;
        case DT_FLAGS: bind_now |= (entry->d_un.d_val & DF_BIND_NOW) != 0; break;
        case DT_FLAGS_1: bind_now |= (entry->d_un.d_val & DF_1_NOW) != 0; break;
        default: break;
        }
    }
    if (rela) release(map, run_time_address(map, rela), rela_size);
    if (plt && bind_now) release(map, run_time_address(map, plt), plt_size);
}
