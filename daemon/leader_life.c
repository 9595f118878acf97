/* The job's life as the leader leads it: a failure (the first one is the job's), the restart
 * of a new generation (spares taking failed nodes' places first), the end (summary.json,
 * written off the loop) and the leader's own end once its agents have hung up. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cancel.h"
#include "fsutil.h"
#include "jtext.h"
#include "leader_int.h"
#include "log.h"
#include "metrics.h"
#include "regroup.h"
#include "scripthead.h"
#include "shim.h"
#include "signame.h"
#include "spares.h"
#include "together.h"
#include "banned.h"

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

int leader_exit_class(const struct msg *m)
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

bool leader_restart_on(const struct leader *l, int cls)
{
    return cls >= 0 && (l->spec->restart_on >> cls) & 1;
}

void leader_fail(struct leader *l, int status, const char *outcome, bool restartable,
                 json_t *failure)
{
    const char *cause, *cls;
    json_t *msg;

    /* Never without a record: leader_finish() reads a missing one as success. */
    if (!failure)
        failure = json_pack("{s:s, s:i, s:i}", "cause", "failure (no memory for its record)",
                            "rank", -1, "node", -1);
    cause = json_string_value(json_object_get(failure, "cause"));
    /* A cancel right after a rank's death by the cancel's own signal (cancel.h): the
     * scheduler's signal reached the rank first, and the job was cancelled, not failed. */
    if (l->first_failure && l->state != JOB_FINISHED && !strcmp(outcome, "cancelled") &&
        strcmp(l->outcome, "cancelled") &&
        cancel_explains((int)json_integer_value(json_object_get(l->first_failure, "signal")),
                        l->t_abort, now_ms(l))) {
        log_warn("job cancelled: %s (before it, %s: the cancel's signal)",
                 cause && !strncmp(cause, "cancelled: ", 11) ? cause + 11
                 : cause                                     ? cause
                                                             : "?",
                 json_string_value(json_object_get(l->first_failure, "cause")));
        json_decref(l->first_failure);
        l->first_failure = failure;
        l->status = status;
        l->outcome = outcome;
        l->restartable = false;
        l->failure_pending = false;
        l->failure_class = -1;
        return;
    }
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
     * restart will follow (leader_check_end) ends a generation, not the job: a warning, and the
     * job's failure only if the job ends on it after all (leader_finish). */
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
    leader_broadcast(l, msg);
}

struct spares_fleet leader_fleet(const struct leader *l, struct spares_node *nodes)
{
    for (int i = 0; i < l->nphys; i++) {
        const struct node *n = &l->nodes[i];
        nodes[i] = (struct spares_node){.slot = n->slot,
                                        .fit = n->joined && n->conn && !n->lost && !n->fenced,
                                        .lost = n->lost,
                                        .preflight = n->preflight[0] != '\0'};
    }
    return (struct spares_fleet){
        .nodes = nodes, .nphys = l->nphys, .nnodes = l->spec->nnodes, .slot_node = l->slot_node};
}

void leader_swap(struct leader *l, const struct spares_swap *w, int generation, const char *why,
                 const char *cause)
{
    struct node *b = &l->nodes[w->node], *n = &l->nodes[w->spare];

    b->slot = -1;
    b->fenced = true;
    if (b->conn && !b->lost)
        peer_send(&b->conn->peer, proto_pack("{s:s, s:i}", "type", "finish", "status", 0));
    n->slot = w->slot;
    n->rank_base = w->slot * l->spec->nprocs;
    l->slot_node[w->slot] = w->spare;
    log_warn("node %d ('%s') fenced: %s; spare node %d ('%s') took its place", w->node, b->hostname,
             why, w->spare, n->hostname);
    json_array_append_new(l->swaps,
                          json_pack("{s:i, s:i, s:s, s:i, s:s, s:s, s:I}", "generation", generation,
                                    "node", w->node, "hostname", b->hostname, "spare", w->spare,
                                    "spare_hostname", n->hostname, "cause", cause, "at_ms",
                                    (json_int_t)(now_ms(l) - l->t_start)));
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

void leader_finish(struct leader *l)
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
    leader_broadcast(l, proto_pack("{s:s, s:i}", "type", "finish", "status", l->status));
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

/* Drops what the ranks' records own (stacks, recorded exceptions, last lines). */
static void ranks_release(struct leader *l)
{
    for (int r = 0; l->ranks && r < l->world_size; r++) {
        json_decref(l->ranks[r].stack);
        json_decref(l->ranks[r].error);
        free(l->ranks[r].last_line);
        l->ranks[r].stack = l->ranks[r].error = NULL;
        l->ranks[r].last_line = NULL;
    }
}

bool leader_spares_cover(const struct leader *l, const json_t *failure)
{
    struct spares_node *nodes = malloc((size_t)l->nphys * sizeof(*nodes));
    json_t *jn = json_object_get(failure, "node");
    bool cover;

    if (!nodes)
        return false;
    struct spares_fleet f = leader_fleet(l, nodes);
    cover = spares_cover(&f, failed_node(l, failure),
                         json_is_integer(jn) && json_integer_value(jn) == 0);
    free(nodes);
    return cover;
}

int leader_hvd_layout(struct leader *l)
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

/* Before a restart: the swaps spares_plan_restart() decides (each node the job lost, the
 * node a FAILURE_NODE or a hang names, and under --straggler-action replace a straggler's)
 * are made: the spare takes the node's slot, its ranks and its rank numbers. */
static void swap_in_spares(struct leader *l)
{
    const char *cause = json_string_value(json_object_get(l->first_failure, "cause"));
    struct spares_node *nodes = malloc((size_t)l->nphys * sizeof(*nodes));
    struct spares_swap *plan = malloc((size_t)l->spec->nnodes * sizeof(*plan));
    double *slower = NULL;
    int n = 0;

    if (l->ranks && l->spec->straggler_action == STRAGGLER_REPLACE &&
        (slower = malloc((size_t)l->world_size * sizeof(*slower))) != NULL)
        for (int r = 0; r < l->world_size; r++)
            slower[r] = l->ranks[r].slower;
    if (nodes && plan && (slower || !l->ranks || l->spec->straggler_action != STRAGGLER_REPLACE)) {
        struct spares_fleet f = leader_fleet(l, nodes);
        n = spares_plan_restart(&f, failed_node(l, l->first_failure), slower, l->spec->nprocs,
                                plan);
    } else
        log_error("cannot plan the spares' swaps: out of memory");
    for (int k = 0; k < n; k++) {
        char why[400];
        if (plan[k].cause == SPARES_STRAGGLER)
            snprintf(why, sizeof(why), "a straggler: rank %d %.0f%% slower than the median",
                     plan[k].rank, l->ranks[plan[k].rank].slower * 100);
        else
            snprintf(why, sizeof(why), "%s",
                     plan[k].cause == SPARES_NAMED && cause ? cause : "lost");
        leader_swap(l, &plan[k], l->generation + 1, why, why);
    }
    if (n > 0 && leader_hvd_layout(l) < 0)
        log_error("cannot tell horovod's rendezvous the new nodes: out of memory");
    free(nodes);
    free(plan);
    free(slower);
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
            leader_finish(l);
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
    l->store = store_new(PROTO_STORE_MAX, PROTO_STORE_KEYS_MAX, leader_on_store_ready, l);
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
        leader_fail(l, 125, "failed", false,
                    leader_classed(leader_failure_new("leader out of memory", -1, 0, "", 0, 0, ""),
                                   FAILURE_NODE));
        return;
    }
    leader_send_assign(l);
}

void leader_abandon_restart(struct leader *l)
{
    l->restartable = false;
    if (!l->restart_at)
        return;
    l->restart_at = 0;
    json_array_append_new(l->failures, l->first_failure);
    l->first_failure = NULL;
    l->failure_pending = false;
}

/* The restart once its backoff has passed (on_tick calls again until then). */
static void restart_later(struct leader *l)
{
    int64_t wait = RESTART_BACKOFF_MS;

    if (l->restart_at && leader_at_time_limit(l)) {
        leader_abandon_restart(l);
        leader_fail(l, 124, "timeout", false,
                    leader_failure_new(leader_timeout_cause(l), -1, -1, "", 0, 0, ""));
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

void leader_check_end(struct leader *l)
{
    if (l->state == JOB_RUNNING && l->exited == l->world_size)
        leader_finish(l);
    else if (l->state == JOB_ABORTING && all_nodes_done(l) && l->restartable &&
             l->generation < l->spec->max_restarts)
        restart_later(l);
    else if (l->state == JOB_ABORTING && (all_nodes_done(l) || !l->t_joined)) {
        /* Said once, where a restart was there to take: why this failure ends the job. */
        if (l->generation < l->spec->max_restarts && l->failure_class >= 0 &&
            !leader_restart_on(l, l->failure_class))
            log_warn("not restarting: a %s failure, which %s", failure_class_name(l->failure_class),
                     l->spec->spare_nodes > 0 && l->spec->restart_on == RESTART_ON_SPARES
                         ? "the spares' restarts (node and hang failures) do not cover"
                         : "--restart-on does not name");
        leader_finish(l); /* before the assign there are no ranks to wait for */
    }
}

/* The node that holds the memory checkpoints of the job's node slot (daemon/memlink.h): the
 * node serving the next slot, so that one node's loss leaves a copy of every rank's state;
 * -1 where there is none (one node, or no link). by_slot: each slot's node, or -1. */
static int mem_holder(const struct leader *l, const int *by_slot, int slot)
{
    int h = l->spec->nnodes > 1 ? by_slot[(slot + 1) % l->spec->nnodes] : -1;

    return h >= 0 && l->nodes[h].mem_port > 0 ? h : -1;
}

/* Each node's assign (fresh NULL: every node's), or in a regroup (fresh[i]: node i takes a
 * slot now) an assign to the fresh nodes and "regroup" to the others serving the job. */
static void send_assigns(struct leader *l, const bool *fresh)
{
    int nslots = l->spec->nnodes, *by_slot = calloc((size_t)nslots, sizeof(*by_slot));
    struct jtext jtext;

    jtext_init(&jtext);
    for (int s = 0; by_slot && s < nslots; s++)
        by_slot[s] = -1;
    for (int i = 0; by_slot && i < l->nphys; i++) {
        const struct node *n = &l->nodes[i];
        if (n->conn && !n->lost && !n->fenced && n->slot >= 0 && n->slot < nslots)
            by_slot[n->slot] = i;
    }
    for (int i = 0; i < l->nphys; i++) {
        struct node *n = &l->nodes[i];
        if (!n->conn || n->lost || n->fenced)
            continue;
        int h = by_slot && n->slot >= 0 ? mem_holder(l, by_slot, n->slot) : -1;
        if (fresh && !fresh[i]) {
            if (n->slot >= 0)
                peer_send(&n->conn->peer,
                          proto_pack("{s:s, s:i, s:s, s:i, s:i}", "type", "regroup", "generation",
                                     l->generation, "mem_addr", h >= 0 ? l->nodes[h].addr : "",
                                     "mem_port", h >= 0 ? l->nodes[h].mem_port : 0, "mem_node",
                                     h >= 0 ? h : -1));
            continue;
        }
        struct proto_assign as = {
            .generation = l->generation,
            .world_size = l->world_size,
            .rank_base = n->slot >= 0 ? n->rank_base : 0,
            .nnodes = l->spec->nnodes,
            .master_addr = l->advertise,
            .master_port = l->master_port,
            .hvd_port = hvd_server_port(l->hvd),
            .hvd_host = n->slot >= 0 && l->hvd && hvd_server_host(l->hvd, n->slot)
                            ? hvd_server_host(l->hvd, n->slot)
                            : "",
            .spare = n->slot < 0,
            .mem_addr = h >= 0 ? l->nodes[h].addr : "",
            .mem_port = h >= 0 ? l->nodes[h].mem_port : 0,
            .mem_node = h >= 0 ? h : -1,
        };
        jtext.len = 0;
        proto_assign_text(&jtext, &as);
        if (jtext.ok) {
            peer_send_text(&n->conn->peer, jtext.p, jtext.len);
        } else {
            peer_close(&n->conn->peer, "out of memory for its assign");
            jtext_release(&jtext);
            jtext_init(&jtext);
        }
    }
    jtext_release(&jtext);
    free(by_slot);
}

void leader_send_assign(struct leader *l)
{
    send_assigns(l, NULL);
}

bool leader_regroup(struct leader *l, int lost, json_t *failure)
{
    struct regroup_rank *ranks = calloc((size_t)l->world_size, sizeof(*ranks));
    bool *fresh = calloc((size_t)l->nphys, sizeof(*fresh));
    struct regroup_in in = {
        .lost = lost,
        .restartable = leader_restart_on(l, FAILURE_NODE) && l->generation < l->spec->max_restarts,
        .spares_cover = leader_spares_cover(l, failure),
        .aborting = l->state != JOB_RUNNING || l->first_failure != NULL,
        .ranks = ranks,
        .world_size = l->world_size,
    };
    int *old_node = malloc((size_t)l->spec->nnodes * sizeof(*old_node));
    char why[160];
    bool ok = false;

    if (!ranks || !fresh || !old_node) {
        log_error("cannot judge a regroup: out of memory");
        goto out;
    }
    for (int r = 0; r < l->world_size; r++)
        ranks[r] = (struct regroup_rank){.node = l->slot_node[r / l->spec->nprocs],
                                         .running = l->ranks[r].phase == PHASE_RUNNING,
                                         .able = l->ranks[r].regroup_ok};
    if (!regroup_decide(&in, why, sizeof(why))) {
        /* Said only where a rank asked for it: otherwise nothing was to be expected. */
        for (int r = 0; r < l->world_size; r++)
            if (l->ranks[r].regroup_ok) {
                log_info("node %d lost: no regroup in process (%s): every rank restarts", lost,
                         why);
                break;
            }
        goto out;
    }
    memcpy(old_node, l->slot_node, (size_t)l->spec->nnodes * sizeof(*old_node));
    json_object_set_new(failure, "healed", json_string("in process"));
    l->first_failure = failure;
    swap_in_spares(l);
    json_array_append_new(l->failures, l->first_failure);
    l->first_failure = NULL;
    l->generation++;
    store_free(l->store);
    l->store = store_new(PROTO_STORE_MAX, PROTO_STORE_KEYS_MAX, leader_on_store_ready, l);
    hvd_server_reset(l->hvd);
    json_object_clear(l->barriers);
    for (int s = 0; s < l->spec->nnodes; s++) {
        struct node *n = &l->nodes[l->slot_node[s]];
        if (l->slot_node[s] == old_node[s])
            continue;
        fresh[l->slot_node[s]] = true;
        n->exited = 0;
        n->done = false;
        for (int r = s * l->spec->nprocs; r < (s + 1) * l->spec->nprocs; r++) {
            struct rank *k = &l->ranks[r];
            json_decref(k->stack);
            json_decref(k->error);
            free(k->last_line);
            if (k->phase == PHASE_EXITED)
                l->exited--;
            memset(k, 0, sizeof(*k));
            proto_progress_init(&k->prog);
            k->phase = PHASE_RUNNING;
        }
    }
    l->t_generation = now_ms(l);
    log_warn("node %d lost: the ranks of the other nodes regroup in process with the spare's, "
             "as generation %d (restart %d of %d)",
             lost, l->generation, l->generation, l->spec->max_restarts);
    if (!l->store) {
        leader_fail(l, 125, "failed", false,
                    leader_classed(leader_failure_new("leader out of memory", -1, 0, "", 0, 0, ""),
                                   FAILURE_NODE));
        ok = true;
        goto out;
    }
    send_assigns(l, fresh);
    ok = true;
out:
    free(ranks);
    free(fresh);
    free(old_node);
    return ok;
}

int64_t leader_limit_origin(int64_t t_start, int64_t *epoch_ms)
{
    const char *env = getenv(JOB_START_ENV);
    struct timespec ts;
    long long start, wall;
    char *end;

    *epoch_ms = 0;
    if (!env || !*env || clock_gettime(CLOCK_REALTIME, &ts) < 0)
        return t_start;
    errno = 0;
    start = strtoll(env, &end, 10);
    wall = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    if (errno || *end || start <= 0 || wall - start < 0 || wall - start > 86400000LL) {
        log_warn("ignoring %s='%.32s': not a start in the last day", JOB_START_ENV, env);
        return t_start;
    }
    *epoch_ms = start;
    return t_start - (wall - start);
}

bool leader_at_time_limit(const struct leader *l)
{
    return l->spec->time_limit_s > 0 &&
           now_ms(l) - l->t_limit0 >= (int64_t)l->spec->time_limit_s * 1000 - TIMEOUT_SLACK_MS;
}

const char *leader_timeout_cause(const struct leader *l)
{
    static char cause[128];

    snprintf(cause, sizeof(cause), "time limit of %d s reached: the ranks were stopped",
             l->spec->time_limit_s);
    return cause;
}

void leader_check_linger(struct leader *l)
{
    if (l->state != JOB_FINISHED || l->done_called || l->summary_writing)
        return;
    if (!l->agents_open || now_ms(l) - l->t_finish > FINISH_LINGER_MS) {
        l->done_called = true;
        l->done(l, l->status, l->arg);
    }
}

void leader_log_refusals(struct leader *l, int64_t now, bool flush)
{
    char line[256];

    while (refusals_next(&l->refusals, now, flush, line, sizeof(line)))
        log_warn("%s", line);
}

void leader_release(struct leader *l)
{
    store_free(l->store);
    auth_seen_release(&l->seen);
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

void leader_maybe_free(struct leader *l)
{
    if (!l->closing || l->handles_open > 0 || l->conns || l->summary_writing)
        return;
    leader_log_refusals(l, 0, true);
    leader_release(l);
}

/* s with every byte outside printable ASCII (and newlines) as '?': for text that failed to
 * make a JSON string, so that the failure's record is never lost. New; caller frees. */
static char *ascii_copy(const char *s)
{
    char *c = strdup(s ? s : "");

    for (char *p = c; p && *p; p++)
        if ((unsigned char)*p >= 0x7f || ((unsigned char)*p < 0x20 && *p != '\n'))
            *p = '?';
    return c;
}

static json_t *failure_pack(const char *cause, int rank, int node, const char *host, int code,
                            int sig, const char *tail)
{
    char sn[SIGNAME_LEN];

    return json_pack("{s:s, s:i, s:i, s:s, s:i, s:i, s:s, s:s}", "cause", cause, "rank", rank,
                     "node", node, "hostname", host ? host : "", "code", code, "signal", sig,
                     "signal_name", sig ? signame(sig, sn) : "", "tail", tail ? tail : "");
}

/* A failure's record. Text that is not UTF-8 (a rank's output cut mid-character, say) is
 * kept as ASCII: a missing record would read as a job that succeeded. */
json_t *leader_failure_new(const char *cause, int rank, int node, const char *host, int code,
                           int sig, const char *tail)
{
    json_t *f = failure_pack(cause, rank, node, host, code, sig, tail);
    char *c, *h, *t;

    if (f)
        return f;
    c = ascii_copy(cause);
    h = ascii_copy(host);
    t = ascii_copy(tail);
    if (c && h && t)
        f = failure_pack(c, rank, node, h, code, sig, t);
    free(c);
    free(h);
    free(t);
    return f;
}

/* summary.json being written by libuv's thread pool. */
struct summary_write {
    uv_work_t req;
    struct leader *l;
    char path[PATH_MAX];
    char *text;
    size_t len;
    int ret;
};

/* On a pool thread: fs_write_atomic's fsyncs, which on a busy disk take seconds (strace's
 * delay on fsync of 3 s each: a 2-node job whose ranks all succeeded failed, node 1 having
 * lost the leader while its loop waited on summary.json's two fsyncs). */
static void on_summary_work(uv_work_t *req)
{
    struct summary_write *w = req->data;

    w->ret = fs_write_atomic(w->path, w->text, w->len, 0600);
}

static void on_summary_written(uv_work_t *req, int status)
{
    struct summary_write *w = req->data;
    struct leader *l = w->l;

    if (status == 0 && w->ret < 0)
        log_error("cannot write '%s': %s", w->path, strerror(-w->ret));
    free(w->text);
    free(w);
    l->summary_writing = false;
    if (!l->closing)
        leader_check_linger(l);
    leader_maybe_free(l);
}

/* Writes text (stolen) to path off the loop, so that the loop keeps answering heartbeats
 * meanwhile; the leader is done only once it is written (leader_check_linger). In place if the
 * pool cannot take it. */
static void write_summary_text(struct leader *l, const char *path, char *text, size_t len)
{
    struct summary_write *w = calloc(1, sizeof(*w));
    int ret;

    if (w) {
        w->l = l;
        w->text = text;
        w->len = len;
        w->req.data = w;
        snprintf(w->path, sizeof(w->path), "%s", path);
        if (uv_queue_work(l->loop, &w->req, on_summary_work, on_summary_written) == 0) {
            l->summary_writing = true;
            return;
        }
        free(w);
    }
    ret = fs_write_atomic(path, text, len, 0600);
    if (ret < 0)
        log_error("cannot write '%s': %s", path, strerror(-ret));
    free(text);
}

/* summary.json, written off the loop. */
void leader_write_summary(struct leader *l)
{
    char path[PATH_MAX], *text;
    size_t len;

    if (!l->job_dir)
        return;
    text = leader_summary_text(l, &len);
    if (!text) {
        log_error("cannot write 'summary.json': out of memory");
        return;
    }
    snprintf(path, sizeof(path), "%s/summary.json", l->job_dir);
    write_summary_text(l, path, text, len);
}
