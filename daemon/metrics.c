/* Prometheus text files for node_exporter's textfile collector (metrics.h). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metrics.h"
#include "banned.h"

const char *const metrics_states[] = {"joining",  "spare", "running", "capture",
                                      "teardown", "done",  NULL};

/* A label value as the format wants it: backslash, double quote and newline escaped. */
static void put_label(FILE *f, const char *v)
{
    for (; v && *v; v++) {
        if (*v == '\\' || *v == '"')
            fputc('\\', f);
        if (*v == '\n')
            fputs("\\n", f);
        else
            fputc(*v, f);
    }
}

/* The labels every sample carries: {job="...",node="K"} without the closing brace. */
static void put_node_labels(FILE *f, const struct metrics_node *n)
{
    fputs("{job=\"", f);
    put_label(f, n->job_id);
    fprintf(f, "\",node=\"%d\"", n->node);
}

static void put_head(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* One rank's sample of a per-rank metric; value NAN leaves the sample out. */
static void put_rank(FILE *f, const struct metrics_node *n, const char *name, int rank,
                     double value)
{
    if (isnan(value))
        return;
    fputs(name, f);
    put_node_labels(f, n);
    fprintf(f, ",rank=\"%d\"} %.17g\n", rank, value);
}

char *metrics_render(const struct metrics_node *n)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);

    if (!f)
        return NULL;
    put_head(f, "gpurun_node_state", "gauge",
             "the job as this node's daemon sees it: 1 for the current state");
    for (int i = 0; metrics_states[i]; i++) {
        fputs("gpurun_node_state", f);
        put_node_labels(f, n);
        fputs(",host=\"", f);
        put_label(f, n->hostname);
        fprintf(f, "\",state=\"%s\"} %d\n", metrics_states[i],
                n->state && !strcmp(n->state, metrics_states[i]));
    }
    put_head(f, "gpurun_job_restarts", "gauge", "times the job's ranks were restarted so far");
    fputs("gpurun_job_restarts", f);
    put_node_labels(f, n);
    fprintf(f, "} %d\n", n->restarts);
    if (n->leader_hb_age_ms >= 0) {
        put_head(f, "gpurun_node_heartbeat_age_seconds", "gauge",
                 "time since this node's daemon last heard the leader");
        fputs("gpurun_node_heartbeat_age_seconds", f);
        put_node_labels(f, n);
        fprintf(f, "} %.3f\n", (double)n->leader_hb_age_ms / 1000);
    }
    put_head(f, "gpurun_rank_running", "gauge", "1 while the rank's process runs");
    for (int i = 0; i < n->nranks; i++)
        put_rank(f, n, "gpurun_rank_running", n->ranks[i].rank, n->ranks[i].running);
    put_head(f, "gpurun_rank_step", "gauge", "the step of the rank's last progress report");
    for (int i = 0; i < n->nranks; i++)
        put_rank(f, n, "gpurun_rank_step", n->ranks[i].rank, (double)n->ranks[i].step);
    put_head(f, "gpurun_rank_loss", "gauge", "the loss of the rank's last progress report");
    for (int i = 0; i < n->nranks; i++) {
        const struct metrics_rank *r = &n->ranks[i];
        put_rank(f, n, "gpurun_rank_loss", r->rank,
                 r->report_age_ms >= 0 && isfinite(r->loss) ? r->loss : NAN);
    }
    put_head(f, "gpurun_rank_tokens_per_second", "gauge",
             "the throughput of the rank's last progress report");
    for (int i = 0; i < n->nranks; i++) {
        const struct metrics_rank *r = &n->ranks[i];
        put_rank(f, n, "gpurun_rank_tokens_per_second", r->rank,
                 r->report_age_ms >= 0 && isfinite(r->tokens_per_s) ? r->tokens_per_s : NAN);
    }
    put_head(f, "gpurun_rank_step_seconds", "gauge",
             "the rank's time per training step, averaged over about 50 steps (its own work "
             "where it reports step_time)");
    for (int i = 0; i < n->nranks; i++)
        put_rank(f, n, "gpurun_rank_step_seconds", n->ranks[i].rank, n->ranks[i].step_seconds);
    put_head(f, "gpurun_rank_report_age_seconds", "gauge",
             "time since the rank's last progress report (what hang detection watches)");
    for (int i = 0; i < n->nranks; i++) {
        const struct metrics_rank *r = &n->ranks[i];
        put_rank(f, n, "gpurun_rank_report_age_seconds", r->rank,
                 r->report_age_ms >= 0 ? (double)r->report_age_ms / 1000 : NAN);
    }
    put_head(f, "gpurun_rank_output_age_seconds", "gauge",
             "time since the rank's last output on stdout or stderr (--hang-watch output)");
    for (int i = 0; i < n->nranks; i++) {
        const struct metrics_rank *r = &n->ranks[i];
        put_rank(f, n, "gpurun_rank_output_age_seconds", r->rank,
                 r->output_age_ms >= 0 ? (double)r->output_age_ms / 1000 : NAN);
    }
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

/* "DIR/gpurun_<job>_<suffix>.prom", <job> as metrics_path says. */
static int job_path(char *out, size_t n, const char *dir, const char *job_id, const char *suffix)
{
    char job[128];
    size_t k = 0;

    for (const char *p = job_id ? job_id : ""; *p && k + 1 < sizeof(job); p++, k++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '.' || c == '-';
        job[k] = ok ? c : '_';
    }
    job[k] = '\0';
    if (snprintf(out, n, "%s/gpurun_%s_%s.prom", dir, job, suffix) >= (int)n)
        return -ENAMETOOLONG;
    return 0;
}

int metrics_path(char *out, size_t n, const char *dir, const char *job_id, int node)
{
    char sfx[32];

    snprintf(sfx, sizeof(sfx), "node%d", node);
    return job_path(out, n, dir, job_id, sfx);
}

/* Replaces path with text (stolen): a temp file beside it, then rename. */
static int write_file(const char *path, char *text)
{
    char tmp[4096 + 32];
    size_t len, off = 0;
    int fd, ret = 0;

    if (!text)
        return -ENOMEM;
    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof(tmp)) {
        free(text);
        return -ENAMETOOLONG;
    }
    len = strlen(text);
    /* Readable by node_exporter, which runs as a user of its own. */
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        ret = -errno;
        goto out;
    }
    while (off < len) {
        ssize_t w = write(fd, text + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            ret = -errno;
            break;
        }
        off += (size_t)w;
    }
    if (close(fd) < 0 && ret == 0)
        ret = -errno;
    if (ret == 0 && rename(tmp, path) < 0)
        ret = -errno;
    if (ret < 0)
        unlink(tmp);
out:
    free(text);
    return ret;
}

int metrics_write(const char *dir, const struct metrics_node *n)
{
    char path[4096];

    if (metrics_path(path, sizeof(path), dir, n->job_id, n->node) < 0)
        return -ENAMETOOLONG;
    return write_file(path, metrics_render(n));
}

char *metrics_leader_render(const struct metrics_leader *m)
{
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);

    if (!f)
        return NULL;
    put_head(f, "gpurun_node_straggler", "gauge",
             "1 where a rank of the node is named a straggler (slower per step than the job's "
             "median by --straggler-threshold)");
    for (int i = 0; i < m->nnodes; i++) {
        fputs("gpurun_node_straggler{job=\"", f);
        put_label(f, m->job_id);
        fprintf(f, "\",node=\"%d\",host=\"", m->nodes[i].node);
        put_label(f, m->nodes[i].hostname);
        fprintf(f, "\"} %d\n", m->nodes[i].straggler);
    }
    put_head(f, "gpurun_rank_straggler_ratio", "gauge",
             "for a straggler, how much slower per step than the job's median (0.5: 50%)");
    for (int i = 0; i < m->nranks; i++) {
        fputs("gpurun_rank_straggler_ratio{job=\"", f);
        put_label(f, m->job_id);
        fprintf(f, "\",node=\"%d\",rank=\"%d\"} %.17g\n", m->ranks[i].node, m->ranks[i].rank,
                m->ranks[i].slower);
    }
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

int metrics_write_leader(const char *dir, const struct metrics_leader *m)
{
    char path[4096];

    if (job_path(path, sizeof(path), dir, m->job_id, "leader") < 0)
        return -ENAMETOOLONG;
    return write_file(path, metrics_leader_render(m));
}

int metrics_remove_leader(const char *dir, const char *job_id)
{
    char path[4096];

    if (job_path(path, sizeof(path), dir, job_id, "leader") < 0)
        return -ENAMETOOLONG;
    if (unlink(path) < 0 && errno != ENOENT)
        return -errno;
    return 0;
}

int metrics_remove(const char *dir, const char *job_id, int node)
{
    char path[4096];

    if (metrics_path(path, sizeof(path), dir, job_id, node) < 0)
        return -ENAMETOOLONG;
    if (unlink(path) < 0 && errno != ENOENT)
        return -errno;
    return 0;
}
