/* The hang rule (hang.h): a pure function of the ranks' life signs and the clock. */
#include "hang.h"

#include <stddef.h>

#include "banned.h"

static const char deadlock_why[] = "every rank waits on the others";

static int64_t later_ms(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

int64_t hang_life_ms(const struct hang_rank *k)
{
    if (!k->report_ms)
        return 0;
    return later_ms(k->report_ms, later_ms(k->released_ms, k->active_ms));
}

/* The same for any running rank, for the culprit: one that never reported counts from the
 * generation's start, or from its later life in the store. */
static int64_t sign_ms(const struct hang_job *job, const struct hang_rank *k)
{
    if (k->report_ms)
        return hang_life_ms(k);
    return later_ms(job->t_generation, later_ms(k->released_ms, k->active_ms));
}

/* The rank to blame for a stall, given stalled, the running rank whose last sign of life is
 * the oldest (past the timeout), or -1 when the job is not hung after all. A rank that waits
 * on the others is not the one stuck while a running rank is not waiting: the culprit is one
 * of those that is stale too, one that never reported first (it never reached the loop),
 * else the oldest; where every one that is not waiting is fresh, they are working and the job
 * is not hung. Where all wait, they deadlocked: the oldest is blamed. Without waits known, a
 * stale rank that never reported is blamed only where most running ranks did report (a job
 * may report from rank 0 alone). Sets *why to what makes it the culprit ("" when it is
 * stalled itself). */
static int culprit(const struct hang_config *cfg, const struct hang_job *job, int stalled,
                   int64_t now, const char **why)
{
    int64_t hang = cfg->timeout_ms + cfg->margin_ms, best_sign = 0;
    int nrun = 0, nreported = 0, nwaiting = 0, best = -1, silent = -1;
    bool free_runs = false; /* a rank not waiting runs */

    *why = "";
    for (int r = 0; r < job->nranks; r++) {
        const struct hang_rank *k = &job->ranks[r];
        int64_t sign = sign_ms(job, k);
        if (!k->running)
            continue;
        nrun++;
        nreported += k->report_ms != 0;
        nwaiting += k->waiting;
        if (!k->report_ms && silent < 0 && now - sign > hang)
            silent = r;
        if (k->waiting)
            continue;
        free_runs = true;
        /* One that never reported goes first: it never reached the loop. */
        if (now - sign > hang &&
            (best < 0 || (!k->report_ms && job->ranks[best].report_ms) ||
             (!k->report_ms == !job->ranks[best].report_ms && sign < best_sign))) {
            best = r;
            best_sign = sign;
        }
    }
    if (nwaiting > 0 && job->ranks[stalled].waiting) {
        if (best >= 0) {
            *why = "the others wait for it";
            return best;
        }
        if (free_runs)
            return -1;
        /* Every one waits: a deadlock only once the waits outlast the timeout. Just after a
         * barrier's last arrival every rank reads as waiting until the agents' next progress,
         * and a rank that waited long for a working one has an old report. */
        if (!job->t_all_wait || now - job->t_all_wait <= hang)
            return -1;
        *why = deadlock_why;
        return stalled;
    }
    if (nwaiting == 0 && silent >= 0 && nreported >= 2 && nreported > nrun - nreported) {
        *why = "the others reported";
        return silent;
    }
    return stalled;
}

static void judge_reports(const struct hang_config *cfg, const struct hang_job *job, int64_t now,
                          struct hang_verdict *v)
{
    bool any = false;
    int blamed;

    for (int r = 0; r < job->nranks; r++) {
        const struct hang_rank *k = &job->ranks[r];
        if (!k->report_ms)
            continue;
        any = true;
        if (k->step > v->max_step)
            v->max_step = k->step;
        if (!k->running)
            continue;
        if (v->stalled < 0 || hang_life_ms(k) < hang_life_ms(&job->ranks[v->stalled]) ||
            (hang_life_ms(k) == hang_life_ms(&job->ranks[v->stalled]) &&
             k->step < job->ranks[v->stalled].step))
            v->stalled = r;
    }
    if (!any) {
        if (now - job->t_generation > cfg->timeout_ms)
            v->kind = HANG_CANNOT_APPLY;
        return;
    }
    /* A newer report or sign in the store may still be on its way (margin_ms). */
    if (v->stalled < 0 ||
        now - hang_life_ms(&job->ranks[v->stalled]) <= cfg->timeout_ms + cfg->margin_ms)
        return;
    blamed = culprit(cfg, job, v->stalled, now, &v->why);
    if (blamed < 0)
        return;
    v->kind = v->why == deadlock_why ? HANG_DEADLOCK : HANG_HUNG;
    v->rank = blamed;
    v->sign_ms = sign_ms(job, &job->ranks[blamed]);
}

/* Under --hang-watch output: a rank's last byte of output, or later a barrier's release. */
static int64_t output_sign_ms(const struct hang_job *job, const struct hang_rank *k)
{
    return later_ms(k->output_ms ? k->output_ms : job->t_generation, k->released_ms);
}

/* The running ranks, those of them that printed, and those that wait. */
static void count_output(const struct hang_job *job, int *nrun, int *nprinted, int *nwaiting)
{
    for (int r = 0; r < job->nranks; r++) {
        const struct hang_rank *k = &job->ranks[r];
        if (k->running) {
            (*nrun)++;
            *nprinted += k->output_ms != 0;
            *nwaiting += k->waiting;
        }
    }
}

/* The job hangs when a rank not waiting on the others is silent past the timeout (the
 * culprit: the one silent longest), or when every running rank waits and is silent (a
 * deadlock: the oldest). */
static void judge_output(const struct hang_config *cfg, const struct hang_job *job, int64_t now,
                         struct hang_verdict *v)
{
    int64_t hang = cfg->timeout_ms + cfg->margin_ms, oldest = 0;
    int nrun = 0, nprinted = 0, nwaiting = 0, blamed = -1, waiting_stale = 0, watched = 0;

    count_output(job, &nrun, &nprinted, &nwaiting);
    if (nprinted == 0) {
        if (now - job->t_generation > cfg->timeout_ms)
            v->kind = HANG_CANNOT_APPLY;
        return;
    }
    for (int r = 0; r < job->nranks; r++) {
        const struct hang_rank *k = &job->ranks[r];
        int64_t sign = output_sign_ms(job, k);
        if (!k->running || (!k->output_ms && nprinted * 2 <= nrun))
            continue;
        watched++;
        if (now - sign <= hang)
            continue;
        if (k->waiting) {
            waiting_stale++;
            continue;
        }
        if (blamed < 0 || sign < oldest) {
            blamed = r;
            oldest = sign;
        }
    }
    if (blamed >= 0) {
        v->kind = HANG_HUNG;
        v->rank = blamed;
        v->sign_ms = oldest;
        return;
    }
    /* A deadlock needs every running rank waiting: one that works in silence (not watched:
     * it printed nothing yet) may be what the others wait for; and the waits outlasting the
     * timeout (a barrier just released reads as every rank waiting until the agents' next
     * progress). */
    if (waiting_stale == 0 || waiting_stale < watched || nwaiting < nrun || !job->t_all_wait ||
        now - job->t_all_wait <= hang)
        return;
    for (int r = 0; r < job->nranks; r++) {
        const struct hang_rank *k = &job->ranks[r];
        int64_t sign = output_sign_ms(job, k);
        if (k->running && k->waiting && (blamed < 0 || sign < oldest)) {
            blamed = r;
            oldest = sign;
        }
    }
    v->kind = HANG_DEADLOCK;
    v->why = deadlock_why;
    v->rank = blamed;
    v->sign_ms = oldest;
}

void hang_judge(const struct hang_config *cfg, const struct hang_job *job, int64_t now,
                struct hang_verdict *v)
{
    *v = (struct hang_verdict){.kind = HANG_NONE, .rank = -1, .why = "", .stalled = -1};
    if (cfg->timeout_ms <= 0)
        return;
    if (cfg->output)
        judge_output(cfg, job, now, v);
    else
        judge_reports(cfg, job, now, v);
}

bool hang_suspect(const struct hang_job *job, const struct hang_verdict *v, int r)
{
    const struct hang_rank *k = &job->ranks[r];

    return r != v->rank && k->running && !k->report_ms && !k->waiting;
}
