/* Following a Slurm job until it ends. The batch output is a plain file on the shared
 * filesystem that slurmstepd appends to, so it is tailed by reading from where the last read
 * stopped; slurmctld is polled with a backoff for the job's state. Both waits are one
 * sigtimedwait(), which also takes the signals that cancel the job. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <uv.h>

#include "slurmlib.h"
#include "status.h"
#include "follow.h"
#include "monotime.h"
#include "signame.h"
#include "banned.h"

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

bool follow_slurm_noise(const char *line, size_t n)
{
    static const char who[] = "slurmstepd", at[] = " CANCELLED AT ", end[] = " ***";
    const char *p, *stamp;

    if (n < sizeof(who) - 1 || memcmp(line, who, sizeof(who) - 1) ||
        !(p = memmem(line, n, ": error: *** ", 13)))
        return false;
    p += 13;
    if (!((size_t)(line + n - p) > 4 && !memcmp(p, "JOB ", 4)) &&
        !((size_t)(line + n - p) > 5 && !memcmp(p, "STEP ", 5)))
        return false;
    stamp = memmem(p, (size_t)(line + n - p), at, sizeof(at) - 1);
    if (!stamp || n < sizeof(end) - 1 || memcmp(line + n - (sizeof(end) - 1), end, sizeof(end) - 1))
        return false;
    /* "... CANCELLED AT 2026-12-01T23:41:09 ***": a time alone, no "DUE TO TIME LIMIT". */
    stamp += sizeof(at) - 1;
    return stamp < line + n - (sizeof(end) - 1) &&
           !memchr(stamp, ' ', (size_t)(line + n - (sizeof(end) - 1) - stamp));
}

/* The batch output's lines on their way to stdout: a line that begins as slurmstepd's would
 * is held until its end (at most FOLLOW_HELD_MAX bytes), and dropped if it is its word of a
 * cancel; any other is written as it comes, a part of a line as it stands. */
#define FOLLOW_HELD_MAX 512 /* slurmstepd's cancel line is under 100 bytes */
struct line_filter {
    char held[FOLLOW_HELD_MAX];
    size_t n;
    bool passing; /* inside a line written in part: the rest goes straight out */
};

static int filter_flush(struct line_filter *lf)
{
    int r = write_all(STDOUT_FILENO, lf->held, lf->n);

    lf->n = 0;
    return r;
}

/* Whether held's n bytes may still grow into slurmstepd's line. */
static bool may_be_slurm(const char *held, size_t n)
{
    static const char who[] = "slurmstepd";

    return !memcmp(held, who, n < sizeof(who) - 1 ? n : sizeof(who) - 1);
}

/* p's n bytes through lf to stdout. Returns 0, or a negative errno. */
static int filter_write(struct line_filter *lf, const char *p, size_t n)
{
    while (n > 0) {
        const char *nl = memchr(p, '\n', n);
        size_t k = nl ? (size_t)(nl - p) + 1 : n;
        int r;

        if (lf->passing || k > sizeof(lf->held) - lf->n) {
            r = filter_flush(lf);
            r = r ? r : write_all(STDOUT_FILENO, p, k);
            lf->passing = !nl;
        } else {
            memcpy(lf->held + lf->n, p, k);
            lf->n += k;
            r = 0;
            if (!may_be_slurm(lf->held, lf->n)) {
                r = filter_flush(lf);
                lf->passing = !nl;
            } else if (nl) {
                if (follow_slurm_noise(lf->held, lf->n - 1))
                    lf->n = 0;
                else
                    r = filter_flush(lf);
            }
        }
        if (r < 0)
            return r;
        p += k;
        n -= k;
    }
    return 0;
}

/* Copies what fd gained since the last call to stdout, through lf. Returns the bytes
 * copied, or a negative errno. */
static long copy_new(int fd, struct line_filter *lf)
{
    char buf[65536];
    long total = 0;

    for (;;) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return total;
        if (filter_write(lf, buf, (size_t)n) < 0)
            return -EPIPE;
        total += n;
    }
}

/* The exit status summary.json records, or -1. */
static int summary_status(const char *job_dir)
{
    char path[PATH_MAX];
    json_error_t je;
    json_t *s;
    int st = -1;

    if (!job_dir || snprintf(path, sizeof(path), "%s/summary.json", job_dir) >= (int)sizeof(path))
        return -1;
    s = json_load_file(path, 0, &je);
    if (json_is_integer(json_object_get(s, "exit_status")))
        st = (int)json_integer_value(json_object_get(s, "exit_status"));
    json_decref(s);
    return st;
}

/* A Slurm job being followed. */
struct follow {
    uint32_t id;
    const char *job_dir;     /* borrowed; NULL: unknown */
    struct slurmlib_job job; /* Slurm's record at the last poll */
    char *path;              /* the batch output's, once Slurm has said */
    int fd;                  /* the batch output, open once the script has started; or -1 */
    int poll_ms, signals;
    long long next_poll, give_up_at; /* monotonic ms; give_up_at 0: not cancelled */
    int excluded_at;                 /* the requeue whose fenced nodes were excluded */
    bool known;                      /* Slurm has answered once */
    struct line_filter lines;        /* the output's lines on their way to stdout */
};

/* Whether name is one of list's ",a,b," names. */
static bool in_list(const char *list, const char *name)
{
    size_t n = strlen(name);

    for (const char *p = strstr(list, name); p; p = strstr(p + 1, name))
        if (p > list && p[-1] == ',' && p[n] == ',')
            return true;
    return false;
}

/* Appends to *list (",a,b,") and to the memstream added the hostnames of the nodes the
 * record at path fenced that *list lacks. */
static void fenced_from(const char *path, char **list, FILE *added)
{
    json_t *s = json_load_file(path, 0, NULL), *n;
    size_t i;

    json_array_foreach(json_object_get(s, "nodes"), i, n)
    {
        const char *st = json_string_value(json_object_get(n, "state"));
        const char *h = json_string_value(json_object_get(n, "hostname"));
        char *more;

        if (!st || strcmp(st, "fenced") || !h || !*h || strchr(h, ',') || in_list(*list, h) ||
            asprintf(&more, "%s%s,", *list, h) < 0)
            continue;
        free(*list);
        *list = more;
        fprintf(added, "%s%s", ftell(added) ? ", " : "", h);
    }
    json_decref(s);
}

/* A requeued job, pending again: the nodes its earlier segments fenced (summary.json, the
 * segment that just ended, and segments/K.json) join its ExcNodeList, so that Slurm gives
 * it other nodes. Only a pending job takes the update, and the batch script that requeues
 * the job ends with it: gpurun --wait makes it; without one, the leader of the next segment
 * refuses a fenced node at its pre-flight. */
static void exclude_fenced(struct follow *f)
{
    char path[PATH_MAX], *list = NULL, *added = NULL, **have = NULL;
    size_t alen = 0;
    int nhave = 0;
    FILE *m;
    struct errmsg err;

    if (!f->job_dir || !(list = strdup(",")) || !(m = open_memstream(&added, &alen))) {
        free(list);
        return;
    }
    if (f->job.exc_nodes && slurmlib_hostlist_expand(f->job.exc_nodes, &have, &nhave) == 0)
        for (int i = 0; i < nhave; i++) {
            char *more;
            if (asprintf(&more, "%s%s,", list, have[i]) < 0)
                break;
            free(list);
            list = more;
        }
    slurmlib_names_free(have);
    snprintf(path, sizeof(path), "%.4000s/summary.json", f->job_dir);
    fenced_from(path, &list, m);
    for (int k = 0; k < f->job.requeues; k++) {
        snprintf(path, sizeof(path), "%.4000s/segments/%d.json", f->job_dir, k);
        fenced_from(path, &list, m);
    }
    fclose(m);
    if (added && *added) {
        list[strlen(list) - 1] = '\0';
        if (slurmlib_exclude(f->id, list + 1, f->job.begin_time, &err) == 0)
            fprintf(stderr,
                    "gpurun: job %u requeued: the nodes it fenced are excluded from it "
                    "(ExcNodeList %s): %s\n",
                    f->id, list + 1, added);
        else
            fprintf(stderr, "gpurun: %s\n", err.text);
    }
    free(added);
    free(list);
}

/* Asks slurmctld about the job when a poll is due, the period doubling. Returns false to go
 * on, or true with *ret, the wait's exit status, when the wait is over. */
static bool poll_job(struct follow *f, long long now, int *ret)
{
    struct errmsg err;
    int r;

    if (now < f->next_poll)
        return false;
    slurmlib_job_release(&f->job);
    r = slurmlib_load(f->id, &f->job, &err);
    if (r == -ENOENT && f->known) {
        /* Purged (MinJobAge) between two polls: the summary has the outcome. */
        int st = summary_status(f->job_dir);
        if (f->fd >= 0)
            copy_new(f->fd, &f->lines);
        if (st < 0)
            fprintf(stderr, "gpurun: Slurm forgot job %u before its end was seen\n", f->id);
        *ret = st < 0 ? 125 : st;
        return true;
    }
    if (r < 0) {
        fprintf(stderr, "gpurun: %s\n", err.text);
        *ret = 125;
        return true;
    }
    f->known = true;
    if (f->job.state == SLURMLIB_PENDING && f->job.requeues > f->excluded_at) {
        f->excluded_at = f->job.requeues;
        exclude_fenced(f);
    }
    if (!f->path && f->job.std_out && !(f->path = strdup(f->job.std_out))) {
        fprintf(stderr, "gpurun: out of memory\n");
        *ret = 125;
        return true;
    }
    f->next_poll = now + f->poll_ms;
    f->poll_ms = f->poll_ms * 2 > FOLLOW_POLL_MAX_MS ? FOLLOW_POLL_MAX_MS : f->poll_ms * 2;
    return false;
}

/* A SIGINT, SIGTERM or SIGHUP: the first cancels the job, which is followed on to its end
 * (for FOLLOW_CANCEL_WAIT_MS at most); the second stops the wait. Returns true when the wait
 * is over. */
static bool take_signal(struct follow *f, int sig, long long now, int *fatal_signal)
{
    struct errmsg err;
    int r;

    if (!*fatal_signal)
        *fatal_signal = sig;
    if (++f->signals > 1) {
        fprintf(stderr, "gpurun: stopped waiting; job %u ends on its own\n", f->id);
        return true;
    }
    r = slurmlib_kill(f->id, &err);
    if (r < 0 && r != -EALREADY)
        fprintf(stderr, "gpurun: %s\n", err.text);
    else
        fprintf(stderr, "gpurun: cancelling job %u (once more to stop waiting)\n", f->id);
    f->give_up_at = now + FOLLOW_CANCEL_WAIT_MS;
    f->poll_ms = FOLLOW_POLL_MIN_MS;
    f->next_poll = 0;
    return false;
}

/* One turn of the wait: a poll when due, the output's new bytes, then the end or a signal
 * (waited for FOLLOW_READ_MS at most). Returns true with *ret when the wait is over. */
static bool follow_turn(struct follow *f, const sigset_t *set, int *ret, int *fatal_signal)
{
    struct timespec ts = {0, FOLLOW_READ_MS * 1000000L};
    long long now = monotime_ms();
    int sig;

    if (poll_job(f, now, ret))
        return true;
    /* The file exists once the batch script starts (slurmstepd creates it). */
    if (f->fd < 0 && f->path && f->job.state != SLURMLIB_PENDING)
        f->fd = open(f->path, O_RDONLY | O_CLOEXEC);
    if (f->fd >= 0 && copy_new(f->fd, &f->lines) == -EPIPE)
        return true;
    if (f->job.ended) {
        *ret = slurmlib_exit_status(&f->job);
        return true;
    }
    if (f->give_up_at && now >= f->give_up_at) {
        fprintf(stderr, "gpurun: job %u still ends after %d s; stopped waiting\n", f->id,
                FOLLOW_CANCEL_WAIT_MS / 1000);
        return true;
    }
    sig = sigtimedwait(set, NULL, &ts);
    return sig > 0 && take_signal(f, sig, now, fatal_signal);
}

int follow_job(uint32_t id, const char *job_dir, int *fatal_signal)
{
    struct follow f = {.id = id, .job_dir = job_dir, .fd = -1, .poll_ms = FOLLOW_POLL_MIN_MS};
    struct timespec zero = {0, 0};
    sigset_t set, old;
    int ret = 125;

    *fatal_signal = 0;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, &old);
    while (!follow_turn(&f, &set, &ret, fatal_signal))
        ;
    filter_flush(&f.lines);
    if (f.job.ended && *fatal_signal && f.signals == 1) {
        /* Cancelled on the signal and followed to its end: gpurun's own last line, as
         * --local's. */
        char sn[SIGNAME_LEN];
        fprintf(stderr, "gpurun: job %u cancelled (%s)", id, signame(*fatal_signal, sn));
        if (job_dir)
            fprintf(stderr, "; logs in '%s/logs'", job_dir);
        fprintf(stderr, "\n");
    } else if (f.job.ended && ret == 0 && !*fatal_signal) {
        char alone[1024];
        fprintf(stderr, "gpurun: job %u completed in %ld s", id, f.job.elapsed_s);
        if (job_dir && status_alone(job_dir, alone, sizeof(alone)))
            fprintf(stderr, ", but %s", alone);
        if (job_dir)
            fprintf(stderr, "; logs in '%s/logs'", job_dir);
        fprintf(stderr, "\n");
    } else if (f.job.ended && ret != 0 && !*fatal_signal) {
        fprintf(stderr, "gpurun: job %u %s with exit status %d", id,
                slurmlib_state_name(f.job.state), ret);
        if (job_dir)
            fprintf(stderr, "; logs in '%s/logs'", job_dir);
        fprintf(stderr, "\n");
    }
    /* Signals that arrived after the decision are spoken for: take them before unblocking. */
    while (sigtimedwait(&set, NULL, &zero) > 0)
        ;
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (f.fd >= 0)
        close(f.fd);
    free(f.path);
    slurmlib_job_release(&f.job);
    return ret;
}
