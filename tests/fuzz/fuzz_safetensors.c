/* libFuzzer target: the safetensors reader, on a file holding the input
 * (a memfd, reached through /proc/self/fd). Every tensor it accepts is read
 * back in full, so offsets it validated are exercised. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ckpt/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuzz.safetensors", 0);
    if (fd < 0 || write(fd, data, size) != (ssize_t)size) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    llmt_st_file *f = NULL;
    if (llmt_st_open(path, NULL, &f) == 0) {
        for (size_t i = 0; i < llmt_st_count(f); i++) {
            const llmt_st_tensor *t = llmt_st_tensor_at(f, i);
            size_t bytes = (size_t)(t->end - t->begin);
            if (bytes <= size) {
                char *buf = malloc(bytes ? bytes : 1);
                llmt_st_read(f, i, 0, buf, bytes);
                free(buf);
            }
        }
        for (size_t i = 0; i < llmt_st_meta_count(f); i++) {
            const char *value = NULL;
            llmt_st_meta_at(f, i, &value);
        }
        llmt_st_close(f);
    }
    close(fd);
    return 0;
}
