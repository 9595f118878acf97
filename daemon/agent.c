/* The agent's lifecycle: its state machine (agent_int.h), the leader link, the ranks' link
 * (store requests and barriers forwarded to the leader, progress reports, the pre-timeout
 * signal), a hang's stack capture and the teardown. One libuv loop holds the leader link (TCP),
 * the rank listener (Unix socket), each rank's process and output pipes (agent_spawn.c,
 * agent_output.c) and two timers. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "agent_int.h"
#include "cgroup.h"
#include "hvd.h"
#include "log.h"
#include "memckpt.h"
#include "metrics.h"
#include "peer.h"
#include "ranklist.h"
#include "signame.h"
#include "sockdiag.h"
#include "sockdir.h"
#include "preflight.h"
#include "stacks.h"
#include "together.h"
#include "utf8.h"
#include "banned.h"

/* Deadline resolution: teardown escalation, hang detection, the leader's heartbeat. */
#define TICK_MS             20
/* Progress goes to the leader at most this often, batched for all local ranks. */
#define PROGRESS_FLUSH_MS   250
/* How often, while no socket on MASTER_PORT has shown, this node's TCP tables are read for
 * one (check_met), besides at each rank's exit. */
#define MET_CHECK_MS        1000
/* The most of a TCP table read: a node with 100,000 sockets has 15 MB of it. */
#define MET_TABLE_MAX       (32 << 20)
/* Ranks' last lines go to the leader at least this often (output_json); under --hang-watch
 * output a rank's line goes sooner where the leader's copy of it ages (output_watch_ms). */
#define OUTPUT_FLUSH_MS     1000
/* After a rank exits, how long its output pipes may stay open (held by a child of it)
 * before its exit is reported anyway. */
#define OUTPUT_DRAIN_MS     200
/* endpoint.json is looked for at every tick; a leader that refused the connection is dialled
 * again this much later. */
#define CONNECT_RETRY_MS    100
/* An agent that has sent its join leaves the verdict to the leader, whose join timeout names
 * the missing nodes (and which its heartbeats show alive); the agent's own join timeout is
 * then a backstop this much later, for a leader that answers but never decides. */
#define JOIN_BACKSTOP_MS    5000
/* How often the node's metrics file is rewritten (--metrics-dir): node_exporter's scrapes
 * come every 15 s or so, and a rewrite costs one small file. */
#define METRICS_INTERVAL_MS 5000
/* How long the job's cgroup may take to empty at the end (cgroup_remove). */
#define JOB_CGROUP_WAIT_MS  1000

/* How long a hang's stack capture may take on this node before the teardown goes on
 * without the stacks still missing (the leader waits a little longer: leader.c). */
#define STACK_CAPTURE_MS 4000

/* A connection on the ranks' socket: a rank once its hello proved its token. */
struct rconn {
    struct peer peer;
    struct rconn *prev, *next;
    struct arank *rank; /* after a valid hello */
    pid_t pid;          /* the connected process (SO_PEERCRED) */
};

/* A request forwarded to the leader, waiting for its reply. */
struct pending {
    int64_t id; /* ours, on the leader link */
    struct rconn *rc;
    int64_t rank_id;
    struct arank *waiter; /* a get with a timeout: the rank waits until the reply */
};

/* A rank blocked in a barrier. */
struct bwait {
    struct bwait *next;
    struct rconn *rc;
    int64_t id;
    int rank;
    char *name;
};

static int64_t now_ms(const struct agent *a)
{
    return (int64_t)uv_now(a->loop);
}

static void teardown(struct agent *a, const char *cause);
static void warm_settle(struct agent *a);
static void capture_check(struct agent *a);
static void stop_watching(struct agent *a);

static void on_handle_closed(uv_handle_t *h)
{
    struct agent *a = h->data;

    a->handles_open--;
    agent_maybe_free(a);
}

/* --- the leader link ---------------------------------------------------------------------- */

static int send_leader(struct agent *a, json_t *msg)
{
    if (!a->leader || !a->leader->ready || a->leader->closing) {
        json_decref(msg);
        return -ENOTCONN;
    }
    return peer_send(a->leader, msg);
}

static void flush_progress(struct agent *a);
static void check_met(struct agent *a, bool now);

/* A rank_exit message with tail as its last lines; NULL when it cannot be packed. */
static json_t *pack_exit(const struct arank *r, const char *tail)
{
    return proto_pack("{s:s, s:i, s:i, s:i, s:b, s:b, s:s}", "type", "rank_exit", "rank", r->rank,
                      "code", r->code, "signal", r->sig, "oom", r->oom, "killed", r->killed, "tail",
                      tail);
}

/* Sends r's exit to the leader: its status, its last lines, what its error file and a hang's
 * capture hold. Nothing in them may keep the exit itself from being sent: the leader ends the
 * job and writes its record on it. */
static void report_exit(struct agent *a, struct arank *r)
{
    char tail[PROTO_TAIL_MAX];
    json_t *msg, *err = NULL;

    if (r->reported)
        return;
    r->reported = true;
    /* The last progress and output first: the leader's view and summary.json end on the final
     * step and line; and whether the ranks met, asked at the node's last rank's exit (what
     * the ranks' links leave in TIME_WAIT is still there then, for a minute), else at most
     * every MET_CHECK_MS: a node of 100,000 sockets costs the kernel milliseconds an ask. */
    bool last = true;
    for (int i = 0; i < a->nranks; i++)
        last = last && (&a->ranks[i] == r || a->ranks[i].reported);
    check_met(a, last);
    if (r->dirty || r->output_dirty || a->met_dirty) {
        a->flush_output = true;
        flush_progress(a);
    }
    arank_tail_join(r, tail, sizeof(tail));
    if ((r->code || r->sig) && !r->killed)
        err = agent_read_error_file(a, r);
    msg = pack_exit(r, tail);
    if (!msg) {
        /* The tail is made valid UTF-8 where it is kept (arank_tail_add), so this is memory or
         * a bug; either way the exit is the event and goes without the text it carried. */
        log_error("rank %d: its last lines cannot be packed into its exit message; sending the "
                  "exit without them",
                  r->rank);
        msg = pack_exit(r, "(the rank's last lines could not be sent: see its log)");
    }
    if (msg && r->stack && json_object_set_new(msg, "stack", json_string(r->stack)) < 0)
        log_warn("rank %d: its stack cannot be sent (not UTF-8, or no memory)", r->rank);
    if (msg && err)
        json_object_set_new(msg, "error", err);
    else
        json_decref(err);
    if (msg && send_leader(a, msg) == -ENOTCONN)
        log_debug("cannot report rank %d's exit to the leader: no connection", r->rank);
}

/* Counts a request of r that waits on the other ranks (delta +1) or its end (-1). */
static void rank_wait(struct agent *a, struct arank *r, int delta)
{
    bool before = r->waits > 0;

    r->waits += delta;
    if (r->waits < 0)
        r->waits = 0;
    if (before != (r->waits > 0))
        a->waits_dirty = true;
}

/* A sign of life of r through the store, for the leader's hang rule: a put, a delete, a get
 * answered with a value, its arrival at a barrier. A rank that reports once and then works
 * by the store alone (barriers, puts and gets between its steps) is alive while it does,
 * however old its report. The waits are not: a barrier's arrival counts at its moment, the
 * wait after it does not, and a get that ends empty-handed (a poll for a key nobody puts)
 * counts not at all, so that ranks that wait on each other still read as a deadlock. */
static void rank_active(struct agent *a, struct arank *r)
{
    r->active_ms = now_ms(a);
    r->active_dirty = true;
}

/* The ranks of this node now waiting on the others, for the leader's hang rule. */
static json_t *waiting_json(const struct agent *a)
{
    json_t *w = json_array();

    for (int i = 0; w && i < a->nranks; i++)
        if (a->ranks[i].waits > 0 && !a->ranks[i].exited)
            json_array_append_new(w, json_integer(a->ranks[i].rank));
    return w;
}

/* Under --hang-watch output, how old the leader's copy of a rank's last output may grow
 * while the rank has printed since: the rank's line then goes with the next progress flush,
 * not the next OUTPUT_FLUSH_MS. Half the timeout at most, so that the leader never takes a
 * rank for silent past the timeout for want of a line this agent still holds; the leader's
 * view of a silence is then late only by a progress flush (HANG_MARGIN_MS covers it, as for
 * reports). 0: no output watch. */
static int64_t output_watch_ms(const struct agent *a)
{
    int64_t half = a->spec->hang_timeout_ms / 2;

    if (a->spec->hang_watch != HANG_WATCH_OUTPUT || a->spec->hang_timeout_ms <= 0)
        return 0;
    return half < OUTPUT_FLUSH_MS ? (half > 0 ? half : 1) : OUTPUT_FLUSH_MS;
}

/* The ranks whose output moved since the last flush: their last line and its age (proto.h,
 * progress "output"); NULL when none moved. */
static json_t *output_json(struct agent *a, int64_t now, bool force)
{
    json_t *out = NULL;
    int64_t watch = output_watch_ms(a);
    bool due = force || now - a->last_output_flush_ms >= OUTPUT_FLUSH_MS;

    /* Lines are for people: every OUTPUT_FLUSH_MS is enough, where every progress flush
     * would send the leader a line per chatty rank 4 times a second. --hang-watch output
     * times silences: a rank whose line the leader has had for watch ms goes at once, so a
     * chatty rank still sends about one line a second, and one that speaks after a silence
     * is heard within a progress flush. */
    if (due)
        a->last_output_flush_ms = now;
    else if (!watch)
        return NULL;
    for (int i = 0; i < a->nranks; i++) {
        struct arank *r = &a->ranks[i];
        if (!r->output_dirty || (!due && now - r->output_sent_ms < watch))
            continue;
        r->output_dirty = false;
        r->output_sent_ms = r->output_ms;
        if (!out && !(out = json_array()))
            return NULL;
        json_array_append_new(out,
                              json_pack("{s:i, s:s, s:I}", "rank", r->rank, "line", r->last_line,
                                        "age_ms", (json_int_t)(now - r->output_ms)));
    }
    return out;
}

/* The ranks active in the store since the last flush: {rank, age_ms}, how long ago their
 * last sign of life there came (proto.h, progress "active"); NULL when none. */
static json_t *active_json(struct agent *a, int64_t now)
{
    json_t *act = NULL;

    for (int i = 0; i < a->nranks; i++) {
        struct arank *r = &a->ranks[i];
        if (!r->active_dirty)
            continue;
        r->active_dirty = false;
        if (!act && !(act = json_array()))
            return NULL;
        json_array_append_new(act, json_pack("{s:i, s:I}", "rank", r->rank, "age_ms",
                                             (json_int_t)(now - r->active_ms)));
    }
    return act;
}

/* The ranks that took a memory checkpoint since the last flush (progress "loaded"), or NULL. */
static json_t *loaded_json(struct agent *a)
{
    json_t *arr = NULL;

    for (int i = 0; i < a->nranks; i++) {
        struct arank *r = &a->ranks[i];
        if (!r->loaded_dirty)
            continue;
        r->loaded_dirty = false;
        if (!arr && !(arr = json_array()))
            return NULL;
        json_array_append_new(arr, json_pack("{s:i, s:s, s:I}", "rank", r->rank, "from",
                                             r->loaded_from, "step", (json_int_t)r->loaded_step));
    }
    return arr;
}

/* The ranks that said they can regroup since the last flush (progress "regroup_ok"), or
 * NULL. */
static json_t *regroup_ok_json(struct agent *a)
{
    json_t *arr = NULL;

    for (int i = 0; i < a->nranks; i++) {
        struct arank *r = &a->ranks[i];
        if (!r->regroup_dirty)
            continue;
        r->regroup_dirty = false;
        if (!arr && !(arr = json_array()))
            return NULL;
        json_array_append_new(arr, json_integer(r->rank));
    }
    return arr;
}

/* The whole text of a /proc table (whose size stat() says is 0), at most max bytes, into a new
 * buffer (*out, caller frees). Returns 0 or a negative errno. */
static int read_proc_table(const char *path, size_t max, char **out, size_t *len)
{
    size_t cap = 64 * 1024, got = 0;
    char *buf = malloc(cap), *nb;
    int fd = open(path, O_RDONLY | O_CLOEXEC), ret = 0;

    if (fd < 0 || !buf) {
        ret = fd < 0 ? -errno : -ENOMEM;
        goto out;
    }
    for (;;) {
        ssize_t n = read(fd, buf + got, cap - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            ret = n < 0 ? -errno : 0;
            break;
        }
        got += (size_t)n;
        if (got == cap) {
            if (cap >= max) {
                ret = -EFBIG;
                break;
            }
            cap *= 2;
            if (!(nb = realloc(buf, cap))) {
                ret = -ENOMEM;
                break;
            }
            buf = nb;
        }
    }
out:
    if (fd >= 0)
        close(fd);
    if (ret < 0) {
        free(buf);
        return ret;
    }
    *out = buf;
    *len = got;
    return 0;
}

/* Whether this node's TCP sockets (IPv4 and IPv6, this network namespace's: the ranks') show
 * one on MASTER_PORT: rank 0's store or a rank's link to it, so that the ranks met
 * (together.h). Asked of the kernel with the port as its filter (sockdiag.h); its tables are
 * read whole only where it cannot be asked. At most every MET_CHECK_MS unless now, never
 * again once seen. */
static void check_met(struct agent *a, bool now)
{
    static const char *const tables[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    int64_t t = now_ms(a);
    int seen;

    if (a->met || a->master_port <= 0 || (!now && t - a->met_check_ms < MET_CHECK_MS))
        return;
    a->met_check_ms = t;
    seen = sockdiag_port_seen(a->master_port);
    if (seen >= 0) {
        a->met = a->met_dirty = seen > 0;
        return;
    }
    for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]) && !a->met; i++) {
        char *text = NULL;
        size_t len = 0;
        if (read_proc_table(tables[i], MET_TABLE_MAX, &text, &len) == 0 &&
            together_tcp_uses_port(text, len, a->master_port))
            a->met = a->met_dirty = true;
        free(text);
    }
}

static void flush_progress(struct agent *a)
{
    json_t *arr = json_array(), *msg, *out, *act, *loaded, *rgok;
    int64_t t = now_ms(a);

    for (int i = 0; i < a->nranks; i++) {
        struct arank *r = &a->ranks[i];
        if (!r->dirty)
            continue;
        r->dirty = false;
        json_t *e =
            json_pack("{s:i, s:I}", "rank", r->rank, "age_ms", (json_int_t)(t - r->progress_ms));
        if (e && proto_progress_pack(e, &r->prog) < 0) {
            json_decref(e);
            e = NULL;
        }
        /* Its time per step, for the leader's stragglers rule: made here alone, from every
         * report (a batch carries only the last). */
        if (e && r->st.steps > 0)
            json_object_update_new(e, json_pack("{s:f, s:I}", "step_avg", r->st.avg,
                                                "step_avg_steps", (json_int_t)r->st.steps));
        json_array_append_new(arr, e);
    }
    a->last_flush_ms = t;
    out = output_json(a, t, a->flush_output);
    a->flush_output = false;
    act = active_json(a, t);
    loaded = loaded_json(a);
    rgok = regroup_ok_json(a);
    check_met(a, false);
    if (json_array_size(arr) == 0 && !a->waits_dirty && !out && !act && !loaded && !rgok &&
        !a->met_dirty) {
        json_decref(arr);
        return;
    }
    msg = proto_pack("{s:s, s:o}", "type", "progress", "ranks", arr);
    if (msg && a->waits_dirty) {
        a->waits_dirty = false;
        json_object_set_new(msg, "waiting", waiting_json(a));
    }
    if (msg && out)
        json_object_set_new(msg, "output", out);
    else
        json_decref(out);
    if (msg && act)
        json_object_set_new(msg, "active", act);
    else
        json_decref(act);
    if (msg && loaded)
        json_object_set_new(msg, "loaded", loaded);
    else
        json_decref(loaded);
    if (msg && rgok)
        json_object_set_new(msg, "regroup_ok", rgok);
    else
        json_decref(rgok);
    if (msg && a->met_dirty) {
        a->met_dirty = false;
        json_object_set_new(msg, "met", json_true());
    }
    send_leader(a, msg);
}

/* --- rank connections --------------------------------------------------------------------- */

static struct pending *pending_add(struct agent *a, struct rconn *rc, int64_t rank_id)
{
    if (a->npend == a->cappend) {
        size_t cap = a->cappend ? 2 * a->cappend : 16;
        struct pending *np = realloc(a->pend, cap * sizeof(*np));
        if (!np)
            return NULL;
        a->pend = np;
        a->cappend = cap;
    }
    a->pend[a->npend] = (struct pending){.id = ++a->next_id, .rc = rc, .rank_id = rank_id};
    return &a->pend[a->npend++];
}

/* A rank's put: forwarded as quiet, which the leader answers only when it refuses it, and
 * answered here at once. The link keeps its order, so the node's every later request (the
 * rank's get, its node's barrier) finds it kept; torch's TCPStore does not wait for its
 * server's word on a set either. A put the store cannot keep fails the job (leader_do_kv):
 * the rank was told it was kept. It saves the leader a reply of each put, and the store's
 * round at a job's start a wait for it. */
static void forward_put(struct agent *a, struct rconn *rc, struct msg *m)
{
    json_t *fwd = json_deep_copy(proto_msg_json(m));

    rank_active(a, rc->rank);
    if (!fwd || json_object_set_new(fwd, "id", json_integer(++a->next_id)) < 0 ||
        json_object_set_new(fwd, "quiet", json_true()) < 0) {
        json_decref(fwd);
        peer_send_error(&rc->peer, m->id, "too_large", "agent out of memory");
        return;
    }
    if (send_leader(a, fwd) < 0) {
        peer_send_error(&rc->peer, m->id, "aborted", "no connection to the leader");
        return;
    }
    peer_send(&rc->peer, proto_pack("{s:s, s:I}", "type", "ok", "id", m->id));
}

/* Forwards a store request with our own id; the reply goes back with the rank's id. */
static void forward_kv(struct agent *a, struct rconn *rc, struct msg *m)
{
    struct pending *p;
    json_t *fwd;

    if (m->type == MSG_KV_PUT) {
        forward_put(a, rc, m);
        return;
    }
    p = pending_add(a, rc, m->id);
    /* A get shows life by its value, when it comes (on_leader_message). */
    if (m->type != MSG_KV_GET)
        rank_active(a, rc->rank);
    if (!p) {
        peer_send_error(&rc->peer, m->id, "too_large", "agent out of memory");
        return;
    }
    fwd = json_deep_copy(proto_msg_json(m));
    json_object_set_new(fwd, "id", json_integer(p->id));
    if (send_leader(a, fwd) < 0) {
        a->npend--;
        peer_send_error(&rc->peer, m->id, "aborted", "no connection to the leader");
        return;
    }
    if (m->type == MSG_KV_GET && m->timeout_ms != 0 && rc->rank) {
        p->waiter = rc->rank;
        rank_wait(a, rc->rank, 1);
    }
}

static void barrier_arrive(struct agent *a, struct rconn *rc, struct msg *m)
{
    struct bwait *w;
    json_t *n;
    json_int_t count;

    /* A rank that gave up waiting and calls the same barrier again has arrived once: it
     * only gets the reply under its new request id. */
    for (w = a->bwaits; w; w = w->next) {
        if (w->rank == rc->rank->rank && !strcmp(w->name, m->key)) {
            w->rc = rc;
            w->id = m->id;
            return;
        }
    }
    w = calloc(1, sizeof(*w));
    if (!w || !(w->name = strdup(m->key))) {
        free(w);
        peer_send_error(&rc->peer, m->id, "too_large", "agent out of memory");
        return;
    }
    w->rc = rc;
    w->id = m->id;
    w->rank = rc->rank->rank;
    w->next = a->bwaits;
    a->bwaits = w;
    rank_wait(a, rc->rank, 1);
    /* Its arrival, not a call again after giving up: that one goes on with its wait. The
     * release is life too: the leader counts it (released_ms there). */
    rank_active(a, rc->rank);
    n = json_object_get(a->barrier_counts, m->key);
    count = (n ? json_integer_value(n) : 0) + 1;
    if (count < a->nranks) {
        json_object_set_new(a->barrier_counts, m->key, json_integer(count));
        return;
    }
    json_object_del(a->barrier_counts, m->key);
    send_leader(a, proto_pack("{s:s, s:I, s:s, s:i}", "type", "barrier", "id",
                              (json_int_t)++a->next_id, "name", m->key, "count", a->nranks));
}

static void barrier_release(struct agent *a, const char *name)
{
    struct bwait **pp = &a->bwaits;

    while (*pp) {
        struct bwait *w = *pp;
        if (strcmp(w->name, name)) {
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        if (w->rank >= a->rank_base && w->rank < a->rank_base + a->nranks)
            rank_wait(a, &a->ranks[w->rank - a->rank_base], -1);
        if (w->rc)
            peer_send(&w->rc->peer, proto_pack("{s:s, s:I}", "type", "ok", "id", w->id));
        free(w->name);
        free(w);
    }
}

/* A rank's regroup request, waiting for the leader's next generation. */
struct rgwait {
    struct rconn *rc; /* NULL once the rank hung up */
    json_int_t id;
    int rank;
    struct rgwait *next;
};

/* Answers the waiting regroup requests: with the new generation, or (gen < 0) an error. */
static void regroup_answer(struct agent *a, int gen, const char *why)
{
    while (a->rgwaits) {
        struct rgwait *w = a->rgwaits;
        a->rgwaits = w->next;
        if (w->rank >= a->rank_base && w->rank < a->rank_base + a->nranks)
            rank_wait(a, &a->ranks[w->rank - a->rank_base], -1);
        if (w->rc && gen >= 0)
            peer_send(&w->rc->peer, proto_pack("{s:s, s:I, s:i}", "type", "regroup", "id", w->id,
                                               "generation", gen));
        else if (w->rc)
            peer_send_error(&w->rc->peer, w->id, "aborted", why);
        free(w);
    }
}

/* A rank whose collectives failed in generation m->generation waits for a later one. */
static void rank_regroup(struct agent *a, struct rconn *rc, struct msg *m)
{
    struct rgwait *w;

    if (a->generation > m->generation) {
        peer_send(&rc->peer, proto_pack("{s:s, s:I, s:i}", "type", "regroup", "id", m->id,
                                        "generation", a->generation));
        return;
    }
    if (a->state != AG_RUNNING) {
        peer_send_error(&rc->peer, m->id, "aborted", "the node's ranks are being torn down");
        return;
    }
    if (!(w = calloc(1, sizeof(*w)))) {
        peer_send_error(&rc->peer, m->id, "too_large", "agent out of memory");
        return;
    }
    w->rc = rc;
    w->id = m->id;
    w->rank = rc->rank->rank;
    w->next = a->rgwaits;
    a->rgwaits = w;
    /* Waiting on the others, as in a barrier: the hang rule never blames it for that. */
    rank_wait(a, rc->rank, 1);
    log_info("rank %d lost its peers in generation %d: it waits for the next", w->rank,
             m->generation);
}

/* The leader's next generation without a restart: a spare took a lost node's place, this
 * node's ranks run on and regroup with its ranks. */
static void on_regroup(struct agent *a, struct msg *m)
{
    if (a->state != AG_RUNNING || m->generation <= a->generation) {
        log_error("unexpected 'regroup' from the leader (generation %d)", m->generation);
        return;
    }
    a->generation = m->generation;
    m->rank_base = a->rank_base;
    agent_mem_assign(a, m);
    log_info("node %d's ranks regroup in process as generation %d", a->node_rank, a->generation);
    regroup_answer(a, a->generation, NULL);
}

static void rank_hello(struct agent *a, struct rconn *rc, struct msg *m)
{
    int local = m->rank - a->rank_base;
    struct arank *r = local >= 0 && local < a->nranks ? &a->ranks[local] : NULL;

    if (!r || strlen(m->value) != strlen(r->token) ||
        CRYPTO_memcmp(m->value, r->token, strlen(r->token))) {
        log_error("refused rank connection claiming rank %d: wrong token", m->rank);
        peer_send_error(&rc->peer, 0, "denied", "wrong rank or token");
        peer_close(&rc->peer, "wrong token");
        return;
    }
    rc->rank = r;
    snprintf(rc->peer.name, sizeof(rc->peer.name), "rank %d", r->rank);
    peer_send(&rc->peer, proto_pack("{s:s, s:I}", "type", "ok", "id", (json_int_t)0));
}

static void on_rank_message(struct peer *p, struct msg *m)
{
    struct rconn *rc = (struct rconn *)p;
    struct agent *a = p->owner;
    struct arank *r = rc->rank;

    if (!r) {
        if (m->type == MSG_HELLO) {
            rank_hello(a, rc, m);
        } else {
            peer_send_error(p, m->id, "denied", "say hello first");
            peer_close(p, "request before hello");
        }
        return;
    }
    switch (m->type) {
    case MSG_KV_PUT:
    case MSG_KV_GET:
    case MSG_KV_DEL:
        forward_kv(a, rc, m);
        break;
    case MSG_BARRIER:
        barrier_arrive(a, rc, m);
        break;
    case MSG_MEM_SAVE:
        agent_mem_save(a, &rc->peer, rc->rank->rank, m);
        break;
    case MSG_MEM_LOAD:
        agent_mem_load(a, &rc->peer, rc->rank->rank, m);
        break;
    case MSG_REPORT:
        /* A rank that reports is not waiting, whatever a barrier it gave up on still counts
         * (its wait ends when that barrier is released, or never). */
        if (r->waits) {
            r->waits = 0;
            a->waits_dirty = true;
        }
        /* The total a rank gave once holds until it gives another. */
        if (m->progress.total_steps == 0)
            m->progress.total_steps = r->prog.total_steps;
        r->prog = m->progress;
        r->dirty = true;
        r->progress_ms = now_ms(a);
        steptime_add(&r->st, r->progress_ms, r->prog.step, r->prog.step_time);
        break;
    case MSG_PREEMPT:
        if (r->wants_preempt && r->preempt_fd >= 0)
            close(r->preempt_fd);
        r->wants_preempt = true;
        r->preempt_pid = rc->pid;
        /* The asker is alive now (it waits for this reply): pin it. */
        r->preempt_fd = (int)syscall(SYS_pidfd_open, rc->pid, 0);
        peer_send(p, proto_pack("{s:s, s:I}", "type", "ok", "id", m->id));
        break;
    case MSG_FINALIZE:
        peer_send(p, proto_pack("{s:s, s:I}", "type", "ok", "id", m->id));
        break;
    case MSG_REGROUP_OK:
        if (!r->regroup_ok)
            r->regroup_ok = r->regroup_dirty = true;
        peer_send(p, proto_pack("{s:s, s:I}", "type", "ok", "id", m->id));
        break;
    case MSG_REGROUP:
        if (m->id)
            rank_regroup(a, rc, m);
        else
            peer_send_error(p, m->id, "bad_request", "regroup: no id");
        break;
    default:
        log_error("refused '%s' from rank %d: not a rank request", proto_type_name(m->type),
                  r->rank);
        peer_send_error(p, m->id, "bad_request", "not a rank request");
        break;
    }
}

static void on_rank_bad_message(struct peer *p, const struct proto_error *err)
{
    struct rconn *rc = (struct rconn *)p;

    log_error("bad message from %s: %s", p->name, err->why.text);
    peer_send_error(p, err->id, "bad_request", err->why.text);
    /* The first frame must be a valid hello (proto.h): a connection that starts with
     * anything else is not a rank's. */
    if (!rc->rank)
        peer_close(p, "bad message before hello");
}

static void on_rank_closed(struct peer *p, const char *why)
{
    struct rconn *rc = (struct rconn *)p;
    struct agent *a = p->owner;

    (void)why;
    if (rc->prev)
        rc->prev->next = rc->next;
    else
        a->rconns = rc->next;
    if (rc->next)
        rc->next->prev = rc->prev;
    for (size_t i = 0; i < a->npend; i++)
        if (a->pend[i].rc == rc)
            a->pend[i].rc = NULL;
    for (struct bwait *w = a->bwaits; w; w = w->next)
        if (w->rc == rc)
            w->rc = NULL;
    for (struct rgwait *w = a->rgwaits; w; w = w->next)
        if (w->rc == rc)
            w->rc = NULL;
    agent_mem_forget(a, p);
    peer_release(p);
    free(rc);
    agent_maybe_free(a);
}

static const struct peer_ops rank_ops = {
    .on_message = on_rank_message,
    .on_bad_message = on_rank_bad_message,
    .on_closed = on_rank_closed,
};

static void on_rank_connection(uv_stream_t *server, int status)
{
    struct agent *a = server->data;
    struct rconn *rc;
    struct ucred cred;
    socklen_t len = sizeof(cred);
    uv_os_fd_t fd;

    if (status < 0)
        return;
    rc = calloc(1, sizeof(*rc));
    if (!rc || peer_init(&rc->peer, a->loop, PEER_UNIX, NULL, a->max_frame, &rank_ops, a) < 0) {
        free(rc);
        log_error("cannot accept a rank connection: out of memory");
        return;
    }
    rc->next = a->rconns;
    if (a->rconns)
        a->rconns->prev = rc;
    a->rconns = rc;
    if (peer_accept(&rc->peer, server) < 0) {
        peer_close(&rc->peer, "accept failed");
        return;
    }
    /* The socket's directory is 0700 already; the uid check also covers a socket path
     * handed to another user's process. */
    if (uv_fileno((uv_handle_t *)&rc->peer.h.pipe, &fd) < 0 ||
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || cred.uid != getuid()) {
        log_error("refused a rank connection from another user");
        peer_close(&rc->peer, "peer of another uid");
        return;
    }
    rc->pid = cred.pid;
}

static int listen_ranks(struct agent *a)
{
    const char *tmp = getenv("TMPDIR");
    int ret;

    tmp = tmp && *tmp ? tmp : "/tmp";
    /* Agents killed by SIGKILL leave their directory: the next one on the node removes it. */
    ret = sockdir_sweep(tmp);
    if (ret > 0)
        log_debug("removed %d socket directories of agents that are gone from '%s'", ret, tmp);
    ret = sockdir_create(tmp, a->sockdir, sizeof(a->sockdir));
    if (ret < 0) {
        log_error("cannot create a socket directory in '%s': %s", tmp, strerror(-ret));
        a->sockdir[0] = '\0';
        return ret;
    }
    snprintf(a->sockpath, sizeof(a->sockpath), "%.4000s/agent.sock", a->sockdir);
    uv_pipe_init(a->loop, &a->listener, 0);
    a->listener.data = a;
    a->listener_open = true;
    a->handles_open++;
    ret = uv_pipe_bind(&a->listener, a->sockpath);
    if (ret == 0)
        ret = uv_listen((uv_stream_t *)&a->listener, SOMAXCONN, on_rank_connection);
    if (ret < 0)
        log_error("cannot listen on '%s': %s", a->sockpath, uv_strerror(ret));
    return ret;
}

/* --- stack capture (a hang) -------------------------------------------------------------- */

/* A native stack tool run for one rank: its stdout goes to the rank's stack and log. */
struct stack_tool {
    uv_process_t proc;
    uv_pipe_t out;
    struct agent *agent;
    struct arank *rank; /* NULL once its rank's record was reset (a restart) */
    struct stack_tool *next;
    bool running;
    int open; /* handles not yet closed */
};

static void on_tool_closed(uv_handle_t *h)
{
    struct stack_tool *t = h->data;
    struct agent *a = t->agent;

    a->handles_open--;
    if (--t->open == 0) {
        struct stack_tool **pp = &a->tools;
        while (*pp != t)
            pp = &(*pp)->next;
        *pp = t->next;
        free(t);
    }
    agent_maybe_free(a);
}

/* Ends every stack tool still running: a tool stuck on its target (gdb reading a large
 * process's symbols, a ptrace of a process in D state) must not outlive the capture. libuv
 * reaps it; kill_orphans() leaves it alone. */
static void stop_tools(struct agent *a)
{
    for (struct stack_tool *t = a->tools; t; t = t->next)
        if (t->running)
            uv_process_kill(&t->proc, SIGKILL);
}

/* The capture is over once every rank exited (a Python rank after its dump) or its tool
 * finished: the teardown goes on at once rather than at the next tick, so that a restart's
 * assign finds the agent in teardown. */
static bool capture_done(const struct agent *a);

static void capture_check(struct agent *a)
{
    if (a->state == AG_CAPTURE && capture_done(a))
        teardown(a, a->capture_cause);
}

static void on_tool_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct stack_tool *t = s->data;

    if (nread > 0 && t->rank) {
        arank_stack_append(t->rank, buf->base, (size_t)nread);
        if (arank_log_append(t->rank, buf->base, (size_t)nread) < 0)
            log_debug("cannot write rank %d's log: %s", t->rank->rank, strerror(errno));
    } else if (nread < 0) {
        uv_close((uv_handle_t *)&t->out, on_tool_closed);
    }
}

static void on_tool_exit(uv_process_t *p, int64_t status, int sig)
{
    struct stack_tool *t = p->data;

    (void)status;
    (void)sig;
    t->running = false;
    if (t->rank)
        t->rank->cap = CAP_DONE;
    uv_close((uv_handle_t *)p, on_tool_closed);
    capture_check(t->agent);
}

/* Runs eu-stack or gdb on pid for r; the capture is done when it exits. */
static int run_stack_tool(struct agent *a, struct arank *r, pid_t pid)
{
    uv_process_options_t opt = {0};
    uv_stdio_container_t stdio[3];
    char buf[2 * PATH_MAX], *argv[12], head[128];
    const char *tool;
    struct stack_tool *t;
    int ret;

    if (stacks_tool_argv(pid, buf, sizeof(buf), argv, &tool) < 0)
        return -ENOENT;
    t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    t->agent = a;
    t->rank = r;
    uv_pipe_init(a->loop, &t->out, 0);
    t->out.data = t->proc.data = t;
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1].data.stream = (uv_stream_t *)&t->out;
    stdio[2].flags = UV_IGNORE;
    opt.file = argv[0];
    opt.args = argv;
    opt.stdio_count = 3;
    opt.stdio = stdio;
    opt.exit_cb = on_tool_exit;
    ret = uv_spawn(a->loop, &t->proc, &opt);
    t->open = 2;
    a->handles_open += 2;
    t->next = a->tools;
    a->tools = t;
    t->running = ret == 0;
    if (ret < 0) {
        uv_close((uv_handle_t *)&t->proc, on_tool_closed);
        uv_close((uv_handle_t *)&t->out, on_tool_closed);
        return ret;
    }
    snprintf(head, sizeof(head), "--- stack of rank %d (pid %ld), by %s ---\n", r->rank, (long)pid,
             tool);
    arank_stack_append(r, head, strlen(head));
    if (arank_log_append(r, head, strlen(head)) < 0)
        log_debug("cannot write rank %d's log: %s", r->rank, strerror(errno));
    r->cap = CAP_TOOL;
    uv_read_start((uv_stream_t *)&t->out, agent_on_out_alloc, on_tool_read);
    return 0;
}

/* Asks every live rank for its stack: SIGABRT to a Python rank with faulthandler (its
 * traceback comes on stderr and it dies; it counts as killed by us), a native tool for any
 * other. The teardown follows once every capture is done or STACK_CAPTURE_MS has passed. */
static void capture_stacks(struct agent *a, const char *cause)
{
    struct stack_target t;

    log_info("capturing the stacks of node %d's ranks: %s", a->node_rank, cause);
    a->state = AG_CAPTURE;
    a->capture_until = now_ms(a) + STACK_CAPTURE_MS;
    snprintf(a->capture_cause, sizeof(a->capture_cause), "%s", cause);
    for (int i = 0; i < a->nranks; i++) {
        struct arank *r = &a->ranks[i];
        r->cap = CAP_DONE;
        if (!r->spawned || r->exited || stacks_find_target(r->pid, &t) < 0)
            continue;
        if (a->spec->container_image && !t.python) {
            /* In a container the rank's Python is no descendant of its shim: found by the
             * mark it carries. */
            struct jobmark want = a->mark;
            want.rank = r->rank;
            if (stacks_find_marked(&want, &t) < 0)
                stacks_find_target(r->pid, &t);
        }
        if (t.python && r->faulthandler) {
            /* No core file: a large process would take minutes to dump one. */
            struct rlimit none = {0, 0};
            char note[160];
            int len = snprintf(note, sizeof(note),
                               "[gpurun] the job hangs: SIGABRT to rank %d (pid %ld) for its "
                               "Python stack, which follows as 'Fatal Python error: Aborted'",
                               r->rank, (long)t.pid);
            arank_emit_line(r, note, (size_t)len, false);
            if (len > (int)sizeof(note) - 2)
                len = (int)sizeof(note) - 2;
            note[len++] = '\n';
            if (arank_log_append(r, note, (size_t)len) < 0)
                log_debug("cannot write rank %d's log: %s", r->rank, strerror(errno));
            prlimit(t.pid, RLIMIT_CORE, &none, NULL);
            r->killed = true;
            r->cap = CAP_PYTHON;
            kill(t.pid, SIGCONT);
            kill(t.pid, SIGABRT);
        } else if (run_stack_tool(a, r, t.pid) < 0) {
            log_warn("no stack of rank %d: neither eu-stack nor gdb is installed", r->rank);
        }
    }
}

/* Whether the capture is over: every rank exited (a Python rank after its dump) or its tool
 * finished. */
static bool capture_done(const struct agent *a)
{
    for (int i = 0; i < a->nranks; i++) {
        const struct arank *r = &a->ranks[i];
        if (r->cap == CAP_TOOL || (r->cap == CAP_PYTHON && !r->exited))
            return false;
    }
    return true;
}

/* --- teardown ----------------------------------------------------------------------------- */

/* Kills what a rank left behind outside its group: the agent is a subreaper, so such
 * processes are our children now. */
static void kill_orphans(struct agent *a)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t self = getpid();

    (void)a;
    if (!d)
        return;
    while ((e = readdir(d))) {
        char path[64], buf[512], *p;
        long pid = strtol(e->d_name, &p, 10);
        int ppid = 0;
        FILE *f;

        if (*p || pid <= 0)
            continue;
        snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
        f = fopen(path, "re");
        if (!f)
            continue;
        if (fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')')))
            sscanf(p + 2, "%*c %d", &ppid);
        fclose(f);
        if (ppid != self)
            continue;
        bool ours = false;
        for (int i = 0; i < a->nranks; i++)
            ours |= a->ranks[i].spawned && !a->ranks[i].exited && a->ranks[i].pid == pid;
        for (struct stack_tool *t = a->tools; t; t = t->next)
            ours |= t->running && t->proc.pid == pid;
        for (struct container_rm *c = a->container_rms; c; c = c->next)
            ours |= c->proc.pid == pid;
        ours |= agent_warm_owns(a, (pid_t)pid);
        if (!ours) {
            log_info("killing process %ld left behind by a rank", pid);
            kill((pid_t)pid, SIGKILL);
            waitpid((pid_t)pid, NULL, 0);
        }
    }
    closedir(d);
}

/* Kills what still carries this daemon's job mark (jobmark.h): a process that left its
 * rank's process group and cgroup and is nobody's child of ours (setsid, then a root
 * cgroup.procs). At a restart and at the agent's end: a scan of /proc costs about 20 us a
 * process (2000 processes: 40 ms on a virtual machine), too much for every rank's exit. */
static void sweep_marks(struct agent *a)
{
    struct jobmark_sweep_stats st;
    int ret;

    if (!a->mark.daemon)
        return;
    ret = jobmark_sweep(&a->mark, JOBMARK_DAEMON, 0, &st);
    if (ret < 0)
        log_warn("cannot look for processes carrying the job mark: %s", strerror(-ret));
    else if (st.killed > 0)
        log_info("ended %d process%s carrying node %d's job mark, outside its ranks' process "
                 "groups and cgroups",
                 st.killed, st.killed == 1 ? "" : "es", a->node_rank);
}

static void teardown(struct agent *a, const char *cause)
{
    if (a->state == AG_TEARDOWN || a->state == AG_DONE)
        return;
    log_info("tearing down node %d's ranks: %s", a->node_rank, cause);
    a->state = AG_TEARDOWN;
    agent_warm_release(a);
    regroup_answer(a, -1, cause);
    stop_tools(a);
    a->teardown_ms = now_ms(a);
    for (int i = 0; i < a->nranks; i++) {
        struct arank *r = &a->ranks[i];
        if (!r->spawned || r->exited)
            continue;
        r->killed = true;
        agent_mark_ended(r, cause);
        /* SIGCONT first: a stopped rank would not act on SIGTERM until continued. */
        arank_signal(r, SIGCONT);
        arank_signal(r, a->spec->kill_grace_ms > 0 ? SIGTERM : SIGKILL);
    }
    agent_check_done(a);
}

/* The node's metrics file (metrics.h), rewritten every METRICS_INTERVAL_MS while the agent
 * lives. A folder it cannot write to is said once; the job goes on. */
static void write_metrics(struct agent *a)
{
    static const char *const state_names[] = {
        [AG_FINDING] = "joining", [AG_JOINING] = "joining", [AG_SPARE] = "spare",
        [AG_RUNNING] = "running", [AG_CAPTURE] = "capture", [AG_TEARDOWN] = "teardown",
        [AG_DONE] = "done",
    };
    int64_t now = now_ms(a);
    struct metrics_rank *mr = calloc((size_t)a->nranks + 1, sizeof(*mr));
    struct metrics_node n = {
        .job_id = a->spec->job_id,
        .hostname = a->hostname,
        .node = a->node_rank,
        .state = state_names[a->state],
        .restarts = a->generation,
        .leader_hb_age_ms = a->leader && a->leader->ready ? now - a->leader->last_rx_ms : -1,
        .ranks = mr,
        .nranks = a->ranks ? a->nranks : 0,
    };
    int ret;

    a->next_metrics_ms = now + METRICS_INTERVAL_MS;
    if (!mr)
        return;
    for (int i = 0; i < n.nranks; i++) {
        const struct arank *r = &a->ranks[i];
        mr[i] = (struct metrics_rank){
            .rank = r->rank,
            .step = r->prog.step,
            .loss = r->prog.loss,
            .tokens_per_s = r->prog.tokens_per_s,
            .report_age_ms = r->progress_ms ? now - r->progress_ms : -1,
            .step_seconds = r->st.steps > 0 ? r->st.avg : NAN,
            .output_age_ms = r->output_ms ? now - r->output_ms : -1,
            .running = r->spawned && !r->exited,
        };
    }
    ret = metrics_write(a->spec->metrics_dir, &n);
    free(mr);
    if (ret < 0 && !a->metrics_warned) {
        a->metrics_warned = true;
        log_warn("cannot write metrics into '%s': %s", a->spec->metrics_dir, strerror(-ret));
    }
}

/* The agent is finished with status: its metrics file goes, then the daemon hears of it. */
static void agent_end(struct agent *a, int status)
{
    int ret;

    a->state = AG_DONE;
    agent_warm_release(a);
    if (a->spec->metrics_dir &&
        (ret = metrics_remove(a->spec->metrics_dir, a->spec->job_id, a->node_rank)) < 0)
        log_warn("cannot remove the metrics file in '%s': %s", a->spec->metrics_dir,
                 strerror(-ret));
    a->done(a, status, a->arg);
}

static void finish(struct agent *a, int status)
{
    if (a->state == AG_DONE)
        return;
    a->state = AG_DONE;
    /* The warm shims' pids first (the pre-flight's thread may still be spawning them): they
     * are not orphans, and they end now. */
    warm_settle(a);
    kill_orphans(a);
    sweep_marks(a);
    if (a->cgroup[0] && cgroup_remove(a->cgroup, JOB_CGROUP_WAIT_MS) < 0)
        log_warn("cannot remove cgroup '%s': processes still in it", a->cgroup);
    agent_end(a, status);
}

/* Whether every rank's exit is known and its output drained; reports each as it becomes
 * so, and ends the agent when the job is over for this node. */
void agent_check_done(struct agent *a)
{
    int64_t t = now_ms(a);
    int all = 1;

    for (int i = 0; i < a->nranks; i++) {
        struct arank *r = &a->ranks[i];
        /* Torn down before its assign (an abort or finish while joining): no rank to wait for.
         * One whose spawn failed has exited, and its exit is reported. */
        if (!r->spawned && !r->exited && a->state == AG_TEARDOWN)
            continue;
        if (!r->exited) {
            all = 0;
            continue;
        }
        if (!r->reported && ((!r->out && !r->err) || t - r->exit_ms > OUTPUT_DRAIN_MS))
            report_exit(a, r);
        all &= r->reported;
    }
    if (!all || a->nranks == 0)
        return;
    if (a->finished) {
        finish(a, a->status);
    } else if (!a->leader) {
        /* Self-fencing: without a leader nobody else will end this node's job. */
        finish(a, a->failed_here ? a->status : 125);
    }
}

void agent_rank_exited(struct agent *a, struct arank *r)
{
    char cause[320];

    if ((r->code || r->sig) && !r->killed && a->state == AG_RUNNING) {
        /* Kill the neighbours at once, before the leader's abort comes back: that is what
         * keeps teardown within milliseconds. */
        if (r->sig)
            snprintf(cause, sizeof(cause), "rank %d was killed by signal %d", r->rank, r->sig);
        else
            snprintf(cause, sizeof(cause), "rank %d exited with status %d", r->rank, r->code);
        a->failed_here = true;
        a->status = r->sig ? 128 + r->sig : r->code;
        teardown(a, cause);
    }
    capture_check(a);
    agent_check_done(a);
}

/* --- leader link events ------------------------------------------------------------------- */

/* Forgets everything of the last generation but the log files: the ranks' records, the
 * barriers and the requests in flight (their ranks are gone). */
static void reset_generation(struct agent *a)
{
    for (struct stack_tool *t = a->tools; t; t = t->next)
        t->rank = NULL;
    for (int i = 0; i < a->nranks; i++) {
        struct arank *r = &a->ranks[i];
        int logfd = r->logfd, idxfd = r->idxfd;
        int64_t log_off = r->log_off;
        bool log_midline = r->log_midline;

        ostream_close(&r->out);
        ostream_close(&r->err);
        free(r->stack);
        if (r->wants_preempt && r->preempt_fd >= 0)
            close(r->preempt_fd);
        memset(r, 0, sizeof(*r));
        r->agent = a;
        r->local = i;
        r->logfd = logfd;
        r->idxfd = idxfd;
        r->log_off = log_off;
        r->log_midline = log_midline;
    }
    while (a->bwaits) {
        struct bwait *w = a->bwaits;
        a->bwaits = w->next;
        free(w->name);
        free(w);
    }
    json_object_clear(a->barrier_counts);
    a->npend = 0;
    a->waits_dirty = false;
    a->exited = 0;
    a->failed_here = false;
    a->status = 0;
}

/* What the ranks' environments take from the leader's assign. */
static void take_assignment(struct agent *a, const struct msg *m)
{
    a->generation = m->generation;
    a->world_size = m->world_size;
    a->rank_base = m->rank_base;
    a->job_node = a->nranks > 0 ? m->rank_base / a->nranks : 0;
    a->nnodes = m->nnodes;
    a->master_port = m->master_port;
    snprintf(a->master_addr, sizeof(a->master_addr), "%s", m->master_addr);
    a->hvd_port = m->hvd_port;
    snprintf(a->hvd_host, sizeof(a->hvd_host), "%s", m->hvd_host ? m->hvd_host : "");
    /* gloo binds the interface horovodrun names: here the one this node is reached at. */
    if (hvd_iface_of(a->advertise, a->hvd_iface, sizeof(a->hvd_iface)) < 0) {
        a->hvd_iface[0] = '\0';
        log_info("no interface holds '%s', this node's address: HOROVOD_GLOO_IFACE not set",
                 a->advertise);
    }
}

static void on_assign(struct agent *a, struct msg *m)
{
    bool all_reported = true, restart;

    for (int i = 0; i < a->nranks; i++)
        all_reported &= a->ranks[i].reported;
    restart = a->state == AG_TEARDOWN && all_reported && m->generation > a->generation;
    if (a->state != AG_JOINING && a->state != AG_SPARE && !restart) {
        log_error("unexpected 'assign' from the leader");
        return;
    }
    if (m->spare) {
        /* A hot spare: joined and watched like the others, running nothing until a node
         * fails; a restart without it leaves it spare. */
        if (a->state != AG_SPARE)
            log_info("node %d is a hot spare (generation %d)", a->node_rank, (int)m->generation);
        a->generation = m->generation;
        a->state = AG_SPARE;
        return;
    }
    if (a->state == AG_SPARE)
        log_info("node %d, a spare, takes the place of the job's node %d (generation %d)",
                 a->node_rank, a->nranks > 0 ? m->rank_base / a->nranks : 0, (int)m->generation);
    if (restart) {
        /* What the last generation left outside its groups and cgroups must not meet the
         * next one (a process holding a GPU, a port). */
        sweep_marks(a);
        reset_generation(a);
        agent_mark_restart(a, (int)m->generation);
    }
    take_assignment(a, m);
    agent_mem_assign(a, m);
    a->state = AG_RUNNING;
    if (!restart && listen_ranks(a) < 0) {
        send_leader(a, proto_pack("{s:s, s:s, s:i}", "type", "abort", "cause",
                                  "agent cannot listen for its ranks", "status", 125));
        a->status = 125;
        a->failed_here = true;
        a->state = AG_TEARDOWN;
    }
    warm_settle(a);
    for (int i = 0; i < a->nranks; i++) {
        struct arank *r = &a->ranks[i];
        r->rank = a->rank_base + i;
        r->muted = a->spec->output_ranks && !ranklist_has(a->spec->output_ranks, r->rank);
        if (a->state == AG_RUNNING) {
            agent_spawn_rank(a, r);
        } else {
            r->exited = true;
            r->code = 125;
            r->killed = true;
            a->exited++;
        }
    }
    log_info("node %d running ranks %d..%d of %d (generation %d)", a->node_rank, a->rank_base,
             a->rank_base + a->nranks - 1, a->world_size, a->generation);
    /* The ranks' metrics at once: a job shorter than a tick is seen too. */
    if (a->spec->metrics_dir)
        write_metrics(a);
    /* Failed spawns are exits too: report every one (the leader counts a node done only when
     * all its ranks are), and fail the job on the first. */
    for (int i = 0; i < a->nranks; i++) {
        struct arank *r = &a->ranks[i];
        if (r->exited && r->code && !r->killed) {
            bool first = a->state == AG_RUNNING;
            if (first) {
                a->failed_here = true;
                a->status = r->code;
            }
            report_exit(a, r);
            if (first)
                teardown(a, "a rank could not be started");
        }
    }
    agent_check_done(a);
}

/* The pre-timeout signal: to the ranks that asked for it ("preempt"), or to every rank when
 * the user chose the signal (--signal: job.json's preempt_all). */
static void deliver_preempt(struct agent *a, int sig)
{
    char sn[SIGNAME_LEN];
    int n = 0;

    for (int i = 0; i < a->nranks; i++) {
        struct arank *r = &a->ranks[i];
        if (!r->spawned || r->exited || !(r->wants_preempt || a->spec->preempt_all))
            continue;
        /* Only the process that asked: its children (a DataLoader's workers, started with
         * spawn and so without its handler) share its group and would die of it. The user's
         * own --signal goes to the whole group, as Slurm's does. */
        if (a->spec->preempt_all || r->preempt_pid <= 0)
            arank_signal(r, sig);
        else if (r->preempt_fd >= 0)
            syscall(SYS_pidfd_send_signal, r->preempt_fd, sig, NULL, 0);
        else
            kill(r->preempt_pid, sig); /* a kernel without pidfds (before 5.3) */
        n++;
    }
    /* Said once per node where it matters: a rank that did not ask runs on to the limit. */
    if (n < a->nranks)
        log_warn("node %d: pre-timeout signal %s to %d of %d ranks: the others did not ask for "
                 "it (gpurun.on_preempt, gr_on_preempt) and run on to the time limit",
                 a->node_rank, signame(sig, sn), n, a->nranks);
    else
        log_info("node %d: pre-timeout signal %s to all %d ranks", a->node_rank, signame(sig, sn),
                 n);
}

static void on_leader_message(struct peer *p, struct msg *m)
{
    struct agent *a = p->owner;

    switch (m->type) {
    case MSG_ASSIGN:
        on_assign(a, m);
        break;
    case MSG_REGROUP:
        on_regroup(a, m);
        break;
    case MSG_HB:
        break;
    case MSG_OK:
    case MSG_KV_VAL:
    case MSG_ERROR:
        for (size_t i = 0; i < a->npend; i++) {
            if (a->pend[i].id != m->id)
                continue;
            struct rconn *rc = a->pend[i].rc;
            int64_t rank_id = a->pend[i].rank_id;
            if (a->pend[i].waiter)
                rank_wait(a, a->pend[i].waiter, -1);
            a->pend[i] = a->pend[--a->npend];
            /* A value ends the get, however long it waited: the rank is back at work. */
            if (rc && rc->rank && m->type == MSG_KV_VAL)
                rank_active(a, rc->rank);
            if (rc) {
                json_t *back = json_deep_copy(proto_msg_json(m));
                json_object_set_new(back, "id", json_integer(rank_id));
                peer_send(&rc->peer, back);
            }
            return;
        }
        if (m->type == MSG_ERROR && m->id > 0 && m->id <= a->next_id) {
            /* One of ours that nothing waits on here: a quiet put, whose rank was told it
             * was kept, or a barrier, whose ranks wait in it. The job cannot go on as they
             * believe. */
            char cause[PROTO_KEY_MAX + 256];
            snprintf(cause, sizeof(cause),
                     "the leader refused a put or a barrier of node %d: %.64s: %.200s",
                     a->node_rank, m->key, m->value);
            log_error("%s", cause);
            send_leader(
                a, proto_pack("{s:s, s:s, s:i}", "type", "abort", "cause", cause, "status", 125));
        } else if (m->type == MSG_ERROR) {
            log_error("leader refused a request: %s: %s", m->key, m->value);
        }
        break;
    case MSG_BARRIER_DONE:
        barrier_release(a, m->key);
        break;
    case MSG_ABORT:
        if (a->state == AG_SPARE)
            break; /* nothing of the job runs here */
        if (m->stacks && a->state == AG_RUNNING)
            capture_stacks(a, m->value);
        else if (a->state != AG_CAPTURE)
            teardown(a, m->value);
        break;
    case MSG_SIGNAL:
        deliver_preempt(a, m->signal);
        break;
    case MSG_FINISH:
        a->finished = true;
        a->status = m->status;
        if (a->exited < a->nranks)
            teardown(a, "the job finished");
        agent_check_done(a);
        break;
    default:
        log_error("unexpected '%s' from the leader", proto_type_name(m->type));
        break;
    }
}

/* The link throughput test of the pre-flight checks: PROTO_PROBE_ROUNDS rounds of
 * PROTO_PROBE_FRAMES frames, an empty one to start each and then a pad each, which the leader
 * times as they arrive. */
static void send_probe(struct agent *a)
{
    char *pad = malloc(PROTO_PROBE_PAD);

    if (!pad) {
        log_warn("no memory for the link test: the leader will not time this node's link");
        return;
    }
    memset(pad, 'p', PROTO_PROBE_PAD);
    /* Room in the socket for the whole probe at once: the kernel then sends it as the link
     * takes it, with no turn of this loop per window (a socket starts with 16 KiB). */
    int room = PROTO_PROBE_ROUNDS * PROTO_PROBE_FRAMES * (PROTO_PROBE_PAD + 256);
    uv_send_buffer_size((uv_handle_t *)&a->leader->h.tcp, &room);
    for (int i = 0; i < PROTO_PROBE_ROUNDS * PROTO_PROBE_FRAMES && a->leader; i++)
        peer_send_tail(a->leader, proto_pack("{s:s, s:i}", "type", "probe", "seq", i),
                       i % PROTO_PROBE_FRAMES ? pad : NULL, PROTO_PROBE_PAD);
    free(pad);
}

/* Whether both ends of tcp are one address (a loopback one included: then on this host). */
static bool same_host(uv_tcp_t *tcp)
{
    struct sockaddr_storage me, them;
    int a = sizeof(me), b = sizeof(them);

    if (uv_tcp_getsockname(tcp, (struct sockaddr *)&me, &a) ||
        uv_tcp_getpeername(tcp, (struct sockaddr *)&them, &b) || me.ss_family != them.ss_family)
        return false;
    if (me.ss_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)&me, *y = (const void *)&them;
        return x->sin_addr.s_addr == y->sin_addr.s_addr || (ntohl(y->sin_addr.s_addr) >> 24) == 127;
    }
    if (me.ss_family == AF_INET6) {
        const struct sockaddr_in6 *x = (const void *)&me, *y = (const void *)&them;
        return !memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr)) ||
               IN6_IS_ADDR_LOOPBACK(&y->sin6_addr);
    }
    return false;
}

/* The join, once the link is ready and the pre-flight checks are done. */
static void send_join(struct agent *a)
{
    char pre[256];

    a->join_waits = false;
    snprintf(pre, sizeof(pre), "%s", a->preflight_why);
    if (!pre[0] && a->spec->preflight && a->spec->container_image)
        snprintf(pre, sizeof(pre), "%s", a->container_why);
    /* The leader says it, once, with what it decides (a spare takes the node's place, or
     * the job ends): here it is only a detail of this node's log. */
    if (pre[0])
        log_info("node %d failed pre-flight: %s", a->node_rank, pre);
    if (a->preflight_skipped[0])
        log_info("node %d pre-flight: skipped %s", a->node_rank, a->preflight_skipped);
    /* A link to the leader's own host (node 0's, every node's with --local) is no link. */
    if (a->spec->preflight && !same_host(&a->leader->h.tcp) &&
        preflight_link_timed(a->spec->nnodes + a->spec->spare_nodes, a->spec->preflight_only))
        send_probe(a);
    send_leader(a,
                proto_pack("{s:s, s:i, s:s, s:s, s:i, s:s, s:s, s:s, s:i}", "type", "join",
                           "node_rank", a->node_rank, "hostname", a->hostname, "addr", a->advertise,
                           "nprocs", a->nranks, "gpus", "", "preflight", pre, "preflight_skipped",
                           a->preflight_skipped, "mem_port", agent_mem_link(a)));
}

static void on_leader_ready(struct peer *p)
{
    struct agent *a = p->owner;
    struct sockaddr_storage ss;
    int len = sizeof(ss);

    if (!a->advertise[0] && uv_tcp_getsockname(&p->h.tcp, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET)
            uv_ip4_name((struct sockaddr_in *)&ss, a->advertise, sizeof(a->advertise));
        else
            uv_ip6_name((struct sockaddr_in6 *)&ss, a->advertise, sizeof(a->advertise));
    }
    a->state = AG_JOINING;
    a->join_ms = now_ms(a);
    stop_watching(a);
    if (a->preflight_done)
        send_join(a);
    else
        a->join_waits = true;
}

/* Ends the processes that carry the job mark (jobmark.h) of a daemon that is gone: ranks and
 * what they started, left running when their daemon and its shims were killed together (and
 * gpurun too, or a Slurm job's batch script). Every daemon's start does it, on any job's
 * behalf (such a process has no daemon left to end it), before its join: the GPUs it frees
 * are then free for the pre-flight's check and the job's ranks. */
static void sweep_stale(void)
{
    struct jobmark_sweep_stats st;
    int ret = jobmark_sweep(NULL, JOBMARK_STALE, 0, &st);

    if (ret < 0)
        log_warn("cannot look for processes left by daemons that are gone: %s", strerror(-ret));
    else if (st.killed > 0)
        log_info("ended %d process%s carrying the job mark of daemons that are gone", st.killed,
                 st.killed == 1 ? "" : "es");
}

/* On a thread of its own, while the agent finds the leader and proves the key: the sweep of
 * stale ranks (a /proc scan: milliseconds on a node of thousands of processes), then the
 * checks, before any rank starts, on every node, spares included (the leader decides); their
 * verdict goes to the loop (the join waits for it), then the warm shims start while the node
 * waits for its assign (agent_warm_spawn: each waits for its exec). The thread touches
 * nothing of the agent's but its own results, handed over by preflight_async. */
static void *preflight_thread(void *arg)
{
    struct agent *a = arg;

    sweep_stale();
    preflight_run(a->spec, a->job_dir, a->node_rank, a->preflight_why, sizeof(a->preflight_why),
                  a->preflight_skipped, sizeof(a->preflight_skipped));
    __atomic_store_n(&a->preflight_checked, true, __ATOMIC_RELEASE);
    uv_async_send(&a->preflight_async);
    agent_warm_spawn(a);
    __atomic_store_n(&a->warm_spawned, true, __ATOMIC_RELEASE);
    uv_async_send(&a->preflight_async);
    return NULL;
}

/* The warm shims once the thread has started them all: waits for it if need be (an assign
 * that came first: the wait is the spawns it would do itself), then watches them; ended at
 * once where the node's job already is. */
static void warm_settle(struct agent *a)
{
    if (a->warm_adopted)
        return;
    if (a->preflight_threaded)
        pthread_join(a->preflight_tid, NULL);
    a->preflight_threaded = false;
    a->warm_adopted = true;
    agent_warm_adopt(a);
    if (a->closing || a->state == AG_TEARDOWN || a->state == AG_DONE)
        agent_warm_release(a);
}

static void preflight_after(uv_async_t *h)
{
    struct agent *a = h->data;

    if (!a->preflight_done && __atomic_load_n(&a->preflight_checked, __ATOMIC_ACQUIRE)) {
        a->preflight_done = true;
        if (a->join_waits && !a->closing && a->leader && a->leader->ready && !a->leader->closing)
            send_join(a);
    }
    if (__atomic_load_n(&a->warm_spawned, __ATOMIC_ACQUIRE) && !uv_is_closing((uv_handle_t *)h)) {
        warm_settle(a);
        uv_close((uv_handle_t *)h, on_handle_closed);
    }
}

/* Starts the pre-flight: on its thread, or in place where none can be had (its end is then
 * handled on the loop's next turn, as a thread's would be). */
static void preflight_start(struct agent *a)
{
    agent_warm_prepare(a);
    a->preflight_async.data = a;
    if (uv_async_init(a->loop, &a->preflight_async, preflight_after) < 0) {
        /* No async, no thread: the checks in place, and no warm shims. */
        sweep_stale();
        preflight_run(a->spec, a->job_dir, a->node_rank, a->preflight_why, sizeof(a->preflight_why),
                      a->preflight_skipped, sizeof(a->preflight_skipped));
        a->preflight_done = a->warm_adopted = true;
        agent_warm_adopt(a);
        return;
    }
    a->handles_open++;
    if (pthread_create(&a->preflight_tid, NULL, preflight_thread, a) == 0)
        a->preflight_threaded = true;
    else
        preflight_thread(a);
}

static void on_leader_closed(struct peer *p, const char *reason)
{
    struct agent *a = p->owner;
    char cause[320], why[256];
    bool refused = strstr(reason, "connection refused") != NULL;

    /* reason may be the peer's own text, freed with it. */
    snprintf(why, sizeof(why), "%s", reason);
    a->leader = NULL;
    peer_release(p);
    free(p);
    if (a->closing) {
        agent_maybe_free(a);
        return;
    }
    if (a->state == AG_FINDING && refused) {
        /* The leader is not listening yet (an explicit --rendezvous): try again. */
        a->next_connect_ms = now_ms(a) + CONNECT_RETRY_MS;
        return;
    }
    if (a->finished || a->state == AG_DONE) {
        agent_check_done(a);
        return;
    }
    if (a->state == AG_FINDING || a->state == AG_JOINING) {
        log_error("node %d cannot join the leader: %s", a->node_rank, why);
        agent_end(a, 125);
        return;
    }
    snprintf(cause, sizeof(cause), "lost the leader: %s", why);
    log_error("node %d %s", a->node_rank, cause);
    teardown(a, cause);
    agent_check_done(a);
}

static void on_leader_bad_message(struct peer *p, const struct proto_error *err)
{
    log_error("bad message from the leader: %s", err->why.text);
    peer_close(p, err->why.text);
}

static const struct peer_ops leader_ops = {
    .on_ready = on_leader_ready,
    .on_message = on_leader_message,
    .on_bad_message = on_leader_bad_message,
    .on_closed = on_leader_closed,
};

static int parse_hostport(const char *s, struct sockaddr_storage *ss)
{
    char host[128];
    const char *colon = strrchr(s, ':');
    char *end;
    long port;

    if (!colon || colon == s || (size_t)(colon - s) >= sizeof(host))
        return -EINVAL;
    port = strtol(colon + 1, &end, 10);
    if (*end || port <= 0 || port > 65535)
        return -EINVAL;
    snprintf(host, sizeof(host), "%.*s", (int)(colon - s), s);
    if (host[0] == '[' && host[strlen(host) - 1] == ']') {
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = '\0';
    }
    if (uv_ip4_addr(host, (int)port, (struct sockaddr_in *)ss) == 0 ||
        uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)ss) == 0)
        return 0;
    return -EINVAL;
}

/* endpoint.json, written by the leader once it listens: {"host": ..., "port": ...}. */
static int read_endpoint(struct agent *a, char *out, size_t cap)
{
    char path[PATH_MAX];
    json_t *root;
    const char *host;
    int port;

    snprintf(path, sizeof(path), "%s/endpoint.json", a->job_dir);
    root = json_load_file(path, 0, NULL);
    if (!root)
        return -ENOENT;
    if (json_unpack(root, "{s:s, s:i}", "host", &host, "port", &port) < 0) {
        json_decref(root);
        return -EINVAL;
    }
    snprintf(out, cap, "%s:%d", host, port);
    json_decref(root);
    return 0;
}

static void try_connect(struct agent *a)
{
    /* Not while the container pre-flight's probe runs (begin): the leader admits a
     * connection only for a prompt join. */
    if (a->container_probe == CONTAINER_PROBE_RUNNING)
        return;
    struct sockaddr_storage ss;
    char hp[160];
    int ret;

    if (a->leader || a->closing)
        return;
    if (a->rendezvous[0])
        snprintf(hp, sizeof(hp), "%s", a->rendezvous);
    else if (read_endpoint(a, hp, sizeof(hp)) < 0)
        return;
    if (parse_hostport(hp, &ss) < 0) {
        log_error("cannot use leader address '%s': not HOST:PORT with a numeric host", hp);
        a->rendezvous[0] = '\0';
        return;
    }
    a->leader = calloc(1, sizeof(*a->leader));
    if (!a->leader)
        return;
    ret = peer_init(a->leader, a->loop, PEER_TCP_CLIENT, &a->key, a->max_frame, &leader_ops, a);
    if (ret < 0) {
        free(a->leader);
        a->leader = NULL;
        return;
    }
    /* The join in the hello's write; the leader's assign, its first frame, proves it. */
    a->leader->early = true;
    snprintf(a->leader->name, sizeof(a->leader->name), "leader %.80s", hp);
    ret = peer_connect(a->leader, (struct sockaddr *)&ss);
    if (ret < 0) {
        log_error("cannot connect to the leader at '%s': %s", hp, uv_strerror(ret));
        peer_close(a->leader, uv_strerror(ret));
    }
}

/* endpoint.json appearing in the job dir: dial at once instead of at the next poll. The
 * poll stays: file systems without change notification (NFS) still work, a tick later. */
static void on_job_dir_change(uv_fs_event_t *h, const char *name, int events, int status)
{
    struct agent *a = h->data;

    (void)events;
    if (status == 0 && name && !strcmp(name, "endpoint.json") && a->state == AG_FINDING &&
        !a->leader)
        try_connect(a);
}

static void stop_watching(struct agent *a)
{
    if (!a->watching)
        return;
    a->watching = false;
    uv_close((uv_handle_t *)&a->watch, on_handle_closed);
}

/* A tick that comes a period late or more found a loop that did not run meanwhile (a
 * callback blocked it; the process was stopped, starved of CPU, or paused with its machine):
 * what the leader sent then waits unread (this tick runs before the loop polls), so the
 * leader is not blamed for that time. A leader whose daemon is really stopped or cut off is
 * still lost after hb_timeout of this agent's own time. */
static void excuse_stall(struct agent *a, int64_t now)
{
    int64_t stall = stall_check(&a->stall, now);

    if (stall == 0)
        return;
    if (a->leader)
        peer_excuse(a->leader, stall, now);
    /* Half the heartbeat timeout: without the excuse it would have come close to losing the
     * leader, and the other nodes, awake meanwhile, may have lost this one. */
    if (stall >= a->spec->hb_timeout_ms / 2)
        log_warn("node %d's daemon stalled for %" PRId64
                 " ms (its loop did not run): its peers are not blamed for it",
                 a->node_rank, stall);
    else if (stall >= a->spec->hb_interval_ms)
        log_info("node %d's daemon stalled for %" PRId64 " ms", a->node_rank, stall);
}

static void on_tick(uv_timer_t *t)
{
    struct agent *a = t->data;
    int64_t now = now_ms(a);
    char cause[320];

    excuse_stall(a, now);
    if (a->state == AG_FINDING && !a->leader && now >= a->next_connect_ms)
        try_connect(a);
    if (a->spec->metrics_dir && a->state != AG_DONE && now >= a->next_metrics_ms)
        write_metrics(a);
    agent_flush_index(a);
    if ((a->state == AG_FINDING && now - a->t_start > a->spec->join_timeout_ms) ||
        (a->state == AG_JOINING &&
         now - a->join_ms > (int64_t)a->spec->join_timeout_ms + JOIN_BACKSTOP_MS)) {
        if (a->state == AG_FINDING)
            log_error("node %d: no leader answered within %d ms", a->node_rank,
                      a->spec->join_timeout_ms);
        else
            log_error("node %d: joined, but the leader started no job within %d ms of it",
                      a->node_rank, a->spec->join_timeout_ms + JOIN_BACKSTOP_MS);
        agent_end(a, 124);
        return;
    }
    if (a->leader && a->leader->ready && peer_silence_ms(a->leader, now) > a->spec->hb_timeout_ms) {
        snprintf(cause, sizeof(cause), "no heartbeat for %" PRId64 " ms",
                 peer_silence_ms(a->leader, now));
        peer_close(a->leader, cause);
    }
    if (a->state == AG_CAPTURE && (capture_done(a) || now >= a->capture_until))
        teardown(a, a->capture_cause);
    if (a->state == AG_TEARDOWN && now - a->teardown_ms >= a->spec->kill_grace_ms)
        for (int i = 0; i < a->nranks; i++)
            arank_signal(&a->ranks[i], SIGKILL);
    if ((a->state == AG_RUNNING || a->state == AG_CAPTURE || a->state == AG_TEARDOWN) &&
        now - a->last_flush_ms >= PROGRESS_FLUSH_MS)
        flush_progress(a);
    if (a->state == AG_RUNNING || a->state == AG_CAPTURE || a->state == AG_TEARDOWN)
        agent_output_tick(a);
    if (a->state == AG_TEARDOWN || a->state == AG_RUNNING || a->state == AG_CAPTURE)
        agent_check_done(a);
}

static void on_heartbeat(uv_timer_t *t)
{
    struct agent *a = t->data;

    if (a->leader && a->leader->ready && peer_hb_due(a->leader, a->spec->hb_interval_ms))
        send_leader(a, proto_pack("{s:s}", "type", "hb"));
    /* The shims' watch (shim.h): a full pipe (a shim that stopped reading) loses nothing. */
    for (int i = 0; i < a->nranks; i++)
        if (a->ranks[i].alive_fd >= 0 && write(a->ranks[i].alive_fd, "", 1) < 0)
            continue;
}

/* The agent's start once everything it needs is there: its timers and its watch of the job
 * dir run, and the leader is looked for. */
static void begin(struct agent *a)
{
    /* Orphans of our ranks come back to us, not to init: see kill_orphans(). */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    uv_timer_init(a->loop, &a->tick);
    uv_timer_init(a->loop, &a->hb);
    a->tick.data = a->hb.data = a;
    a->handles_open += 2;
    stall_init(&a->stall, TICK_MS, now_ms(a));
    uv_timer_start(&a->tick, on_tick, TICK_MS, TICK_MS);
    uv_timer_start(&a->hb, on_heartbeat, (uint64_t)a->spec->hb_interval_ms,
                   (uint64_t)a->spec->hb_interval_ms);
    preflight_start(a);
    if (!a->rendezvous[0] && a->job_dir && uv_fs_event_init(a->loop, &a->watch) == 0) {
        a->watch.data = a;
        a->handles_open++;
        a->watching = true;
        if (uv_fs_event_start(&a->watch, on_job_dir_change, a->job_dir, 0) < 0)
            stop_watching(a);
    }
    /* A job with an image: its checks first, in the background (a first podman run on a node
     * takes seconds); the leader is looked for once they are done, within the join timeout.
     * Their verdict goes with the join (on_leader_ready). */
    if (a->spec->preflight && a->spec->container_image &&
        !agent_container_preflight(a, try_connect))
        return;
    try_connect(a);
}

int agent_start(uv_loop_t *loop, const struct agent_config *cfg, struct agent **out)
{
    struct agent *a = calloc(1, sizeof(*a));
    struct errmsg why = {"out of memory"};
    int ret = -ENOMEM;

    if (!a)
        goto out;
    a->loop = loop;
    a->spec = cfg->spec;
    a->key = *cfg->key;
    a->job_dir = cfg->job_dir;
    a->requeues = cfg->requeues;
    a->node_rank = cfg->node_rank;
    a->max_frame = cfg->max_frame;
    a->done = cfg->done;
    a->arg = cfg->arg;
    a->t_start = now_ms(a);
    /* It goes on the wire in the join: a name that is not UTF-8 would keep the node out. */
    utf8_sanitize(a->hostname, sizeof(a->hostname), cfg->hostname, strlen(cfg->hostname));
    if (cfg->advertise)
        snprintf(a->advertise, sizeof(a->advertise), "%s", cfg->advertise);
    if (cfg->rendezvous)
        snprintf(a->rendezvous, sizeof(a->rendezvous), "%s", cfg->rendezvous);
    a->nranks = cfg->spec->nprocs;
    a->ranks = calloc((size_t)a->nranks, sizeof(*a->ranks));
    a->barrier_counts = json_object();
    if (!a->ranks || !a->barrier_counts)
        goto out;
    for (int i = 0; i < a->nranks; i++) {
        a->ranks[i].agent = a;
        a->ranks[i].local = i;
        a->ranks[i].logfd = a->ranks[i].idxfd = -1;
        a->ranks[i].alive_fd = -1;
        proto_progress_init(&a->ranks[i].prog);
    }
    agent_mem_open(a);
    ret = agent_spawn_init(a, &why);
    if (ret < 0)
        goto out;
    ret = agent_output_start(a);
    if (ret < 0) {
        errmsg_set(&why, ret, "cannot start the output writer: %s", uv_strerror(ret));
        goto out;
    }
    begin(a);
    *out = a;
    a = NULL;
    ret = 0;
out:
    if (a) {
        log_set_sink(NULL, NULL); /* it may have been ours */
        if (a->cgroup[0])
            cgroup_remove(a->cgroup, 0);
        free(a->spawn_argv);
        free(a->ranks);
        json_decref(a->barrier_counts);
        agent_mem_free(a);
        free(a);
    }
    if (ret < 0)
        log_error("node %d: cannot start the agent: %s", cfg->node_rank, why.text);
    return ret;
}

void agent_signal(struct agent *a, int sig)
{
    char cause[256], sn[SIGNAME_LEN];

    if (sig == SIGUSR1 || sig == SIGUSR2) {
        /* Inside a Slurm step, slurmstepd signals every process of the step itself
         * (`scancel --signal`): passing it on would deliver it twice. gpurun's own
         * pre-timeout signal comes through the leader instead ("signal"), so that it
         * reaches only the ranks that asked for it. */
        if (getenv("SLURM_STEP_ID"))
            return;
        if (sig == a->spec->preempt_signal) {
            deliver_preempt(a, sig);
            return;
        }
        for (int i = 0; i < a->nranks; i++)
            arank_signal(&a->ranks[i], sig);
        return;
    }
    /* The first terminating signal cancels the job; a burst of them (a user's repeated ^C,
     * a scheduler's repeated signals) must not become a burst of aborts. */
    if (a->cancelled)
        return;
    a->cancelled = true;
    snprintf(cause, sizeof(cause), "cancelled: node %d ('%.64s') received %s", a->node_rank,
             a->hostname, signame(sig, sn));
    if (!a->failed_here) {
        a->failed_here = true;
        a->status = 128 + sig;
    }
    send_leader(
        a, proto_pack("{s:s, s:s, s:i}", "type", "abort", "cause", cause, "status", 128 + sig));
    if (a->state == AG_FINDING || a->state == AG_JOINING) {
        agent_end(a, 128 + sig);
        return;
    }
    teardown(a, cause);
}

void agent_maybe_free(struct agent *a)
{
    if (!a->closing || a->handles_open > 0 || a->rconns || a->leader)
        return;
    for (int i = 0; i < a->nranks; i++) {
        arank_close_log(&a->ranks[i]);
        if (a->ranks[i].alive_fd >= 0)
            close(a->ranks[i].alive_fd);
        if (a->ranks[i].wants_preempt && a->ranks[i].preempt_fd >= 0)
            close(a->ranks[i].preempt_fd);
        free(a->ranks[i].stack);
    }
    while (a->bwaits) {
        struct bwait *w = a->bwaits;
        a->bwaits = w->next;
        free(w->name);
        free(w);
    }
    while (a->rgwaits) {
        struct rgwait *w = a->rgwaits;
        a->rgwaits = w->next;
        free(w);
    }
    if (a->sockpath[0])
        unlink(a->sockpath);
    if (a->sockdir[0])
        rmdir(a->sockdir);
    json_decref(a->barrier_counts);
    agent_mem_free(a);
    free(a->pend);
    free(a->spawn_argv);
    free(a->warm);
    free(a->ranks);
    log_set_sink(NULL, NULL); /* agent_output_close cleared it; an early end may not have */
    free(a);
}

void agent_close(struct agent *a)
{
    if (a->closing)
        return;
    a->closing = true;
    agent_warm_release(a);
    if (a->leader)
        peer_close(a->leader, "agent shutting down");
    for (struct rconn *rc = a->rconns; rc; rc = rc->next)
        peer_close(&rc->peer, "agent shutting down");
    for (int i = 0; i < a->nranks; i++) {
        ostream_close(&a->ranks[i].out);
        ostream_close(&a->ranks[i].err);
    }
    agent_output_close(a);
    agent_mem_close(a);
    stop_watching(a);
    if (a->listener_open)
        uv_close((uv_handle_t *)&a->listener, on_handle_closed);
    uv_close((uv_handle_t *)&a->tick, on_handle_closed);
    uv_close((uv_handle_t *)&a->hb, on_handle_closed);
    agent_maybe_free(a);
}
