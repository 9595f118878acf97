/* Admission and the join: connections waiting for their first message (the pending queue,
 * bounded), the link probe and pre-flight verdicts of joining nodes, and the assign that
 * starts the ranks once every node of the job is in. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "leader_int.h"
#include "preflight.h"
#include "log.h"
#include "banned.h"

/* --- the pending queue: connections not yet admitted, oldest first ------------------------- */

void leader_pending_add(struct leader *l, struct conn *c)
{
    c->queued = true;
    c->qprev = l->qtail;
    c->qnext = NULL;
    if (l->qtail)
        l->qtail->qnext = c;
    else
        l->qhead = c;
    l->qtail = c;
    l->npending++;
}

void leader_pending_remove(struct leader *l, struct conn *c)
{
    if (!c->queued)
        return;
    c->queued = false;
    if (c->qprev)
        c->qprev->qnext = c->qnext;
    else
        l->qhead = c->qnext;
    if (c->qnext)
        c->qnext->qprev = c->qprev;
    else
        l->qtail = c->qprev;
    c->qprev = c->qnext = NULL;
    l->npending--;
}

void leader_do_probe(struct conn *c, const struct msg *m)
{
    uint64_t t = uv_hrtime();
    int k = m->count % PROTO_PROBE_FRAMES;
    double us, mbit;

    if (m->count >= PROTO_PROBE_ROUNDS * PROTO_PROBE_FRAMES)
        return;
    if (k == 0) {
        c->probe_t0 = t;
        c->probe_bytes = 0;
        return;
    }
    c->probe_bytes += m->tail_len;
    if (k < PROTO_PROBE_FRAMES - 1 || !c->probe_t0)
        return;
    /* A round that came in one read took under a microsecond: a microsecond is said. */
    us = (double)(t - c->probe_t0) / 1e3;
    if (us < 1)
        us = 1;
    mbit = (double)c->probe_bytes * 8 / us;
    if (mbit > c->probe_mbit) {
        c->probe_mbit = mbit;
        c->probe_ms = us / 1e3;
    }
    c->probe_t0 = 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The link test's verdict: a node whose link is far below the median of the timed ones fails
 * its pre-flight, its figure and the median named (a node that failed another check keeps
 * that one). */
static void link_check(struct leader *l)
{
    double *v = calloc((size_t)l->nphys, sizeof(*v)), median;
    int k = 0;

    if (!v)
        return;
    for (int i = 0; i < l->nphys; i++)
        if (l->nodes[i].link_mbit > 0)
            v[k++] = l->nodes[i].link_mbit;
    if (k < PREFLIGHT_LINKS_MIN) {
        free(v);
        return;
    }
    qsort(v, (size_t)k, sizeof(*v), cmp_double);
    median = k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2;
    free(v);
    for (int i = 0; i < l->nphys; i++) {
        struct node *n = &l->nodes[i];
        if (n->preflight[0] || n->link_mbit <= 0 || n->link_ms < LINK_SLOW_MIN_MS ||
            n->link_mbit >= median * LINK_SLOW_FRACTION)
            continue;
        snprintf(n->preflight, sizeof(n->preflight),
                 "link to the leader %.0f Mbit/s, median of the nodes %.0f Mbit/s", n->link_mbit,
                 median);
        log_debug("node %d ('%s') failed pre-flight: %s", i, n->hostname, n->preflight);
    }
}

/* gpurun preflight: the checks were all; the job ends before any assign, failed (125) where
 * a node failed them, spares included. */
static void preflight_verdict(struct leader *l)
{
    int bad = 0, first = -1;
    char cause[400];

    for (int i = 0; i < l->nphys; i++)
        if (l->nodes[i].preflight[0]) {
            bad++;
            first = first < 0 ? i : first;
        }
    if (!bad) {
        log_info("pre-flight: all %d nodes passed", l->nphys);
        leader_finish(l);
        return;
    }
    snprintf(cause, sizeof(cause), "pre-flight failed on %d of %d nodes; node %d ('%.64s'): %s",
             bad, l->nphys, first, l->nodes[first].hostname, l->nodes[first].preflight);
    leader_fail(
        l, 125, "failed", false,
        leader_classed(leader_failure_new(cause, -1, first, l->nodes[first].hostname, 0, 0, ""),
                       FAILURE_NODE));
    leader_check_end(l);
}

/* Slot s's node failed pre-flight and no spare can serve it (or it is node 0): the job ends
 * on it; the others that failed are said here, once. */
static void preflight_unserved(struct leader *l, int s)
{
    int bad = l->slot_node[s];
    const struct node *b = &l->nodes[bad];
    char cause[400];

    for (int t = s + 1; t < l->spec->nnodes; t++) {
        const struct node *o = &l->nodes[l->slot_node[t]];
        if (o->preflight[0])
            log_warn("node %d ('%s') failed pre-flight: %s", l->slot_node[t], o->hostname,
                     o->preflight);
    }
    snprintf(cause, sizeof(cause), "node %d ('%.64s') failed pre-flight: %s", bad, b->hostname,
             b->preflight);
    leader_fail(
        l, 125, "failed", false,
        leader_classed(leader_failure_new(cause, -1, bad, b->hostname, 0, 0, ""), FAILURE_NODE));
    leader_check_end(l);
}

/* Before the first assign: each node serving the job that failed its pre-flight checks gives
 * its place to a spare that passed them; where none is left (or it is node 0, the leader's),
 * the job ends before any rank starts. Spares that failed are fenced. Returns false when the
 * job ended. */
static bool preflight_swaps(struct leader *l)
{
    struct spares_node *nodes;
    struct spares_swap *plan;
    struct spares_fleet f;
    char cause[400];
    int nswaps;

    link_check(l);
    if (l->spec->preflight_only) {
        preflight_verdict(l);
        return false;
    }
    for (int i = l->spec->nnodes; i < l->nphys; i++) {
        struct node *n = &l->nodes[i];
        if (n->preflight[0] && !n->fenced) {
            log_warn("spare node %d ('%s') fenced: failed pre-flight: %s", i, n->hostname,
                     n->preflight);
            n->fenced = true;
            if (n->conn)
                peer_send(&n->conn->peer, proto_pack("{s:s, s:i}", "type", "finish", "status", 0));
        }
    }
    nodes = malloc((size_t)l->nphys * sizeof(*nodes));
    plan = malloc((size_t)l->spec->nnodes * sizeof(*plan));
    if (!nodes || !plan) {
        free(nodes);
        free(plan);
        leader_fail(l, 125, "failed", false,
                    leader_classed(leader_failure_new("leader out of memory", -1, 0, "", 0, 0, ""),
                                   FAILURE_NODE));
        leader_check_end(l);
        return false;
    }
    f = leader_fleet(l, nodes);
    nswaps = spares_plan_preflight(&f, plan);
    for (int k = 0; k < nswaps; k++) {
        const struct node *b = &l->nodes[plan[k].node];
        char why[300];
        snprintf(why, sizeof(why), "failed pre-flight: %s", b->preflight);
        snprintf(cause, sizeof(cause), "node %d ('%.64s') failed pre-flight: %s", plan[k].node,
                 b->hostname, b->preflight);
        leader_swap(l, &plan[k], 0, why, cause);
    }
    free(nodes);
    free(plan);
    if (nswaps < 0) {
        preflight_unserved(l, -1 - nswaps);
        return false;
    }
    return true;
}

static void assign_all(struct leader *l)
{
    int base = 0, hvd;

    if (!preflight_swaps(l))
        return;
    for (int s = 0; s < l->spec->nnodes; s++) {
        struct node *n = &l->nodes[l->slot_node[s]];
        n->rank_base = base;
        base += n->nprocs;
    }
    l->world_size = base;
    l->ranks = calloc((size_t)base, sizeof(*l->ranks));
    l->hang_signs = calloc((size_t)base, sizeof(*l->hang_signs));
    hvd = leader_hvd_layout(l);
    if (!l->ranks || !l->hang_signs || hvd < 0) {
        leader_fail(l, 125, "failed", false,
                    leader_classed(leader_failure_new("leader out of memory", -1, 0, "", 0, 0, ""),
                                   FAILURE_NODE));
        return;
    }
    for (int r = 0; r < base; r++) {
        l->ranks[r].phase = PHASE_RUNNING;
        proto_progress_init(&l->ranks[r].prog);
    }
    l->state = JOB_RUNNING;
    l->t_joined = l->t_generation = now_ms(l);
    log_info("all %d nodes joined in %" PRId64 " ms: world size %d", l->nphys,
             l->t_joined - l->t_start, base);
    if (l->spec->spare_nodes)
        log_info("hot spares: node%s %d..%d", l->spec->spare_nodes > 1 ? "s" : "", l->spec->nnodes,
                 l->nphys - 1);
    leader_send_assign(l);
}

/* A node a requeued job's earlier segment fenced fails pre-flight: the job never uses it
 * again (where gpurun --wait followed the requeue, Slurm's ExcNodeList kept it out). */
static void fenced_before(struct leader *l, struct node *n)
{
    json_t *seg, *h;
    size_t i, j;

    json_array_foreach(l->segments, i, seg)
    {
        json_array_foreach(json_object_get(seg, "fenced"), j, h)
        {
            if (strcmp(json_string_value(h), n->hostname))
                continue;
            snprintf(n->preflight, sizeof(n->preflight),
                     "fenced in segment %zu of this job (before its requeue)", i);
            return;
        }
    }
}

void leader_do_join(struct leader *l, struct conn *c, struct msg *m)
{
    struct node *n;
    char why[160];

    /* Every node runs job.json's nprocs ranks (rank = node_rank * nprocs + local_rank), which
     * also keeps the world size from overflowing whatever a join claims. */
    if (m->node_rank >= l->nphys || m->nprocs != l->spec->nprocs || l->state != JOB_JOINING ||
        l->nodes[m->node_rank].joined) {
        /* A job that ended before any rank started (a node that could not start, a
         * cancel) has not started: its late joins are the failure's consequence, not news. */
        snprintf(why, sizeof(why),
                 l->state != JOB_JOINING && l->t_joined ? "node %d joined after the job started"
                 : l->state != JOB_JOINING      ? "node %d joined after the job ended, before any "
                                                  "rank started"
                 : m->node_rank >= l->nphys     ? "node rank %d out of range"
                 : m->nprocs != l->spec->nprocs ? "node %d does not run job.json's nprocs ranks"
                                                : "node %d joined twice",
                 m->node_rank);
        if (l->state != JOB_JOINING && !l->t_joined && l->first_failure)
            log_info("refused join from '%s': %s", c->peer.name, why);
        else
            log_error("refused join from '%s': %s", c->peer.name, why);
        peer_send_error(&c->peer, 0, "denied", why);
        c->logged = true;
        peer_close(&c->peer, why);
        return;
    }
    n = &l->nodes[m->node_rank];
    c->role = ROLE_AGENT;
    c->node = m->node_rank;
    leader_pending_remove(l, c);
    n->conn = c;
    l->agents_open++;
    n->joined = true;
    n->nprocs = m->nprocs;
    snprintf(n->hostname, sizeof(n->hostname), "%s", m->hostname);
    snprintf(n->addr, sizeof(n->addr), "%s", m->addr);
    n->mem_port = m->mem_port > 0 && m->mem_port < 65536 ? m->mem_port : 0;
    snprintf(n->preflight, sizeof(n->preflight), "%s", m->preflight ? m->preflight : "");
    snprintf(n->preflight_skipped, sizeof(n->preflight_skipped), "%s",
             m->preflight_skipped ? m->preflight_skipped : "");
    n->link_mbit = c->probe_mbit;
    n->link_ms = c->probe_ms;
    if (!n->preflight[0])
        fenced_before(l, n);
    if (n->link_mbit > 0)
        log_debug("node %d ('%s'): link %.0f Mbit/s (%.1f ms)", m->node_rank, n->hostname,
                  n->link_mbit, n->link_ms);
    /* A failed pre-flight is said once, where the leader decides on it (preflight_swaps). */
    if (n->preflight[0])
        log_debug("node %d ('%s') failed pre-flight: %s", m->node_rank, n->hostname, n->preflight);
    snprintf(c->peer.name, sizeof(c->peer.name), "node %d (%.64s)", c->node, n->hostname);
    log_debug("node %d ('%s', %s) joined with %d ranks", c->node, n->hostname, n->addr, n->nprocs);
    if (++l->joined == l->nphys)
        assign_all(l);
}

void leader_evict_pending(struct leader *l)
{
    struct admit_conn *q = malloc((size_t)(l->npending > 0 ? l->npending : 1) * sizeof(*q));
    struct conn *c = l->qhead;
    int n = 0, v;

    if (!q)
        return;
    for (; c && n < l->npending; c = c->qnext)
        q[n++] =
            (struct admit_conn){.proved = c->peer.ready || c->peer.closing, .heard = c->peer.heard};
    v = admit_victim(q, n);
    free(q);
    if (v < 0)
        return;
    for (c = l->qhead; v > 0; v--)
        c = c->qnext;
    /* Out of the count now: its close completes on the next turn of the loop. */
    leader_pending_remove(l, c);
    peer_close(&c->peer, "evicted: too many pending connections");
}
