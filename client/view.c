/* Building and printing a job's status view. Every number a person sees is taken from the
 * JSON view, so that --json and the text say the same; the text only formats. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "proto.h"
#include "status.h"
#include "utf8.h"
#include "view.h"
#include "signame.h"
#include "banned.h"

/* --- building ------------------------------------------------------------------------------ */

static json_t *str_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

static json_t *time_or_null(time_t t)
{
    return t > 0 ? json_integer((json_int_t)t) : json_null();
}

static json_t *slurm_json(const struct slurmlib_job *j)
{
    json_t *o = json_object(), *nodes = json_array();

    for (int i = 0; i < j->n_nodes && j->nodes; i++)
        json_array_append_new(nodes, json_string(j->nodes[i]));
    json_object_set_new(o, "state", json_string(slurmlib_state_name(j->state)));
    json_object_set_new(o, "completing", json_boolean(j->completing));
    json_object_set_new(o, "reason", str_or_null(j->reason));
    json_object_set_new(o, "name", str_or_null(j->name));
    json_object_set_new(o, "partition", str_or_null(j->partition));
    json_object_set_new(o, "nodelist", str_or_null(j->nodelist));
    json_object_set_new(o, "nodes", nodes);
    json_object_set_new(o, "num_nodes", json_integer(j->n_nodes));
    json_object_set_new(o, "batch_host", str_or_null(j->batch_host));
    json_object_set_new(o, "submit_time", time_or_null(j->submit_time));
    json_object_set_new(o, "start_time", time_or_null(j->start_time));
    json_object_set_new(o, "end_time", time_or_null(j->end_time));
    json_object_set_new(o, "elapsed_s", json_integer(j->elapsed_s));
    json_object_set_new(o, "time_limit_s",
                        j->time_limit_min > 0 ? json_integer(j->time_limit_min * 60) : json_null());
    json_object_set_new(o, "exit_code",
                        j->exit_code >= 0 ? json_integer(j->exit_code) : json_null());
    json_object_set_new(o, "exit_signal",
                        j->exit_signal ? json_integer(j->exit_signal) : json_null());
    json_object_set_new(o, "output", str_or_null(j->std_out));
    json_object_set_new(o, "requeues", json_integer(j->requeues));
    return o;
}

/* Reads DIR/NAME as JSON; NULL when it is missing or unreadable. */
static json_t *load_file(const char *dir, const char *name)
{
    char path[PATH_MAX];
    json_error_t je;

    if (snprintf(path, sizeof(path), "%s/%s", dir, name) >= (int)sizeof(path))
        return NULL;
    return json_load_file(path, 0, &je);
}

/* The modification time of DIR/NAME in seconds since the epoch, or 0. */
static double mtime_of(const char *dir, const char *name)
{
    char path[PATH_MAX];
    struct stat st;

    if (snprintf(path, sizeof(path), "%s/%s", dir, name) >= (int)sizeof(path) ||
        stat(path, &st) < 0)
        return 0;
    return (double)st.st_mtim.tv_sec + st.st_mtim.tv_nsec / 1e9;
}

/* A rank's progress record of a status view (unknown where the view's is bad: a newer
 * leader's, or a hand-edited summary, must not stop the view). */
static struct proto_progress rank_progress(const json_t *r)
{
    struct proto_progress p;
    struct errmsg err;

    if (proto_progress_unpack(r, false, &p, &err) < 0)
        proto_progress_init(&p);
    return p;
}

/* Counts of phases, the step range, the mean loss and the total rate of a ranks array; the
 * total steps are the ranks' own (gpurun.report(total_steps=...), gr_progress.total_steps,
 * gpurun-train's train.steps): the first rank's that reported one, else none. */
static json_t *progress_json(const json_t *ranks)
{
    long counts[4] = {0, 0, 0, 0}, smin = LONG_MAX, smax = -1, total = 0;
    static const char *const phases[4] = {"pending", "joined", "running", "exited"};
    double loss = 0, tps = 0, rate = 0;
    int nloss = 0, ntps = 0;
    size_t i;
    json_t *r, *o;

    if (!json_is_array(ranks) || json_array_size(ranks) == 0)
        return json_null();
    json_array_foreach(ranks, i, r)
    {
        const char *ph = json_string_value(json_object_get(r, "phase"));
        struct proto_progress p = rank_progress(r);
        long step = (long)p.step;
        double l = p.loss;
        for (int k = 0; k < 4; k++)
            if (ph && !strcmp(ph, phases[k]))
                counts[k]++;
        if (step < smin)
            smin = step;
        if (step > smax)
            smax = step;
        if (step > 0 && isfinite(l)) {
            loss += l;
            nloss++;
        }
        if (ph && !strcmp(ph, "running")) {
            double sps = json_number_value(json_object_get(r, "steps_per_s"));
            if (isfinite(p.tokens_per_s)) {
                tps += p.tokens_per_s;
                ntps++;
            }
            /* The job goes as fast as its slowest running rank. */
            if (sps > 0 && (rate == 0 || sps < rate))
                rate = sps;
        }
        if (total <= 0 && p.total_steps > 0)
            total = (long)p.total_steps;
    }
    o = json_pack("{s:i, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:o}", "ranks",
                  (int)json_array_size(ranks), "pending", (json_int_t)counts[0], "joined",
                  (json_int_t)counts[1], "running", (json_int_t)counts[2], "exited",
                  (json_int_t)counts[3], "step_min", (json_int_t)smin, "step_max", (json_int_t)smax,
                  "steps_total", total > 0 ? json_integer(total) : json_null(), "loss_mean",
                  nloss ? json_real(loss / nloss) : json_null(), "tokens_per_s",
                  ntps ? json_real(tps) : json_null());
    /* The time left at the slowest rank's rate, from the slowest rank's step. */
    if (o && total > smin && rate > 0)
        json_object_set_new(o, "eta_s", json_real((double)(total - smin) / rate));
    return o;
}

/* The phase timeline: absolute times where known, and the durations between them. Slurm's
 * times have whole seconds; summary.json's script_started_ms is the batch script's first
 * command (gpurun --local's start) to the millisecond; the job dir's files give the rest to
 * the kernel's tick: the key is the first thing the batch script (or gpurun --local) writes,
 * endpoint.json the leader's first act once it listens. */
static json_t *timings_json(const struct view_input *in, const json_t *summary)
{
    const json_t *t = json_object_get(summary, "timings");
    double submitted = 0, allocated = 0, started = 0, up = 0, rdv = 0, first = 0, ended = 0;
    json_int_t rdv_ms = json_integer_value(json_object_get(t, "rendezvous_ms"));
    json_int_t first_ms = json_integer_value(json_object_get(t, "first_step_ms"));
    json_int_t total_ms = json_integer_value(json_object_get(t, "total_ms"));
    json_t *o = json_object(), *d = json_object();

    if (in->slurm) {
        submitted = (double)in->slurm->submit_time;
        allocated = (double)in->slurm->start_time;
    }
    if (in->job_dir) {
        started = mtime_of(in->job_dir, "key");
        up = mtime_of(in->job_dir, "endpoint.json");
    }
    if (json_integer_value(json_object_get(t, "script_started_ms")) > 0)
        started = (double)json_integer_value(json_object_get(t, "script_started_ms")) / 1000.0;
    if (up > 0 && json_is_object(t)) {
        if (rdv_ms >= 0 && json_object_get(t, "rendezvous_ms"))
            rdv = up + rdv_ms / 1000.0;
        if (first_ms >= 0 && json_object_get(t, "first_step_ms"))
            first = up + first_ms / 1000.0;
        if (total_ms > 0)
            ended = up + total_ms / 1000.0;
    }
    if (!ended && in->slurm && in->slurm->end_time)
        ended = (double)in->slurm->end_time;
#define AT(name, v) json_object_set_new(o, name, (v) > 0 ? json_real(v) : json_null())
    AT("submitted", submitted);
    AT("allocated", allocated);
    AT("script_started", started);
    AT("daemons_up", up);
    AT("rendezvous_done", rdv);
    AT("first_step", first);
    AT("ended", ended);
#undef AT
#define SPAN(name, a, b)                                                                           \
    json_object_set_new(d, name, (a) > 0 && (b) >= (a) ? json_real((b) - (a)) : json_null())
    SPAN("queued_s", submitted, allocated);
    SPAN("startup_s", started, up);
    SPAN("rendezvous_s", up, rdv);
    SPAN("first_step_s", rdv, first);
    SPAN("run_s", up, ended);
#undef SPAN
    json_object_set_new(o, "durations", d);
    return o;
}

/* The job's name: Slurm's while it knows the job, else the one gpurun wrote in job.json (a
 * local job's, or a Slurm job's that Slurm has forgotten); null when neither has one. */
static json_t *name_json(const struct view_input *in)
{
    json_t *spec, *name = NULL;

    if (in->slurm && in->slurm->name)
        return json_string(in->slurm->name);
    if (!in->job_dir)
        return json_null();
    spec = load_file(in->job_dir, "job.json");
    if (json_is_string(json_object_get(spec, "name")))
        name = json_string(json_string_value(json_object_get(spec, "name")));
    json_decref(spec);
    return name ? name : json_null();
}

bool view_local_leader_alive(const char *dir)
{
    json_t *ep = load_file(dir, "endpoint.json");
    const char *host = json_string_value(json_object_get(ep, "host"));
    json_int_t pid = json_integer_value(json_object_get(ep, "pid"));
    bool alive = host && !strcmp(host, "127.0.0.1") && pid > 0 && kill((pid_t)pid, 0) == 0;

    json_decref(ep);
    return alive;
}

/* Whether the leader of a job on this machine is known to be dead: its endpoint.json is on
 * loopback and names a process that no longer exists. */
static bool local_leader_dead(const char *dir)
{
    json_t *ep = load_file(dir, "endpoint.json");
    const char *host = json_string_value(json_object_get(ep, "host"));
    json_int_t pid = json_integer_value(json_object_get(ep, "pid"));
    bool dead =
        host && !strcmp(host, "127.0.0.1") && pid > 0 && kill((pid_t)pid, 0) < 0 && errno == ESRCH;

    json_decref(ep);
    return dead;
}

static json_t *elapsed_json(const struct view_input *in, const json_t *timings, const char *state);

json_t *view_build(const struct view_input *in)
{
    json_t *v = json_object(), *summary = NULL, *live = NULL, *ranks;
    struct errmsg serr;
    const char *state = "UNKNOWN";
    bool ended = false, dead = false;
    int exit_status = -1;

    if (!v)
        return NULL;
    if (in->job_dir) {
        summary = load_file(in->job_dir, "summary.json");
        /* A job that has ended has a summary; one that runs has a leader to ask. Ask, and
         * look for the summary again if the leader is gone, as it may have ended meanwhile.
         * A pending job has none yet (a requeued one may have its last segment's endpoint). */
        if (!summary && !in->no_live &&
            (!in->slurm || (!in->slurm->ended && in->slurm->state != SLURMLIB_PENDING)) &&
            mtime_of(in->job_dir, "endpoint.json") > 0) {
            if (status_query(in->job_dir, in->timeout_ms, &live, &serr) < 0) {
                summary = load_file(in->job_dir, "summary.json");
                /* A leader that died without a summary: the job has ended, how is unknown. */
                dead = !summary && !in->slurm && local_leader_dead(in->job_dir);
                if (!summary && !dead)
                    json_object_set_new(v, "live_error", json_string(serr.text));
            }
        }
    }
    json_object_set_new(v, "version", json_integer(VIEW_VERSION));
    json_object_set_new(v, "job_id", json_string(in->job_id));
    json_object_set_new(v, "name", name_json(in));
    json_object_set_new(v, "job_dir", str_or_null(in->job_dir));
    json_object_set_new(v, "slurm", in->slurm ? slurm_json(in->slurm) : json_null());
    if (in->slurm_error)
        json_object_set_new(v, "slurm_error", json_string(in->slurm_error));

    /* The state: Slurm's when it knows the job; else the leader's or the summary's. */
    if (in->slurm) {
        state = slurmlib_state_name(in->slurm->state);
        ended = in->slurm->ended;
        if (ended)
            exit_status = slurmlib_exit_status(in->slurm);
    } else if (summary) {
        const char *oc = json_string_value(json_object_get(summary, "outcome"));
        state = oc && !strcmp(oc, "completed")   ? "COMPLETED"
                : oc && !strcmp(oc, "cancelled") ? "CANCELLED"
                : oc && !strcmp(oc, "timeout")   ? "TIMEOUT"
                                                 : "FAILED";
        ended = true;
        exit_status = (int)json_integer_value(json_object_get(summary, "exit_status"));
    } else if (live) {
        state = "RUNNING";
    } else if (dead) {
        ended = true;
    } else if (in->job_dir && in->no_live) {
        state = view_local_leader_alive(in->job_dir) ? "RUNNING" : "UNKNOWN";
    } else if (in->job_dir && !json_object_get(v, "live_error")) {
        state = "STARTING";
    }
    json_object_set_new(v, "state", json_string(state));
    json_object_set_new(v, "ended", json_boolean(ended));
    json_object_set_new(v, "exit_status",
                        exit_status >= 0 ? json_integer(exit_status) : json_null());
    json_object_set_new(v, "live", live ? live : json_null());
    json_object_set_new(v, "summary", summary ? summary : json_null());
    json_object_set(v, "first_failure",
                    summary && json_object_get(summary, "first_failure")
                        ? json_object_get(summary, "first_failure")
                        : json_null());
    ranks = json_object_get(live ? live : summary, "ranks");
    json_object_set_new(v, "progress", progress_json(ranks));
    json_object_set_new(v, "timings", timings_json(in, summary));
    json_object_set_new(v, "elapsed_s", elapsed_json(in, json_object_get(v, "timings"), state));
    return v;
}

long view_elapsed_s(double started, double ended, bool running, double now)
{
    if (started <= 0)
        return -1;
    if (ended > 0)
        return ended >= started ? (long)(ended - started + 0.5) : -1;
    if (!running)
        return -1;
    return now >= started ? (long)(now - started) : 0;
}

/* How long the job has run: Slurm's count while Slurm knows it; else from the job dir's
 * timings (the key, gpurun's first write, to the end), or to now while it runs. */
static json_t *elapsed_json(const struct view_input *in, const json_t *timings, const char *state)
{
    struct timespec now;
    long s;

    if (in->slurm)
        return json_integer(in->slurm->elapsed_s);
    clock_gettime(CLOCK_REALTIME, &now);
    s = view_elapsed_s(json_real_value(json_object_get(timings, "script_started")),
                       json_real_value(json_object_get(timings, "ended")),
                       !strcmp(state, "RUNNING") || !strcmp(state, "STARTING"),
                       (double)now.tv_sec + now.tv_nsec / 1e9);
    return s >= 0 ? json_integer(s) : json_null();
}

bool view_ended(const json_t *view)
{
    return json_is_true(json_object_get(view, "ended"));
}

/* --- printing ------------------------------------------------------------------------------ */

void view_duration(char *buf, size_t n, long s)
{
    if (s < 0)
        snprintf(buf, n, "-");
    else if (s >= 86400)
        snprintf(buf, n, "%ld-%02ld:%02ld:%02ld", s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
    else
        snprintf(buf, n, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
}

void view_bar(char *buf, size_t n, long step, long total)
{
    char bar[VIEW_BAR_WIDTH + 1];
    long fill;
    double frac;

    if (total <= 0) {
        snprintf(buf, n, "-");
        return;
    }
    frac = step <= 0 ? 0 : step >= total ? 1 : (double)step / (double)total;
    fill = (long)(frac * VIEW_BAR_WIDTH + 0.5);
    for (int i = 0; i < VIEW_BAR_WIDTH; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[VIEW_BAR_WIDTH] = '\0';
    snprintf(buf, n, "[%s] %3d%% (%ld/%ld)", bar, (int)(frac * 100), step, total);
}

static const char *sget(const json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

static long iget(const json_t *o, const char *k, long dflt)
{
    const json_t *v = json_object_get(o, k);
    return json_is_integer(v) ? (long)json_integer_value(v) : dflt;
}

/* "1.5s" for milliseconds; "-" for a negative age. */
static void age(char *buf, size_t n, long ms)
{
    if (ms < 0)
        snprintf(buf, n, "-");
    else if (ms < 10000)
        snprintf(buf, n, "%.1fs", ms / 1000.0);
    else
        snprintf(buf, n, "%lds", ms / 1000);
}

/* How a rank ended, for the table: "-" while it runs. */
static void exit_cause(char *buf, size_t n, const json_t *r)
{
    const char *ph = sget(r, "phase");
    long code = iget(r, "code", 0), sig = iget(r, "signal", 0);
    bool killed = json_is_true(json_object_get(r, "killed"));

    if (!ph || strcmp(ph, "exited"))
        snprintf(buf, n, "-");
    else if (json_is_true(json_object_get(r, "oom")))
        snprintf(buf, n, "out of memory");
    else if (sig)
        snprintf(buf, n, "signal %ld%s", sig, killed ? " (torn down)" : "");
    else
        snprintf(buf, n, "exit %ld%s", code, killed ? " (torn down)" : "");
}

#define NCOL          13
/* The bytes of a rank's last line of output the table shows (cut at a character). */
#define VIEW_LINE_MAX 60

/* The blamed rank's stack in `gpurun status`: enough lines to see where it stopped. */
#define VIEW_STACK_LINES 40

static void print_ranks(FILE *out, const json_t *job)
{
    static const char *const head[NCOL] = {"rank", "node",       "host",      "phase",  "step",
                                           "loss", "tokens/s",   "heartbeat", "report", "output",
                                           "exit", "state from", "last line"};
    enum { COL_STATE = 11, COL_LINE = 12 };
    const json_t *ranks = json_object_get(job, "ranks"), *nodes = json_object_get(job, "nodes");
    size_t nr = json_array_size(ranks), i;
    int width[NCOL], last = 0;
    bool show[NCOL];
    char(*cells)[NCOL][VIEW_LINE_MAX + 8];
    json_t *x0;

    if (nr == 0)
        return;
    /* Where state came from and the last line only where a rank has one: a column of empty
     * cells says nothing. */
    for (int c = 0; c < NCOL; c++)
        show[c] = c != COL_STATE && c != COL_LINE;
    json_array_foreach(ranks, i, x0)
    {
        if (sget(x0, "state_from"))
            show[COL_STATE] = true;
        if (sget(x0, "last_line"))
            show[COL_LINE] = true;
    }
    for (int c = 0; c < NCOL; c++)
        if (show[c])
            last = c;
    cells = calloc(nr, sizeof(*cells));
    if (!cells)
        return;
    for (int c = 0; c < NCOL; c++)
        width[c] = (int)strlen(head[c]);
    for (i = 0; i < nr; i++) {
        const json_t *r = json_array_get(ranks, i);
        long node = iget(r, "node", -1);
        const json_t *nd = NULL;
        size_t k;
        json_t *x;
        char *row[NCOL];
        struct proto_progress p = rank_progress(r);
        const char *line = sget(r, "last_line");
        const int cell = VIEW_LINE_MAX + 8;

        json_array_foreach(nodes, k, x) if (iget(x, "node", -2) == node) nd = x;
        for (int c = 0; c < NCOL; c++)
            row[c] = cells[i][c];
        snprintf(row[0], cell, "%ld", iget(r, "rank", -1));
        snprintf(row[1], cell, "%ld", node);
        snprintf(row[2], cell, "%s", nd && sget(nd, "hostname") ? sget(nd, "hostname") : "-");
        snprintf(row[3], cell, "%s", sget(r, "phase") ? sget(r, "phase") : "-");
        snprintf(row[4], cell, "%lld", (long long)p.step);
        if (p.step > 0 && isfinite(p.loss))
            snprintf(row[5], cell, "%.4f", p.loss);
        else
            snprintf(row[5], cell, "-");
        if (isfinite(p.tokens_per_s))
            snprintf(row[6], cell, "%.0f", p.tokens_per_s);
        else
            snprintf(row[6], cell, "-");
        age(row[7], cell, nd ? iget(nd, "hb_age_ms", -1) : -1);
        if (json_is_false(json_object_get(r, "reported")))
            snprintf(row[8], cell, "no reports");
        else
            age(row[8], cell, iget(r, "report_age_ms", -1));
        age(row[9], cell, iget(r, "output_age_ms", -1));
        exit_cause(row[10], cell, r);
        /* "memory, step 300": its node's own copy; "node 0, step 300": the holder's. */
        if (sget(r, "state_from"))
            snprintf(row[COL_STATE], cell, "%s, step %ld", sget(r, "state_from"),
                     iget(r, "state_step", -1));
        else
            snprintf(row[COL_STATE], cell, "-");
        /* Cut at a character: the line is valid UTF-8. */
        snprintf(row[COL_LINE], cell, "%.*s", (int)utf8_prefix_len(line ? line : "", VIEW_LINE_MAX),
                 line ? line : "");
        for (int c = 0; c < NCOL; c++)
            if ((int)strlen(row[c]) > width[c])
                width[c] = (int)strlen(row[c]);
    }
    fprintf(out, "\n");
    for (int c = 0; c < NCOL; c++)
        if (show[c])
            fprintf(out, "%-*s%s", c < last ? width[c] : 0, head[c], c < last ? "  " : "\n");
    for (i = 0; i < nr; i++)
        for (int c = 0; c < NCOL; c++)
            if (show[c])
                fprintf(out, "%-*s%s", c < last ? width[c] : 0, cells[i][c],
                        c < last ? "  " : "\n");
    free(cells);
}

static void print_progress(FILE *out, const json_t *p)
{
    long total = iget(p, "steps_total", 0), smin = iget(p, "step_min", 0),
         smax = iget(p, "step_max", 0);
    const json_t *loss = json_object_get(p, "loss_mean");
    char bar[VIEW_BAR_WIDTH + 64];

    if (!json_is_object(p))
        return;
    fprintf(out, "ranks: %ld running, %ld exited, %ld joined, %ld pending (of %ld)\n",
            iget(p, "running", 0), iget(p, "exited", 0), iget(p, "joined", 0),
            iget(p, "pending", 0), iget(p, "ranks", 0));
    if (smax > 0) {
        fprintf(out, "step: %ld", smax);
        if (smin != smax)
            fprintf(out, " (the slowest rank at %ld)", smin);
        if (total > 0)
            fprintf(out, " of %ld", total);
        if (json_is_number(loss))
            fprintf(out, ", loss %.4f", json_number_value(loss));
        if (iget(p, "running", 0) > 0 && json_is_number(json_object_get(p, "tokens_per_s")))
            fprintf(out, ", %.0f tokens/s", json_number_value(json_object_get(p, "tokens_per_s")));
        fprintf(out, "\n");
    }
    if (total > 0) {
        view_bar(bar, sizeof(bar), smin, total);
        fprintf(out, "progress: %s", bar);
        if (json_is_number(json_object_get(p, "eta_s"))) {
            long eta = (long)(json_number_value(json_object_get(p, "eta_s")) + 0.5);
            if (eta >= 3600)
                fprintf(out, ", ETA %ldh%02ldm", eta / 3600, eta / 60 % 60);
            else
                fprintf(out, ", ETA %ldm%02lds", eta / 60, eta % 60);
        }
        fprintf(out, "\n");
    }
}

/* s[0..n), what a rank printed or raised, with its control bytes escaped (utf8.h): the view
 * is gpurun's, and an escape sequence in it would drive the reader's terminal. */
static void put_escaped(FILE *out, const char *s, size_t n)
{
    /* An escape is at most 4 bytes per byte it stands for ("\x1b"). */
    char *buf = malloc(4 * n + 1);

    if (!buf)
        return;
    utf8_escape_controls(buf, 4 * n + 1, s, n);
    fputs(buf, out);
    free(buf);
}

/* text's lines indented by two, at most max of them (-1: all). */
static void print_indented(FILE *out, const char *text, int max)
{
    int lines = 0;

    for (const char *p = text; *p; lines++) {
        size_t n = strcspn(p, "\n");
        if (max >= 0 && lines == max) {
            fprintf(out, "  ...\n");
            break;
        }
        fputs("  ", out);
        put_escaped(out, p, n);
        fputc('\n', out);
        p += n + (p[n] == '\n');
    }
}

static void print_failure(FILE *out, const json_t *ff)
{
    const char *tail = sget(ff, "tail"), *cause = sget(ff, "cause"), *host = sget(ff, "hostname");
    const char *stack = sget(ff, "stack");
    const json_t *err;
    long code = iget(ff, "code", 0), sig = iget(ff, "signal", 0);

    if (!json_is_object(ff))
        return;
    /* The cause names the rank, its node and host, and what happened: said once. Without
     * one (an older record), the same from the fields. */
    if (cause && *cause) {
        fprintf(out, "first failure%s%s%s: ", sget(ff, "class") ? " (" : "",
                sget(ff, "class") ? sget(ff, "class") : "", sget(ff, "class") ? ")" : "");
        put_escaped(out, cause, strlen(cause));
        fputc('\n', out);
    } else {
        /* A cancelled job's first "failure" is a node's, without a rank. */
        if (iget(ff, "rank", -1) >= 0)
            fprintf(out, "first failure: rank %ld on node %ld", iget(ff, "rank", -1),
                    iget(ff, "node", -1));
        else
            fprintf(out, "first failure: node %ld", iget(ff, "node", -1));
        if (host && *host)
            fprintf(out, " ('%s')", host);
        if (sig)
            fprintf(out, " was killed by signal %ld%s%s", sig, sget(ff, "signal_name") ? " " : "",
                    sget(ff, "signal_name") ? sget(ff, "signal_name") : "");
        else if (code)
            fprintf(out, " exited with status %ld", code);
        fprintf(out, "\n");
    }
    err = json_object_get(ff, "error");
    if (json_is_object(err)) {
        const char *type = sget(err, "type"), *msg = sget(err, "message");
        fputs("exception: ", out);
        put_escaped(out, type ? type : "?", strlen(type ? type : "?"));
        if (msg && *msg) {
            fputs(": ", out);
            put_escaped(out, msg, strlen(msg));
        }
        if (sget(err, "file")) {
            fputs(" (", out);
            put_escaped(out, sget(err, "file"), strlen(sget(err, "file")));
            fprintf(out, ":%ld)", iget(err, "line", 0));
        }
        fprintf(out, "\n");
    }
    /* A hang's stack is the end of its log: shown once, as the stack. */
    if (tail && *tail && !(stack && *stack)) {
        fprintf(out, "last lines of its log:\n");
        print_indented(out, tail, -1);
    }
    if (stack && *stack) {
        fprintf(out, "stack of rank %ld (in full in summary.json and its log):\n",
                iget(ff, "rank", -1));
        print_indented(out, stack, VIEW_STACK_LINES);
    }
}

static void print_timings(FILE *out, const json_t *t)
{
    static const char *const rows[][2] = {
        {"queued_s", "queued"},
        {"startup_s", "daemons up"},
        {"rendezvous_s", "rendezvous"},
        {"first_step_s", "first step"},
        {"run_s", "run"},
    };
    const json_t *d = json_object_get(t, "durations");
    bool any = false;

    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const json_t *v = json_object_get(d, rows[i][0]);
        if (!json_is_number(v))
            continue;
        fprintf(out, "%s%s %.*f s", any ? ", " : "timings: ", rows[i][1], i == 0 ? 0 : 3,
                json_number_value(v));
        any = true;
    }
    if (any)
        fprintf(out, "\n");
}

/* "loss: ▇▆▅▄▃▂▁ 4.1213 -> 2.0311 (rank 0, steps 1-60)": rank 0's recent losses, one
 * block a report, scaled from the lowest to the highest shown. */
static void print_loss_history(FILE *out, const json_t *job)
{
    static const char *const blocks[] = {"\u2581", "\u2582", "\u2583", "\u2584",
                                         "\u2585", "\u2586", "\u2587", "\u2588"};
    const json_t *h = json_object_get(job, "loss_history"), *e;
    size_t n = json_array_size(h), i;
    double lo = INFINITY, hi = -INFINITY;

    if (n < 2)
        return;
    json_array_foreach(h, i, e)
    {
        double v = json_number_value(json_array_get(e, 1));
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    fprintf(out, "loss: ");
    json_array_foreach(h, i, e)
    {
        double v = json_number_value(json_array_get(e, 1));
        int k = hi > lo ? (int)((v - lo) / (hi - lo) * 7 + 0.5) : 3;
        fputs(blocks[k < 0 ? 0 : k > 7 ? 7 : k], out);
    }
    fprintf(out, " %.4f -> %.4f (rank 0, steps %lld-%lld)\n",
            json_number_value(json_array_get(json_array_get(h, 0), 1)),
            json_number_value(json_array_get(json_array_get(h, n - 1), 1)),
            (long long)json_integer_value(json_array_get(json_array_get(h, 0), 0)),
            (long long)json_integer_value(json_array_get(json_array_get(h, n - 1), 0)));
}

/* "restarts: N", then the failure that ended each earlier generation: a completed job does
 * not hide that its ranks failed and started again. */
static void print_restarts(FILE *out, const json_t *job)
{
    const json_t *failures = json_object_get(job, "earlier_failures"), *f;
    long n = iget(job, "restarts", 0);
    size_t i;

    if (n <= 0)
        return;
    fprintf(out, "restarts: %ld\n", n);
    json_array_foreach(failures, i, f)
    {
        const char *cause = sget(f, "cause");
        fprintf(out, "  generation %zu ended: %s\n", i, cause ? cause : "?");
    }
}

/* "spares: K (J idle[: WHY])", then each swap: "node 2 (node2) fenced: CAUSE; spare node 3 (node3)
 * took its place (generation G)". Nothing for a job without spares. */
static void print_spares(FILE *out, const json_t *job)
{
    const json_t *swaps = json_object_get(job, "swaps"), *nodes = json_object_get(job, "nodes"), *s;
    long k = iget(job, "spare_nodes", 0), left = 0;
    size_t i;

    if (k <= 0)
        return;
    json_array_foreach(nodes, i, s)
    {
        const char *st = sget(s, "state");
        left += st && !strcmp(st, "spare");
    }
    /* The leader's reason where a spare stayed idle as the job failed. */
    const char *why = sget(job, "spares_idle_why");
    fprintf(out, "spares: %ld (%ld idle%s%s)\n", k, left, why ? ": " : "", why ? why : "");
    json_array_foreach(swaps, i, s)
    {
        const char *h = sget(s, "hostname"), *sh = sget(s, "spare_hostname"), *c = sget(s, "cause");
        fprintf(out,
                "  node %ld (%s) fenced: %s; spare node %ld (%s) took its place (generation %ld)\n",
                iget(s, "node", -1), h ? h : "?", c ? c : "?", iget(s, "spare", -1), sh ? sh : "?",
                iget(s, "generation", -1));
    }
}

/* One line per straggler the leader names: "straggler: rank 3 on node 1 (node1) 38% slower
 * than the median over 200 steps (0.412 s a step)". */
static void print_stragglers(FILE *out, const json_t *job)
{
    const json_t *s;
    size_t i;

    json_array_foreach(json_object_get(job, "stragglers"), i, s)
    {
        const char *h = sget(s, "hostname");
        fprintf(out,
                "straggler: rank %ld on node %ld (%s) %.0f%% slower than the median over %ld "
                "steps (%.3f s a step)\n",
                iget(s, "rank", -1), iget(s, "node", -1), h ? h : "?",
                json_number_value(json_object_get(s, "slower")) * 100, iget(s, "steps", 0),
                json_number_value(json_object_get(s, "step_seconds")));
    }
}

/* "requeues: N", then how each earlier segment of the job ended (the leader's "segments"). A
 * job Slurm requeued that has not started again yet has only its last segment's summary:
 * that one ended too. */
static void print_requeues(FILE *out, const json_t *job, const json_t *sl)
{
    const json_t *segs = json_object_get(job, "segments"), *s;
    long n = iget(job, "requeues", 0), ns = iget(sl, "requeues", 0);
    size_t i;

    if (n <= 0 && ns <= 0)
        return;
    fprintf(out, "requeues: %ld\n", ns > n ? ns : n);
    json_array_foreach(segs, i, s)
    {
        const char *cause = sget(s, "cause");
        fprintf(out, "  segment %ld ended: %s\n", iget(s, "segment", (long)i), cause ? cause : "?");
    }
    if (ns > n && sget(job, "outcome")) {
        const json_t *pre = json_object_get(job, "preempt_signal");
        long st = iget(job, "exit_status", -1);
        if (json_is_object(pre) && st == 0)
            fprintf(out,
                    "  segment %ld ended: the ranks checkpointed on the pre-timeout signal %ld "
                    "and ended\n",
                    n, iget(pre, "signal", 0));
        else
            fprintf(out, "  segment %ld ended: %s, exit status %ld\n", n, sget(job, "outcome"), st);
    }
}

void view_print(FILE *out, const json_t *v)
{
    const json_t *sl = json_object_get(v, "slurm"), *live = json_object_get(v, "live");
    const json_t *summary = json_object_get(v, "summary"), *es = json_object_get(v, "exit_status");
    const char *name = sget(v, "name"), *reason = sget(sl, "reason");
    char a[64], b[64];

    fprintf(out, "job: %s", sget(v, "job_id"));
    if (name)
        fprintf(out, " (%s)", name);
    fprintf(out, "\nstate: %s", sget(v, "state"));
    if (json_is_true(json_object_get(sl, "completing")))
        fprintf(out, " (completing)");
    if (reason && !strcmp(sget(v, "state"), "PENDING"))
        fprintf(out, " (%s)", reason);
    if (json_is_integer(es))
        fprintf(out, ", exit status %lld", (long long)json_integer_value(es));
    fprintf(out, "\n");
    if (json_is_object(summary) && sget(summary, "outcome")) {
        const json_t *pre = json_object_get(summary, "preempt_signal");
        char sn[SIGNAME_LEN];
        fprintf(out, "outcome: %s", sget(summary, "outcome"));
        if (json_is_object(pre))
            fprintf(out, " (the pre-timeout signal %s came %.1f s after the start)",
                    signame((int)iget(pre, "signal", 0), sn), (double)iget(pre, "at_ms", 0) / 1000);
        fprintf(out, "\n");
        /* A job whose ranks never met (the leader's together.h). */
        if (sget(summary, "alone"))
            fprintf(out, "warning: %s\n", sget(summary, "alone"));
    }
    print_restarts(out, json_is_object(summary) ? summary : live);
    print_spares(out, json_is_object(summary) ? summary : live);
    print_stragglers(out, json_is_object(summary) ? summary : live);
    print_requeues(out, json_is_object(live) ? live : summary, sl);
    if (json_is_object(sl)) {
        const char *nodelist = sget(sl, "nodelist");
        if (nodelist)
            fprintf(out, "nodes: %s (%lld)\n", nodelist,
                    (long long)json_array_size(json_object_get(sl, "nodes")));
        else
            fprintf(out, "nodes: %ld asked for\n", iget(sl, "num_nodes", 0));
        view_duration(a, sizeof(a), iget(sl, "elapsed_s", 0));
        if (json_is_integer(json_object_get(sl, "time_limit_s")))
            view_duration(b, sizeof(b), iget(sl, "time_limit_s", 0));
        else
            snprintf(b, sizeof(b), "none");
        fprintf(out, "elapsed: %s, time limit %s\n", a, b);
        if (sget(sl, "partition"))
            fprintf(out, "partition: %s\n", sget(sl, "partition"));
    } else {
        if (sget(v, "slurm_error"))
            fprintf(out, "slurm: %s\n", sget(v, "slurm_error"));
        if (json_is_integer(json_object_get(v, "elapsed_s"))) {
            view_duration(a, sizeof(a), iget(v, "elapsed_s", 0));
            fprintf(out, "elapsed: %s\n", a);
        }
    }
    if (sget(v, "job_dir"))
        fprintf(out, "job dir: %s\n", sget(v, "job_dir"));
    if (sget(v, "live_error"))
        fprintf(out, "leader: %s\n", sget(v, "live_error"));
    print_progress(out, json_object_get(v, "progress"));
    print_loss_history(out, json_is_object(live) ? live : summary);
    print_failure(out, json_object_get(v, "first_failure"));
    print_timings(out, json_object_get(v, "timings"));
    print_ranks(out, json_is_object(live) ? live : summary);
}

void view_print_list(FILE *out, const json_t *views)
{
    static const char *const head[6] = {"jobid", "name",    "state",
                                        "nodes", "elapsed", "nodelist(reason)"};
    size_t n = json_array_size(views), i;
    char(*cells)[6][128];
    int width[6];

    cells = calloc(n + 1, sizeof(*cells));
    if (!cells)
        return;
    for (int c = 0; c < 6; c++)
        width[c] = (int)strlen(head[c]);
    for (i = 0; i < n; i++) {
        const json_t *v = json_array_get(views, i), *sl = json_object_get(v, "slurm");
        const char *state = sget(v, "state"), *reason = sget(sl, "reason");
        snprintf(cells[i][0], 128, "%s", sget(v, "job_id"));
        snprintf(cells[i][1], 128, "%s", sget(v, "name") ? sget(v, "name") : "-");
        snprintf(cells[i][2], 128, "%s", state ? state : "-");
        if (json_is_object(sl)) {
            snprintf(cells[i][3], 128, "%ld", iget(sl, "num_nodes", 0));
            view_duration(cells[i][4], 128, iget(sl, "elapsed_s", 0));
            if (state && !strcmp(state, "PENDING"))
                snprintf(cells[i][5], 128, "(%s)", reason ? reason : "-");
            else
                snprintf(cells[i][5], 128, "%s", sget(sl, "nodelist") ? sget(sl, "nodelist") : "-");
        } else {
            snprintf(cells[i][3], 128, "-");
            view_duration(cells[i][4], 128, iget(v, "elapsed_s", -1));
            snprintf(cells[i][5], 128, "%s", sget(v, "job_dir") ? sget(v, "job_dir") : "-");
        }
        for (int c = 0; c < 6; c++)
            if ((int)strlen(cells[i][c]) > width[c])
                width[c] = (int)strlen(cells[i][c]);
    }
    for (int c = 0; c < 6; c++)
        fprintf(out, "%-*s%s", c + 1 < 6 ? width[c] : 0, head[c], c + 1 < 6 ? "  " : "\n");
    for (i = 0; i < n; i++)
        for (int c = 0; c < 6; c++)
            fprintf(out, "%-*s%s", c + 1 < 6 ? width[c] : 0, cells[i][c], c + 1 < 6 ? "  " : "\n");
    free(cells);
}
