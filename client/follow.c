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
#include "follow.h"
#include "banned.h"

static long long now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

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

/* Copies what fd gained since the last call to stdout. Returns the bytes copied, or a
 * negative errno. */
static long copy_new(int fd)
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
        if (write_all(STDOUT_FILENO, buf, (size_t)n) < 0)
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

int follow_job(uint32_t id, const char *job_dir, int *fatal_signal)
{
    struct slurmlib_job job = {0};
    struct slurmlib_error err;
    sigset_t set, old;
    char *path = NULL;
    long long next_poll = 0, give_up_at = 0;
    int poll_ms = FOLLOW_POLL_MIN_MS, fd = -1, ret = 125, signals = 0;
    bool known = false;

    *fatal_signal = 0;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, &old);
    for (;;) {
        struct timespec ts = {0, FOLLOW_READ_MS * 1000000L};
        long long now = now_ms();
        siginfo_t info;
        int sig, r;

        if (now >= next_poll) {
            slurmlib_job_release(&job);
            r = slurmlib_load(id, &job, &err);
            if (r == -ENOENT && known) {
                /* Purged (MinJobAge) between two polls: the summary has the outcome. */
                int st = summary_status(job_dir);
                if (fd >= 0)
                    copy_new(fd);
                if (st < 0)
                    fprintf(stderr, "gpurun: Slurm forgot job %u before its end was seen\n", id);
                ret = st < 0 ? 125 : st;
                break;
            }
            if (r < 0) {
                fprintf(stderr, "gpurun: %s\n", err.text);
                ret = 125;
                break;
            }
            known = true;
            if (!path && job.std_out && !(path = strdup(job.std_out))) {
                fprintf(stderr, "gpurun: out of memory\n");
                break;
            }
            next_poll = now + poll_ms;
            poll_ms = poll_ms * 2 > FOLLOW_POLL_MAX_MS ? FOLLOW_POLL_MAX_MS : poll_ms * 2;
        }
        /* The file exists once the batch script starts (slurmstepd creates it). */
        if (fd < 0 && path && job.state != SLURMLIB_PENDING)
            fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0 && copy_new(fd) == -EPIPE) {
            ret = 125;
            break;
        }
        if (job.ended) {
            ret = slurmlib_exit_status(&job);
            break;
        }
        if (give_up_at && now >= give_up_at) {
            fprintf(stderr, "gpurun: job %u still ends after %d s; stopped waiting\n", id,
                    FOLLOW_CANCEL_WAIT_MS / 1000);
            break;
        }
        sig = sigtimedwait(&set, &info, &ts);
        if (sig <= 0)
            continue;
        if (!*fatal_signal)
            *fatal_signal = sig;
        if (++signals > 1) {
            fprintf(stderr, "gpurun: stopped waiting; job %u ends on its own\n", id);
            break;
        }
        r = slurmlib_kill(id, &err);
        if (r < 0 && r != -EALREADY)
            fprintf(stderr, "gpurun: %s\n", err.text);
        else
            fprintf(stderr, "gpurun: cancelling job %u (once more to stop waiting)\n", id);
        give_up_at = now + FOLLOW_CANCEL_WAIT_MS;
        poll_ms = FOLLOW_POLL_MIN_MS;
        next_poll = 0;
    }
    if (job.ended && ret != 0 && !*fatal_signal) {
        fprintf(stderr, "gpurun: job %u %s with exit status %d", id, slurmlib_state_name(job.state),
                ret);
        if (job_dir)
            fprintf(stderr, "; logs in '%s/logs'", job_dir);
        fprintf(stderr, "\n");
    }
    /* Signals that arrived after the decision are spoken for: take them before unblocking. */
    {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&set, NULL, &zero) > 0)
            ;
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (fd >= 0)
        close(fd);
    free(path);
    slurmlib_job_release(&job);
    return ret;
}
