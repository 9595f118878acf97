/* What coll.c shares with the collectives' backends, each in a file of its own (coll_tcp.c,
 * coll_nccl.c): the backend's row in coll.c's table, and coll.c's services to a backend.
 * Internal to kernels/coll/; programs use coll.h. */
#ifndef GPURUN_COLL_BACKEND_H
#define GPURUN_COLL_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "coll.h"

/* The element types of the host-memory allreduces. */
enum coll_host_type {
    COLL_HOST_F32,
    COLL_HOST_F64,
};

/* A backend. open runs inside coll_open, after coll.c has set the rank and world size, for a
 * world of more than one rank, or for every world when alone is true; the host operations
 * likewise (a world of one without alone never reaches them: its operations are no-ops).
 * coll.c checks the arguments (sizes, roots, dtypes) and the broken state before it calls a
 * backend, and skips calls with nothing to move. The dev_* operations are NULL for a backend
 * without device memory (coll.c answers -ENOTSUP). Every operation returns 0 or a negative
 * errno with coll_set_err's message, after coll_fail when the failure breaks the collectives;
 * close frees what open made, also after a failed open. */
struct coll_backend {
    const char *name;
    bool alone;
    int (*open)(struct coll *c, struct gr *g);
    int (*allreduce)(struct coll *c, void *buf, size_t n, enum coll_host_type t);
    int (*broadcast)(struct coll *c, void *buf, size_t bytes, int root);
    void (*close)(struct coll *c);
    int (*dev_allreduce_avg)(struct coll *c, void *buf, size_t n, enum coll_dtype dt, void *stream);
    int (*dev_reduce_scatter_avg)(struct coll *c, const void *send, void *recv, size_t count,
                                  enum coll_dtype dt, void *stream);
    int (*dev_all_gather)(struct coll *c, const void *send, void *recv, size_t count,
                          enum coll_dtype dt, void *stream);
};

/* The tcp backend (coll_tcp.c, its shared-memory links coll_shm.c). */
extern const struct coll_backend coll_tcp_backend;

/* The nccl backend (coll_nccl.c; in a build without NCCL, its open says so). */
extern const struct coll_backend coll_nccl_backend;

/* The next "<seq>" of the store keys: the process-wide count of the backends' set-ups that
 * use the store in the rank's generation (gr_generation of g; g NULL: 0), so that every rank
 * opening its collectives in the same order agrees, a rank that regrouped in process and
 * a spare's new rank of the same generation too (each generation's store starts empty). */
unsigned coll_next_seq(struct gr *g);

/* Records the message of the current failure (what coll_strerror returns). */
void coll_set_err(struct coll *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Breaks the collectives with err (a negative errno): every later call returns it. Returns
 * err. */
int coll_fail(struct coll *c, int err);

/* The timeout of an operation, in ms (coll_set_timeout). */
int coll_timeout_ms(const struct coll *c);

/* The backend's own state, NULL until the backend sets it (borrowed slot inside c: the backend
 * owns what it stores there and frees it in its close). */
void **coll_state(struct coll *c);

/* Sets the text coll_describe returns (at most 255 bytes kept). */
void coll_set_describe(struct coll *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
