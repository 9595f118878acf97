/* What the leader's tick watches while the ranks run: hangs (hang.h's rule), stragglers
 * (stragglers.h's), a job whose every node is lost, and the batch script's pre-timeout
 * request. Each words what its rule found and acts on it. */
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsutil.h"
#include "leader_int.h"
#include "log.h"
#include "metrics.h"
#include "signame.h"
#include "stragglers.h"
#include "utf8.h"
#include "banned.h"

/* The pre-timeout signal to every agent, which hands it to the ranks that asked for it. */
static void send_preempt(struct leader *l, int sig)
{
    char sn[SIGNAME_LEN];

    log_info("pre-timeout signal %s: to the ranks that asked for it", signame(sig, sn));
    if (!l->t_preempt) {
        l->t_preempt = now_ms(l);
        l->preempt_sig = sig;
    }
    leader_broadcast(l, proto_pack("{s:s, s:i}", "type", "signal", "signal", sig));
}

void leader_poll_preempt(struct leader *l, int64_t now)
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

void leader_check_stragglers(struct leader *l, int64_t now)
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
    if (b->last_line && b->last_line[0])
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

void leader_check_hang(struct leader *l, int64_t now)
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
    leader_fail(
        l, 124, "hung", leader_restart_on(l, FAILURE_HANG),
        leader_classed(leader_failure_new(cause, v.rank, node, l->nodes[node].hostname, 0, 0, ""),
                       FAILURE_HANG));
}

void leader_check_all_lost(struct leader *l, int64_t now)
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
    leader_fail(l, 125, "failed", false,
                leader_classed(leader_failure_new(cause, -1, 0, l->nodes[0].hostname, 0, 0, ""),
                               FAILURE_NODE));
}
