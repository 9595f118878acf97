/* The rank library over PMIx (gr_pmix.h): the rank's place from the job's PMIx data, puts and
 * commits, gets that look for a key whose owner is unknown, and fences with a time limit.
 * PMIx's calls have no time limits that a remote request honours (Slurm's direct modex waits
 * for the other rank as long as it takes), so every request that may wait goes out
 * non-blocking and this thread waits for its completion with a deadline; a request given up
 * on completes later on PMIx's thread, which then frees it. */
#include <errno.h>
#ifdef HAVE_PMIX
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <pmix.h>
#endif

#include "errmsg.h"
#include "gr_pmix.h"
#include "monotime.h"
#include "banned.h"

#ifdef HAVE_PMIX

/* Keys of the store live beside PMIx's own ("pmix.*") and an MPI library's in the rank's
 * data: the prefix keeps them apart. */
#define KEY_PREFIX        "gr."
/* A key every rank puts and commits in gr_pmix_open: a request to the node of a rank that has
 * committed something is answered at once (found or not found), while one to a rank that has
 * committed nothing yet waits for its first commit. */
#define KEY_UP            "gr.up"
/* How long a rank of another node has to answer one request of a search before the search
 * moves on to the next rank (the request stays in flight, and its answer fills PMIx's cache
 * for the next search). A rank that has started answers in about a millisecond here; one
 * that has not yet called gr_init answers when it does. */
#define PROBE_PATIENCE_MS 200
/* The pause between two searches that found nothing: from PAUSE_MIN_MS, doubling up to
 * PAUSE_MAX_MS, so that a key put soon is seen soon and a long wait costs little. */
#define PAUSE_MIN_MS      5
#define PAUSE_MAX_MS      200
#define NO_DEADLINE       INT64_MAX
/* The target of an operation that is a fence, not a get. */
#define FENCE_RANK        UINT32_MAX

/* One non-blocking PMIx request. Owned by the thread that started it until that thread
 * collects it or gives up on it (abandoned); from then on by the completion callback. */
struct op {
    struct gr_pmix *px;
    uint32_t rank;
    bool done, abandoned;
    pmix_status_t status;
    bool bytes;    /* the value was a byte object */
    uint8_t *data; /* a copy of it */
    size_t len;
    pmix_info_t *info; /* the request's directives, valid until completion */
    size_t ninfo;
};

struct gr_pmix {
    pthread_mutex_t mu; /* guards everything an op's completion touches */
    pthread_cond_t cv;  /* an op completed (CLOCK_MONOTONIC) */
    int refs;           /* the handle itself, plus one per op in flight */
    pmix_proc_t me;
    uint32_t size;
    bool *local;      /* per rank: on this node (seen through this node's server) */
    bool *inflight;   /* per rank: a get to it not answered yet */
    struct op *fence; /* a fence given up on and not known to be complete */
};

static int64_t deadline_of(int timeout_ms)
{
    return timeout_ms < 0 ? NO_DEADLINE : monotime_ms() + timeout_ms;
}

static const char *status_text(pmix_status_t st)
{
    const char *s = PMIx_Error_string(st);

    return s ? s : "unknown PMIx status";
}

static void px_free(struct gr_pmix *px)
{
    pthread_cond_destroy(&px->cv);
    pthread_mutex_destroy(&px->mu);
    free(px->local);
    free(px->inflight);
    free(px);
}

static void op_free(struct op *op)
{
    if (op->info)
        PMIX_INFO_FREE(op->info, op->ninfo);
    free(op->data);
    free(op);
}

/* Frees a completed op and drops its reference on px; with px->mu held. Returns whether that
 * was the last reference (the caller frees px after unlocking). */
static bool op_release_locked(struct gr_pmix *px, struct op *op)
{
    op_free(op);
    return --px->refs == 0;
}

static struct op *op_new(struct gr_pmix *px, uint32_t rank, size_t ninfo)
{
    struct op *op = calloc(1, sizeof(*op));

    if (!op)
        return NULL;
    op->px = px;
    op->rank = rank;
    if (ninfo) {
        PMIX_INFO_CREATE(op->info, ninfo);
        if (!op->info) {
            free(op);
            return NULL;
        }
        op->ninfo = ninfo;
    }
    return op;
}

/* An op's completion, on PMIx's thread. */
static void finish(struct op *op, pmix_status_t st)
{
    struct gr_pmix *px = op->px;
    bool last = false;

    pthread_mutex_lock(&px->mu);
    op->status = st;
    op->done = true;
    if (op->rank != FENCE_RANK)
        px->inflight[op->rank] = false;
    if (op->abandoned)
        last = op_release_locked(px, op);
    else
        pthread_cond_broadcast(&px->cv);
    pthread_mutex_unlock(&px->mu);
    if (last)
        px_free(px);
}

static void on_get(pmix_status_t st, pmix_value_t *kv, void *cbdata)
{
    struct op *op = cbdata;

    /* kv is PMIx's and gone when this returns: keep a copy. Nobody reads op before finish()
     * marks it done under the lock. */
    if (st == PMIX_SUCCESS && kv && kv->type == PMIX_BYTE_OBJECT) {
        op->bytes = true;
        op->len = kv->data.bo.size;
        op->data = malloc(op->len ? op->len : 1);
        if (!op->data)
            st = PMIX_ERR_NOMEM;
        else if (op->len)
            memcpy(op->data, kv->data.bo.bytes, op->len);
    }
    finish(op, st);
}

static void on_fence(pmix_status_t st, void *cbdata)
{
    finish(cbdata, st);
}

/* Waits, with px->mu held, until op is done or the deadline passes; true when done. */
static bool wait_locked(struct gr_pmix *px, struct op *op, int64_t deadline)
{
    while (!op->done) {
        if (deadline == NO_DEADLINE) {
            pthread_cond_wait(&px->cv, &px->mu);
            continue;
        }
        int64_t now = monotime_ms();
        if (now >= deadline)
            return false;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t ns = ts.tv_nsec + (deadline - now) % 1000 * 1000000;
        ts.tv_sec += (time_t)((deadline - now) / 1000 + ns / 1000000000);
        ts.tv_nsec = (long)(ns % 1000000000);
        pthread_cond_timedwait(&px->cv, &px->mu, &ts);
    }
    return true;
}

/* --- place ----------------------------------------------------------------------------------- */

/* A number of the job's PMIx data about rank (PMIX_RANK_WILDCARD: the job itself). */
static int get_number(struct gr_pmix *px, uint32_t rank, const char *key, uint32_t *out)
{
    pmix_proc_t proc;
    pmix_value_t *v = NULL;
    pmix_status_t st;
    int ret = -EINVAL;

    PMIX_LOAD_PROCID(&proc, px->me.nspace, rank);
    st = PMIx_Get(&proc, key, NULL, 0, &v);
    if (st != PMIX_SUCCESS || !v)
        goto out;
    switch (v->type) {
    case PMIX_UINT32:
        *out = v->data.uint32;
        break;
    case PMIX_UINT16:
        *out = v->data.uint16;
        break;
    case PMIX_INT:
        if (v->data.integer < 0)
            goto out;
        *out = (uint32_t)v->data.integer;
        break;
    default:
        goto out;
    }
    ret = 0;
out:
    if (v)
        PMIX_VALUE_RELEASE(v);
    return ret;
}

/* Marks the ranks of this node from PMIX_LOCAL_PEERS, "0,1,5" (ranges "0-3" too); without it
 * only this rank counts as local, which costs searches a request more, nothing else. */
static void read_local_peers(struct gr_pmix *px)
{
    pmix_proc_t proc;
    pmix_value_t *v = NULL;
    const char *p;

    px->local[px->me.rank] = true;
    PMIX_LOAD_PROCID(&proc, px->me.nspace, PMIX_RANK_WILDCARD);
    if (PMIx_Get(&proc, PMIX_LOCAL_PEERS, NULL, 0, &v) != PMIX_SUCCESS || !v)
        return;
    if (v->type == PMIX_STRING && v->data.string) {
        for (p = v->data.string; *p;) {
            char *end;
            unsigned long a = strtoul(p, &end, 10), b = a;
            if (end == p)
                break;
            if (*end == '-') {
                p = end + 1;
                b = strtoul(p, &end, 10);
                if (end == p)
                    break;
            }
            for (unsigned long r = a; r <= b && r < px->size; r++)
                px->local[r] = true;
            p = *end == ',' ? end + 1 : end;
            if (*end != ',')
                break;
        }
    }
    PMIX_VALUE_RELEASE(v);
}

static int put_bytes(const char *pkey, const void *val, size_t len)
{
    pmix_byte_object_t bo = {.bytes = (char *)val, .size = len};
    pmix_value_t v;
    pmix_status_t st;

    PMIX_VALUE_LOAD(&v, &bo, PMIX_BYTE_OBJECT);
    st = PMIx_Put(PMIX_GLOBAL, pkey, &v);
    PMIX_VALUE_DESTRUCT(&v);
    if (st == PMIX_SUCCESS)
        st = PMIx_Commit();
    return st;
}

int gr_pmix_open(struct gr_pmix **out, struct gr_pmix_place *place, struct errmsg *err)
{
    pthread_condattr_t ca;
    struct gr_pmix *px = NULL;
    uint32_t lrank, lsize, node;
    bool inited = false;
    pmix_status_t st;
    uint8_t one = 1;
    int ret = -1;

    *out = NULL;
    px = calloc(1, sizeof(*px));
    if (!px) {
        ret = errmsg_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    pthread_mutex_init(&px->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&px->cv, &ca);
    pthread_condattr_destroy(&ca);
    px->refs = 1;
    st = PMIx_Init(&px->me, NULL, 0);
    if (st != PMIX_SUCCESS) {
        ret = errmsg_set(err, -ECONNREFUSED, "cannot connect to the PMIx server: %s",
                         status_text(st));
        goto out;
    }
    inited = true;
    if (get_number(px, PMIX_RANK_WILDCARD, PMIX_JOB_SIZE, &px->size) < 0 || px->size == 0 ||
        px->size > INT32_MAX || px->me.rank >= px->size) {
        ret = errmsg_set(err, -EINVAL, "PMIx gives no job size above rank %u in '%s'", px->me.rank,
                         px->me.nspace);
        goto out;
    }
    if (get_number(px, px->me.rank, PMIX_LOCAL_RANK, &lrank) < 0 ||
        get_number(px, PMIX_RANK_WILDCARD, PMIX_LOCAL_SIZE, &lsize) < 0 ||
        get_number(px, px->me.rank, PMIX_NODEID, &node) < 0 || lrank >= lsize || lsize > px->size ||
        node > INT32_MAX) {
        ret = errmsg_set(err, -EINVAL,
                         "PMIx gives no local rank, local size or node id for rank %u of '%s'",
                         px->me.rank, px->me.nspace);
        goto out;
    }
    px->local = calloc(px->size, sizeof(*px->local));
    px->inflight = calloc(px->size, sizeof(*px->inflight));
    if (!px->local || !px->inflight) {
        ret = errmsg_set(err, -ENOMEM, "out of memory for %u ranks", px->size);
        goto out;
    }
    read_local_peers(px);
    st = put_bytes(KEY_UP, &one, 1);
    if (st != PMIX_SUCCESS) {
        ret = errmsg_set(err, -EIO, "cannot put '%s' into PMIx: %s", KEY_UP, status_text(st));
        goto out;
    }
    place->rank = (int)px->me.rank;
    place->world_size = (int)px->size;
    place->local_rank = (int)lrank;
    place->local_world_size = (int)lsize;
    place->node_rank = (int)node;
    *out = px;
    px = NULL;
    ret = 0;
out:
    if (px) {
        if (inited)
            PMIx_Finalize(NULL, 0);
        px_free(px);
    }
    return ret;
}

/* --- store ----------------------------------------------------------------------------------- */

static int prefixed(char *pkey, size_t cap, const char *key)
{
    return (size_t)snprintf(pkey, cap, "%s%s", KEY_PREFIX, key) < cap ? 0 : -E2BIG;
}

int gr_pmix_put(struct gr_pmix *px, const char *key, const void *val, size_t len,
                struct errmsg *err)
{
    char pkey[PMIX_MAX_KEYLEN + 1];
    pmix_status_t st;

    (void)px;
    if (prefixed(pkey, sizeof(pkey), key) < 0)
        return errmsg_set(err, -E2BIG, "kv_put '%s': key too long for PMIx", key);
    st = put_bytes(pkey, val, len);
    if (st != PMIX_SUCCESS)
        return errmsg_set(err, -EIO, "kv_put '%s': PMIx refused it: %s", key, status_text(st));
    return 0;
}

/* The rank a key names by its end, "addr/3" -> 3, where it is a rank of the job: the rank
 * that most likely put it, asked first. -1 when there is none. */
static long owner_hint(const struct gr_pmix *px, const char *key)
{
    const char *slash = strrchr(key, '/');
    long r = 0;

    if (!slash || !slash[1])
        return -1;
    for (const char *p = slash + 1; *p; p++) {
        if (*p < '0' || *p > '9' || r > (long)px->size)
            return -1;
        r = r * 10 + (*p - '0');
    }
    return r < (long)px->size ? r : -1;
}

/* What this process can see of rank's data under pkey without asking anybody: its own puts,
 * the shared store of its node's PMIx server (the other local ranks' commits), and what an
 * earlier request or fence brought in (PMIX_OPTIONAL). Returns 1 found (*data new), 0 not
 * there, or -EIO (*st set) for a value that is not ours. */
static int look_here(struct gr_pmix *px, uint32_t rank, const char *pkey, uint8_t **data,
                     size_t *len, pmix_status_t *st)
{
    pmix_proc_t proc;
    pmix_value_t *v = NULL;
    pmix_info_t info;
    bool yes = true;
    int ret = 0;

    PMIX_LOAD_PROCID(&proc, px->me.nspace, rank);
    PMIX_INFO_LOAD(&info, PMIX_OPTIONAL, &yes, PMIX_BOOL);
    *st = PMIx_Get(&proc, pkey, &info, 1, &v);
    PMIX_INFO_DESTRUCT(&info);
    if (*st != PMIX_SUCCESS || !v)
        return 0;
    if (v->type != PMIX_BYTE_OBJECT) {
        *st = PMIX_ERR_TYPE_MISMATCH;
        ret = -EIO;
        goto out;
    }
    *len = v->data.bo.size;
    *data = malloc(*len ? *len : 1);
    if (!*data) {
        *st = PMIX_ERR_NOMEM;
        ret = -EIO;
        goto out;
    }
    if (*len)
        memcpy(*data, v->data.bo.bytes, *len);
    ret = 1;
out:
    PMIX_VALUE_RELEASE(v);
    return ret;
}

/* Asks rank's node for pkey, waiting until wait_until at most. Returns 1 found (*data new),
 * 0 not found, not answered in time, or a request already in flight to that rank; *st is the
 * PMIx status when there was an answer. */
static int ask_rank(struct gr_pmix *px, uint32_t rank, const char *pkey, int64_t wait_until,
                    uint8_t **data, size_t *len, pmix_status_t *st)
{
    pmix_proc_t proc;
    struct op *op;
    bool yes = true;
    int ret = 0;

    pthread_mutex_lock(&px->mu);
    if (px->inflight[rank]) {
        pthread_mutex_unlock(&px->mu);
        return 0;
    }
    pthread_mutex_unlock(&px->mu);
    op = op_new(px, rank, 1);
    if (!op) {
        *st = PMIX_ERR_NOMEM;
        return 0;
    }
    PMIX_INFO_LOAD(&op->info[0], PMIX_GET_REFRESH_CACHE, &yes, PMIX_BOOL);
    PMIX_LOAD_PROCID(&proc, px->me.nspace, rank);
    pthread_mutex_lock(&px->mu);
    px->inflight[rank] = true;
    px->refs++;
    pthread_mutex_unlock(&px->mu);
    *st = PMIx_Get_nb(&proc, pkey, op->info, op->ninfo, on_get, op);
    pthread_mutex_lock(&px->mu);
    if (*st != PMIX_SUCCESS) {
        /* Refused at once: no completion will come. */
        px->inflight[rank] = false;
        op_release_locked(px, op);
    } else if (wait_locked(px, op, wait_until)) {
        *st = op->status;
        if (op->status == PMIX_SUCCESS && op->bytes) {
            *data = op->data;
            *len = op->len;
            op->data = NULL;
            ret = 1;
        } else if (op->status == PMIX_SUCCESS) {
            *st = PMIX_ERR_TYPE_MISMATCH;
        }
        /* Never the last reference: the handle holds its own. */
        op_release_locked(px, op);
    } else {
        op->abandoned = true;
    }
    pthread_mutex_unlock(&px->mu);
    return ret;
}

/* The i-th rank a search visits: the hinted one first, then all in order (the hinted one
 * again is skipped by the caller). */
static long visit(long hint, long i)
{
    return i < 0 ? hint : i;
}

/* One search for pkey: every rank's data this process can see, then a request to the node of
 * each rank of another node, the hinted rank first each time. Returns 1 found, 0 not found;
 * *last_st is the last status that was not "not found". */
static int search(struct gr_pmix *px, const char *pkey, long hint, int64_t deadline, bool once,
                  uint8_t **data, size_t *len, pmix_status_t *last_st)
{
    pmix_status_t st;
    long i, rank;
    int r;

    for (i = -1; i < (long)px->size; i++) {
        rank = visit(hint, i);
        if (rank < 0 || (i >= 0 && i == hint))
            continue;
        r = look_here(px, (uint32_t)rank, pkey, data, len, &st);
        if (r > 0)
            return 1;
        if (r < 0)
            *last_st = st;
    }
    for (i = -1; i < (long)px->size; i++) {
        int64_t until;

        rank = visit(hint, i);
        if (rank < 0 || (i >= 0 && i == hint) || px->local[rank])
            continue;
        /* A look without a wait still gives each rank its patience. */
        until = monotime_ms() + PROBE_PATIENCE_MS;
        if (!once && deadline < until)
            until = deadline;
        st = PMIX_ERR_NOT_FOUND;
        r = ask_rank(px, (uint32_t)rank, pkey, until, data, len, &st);
        if (r > 0)
            return 1;
        if (st != PMIX_ERR_NOT_FOUND && st != PMIX_SUCCESS)
            *last_st = st;
        if (!once && monotime_ms() >= deadline)
            break;
    }
    return 0;
}

int gr_pmix_get(struct gr_pmix *px, const char *key, void *buf, size_t cap, size_t *len,
                int timeout_ms, struct errmsg *err)
{
    char pkey[PMIX_MAX_KEYLEN + 1];
    pmix_status_t last_st = PMIX_SUCCESS;
    int64_t deadline = deadline_of(timeout_ms), pause = PAUSE_MIN_MS;
    uint8_t *data = NULL;
    size_t n = 0;
    long hint;
    int ret = -1;

    if (prefixed(pkey, sizeof(pkey), key) < 0)
        return errmsg_set(err, -E2BIG, "kv_get '%s': key too long for PMIx", key);
    hint = owner_hint(px, key);
    for (;;) {
        if (search(px, pkey, hint, deadline, timeout_ms == 0, &data, &n, &last_st))
            break;
        if (timeout_ms == 0) {
            ret = errmsg_set(err, -ENOENT, "kv_get '%s': no such key", key);
            goto out;
        }
        int64_t left = deadline == NO_DEADLINE ? pause : deadline - monotime_ms();
        if (left <= 0) {
            if (last_st != PMIX_SUCCESS)
                ret = errmsg_set(err, -ETIMEDOUT,
                                 "kv_get '%s': not put by any rank within %d ms (PMIx said: %s)",
                                 key, timeout_ms, status_text(last_st));
            else
                ret = errmsg_set(err, -ETIMEDOUT, "kv_get '%s': not put by any rank within %d ms",
                                 key, timeout_ms);
            goto out;
        }
        monotime_sleep_ms(left < pause ? left : pause);
        pause = pause * 2 > PAUSE_MAX_MS ? PAUSE_MAX_MS : pause * 2;
    }
    *len = n;
    if (n > cap) {
        ret = errmsg_set(err, -ENOBUFS, "kv_get '%s': value of %zu bytes does not fit in %zu", key,
                         n, cap);
        goto out;
    }
    if (n)
        memcpy(buf, data, n);
    ret = 0;
out:
    free(data);
    return ret;
}

/* --- barrier --------------------------------------------------------------------------------- */

int gr_pmix_fence(struct gr_pmix *px, const char *name, int timeout_ms, struct errmsg *err)
{
    int64_t deadline = deadline_of(timeout_ms);
    pmix_status_t st;
    struct op *op;
    bool yes = true, done;
    int ret = 0;

    /* The fence given up on last time still counts this rank as arrived: the others are
     * released by it, not by this one, so wait for it first. */
    pthread_mutex_lock(&px->mu);
    if (px->fence) {
        if (!wait_locked(px, px->fence, deadline)) {
            pthread_mutex_unlock(&px->mu);
            return errmsg_set(err, -ETIMEDOUT,
                              "barrier '%s': the barrier given up on before is still not complete "
                              "after %d ms",
                              name, timeout_ms);
        }
        op_release_locked(px, px->fence);
        px->fence = NULL;
    }
    pthread_mutex_unlock(&px->mu);

    op = op_new(px, FENCE_RANK, 1);
    if (!op)
        return errmsg_set(err, -ENOMEM, "barrier '%s': out of memory", name);
    PMIX_INFO_LOAD(&op->info[0], PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
    pthread_mutex_lock(&px->mu);
    px->refs++;
    pthread_mutex_unlock(&px->mu);
    st = PMIx_Fence_nb(NULL, 0, op->info, op->ninfo, on_fence, op);
    pthread_mutex_lock(&px->mu);
    if (st != PMIX_SUCCESS) {
        /* No completion will come: done at once (OPERATION_SUCCEEDED) or refused. */
        op_release_locked(px, op);
        pthread_mutex_unlock(&px->mu);
        if (st == PMIX_OPERATION_SUCCEEDED)
            return 0;
        return errmsg_set(err, -EIO, "barrier '%s': PMIx refused the fence: %s", name,
                          status_text(st));
    }
    done = wait_locked(px, op, deadline);
    if (done) {
        st = op->status;
        op_release_locked(px, op);
    } else {
        px->fence = op;
    }
    pthread_mutex_unlock(&px->mu);
    if (!done)
        ret = errmsg_set(err, -ETIMEDOUT, "barrier '%s': not every rank arrived within %d ms", name,
                         timeout_ms);
    else if (st != PMIX_SUCCESS)
        ret =
            errmsg_set(err, -EIO, "barrier '%s': the PMIx fence failed: %s", name, status_text(st));
    return ret;
}

int gr_pmix_close(struct gr_pmix *px, struct errmsg *err)
{
    pmix_status_t st;
    bool last;
    int ret = 0;

    if (!px)
        return 0;
    pthread_mutex_lock(&px->mu);
    if (px->fence) {
        if (px->fence->done)
            op_release_locked(px, px->fence);
        else
            px->fence->abandoned = true;
        px->fence = NULL;
    }
    pthread_mutex_unlock(&px->mu);
    st = PMIx_Finalize(NULL, 0);
    if (st != PMIX_SUCCESS)
        ret = errmsg_set(err, -EIO, "finalize: PMIx_Finalize failed: %s", status_text(st));
    /* Requests still in flight hold references: the last completion frees px. */
    pthread_mutex_lock(&px->mu);
    last = --px->refs == 0;
    pthread_mutex_unlock(&px->mu);
    if (last)
        px_free(px);
    return ret;
}

#else /* !HAVE_PMIX: built without libpmix; gr.c never calls these then */

int gr_pmix_open(struct gr_pmix **out, struct gr_pmix_place *place, struct errmsg *err)
{
    (void)place;
    *out = NULL;
    err->text[0] = '\0';
    return -ENOTSUP;
}

int gr_pmix_put(struct gr_pmix *px, const char *key, const void *val, size_t len,
                struct errmsg *err)
{
    (void)px, (void)key, (void)val, (void)len, (void)err;
    return -ENOTSUP;
}

int gr_pmix_get(struct gr_pmix *px, const char *key, void *buf, size_t cap, size_t *len,
                int timeout_ms, struct errmsg *err)
{
    (void)px, (void)key, (void)buf, (void)cap, (void)len, (void)timeout_ms, (void)err;
    return -ENOTSUP;
}

int gr_pmix_fence(struct gr_pmix *px, const char *name, int timeout_ms, struct errmsg *err)
{
    (void)px, (void)name, (void)timeout_ms, (void)err;
    return -ENOTSUP;
}

int gr_pmix_close(struct gr_pmix *px, struct errmsg *err)
{
    (void)px, (void)err;
    return 0;
}

#endif /* HAVE_PMIX */
