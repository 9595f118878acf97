/* The leader. Single-threaded on the daemon's loop: agents and status clients are peers on
 * one TCP listener; the first message after the handshake says which a peer is ("join" or
 * "status"). One timer ("tick") drives heartbeats, the join deadline, store timeouts and the
 * end-of-job grace. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

#include <jansson.h>

#include "fsutil.h"
#include "hvd.h"
#include "leader_int.h"
#include "log.h"
#include "metrics.h"
#include "peer.h"
#include "proto.h"
#include "refusals.h"
#include "scripthead.h"
#include "shim.h"
#include "signame.h"
#include "spares.h"
#include "stall.h"
#include "stragglers.h"
#include "store.h"
#include "together.h"
#include "utf8.h"
#include "banned.h"

/* --- a requeued job's earlier segments -------------------------------------------------- */

/* --- the pending queue: connections not yet admitted, oldest first ------------------------- */

static void pending_add(struct leader *l, struct conn *c)
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

/* c leaves the queue: admitted (agent or status client) or closed. */
static void pending_remove(struct leader *l, struct conn *c)
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

/* --- outcome ------------------------------------------------------------------------------ */

static void broadcast(struct leader *l, json_t *msg)
{
    for (int i = 0; i < l->nphys; i++)
        if (l->nodes[i].conn && !l->nodes[i].lost && !l->nodes[i].fenced)
            peer_send(&l->nodes[i].conn->peer, json_incref(msg));
    json_decref(msg);
}

/* The failing rank's last lines, one record each, under the failure's record. */
static void log_tail(const char *tail)
{
    while (tail && *tail) {
        size_t n = strcspn(tail, "\n");
        log_error("  | %.*s", (int)n, tail);
        tail += n + (tail[n] == '\n');
    }
}

/* The words in a rank's last lines or its exception that tie its failure to its node: the
 * GPU or the network, not the script (NCCL's and CUDA's own errors, a watchdog's abort). */
static bool names_node_fault(const char *text)
{
    static const char *const words[] = {
        "NCCL error",    "ncclSystemError",  "ncclUnhandledCudaError", "ncclInternalError",
        "CUDA error",    "cudaError",        "uncorrectable ECC",      "Xid",
        "NCCL watchdog", "DistBackendError", SPAWN_FORK_FAILED,
    };

    for (size_t i = 0; text && i < sizeof(words) / sizeof(words[0]); i++)
        if (strstr(text, words[i]))
            return true;
    return false;
}

/* The class of a rank's failed exit (jobspec.h's failure_class). */
static int exit_class(const struct msg *m)
{
    json_t *err = m->error;
    const char *type = json_string_value(json_object_get(err, "type"));
    const char *msg = json_string_value(json_object_get(err, "message"));

    if (m->oom)
        return FAILURE_OOM;
    if (names_node_fault(m->value) || names_node_fault(type) || names_node_fault(msg))
        return FAILURE_NODE;
    return m->signal ? FAILURE_SIGNAL : FAILURE_USER_ERROR;
}

static bool restart_on(const struct leader *l, int cls)
{
    return cls >= 0 && (l->spec->restart_on >> cls) & 1;
}

/* Records the first failure; later ones are consequences and only logged. */
/* restartable: a rank's own failure (exit, signal, hang), which a restart in the same
 * allocation may get past; a lost node, a cancel or a join timeout is not. */
static void fail(struct leader *l, int status, const char *outcome, bool restartable,
                 json_t *failure)
{
    const char *cause, *cls;
    json_t *msg;

    /* Never without a record: finish() reads a missing one as success. */
    if (!failure)
        failure = json_pack("{s:s, s:i, s:i}", "cause", "failure (no memory for its record)",
                            "rank", -1, "node", -1);
    cause = json_string_value(json_object_get(failure, "cause"));
    if (l->first_failure || l->state == JOB_FINISHED) {
        log_info("after the first failure: %s", cause ? cause : "?");
        json_decref(failure);
        return;
    }
    l->first_failure = failure;
    l->status = status;
    l->outcome = outcome;
    l->restartable = restartable;
    l->failure_class = -1;
    cls = json_string_value(json_object_get(failure, "class"));
    for (int c = 0; cls && c < FAILURE_CLASS_COUNT; c++)
        if (!strcmp(failure_class_name(c), cls))
            l->failure_class = c;
    /* A cancel is what the user asked for: said as such, not as a failure. A failure that a
     * restart will follow (check_end) ends a generation, not the job: a warning, and the
     * job's failure only if the job ends on it after all (finish). */
    l->failure_pending = false;
    if (!strcmp(outcome, "cancelled")) {
        log_warn("job cancelled: %s", cause && !strncmp(cause, "cancelled: ", 11) ? cause + 11
                                      : cause                                     ? cause
                                                                                  : "?");
    } else if (restartable && l->generation < l->spec->max_restarts) {
        l->failure_pending = true;
        log_warn("generation %d failed, a restart follows: %s", l->generation, cause ? cause : "?");
    } else {
        log_error("job failed: %s", cause ? cause : "?");
    }
    log_tail(json_string_value(json_object_get(failure, "tail")));
    l->state = JOB_ABORTING;
    l->t_abort = now_ms(l);
    msg = proto_pack("{s:s, s:s, s:b}", "type", "abort", "cause", cause ? cause : "failure",
                     "stacks", l->abort_stacks);
    /* The abort is the event: a cause that cannot be sent must not keep the nodes running. */
    if (!msg)
        msg = proto_pack("{s:s, s:s, s:b}", "type", "abort", "cause",
                         "failure (its text could not be sent: see summary.json)", "stacks",
                         l->abort_stacks);
    broadcast(l, msg);
}

/* The first spare still fit to take a place (joined, linked, neither lost nor fenced); -1:
 * none. */
static int next_spare(const struct leader *l)
{
    for (int i = l->spec->nnodes; i < l->nphys; i++) {
        const struct node *n = &l->nodes[i];
        if (n->slot < 0 && n->joined && n->conn && !n->lost && !n->fenced)
            return i;
    }
    return -1;
}

static int failed_node(const struct leader *l, const json_t *failure);

/* At the end, why the spares still fit to serve took no place (spares.h), into
 * l->idle_why ("" where none stayed idle or nothing failed). */
static void note_spares_why(struct leader *l)
{
    json_t *jn = json_object_get(l->first_failure, "node");
    int named = failed_node(l, l->first_failure);
    struct spares_end e = {
        .outcome = l->outcome,
        .cls = l->failure_class,
        .node = json_is_integer(jn) ? (int)json_integer_value(jn) : -1,
        .started = l->t_joined != 0,
        .max_restarts = l->spec->max_restarts,
        .restarts = l->generation,
        .restart_on = l->spec->restart_on,
    };

    l->idle_why[0] = '\0';
    for (int i = l->spec->nnodes; i < l->nphys; i++) {
        const struct node *n = &l->nodes[i];
        e.idle += n->slot < 0 && n->joined && n->conn && !n->lost && !n->fenced;
    }
    for (int s = 0; s < l->spec->nnodes; s++)
        e.lost += l->nodes[l->slot_node[s]].lost || l->slot_node[s] == named;
    if (!l->first_failure)
        e.cls = -1;
    spares_idle_why(&e, l->idle_why, sizeof(l->idle_why));
}

/* detail: every rank's stack and exception (summary.json; too large for a status reply), and
 * no "ranks": leader_write_summary() adds them one at a time, so that 100,000 ranks never stand as
 * one tree of JSON objects (160 MiB) beside their text. */

/* Whether the ranks' command runs Python (together_runs_python): argv[0] as named, or the
 * "#!" line of the file it names, here or on PATH. */
static bool runs_python(char *const *argv)
{
    char path[PATH_MAX], head[256] = "";
    const char *dirs = getenv("PATH");
    int fd = -1;
    ssize_t n;

    if (!argv || !argv[0])
        return false;
    if (strchr(argv[0], '/')) {
        fd = open(argv[0], O_RDONLY | O_CLOEXEC);
    } else {
        for (const char *d = dirs; d && fd < 0;) {
            int len = (int)strcspn(d, ":");
            /* An empty entry is the working directory. */
            if (snprintf(path, sizeof(path), "%.*s/%s", len ? len : 1, len ? d : ".", argv[0]) <
                (int)sizeof(path))
                fd = open(path, O_RDONLY | O_CLOEXEC);
            d = d[len] ? d + len + 1 : NULL;
        }
    }
    if (fd >= 0) {
        n = read(fd, head, sizeof(head) - 1);
        head[n > 0 ? n : 0] = '\0';
        close(fd);
    }
    return together_runs_python(argv[0], fd >= 0 ? head : NULL);
}

/* A job of several ranks that never met: said on the leader's log and in summary.json (the
 * client's end line reads it there), and with --require-rendezvous the job's failure. */
static void judge_together(struct leader *l)
{
    char fix[512], text[768];

    bool judged = l->spec->require_rendezvous || runs_python(l->spec->argv);
    bool hvd_used = hvd_server_puts(l->hvd) > 0;

    if (together_judge(l->world_size, judged, l->met, hvd_used) != TOGETHER_ALONE) {
        /* Horovod's ranks meet through its store and gloo's own links, never MASTER_PORT:
         * summary.json's ranks_met says they met all the same. */
        l->met = l->met || hvd_used;
        return;
    }
    int argc = 0;
    while (l->spec->argv && l->spec->argv[argc])
        argc++;
    char *head = malloc(SCRIPT_HEAD_MAX);
    size_t n = head ? script_head(l->spec->workdir, l->spec->argv, argc, head, SCRIPT_HEAD_MAX) : 0;
    together_fix(l->spec->argv, head, n, l->world_size, fix, sizeof(fix));
    free(head);
    snprintf(text, sizeof(text),
             "the %d ranks never met: none connected to MASTER_ADDR:MASTER_PORT nor used "
             "gpurun's store, so each trained alone; %s",
             l->world_size, fix);
    free(l->alone);
    l->alone = strdup(text);
    if (l->first_failure || !l->spec->require_rendezvous) {
        /* gpurun's end line and status say it, from summary.json. */
        log_info("%s", text);
        return;
    }
    l->first_failure = json_pack("{s:s, s:s, s:i, s:i}", "cause", text, "class",
                                 failure_class_name(FAILURE_USER_ERROR), "rank", -1, "node", -1);
    l->failure_class = FAILURE_USER_ERROR;
    l->outcome = "failed";
    l->status = 125; /* gpurun's own verdict, as its other failures */
    log_error("job failed (--require-rendezvous): %s", text);
}

static void finish(struct leader *l)
{
    if (l->state == JOB_FINISHED)
        return;
    judge_together(l);
    if (!l->first_failure) {
        l->outcome = "completed";
        l->status = 0;
    } else if (l->failure_pending) {
        /* No restart came after all (a node lost during the backoff, the agents' teardown
         * overdue): the generation's failure is the job's. */
        const char *cause = json_string_value(json_object_get(l->first_failure, "cause"));
        log_error("job failed: %s", cause ? cause : "?");
    }
    l->failure_pending = false;
    l->state = JOB_FINISHED;
    l->t_finish = now_ms(l);
    note_spares_why(l);
    if (l->spec->metrics_dir && l->stragglers_seen)
        metrics_remove_leader(l->spec->metrics_dir, l->spec->job_id);
    leader_write_summary(l);
    if (l->idle_why[0])
        log_warn("job %s: %s, exit status %d; spare%s stayed idle: %s", l->spec->job_id, l->outcome,
                 l->status, l->spec->spare_nodes > 1 ? "s" : "", l->idle_why);
    else
        log_info("job %s: %s, exit status %d", l->spec->job_id, l->outcome, l->status);
    broadcast(l, proto_pack("{s:s, s:i}", "type", "finish", "status", l->status));
}

/* Every node serving the job is done (or lost); spares run nothing. */
static bool all_nodes_done(const struct leader *l)
{
    for (int s = 0; s < l->spec->nnodes; s++) {
        const struct node *n = &l->nodes[l->slot_node[s]];
        if (!n->done && !n->lost && n->joined)
            return false;
    }
    return true;
}

static void on_store_ready(void *owner, int64_t id, const char *key, const char *value, void *arg);
static void send_assign(struct leader *l);

/* Drops what the ranks' records own (stacks, recorded exceptions). */
static void ranks_release(struct leader *l)
{
    for (int r = 0; l->ranks && r < l->world_size; r++) {
        json_decref(l->ranks[r].stack);
        json_decref(l->ranks[r].error);
        l->ranks[r].stack = l->ranks[r].error = NULL;
    }
}

/* The node a failure of the node's own (FAILURE_NODE) names, or the node of the rank a hang
 * was traced to (FAILURE_HANG), if it serves the job and is not node 0 (the leader's own,
 * which no spare can replace); else -1. */
static int failed_node(const struct leader *l, const json_t *failure)
{
    const char *cls = json_string_value(json_object_get(failure, "class"));
    json_t *jn = json_object_get(failure, "node");
    int n = json_is_integer(jn) ? (int)json_integer_value(jn) : -1;

    if (!cls ||
        (strcmp(cls, failure_class_name(FAILURE_NODE)) &&
         strcmp(cls, failure_class_name(FAILURE_HANG))) ||
        n <= 0 || n >= l->nphys || l->nodes[n].slot < 0)
        return -1;
    return n;
}

/* Whether spares can take the place of every node the failure and the losses took from the
 * job (nodes serving it that are lost, and the node a FAILURE_NODE names): then a restart
 * may go on without them. Node 0 lost or named: never. */
static bool spares_cover(const struct leader *l, const json_t *failure)
{
    int need = 0, have = 0, named = failed_node(l, failure);
    json_t *jn = json_object_get(failure, "node");

    if (json_is_integer(jn) && json_integer_value(jn) == 0)
        return false;
    for (int s = 0; s < l->spec->nnodes; s++) {
        int i = l->slot_node[s];
        if (l->nodes[i].lost && i == 0)
            return false;
        need += l->nodes[i].lost || i == named;
    }
    for (int i = l->spec->nnodes; i < l->nphys; i++) {
        const struct node *n = &l->nodes[i];
        have += n->slot < 0 && n->joined && n->conn && !n->lost && !n->fenced;
    }
    return need > 0 && need <= have;
}

/* horovod's rendezvous (a job that uses horovod only) learns the nodes of the job's slots
 * (its host list), and serves the addresses the job's nodes joined from and advertise: those
 * of every node that joined, spares included (one may take a slot). */
static int hvd_layout(struct leader *l)
{
    const char **hosts = calloc((size_t)l->spec->nnodes, sizeof(*hosts));
    const char **addrs = calloc(2 * (size_t)l->nphys, sizeof(*addrs));
    int ret = -ENOMEM, n = 0;

    if (!l->hvd) {
        ret = 0;
        goto out;
    }
    if (!hosts || !addrs)
        goto out;
    for (int s = 0; s < l->spec->nnodes; s++)
        hosts[s] = l->nodes[l->slot_node[s]].hostname;
    for (int i = 0; i < l->nphys; i++) {
        const struct node *nd = &l->nodes[i];
        if (nd->conn && nd->conn->peer.addr[0])
            addrs[n++] = nd->conn->peer.addr;
        if (nd->joined && nd->addr[0])
            addrs[n++] = nd->addr;
    }
    ret = hvd_server_layout(l->hvd, l->spec->nnodes, l->spec->nprocs, hosts);
    if (ret == 0 && hvd_server_allow(l->hvd, n, addrs) < 0)
        ret = -ENOMEM;
out:
    free(hosts);
    free(addrs);
    return ret;
}

/* Before a restart: each node the job lost, and the node a FAILURE_NODE or a hang names, is
 * fenced where a spare can take its place (its
 * daemon, if still there, told to end: it never serves this job again) and the next spare
 * takes its slot, its ranks and its rank numbers; each swap is logged and kept for status
 * and summary.json. */
static void swap_in_spares(struct leader *l)
{
    int named = failed_node(l, l->first_failure);
    const char *cause = json_string_value(json_object_get(l->first_failure, "cause"));
    bool swapped = false;

    for (int s = 0; s < l->spec->nnodes; s++) {
        int bad = l->slot_node[s], sp = next_spare(l), slow = -1;
        struct node *b = &l->nodes[bad], *n;
        char why[400];

        /* --straggler-action=replace: a node whose rank straggles gives its place too. */
        for (int r = s * l->spec->nprocs; l->ranks && r < (s + 1) * l->spec->nprocs; r++)
            if (l->spec->straggler_action == STRAGGLER_REPLACE && l->ranks[r].slower > 0 &&
                (slow < 0 || l->ranks[r].slower > l->ranks[slow].slower))
                slow = r;
        if ((!b->lost && bad != named && slow < 0) || bad == 0 || sp < 0)
            continue;
        n = &l->nodes[sp];
        if (b->lost || bad == named)
            snprintf(why, sizeof(why), "%s", bad == named && cause ? cause : "lost");
        else
            snprintf(why, sizeof(why), "a straggler: rank %d %.0f%% slower than the median", slow,
                     l->ranks[slow].slower * 100);
        b->slot = -1;
        b->fenced = true;
        if (b->conn && !b->lost)
            peer_send(&b->conn->peer, proto_pack("{s:s, s:i}", "type", "finish", "status", 0));
        n->slot = s;
        n->rank_base = s * l->spec->nprocs;
        l->slot_node[s] = sp;
        swapped = true;
        log_warn("node %d ('%s') fenced: %s; spare node %d ('%s') took its place", bad, b->hostname,
                 why, sp, n->hostname);
        json_array_append_new(l->swaps,
                              json_pack("{s:i, s:i, s:s, s:i, s:s, s:s, s:I}", "generation",
                                        l->generation + 1, "node", bad, "hostname", b->hostname,
                                        "spare", sp, "spare_hostname", n->hostname, "cause", why,
                                        "at_ms", (json_int_t)(now_ms(l) - l->t_start)));
    }
    if (swapped && hvd_layout(l) < 0)
        log_error("cannot tell horovod's rendezvous the new nodes: out of memory");
}

/* Generation g+1 in the same allocation: every rank is gone, the store and barriers start
 * empty (a rank of the new generation must not read the old NCCL id), and every agent gets
 * a new assign. The training core resumes from its last checkpoint. A node that failed for
 * its own sake, or was lost, gives its place to a spare first (swap_in_spares). */
static void restart(struct leader *l)
{
    swap_in_spares(l);
    /* A spare lost during the backoff leaves a lost node in place: the job cannot go on. */
    for (int s = 0; s < l->spec->nnodes; s++) {
        if (l->nodes[l->slot_node[s]].lost) {
            log_error("not restarting: node %d was lost and no spare is left to take its place",
                      l->slot_node[s]);
            l->restartable = false;
            l->restart_at = 0;
            finish(l);
            return;
        }
    }
    json_array_append_new(l->failures, l->first_failure);
    l->first_failure = NULL;
    l->failure_pending = false;
    l->generation++;
    log_warn("restarting the job: generation %d (restart %d of %d)", l->generation, l->generation,
             l->spec->max_restarts);
    store_free(l->store);
    l->store = store_new(PROTO_STORE_MAX, PROTO_STORE_KEYS_MAX, on_store_ready, l);
    hvd_server_reset(l->hvd);
    json_object_clear(l->barriers);
    ranks_release(l);
    memset(l->ranks, 0, (size_t)l->world_size * sizeof(*l->ranks));
    for (int r = 0; r < l->world_size; r++)
        proto_progress_init(&l->ranks[r].prog);
    for (int r = 0; r < l->world_size; r++)
        l->ranks[r].phase = PHASE_RUNNING;
    for (int i = 0; i < l->nphys; i++) {
        l->nodes[i].exited = 0;
        l->nodes[i].done = false;
    }
    l->exited = 0;
    l->status = 0;
    l->outcome = "running";
    l->restartable = false;
    l->abort_stacks = false;
    l->hang_warned = false;
    l->state = JOB_RUNNING;
    l->t_generation = now_ms(l);
    l->restart_at = 0;
    /* A restarted generation resumes from a checkpoint, perhaps steps back: a new course. */
    l->hist_n = l->hist_next = 0;
    if (!l->store) {
        fail(l, 125, "failed", false,
             leader_classed(leader_failure_new("leader out of memory", -1, 0, "", 0, 0, ""),
                            FAILURE_NODE));
        return;
    }
    send_assign(l);
}

/* The restart once its backoff has passed (on_tick calls again until then). */
static bool at_time_limit(const struct leader *l);
static const char *timeout_cause(const struct leader *l);

/* Calls off what a failure may still start: a restart waiting for its backoff gives way to a
 * cancel, the time limit or a lost node, and the failure that ended the last generation
 * joins the earlier ones, so that the new cause becomes the job's record (fail()). */
static void abandon_restart(struct leader *l)
{
    l->restartable = false;
    if (!l->restart_at)
        return;
    l->restart_at = 0;
    json_array_append_new(l->failures, l->first_failure);
    l->first_failure = NULL;
    l->failure_pending = false;
}

static void restart_later(struct leader *l)
{
    int64_t wait = RESTART_BACKOFF_MS;

    if (l->restart_at && at_time_limit(l)) {
        abandon_restart(l);
        fail(l, 124, "timeout", false, leader_failure_new(timeout_cause(l), -1, -1, "", 0, 0, ""));
        return;
    }
    if (l->restart_at && now_ms(l) >= l->restart_at) {
        restart(l);
        return;
    }
    if (l->restart_at)
        return;
    for (int g = 0; g < l->generation && wait < RESTART_BACKOFF_MAX_MS; g++)
        wait *= 2;
    if (wait > RESTART_BACKOFF_MAX_MS)
        wait = RESTART_BACKOFF_MAX_MS;
    l->restart_at = now_ms(l) + wait;
    log_warn("restarting the job in %.1f s (restart %d of %d)", (double)wait / 1000,
             l->generation + 1, l->spec->max_restarts);
}

static void check_end(struct leader *l)
{
    if (l->state == JOB_RUNNING && l->exited == l->world_size)
        finish(l);
    else if (l->state == JOB_ABORTING && all_nodes_done(l) && l->restartable &&
             l->generation < l->spec->max_restarts)
        restart_later(l);
    else if (l->state == JOB_ABORTING && (all_nodes_done(l) || !l->t_joined)) {
        /* Said once, where a restart was there to take: why this failure ends the job. */
        if (l->generation < l->spec->max_restarts && l->failure_class >= 0 &&
            !restart_on(l, l->failure_class))
            log_warn("not restarting: a %s failure, which %s", failure_class_name(l->failure_class),
                     l->spec->spare_nodes > 0 && l->spec->restart_on == RESTART_ON_SPARES
                         ? "the spares' restarts (node and hang failures) do not cover"
                         : "--restart-on does not name");
        finish(l); /* before the assign there are no ranks to wait for */
    }
}

/* --- requests ----------------------------------------------------------------------------- */

static void on_store_ready(void *owner, int64_t id, const char *key, const char *value, void *arg)
{
    struct conn *c = owner;
    char msg[PROTO_KEY_MAX + 64];

    (void)arg;
    if (value) {
        peer_send(&c->peer, proto_pack("{s:s, s:I, s:s}", "type", "kv_val", "id", (json_int_t)id,
                                       "value", value));
    } else {
        snprintf(msg, sizeof(msg), "key '%s' did not appear in time", key);
        peer_send_error(&c->peer, id, "timeout", msg);
    }
}

static void do_kv(struct leader *l, struct conn *c, struct msg *m)
{
    const char *v;
    int ret;

    switch (m->type) {
    case MSG_KV_PUT:
        l->met = true;
        l->t_all_wait = 0; /* a put may end a rank's wait for its key */
        ret = store_put(l->store, m->key, m->value);
        if (ret < 0)
            peer_send_error(&c->peer, m->id, "too_large",
                            "store full: its key or byte limit is reached");
        else
            peer_send(&c->peer, proto_pack("{s:s, s:I}", "type", "ok", "id", m->id));
        break;
    case MSG_KV_GET:
        l->met = true;
        v = store_get(l->store, m->key);
        if (v)
            peer_send(&c->peer,
                      proto_pack("{s:s, s:I, s:s}", "type", "kv_val", "id", m->id, "value", v));
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
        peer_send(&c->peer, proto_pack("{s:s, s:I}", "type", "ok", "id", m->id));
        break;
    }
}

static void do_barrier(struct leader *l, struct conn *c, struct msg *m)
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
        broadcast(l, proto_pack("{s:s, s:s}", "type", "barrier_done", "name", m->key));
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

static void do_progress(struct leader *l, struct conn *c, struct msg *m)
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
    if (m->signal == SIGTERM && !m->killed && at_time_limit(l)) {
        /* Slurm's time limit signals every process of the step, the ranks with their daemon:
         * whichever tells the leader first, the job ended at its limit. */
        fail(l, 124, "timeout", false,
             leader_failure_new(timeout_cause(l), -1, c->node, n->hostname, 0, 0, ""));
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
        int cls = exit_class(m);
        f = leader_classed(
            leader_failure_new(cause, m->rank, c->node, n->hostname, m->code, m->signal, m->value),
            cls);
        if (f && m->error)
            json_object_set(f, "error", m->error);
        fail(l, m->signal ? 128 + m->signal : m->code, "failed", restart_on(l, cls), f);
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
    check_end(l);
}

/* A frame of an agent's link probe: a round's first starts its clock, its last ends it, and
 * the best round is kept. */
static void do_probe(struct conn *c, const struct msg *m)
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
    c->probe_bytes += strlen(m->value);
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
    if (k < 2) {
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
        finish(l);
        return;
    }
    snprintf(cause, sizeof(cause), "pre-flight failed on %d of %d nodes; node %d ('%.64s'): %s",
             bad, l->nphys, first, l->nodes[first].hostname, l->nodes[first].preflight);
    fail(l, 125, "failed", false,
         leader_classed(leader_failure_new(cause, -1, first, l->nodes[first].hostname, 0, 0, ""),
                        FAILURE_NODE));
    check_end(l);
}

/* Before the first assign: each node serving the job that failed its pre-flight checks gives
 * its place to a spare that passed them; where none is left (or it is node 0, the leader's),
 * the job ends before any rank starts. Spares that failed are fenced. Returns false when the
 * job ended. */
static bool preflight_swaps(struct leader *l)
{
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
    for (int s = 0; s < l->spec->nnodes; s++) {
        int bad = l->slot_node[s], sp = next_spare(l);
        struct node *b = &l->nodes[bad], *n;
        char cause[400];

        if (!b->preflight[0])
            continue;
        snprintf(cause, sizeof(cause), "node %d ('%.64s') failed pre-flight: %s", bad, b->hostname,
                 b->preflight);
        if (bad == 0 || sp < 0) {
            /* The job ends on the first; the others that failed are said here, once. */
            for (int t = s + 1; t < l->spec->nnodes; t++) {
                const struct node *o = &l->nodes[l->slot_node[t]];
                if (o->preflight[0])
                    log_warn("node %d ('%s') failed pre-flight: %s", l->slot_node[t], o->hostname,
                             o->preflight);
            }
            fail(l, 125, "failed", false,
                 leader_classed(leader_failure_new(cause, -1, bad, b->hostname, 0, 0, ""),
                                FAILURE_NODE));
            check_end(l);
            return false;
        }
        n = &l->nodes[sp];
        b->slot = -1;
        b->fenced = true;
        if (b->conn)
            peer_send(&b->conn->peer, proto_pack("{s:s, s:i}", "type", "finish", "status", 0));
        n->slot = s;
        l->slot_node[s] = sp;
        log_warn("node %d ('%s') fenced: failed pre-flight: %s; spare node %d ('%s') took its "
                 "place",
                 bad, b->hostname, b->preflight, sp, n->hostname);
        json_array_append_new(
            l->swaps, json_pack("{s:i, s:i, s:s, s:i, s:s, s:s, s:I}", "generation", 0, "node", bad,
                                "hostname", b->hostname, "spare", sp, "spare_hostname", n->hostname,
                                "cause", cause, "at_ms", (json_int_t)(now_ms(l) - l->t_start)));
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
    hvd = hvd_layout(l);
    if (!l->ranks || !l->hang_signs || hvd < 0) {
        fail(l, 125, "failed", false,
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
    send_assign(l);
}

/* Every node's assign for the generation: the nodes serving the job their ranks, the spares
 * none ("spare"). */
static void send_assign(struct leader *l)
{
    for (int i = 0; i < l->nphys; i++) {
        struct node *n = &l->nodes[i];
        if (!n->conn || n->lost || n->fenced)
            continue;
        peer_send(&n->conn->peer,
                  proto_pack("{s:s, s:i, s:i, s:i, s:i, s:s, s:i, s:i, s:s, s:b}", "type", "assign",
                             "generation", l->generation, "world_size", l->world_size, "rank_base",
                             n->slot >= 0 ? n->rank_base : 0, "nnodes", l->spec->nnodes,
                             "master_addr", l->advertise, "master_port", l->master_port, "hvd_port",
                             hvd_server_port(l->hvd), "hvd_host",
                             n->slot >= 0 && l->hvd ? hvd_server_host(l->hvd, n->slot) : "",
                             "spare", n->slot < 0));
    }
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

static void do_join(struct leader *l, struct conn *c, struct msg *m)
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
    pending_remove(l, c);
    n->conn = c;
    l->agents_open++;
    n->joined = true;
    n->nprocs = m->nprocs;
    snprintf(n->hostname, sizeof(n->hostname), "%s", m->hostname);
    snprintf(n->addr, sizeof(n->addr), "%s", m->addr);
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

/* The time limit's origin on the loop's clock (at t_start): the job's start as the launcher
 * said in JOB_START_ENV, up to a day back; else t_start. */
static int64_t limit_origin(int64_t t_start)
{
    const char *env = getenv(JOB_START_ENV);
    struct timespec ts;
    long long start, wall;
    char *end;

    if (!env || !*env || clock_gettime(CLOCK_REALTIME, &ts) < 0)
        return t_start;
    errno = 0;
    start = strtoll(env, &end, 10);
    wall = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    if (errno || *end || start <= 0 || wall - start < 0 || wall - start > 86400000LL) {
        log_warn("ignoring %s='%.32s': not a start in the last day", JOB_START_ENV, env);
        return t_start;
    }
    return t_start - (wall - start);
}

/* Whether the job has reached its time limit (job.json's time_limit_s), give or take the
 * moment between the job's start and the leader's. */
static bool at_time_limit(const struct leader *l)
{
    return l->spec->time_limit_s > 0 &&
           now_ms(l) - l->t_limit0 >= (int64_t)l->spec->time_limit_s * 1000 - TIMEOUT_SLACK_MS;
}

static const char *timeout_cause(const struct leader *l)
{
    static char cause[128];

    snprintf(cause, sizeof(cause), "time limit of %d s reached: the ranks were stopped",
             l->spec->time_limit_s);
    return cause;
}

/* The pre-timeout signal to every agent, which hands it to the ranks that asked for it. */
static void send_preempt(struct leader *l, int sig)
{
    char sn[SIGNAME_LEN];

    log_info("pre-timeout signal %s: to the ranks that asked for it", signame(sig, sn));
    if (!l->t_preempt) {
        l->t_preempt = now_ms(l);
        l->preempt_sig = sig;
    }
    broadcast(l, proto_pack("{s:s, s:i}", "type", "signal", "signal", sig));
}

/* The batch script's request (PREEMPT_FILE), taken once. */
static void poll_preempt(struct leader *l, int64_t now)
{
    char path[PATH_MAX], *text = NULL, *end;
    size_t len;
    long sig;

    if (!l->job_dir || now - l->t_preempt_poll < PREEMPT_POLL_MS)
        return;
    l->t_preempt_poll = now;
    snprintf(path, sizeof(path), "%.4000s/" PREEMPT_FILE, l->job_dir);
    if (fs_read_all(path, 64, &text, &len) < 0)
        return;
    unlink(path);
    sig = strtol(text, &end, 10);
    if (end == text || (*end && *end != '\n') || sig < 1 || sig > 64)
        log_warn("ignored '%s': '%.16s' is not a signal number", path, text);
    else if (l->state == JOB_RUNNING)
        send_preempt(l, (int)sig);
    free(text);
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
        abandon_restart(l);
    if (m->status == 128 + SIGTERM && at_time_limit(l)) {
        fail(l, 124, "timeout", false,
             leader_failure_new(timeout_cause(l), -1, c->node, l->nodes[c->node].hostname, 0, 0,
                                ""));
        return;
    }
    if (cancel)
        fail(l, m->status, "cancelled", false,
             leader_failure_new(m->value, -1, c->node, l->nodes[c->node].hostname, 0, 0, ""));
    else
        fail(l, m->status ? m->status : 1, "failed",
             m->status == 124 ? restart_on(l, FAILURE_HANG) : false,
             leader_classed(
                 leader_failure_new(m->value, -1, c->node, l->nodes[c->node].hostname, 0, 0, ""),
                 m->status == 124 ? FAILURE_HANG : FAILURE_NODE));
    check_end(l);
}

static void on_message(struct peer *p, struct msg *m)
{
    struct conn *c = (struct conn *)p;
    struct leader *l = p->owner;

    if (c->role == ROLE_NEW && m->type == MSG_JOIN) {
        do_join(l, c, m);
        return;
    }
    if (c->role == ROLE_NEW && m->type == MSG_PROBE) {
        do_probe(c, m);
        return;
    }
    if (c->role == ROLE_NEW && m->type == MSG_STATUS) {
        if (l->nclients >= CLIENTS_MAX) {
            peer_send_error(p, m->id, "denied", "too many status clients");
            peer_close(p, "too many status clients");
            return;
        }
        c->role = ROLE_CLIENT;
        pending_remove(l, c);
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
        do_kv(l, c, m);
        break;
    case MSG_BARRIER:
        do_barrier(l, c, m);
        break;
    case MSG_PROGRESS:
        do_progress(l, c, m);
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
    l->restartable = was_restartable && restart_on(l, FAILURE_NODE) && spares_cover(l, f);
    if (was_restartable && l->restartable)
        log_warn("node %d ('%s') lost too: %s; a spare takes its place as well at the restart", k,
                 l->nodes[k].hostname, why);
    else if (was_restartable)
        log_warn("node %d ('%s') lost too: %s; no restart: %s", k, l->nodes[k].hostname, why,
                 restart_on(l, FAILURE_NODE) ? "too few spares for every node lost"
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
        pending_remove(l, c);
        /* One line each for a peer that proved the key; a flood of those that did not is
         * counted and summarised (log_refusals). */
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
            abandon_restart(l);
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
                check_end(l);
                goto out;
            }
            /* Without a spare to take its place, not restartable whatever --restart-on says:
             * the node's daemon is gone, and a new generation would wait for it for ever. */
            json_t *f = leader_classed(
                leader_failure_new(cause, -1, c->node, n->hostname, 0, 0, ""), FAILURE_NODE);
            fail(l, 125, "failed",
                 l->t_joined && restart_on(l, FAILURE_NODE) && f && spares_cover(l, f), f);
            check_end(l);
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

/* Connections allowed before admission: one for every node still to join, so that every
 * agent of a job can connect at once, and l->strangers_max for strangers. */
static int pending_max(const struct leader *l)
{
    return l->nphys - l->joined + l->strangers_max;
}

/* The stranger slots the descriptor limit leaves room for: PENDING_CONNS_MAX, or fewer (not
 * under PENDING_CONNS_MIN) when the soft limit cannot hold one descriptor per node, FDS_SLACK
 * and PENDING_CONNS_MAX. A flood then meets evictions before accept() meets EMFILE. */
static int strangers_max(int nnodes)
{
    struct rlimit rl;
    long room;

    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY)
        return PENDING_CONNS_MAX;
    room = (long)rl.rlim_cur - nnodes - FDS_SLACK;
    return room >= PENDING_CONNS_MAX ? PENDING_CONNS_MAX
                                     : (int)(room > PENDING_CONNS_MIN ? room : PENDING_CONNS_MIN);
}

/* Over the pending limit one connection not yet admitted goes, never one that proved the job
 * key: the oldest of those that have sent nothing valid yet (not even a well-formed hello),
 * else the oldest still in its handshake. Never the newest: refusing newcomers would lock a
 * real agent out for as long as a flood lasts, where this only delays it by the flood's
 * turnover of the queue, and an agent, which sends its hello at once, is always younger than
 * the silent strangers ahead of it. */
static void evict_pending(struct leader *l)
{
    struct conn *victim = NULL;

    for (struct conn *c = l->qhead; c; c = c->qnext) {
        if (c->peer.ready || c->peer.closing)
            continue;
        if (!c->peer.heard) {
            victim = c;
            break;
        }
        if (!victim)
            victim = c;
    }
    if (!victim)
        return;
    /* Out of the count now: its close completes on the next turn of the loop. */
    pending_remove(l, victim);
    peer_close(&victim->peer, "evicted: too many pending connections");
}

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
    c->next = l->conns;
    if (l->conns)
        l->conns->prev = c;
    l->conns = c;
    pending_add(l, c);
    ret = peer_accept(&c->peer, server);
    if (ret < 0) {
        log_error("cannot accept: %s", uv_strerror(ret));
        c->logged = true;
        peer_close(&c->peer, uv_strerror(ret));
        return;
    }
    if (l->state == JOB_FINISHED)
        peer_close(&c->peer, "refused: job finished");
    else if (l->npending > pending_max(l))
        evict_pending(l);
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

/* After "finish": the leader is done once summary.json is written and every agent hung up,
 * or the linger ran out. */
void leader_check_linger(struct leader *l)
{
    if (l->state != JOB_FINISHED || l->done_called || l->summary_writing)
        return;
    if (!l->agents_open || now_ms(l) - l->t_finish > FINISH_LINGER_MS) {
        l->done_called = true;
        l->done(l, l->status, l->arg);
    }
}

/* The leader's metrics file (metrics.h): which of the job's nodes have a straggler, and how
 * much slower each straggler is. Written from the first straggler on, every check. */
static void write_straggler_metrics(struct leader *l)
{
    struct metrics_leader_node *nodes = calloc((size_t)l->spec->nnodes, sizeof(*nodes));
    struct metrics_leader_rank *ranks = calloc((size_t)l->world_size, sizeof(*ranks));
    struct metrics_leader m = {.job_id = l->spec->job_id, .nodes = nodes, .ranks = ranks};
    int ret;

    if (nodes && ranks) {
        for (int s = 0; s < l->spec->nnodes; s++) {
            int i = l->slot_node[s];
            nodes[m.nnodes++] =
                (struct metrics_leader_node){.node = i, .hostname = l->nodes[i].hostname};
        }
        for (int r = 0; r < l->world_size; r++) {
            if (l->ranks[r].slower <= 0)
                continue;
            nodes[r / l->spec->nprocs].straggler = true;
            ranks[m.nranks++] = (struct metrics_leader_rank){
                .rank = r, .node = node_of(l, r), .slower = l->ranks[r].slower};
        }
        ret = metrics_write_leader(l->spec->metrics_dir, &m);
        if (ret < 0 && !l->metrics_warned) {
            l->metrics_warned = true;
            log_warn("cannot write the leader's metrics into '%s': %s", l->spec->metrics_dir,
                     strerror(-ret));
        }
    }
    free(nodes);
    free(ranks);
}

/* Stragglers: the rule is stragglers.h's; here each rank's average is gathered, a rank
 * newly named is logged once (rank_view's "slower", job_view's "stragglers" show them), and
 * the leader's metrics file is written. */
static void check_stragglers(struct leader *l, int64_t now)
{
    struct straggler_rank *k;
    double *slower, median;
    int ret;

    if (l->spec->straggler_pct <= 0 || l->state != JOB_RUNNING || !l->ranks ||
        now - l->t_straggler_check < STRAGGLER_CHECK_MS)
        return;
    l->t_straggler_check = now;
    k = malloc((size_t)l->world_size * sizeof(*k));
    slower = malloc((size_t)l->world_size * sizeof(*slower));
    if (!k || !slower)
        goto out;
    for (int r = 0; r < l->world_size; r++) {
        const struct rank *rk = &l->ranks[r];
        k[r] = (struct straggler_rank){.running = rk->phase == PHASE_RUNNING,
                                       .reported = rk->report_ms != 0,
                                       .steps = rk->step_avg_steps,
                                       .avg = rk->step_avg};
        slower[r] = rk->slower;
    }
    ret = stragglers_judge(k, l->world_size, l->spec->straggler_pct, STRAGGLER_MIN_STEPS, slower,
                           &median);
    if (ret <= 0)
        goto out;
    for (int r = 0; r < l->world_size; r++) {
        struct rank *rk = &l->ranks[r];
        int node = node_of(l, r);
        rk->slower = slower[r];
        if (rk->slower <= 0 || rk->straggler_said)
            continue;
        l->stragglers_seen = true;
        rk->straggler_said = true;
        log_warn("straggler: rank %d on node %d ('%s') %.0f%% slower than the median (%.3f s a "
                 "step against %.3f) over %" PRId64 " steps",
                 r, node, l->nodes[node].hostname, rk->slower * 100, rk->step_avg, median,
                 rk->step_avg_steps);
    }
    if (l->spec->metrics_dir && l->stragglers_seen)
        write_straggler_metrics(l);
out:
    free(k);
    free(slower);
}

/* Hang detection: the rule and its cases are hang.h's; here the ranks' signs are gathered,
 * the verdict worded, and the job failed (every rank's stack captured first). */
static void hang_signs(const struct leader *l, struct hang_rank *hr)
{
    for (int r = 0; r < l->world_size; r++) {
        const struct rank *k = &l->ranks[r];
        hr[r] = (struct hang_rank){.running = k->phase == PHASE_RUNNING,
                                   .waiting = k->waiting,
                                   .step = k->prog.step,
                                   .report_ms = k->report_ms,
                                   .released_ms = k->released_ms,
                                   .active_ms = k->active_ms,
                                   .output_ms = k->output_ms};
    }
}

/* --hang-watch output's cause: the silence said is the output's; where a barrier released
 * the rank since, the time since then too (what the timeout counted). */
static void hang_output_cause(const struct leader *l, const struct hang_verdict *v, int64_t now,
                              char *cause, size_t size)
{
    const struct rank *b = &l->ranks[v->rank];
    int64_t ms = now - (b->output_ms ? b->output_ms : l->t_generation);
    int node = node_of(l, v->rank);
    char since[64] = "";

    if (v->sign_ms > now - ms)
        snprintf(since, sizeof(since), ", %.1f s since a barrier released it",
                 (double)(now - v->sign_ms) / 1000);
    if (b->last_line[0])
        snprintf(cause, size,
                 "rank %d on node %d ('%.64s') hung: no output for %.1f s%s (--hang-watch "
                 "output); its last line: '%.*s'",
                 v->rank, node, l->nodes[node].hostname, (double)ms / 1000, since,
                 (int)utf8_prefix_len(b->last_line, 200), b->last_line);
    else
        snprintf(cause, size,
                 "rank %d on node %d ('%.64s') hung: it printed nothing in %.1f s%s (--hang-watch "
                 "output)",
                 v->rank, node, l->nodes[node].hostname, (double)ms / 1000, since);
}

/* The reports' cause, with the ranks that never reported and may be the ones stuck. */
static void hang_reports_cause(const struct leader *l, const struct hang_job *job,
                               const struct hang_verdict *v, int64_t now, char *cause, size_t size)
{
    const struct rank *b = &l->ranks[v->rank];
    int node = node_of(l, v->rank), n, silent = 0;

    if (!b->report_ms)
        n = snprintf(cause, size,
                     "rank %d on node %d ('%s') hung: it never reported progress while %s (no "
                     "progress for %.1f s; the furthest rank's step %" PRId64 ")",
                     v->rank, node, l->nodes[node].hostname, v->why,
                     (double)(now - l->ranks[v->stalled].report_ms) / 1000, v->max_step);
    else {
        /* Its report may be far older than the timeout where the store kept it alive since:
         * say when it was last seen, so that the report's age does not read as a late call. */
        char life[64] = "";
        if (v->sign_ms > b->report_ms)
            snprintf(life, sizeof(life), ", no store call or barrier for %.1f s",
                     (double)(now - v->sign_ms) / 1000);
        n = snprintf(cause, size,
                     "rank %d on node %d ('%s') hung: no progress report for %.1f s (its last "
                     "step %" PRId64 ", the furthest rank's %" PRId64 "%s)%s%s",
                     v->rank, node, l->nodes[node].hostname, (double)(now - b->report_ms) / 1000,
                     (int64_t)b->prog.step, v->max_step, life, *v->why ? "; " : "", v->why);
    }
    for (int r = 0; r < l->world_size && n > 0 && (size_t)n < size - 48; r++) {
        if (!hang_suspect(job, v, r))
            continue;
        if (silent++ == 8) {
            n += snprintf(cause + n, size - (size_t)n, " ...");
            break;
        }
        n += snprintf(cause + n, size - (size_t)n, "%s%d",
                      silent == 1 ? "; never reported, and may be the one stuck: rank " : ", ", r);
    }
}

static void check_hang(struct leader *l, int64_t now)
{
    struct hang_config cfg = {.timeout_ms = l->spec->hang_timeout_ms,
                              .margin_ms = HANG_MARGIN_MS,
                              .output = l->spec->hang_watch == HANG_WATCH_OUTPUT};
    struct hang_job job = {.ranks = l->hang_signs,
                           .nranks = l->world_size,
                           .t_generation = l->t_generation,
                           .t_all_wait = l->t_all_wait};
    struct hang_verdict v;
    char cause[480];
    int node;

    if (cfg.timeout_ms <= 0 || l->state != JOB_RUNNING || !l->hang_signs)
        return;
    hang_signs(l, l->hang_signs);
    hang_judge(&cfg, &job, now, &v);
    if (v.kind == HANG_CANNOT_APPLY && !l->hang_warned) {
        l->hang_warned = true;
        if (cfg.output)
            log_warn("--hang-timeout %.1f s (--hang-watch output) cannot apply yet: no rank has "
                     "printed anything",
                     (double)cfg.timeout_ms / 1000);
        else
            log_warn("--hang-timeout %.1f s cannot apply: no rank has reported progress (report "
                     "with gpurun.report() in Python or gr_report() in C)",
                     (double)cfg.timeout_ms / 1000);
    }
    if (v.kind != HANG_HUNG && v.kind != HANG_DEADLOCK)
        return;
    if (cfg.output)
        hang_output_cause(l, &v, now, cause, sizeof(cause));
    else
        hang_reports_cause(l, &job, &v, now, cause, sizeof(cause));
    node = node_of(l, v.rank);
    l->abort_stacks = true;
    fail(l, 124, "hung", restart_on(l, FAILURE_HANG),
         leader_classed(leader_failure_new(cause, v.rank, node, l->nodes[node].hostname, 0, 0, ""),
                        FAILURE_HANG));
}

/* Logs the summaries of refusals due at now (all of them when flush). */
static void log_refusals(struct leader *l, int64_t now, bool flush)
{
    char line[256];

    while (refusals_next(&l->refusals, now, flush, line, sizeof(line)))
        log_warn("%s", line);
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

/* Every other node silent past the timeout together: from the leader's side that is its own
 * link (or host) far more likely than each of theirs, so the record says the leader lost them
 * all rather than blame the first in its list. The leader's node is node 0; its own agent
 * talks to it over the host's loopback and stays heard. It takes two others at least (with
 * one, either side may be at fault: the single loss says which side saw it), nodes not done
 * (a finished node's link is no one's concern), and a job over several hosts (--local's
 * nodes share one). "Together": when the first passes the timeout, every other has been
 * silent for all but two heartbeat periods of it, where heartbeats phase apart by up to one. */
static void check_all_lost(struct leader *l, int64_t now)
{
    char cause[400];
    int others = 0, n;
    int64_t ms = 0, longest = 0, together = l->spec->hb_timeout_ms - 2 * l->spec->hb_interval_ms;

    if (l->first_failure || l->state == JOB_FINISHED || l->spec->loopback)
        return;
    if (together < l->spec->hb_timeout_ms / 2)
        together = l->spec->hb_timeout_ms / 2;
    for (struct conn *c = l->conns; c; c = c->next) {
        int64_t silent;
        if (c->role != ROLE_AGENT || c->node == 0 || l->nodes[c->node].done)
            continue;
        others++;
        silent = peer_silence_ms(&c->peer, now);
        if (silent <= together)
            return;
        if (!ms || silent < ms)
            ms = silent;
        if (silent > longest)
            longest = silent;
    }
    if (others < 2 || longest <= l->spec->hb_timeout_ms)
        return;
    n = snprintf(cause, sizeof(cause),
                 "the leader (node 0, '%.64s') lost all %d other nodes at once: no heartbeat from "
                 "any for %" PRId64 " ms or more; its own link or host is the likely fault, unless "
                 "they all stopped together (nodes:",
                 l->nodes[0].hostname, others, ms);
    for (int i = 1; i < l->nphys && n > 0 && (size_t)n < sizeof(cause) - 16; i++)
        if (l->nodes[i].conn && !l->nodes[i].done)
            n += snprintf(cause + n, sizeof(cause) - (size_t)n, " %d", i);
    if (n > 0 && (size_t)n < sizeof(cause) - 2)
        snprintf(cause + n, sizeof(cause) - (size_t)n, ")");
    fail(l, 125, "failed", false,
         leader_classed(leader_failure_new(cause, -1, 0, l->nodes[0].hostname, 0, 0, ""),
                        FAILURE_NODE));
}

static void on_tick(uv_timer_t *t)
{
    struct leader *l = t->data;
    int64_t now = now_ms(l);
    char cause[512];

    excuse_stall(l, now);
    store_expire(l->store, now);
    log_refusals(l, now, false);
    if (l->restart_at)
        check_end(l);
    check_all_lost(l, now);
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
        fail(l, 124, "failed", false,
             leader_classed(leader_failure_new(cause, -1, first, "", 0, 0, ""), FAILURE_NODE));
        finish(l);
    }
    /* The time limit is the leader's to keep too: gpurun --local's deadline dies with
     * gpurun. On Slurm, Slurm ends the job at its limit and records TIMEOUT (what a requeue
     * decides on): the leader's deadline is then only a backstop, LIMIT_BACKSTOP_MS later. */
    if ((l->state == JOB_JOINING || l->state == JOB_RUNNING) && l->spec->time_limit_s > 0 &&
        now - l->t_limit0 >=
            (int64_t)l->spec->time_limit_s * 1000 + (l->spec->loopback ? 0 : LIMIT_BACKSTOP_MS)) {
        fail(l, 124, "timeout", false, leader_failure_new(timeout_cause(l), -1, -1, "", 0, 0, ""));
        check_end(l);
    }
    check_hang(l, now);
    check_stragglers(l, now);
    poll_preempt(l, now);
    if (l->state == JOB_ABORTING && !l->restart_at &&
        now - l->t_abort >
            l->spec->kill_grace_ms + ABORT_SLACK_MS + (l->abort_stacks ? STACK_CAPTURE_MS : 0)) {
        log_error("agents did not report their ranks gone in time; finishing");
        finish(l);
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

void leader_maybe_free(struct leader *l)
{
    if (!l->closing || l->handles_open > 0 || l->conns || l->summary_writing)
        return;
    log_refusals(l, 0, true);
    store_free(l->store);
    json_decref(l->barriers);
    json_decref(l->failures);
    json_decref(l->segments);
    json_decref(l->first_failure);
    json_decref(l->swaps);
    free(l->alone);
    free(l->nodes);
    free(l->slot_node);
    ranks_release(l);
    free(l->ranks);
    free(l->hang_signs);
    free(l);
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
    return fs_write_atomic(path, text, (size_t)n, 0600);
}

int leader_start(uv_loop_t *loop, const struct leader_config *cfg, struct leader **out)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss), ret;
    struct leader *l = calloc(1, sizeof(*l));

    if (!l)
        return -ENOMEM;
    l->loop = loop;
    l->spec = cfg->spec;
    l->key = *cfg->key;
    l->job_dir = cfg->job_dir;
    l->max_frame = cfg->max_frame;
    l->done = cfg->done;
    l->arg = cfg->arg;
    l->t_start = (int64_t)uv_now(loop);
    l->t_limit0 = limit_origin(l->t_start);
    l->outcome = "running";
    l->nphys = cfg->spec->nnodes + cfg->spec->spare_nodes;
    l->strangers_max = strangers_max(l->nphys);
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
    l->store = store_new(PROTO_STORE_MAX, PROTO_STORE_KEYS_MAX, on_store_ready, l);
    l->barriers = json_object();
    l->failures = json_array();
    l->requeues = cfg->requeues;
    l->segments = leader_segments_load(cfg->job_dir, cfg->requeues);
    if (!l->nodes || !l->slot_node || !l->swaps || !l->store || !l->barriers || !l->failures ||
        !l->segments) {
        ret = -ENOMEM;
        goto fail;
    }
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
    uv_check_init(loop, &l->accept_check);
    l->accept_check.data = l;
    l->handles_open++;
    uv_check_start(&l->accept_check, accept_next);
    /* It runs every turn, but is no reason for the loop to keep turning. */
    uv_unref((uv_handle_t *)&l->accept_check);
    uv_timer_init(loop, &l->tick);
    l->tick.data = l;
    l->handles_open++;
    stall_init(&l->stall, TICK_MS, now_ms(l));
    uv_timer_start(&l->tick, on_tick, TICK_MS, TICK_MS);
    uv_timer_init(loop, &l->hb);
    l->hb.data = l;
    l->handles_open++;
    uv_timer_start(&l->hb, on_heartbeat, (uint64_t)l->spec->hb_interval_ms,
                   (uint64_t)l->spec->hb_interval_ms);
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
    store_free(l->store);
    json_decref(l->barriers);
    json_decref(l->failures);
    json_decref(l->segments);
    json_decref(l->swaps);
    free(l->nodes);
    free(l->slot_node);
    free(l);
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
    abandon_restart(l);
    if (at_time_limit(l))
        fail(l, 124, "timeout", false, leader_failure_new(timeout_cause(l), -1, -1, "", 0, 0, ""));
    else
        fail(l, 143, "cancelled", false, leader_failure_new(cause, -1, -1, "", 0, 0, ""));
    check_end(l);
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
