/* The leader. Single-threaded on the daemon's loop: agents and status clients are peers on
 * one TCP listener; the first message after the handshake says which a peer is ("join" or
 * "status"). One timer ("tick") drives heartbeats, the join deadline, store timeouts and the
 * end-of-job grace. This file holds the connections, the messages' dispatch, the tick and
 * the leader's start and end; what each message or check does stands in leader_join.c
 * (admission), leader_ranks.c (the ranks' traffic), leader_watch.c (the tick's rules),
 * leader_life.c (failures, restarts, the end) and leader_view.c (what status shows). Rules
 * that judge are pure modules of their own (hang.h, stragglers.h, spares.h, together.h). */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <jansson.h>

#include "fsutil.h"
#include "leader_int.h"
#include "log.h"
#include "shim.h"
#include "signame.h"
#include "utf8.h"
#include "banned.h"

/* How many bytes of s (NULL: none) to keep for at most max, not splitting a character. */
static int utf8_cut(const char *s, int max)
{
    return s ? (int)utf8_prefix_len(s, (size_t)max) : 0;
}

/* "ValueError: bad input (train.py:42)" from a rank's recorded exception, in a static
 * buffer (the leader is single-threaded). */
static const char *error_line(json_t *err)
{
    static char line[400];
    const char *type = json_string_value(json_object_get(err, "type"));
    const char *msg = json_string_value(json_object_get(err, "message"));
    const char *file = json_string_value(json_object_get(err, "file"));
    json_int_t ln = json_integer_value(json_object_get(err, "line"));
    int n = snprintf(line, sizeof(line), "%.*s%s%.*s", utf8_cut(type ? type : "exception", 80),
                     type ? type : "exception", msg && *msg ? ": " : "", utf8_cut(msg, 200),
                     msg ? msg : "");

    if (file && n > 0 && (size_t)n < sizeof(line))
        snprintf(line + n, sizeof(line) - (size_t)n, " (%.*s:%lld)", utf8_cut(file, 80), file,
                 (long long)ln);
    return line;
}

static void do_rank_exit(struct leader *l, struct conn *c, struct msg *m)
{
    struct node *n = &l->nodes[c->node];
    struct rank *k;
    char cause[768], sn[SIGNAME_LEN];

    if (m->rank < n->rank_base || m->rank >= n->rank_base + n->nprocs) {
        log_warn("node %d reported the exit of rank %d, which is not its own", c->node, m->rank);
        return;
    }
    k = &l->ranks[m->rank];
    if (k->phase == PHASE_EXITED)
        return;
    k->phase = PHASE_EXITED;
    k->code = m->code;
    k->signal = m->signal;
    k->oom = m->oom;
    k->killed = m->killed;
    if (m->stack)
        k->stack = json_string(m->stack);
    if (m->error)
        k->error = json_incref(m->error);
    l->exited++;
    if (++n->exited == n->nprocs)
        n->done = true;
    if (m->signal == SIGTERM && !m->killed && leader_at_time_limit(l)) {
        /* Slurm's time limit signals every process of the step, the ranks with their daemon:
         * whichever tells the leader first, the job ended at its limit. */
        leader_fail(
            l, 124, "timeout", false,
            leader_failure_new(leader_timeout_cause(l), -1, c->node, n->hostname, 0, 0, ""));
    } else if ((m->code || m->signal) && !m->killed) {
        const char *fork;
        json_t *f;
        char what[420] = "";
        if (m->error)
            snprintf(what, sizeof(what), ": %s", error_line(m->error));
        if (m->signal)
            snprintf(cause, sizeof(cause),
                     "rank %d on node %d ('%s') was killed by signal %d (%s)%s%s", m->rank, c->node,
                     n->hostname, m->signal, signame(m->signal, sn),
                     m->oom ? ": out of memory" : "", what);
        else if (m->value && (fork = strstr(m->value, SPAWN_FORK_FAILED)))
            snprintf(cause, sizeof(cause), "rank %d on node %d ('%s') could not start: %.*s",
                     m->rank, c->node, n->hostname, (int)strcspn(fork, "\n"), fork);
        else
            snprintf(cause, sizeof(cause), "rank %d on node %d ('%s') exited with status %d%s",
                     m->rank, c->node, n->hostname, m->code, what);
        int cls = leader_exit_class(m);
        f = leader_classed(
            leader_failure_new(cause, m->rank, c->node, n->hostname, m->code, m->signal, m->value),
            cls);
        if (f && m->error)
            json_object_set(f, "error", m->error);
        leader_fail(l, m->signal ? 128 + m->signal : m->code, "failed", leader_restart_on(l, cls),
                    f);
    } else if (l->first_failure && m->killed) {
        /* The blamed rank of a hang, killed by the teardown: its last lines and its stack
         * complete the failure's record. */
        json_t *fr = json_object_get(l->first_failure, "rank");
        if (json_is_integer(fr) && json_integer_value(fr) == m->rank) {
            json_object_set_new(l->first_failure, "tail", json_string(m->value));
            if (k->stack)
                json_object_set(l->first_failure, "stack", k->stack);
        }
    }
    leader_check_end(l);
}

/* An agent's abort: a failure of its own (a signal to its daemon: 128+S), a cancel, or the
 * time limit's SIGTERM. */
static void do_abort(struct leader *l, struct conn *c, struct msg *m)
{
    /* The agent's cause is its own text (bounded by the frame): keep it as it is. */
    bool cancel =
        m->status == 128 + SIGTERM || m->status == 128 + SIGINT || m->status == 128 + SIGHUP;
    /* A cancel or the time limit ends the job, a restart waiting for its backoff
     * included. */
    if (cancel)
        leader_abandon_restart(l);
    if (m->status == 128 + SIGTERM && leader_at_time_limit(l)) {
        leader_fail(l, 124, "timeout", false,
                    leader_failure_new(leader_timeout_cause(l), -1, c->node,
                                       l->nodes[c->node].hostname, 0, 0, ""));
        return;
    }
    if (cancel)
        leader_fail(
            l, m->status, "cancelled", false,
            leader_failure_new(m->value, -1, c->node, l->nodes[c->node].hostname, 0, 0, ""));
    else
        leader_fail(l, m->status ? m->status : 1, "failed",
                    m->status == 124 ? leader_restart_on(l, FAILURE_HANG) : false,
                    leader_classed(leader_failure_new(m->value, -1, c->node,
                                                      l->nodes[c->node].hostname, 0, 0, ""),
                                   m->status == 124 ? FAILURE_HANG : FAILURE_NODE));
    leader_check_end(l);
}

static void on_message(struct peer *p, struct msg *m)
{
    struct conn *c = (struct conn *)p;
    struct leader *l = p->owner;

    if (c->role == ROLE_NEW && m->type == MSG_JOIN) {
        leader_do_join(l, c, m);
        return;
    }
    if (c->role == ROLE_NEW && m->type == MSG_PROBE) {
        leader_do_probe(c, m);
        return;
    }
    if (c->role == ROLE_NEW && m->type == MSG_STATUS) {
        if (l->nclients >= CLIENTS_MAX) {
            peer_send_error(p, m->id, "denied", "too many status clients");
            peer_close(p, "too many status clients");
            return;
        }
        c->role = ROLE_CLIENT;
        leader_pending_remove(l, c);
        l->nclients++;
    }
    if (c->role == ROLE_CLIENT && m->type == MSG_STATUS) {
        peer_send(p, proto_pack("{s:s, s:I, s:o}", "type", "status_reply", "id", m->id, "job",
                                leader_job_view(l, l->state == JOB_FINISHED, false)));
        return;
    }
    if (c->role != ROLE_AGENT) {
        log_error("refused '%s' from '%s': not an agent of this job", proto_type_name(m->type),
                  p->name);
        peer_send_error(p, m->id, "denied", "join first");
        c->logged = true;
        peer_close(p, "message before join");
        return;
    }
    switch (m->type) {
    case MSG_HB:
        break;
    case MSG_KV_PUT:
    case MSG_KV_GET:
    case MSG_KV_DEL:
        leader_do_kv(l, c, m);
        break;
    case MSG_BARRIER:
        leader_do_barrier(l, c, m);
        break;
    case MSG_PROGRESS:
        leader_do_progress(l, c, m);
        break;
    case MSG_RANK_EXIT:
        do_rank_exit(l, c, m);
        break;
    case MSG_ABORT:
        do_abort(l, c, m);
        break;
    default:
        log_error("refused '%s' from %s: not a message for the leader", proto_type_name(m->type),
                  p->name);
        peer_send_error(p, m->id, "bad_request", "not a message for the leader");
        break;
    }
}

static void on_bad_message(struct peer *p, const struct proto_error *err)
{
    log_error("bad message from '%s': %s", p->name, err->why.text);
    peer_send_error(p, err->id, "bad_request", err->why.text);
}

/* --- connections -------------------------------------------------------------------------- */

/* Node k lost (why) while the first failure's teardown runs: its record names k too (the
 * cause says "node K ('HOST') lost too: WHY", "also_lost" lists the nodes), and a restart the
 * failure allowed (was_restartable) still comes only where spares can take every place. */
static void lost_too(struct leader *l, int k, const char *why, bool was_restartable)
{
    json_t *f = l->first_failure, *also = json_object_get(f, "also_lost");
    const char *cause = json_string_value(json_object_get(f, "cause"));
    char *text = NULL;

    if (asprintf(&text, "%s; node %d ('%s') lost too: %s", cause ? cause : "?", k,
                 l->nodes[k].hostname, why) >= 0)
        json_object_set_new(f, "cause", json_string(text));
    free(text);
    if (!also) {
        also = json_array();
        json_object_set_new(f, "also_lost", also);
    }
    json_array_append_new(also, json_integer(k));
    l->restartable =
        was_restartable && leader_restart_on(l, FAILURE_NODE) && leader_spares_cover(l, f);
    if (was_restartable && l->restartable)
        log_warn("node %d ('%s') lost too: %s; a spare takes its place as well at the restart", k,
                 l->nodes[k].hostname, why);
    else if (was_restartable)
        log_warn("node %d ('%s') lost too: %s; no restart: %s", k, l->nodes[k].hostname, why,
                 leader_restart_on(l, FAILURE_NODE) ? "too few spares for every node lost"
                                                    : "--restart-on does not name node failures");
    else
        log_info("after the first failure: node %d ('%s') lost: %s", k, l->nodes[k].hostname, why);
}

static void on_closed(struct peer *p, const char *why)
{
    struct conn *c = (struct conn *)p;
    struct leader *l = p->owner;

    if (c->prev)
        c->prev->next = c->next;
    else
        l->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    store_drop_owner(l->store, c);
    if (c->role == ROLE_NEW) {
        leader_pending_remove(l, c);
        /* One line each for a peer that proved the key; a flood of those that did not is
         * counted and summarised (leader_log_refusals). */
        if (!c->logged && !l->closing &&
            (p->ready || refusals_note(&l->refusals, now_ms(l), p->addr, why)))
            log_warn("connection from '%s' closed before it was admitted: %s", p->name, why);
    } else if (c->role == ROLE_CLIENT) {
        l->nclients--;
        /* A client hanging up is the normal end; anything else (a replayed or forged frame,
         * a bad length) is a refusal worth a line. */
        if (!c->logged && !l->closing && strcmp(why, "connection closed"))
            log_warn("status client '%s' closed: %s", p->name, why);
    } else {
        struct node *n = &l->nodes[c->node];
        n->conn = NULL;
        l->agents_open--;
        if (n->fenced) {
            log_info("fenced node %d ('%s') closed: %s", c->node, n->hostname, why);
        } else if (n->slot < 0 && l->t_joined && l->state != JOB_FINISHED) {
            /* A spare lost is one fewer to take a place: the job runs on. */
            n->lost = true;
            log_warn("spare node %d ('%s') lost: %s", c->node, n->hostname, why);
        } else if ((!n->done || l->restart_at) && l->state != JOB_FINISHED) {
            /* A node lost while a restart waits for its backoff (every node done) calls it
             * off: the new generation would wait for it for ever, unless a spare takes its
             * place. */
            char cause[320];
            bool was_restartable = l->restartable;
            leader_abandon_restart(l);
            n->lost = true;
            snprintf(cause, sizeof(cause), "node %d ('%s') lost: %s (seen by the leader, node 0)",
                     c->node, n->hostname, why);
            if (l->state == JOB_JOINING) {
                n->joined = false;
                l->joined--;
            }
            for (int r = n->rank_base; l->t_joined && r < n->rank_base + n->nprocs; r++)
                if (r < l->world_size && l->ranks[r].phase == PHASE_RUNNING)
                    l->ranks[r].phase = PHASE_LOST;
            /* A loss during the teardown of the first failure is part of its story: one
             * record names every node lost, and the restart still comes only where the
             * spares cover them all. */
            if (l->first_failure) {
                lost_too(l, c->node, why, was_restartable);
                leader_check_end(l);
                goto out;
            }
            /* Without a spare to take its place, not restartable whatever --restart-on says:
             * the node's daemon is gone, and a new generation would wait for it for ever. */
            json_t *f = leader_classed(
                leader_failure_new(cause, -1, c->node, n->hostname, 0, 0, ""), FAILURE_NODE);
            if (f && l->t_joined && l->state == JOB_RUNNING && leader_regroup(l, c->node, f))
                goto out;
            leader_fail(l, 125, "failed",
                        l->t_joined && leader_restart_on(l, FAILURE_NODE) && f &&
                            leader_spares_cover(l, f),
                        f);
            leader_check_end(l);
        }
    }
out:
    peer_release(p);
    free(c);
    if (!l->closing)
        leader_check_linger(l);
    leader_maybe_free(l);
}

static const struct peer_ops leader_peer_ops = {
    .on_message = on_message,
    .on_bad_message = on_bad_message,
    .on_closed = on_closed,
};

static void on_connection(uv_stream_t *server, int status)
{
    struct leader *l = server->data;
    struct conn *c;
    int ret;

    if (status < 0) {
        log_error("cannot accept: %s", uv_strerror(status));
        return;
    }
    if (l->accepts >= ACCEPTS_PER_TURN) {
        /* Left in the backlog: libuv stops watching the listener until accept_next() takes
         * it on the next turn. */
        l->accept_deferred = true;
        return;
    }
    l->accepts++;
    c = calloc(1, sizeof(*c));
    if (!c || peer_init(&c->peer, l->loop, PEER_TCP_SERVER, &l->key, l->max_frame, &leader_peer_ops,
                        l) < 0) {
        /* Accept into a throwaway handle would need memory too: leave it in the backlog,
         * and try again after the next poll (libuv stops watching until it is taken). */
        free(c);
        log_error("cannot accept: out of memory");
        l->accept_deferred = true;
        return;
    }
    c->peer.seen = &l->seen;
    c->next = l->conns;
    if (l->conns)
        l->conns->prev = c;
    l->conns = c;
    leader_pending_add(l, c);
    ret = peer_accept(&c->peer, server);
    if (ret < 0) {
        log_error("cannot accept: %s", uv_strerror(ret));
        c->logged = true;
        peer_close(&c->peer, uv_strerror(ret));
        return;
    }
    if (l->state == JOB_FINISHED)
        peer_close(&c->peer, "refused: job finished");
    else if (l->npending > admit_pending_max(l->nphys, l->joined, l->strangers_max))
        leader_evict_pending(l);
}

/* After each poll: a new turn's budget of accepts, and the connection left waiting. */
static void accept_next(uv_check_t *h)
{
    struct leader *l = h->data;

    l->accepts = 0;
    if (l->accept_deferred && !l->closing) {
        l->accept_deferred = false;
        on_connection((uv_stream_t *)&l->server, 0);
    }
}

/* A tick that comes a period late or more found a loop that did not run meanwhile: a
 * callback blocked it, or the process was stopped, starved of CPU or paused with its machine.
 * Nothing was read then, and what the agents sent waits unread in the sockets (this tick runs
 * before the loop polls them), so no agent is blamed for that time: the silence a heartbeat
 * timeout judges is the leader's own time awake. On node 0 the agent shares this loop, and
 * without this a stall of the daemon made each blame the other for it ("node 0 lost: no
 * heartbeat for 12048 ms" after a SIGSTOP of 12 s, both sides alive). An agent that is
 * really gone is still lost, after hb_timeout of the leader's own time. */
static void excuse_stall(struct leader *l, int64_t now)
{
    int64_t stall = stall_check(&l->stall, now);

    if (stall == 0)
        return;
    for (struct conn *c = l->conns; c; c = c->next)
        peer_excuse(&c->peer, stall, now);
    /* On node 0 the agent shares the loop and warns of the same stall. */
    if (stall >= l->spec->hb_interval_ms)
        log_info("leader's loop stalled for %" PRId64 " ms: no agent is blamed for it", stall);
}

/* The join's deadline and the time limit. The time limit is the leader's to keep too:
 * gpurun --local's deadline dies with gpurun. On Slurm, Slurm ends the job at its limit and
 * records TIMEOUT (what a requeue decides on): the leader's deadline is then only a
 * backstop, LIMIT_BACKSTOP_MS later. */
static void check_deadlines(struct leader *l, int64_t now)
{
    char cause[512];

    if (l->state == JOB_JOINING && now - l->t_start > l->spec->join_timeout_ms) {
        int n = snprintf(cause, sizeof(cause),
                         "join timed out after %d ms; missing nodes:", l->spec->join_timeout_ms);
        int first = -1;
        for (int i = 0; i < l->nphys && n < (int)sizeof(cause) - 16; i++) {
            if (!l->nodes[i].joined) {
                n += snprintf(cause + n, sizeof(cause) - (size_t)n, " %d", i);
                first = first < 0 ? i : first;
            }
        }
        /* The nodes that never joined failed the job: the first is the record's node. */
        leader_fail(
            l, 124, "failed", false,
            leader_classed(leader_failure_new(cause, -1, first, "", 0, 0, ""), FAILURE_NODE));
        leader_finish(l);
    }
    if ((l->state == JOB_JOINING || l->state == JOB_RUNNING) && l->spec->time_limit_s > 0 &&
        now - l->t_limit0 >=
            (int64_t)l->spec->time_limit_s * 1000 + (l->spec->loopback ? 0 : LIMIT_BACKSTOP_MS)) {
        leader_fail(l, 124, "timeout", false,
                    leader_failure_new(leader_timeout_cause(l), -1, -1, "", 0, 0, ""));
        leader_check_end(l);
    }
}

static void on_tick(uv_timer_t *t)
{
    struct leader *l = t->data;
    int64_t now = now_ms(l);
    char cause[512];

    excuse_stall(l, now);
    store_expire(l->store, now);
    leader_log_refusals(l, now, false);
    if (l->restart_at)
        leader_check_end(l);
    leader_check_all_lost(l, now);
    for (struct conn *c = l->conns; c; c = c->next) {
        if (c->role == ROLE_NEW && peer_age_ms(&c->peer, now) > HANDSHAKE_TIMEOUT_MS)
            peer_close(&c->peer, c->peer.ready ? "no request after the handshake in time"
                                               : "handshake timed out");
        else if (c->role == ROLE_CLIENT && peer_silence_ms(&c->peer, now) > CLIENT_IDLE_MS)
            peer_close(&c->peer, "status client idle");
        else if (c->role == ROLE_AGENT && peer_silence_ms(&c->peer, now) > l->spec->hb_timeout_ms) {
            snprintf(cause, sizeof(cause), "no heartbeat for %" PRId64 " ms",
                     peer_silence_ms(&c->peer, now));
            peer_close(&c->peer, cause);
        }
    }
    check_deadlines(l, now);
    leader_check_hang(l, now);
    leader_check_stragglers(l, now);
    leader_poll_preempt(l, now);
    if (l->state == JOB_ABORTING && !l->restart_at &&
        now - l->t_abort >
            l->spec->kill_grace_ms + ABORT_SLACK_MS + (l->abort_stacks ? STACK_CAPTURE_MS : 0)) {
        log_error("agents did not report their ranks gone in time; finishing");
        leader_finish(l);
    }
    leader_check_linger(l);
}

static void on_heartbeat(uv_timer_t *t)
{
    struct leader *l = t->data;

    for (int i = 0; i < l->nphys; i++)
        if (l->nodes[i].conn && peer_hb_due(&l->nodes[i].conn->peer, l->spec->hb_interval_ms))
            peer_send(&l->nodes[i].conn->peer, proto_pack("{s:s}", "type", "hb"));
}

/* --- lifecycle ---------------------------------------------------------------------------- */

static void on_handle_closed(uv_handle_t *h)
{
    struct leader *l = h->data;

    l->handles_open--;
    leader_maybe_free(l);
}

static int pick_master_port(const char *addr)
{
    uv_loop_t loop;
    uv_tcp_t tcp;
    struct sockaddr_storage ss;
    int len = sizeof(ss), port = -1;

    /* A port the kernel gives us and we release: the application (torch's TCPStore, say)
     * binds it right after. The same race every launcher accepts; it is short. */
    if (uv_loop_init(&loop) < 0)
        return -1;
    if (uv_tcp_init(&loop, &tcp) == 0) {
        if ((uv_ip4_addr(addr, 0, (struct sockaddr_in *)&ss) == 0 ||
             uv_ip6_addr(addr, 0, (struct sockaddr_in6 *)&ss) == 0) &&
            uv_tcp_bind(&tcp, (struct sockaddr *)&ss, 0) == 0 &&
            uv_tcp_getsockname(&tcp, (struct sockaddr *)&ss, &len) == 0)
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        uv_close((uv_handle_t *)&tcp, NULL);
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    return port;
}

static int write_endpoint(struct leader *l)
{
    char path[PATH_MAX], text[256];
    int n;

    if (!l->job_dir)
        return 0;
    snprintf(path, sizeof(path), "%s/endpoint.json", l->job_dir);
    n = snprintf(text, sizeof(text), "{\"host\": \"%s\", \"port\": %d, \"pid\": %ld}\n",
                 l->advertise, l->port, (long)getpid());
    return fs_publish(path, text, (size_t)n, 0600);
}

/* The leader's state from its config: its nodes (the job's, then the spares, each serving
 * its own slot), the store and the records; -ENOMEM. */
static int leader_init(struct leader *l, uv_loop_t *loop, const struct leader_config *cfg)
{
    struct rlimit rl;

    l->loop = loop;
    l->spec = cfg->spec;
    l->key = *cfg->key;
    l->job_dir = cfg->job_dir;
    l->max_frame = cfg->max_frame;
    l->done = cfg->done;
    l->arg = cfg->arg;
    l->t_start = (int64_t)uv_now(loop);
    l->t_limit0 = leader_limit_origin(l->t_start, &l->started_epoch_ms);
    l->outcome = "running";
    l->nphys = cfg->spec->nnodes + cfg->spec->spare_nodes;
    /* Each node's agent opens its link once: room for four times as many, and for a few
     * test clients (auth.h; a key holder looping on hellos grows it no further). */
    l->seen.max = 4 * (size_t)l->nphys + 64;
    l->strangers_max = admit_strangers_max(
        getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY ? -1 : (long)rl.rlim_cur,
        l->nphys, FDS_SLACK);
    refusals_init(&l->refusals, REFUSAL_WINDOW_MS);
    snprintf(l->advertise, sizeof(l->advertise), "%s", cfg->advertise_addr);
    l->nodes = calloc((size_t)l->nphys, sizeof(*l->nodes));
    l->slot_node = calloc((size_t)cfg->spec->nnodes, sizeof(*l->slot_node));
    l->swaps = json_array();
    for (int i = 0; l->nodes && l->slot_node && i < l->nphys; i++) {
        l->nodes[i].slot = i < cfg->spec->nnodes ? i : -1;
        if (i < cfg->spec->nnodes)
            l->slot_node[i] = i;
    }
    l->store = store_new(PROTO_STORE_MAX, PROTO_STORE_KEYS_MAX, leader_on_store_ready, l);
    l->barriers = json_object();
    l->failures = json_array();
    l->requeues = cfg->requeues;
    l->segments = leader_segments_load(cfg->job_dir, cfg->requeues);
    if (!l->nodes || !l->slot_node || !l->swaps || !l->store || !l->barriers || !l->failures ||
        !l->segments)
        return -ENOMEM;
    return 0;
}

/* The accepts' check, the tick and the heartbeats. */
static void start_timers(struct leader *l)
{
    uv_check_init(l->loop, &l->accept_check);
    l->accept_check.data = l;
    l->handles_open++;
    uv_check_start(&l->accept_check, accept_next);
    /* It runs every turn, but is no reason for the loop to keep turning. */
    uv_unref((uv_handle_t *)&l->accept_check);
    uv_timer_init(l->loop, &l->tick);
    l->tick.data = l;
    l->handles_open++;
    stall_init(&l->stall, TICK_MS, now_ms(l));
    uv_timer_start(&l->tick, on_tick, TICK_MS, TICK_MS);
    uv_timer_init(l->loop, &l->hb);
    l->hb.data = l;
    l->handles_open++;
    uv_timer_start(&l->hb, on_heartbeat, (uint64_t)l->spec->hb_interval_ms,
                   (uint64_t)l->spec->hb_interval_ms);
}

int leader_start(uv_loop_t *loop, const struct leader_config *cfg, struct leader **out)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss), ret;
    struct leader *l = calloc(1, sizeof(*l));

    if (!l)
        return -ENOMEM;
    ret = leader_init(l, loop, cfg);
    if (ret < 0)
        goto fail;
    if (uv_ip4_addr(cfg->bind_addr, 0, (struct sockaddr_in *)&ss) < 0 &&
        uv_ip6_addr(cfg->bind_addr, 0, (struct sockaddr_in6 *)&ss) < 0) {
        log_error("cannot listen on '%s': not a numeric address", cfg->bind_addr);
        ret = -EINVAL;
        goto fail;
    }
    uv_tcp_init(loop, &l->server);
    l->server.data = l;
    l->handles_open++;
    ret = uv_tcp_bind(&l->server, (struct sockaddr *)&ss, 0);
    /* Inherited by every accepted link (peer_accept). */
    if (ret == 0)
        ret = uv_tcp_nodelay(&l->server, 1);
    if (ret == 0)
        ret = uv_listen((uv_stream_t *)&l->server, SOMAXCONN, on_connection);
    if (ret == 0)
        ret = uv_tcp_getsockname(&l->server, (struct sockaddr *)&ss, &len);
    if (ret < 0) {
        log_error("cannot listen on '%s:0': %s", cfg->bind_addr, uv_strerror(ret));
        goto fail_close;
    }
    l->port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
    l->master_port = pick_master_port(cfg->bind_addr);
    if (l->master_port < 0) {
        log_error("cannot find a free port on '%s' for MASTER_PORT", cfg->bind_addr);
        ret = -EADDRNOTAVAIL;
        goto fail_close;
    }
    /* A job that does not use horovod opens no port for it (README.md says how a job does). */
    ret = cfg->spec->horovod
              ? hvd_server_start(loop, &(struct hvd_config){.bind_addr = cfg->bind_addr}, &l->hvd)
              : 0;
    if (ret < 0)
        goto fail_close;
    ret = write_endpoint(l);
    if (ret < 0) {
        log_error("cannot write '%s/endpoint.json': %s", l->job_dir, strerror(-ret));
        goto fail_close;
    }
    start_timers(l);
    log_info("leader listening on %s:%d (advertised %s), MASTER_PORT %d, horovod rendezvous %d",
             cfg->bind_addr, l->port, l->advertise, l->master_port, hvd_server_port(l->hvd));
    *out = l;
    return 0;
fail_close:
    l->closing = true;
    hvd_server_close(l->hvd);
    uv_close((uv_handle_t *)&l->server, on_handle_closed);
    return ret;
fail:
    leader_release(l);
    return ret;
}

int leader_fds_needed(int nnodes)
{
    return nnodes + PENDING_CONNS_MIN + FDS_SLACK;
}

int leader_port(const struct leader *l)
{
    return l->port;
}

void leader_cancel(struct leader *l, const char *cause)
{
    if (l->state == JOB_FINISHED)
        return;
    /* A cancel ends the job, a restart waiting for its backoff included. */
    leader_abandon_restart(l);
    if (leader_at_time_limit(l))
        leader_fail(l, 124, "timeout", false,
                    leader_failure_new(leader_timeout_cause(l), -1, -1, "", 0, 0, ""));
    else
        leader_fail(l, 143, "cancelled", false, leader_failure_new(cause, -1, -1, "", 0, 0, ""));
    leader_check_end(l);
}

void leader_close(struct leader *l)
{
    if (l->closing)
        return;
    l->closing = true;
    for (struct conn *c = l->conns; c; c = c->next)
        peer_close(&c->peer, "leader shutting down");
    hvd_server_close(l->hvd);
    uv_close((uv_handle_t *)&l->server, on_handle_closed);
    uv_close((uv_handle_t *)&l->accept_check, on_handle_closed);
    uv_close((uv_handle_t *)&l->tick, on_handle_closed);
    uv_close((uv_handle_t *)&l->hb, on_handle_closed);
}
