/* gpurun logs: a job's rank logs (logs.c prints them), or with -f, followed until the job
 * ends. */
#include <limits.h>
#include <stdio.h>
#include <unistd.h>

#include "cmd.h"
#include "follow.h"
#include "logs.h"
#include "monotime.h"
#include "slurmlib.h"
#include "banned.h"

struct job_end {
    const struct target *t;
    long long next_ms; /* when Slurm is asked again */
    bool ended;
};

/* Whether the job whose logs are followed is over: Slurm's word for a Slurm job (asked once a
 * second), the summary and a gone leader for a local one. */
static bool job_ended(void *arg)
{
    struct job_end *s = arg;
    char path[PATH_MAX + 32];

    if (s->ended)
        return true;
    if (s->t->slurm) {
        struct slurmlib_job job;
        struct errmsg err;
        int r;
        if (monotime_ms() < s->next_ms)
            return false;
        s->next_ms = monotime_ms() + FOLLOW_POLL_MAX_MS;
        r = slurmlib_load(s->t->slurm, &job, &err);
        s->ended = r < 0 || job.ended;
        slurmlib_job_release(&job);
        return s->ended;
    }
    snprintf(path, sizeof(path), "%s/summary.json", s->t->dir);
    if (access(path, F_OK) == 0) {
        /* The leader writes the summary, then waits for every node to finish: give the
         * followers' last lines the time of a poll. */
        s->ended = s->next_ms != 0 && monotime_ms() >= s->next_ms;
        if (!s->next_ms)
            s->next_ms = monotime_ms() + LOGS_POLL_MS;
    }
    return s->ended;
}

int cmd_logs(struct gpurun_args *args, int *fatal_signal)
{
    struct job_end end = {0};
    struct errmsg err;
    struct target t;
    int ret;

    (void)fatal_signal;
    ret = resolve_newest(args, &t);
    if (ret)
        return ret;
    end.t = &t;
    if (t.slurm && (args->follow || !t.has_dir)) {
        ret = open_slurm();
        if (ret)
            return ret;
    }
    if (!t.has_dir && !args->follow) {
        struct slurmlib_job job;
        struct errmsg serr;
        if (slurmlib_load(t.slurm, &job, &serr) < 0)
            return error_out(EXIT_FAILED, "%s", serr.text);
        ret = error_out(EXIT_FAILED,
                        "job %s has no logs yet (%s; its job dir '%s' is made when "
                        "it starts; -f waits for them)",
                        t.id, slurmlib_state_name(job.state), t.dir);
        slurmlib_job_release(&job);
        return ret;
    }
    if (args->follow)
        ret = logs_follow(stdout, t.dir, args->rank, job_ended, &end, &err);
    else
        ret = logs_print(stdout, t.dir, args->rank, &err);
    slurmlib_close();
    if (ret < 0)
        return error_out(EXIT_FAILED, "%s", err.text);
    return 0;
}
