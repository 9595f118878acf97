/* Tests of daemon/hang on timelines of the tests' own: each case is a job's ranks as the
 * leader knows them at one moment (their last report, store sign, barrier release, output
 * and wait), and the verdict the rule must give then. The cases are those the hang scripts
 * (tests/integ/local_hang*.sh, local_liveness.sh) produce with real processes, and those a
 * loaded machine produced in their history. */
#include <stdint.h>
#include <string.h>

#include "../daemon/hang.h"
#include "test.h"
#include "banned.h"

#define T      3000 /* --hang-timeout */
#define MARGIN 300

static const struct hang_config reports = {.timeout_ms = T, .margin_ms = MARGIN};
static const struct hang_config output = {.timeout_ms = T, .margin_ms = MARGIN, .output = true};

/* n running ranks that reported step 10 at report_ms, nothing else. */
static void running(struct hang_rank *k, int n, int64_t report_ms)
{
    for (int r = 0; r < n; r++)
        k[r] = (struct hang_rank){.running = true, .step = 10, .report_ms = report_ms};
}

static struct hang_verdict judge(const struct hang_config *cfg, const struct hang_rank *k, int n,
                                 int64_t t_all_wait, int64_t now)
{
    struct hang_job job = {.ranks = k, .nranks = n, .t_generation = 1, .t_all_wait = t_all_wait};
    struct hang_verdict v;

    hang_judge(cfg, &job, now, &v);
    return v;
}

TEST(hang_off_without_a_timeout)
{
    struct hang_rank k[2];
    struct hang_config off = {.timeout_ms = 0, .margin_ms = MARGIN};

    running(k, 2, 100);
    CHECK_EQ(judge(&off, k, 2, 0, 1000000).kind, HANG_NONE);
}

/* SIGSTOP: rank 2 stops at 1,000 ms while the others report every 100 ms. It is blamed only
 * once its silence is past the timeout and the margin, not a millisecond before. */
TEST(hang_a_stopped_rank_is_blamed_after_timeout_and_margin)
{
    struct hang_rank k[4];
    struct hang_verdict v;
    int64_t now = 1000 + T + MARGIN;

    running(k, 4, now - 50);
    k[2].report_ms = 1000;
    k[2].step = 9;
    v = judge(&reports, k, 4, 0, now);
    CHECK_EQ(v.kind, HANG_NONE);
    v = judge(&reports, k, 4, 0, now + 1);
    CHECK_EQ(v.kind, HANG_HUNG);
    CHECK_EQ(v.rank, 2);
    CHECK_EQ(v.stalled, 2);
    CHECK_STR(v.why, "");
    CHECK_EQ(v.sign_ms, 1000);
    CHECK_EQ(v.max_step, 10);
}

/* Ranks with equal last signs: the one at the lower step is the one behind. */
TEST(hang_equal_times_blame_the_lower_step)
{
    struct hang_rank k[3];
    struct hang_verdict v;

    running(k, 3, 500);
    k[1].step = 7;
    v = judge(&reports, k, 3, 0, 500 + T + MARGIN + 1);
    CHECK_EQ(v.kind, HANG_HUNG);
    CHECK_EQ(v.rank, 1);
}

/* The others reported the step rank 0 never finished, then wait for it in a collective (a
 * barrier: their agents say so). Their reports are older than rank 0's, yet rank 0 is
 * blamed: the waiting ones are not the ones stuck. */
TEST(hang_the_rank_the_others_wait_for_is_blamed)
{
    struct hang_rank k[3];
    struct hang_verdict v;

    running(k, 3, 1000);
    k[0].report_ms = 1500;
    k[1].waiting = k[2].waiting = true;
    v = judge(&reports, k, 3, 0, 1500 + T + MARGIN + 1);
    CHECK_EQ(v.kind, HANG_HUNG);
    CHECK_EQ(v.rank, 0);
    CHECK_EQ(v.stalled, 1);
    CHECK_STR(v.why, "the others wait for it");
}

/* The same, but rank 0 still works (a fresh report): the old waits are no hang. */
TEST(hang_waiters_on_a_working_rank_are_not_hung)
{
    struct hang_rank k[3];

    running(k, 3, 1000);
    k[1].waiting = k[2].waiting = true;
    k[0].report_ms = 1000 + T + MARGIN;
    CHECK_EQ(judge(&reports, k, 3, 0, 1000 + T + MARGIN + 1).kind, HANG_NONE);
}

/* A late starter: rank 3 never reached its loop (no report), the others wait for it at the
 * first collective. It goes first, before any stale rank that did report. */
TEST(hang_a_late_starter_is_blamed_before_the_ones_that_reported)
{
    struct hang_rank k[4];
    struct hang_verdict v;

    running(k, 4, 100);
    k[0].waiting = k[1].waiting = true;
    k[2].report_ms = 150; /* stale too, not waiting */
    k[3].report_ms = 0;
    v = judge(&reports, k, 4, 0, 150 + T + MARGIN + 1);
    CHECK_EQ(v.kind, HANG_HUNG);
    CHECK_EQ(v.stalled, 0);
    CHECK_EQ(v.rank, 3);
    CHECK_STR(v.why, "the others wait for it");
    CHECK_EQ(v.sign_ms, 1); /* the generation's start */
    /* Where the oldest is not waiting itself, it is the one blamed. */
    k[2].report_ms = 50;
    v = judge(&reports, k, 4, 0, 150 + T + MARGIN + 1);
    CHECK_EQ(v.rank, 2);
    CHECK_STR(v.why, "");
}

/* Without waits known, a rank that never reported is blamed where most ranks did report. */
TEST(hang_a_silent_rank_among_reporting_ones_is_blamed)
{
    struct hang_rank k[4];
    struct hang_verdict v;

    running(k, 4, 200);
    k[1].report_ms = 0;
    v = judge(&reports, k, 4, 0, 200 + T + MARGIN + 1);
    CHECK_EQ(v.kind, HANG_HUNG);
    CHECK_EQ(v.rank, 1);
    CHECK_STR(v.why, "the others reported");
}

/* A job that reports from rank 0 alone: the silent others are never blamed while rank 0
 * reports; once rank 0 stops, it is blamed and the silent ones are named as suspects. */
TEST(hang_a_job_that_reports_from_rank_0_alone)
{
    struct hang_rank k[4];
    struct hang_job job = {.ranks = k, .nranks = 4, .t_generation = 1};
    struct hang_verdict v;

    running(k, 4, 0);
    k[0].report_ms = 10000;
    CHECK_EQ(judge(&reports, k, 4, 0, 10000 + T).kind, HANG_NONE);
    k[2].waiting = true;
    hang_judge(&reports, &job, 10000 + T + MARGIN + 1, &v);
    CHECK_EQ(v.kind, HANG_HUNG);
    CHECK_EQ(v.rank, 0);
    CHECK(!hang_suspect(&job, &v, 0));
    CHECK(hang_suspect(&job, &v, 1));
    CHECK(!hang_suspect(&job, &v, 2)); /* it waits */
    CHECK(hang_suspect(&job, &v, 3));
    k[3].running = false;
    CHECK(!hang_suspect(&job, &v, 3)); /* it ended */
}

/* No rank reported: the rule cannot apply once the timeout has passed (the leader warns). */
TEST(hang_cannot_apply_without_reports)
{
    struct hang_rank k[2];

    running(k, 2, 0);
    CHECK_EQ(judge(&reports, k, 2, 0, 1 + T).kind, HANG_NONE);
    CHECK_EQ(judge(&reports, k, 2, 0, 2 + T).kind, HANG_CANNOT_APPLY);
    CHECK_EQ(judge(&reports, k, 2, 0, 2 + T).rank, -1);
}

/* Every rank in a barrier of its own: a deadlock, called once the waits outlast the timeout
 * (t_all_wait) and the oldest is blamed. */
TEST(hang_a_deadlock_in_barriers)
{
    struct hang_rank k[3];
    struct hang_verdict v;

    running(k, 3, 1000);
    k[1].report_ms = 900;
    for (int r = 0; r < 3; r++)
        k[r].waiting = true;
    CHECK_EQ(judge(&reports, k, 3, 1100, 1100 + T + MARGIN).kind, HANG_NONE);
    v = judge(&reports, k, 3, 1100, 1100 + T + MARGIN + 1);
    CHECK_EQ(v.kind, HANG_DEADLOCK);
    CHECK_EQ(v.rank, 1);
    CHECK_STR(v.why, "every rank waits on the others");
}

/* A loaded run (a barrier's last arrival): agents say who waits every 250 ms, so at the
 * moment rank 0 reached the barrier every rank reads as waiting, and rank 1, which waited
 * 4 s for it, has an old report. The waits began just now: no deadlock, nobody blamed. */
TEST(hang_every_rank_waiting_just_after_an_arrival_is_no_deadlock)
{
    struct hang_rank k[2];

    running(k, 2, 0);
    k[0].report_ms = 4000;
    k[1].report_ms = 100;
    k[0].waiting = k[1].waiting = true;
    CHECK_EQ(judge(&reports, k, 2, 4100, 4150).kind, HANG_NONE);
    /* No wait known to have begun for all: the same. */
    CHECK_EQ(judge(&reports, k, 2, 0, 4150).kind, HANG_NONE);
}

/* A get nobody answers: rank 1 waits for a key that never comes while rank 0 waits for rank
 * 1 in a barrier: a deadlock once the waits are old. Before rank 0 arrives (it still
 * reports), rank 1's wait is no hang. */
TEST(hang_a_get_nobody_answers)
{
    struct hang_rank k[2];
    struct hang_verdict v;

    running(k, 2, 500);
    k[1].waiting = true;
    k[0].report_ms = 500 + T;
    CHECK_EQ(judge(&reports, k, 2, 0, 500 + T + MARGIN + 1).kind, HANG_NONE);
    k[0].waiting = true;
    v = judge(&reports, k, 2, 500 + T, 500 + 2 * T + MARGIN + 1);
    CHECK_EQ(v.kind, HANG_DEADLOCK);
    CHECK_EQ(v.rank, 1);
}

/* A rank that reported once and then works through the store alone: its puts and gets keep
 * it alive; when they stop, it is blamed from its last one, not its report. */
TEST(hang_store_traffic_is_life)
{
    struct hang_rank k[2];
    struct hang_verdict v;

    running(k, 2, 100);
    k[0].active_ms = k[1].active_ms = 20000;
    CHECK_EQ(judge(&reports, k, 2, 0, 20000 + T).kind, HANG_NONE);
    k[0].active_ms = 25000;
    v = judge(&reports, k, 2, 0, 20000 + T + MARGIN + 1);
    CHECK_EQ(v.kind, HANG_HUNG);
    CHECK_EQ(v.rank, 1);
    CHECK_EQ(v.sign_ms, 20000);
    CHECK_EQ(hang_life_ms(&k[1]), 20000);
}

/* A barrier's release is life: a rank that waited long in it and is back at work is not
 * blamed by its old report in the moment before its next one (a loaded run blamed it). */
TEST(hang_a_barrier_release_restarts_the_silence)
{
    struct hang_rank k[2];

    running(k, 2, 100);
    k[0].report_ms = 4050;
    k[1].released_ms = 4000;
    CHECK_EQ(judge(&reports, k, 2, 0, 4100).kind, HANG_NONE);
    CHECK_EQ(judge(&reports, k, 2, 0, 4000 + T + MARGIN).kind, HANG_NONE);
    CHECK_EQ(judge(&reports, k, 2, 0, 4000 + T + MARGIN + 1).rank, 1);
}

/* Ranks that ended or were lost are neither stalled nor blamed; their steps still count as
 * the furthest. */
TEST(hang_ended_ranks_are_not_judged)
{
    struct hang_rank k[3];
    struct hang_verdict v;

    running(k, 3, 5000);
    k[0].running = false;
    k[0].report_ms = 10;
    k[0].step = 50;
    CHECK_EQ(judge(&reports, k, 3, 0, 5000 + T).kind, HANG_NONE);
    k[2].report_ms = 4000;
    v = judge(&reports, k, 3, 0, 4000 + T + MARGIN + 1);
    CHECK_EQ(v.rank, 2);
    CHECK_EQ(v.max_step, 50);
}

/* --hang-watch output: a rank silent past the timeout while the others print is blamed. */
TEST(hang_output_silence)
{
    struct hang_rank k[3];
    struct hang_verdict v;

    running(k, 3, 0);
    for (int r = 0; r < 3; r++)
        k[r].output_ms = 9000;
    k[1].output_ms = 2000;
    CHECK_EQ(judge(&output, k, 3, 0, 2000 + T + MARGIN).kind, HANG_NONE);
    v = judge(&output, k, 3, 0, 2000 + T + MARGIN + 1);
    CHECK_EQ(v.kind, HANG_HUNG);
    CHECK_EQ(v.rank, 1);
    CHECK_EQ(v.sign_ms, 2000);
}

/* --hang-watch output before any rank printed: nothing to watch, then a warning's verdict. */
TEST(hang_output_cannot_apply_before_any_output)
{
    struct hang_rank k[2];

    running(k, 2, 0);
    CHECK_EQ(judge(&output, k, 2, 0, 1 + T).kind, HANG_NONE);
    CHECK_EQ(judge(&output, k, 2, 0, 2 + T).kind, HANG_CANNOT_APPLY);
}

/* A job that prints from rank 0 alone: the quiet ranks are not watched. Where most ranks
 * printed, one that printed nothing is watched from the generation's start. */
TEST(hang_output_quiet_ranks_are_watched_only_where_most_print)
{
    struct hang_rank k[4];
    struct hang_verdict v;

    running(k, 4, 0);
    k[0].output_ms = 20000;
    CHECK_EQ(judge(&output, k, 4, 0, 20000 + T).kind, HANG_NONE);
    k[1].output_ms = k[2].output_ms = 20000;
    v = judge(&output, k, 4, 0, 20000 + T);
    CHECK_EQ(v.kind, HANG_HUNG);
    CHECK_EQ(v.rank, 3);
    CHECK_EQ(v.sign_ms, 1);
}

/* --hang-watch output: a rank silent in a barrier while another still prints is waiting,
 * not hung (a loaded run blamed it when its line came late); the barrier's release restarts
 * its silence; every rank waiting and silent past the timeout is a deadlock. */
TEST(hang_output_waits_releases_and_deadlock)
{
    struct hang_rank k[2];
    struct hang_verdict v;

    running(k, 2, 0);
    k[0].output_ms = 8000;
    k[1].output_ms = 1000;
    k[1].waiting = true;
    CHECK_EQ(judge(&output, k, 2, 0, 8000 + T).kind, HANG_NONE);
    k[1].waiting = false;
    k[1].released_ms = 7000;
    CHECK_EQ(judge(&output, k, 2, 0, 7000 + T + MARGIN).kind, HANG_NONE);
    CHECK_EQ(judge(&output, k, 2, 0, 7000 + T + MARGIN + 1).rank, 1);
    k[0].waiting = k[1].waiting = true;
    CHECK_EQ(judge(&output, k, 2, 9000, 9000 + T + MARGIN).kind, HANG_NONE);
    v = judge(&output, k, 2, 9000, 9000 + T + MARGIN + 1);
    CHECK_EQ(v.kind, HANG_DEADLOCK);
    CHECK_EQ(v.rank, 1);
}
