/* The agent's memory checkpoints (memckpt.h, memlink.h): the node's store, its ranks' saves
 * and loads, and the memory link that sends every copy to the node holding this node's
 * copies and fetches from there what the store lacks (a spare in a lost node's place). The
 * link's threads report through an async handle; this file answers the ranks. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent_int.h"
#include "log.h"
#include "memckpt.h"
#include "memlink.h"
#include "peer.h"
#include "banned.h"

/* A rank's load waiting for a fetch from the holder. */
struct mwait {
    struct mwait *next;
    uint64_t cookie;
    struct peer *p; /* the rank's link; NULL once it closed */
    json_int_t id;
    int rank;
    char name[MEMCKPT_NAME_MAX + 1];
};

/* The node's store (proto_mem_dir). Without it the ranks' saves are refused and the job
 * runs on. */
void agent_mem_open(struct agent *a)
{
    uint64_t cap =
        a->spec->mem_ckpt_max_mb > 0
            ? (uint64_t)a->spec->mem_ckpt_max_mb << 20
            : memckpt_default_cap(a->spec->loopback ? a->spec->nnodes + a->spec->spare_nodes : 1);
    char dir[4096];
    int ret;

    a->mem_holder = -1;
    ret = proto_mem_dir(dir, sizeof(dir), a->spec->job_id, a->node_rank);
    if (ret == 0) {
        /* What daemons killed on this node (a node fenced, then given back) left behind. */
        char *slash = strrchr(dir, '/');
        int n;
        *slash = '\0';
        n = memckpt_sweep(dir, "gpurun-");
        *slash = '/';
        if (n > 0)
            log_info("node %d removed %d memory checkpoint director%s of daemons that were "
                     "killed",
                     a->node_rank, n, n == 1 ? "y" : "ies");
        ret = memckpt_open(dir, cap, &a->mem);
    }
    if (ret < 0)
        log_warn("node %d: no memory checkpoints: cannot make '%s': %s", a->node_rank, dir,
                 strerror(-ret));
}

static void mem_wake(void *ctx)
{
    uv_async_send(ctx);
}

static void on_mem_events(uv_async_t *h);

int agent_mem_link(struct agent *a)
{
    int ret;

    if (a->memlink)
        return memlink_port(a->memlink);
    if (!a->mem || a->closing)
        return 0;
    ret = uv_async_init(a->loop, &a->mem_async, on_mem_events);
    if (ret < 0)
        return 0;
    a->mem_async.data = a;
    a->mem_async_open = true;
    a->handles_open++;
    ret = memlink_start(a->mem, &a->key, a->advertise, mem_wake, &a->mem_async, &a->memlink);
    if (ret < 0) {
        log_warn("node %d: its memory checkpoints stay on it: no memory link on %s: %s",
                 a->node_rank, a->advertise, strerror(-ret));
        return 0;
    }
    return memlink_port(a->memlink);
}

void agent_mem_assign(struct agent *a, const struct msg *m)
{
    struct memckpt_entry *e;
    size_t n;

    if (!a->memlink)
        return;
    a->mem_holder = m->mem_port > 0 && m->mem_addr ? m->mem_node : -1;
    if (!memlink_set_holder(a->memlink, m->mem_addr, m->mem_port) || a->nranks == 0)
        return;
    /* A new holder (the old one lost, a spare in its place) has none of this node's
     * copies: each goes to it now. */
    n = memckpt_list(a->mem, m->rank_base, m->rank_base + a->nranks, NULL, 0);
    e = n ? calloc(n, sizeof(*e)) : NULL;
    if (!e)
        return;
    n = memckpt_list(a->mem, m->rank_base, m->rank_base + a->nranks, e, n);
    for (size_t i = 0; i < n; i++)
        memlink_push(a->memlink, e[i].rank, e[i].name);
    if (n)
        log_info("node %d sends its %zu memory checkpoint%s to node %d, its new holder",
                 a->node_rank, n, n == 1 ? "" : "s", a->mem_holder);
    free(e);
}

void agent_mem_save(struct agent *a, struct peer *p, int rank, struct msg *m)
{
    struct errmsg err;
    int ret;

    if (!a->mem) {
        peer_send_error(p, m->id, "unsupported", "this node keeps no memory checkpoints");
        return;
    }
    ret = memckpt_keep(a->mem, rank, m->key, m->step, &err);
    if (ret < 0) {
        log_warn("%s", err.text);
        peer_send_error(p, m->id,
                        ret == -ENOSPC   ? "no_space"
                        : ret == -ENOENT ? "not_found"
                                         : "bad_name",
                        err.text);
        return;
    }
    if (a->memlink)
        memlink_push(a->memlink, rank, m->key);
    peer_send(p, proto_pack("{s:s, s:I}", "type", "ok", "id", m->id));
}

/* Answers a load from the store (where from: said in the log; short: the status view's
 * "memory" or "node N"); false when it has none. */
static bool answer_load(struct agent *a, struct peer *p, json_int_t id, int rank, const char *name,
                        const char *from, const char *short_from)
{
    char path[4200];
    int64_t step;
    uint64_t size;

    if (!a->mem || memckpt_find(a->mem, rank, name, path, sizeof(path), &step, &size) < 0)
        return false;
    log_info("rank %d takes its memory checkpoint '%s' of step %" PRId64 " (%" PRIu64
             " bytes) from %s",
             rank, name, step, size, from);
    peer_send(p, proto_pack("{s:s, s:I, s:s, s:I, s:I}", "type", "mem_copy", "id", id, "path", path,
                            "step", (json_int_t)step, "size", (json_int_t)size));
    if (rank >= a->rank_base && rank < a->rank_base + a->nranks) {
        struct arank *r = &a->ranks[rank - a->rank_base];
        snprintf(r->loaded_from, sizeof(r->loaded_from), "%s", short_from);
        r->loaded_step = step;
        r->loaded_dirty = true;
    }
    return true;
}

void agent_mem_load(struct agent *a, struct peer *p, int rank, struct msg *m)
{
    char from[64];
    struct mwait *w;

    snprintf(from, sizeof(from), "node %d's memory", a->node_rank);
    if (answer_load(a, p, m->id, rank, m->key, from, "memory"))
        return;
    if (!a->memlink || a->mem_holder < 0 || !proto_mem_name_ok(m->key) ||
        !(w = calloc(1, sizeof(*w)))) {
        peer_send_error(p, m->id, "not_found", "no memory checkpoint of that name");
        return;
    }
    w->cookie = ++a->mem_cookie;
    w->p = p;
    w->id = m->id;
    w->rank = rank;
    snprintf(w->name, sizeof(w->name), "%s", m->key);
    w->next = a->mwaits;
    a->mwaits = w;
    memlink_fetch(a->memlink, rank, m->key, w->cookie);
}

void agent_mem_forget(struct agent *a, struct peer *p)
{
    for (struct mwait *w = a->mwaits; w; w = w->next)
        if (w->p == p)
            w->p = NULL;
}

static void fetched(struct agent *a, const struct memlink_event *e)
{
    struct mwait **pw = &a->mwaits, *w;
    char from[96], short_from[16];

    while (*pw && (*pw)->cookie != e->cookie)
        pw = &(*pw)->next;
    if (!(w = *pw))
        return;
    *pw = w->next;
    snprintf(from, sizeof(from), "node %d's memory (its replica: this node had none)",
             a->mem_holder);
    snprintf(short_from, sizeof(short_from), "node %d", a->mem_holder);
    if (e->ret < 0 && e->ret != -ENOENT)
        log_warn("node %d cannot fetch rank %d's memory checkpoint '%s' from node %d: %s",
                 a->node_rank, e->rank, e->name, a->mem_holder, e->why);
    if (w->p && !(e->ret == 0 && answer_load(a, w->p, w->id, w->rank, w->name, from, short_from)))
        peer_send_error(w->p, w->id, "not_found",
                        e->ret == -ENOENT ? "no memory checkpoint of that name, here or on "
                                            "the node that holds this node's copies"
                                          : e->why);
    free(w);
}

static void on_mem_events(uv_async_t *h)
{
    struct agent *a = h->data;
    struct memlink_event ev[16];
    size_t n;

    if (!a->memlink)
        return;
    while ((n = memlink_take(a->memlink, ev, 16)) > 0)
        for (size_t i = 0; i < n; i++) {
            const struct memlink_event *e = &ev[i];
            switch (e->kind) {
            case MEMLINK_SENT:
                a->mem_send_failing = false;
                log_debug("rank %d's memory checkpoint '%s' of step %" PRId64
                          " is kept by node %d too",
                          e->rank, e->name, e->step, a->mem_holder);
                break;
            case MEMLINK_SEND_FAILED:
                /* Said once while it lasts: a lost holder fails every save until the next
                 * generation names another. */
                if (!a->mem_send_failing)
                    log_warn("node %d cannot send rank %d's memory checkpoint '%s' to node %d "
                             "(its copy stays on this node only): %s",
                             a->node_rank, e->rank, e->name, a->mem_holder, e->why);
                a->mem_send_failing = true;
                break;
            case MEMLINK_FETCHED:
                fetched(a, e);
                break;
            case MEMLINK_RECEIVED:
                log_debug("node %d keeps rank %d's memory checkpoint '%s' of step %" PRId64,
                          a->node_rank, e->rank, e->name, e->step);
                break;
            case MEMLINK_REFUSED:
                log_warn("node %d refused rank %d's memory checkpoint '%s' from its peer: %s",
                         a->node_rank, e->rank, e->name, e->why);
                break;
            }
        }
}

static void on_async_closed(uv_handle_t *h)
{
    struct agent *a = h->data;

    a->handles_open--;
    agent_maybe_free(a);
}

void agent_mem_close(struct agent *a)
{
    memlink_stop(a->memlink);
    a->memlink = NULL;
    while (a->mwaits) {
        struct mwait *w = a->mwaits;
        a->mwaits = w->next;
        free(w);
    }
    if (a->mem_async_open) {
        a->mem_async_open = false;
        uv_close((uv_handle_t *)&a->mem_async, on_async_closed);
    }
}

void agent_mem_free(struct agent *a)
{
    memlink_stop(a->memlink);
    a->memlink = NULL;
    memckpt_close(a->mem);
    a->mem = NULL;
}
