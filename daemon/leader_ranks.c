/* The leader's side of what the ranks do through their agents: progress batches (reports,
 * waits, output and store signs, the ranks meeting), the store's keys and the barriers. The
 * rules that read these signs are hang.h's and stragglers.h's. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "jtext.h"
#include "leader_int.h"
#include "log.h"
#include "banned.h"

void leader_broadcast(struct leader *l, json_t *msg)
{
    /* Serialised once for every agent, not once an agent (a large job's barrier_done went
     * through jansson 12,500 times). */
    char *text = msg ? json_dumps(msg, JSON_COMPACT) : NULL;

    for (int i = 0; i < l->nphys; i++) {
        if (!l->nodes[i].conn || l->nodes[i].lost || l->nodes[i].fenced)
            continue;
        if (text)
            peer_send_text(&l->nodes[i].conn->peer, text, strlen(text));
        else
            peer_send(&l->nodes[i].conn->peer, json_incref(msg));
    }
    free(text);
    json_decref(msg);
}

/* --- requests ----------------------------------------------------------------------------- */

/* The store's replies, as text: no tree to build, dump and free for each of a large job's
 * 200,000 (proto.h). A text that could not be made (no memory) goes through jansson. */
static void send_ok(struct conn *c, json_int_t id)
{
    struct jtext t;

    jtext_init(&t);
    proto_ok_text(&t, id);
    if (t.ok)
        peer_send_text(&c->peer, t.p, t.len);
    else
        peer_send(&c->peer, proto_pack("{s:s, s:I}", "type", "ok", "id", id));
    jtext_release(&t);
}

static void send_value(struct conn *c, json_int_t id, const char *value)
{
    struct jtext t;

    jtext_init(&t);
    proto_kv_val_text(&t, id, value);
    if (t.ok)
        peer_send_text(&c->peer, t.p, t.len);
    else
        peer_send(&c->peer,
                  proto_pack("{s:s, s:I, s:s}", "type", "kv_val", "id", id, "value", value));
    jtext_release(&t);
}

void leader_on_store_ready(void *owner, int64_t id, const char *key, const char *value, void *arg)
{
    struct conn *c = owner;
    char msg[PROTO_KEY_MAX + 64];

    (void)arg;
    if (value) {
        send_value(c, (json_int_t)id, value);
    } else {
        snprintf(msg, sizeof(msg), "key '%s' did not appear in time", key);
        peer_send_error(&c->peer, id, "timeout", msg);
    }
}

/* A put the store cannot keep (err: full, or no memory), of which its rank was told that it
 * was kept (a quiet put): the job cannot go on as its ranks believe, so it fails, naming the
 * limit. */
static void store_refused(struct leader *l, struct conn *c, const char *key, int err)
{
    char cause[PROTO_KEY_MAX + 320];
    const struct node *n = &l->nodes[c->node];

    if (err == -ENOSPC)
        snprintf(cause, sizeof(cause),
                 "the job's store is full (%zu keys, %zu bytes; its limits are %d keys and %d "
                 "MiB): node %d ('%s') put '%s', which it could not keep",
                 store_keys(l->store), store_bytes(l->store), PROTO_STORE_KEYS_MAX,
                 PROTO_STORE_MAX >> 20, c->node, n->hostname, key);
    else
        snprintf(cause, sizeof(cause),
                 "the leader ran out of memory: node %d ('%s') put '%s', which it could not keep",
                 c->node, n->hostname, key);
    leader_fail(l, 125, "failed", false,
                leader_classed(leader_failure_new(cause, -1, c->node, n->hostname, 0, 0, ""),
                               FAILURE_USER_ERROR));
}

void leader_do_kv(struct leader *l, struct conn *c, struct msg *m)
{
    const char *v;
    int ret;

    switch (m->type) {
    case MSG_KV_PUT:
        l->met = true;
        l->t_all_wait = 0; /* a put may end a rank's wait for its key */
        ret = store_put(l->store, m->key, m->value);
        if (ret < 0) {
            peer_send_error(&c->peer, m->id, "too_large",
                            ret == -ENOSPC ? "store full: its key or byte limit is reached"
                                           : "out of memory");
            if (m->quiet)
                store_refused(l, c, m->key, ret);
        } else if (!m->quiet) {
            send_ok(c, m->id);
        }
        break;
    case MSG_KV_GET:
        l->met = true;
        v = store_get(l->store, m->key);
        if (v)
            send_value(c, m->id, v);
        else if (m->timeout_ms <= 0)
            peer_send_error(&c->peer, m->id, "not_found", "no such key");
        else if (store_wait(l->store, m->key,
                            now_ms(l) +
                                (m->timeout_ms < KV_WAIT_MAX_MS ? m->timeout_ms : KV_WAIT_MAX_MS),
                            c, m->id) < 0)
            peer_send_error(&c->peer, m->id, "too_large", "out of memory");
        break;
    default:
        store_del(l->store, m->key);
        send_ok(c, m->id);
        break;
    }
}

void leader_do_barrier(struct leader *l, struct conn *c, struct msg *m)
{
    json_t *n = json_object_get(l->barriers, m->key);
    json_int_t arrived = (n ? json_integer_value(n) : 0) + m->count;

    (void)c;
    l->met = true;
    if (arrived >= l->world_size) {
        json_object_del(l->barriers, m->key);
        l->t_all_wait = 0; /* the waits it ends are over before the agents can say so */
        /* Every rank arrived: each is alive, and a rank that waited long in it has an old
         * report but is back at work. Its silence counts from here (hang.h). */
        for (int r = 0; r < l->world_size && l->ranks; r++)
            l->ranks[r].released_ms = now_ms(l);
        leader_broadcast(l, proto_pack("{s:s, s:s}", "type", "barrier_done", "name", m->key));
    } else {
        json_object_set_new(l->barriers, m->key, json_integer(arrived));
    }
}

/* The node's ranks waiting on the others, the whole set (proto.h, progress "waiting"). */
static void set_waiting(struct leader *l, const struct node *n, json_t *waiting)
{
    size_t i;
    json_t *e;

    for (int r = n->rank_base; r < n->rank_base + n->nprocs && r < l->world_size; r++)
        l->ranks[r].waiting = false;
    json_array_foreach(waiting, i, e)
    {
        json_int_t r = json_integer_value(e);
        if (!json_is_integer(e) || r < n->rank_base || r >= n->rank_base + n->nprocs ||
            r >= l->world_size) {
            log_warn("ignoring a bad waiting rank from node %d", (int)(n - l->nodes));
            continue;
        }
        l->ranks[r].waiting = true;
    }
    bool all = l->world_size > 0;
    for (int r = 0; r < l->world_size; r++)
        if (l->ranks[r].phase == PHASE_RUNNING && !l->ranks[r].waiting)
            all = false;
    if (!all)
        l->t_all_wait = 0;
    else if (!l->t_all_wait)
        l->t_all_wait = now_ms(l);
}

/* The node's ranks whose output moved: their last line and when their last byte came. */
static void set_output(struct leader *l, const struct node *n, json_t *output)
{
    size_t i;
    json_t *e;

    json_array_foreach(output, i, e)
    {
        json_int_t r, age;
        const char *line;
        size_t len;
        if (json_unpack(e, "{s:I, s:s%, s:I}", "rank", &r, "line", &line, &len, "age_ms", &age) <
                0 ||
            r < n->rank_base || r >= n->rank_base + n->nprocs || r >= l->world_size || age < 0 ||
            age > INT32_MAX || len > PROTO_LINE_MAX) {
            log_warn("ignoring a bad output entry from node %d", (int)(n - l->nodes));
            continue;
        }
        if (!l->ranks[r].last_line && !(l->ranks[r].last_line = malloc(PROTO_LINE_MAX + 1))) {
            log_warn("no memory for rank %d's last line", (int)r);
            continue;
        }
        memcpy(l->ranks[r].last_line, line, len);
        l->ranks[r].last_line[len] = '\0';
        l->ranks[r].output_ms = now_ms(l) - age;
        if (l->ranks[r].output_ms <= 0)
            l->ranks[r].output_ms = 1;
    }
}

/* The node's ranks active in the store (proto.h, progress "active"): when each last showed
 * life there, for the hang rule (hang.h). */
static void set_active(struct leader *l, const struct node *n, json_t *active)
{
    size_t i;
    json_t *e;

    json_array_foreach(active, i, e)
    {
        json_int_t r, age;
        if (json_unpack(e, "{s:I, s:I}", "rank", &r, "age_ms", &age) < 0 || r < n->rank_base ||
            r >= n->rank_base + n->nprocs || r >= l->world_size || age < 0 || age > INT32_MAX) {
            log_warn("ignoring a bad active entry from node %d", (int)(n - l->nodes));
            continue;
        }
        int64_t t = now_ms(l) - age;
        if (t > l->ranks[r].active_ms)
            l->ranks[r].active_ms = t > 0 ? t : 1;
    }
}

/* progress "loaded": where each rank's memory checkpoint came from, for the status view. */
static void set_loaded(struct leader *l, const struct node *n, json_t *arr)
{
    size_t i;
    json_t *e;

    json_array_foreach(arr, i, e)
    {
        int r;
        const char *from;
        json_int_t step;
        if (json_unpack(e, "{s:i, s:s, s:I}", "rank", &r, "from", &from, "step", &step) < 0 ||
            r < n->rank_base || r >= n->rank_base + n->nprocs || step < 0 ||
            strlen(from) >= sizeof(l->ranks[r].loaded_from)) {
            log_warn("ignoring a bad 'loaded' entry from node %d", (int)(n - l->nodes));
            continue;
        }
        snprintf(l->ranks[r].loaded_from, sizeof(l->ranks[r].loaded_from), "%s", from);
        l->ranks[r].loaded_step = step;
    }
}

/* progress "regroup_ok": the ranks that can regroup in process (regroup.h). */
static void set_regroup_ok(struct leader *l, const struct node *n, json_t *arr)
{
    size_t i;
    json_t *e;

    json_array_foreach(arr, i, e)
    {
        json_int_t r = json_is_integer(e) ? json_integer_value(e) : -1;
        if (r < n->rank_base || r >= n->rank_base + n->nprocs) {
            log_warn("ignoring a bad 'regroup_ok' entry from node %d", (int)(n - l->nodes));
            continue;
        }
        l->ranks[r].regroup_ok = true;
    }
}

void leader_do_progress(struct leader *l, struct conn *c, struct msg *m)
{
    size_t i;
    json_t *e;

    if (m->waiting)
        set_waiting(l, &l->nodes[c->node], m->waiting);
    if (m->output)
        set_output(l, &l->nodes[c->node], m->output);
    if (m->active)
        set_active(l, &l->nodes[c->node], m->active);
    if (m->met)
        l->met = true;
    if (m->loaded)
        set_loaded(l, &l->nodes[c->node], m->loaded);
    if (m->regroup_ok)
        set_regroup_ok(l, &l->nodes[c->node], m->regroup_ok);
    json_array_foreach(m->array, i, e)
    {
        int r;
        struct proto_progress p;
        struct errmsg why;
        json_int_t age = 0, avg_steps = 0;
        double avg = 0;
        /* The record through proto.c's one reader; rank, age_ms and the time per step
         * (steptime.h) are the agent's. */
        if (json_unpack(e, "{s:i, s?I, s?F, s?I}", "rank", &r, "age_ms", &age, "step_avg", &avg,
                        "step_avg_steps", &avg_steps) < 0 ||
            age < 0 || age > INT32_MAX || avg_steps < 0 || !isfinite(avg) || avg < 0 ||
            r < l->nodes[c->node].rank_base ||
            r >= l->nodes[c->node].rank_base + l->nodes[c->node].nprocs) {
            log_warn("ignoring a bad progress entry from node %d", c->node);
            continue;
        }
        if (proto_progress_unpack(e, true, &p, &why) < 0) {
            log_warn("ignoring a bad progress entry from node %d: %s", c->node, why.text);
            continue;
        }
        struct rank *dst = &l->ranks[r];
        dst->prog = p;
        if (!dst->report_ms) {
            dst->first_ms = now_ms(l) - age;
            dst->first_step = p.step;
        }
        /* The report's own time, not this frame's: agents batch reports, and the hang rule
         * compares report times across nodes to the millisecond. */
        dst->report_ms = now_ms(l) - age;
        if (dst->report_ms <= 0)
            dst->report_ms = 1;
        if (avg_steps > 0) {
            dst->step_avg = avg;
            dst->step_avg_steps = avg_steps;
        }
        if (!l->t_first_step)
            l->t_first_step = dst->report_ms;
        if (r == 0)
            leader_history_add(l, p.step, p.loss);
    }
}
