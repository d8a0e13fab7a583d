// The system call itself rather than glibc's wrapper: no glibc version requirement (the
// wrapper came in 2.28), and on a kernel without renameat2 (before 3.15) ENOSYS, which the
// caller treats like a filesystem that cannot exchange.
#include <sys/syscall.h>
#include <unistd.h>

#include "rename_exchange.h"

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

int sf_rename_exchange(int directory_fd, const char *first, const char *second) {
    return (int)syscall(SYS_renameat2, directory_fd, first, directory_fd, second, RENAME_EXCHANGE);
}
