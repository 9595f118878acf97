/* What the leader tells: the status view (a JSON object: the job, its nodes and ranks, the
 * loss history, restarts, spares and swaps, stragglers, earlier failures and segments; for
 * summary.json also the outcome, the first failure, the timings and every rank's stack and
 * exception) and summary.json's text. gpurun status
 * (client/view.c) reads exactly this; a key added here is a key of that contract. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "jtext.h"
#include "fsutil.h"
#include "leader_int.h"
#include "log.h"
#include "signame.h"
#include "utf8.h"
#include "banned.h"

static const char *const phase_names[] = {"pending", "joined", "running", "exited", "lost"};
static const char *const state_names[] = {"joining", "running", "aborting", "finished"};

/* Rank 0's loss at a step it had not reported before; a loss that is not finite is left out. */
void leader_history_add(struct leader *l, int64_t step, double loss)
{
    int last = (l->hist_next + LOSS_HISTORY - 1) % LOSS_HISTORY;

    if (!isfinite(loss) || (l->hist_n && step <= l->hist_step[last]))
        return;
    l->hist_step[l->hist_next] = step;
    l->hist_loss[l->hist_next] = loss;
    l->hist_next = (l->hist_next + 1) % LOSS_HISTORY;
    if (l->hist_n < LOSS_HISTORY)
        l->hist_n++;
}

/* [[step, loss], ...], oldest first. */
static json_t *history_view(const struct leader *l)
{
    json_t *a = json_array();
    int first = l->hist_n < LOSS_HISTORY ? 0 : l->hist_next;

    for (int i = 0; a && i < l->hist_n; i++) {
        int k = (first + i) % LOSS_HISTORY;
        json_array_append_new(a, json_pack("[I, f]", (json_int_t)l->hist_step[k], l->hist_loss[k]));
    }
    return a;
}

/* What the summary of an earlier segment says of its end, for status: [{"segment", "outcome",
 * "exit_status", "cause", "total_ms", "fenced" (the hostnames of the nodes it fenced; absent:
 * none)}, ...], one per requeue, oldest first. A segment
 * without its summary (its leader never wrote one: killed, or its node lost) says so. */
json_t *leader_segments_load(const char *job_dir, int requeues)
{
    json_t *out = json_array();

    for (int k = 0; out && job_dir && k < requeues; k++) {
        char path[PATH_MAX], cause[256];
        json_t *s, *pre, *ff, *seg, *n;
        const char *outcome;
        size_t i;
        json_int_t status;

        snprintf(path, sizeof(path), "%.4000s/segments/%d.json", job_dir, k);
        s = json_load_file(path, 0, NULL);
        if (!json_is_object(s)) {
            json_decref(s);
            json_array_append_new(out, json_pack("{s:i, s:s, s:s}", "segment", k, "outcome",
                                                 "unknown", "cause",
                                                 "no summary: its daemons were killed or lost"));
            continue;
        }
        outcome = json_string_value(json_object_get(s, "outcome"));
        outcome = outcome ? outcome : "unknown";
        status = json_integer_value(json_object_get(s, "exit_status"));
        pre = json_object_get(s, "preempt_signal");
        ff = json_object_get(s, "first_failure");
        if (json_is_object(pre) && status == 0)
            snprintf(cause, sizeof(cause),
                     "the ranks checkpointed on the pre-timeout signal %d and ended",
                     (int)json_integer_value(json_object_get(pre, "signal")));
        else if (!strcmp(outcome, "cancelled"))
            snprintf(cause, sizeof(cause), "stopped by Slurm (preempted), exit status %d",
                     (int)status);
        else if (json_is_object(ff) && json_is_string(json_object_get(ff, "cause")))
            snprintf(cause, sizeof(cause), "%s: %s", outcome,
                     json_string_value(json_object_get(ff, "cause")));
        else
            snprintf(cause, sizeof(cause), "%s, exit status %d", outcome, (int)status);
        seg = json_pack(
            "{s:i, s:s, s:I, s:s, s:I}", "segment", k, "outcome", outcome, "exit_status", status,
            "cause", cause, "total_ms",
            json_integer_value(json_object_get(json_object_get(s, "timings"), "total_ms")));
        /* The hosts of the nodes it fenced: never used again by the job. */
        json_array_foreach(json_object_get(s, "nodes"), i, n)
        {
            const char *st = json_string_value(json_object_get(n, "state"));
            json_t *h = json_object_get(n, "hostname");
            if (seg && st && !strcmp(st, "fenced") && json_is_string(h)) {
                if (!json_object_get(seg, "fenced"))
                    json_object_set_new(seg, "fenced", json_array());
                json_array_append(json_object_get(seg, "fenced"), h);
            }
        }
        json_array_append_new(out, seg);
        json_decref(s);
    }
    return out;
}

/* failure with its class: "class" in the record, and whether --restart-on restarts it. */
json_t *leader_classed(json_t *failure, int cls)
{
    if (failure)
        json_object_set_new(failure, "class", json_string(failure_class_name(cls)));
    return failure;
}

json_t *leader_rank_view(const struct leader *l, int r, bool detail)
{
    const struct rank *k = &l->ranks[r];
    json_t *v;

    v = json_pack("{s:i, s:i, s:s, s:I, s:i, s:i, s:b, s:b, s:b}", "rank", r, "node", node_of(l, r),
                  "phase", phase_names[k->phase], "report_age_ms",
                  (json_int_t)(k->report_ms ? now_ms(l) - k->report_ms : -1), "code", k->code,
                  "signal", k->signal, "oom", k->oom, "killed", k->killed, "reported",
                  k->report_ms != 0);
    /* Its last report (what it did not report, or has not yet, stays out: unknown, not 0). */
    if (v && proto_progress_pack(v, &k->prog) < 0) {
        json_decref(v);
        v = NULL;
    }
    /* Liveness for scripts that do not report: the last line and how long ago output came. */
    if (v) {
        json_object_set_new(v, "output_age_ms",
                            json_integer(k->output_ms ? now_ms(l) - k->output_ms : -1));
        /* A status reply is one frame (1 MiB): there the line is cut to STATUS_LINE_MAX
         * bytes and left out past STATUS_LINES_RANKS ranks; summary.json has it whole. */
        if (k->last_line && k->last_line[0] && (detail || l->world_size <= STATUS_LINES_RANKS))
            json_object_set_new(
                v, "last_line",
                json_stringn(k->last_line, detail
                                               ? strlen(k->last_line)
                                               : utf8_prefix_len(k->last_line, STATUS_LINE_MAX)));
    }
    /* Its time per step, and how much slower than the median where it straggles. */
    if (v && k->step_avg_steps > 0)
        json_object_set_new(v, "step_seconds", json_real(k->step_avg));
    if (v && k->slower > 0)
        json_object_set_new(v, "slower", json_real(k->slower));
    /* Where its state came from, where a memory checkpoint gave it. */
    if (v && k->loaded_from[0])
        json_object_update_new(v, json_pack("{s:s, s:I}", "state_from", k->loaded_from,
                                            "state_step", (json_int_t)k->loaded_step));
    /* Steps per second since its first report: the ETA's rate. */
    if (v && k->report_ms > k->first_ms && k->prog.step > k->first_step)
        json_object_set_new(v, "steps_per_s",
                            json_real((double)(k->prog.step - k->first_step) * 1000 /
                                      (double)(k->report_ms - k->first_ms)));
    /* Stacks and exceptions go to summary.json only: with many ranks they would not fit a
     * status reply's frame (the first failure's, the one that matters, is in both). */
    if (v && detail && k->stack)
        json_object_set(v, "stack", k->stack);
    if (v && detail && k->error)
        json_object_set(v, "error", k->error);
    return v;
}

/* Written as text (lib/jtext.h) rather than built as a tree and dumped: at a large job's end
 * the lines of 100,000 ranks were most of the leader's work after the barrier. */
void leader_rank_line(const struct leader *l, int r, struct jtext *t)
{
    const struct rank *k = &l->ranks[r];
    int64_t now = now_ms(l);

    jtext_raw(t, "{", 1);
    jtext_key(t, "rank", true);
    jtext_int(t, r);
    jtext_key(t, "node", false);
    jtext_int(t, node_of(l, r));
    jtext_key(t, "phase", false);
    jtext_str(t, phase_names[k->phase], strlen(phase_names[k->phase]));
    jtext_key(t, "report_age_ms", false);
    jtext_int(t, k->report_ms ? now - k->report_ms : -1);
    jtext_key(t, "code", false);
    jtext_int(t, k->code);
    jtext_key(t, "signal", false);
    jtext_int(t, k->signal);
    jtext_key(t, "oom", false);
    jtext_bool(t, k->oom);
    jtext_key(t, "killed", false);
    jtext_bool(t, k->killed);
    jtext_key(t, "reported", false);
    jtext_bool(t, k->report_ms != 0);
    proto_progress_text(t, &k->prog);
    jtext_key(t, "output_age_ms", false);
    jtext_int(t, k->output_ms ? now - k->output_ms : -1);
    if (k->last_line && k->last_line[0]) {
        jtext_key(t, "last_line", false);
        jtext_str(t, k->last_line, strlen(k->last_line));
    }
    if (k->step_avg_steps > 0) {
        jtext_key(t, "step_seconds", false);
        jtext_real(t, k->step_avg);
    }
    if (k->slower > 0) {
        jtext_key(t, "slower", false);
        jtext_real(t, k->slower);
    }
    if (k->loaded_from[0]) {
        jtext_key(t, "state_from", false);
        jtext_str(t, k->loaded_from, strlen(k->loaded_from));
        jtext_key(t, "state_step", false);
        jtext_int(t, k->loaded_step);
    }
    if (k->report_ms > k->first_ms && k->prog.step > k->first_step) {
        jtext_key(t, "steps_per_s", false);
        jtext_real(t, (double)(k->prog.step - k->first_step) * 1000 /
                          (double)(k->report_ms - k->first_ms));
    }
    if (k->stack) {
        jtext_key(t, "stack", false);
        jtext_json(t, k->stack);
    }
    if (k->error) {
        jtext_key(t, "error", false);
        jtext_json(t, k->error);
    }
    jtext_raw(t, "}", 1);
}

/* The stragglers (check_stragglers) for status and summary.json: the slowest first, at most
 * STRAGGLERS_SHOWN. */
static json_t *stragglers_view(const struct leader *l)
{
    json_t *arr = json_array();
    bool *taken;

    if (!arr || !l->ranks)
        return arr;
    taken = calloc((size_t)l->world_size, sizeof(*taken));
    for (int shown = 0; taken && shown < STRAGGLERS_SHOWN; shown++) {
        int best = -1;
        for (int r = 0; r < l->world_size; r++)
            if (!taken[r] && l->ranks[r].slower > 0 &&
                (best < 0 || l->ranks[r].slower > l->ranks[best].slower))
                best = r;
        if (best < 0)
            break;
        taken[best] = true;
        int node = node_of(l, best);
        json_array_append_new(arr, json_pack("{s:i, s:i, s:s, s:f, s:f, s:I}", "rank", best, "node",
                                             node, "hostname", l->nodes[node].hostname, "slower",
                                             l->ranks[best].slower, "step_seconds",
                                             l->ranks[best].step_avg, "steps",
                                             (json_int_t)l->ranks[best].step_avg_steps));
    }
    free(taken);
    return arr;
}

static const char *node_state(const struct leader *l, const struct node *n)
{
    return n->fenced                    ? "fenced"
           : n->lost                    ? "lost"
           : n->done                    ? "done"
           : !n->joined                 ? "pending"
           : n->slot < 0 && l->t_joined ? "spare"
                                        : "joined";
}

static json_int_t node_hb_age(const struct node *n, int64_t t)
{
    return (json_int_t)(n->conn ? t - n->conn->peer.last_rx_ms : -1);
}

/* Node i's entry of the view: its state, heartbeat, slot and what its pre-flight found. */
json_t *leader_node_view(const struct leader *l, int i, int64_t t)
{
    const struct node *n = &l->nodes[i];
    json_t *nv = json_pack("{s:i, s:s, s:s, s:i, s:s, s:I, s:i}", "node", i, "hostname",
                           n->hostname, "addr", n->addr, "nprocs", n->nprocs, "state",
                           node_state(l, n), "hb_age_ms", node_hb_age(n, t), "slot", n->slot);

    /* The pre-flight checks' findings: the one it failed, its link as timed. */
    if (nv && n->preflight[0])
        json_object_set_new(nv, "preflight", json_string(n->preflight));
    if (nv && n->preflight_skipped[0])
        json_object_set_new(nv, "preflight_skipped", json_string(n->preflight_skipped));
    if (nv && n->link_mbit > 0)
        json_object_set_new(nv, "link_mbit", json_real(round(n->link_mbit * 10) / 10));
    return nv;
}

/* leader_node_view()'s compact dump, written as text as the ranks' lines are: 12,500 nodes'
 * trees, dumped with indentation, were a third of a large job's summary. The batch script
 * (client/sbatch.c) reads a node given up from it: "state":"lost" or "fenced". */
void leader_node_line(const struct leader *l, int i, int64_t t, struct jtext *j)
{
    const struct node *n = &l->nodes[i];
    const char *st = node_state(l, n);

    jtext_raw(j, "{", 1);
    jtext_key(j, "node", true);
    jtext_int(j, i);
    jtext_key(j, "hostname", false);
    jtext_str(j, n->hostname, strlen(n->hostname));
    jtext_key(j, "addr", false);
    jtext_str(j, n->addr, strlen(n->addr));
    jtext_key(j, "nprocs", false);
    jtext_int(j, n->nprocs);
    jtext_key(j, "state", false);
    jtext_str(j, st, strlen(st));
    jtext_key(j, "hb_age_ms", false);
    jtext_int(j, node_hb_age(n, t));
    jtext_key(j, "slot", false);
    jtext_int(j, n->slot);
    if (n->preflight[0]) {
        jtext_key(j, "preflight", false);
        jtext_str(j, n->preflight, strlen(n->preflight));
    }
    if (n->preflight_skipped[0]) {
        jtext_key(j, "preflight_skipped", false);
        jtext_str(j, n->preflight_skipped, strlen(n->preflight_skipped));
    }
    if (n->link_mbit > 0) {
        jtext_key(j, "link_mbit", false);
        jtext_real(j, round(n->link_mbit * 10) / 10);
    }
    jtext_raw(j, "}", 1);
}

/* detail: every rank's stack and exception (summary.json; too large for a status reply), and
 * no "nodes" nor "ranks": leader_summary_text() adds them one line at a time, so that 100,000
 * ranks never stand as one tree of JSON objects (160 MiB) beside their text. */
json_t *leader_job_view(struct leader *l, bool for_summary, bool detail)
{
    json_t *nodes = json_array(), *ranks = json_array(), *job;
    int64_t t = now_ms(l);

    for (int i = 0; i < l->nphys && !detail; i++)
        json_array_append_new(nodes, leader_node_view(l, i, t));
    for (int r = 0; r < l->world_size && !detail; r++)
        json_array_append_new(ranks, leader_rank_view(l, r, detail));
    job = json_pack("{s:s, s:s, s:i, s:i, s:o, s:o}", "job_id", l->spec->job_id, "state",
                    state_names[l->state], "world_size", l->world_size, "nnodes", l->spec->nnodes,
                    "nodes", nodes, "ranks", ranks);
    json_object_set_new(job, "loss_history", history_view(l));
    /* Live and in the summary: a completed job may have failed and been restarted. */
    json_object_set_new(job, "restarts", json_integer(l->generation));
    if (l->spec->spare_nodes > 0) {
        json_object_set_new(job, "spare_nodes", json_integer(l->spec->spare_nodes));
        json_object_set(job, "swaps", l->swaps);
        if (l->idle_why[0])
            json_object_set_new(job, "spares_idle_why", json_string(l->idle_why));
    }
    if (l->spec->straggler_pct > 0)
        json_object_set_new(job, "stragglers", stragglers_view(l));
    if (l->requeues > 0) {
        json_object_set_new(job, "requeues", json_integer(l->requeues));
        json_object_set(job, "segments", l->segments);
    }
    if (for_summary || json_array_size(l->failures) <= LIVE_FAILURES_MAX) {
        json_object_set(job, "earlier_failures", l->failures);
    } else {
        /* The newest only: a status reply must stay far below a frame's 1 MiB. */
        json_t *recent = json_array();
        for (size_t i = json_array_size(l->failures) - LIVE_FAILURES_MAX;
             recent && i < json_array_size(l->failures); i++)
            json_array_append(recent, json_array_get(l->failures, i));
        json_object_set_new(job, "earlier_failures", recent ? recent : json_array());
    }
    if (for_summary) {
        json_t *timings =
            json_pack("{s:I, s:I, s:I}", "rendezvous_ms",
                      (json_int_t)(l->t_joined ? l->t_joined - l->t_start : -1), "first_step_ms",
                      (json_int_t)(l->t_first_step ? l->t_first_step - l->t_start : -1), "total_ms",
                      (json_int_t)(t - l->t_start));
        /* The batch script's first command (gpurun's start under --local), to the ms: the
         * job dir's file times have the kernel's tick (4 ms on many). */
        if (timings && l->started_epoch_ms > 0)
            json_object_set_new(timings, "script_started_ms", json_integer(l->started_epoch_ms));
        json_object_set_new(job, "outcome", json_string(l->outcome));
        if (l->world_size > 1)
            json_object_set_new(job, "ranks_met", json_boolean(l->met));
        if (l->alone)
            json_object_set_new(job, "alone", json_string(l->alone));
        json_object_set_new(job, "exit_status", json_integer(l->status));
        json_object_set(job, "first_failure", l->first_failure ? l->first_failure : json_null());
        json_object_set_new(job, "timings", timings);
        /* Whether the job was told its time was nearly up: a job that then completes stopped
         * early, on purpose. */
        if (l->t_preempt)
            json_object_set_new(job, "preempt_signal",
                                json_pack("{s:i, s:I}", "signal", l->preempt_sig, "at_ms",
                                          (json_int_t)(l->t_preempt - l->t_start)));
    }
    return job;
}

/* summary.json's text: the job as leader_job_view() shows it, then its nodes and its ranks,
 * one line each. */
char *leader_summary_text(struct leader *l, size_t *n)
{
    struct jtext t;
    json_t *job;
    char *head, *end;
    int64_t now = now_ms(l);

    job = leader_job_view(l, true, true);
    json_object_del(job, "nodes");
    json_object_del(job, "ranks");
    head = job ? json_dumps(job, JSON_INDENT(2)) : NULL;
    json_decref(job);
    end = head ? strrchr(head, '}') : NULL;
    if (!end) {
        free(head);
        return NULL;
    }
    jtext_init(&t);
    jtext_raw(&t, head, (size_t)(end - head));
    free(head);
    while (t.len && (t.p[t.len - 1] == '\n' || t.p[t.len - 1] == ' '))
        t.len--;
    jtext_lit(&t, ",\n  \"nodes\": [");
    for (int i = 0; t.ok && i < l->nphys; i++) {
        jtext_lit(&t, i ? ",\n    " : "\n    ");
        leader_node_line(l, i, now, &t);
    }
    jtext_lit(&t, l->nphys ? "\n  ],\n  \"ranks\": [" : "],\n  \"ranks\": [");
    for (int r = 0; t.ok && r < l->world_size; r++) {
        jtext_lit(&t, r ? ",\n    " : "\n    ");
        leader_rank_line(l, r, &t);
    }
    jtext_lit(&t, l->world_size ? "\n  ]\n}\n" : "]\n}\n");
    if (!t.ok) {
        jtext_release(&t);
        return NULL;
    }
    *n = t.len;
    return t.p;
}
