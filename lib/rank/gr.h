/* The gpurun rank library: what a training process links to talk to its node's rendezvousd.
 *
 * A rank started by rendezvousd finds in its environment RANK, LOCAL_RANK, WORLD_SIZE,
 * LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT and the two variables of this
 * library, GPURUN_SOCK (the agent's Unix socket) and GPURUN_TOKEN (this rank's secret).
 * gr_init() reads them and connects; every other call is a request over that socket, served
 * by the job-wide store and barrier on the leader.
 *
 * Thread context: a struct gr is used by one thread at a time; calls block. Every call
 * returns 0 or a negative errno: -ETIMEDOUT for a wait that ran out, -ENOENT for a missing
 * key (timeout 0), -E2BIG for a key or value over the limits, -ECONNRESET when the agent is
 * gone, -EPROTO for an answer that makes no sense, -ECANCELED when the job is being torn
 * down. gr_strerror() describes the last failure in words ("kv_put 'k': value of 200000
 * bytes is over the store's limit of 196608"). After -ECONNRESET or -EPROTO the connection is
 * unusable: every later call returns the same error, and only gr_finalize() is left to do.
 * The library never raises SIGPIPE and retries system calls a signal interrupts.
 *
 * Under PMIx. A rank that a PMIx launcher started without rendezvousd (`srun --mpi=pmix` in
 * a user's own batch script, OpenMPI's mpirun), that is with PMIX_RANK and PMIX_NAMESPACE but
 * no GPURUN_SOCK in its environment, runs on PMIx instead when the library was built with
 * libpmix: gr_init takes the place from the job's PMIx data (rank, job size, local rank,
 * local size, node id); a put is a PMIx put and commit; a get searches the ranks for the key
 * (its owner is unknown to PMIx) until it turns up; a barrier is a fence that collects every
 * rank's puts. What differs from the agent's store:
 * - gr_kv_del is -EOPNOTSUPP: a put cannot be taken back.
 * - A key should be put once, by one rank. A rank that already read a key may keep its old
 *   value after a new put; which of several ranks' values a get returns is unspecified.
 * - A get of a key put on another node without a barrier in between costs a request to each
 *   rank of the other nodes until one has it (the rank named by a key ending in "/N" is asked
 *   first); after a barrier, or for keys of this node's ranks, it costs no request at all.
 *   Fine for the keys of a start-up, not a store for heavy use.
 * - Barrier names are not compared: ranks must call barriers in the same order. A barrier
 *   given up on (-ETIMEDOUT) stays counted, and the next barrier first waits for it.
 * - gr_report checks its argument, then does nothing (there is no agent to tell) and
 *   returns 0.
 * - Errors: -ECONNREFUSED from gr_init when the PMIx server cannot be reached; -EIO when PMIx
 *   refuses a put or a fence. */
#ifndef GPURUN_GR_H
#define GPURUN_GR_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* The store's limits as a rank sees them: a key (and a barrier name) is at most 256 bytes of
 * UTF-8 text; a value travels as base64, 4 characters per 3 bytes, in at most 256 KiB, so a
 * binary value holds at most 196608 bytes. */
#define GR_KEY_MAX   256
#define GR_NAME_MAX  256
#define GR_VALUE_MAX (3 * (256 * 1024) / 4)

struct gr;

/* Progress of one training step, as gpurun status shows it.
 *
 * The struct grows: a field is only ever added at its end, and size, its first member, says
 * how much of it the caller has. GR_PROGRESS_INIT sets size to sizeof(struct gr_progress) as
 * the caller is built, and every number to unknown; the caller then fills in what it knows:
 *
 *     struct gr_progress p = GR_PROGRESS_INIT;
 *     p.step = step;
 *     p.loss = loss;
 *     gr_report(g, &p);
 *
 * So a program built with this header runs on a later libgr.so.1 with a longer struct (the
 * fields past its size are unknown), and one built with a later header runs on this library
 * (the fields it does not know are not sent). Why a size and not setters on an opaque record:
 * the struct stays on the caller's stack, a step is reported with one call and no
 * allocation, and a new field costs no new symbol; the kernel's extensible structs (clone3's,
 * openat2's) grow the same way.
 *
 * libgr.so.0's struct had no size and had already grown once (step_time) without a word to
 * the library, which therefore cannot tell its two layouts apart; this one is libgr.so.1, and
 * a program linked with libgr.so.0 never loads it. */
struct gr_progress {
    size_t size;         /* sizeof(struct gr_progress) where the caller was built */
    int64_t step;        /* the step just done: 0 or more */
    double loss;         /* the numbers: NAN where unknown */
    double lr;           /* (loss and lr may be negative) */
    double tokens_per_s; /* 0 or more */
    double grad_norm;    /* 0 or more */
    int64_t total_steps; /* the steps the run aims at (progress bar and ETA); 0: unknown */
    double step_time;    /* seconds of the step's own work, without waiting on the other
                          * ranks: what names a straggler (more than 0; 0 is unknown too) */
    /* Fields added later go here (and into GR_PROGRESS_INIT), each saying its version. */
};

/* The size of the first layout (up to step_time): every libgr.so.1 reads at least this much,
 * and refuses a smaller size. */
#define GR_PROGRESS_SIZE_1 (offsetof(struct gr_progress, step_time) + sizeof(double))

/* The initializer of a struct gr_progress: its size set, nothing known (every double NAN,
 * step and total_steps 0). */
#define GR_PROGRESS_INIT                                                                           \
    {                                                                                              \
        .size = sizeof(struct gr_progress), .step = 0, .loss = NAN, .lr = NAN,                     \
        .tokens_per_s = NAN, .grad_norm = NAN, .total_steps = 0, .step_time = NAN                  \
    }

/* Connects to the agent named by the environment and introduces this rank. On success *out
 * is new (the caller ends it with gr_finalize); on failure *out is NULL and gr_strerror(NULL)
 * says why. Returns -ENOENT when the process was not started by rendezvousd (GPURUN_SOCK or
 * another of the variables unset), -EINVAL for a variable that is not a well-formed value
 * (a decimal number in range, RANK < WORLD_SIZE, LOCAL_RANK < LOCAL_WORLD_SIZE; the token in
 * hex), -EACCES when the agent refuses the rank, or the connection's error. */
int gr_init(struct gr **out);

/* This rank's place in the job, from the environment gr_init read. */
int gr_rank(const struct gr *g);
int gr_world_size(const struct gr *g);
int gr_local_rank(const struct gr *g);
int gr_local_world_size(const struct gr *g);
int gr_node_rank(const struct gr *g);

/* Stores len bytes of val (borrowed) under key, replacing any earlier value. Values are
 * binary-safe. A key that is empty or not UTF-8 is -EINVAL; a key over GR_KEY_MAX or a value
 * over GR_VALUE_MAX bytes is -E2BIG, refused before anything is sent. It returns once the
 * node's agent has taken the put, which then comes before the node's every later request: a
 * get or barrier after it, from any rank, sees it; a rank elsewhere told by other means may
 * need a get that waits. A put the job's store cannot keep (full) fails the job. */
int gr_kv_put(struct gr *g, const char *key, const void *val, size_t len);

/* Waits up to timeout_ms (0: do not wait; -1: wait as long as the job lives) for key to
 * exist, then copies its value into buf (cap bytes) and sets *len. -ENOBUFS with *len set
 * to the size needed when cap is too small (buf may be NULL when cap is 0); -ENOENT when timeout_ms
 * is 0 and the key does not exist; -ETIMEDOUT when the wait ran out. */
int gr_kv_get(struct gr *g, const char *key, void *buf, size_t cap, size_t *len, int timeout_ms);

/* Removes key; removing a missing key is not an error. */
int gr_kv_del(struct gr *g, const char *key);

/* Returns once every rank of the job has called gr_barrier with the same name (NULL: the
 * next of an implicit sequence "#0", "#1"... counted per struct gr, the same on every rank),
 * or -ETIMEDOUT after timeout_ms (-1: no limit). Names starting with '#' are reserved for
 * that sequence (-EINVAL). A barrier given up on stays counted: the agent's late answer to
 * it is skipped, and the ranks that did arrive are not released until the others do. */
int gr_barrier(struct gr *g, const char *name, int timeout_ms);

/* Memory checkpoints (gpurun --mem-ckpt-max): keeps len bytes of data as this rank's copy of
 * name (letters, digits, '_', '-', '.'; at most 64 bytes) at step, in its node's memory: a
 * file of /dev/shm its daemon keeps, which outlives this process, for a restart in the same
 * allocation. The newest complete copy is kept: a rank that dies while saving leaves the
 * older one. Returns 0; -ENOSPC where the node's cap refuses it (the older copy stays),
 * -EINVAL for a bad name, -ENOSYS where the node keeps none (or under PMIx), or the link's
 * error; gr_strerror says which. */
int gr_mem_save(struct gr *g, const char *name, const void *data, size_t len, int64_t step);

/* This rank's copy of name: *data new (the caller frees it), its *len bytes and the *step it
 * was saved at. -ENOENT where there is none (a first start), or as gr_mem_save. */
int gr_mem_load(struct gr *g, const char *name, void **data, size_t *len, int64_t *step);

/* A state written by the caller's own writer (one too large to hold twice in memory, such as
 * a trainer's checkpoint), in two steps: gr_mem_tmp_path gives the file to write this rank's
 * next copy of name into (into buf, n bytes); once it is written whole, gr_mem_keep keeps it
 * as the copy of step, as gr_mem_save does. Errors as gr_mem_save's. */
int gr_mem_tmp_path(struct gr *g, const char *name, char *buf, size_t n);
int gr_mem_keep(struct gr *g, const char *name, int64_t step);

/* Where this rank's copy of name is, for a reader of its own: its path into buf (n bytes),
 * the *step it was saved at and its *size. Open it before the next gr_mem_keep of name (an
 * open file stays whole; the path then names the newer copy). Errors as gr_mem_load's. */
int gr_mem_find(struct gr *g, const char *name, char *buf, size_t n, int64_t *step, uint64_t *size);

/* Sends this rank's progress (p is borrowed; see struct gr_progress); the agent forwards it
 * to the leader without blocking and does not answer. A number not known is left out, and
 * status shows it as unknown: a double that is not finite (NAN), total_steps 0, a field past
 * p->size. So is a number that cannot be: a negative tokens_per_s or grad_norm, a step_time
 * not above 0. Returns -EINVAL, sending nothing, for a p->size under GR_PROGRESS_SIZE_1 (0: a
 * struct not made with GR_PROGRESS_INIT) or a negative step or total_steps. */
int gr_report(struct gr *g, const struct gr_progress *p);

/* Asks for the pre-timeout signal: Slurm's warning before the time limit (or gpurun's own,
 * in --local) reaches only the ranks that ask for it, so that a script that is not ready
 * for it is never killed by it. Install the handler first (it must not kill the rank: set a
 * flag, checkpoint, exit 0), then call this. *sig (may be NULL) receives the signal's number
 * (GPURUN_PREEMPT_SIGNAL, SIGUSR1 unless the job's --signal chose another). Returns 0, or
 * -EINVAL for a malformed GPURUN_PREEMPT_SIGNAL; under PMIx it only fills *sig. */
int gr_on_preempt(struct gr *g, int *sig);

/* Regrouping in process (docs/design.md, section 4): where a node is lost and a spare takes
 * its place, the ranks on the other nodes may keep their processes and go on with the
 * spare's new ranks, rather than all being restarted. A rank that can (it notices its
 * collectives failing, re-forms them through the store under the new generation, and takes
 * the state the job's other ranks hold) says so once with gr_regroup_enable; the job heals
 * in process only where every rank on the healthy nodes said it. -ENOSYS under PMIx.
 *
 * gr_regroup, called once the rank's collectives failed (a peer gone): waits up to
 * timeout_ms (-1: no limit) until the leader names the next generation in which this rank
 * goes on, and returns it (>= 1; gr_generation then says it too, and the store is the new
 * generation's, empty, and gr_barrier(NULL)'s names count from "#0" again, as in the
 * spare's new ranks). -ECANCELED where the job does not regroup (it is being torn down and
 * restarted, or ends): exit. -ETIMEDOUT, or the link's error.
 *
 * gr_generation: the rank's generation, GPURUN_RESTART_COUNT at gr_init, then the last one
 * gr_regroup returned. */
int gr_regroup_enable(struct gr *g);
int gr_regroup(struct gr *g, int64_t timeout_ms);
int gr_generation(const struct gr *g);

/* Tells the agent this rank is done with the library, closes the connection and frees g
 * (g may be NULL). Returns the agent's answer; g is freed in every case, and the text of a
 * failure is then gr_strerror(NULL)'s. */
int gr_finalize(struct gr *g);

/* The text of g's last failure, or "" (borrowed: valid until the next call on g). With g
 * NULL: the text of the calling thread's last failed gr_init or gr_finalize (valid until
 * the next of those calls). */
const char *gr_strerror(const struct gr *g);

#endif
