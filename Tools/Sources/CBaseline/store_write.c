// The store write's second floor: the same replace the store makes (FileIO.replaceThroughSpare),
// in C, so that the row's ratio against it is our CPU and system calls alone.
#include "cbaseline.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

void bl_spare_write(const char *directory, int size) {
    unsigned char bytes[4096];
    if (size < 0 || size > (int)sizeof bytes) return;
    memset(bytes, 0x5a, (size_t)size);
    int directory_fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (directory_fd < 0) return;
    int fd = openat(directory_fd, "spare-floor.spare", O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) {
        // The directory first: the spare's exchange must be on disk before it is written over.
        if (fsync(directory_fd) == 0 && pwrite(fd, bytes, (size_t)size, 0) == size && ftruncate(fd, size) == 0 && fsync(fd) == 0) {
            close(fd);
            if (syscall(SYS_renameat2, directory_fd, "spare-floor.spare", directory_fd, "spare-floor.bin", RENAME_EXCHANGE) != 0) {
                renameat(directory_fd, "spare-floor.spare", directory_fd, "spare-floor.bin");
            }
            fsync(directory_fd);
        } else {
            close(fd);
        }
    }
    close(directory_fd);
}
