/* The hang rule (docs/design.md, section 4): whether a job's running ranks are hung, which
 * rank to blame and why, from each rank's last signs of life and the clock. Pure: no I/O and
 * no clock of its own. The leader gathers the signs (its agents' progress batches), words
 * the verdict and acts on it (a failure of class hang, the ranks' stacks captured first).
 *
 * Under --hang-watch reports (the default) a rank's clock starts at its first report: a rank
 * that never reports is never the stalled one, though it may be blamed when it is what the
 * others wait for. The job hangs when the oldest last sign of life among the running ranks
 * is older than the timeout; in a job whose ranks meet in collectives the stalled rank's is
 * the oldest (the others reported the step it never finished, then wait for it). A sign of
 * life is a report, and after it what the rank does through the store (a put, a delete, a
 * get's value, its arrival at a barrier, as its agent saw them) and a barrier's release: a
 * rank that reports once and then works by barriers and store calls alone is not stale
 * while it does. The waits are no sign: a rank blocked in a barrier shows life at its
 * arrival and not after, and a get only when its value comes, so that ranks waiting on each
 * other still age into a deadlock. Equal times go to the rank with the lower step.
 *
 * Under --hang-watch output a rank's sign of life is its last byte of output, or later a
 * barrier's release; one that printed nothing yet is watched from the generation's start
 * where most ranks printed (a job may print from rank 0 alone). */
#ifndef GPURUN_HANG_H
#define GPURUN_HANG_H

#include <stdbool.h>
#include <stdint.h>

/* One rank's life signs, times on the leader's monotonic clock in ms (0: never). */
struct hang_rank {
    bool running;        /* running now: not pending, exited or lost */
    bool waiting;        /* waits on the others: in a barrier, or a get with a timeout */
    int64_t step;        /* its last reported step */
    int64_t report_ms;   /* its last progress report */
    int64_t released_ms; /* the last release of a barrier it was in */
    int64_t active_ms;   /* its last sign in the store */
    int64_t output_ms;   /* its last byte of output */
};

struct hang_config {
    int64_t timeout_ms; /* --hang-timeout; <= 0: the rule is off */
    /* How late a rank's newest sign may reach the judge (its agent's batching, the link): a
     * rank is stale only this much after the timeout. */
    int64_t margin_ms;
    bool output; /* --hang-watch output: output is the sign of life, not reports */
};

struct hang_job {
    const struct hang_rank *ranks;
    int nranks;
    int64_t t_generation; /* when this generation's ranks were assigned */
    /* Since when every running rank waits on the others, as last known (0: not so). A
     * barrier's release or a key's put ends the waits before the agents say so; a deadlock
     * is called only when the waits outlast the timeout from here. */
    int64_t t_all_wait;
};

enum hang_kind {
    HANG_NONE,         /* no rank is stale, or the stale ones wait on one that works */
    HANG_CANNOT_APPLY, /* the timeout has passed and no rank gave a sign the rule reads */
    HANG_HUNG,         /* a rank is stuck: rank */
    HANG_DEADLOCK,     /* every running rank waits on the others: rank is the oldest */
};

struct hang_verdict {
    enum hang_kind kind;
    int rank;         /* the rank blamed; -1 */
    const char *why;  /* what makes it the culprit ("the others wait for it"); "" when it is
                       * stale itself (a static string) */
    int stalled;      /* reports: the running rank whose last sign is oldest; -1 */
    int64_t sign_ms;  /* the blamed rank's last sign of life, what the timeout counted */
    int64_t max_step; /* reports: the furthest step any rank reported */
};

/* The verdict on job at now under cfg, into *v. */
void hang_judge(const struct hang_config *cfg, const struct hang_job *job, int64_t now,
                struct hang_verdict *v);

/* When a rank that reported showed life last: its report, or later its sign in the store or
 * a barrier's release; 0 for a rank that never reported. */
int64_t hang_life_ms(const struct hang_rank *k);

/* Whether rank r, running, never reported, not waiting and not the one blamed, may still be
 * the one stuck under a verdict of the reports' rule (a job may report from rank 0 alone):
 * the cause names these, and the stacks tell. */
bool hang_suspect(const struct hang_job *job, const struct hang_verdict *v, int r);

#endif
