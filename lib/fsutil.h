/* File helpers for the job dir: atomic replacement and private directories. */
#ifndef GPURUN_FSUTIL_H
#define GPURUN_FSUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Replaces path with len bytes of data (borrowed) so that a reader sees the old file or the
 * new one, never a part: a temp file beside it, fsync, rename, fsync of the directory.
 * Returns 0 or a negative errno; on failure the temp file is gone. */
int fs_write_atomic(const char *path, const void *data, size_t len, mode_t mode);

/* fs_write_atomic() without its two fsyncs: readers still see the old file or the new one,
 * but a crash of the machine may lose either. For a file that means nothing after one
 * (endpoint.json: where a live leader listens), whose fsyncs cost milliseconds on the path
 * of every job's start. */
int fs_publish(const char *path, const void *data, size_t len, mode_t mode);

/* fsync of the directory dir itself, so that the names made or removed in it last. Returns 0
 * or a negative errno. */
int fs_fsync_dir(const char *dir);

/* Creates dir and its missing parents with mode (parents 0700). An existing directory is
 * fine; an existing file of that name is -ENOTDIR. Returns 0 or a negative errno. */
int fs_mkdirs(const char *dir, mode_t mode);

/* Reads a whole file of at most max bytes into a new NUL-terminated buffer (*out, caller
 * frees) and sets *len. Returns 0, -EFBIG over max, or a negative errno. */
int fs_read_all(const char *path, size_t max, char **out, size_t *len);

/* fs_read_all of the file open at fd (borrowed: left open), for a caller that checks the open
 * file (fstat) before it reads it. */
int fs_read_fd(int fd, size_t max, char **out, size_t *len);

/* Removes dir and everything under it, never following a symbolic link (a link is removed,
 * not what it points to). Adds the bytes of the files removed to *bytes when bytes is not
 * NULL. Returns 0 or the first negative errno; what could be removed is gone either way. */
int fs_remove_tree(const char *dir, uint64_t *bytes);

/* The bytes of the files under dir (not following links) into *bytes. Returns 0 or a
 * negative errno. */
int fs_tree_size(const char *dir, uint64_t *bytes);

/* The interpreter a script's "#!" line names (path, borrowed): its first word, as the kernel
 * reads it, into out (n bytes). Returns 1 when path starts with "#!" and names one, 0 when it
 * does not (a binary, a script without one, a file that cannot be read), or -ENAMETOOLONG.
 * What exec's ENOENT means for a file that exists. */
int fs_script_interpreter(const char *path, char *out, size_t n);

#endif
