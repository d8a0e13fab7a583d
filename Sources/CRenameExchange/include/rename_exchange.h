/*
 * renameat2(RENAME_EXCHANGE), which Swift's Glibc module does not declare (glibc declares it
 * only under _GNU_SOURCE). Internal to SessionFileStore: the store file is replaced by
 * exchanging it with a spare file (FileIO.replaceThroughSpare).
 */
#ifndef SESSIONFLOW_RENAME_EXCHANGE_H
#define SESSIONFLOW_RENAME_EXCHANGE_H

#ifdef __cplusplus
extern "C" {
#endif

/* Atomically exchanges the entries `first` and `second` of the directory `directory_fd`
 * (neither is followed). 0, or -1 with errno: ENOENT if either is missing; EINVAL, ENOSYS,
 * ENOTSUP or EPERM where the filesystem or kernel cannot exchange. */
int sf_rename_exchange(int directory_fd, const char *first, const char *second);

#ifdef __cplusplus
}
#endif

#endif
