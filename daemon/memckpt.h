/* Memory checkpoints (docs/design.md, section 4): the newest complete copy of each rank's
 * named state, kept by its node's daemon in a directory of a memory file system (/dev/shm),
 * so that a rank started again in the same allocation takes its state from memory rather
 * than from disk. A rank writes a state's bytes into its temp file (memckpt_tmp_path) and
 * asks its daemon to keep it; the daemon renames it over the older copy, so that a copy is
 * complete or absent (a rank killed while writing leaves the older one), within the node's
 * cap. The table of copies is the daemon's; the bytes are the file system's, which outlive
 * the rank that wrote them. The table has a lock: the agent's loop keeps its ranks' copies,
 * the memory link's threads (memlink.h) a peer's and the ones they fetch. */
#ifndef GPURUN_MEMCKPT_H
#define GPURUN_MEMCKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "errmsg.h"
#include "proto.h"

/* A state's name (proto.h's rule) and the variable that tells a rank its node's directory. */
#define MEMCKPT_NAME_MAX PROTO_MEM_NAME_MAX
#define MEMCKPT_DIR_ENV  PROTO_MEM_DIR_ENV

struct memckpt;

/* Makes dir (0700, which must not exist yet or be empty) for copies of at most cap bytes in
 * all. Returns 0 with a new store in *out, or a negative errno. */
int memckpt_open(const char *dir, uint64_t cap, struct memckpt **out);

/* Removes every copy, temp file and the directory, and frees m (NULL: nothing). */
void memckpt_close(struct memckpt *m);

/* A daemon killed (SIGKILL, its node fenced) cannot remove its store, which would hold its
 * share of the node's memory until a reboot. memckpt_open writes the owner's pid and start
 * time into the directory ("owner"); this removes every directory in parent whose name starts
 * with prefix and whose owner is no longer running (no process of that pid and start time),
 * with what it holds. A directory without an owner file is left alone. Returns how many were
 * removed. */
int memckpt_sweep(const char *parent, const char *prefix);

const char *memckpt_dir(const struct memckpt *m);

/* The temp file rank writes name's bytes into, into buf (n bytes). -EINVAL for a name that
 * is not one (MEMCKPT_NAME_MAX), -ENAMETOOLONG when buf is too small. */
int memckpt_tmp_path(const struct memckpt *m, int rank, const char *name, char *buf, size_t n);

/* Keeps rank's name from its temp file as the copy of step, in place of the older one.
 * -ENOENT: no temp file; -ENOSPC: it does not fit the cap beside the other copies (the temp
 * file is removed, the older copy kept); -EINVAL: a bad name; err says which and why. */
int memckpt_keep(struct memckpt *m, int rank, const char *name, int64_t step, struct errmsg *err);

/* memckpt_keep from the file src (in the store's directory) rather than the rank's temp
 * file: a copy that came over a memory link. */
int memckpt_keep_from(struct memckpt *m, int rank, const char *name, int64_t step, const char *src,
                      struct errmsg *err);

/* The file a copy of rank's name that comes over a memory link is written into ("...in"). */
int memckpt_in_path(const struct memckpt *m, int rank, const char *name, char *buf, size_t n);

/* Whether a copy of rank's name of size bytes would fit now (memckpt_fits). */
bool memckpt_would_fit(struct memckpt *m, int rank, const char *name, uint64_t size);

/* Opens the copy of rank's name for reading: its fd (the caller closes it; a newer copy
 * renamed over it later leaves this one whole to the reader), step and size; -ENOENT. */
int memckpt_open_copy(struct memckpt *m, int rank, const char *name, int64_t *step, uint64_t *size);

/* One copy: what memckpt_list tells of it. */
struct memckpt_entry {
    int rank;
    char name[MEMCKPT_NAME_MAX + 1];
    int64_t step;
    uint64_t size;
};

/* The copies of ranks lo..hi-1, at most max of them into out; returns how many there are. */
size_t memckpt_list(struct memckpt *m, int lo, int hi, struct memckpt_entry *out, size_t max);

/* The copy of rank's name: its path (into path, n bytes), step and size. -ENOENT: none. */
int memckpt_find(struct memckpt *m, int rank, const char *name, char *path, size_t n, int64_t *step,
                 uint64_t *size);

/* The bytes kept in all. */
uint64_t memckpt_kept(struct memckpt *m);

/* Whether a copy of add bytes fits a cap of cap where kept bytes are kept, old of them the
 * copy it replaces: the rule of memckpt_keep, pure. */
bool memckpt_fits(uint64_t kept, uint64_t old, uint64_t add, uint64_t cap);

/* The default cap: a quarter of the node's memory, shared by its nnodes emulated nodes
 * (gpurun --local runs them on one machine). */
uint64_t memckpt_default_cap(int nnodes);

#endif
