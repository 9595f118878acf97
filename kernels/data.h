/* Training data: token shards in llm.c's .bin layout, read with pread, and the loader that
 * cuts the same global batch out of them whatever the number of ranks; plus the byte-level
 * tokenizer that makes shards from text.
 *
 * Shard layout (little-endian), as llm.c's data scripts write it:
 *   header: 256 int32 (1024 bytes): [0] magic 20240520, [1] version 1, [2] token count N,
 *           the rest zero;
 *   body:   N uint16 tokens.
 * The file is exactly 1024 + 2 N bytes long.
 *
 * The shards of a set, in order, form one token stream. Sequence i is the T + 1 tokens that
 * start at token i*T (inputs are its first T tokens, targets its last T), so consecutive
 * sequences share one token and the stream holds S = (tokens - 1) / T of them. A step's
 * global batch is G = W*B*accum sequences (W ranks, B sequences per rank per micro-step,
 * accum micro-steps); step s takes sequences s*G .. s*G+G-1 (modulo S: once past the end the
 * data starts over, one epoch later) and rank r's micro-step m takes the B of them that start
 * at s*G + m*W*B + r*B. So 1 rank with B=4 and 2 ranks with B=2 see the same global batch. */
#ifndef GPURUN_DATA_H
#define GPURUN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "errmsg.h"

#define DATA_SHARD_MAGIC       20240520
#define DATA_SHARD_VERSION     1
#define DATA_SHARD_HEADER_INTS 256 /* header of 256 int32: 1024 bytes */

/* A failure below fills the caller's struct errmsg with one line that names the file:
 * "'data/train_000000.bin': truncated: header says 1000 tokens, the file holds 998". A shard
 * that changes after data_open is an error of the read that sees it, never a signal: "data
 * shard 'data/train_000000.bin' shrank from 2291956 to 2000 bytes while training read it", or
 * a token not below vocab_size ("...: the file changed while training read it"). */

/* An opened set of shards, each kept open (one descriptor per shard) and read with pread. */
struct data_shard {
    char *path;    /* new */
    int fd;        /* open for reading; -1 once closed */
    uint64_t size; /* bytes at data_open: the header and ntokens tokens */
    uint64_t ntokens;
    uint64_t first; /* index of the shard's first token in the set's stream */
};

struct data_set {
    struct data_shard *shards;
    size_t nshards;
    uint64_t ntokens; /* of all shards */
    int vocab_size;   /* every token read is checked below it */
    char *spec;       /* what was opened (new) */
};

/* Opens spec (borrowed): a path, a glob, or a comma-separated list of paths and globs; each
 * glob's matches are taken in sorted order, the list in its own order. Every shard is
 * validated: magic, version, token count against the file's size, and every token below
 * vocab_size (a pass over all the data). A glob that matches nothing is an error.
 * Returns a new set (data_close) or NULL with err filled. */
struct data_set *data_open(const char *spec, int vocab_size, struct errmsg *err);

/* Closes the shards of ds and frees it (NULL is fine). */
void data_close(struct data_set *ds);

/* Reads n tokens of ds's stream from token g on (g + n <= ds->ntokens) into out. Returns 0,
 * or a negative errno with err filled when a shard shrank or changed since data_open (-EIO
 * for a shrunk file or a token not below vocab_size) or cannot be read. Thread-safe. */
int data_read(const struct data_set *ds, uint64_t g, uint64_t n, uint16_t *out, struct errmsg *err);

/* Where a loader is in its data, enough to continue from a checkpoint. The batch of step s is
 * the one that starts at sequence next_seq + (s - step) * G. */
struct data_pos {
    uint64_t step;     /* the step next_seq belongs to */
    uint64_t next_seq; /* first sequence of that step's global batch, not reduced modulo S */
    uint64_t nseq;     /* S of the set when saved: the caller may compare */
    uint64_t ntokens;  /* tokens of the set when saved: the caller may compare */
};

/* The slicing of one set for one rank (plain values: copy freely). Read-only use from many
 * threads is fine (each read is a pread). */
struct data_loader {
    const struct data_set *ds; /* borrowed */
    int B, T, rank, world, accum;
    uint64_t nseq; /* S */
    uint64_t G;    /* W*B*accum */
    uint64_t base_step, base_seq;
};

/* Sets up dl for rank of world over ds (borrowed: must outlive dl) with B sequences of T
 * tokens per micro-step and accum micro-steps per step. An error when the set holds fewer
 * than G sequences (one step would repeat data), or the arguments are out of range.
 * Returns 0 or -EINVAL with err filled. */
int data_loader_init(struct data_loader *dl, const struct data_set *ds, int B, int T, int rank,
                     int world, int accum, struct errmsg *err);

/* Fills inputs and targets (B*T each, row-major [B][T]) with rank's micro-step micro
 * (0..accum-1) of step. Tokens are 0..65535 as int. Returns 0, or a negative errno with err
 * filled as data_read's (the buffers' content is then undefined). */
int data_loader_batch(const struct data_loader *dl, uint64_t step, int micro, int *inputs,
                      int *targets, struct errmsg *err);

/* The position to save once `step` is the next step to run. */
struct data_pos data_loader_pos(const struct data_loader *dl, uint64_t step);

/* Continues from pos: the batch of step pos->step starts at pos->next_seq and later ones
 * follow every G sequences (so a run resumed with another W, B or accum still goes on from
 * where the data stopped). The caller compares pos->nseq/ntokens with the set if it wants
 * the data unchanged. */
void data_loader_restore(struct data_loader *dl, const struct data_pos *pos);

/* The validation batches: batch e (0, 1, ...) of rank r is the B sequences that start at
 * e*W*B + r*B, modulo S. Fixed, whatever the step. Returns as data_loader_batch. */
int data_loader_val_batch(const struct data_loader *dl, int e, int *inputs, int *targets,
                          struct errmsg *err);

/* Sequences needed per validation batch over all ranks (W*B) and how many distinct
 * validation batches the set holds (S / (W*B)); eval_batches above that repeats data. */
uint64_t data_loader_val_batches(const struct data_loader *dl);

/* The byte-level tokenizer: every byte is a token (vocabulary 256). Concatenates the n text
 * files inputs (borrowed), keeps the last val_fraction (0 < f < 1) of the bytes for
 * validation and writes out_dir/train_000000.bin (and _000001... past DATA_PREP_SHARD_TOKENS
 * tokens) and out_dir/val_000000.bin, each atomically, creating out_dir. Shards of an earlier
 * prep beyond the new ones are removed. Returns 0, or a negative errno with err filled. */
#define DATA_PREP_SHARD_TOKENS 100000000 /* llm.c's shard size: 200 MB of uint16 */
int data_prep(const char *const *inputs, size_t n, const char *out_dir, double val_fraction,
              struct errmsg *err);

#endif
