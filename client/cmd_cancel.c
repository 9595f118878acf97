/* gpurun cancel: ends a job, through its leader for a local one and through slurmctld for a
 * Slurm one, and returns once its processes are gone (or CANCEL_WAIT_MS has passed). */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

#include <jansson.h>
#include <uv.h>

#include "cmd.h"
#include "follow.h"
#include "monotime.h"
#include "slurmlib.h"
#include "banned.h"

/* gpurun cancel waits this long for the job's processes to be gone. */
#define CANCEL_WAIT_MS 60000

/* A local job: SIGTERM to its leader (the node 0 rendezvousd), which ends the job on every
 * node; returns once the leader is gone. */
static int cancel_local(const struct target *t)
{
    char path[PATH_MAX + 32];
    json_error_t je;
    json_t *ep;
    pid_t pid;
    long long until;

    snprintf(path, sizeof(path), "%s/summary.json", t->dir);
    if (access(path, F_OK) == 0) {
        fprintf(stderr, "gpurun: job %s has ended already\n", t->id);
        return 0;
    }
    snprintf(path, sizeof(path), "%s/endpoint.json", t->dir);
    ep = json_load_file(path, 0, &je);
    pid = (pid_t)json_integer_value(json_object_get(ep, "pid"));
    json_decref(ep);
    if (pid <= 0)
        return error_out(EXIT_FAILED, "job %s has no leader to stop (no '%s')", t->id, path);
    if (kill(pid, SIGTERM) < 0)
        return errno == ESRCH ? error_out(EXIT_FAILED, "the leader of job %s (pid %d) is gone",
                                          t->id, (int)pid)
                              : error_out(EXIT_FAILED, "cannot signal pid %d: %s", (int)pid,
                                          uv_strerror(-errno));
    for (until = monotime_ms() + CANCEL_WAIT_MS; monotime_ms() < until && kill(pid, 0) == 0;)
        monotime_sleep_ms(50);
    if (kill(pid, 0) == 0)
        fprintf(stderr, "gpurun: job %s is still ending after %d s (its leader, pid %d, has it)\n",
                t->id, CANCEL_WAIT_MS / 1000, (int)pid);
    else
        fprintf(stderr, "gpurun: job %s cancelled\n", t->id);
    return 0;
}

int cmd_cancel(struct gpurun_args *args, int *fatal_signal)
{
    struct errmsg err;
    struct slurmlib_job job;
    struct target t;
    long long until;
    int ret, r;

    (void)fatal_signal;
    /* --job-dir alone names the job too: resolve_target reads its id from the dir. */
    ret = resolve_target(args, &t);
    if (ret)
        return ret;
    if (!t.slurm)
        return cancel_local(&t);
    ret = open_slurm();
    if (ret)
        return ret;
    r = slurmlib_kill(t.slurm, &err);
    if (r == -EALREADY) {
        fprintf(stderr, "gpurun: %s\n", err.text);
        ret = 0;
        goto out;
    }
    if (r < 0) {
        ret = error_out(EXIT_FAILED, "%s", err.text);
        goto out;
    }
    /* Slurm says CANCELLED at once; the processes go over KillWait. Return when they have. */
    for (until = monotime_ms() + CANCEL_WAIT_MS;; monotime_sleep_ms(FOLLOW_POLL_MIN_MS)) {
        r = slurmlib_load(t.slurm, &job, &err);
        bool ended = r < 0 || job.ended;
        slurmlib_job_release(&job);
        if (ended) {
            fprintf(stderr, "gpurun: job %s cancelled\n", t.id);
            break;
        }
        if (monotime_ms() >= until) {
            fprintf(stderr, "gpurun: job %s is still completing after %d s\n", t.id,
                    CANCEL_WAIT_MS / 1000);
            break;
        }
    }
out:
    slurmlib_close();
    return ret;
}
