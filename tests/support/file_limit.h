/* A file size limit on this process, for tests of failing writes: a write
 * past it fails (EFBIG) instead of raising SIGXFSZ; it holds for root too. */
#ifndef LLMT_TEST_FILE_LIMIT_H
#define LLMT_TEST_FILE_LIMIT_H

#include <signal.h>
#include <sys/resource.h>

/* Limits files to `bytes` (the hard limit kept), *old receiving the limit
 * before; returns setrlimit's status. */
static inline int file_limit_set(rlim_t bytes, struct rlimit *old)
{
    getrlimit(RLIMIT_FSIZE, old);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit limit = {bytes, old->rlim_max};
    return setrlimit(RLIMIT_FSIZE, &limit);
}

/* Puts back the limit file_limit_set replaced. */
static inline void file_limit_restore(const struct rlimit *old)
{
    setrlimit(RLIMIT_FSIZE, old);
}

#endif
