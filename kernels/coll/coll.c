/* Collectives between ranks (coll.h): the backend table, the world-of-one shortcut, and the
 * checks and state every backend shares (coll_backend.h). The backends live in files of their
 * own beside this one: tcp (coll_tcp.c, with its shared-memory links in coll_shm.c) and nccl
 * (coll_nccl.c). */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"
#include "coll_backend.h"
#include "errmsg.h"
#include "gr.h"
#include "banned.h"

struct coll {
    const struct coll_backend *be;
    int rank;
    int world;
    int timeout_ms;
    /* The first transport error: once set, every call returns it. */
    int broken;
    struct errmsg err;
    char describe[256];
    /* The backend's own state (coll_state). */
    void *state;
};

/* The process-wide count of coll_open calls in the generation open_gen: the "<seq>" of the
 * store keys. */
static pthread_mutex_t seq_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned open_seq;
static int open_gen;

void coll_set_err(struct coll *c, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    errmsg_vset(&c->err, 0, fmt, ap);
    va_end(ap);
}

static int single_open(struct coll *c, struct gr *g)
{
    (void)g;
    if (c->world != 1) {
        coll_set_err(c, "the single backend runs one rank, not %d (use tcp)", c->world);
        return -EINVAL;
    }
    return 0;
}

/* --- the interface --------------------------------------------------------------------------- */

static const struct coll_backend single_backend = {
    .name = "single",
    .open = single_open,
};

static const struct coll_backend *const backends[] = {
    &single_backend,
    &coll_tcp_backend,
    &coll_nccl_backend,
};

#define N_BACKENDS (sizeof(backends) / sizeof(backends[0]))

unsigned coll_next_seq(struct gr *g)
{
    int gen = g ? gr_generation(g) : 0;
    unsigned seq;

    pthread_mutex_lock(&seq_lock);
    if (gen != open_gen) {
        open_gen = gen;
        open_seq = 0;
    }
    seq = open_seq++;
    pthread_mutex_unlock(&seq_lock);
    return seq;
}

int coll_fail(struct coll *c, int err)
{
    c->broken = err;
    return err;
}

int coll_timeout_ms(const struct coll *c)
{
    return c->timeout_ms;
}

void **coll_state(struct coll *c)
{
    return &c->state;
}

void coll_set_describe(struct coll *c, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(c->describe, sizeof(c->describe), fmt, ap);
    va_end(ap);
}

/* Whether c's operations are no-ops: one rank, on a backend that does not run alone. */
static bool trivial(const struct coll *c)
{
    return c->world == 1 && !c->be->alone;
}

int coll_open(const char *backend, struct gr *g, struct coll **out, struct errmsg *err)
{
    struct coll *c = NULL;
    int ret = -1;

    *out = NULL;
    if (err)
        err->text[0] = '\0';
    c = calloc(1, sizeof(*c));
    if (!c)
        return err ? errmsg_set(err, -ENOMEM, "out of memory for the collectives") : -ENOMEM;
    c->timeout_ms = COLL_TIMEOUT_MS_DEFAULT;
    c->rank = g ? gr_rank(g) : 0;
    c->world = g ? gr_world_size(g) : 1;
    for (size_t i = 0; i < N_BACKENDS; i++)
        if (backend && !strcmp(backend, backends[i]->name))
            c->be = backends[i];
    if (!c->be) {
        char names[64] = "";
        for (size_t i = 0, len = 0; i < N_BACKENDS && len < sizeof(names); i++)
            len += (size_t)snprintf(names + len, sizeof(names) - len, "%s%s", i ? ", " : "",
                                    backends[i]->name);
        coll_set_err(c, "unknown collectives backend '%s' (%s)", backend ? backend : "", names);
        ret = -EINVAL;
        goto out;
    }
    if (c->world > 1 || c->be->alone || c->be == &single_backend)
        if ((ret = c->be->open(c, g)) < 0)
            goto out;
    /* A backend that opened describes itself; a world of one on tcp or single opened none. */
    if (!c->describe[0])
        snprintf(c->describe, sizeof(c->describe), "%s: one rank", c->be->name);
    /* A shared ring that could not be made leaves a message but no failure. */
    c->err.text[0] = '\0';
    *out = c;
    c = NULL;
    ret = 0;
out:
    if (c) {
        if (err)
            *err = c->err;
        coll_close(c);
    }
    return ret;
}

int coll_rank(const struct coll *c)
{
    return c->rank;
}

int coll_world_size(const struct coll *c)
{
    return c->world;
}

const char *coll_backend(const struct coll *c)
{
    return c->be->name;
}

void coll_set_timeout(struct coll *c, int timeout_ms)
{
    if (timeout_ms > 0)
        c->timeout_ms = timeout_ms;
}

static int coll_allreduce(struct coll *c, void *buf, size_t n, enum coll_host_type t)
{
    if (c->broken)
        return c->broken;
    if (trivial(c) || n == 0)
        return 0;
    c->err.text[0] = '\0';
    return c->be->allreduce(c, buf, n, t);
}

int coll_allreduce_sum_f32(struct coll *c, float *buf, size_t n)
{
    return coll_allreduce(c, buf, n, COLL_HOST_F32);
}

int coll_allreduce_avg_f32(struct coll *c, float *buf, size_t n)
{
    int ret = coll_allreduce(c, buf, n, COLL_HOST_F32);
    float w = (float)c->world;

    if (ret < 0 || c->world == 1)
        return ret;
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        buf[i] = buf[i] / w;
    return 0;
}

int coll_allreduce_sum_f64(struct coll *c, double *buf, size_t n)
{
    return coll_allreduce(c, buf, n, COLL_HOST_F64);
}

int coll_broadcast(struct coll *c, void *buf, size_t bytes, int root)
{
    if (c->broken)
        return c->broken;
    if (root < 0 || root >= c->world) {
        coll_set_err(c, "broadcast from rank %d: no such rank in a world of %d", root, c->world);
        return -EINVAL;
    }
    if (trivial(c) || bytes == 0)
        return 0;
    c->err.text[0] = '\0';
    return c->be->broadcast(c, buf, bytes, root);
}

/* An allreduce of one element: no rank gets the sum before every rank has given its part. */
int coll_barrier(struct coll *c)
{
    float one = 1.0f;

    if (c->broken)
        return c->broken;
    if (trivial(c))
        return 0;
    c->err.text[0] = '\0';
    return c->be->allreduce(c, &one, 1, COLL_HOST_F32);
}

/* The checks every device operation starts with: 0 to go on, or the error to return. */
static int dev_check(struct coll *c, const char *what, bool has_op)
{
    if (c->broken)
        return c->broken;
    if (!has_op) {
        coll_set_err(c, "%s: the %s backend has no device-memory operations (nccl has)", what,
                     c->be->name);
        return -ENOTSUP;
    }
    c->err.text[0] = '\0';
    return 0;
}

static int dev_check_dtype(struct coll *c, const char *what, bool has_op, enum coll_dtype dt)
{
    int ret = dev_check(c, what, has_op);

    if (ret == 0 && dt != COLL_F32 && dt != COLL_BF16) {
        coll_set_err(c, "%s: unknown dtype %d", what, (int)dt);
        return -EINVAL;
    }
    return ret;
}

static int null_buffer(struct coll *c, const char *what)
{
    coll_set_err(c, "%s: a null buffer", what);
    return -EINVAL;
}

int coll_dev_allreduce_avg(struct coll *c, void *buf, size_t n, enum coll_dtype dt, void *stream)
{
    const char *what = "device allreduce";
    int ret = dev_check_dtype(c, what, c->be->dev_allreduce_avg != NULL, dt);

    if (ret < 0 || n == 0)
        return ret;
    if (!buf)
        return null_buffer(c, what);
    return c->be->dev_allreduce_avg(c, buf, n, dt, stream);
}

int coll_dev_reduce_scatter_avg(struct coll *c, const void *send, void *recv, size_t count,
                                enum coll_dtype dt, void *stream)
{
    const char *what = "device reduce-scatter";
    int ret = dev_check_dtype(c, what, c->be->dev_reduce_scatter_avg != NULL, dt);

    if (ret < 0 || count == 0)
        return ret;
    if (!send || !recv)
        return null_buffer(c, what);
    return c->be->dev_reduce_scatter_avg(c, send, recv, count, dt, stream);
}

int coll_dev_all_gather(struct coll *c, const void *send, void *recv, size_t count,
                        enum coll_dtype dt, void *stream)
{
    const char *what = "device all-gather";
    int ret = dev_check_dtype(c, what, c->be->dev_all_gather != NULL, dt);

    if (ret < 0 || count == 0)
        return ret;
    if (!send || !recv)
        return null_buffer(c, what);
    return c->be->dev_all_gather(c, send, recv, count, dt, stream);
}

void coll_close(struct coll *c)
{
    if (!c)
        return;
    if (c->be && c->be->close)
        c->be->close(c);
    free(c);
}

const char *coll_describe(const struct coll *c)
{
    return c->describe;
}

const char *coll_strerror(const struct coll *c)
{
    return c ? c->err.text : "";
}
