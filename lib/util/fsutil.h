/* Small file-system helpers of the writers and the checkpoint store. Every
 * failure is LLMT_EIO with the path and the system's reason. */
#ifndef LLMT_UTIL_FSUTIL_H
#define LLMT_UTIL_FSUTIL_H

#include <stddef.h>
#include <stdint.h>

/* Creates dir and its missing parents (mode 0755). */
int llmt_mkdirs(const char *dir);

/* Removes dir, the files in it and then dir itself (checkpoint directories
 * hold files only; a subdirectory is removed the same way). */
int llmt_remove_tree(const char *dir);

/* fsyncs a directory. */
int llmt_sync_dir(const char *dir);

/* fsyncs the directory holding path, so a rename onto path survives a crash. */
int llmt_sync_parent(const char *path);

/* Writes all n bytes to fd (EINTR and short writes handled); messages name
 * path, the file being written under the temporary name tmp. */
int llmt_write_all(int fd, const void *data, size_t n, const char *path, const char *tmp);

/* Writes len bytes to a new file path (mode 0644), fsynced when sync, and
 * returns their XXH3-64. */
int llmt_write_file(const char *path, const void *data, size_t len, int sync, uint64_t *xxh3);

/* Reads a whole file of at most max bytes into a malloc'ed buffer. */
int llmt_read_file(const char *path, size_t max, char **out, size_t *len);

/* Size and XXH3-64 of a file's bytes. */
int llmt_hash_file(const char *path, uint64_t *size, uint64_t *xxh3);

/* Reads exactly len bytes at offset of an open file (EINTR and short reads handled). */
int llmt_pread_all(int fd, const char *path, void *buf, size_t len, uint64_t offset);

#endif
