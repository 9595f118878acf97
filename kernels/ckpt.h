/* Checkpoints: our own format (parameters, AdamW moments, step, RNG, data position, written
 * atomically and checksummed) and the import of llm.c's GPT-2 checkpoints. The API takes
 * flat fp32 buffers so that it does not depend on the model's code.
 *
 * Our format, version 1 (little-endian), file out_dir/ckpt_<step, 8 digits>.bin:
 *   header   256 bytes: magic "GPRCKPT1", version, header size, the model's shape (n_layer,
 *            n_head, n_embd, seq_len, vocab_size, padded_vocab), the run's world size, batch
 *            size and grad_accum (for information), nparams, step, optimizer step, RNG words,
 *            data position, config length and the whole file's size;
 *   config   config_len bytes: the effective train.cfg as JSON text (informative);
 *   params   nparams fp32;  m  nparams fp32;  v  nparams fp32;
 *   trailer  32 bytes: SHA-256 of everything before it.
 * A checkpoint is written to a temp file beside its final name (ckpt_<step>.bin.tmp.<pid>),
 * fsynced, renamed and the directory fsynced: a reader finds the previous checkpoint or the
 * new one, never a part. A resume sets a damaged newest checkpoint aside as
 * ckpt_<step>.bin.damaged (then .damaged.2, ...) and goes on from the newest valid one.
 *
 * llm.c's GPT-2 checkpoint (train_gpt2.c's gpt2_build_from_checkpoint), version 3:
 *   header   256 int32 (1024 bytes): [0] magic 20240326, [1] version 3 (fp32 parameters),
 *            [2] maxT (positions), [3] V (vocabulary), [4] L (layers), [5] NH (heads),
 *            [6] C (channels), [7] Vp (V padded, for alignment), the rest zero;
 *   params   fp32, 16 tensors one after the other, in this order and shape:
 *            wte (Vp, C), wpe (maxT, C), ln1w (L, C), ln1b (L, C), qkvw (L, 3C, C),
 *            qkvb (L, 3C), attprojw (L, C, C), attprojb (L, C), ln2w (L, C), ln2b (L, C),
 *            fcw (L, 4C, C), fcb (L, 4C), fcprojw (L, C, 4C), fcprojb (L, C), lnfw (C),
 *            lnfb (C).
 *   Nothing follows. Version 5 holds bf16 parameters and is refused here. */
#ifndef GPURUN_CKPT_H
#define GPURUN_CKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "data.h"
#include "errmsg.h"

#define CKPT_RNG_WORDS 4 /* room for a xoshiro256 state; unused words stay 0 */

#define LLMC_CKPT_MAGIC   20240326
#define LLMC_CKPT_VERSION 3

/* A failure below fills the caller's struct errmsg with one line that names the file:
 * "'out/ckpt_00000010.bin': n_layer is 4 in the checkpoint, 2 in the config". */

/* The shape of a GPT-2 model. */
struct ckpt_model {
    int n_layer;
    int n_head;
    int n_embd;
    int seq_len;      /* positions (llm.c's maxT) */
    int vocab_size;   /* V */
    int padded_vocab; /* Vp: rows of the token embedding */
};

/* Everything a checkpoint holds but the config text. For ckpt_save every field is read
 * (params, m, v borrowed, nparams floats each); for ckpt_load_newest the caller sets params,
 * m and v to buffers of nparams floats and the rest is filled. */
struct ckpt_state {
    struct ckpt_model model;
    int world_size, batch_size, grad_accum; /* of the run that saved it: informative */
    uint64_t step;                          /* steps done: the next one to run */
    uint64_t opt_step;                      /* AdamW's update count t */
    uint64_t rng[CKPT_RNG_WORDS];
    struct data_pos data;
    size_t nparams;
    float *params;
    float *m; /* AdamW first moment */
    float *v; /* AdamW second moment */
};

/* The file name of step's checkpoint in out_dir (borrowed) into buf of size len. Returns 0
 * or -ENAMETOOLONG. */
int ckpt_path(char *buf, size_t len, const char *out_dir, uint64_t step);
/* Whether name (a file name, no directory) is a checkpoint's: ckpt_<step>.bin, nothing else
 * (not a temp file of a save, not one set aside as damaged). */
bool ckpt_is_name(const char *name);

/* Writes st as out_dir/ckpt_<st->step>.bin, creating out_dir, atomically (temp file, fsync,
 * rename, directory fsync); config (borrowed, NUL-terminated JSON text, NULL: none) is kept
 * for information. On failure the temp file is removed and any earlier checkpoint is left
 * as it was. Returns 0, or a negative errno with err filled. */
int ckpt_save(const char *out_dir, const struct ckpt_state *st, const char *config,
              struct errmsg *err);

/* Writes st's checkpoint file as ckpt_save does, at path itself (created or truncated; not
 * fsynced: a memory checkpoint's temp file, which its keeper renames). On failure path is
 * removed. Returns 0, or a negative errno with err filled. */
int ckpt_write(const char *path, const struct ckpt_state *st, const char *config,
               struct errmsg *err);

/* Reads the checkpoint file path (any name) into st as ckpt_load_newest reads one: its shape
 * must equal *expect, its parameter count nparams, its checksum must match. Returns 0, or a
 * negative errno with err filled (-EBADMSG: damaged, -EINVAL: another model's). */
int ckpt_read(const char *path, const struct ckpt_model *expect, size_t nparams,
              struct ckpt_state *st, struct errmsg *err);

/* A checkpoint newer than the one ckpt_load_newest loaded, passed over as damaged. */
struct ckpt_damaged {
    char *path; /* new */
    struct errmsg why;
};

/* What ckpt_load_newest found; release with ckpt_newest_release. */
struct ckpt_newest {
    char *path;                   /* the checkpoint loaded: new */
    struct ckpt_damaged *damaged; /* the newer ones passed over, newest first: new */
    size_t ndamaged;
};

/* For a resume: loads the newest valid checkpoint of out_dir into st: its shape must equal
 * *expect (the first mismatch is named) and its parameter count nparams, its checksum must
 * match; st->params, m, v must point to buffers of nparams floats (their content is undefined
 * after a failure); the config text is not read back. The files named ckpt_<step>.bin are
 * tried newest step first: a damaged one (-EBADMSG: not our format, truncated, sizes that
 * disagree, a header whose step is not its name's, a checksum mismatch) is passed over and
 * listed in nw; any other failure (a newer format version, a file that cannot be read, a checkpoint
 * of another model) stops the search with that error, as does finding no valid one behind
 * damaged ones (-EBADMSG). No file is changed: the caller sets the damaged ones aside
 * (ckpt_set_aside) once it uses the one loaded. Returns 1 with nw filled (new), 0 when
 * out_dir (missing or not) holds no checkpoint file, or a negative errno with err filled (nw
 * then empty). */
int ckpt_load_newest(const char *out_dir, const struct ckpt_model *expect, size_t nparams,
                     struct ckpt_state *st, struct ckpt_newest *nw, struct errmsg *err);

/* The step of out_dir's newest complete checkpoint (a ckpt_<step>.bin whose header is whole and
 * names its step; the body is not read) into *step, -1 when there is none (or no out_dir).
 * Returns 0, or a negative errno with err filled when out_dir cannot be read. */
int ckpt_newest_step(const char *out_dir, long long *step, struct errmsg *err);

/* Frees what nw holds and empties it; idempotent. */
void ckpt_newest_release(struct ckpt_newest *nw);

/* Renames the damaged checkpoint path (borrowed) to path.damaged, or path.damaged.<n> (n from
 * 2) when that is taken, so that it is kept but no longer read as a checkpoint or replaced by
 * a save of its step; ckpt_prune removes it once keep complete checkpoints of later steps are
 * there. The new name goes into aside (len bytes). Returns 0 or a negative errno with err
 * filled. */
int ckpt_set_aside(const char *path, char *aside, size_t len, struct errmsg *err);

/* Removes all but the keep newest complete checkpoints (keep >= 1) of out_dir: a file named
 * ckpt_<step>.bin or set aside (.damaged) goes only when its step is below that of the
 * keep-th newest complete checkpoint (a valid header of its step, the announced size), so
 * that a file is never removed unless keep complete newer ones exist; incomplete files newer
 * than that stay, and entries that are not regular files are never touched. Returns 0 or a
 * negative errno with err filled. */
int ckpt_prune(const char *out_dir, int keep, struct errmsg *err);

/* Removes the temp files that saves killed before their rename left in out_dir
 * (ckpt_<step>.bin.tmp.<pid>, exactly, regular files of this user): those whose pid is no
 * live process (or is this process's) and that were last modified before *started (when
 * this process started). *removed and *bytes count what went. Returns 0 (a missing out_dir
 * holds none) or a negative errno with err filled. */
int ckpt_clean_tmp(const char *out_dir, const struct timespec *started, int *removed,
                   uint64_t *bytes, struct errmsg *err);

/* Parameters of GPT-2 in llm.c's layout for model m (m->seq_len positions, m->padded_vocab
 * token rows). */
size_t ckpt_llmc_nparams(const struct ckpt_model *m);

/* Reads an llm.c GPT-2 checkpoint (version 3, fp32): *found gets its shape (seq_len = maxT),
 * *params a new buffer (free) of *nparams floats in llm.c's order. When seq_len > 0 and below
 * maxT, only the first seq_len rows of wpe are kept (the shape then says seq_len) so that the
 * buffer fits a model with a shorter context; seq_len above maxT is an error. The caller
 * compares *found with its own config. Returns 0, or a negative errno with err filled. */
int ckpt_load_llmc(const char *path, int seq_len, struct ckpt_model *found, float **params,
                   size_t *nparams, struct errmsg *err);

#endif
