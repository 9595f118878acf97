/* Tests of daemon/stragglers on the ranks' times per step as the leader knows them: the
 * cases of tests/integ/local_stragglers.sh and local_straggler_quota.sh, with real processes
 * there, as tables here. */
#include <errno.h>
#include <stdint.h>

#include "../daemon/stragglers.h"
#include "test.h"
#include "banned.h"

#define MIN_STEPS 10
#define PCT       30.0

static void ranks(struct straggler_rank *k, int n, double avg)
{
    for (int r = 0; r < n; r++)
        k[r] = (struct straggler_rank){.running = true, .reported = true, .steps = 50, .avg = avg};
}

/* One rank 50% slower than the others is named, by how much; the others are 0. */
TEST(stragglers_a_slow_rank_is_named)
{
    struct straggler_rank k[4];
    double slower[4] = {0}, median = 0;

    ranks(k, 4, 0.100);
    k[2].avg = 0.150;
    CHECK_EQ(stragglers_judge(k, 4, PCT, MIN_STEPS, slower, &median), 1);
    CHECK(median > 0.0999 && median < 0.1001);
    CHECK(slower[2] > 0.4999 && slower[2] < 0.5001);
    CHECK(slower[0] == 0 && slower[1] == 0 && slower[3] == 0);
}

/* At the threshold a rank is named; just under, it is not. An even count's median is the
 * mean of the middle two. */
TEST(stragglers_threshold_and_even_median)
{
    struct straggler_rank k[4];
    double slower[4] = {0}, median = 0;

    ranks(k, 4, 0.100);
    k[0].avg = 0.080;
    k[3].avg = 0.125;
    /* median (0.1 + 0.1) / 2 = 0.1; rank 3 is 25% slower */
    CHECK_EQ(stragglers_judge(k, 4, 25.0, MIN_STEPS, slower, &median), 1);
    CHECK(slower[3] > 0.2499 && slower[3] < 0.2501);
    CHECK_EQ(stragglers_judge(k, 4, 25.5, MIN_STEPS, slower, &median), 1);
    CHECK(slower[3] == 0);
    k[1].avg = 0.090;
    CHECK_EQ(stragglers_judge(k, 4, 20.0, MIN_STEPS, slower, &median), 1);
    CHECK(median > 0.0949 && median < 0.0951);
}

/* A fast rank among slow ones before every rank has its window: no median yet, nothing set
 * (the fast ones' median would name every slow one, which is the job's pace). */
TEST(stragglers_no_verdict_before_every_rank_has_its_window)
{
    struct straggler_rank k[4];
    double slower[4] = {0.7, 0, 0, 0}, median = -1;

    ranks(k, 4, 0.300);
    k[0].avg = 0.100;
    for (int r = 1; r < 4; r++)
        k[r].steps = MIN_STEPS - 1;
    CHECK_EQ(stragglers_judge(k, 4, PCT, MIN_STEPS, slower, &median), 0);
    CHECK(slower[0] == 0.7 && median == -1);
    /* Once they have it, the slow ones are the job's median and nobody is named. */
    for (int r = 1; r < 4; r++)
        k[r].steps = MIN_STEPS;
    CHECK_EQ(stragglers_judge(k, 4, PCT, MIN_STEPS, slower, &median), 1);
    for (int r = 0; r < 4; r++)
        CHECK(slower[r] == 0);
}

/* Ranks that never reported are left out of the median (a job may report from some ranks
 * only); one rank alone makes no median. */
TEST(stragglers_silent_ranks_and_a_lone_rank)
{
    struct straggler_rank k[3];
    double slower[3] = {0}, median = 0;

    ranks(k, 3, 0.100);
    k[1] = (struct straggler_rank){.running = true};
    k[2].avg = 0.200;
    CHECK_EQ(stragglers_judge(k, 3, PCT, MIN_STEPS, slower, &median), 1);
    CHECK(median > 0.149 && median < 0.151);
    CHECK(slower[1] == 0);
    k[2].reported = false;
    CHECK_EQ(stragglers_judge(k, 3, PCT, MIN_STEPS, slower, &median), 0);
}

/* A rank that ended keeps what it was last called (summary.json says it), and is not in the
 * median. */
TEST(stragglers_an_ended_rank_keeps_its_verdict)
{
    struct straggler_rank k[4];
    double slower[4] = {0}, median = 0;

    ranks(k, 4, 0.100);
    k[3].avg = 0.200;
    CHECK_EQ(stragglers_judge(k, 4, PCT, MIN_STEPS, slower, &median), 1);
    CHECK(slower[3] > 0.99);
    k[3].running = false;
    k[0].avg = 0.5; /* would move the median if counted */
    CHECK_EQ(stragglers_judge(k, 4, PCT, MIN_STEPS, slower, &median), 1);
    CHECK(slower[3] > 0.99);
    CHECK(median > 0.0999 && median < 0.1001);
    CHECK(slower[0] > 3.99);
}

/* No time per step known (a median of 0): no verdict. */
TEST(stragglers_zero_times_make_no_verdict)
{
    struct straggler_rank k[2];
    double slower[2] = {0}, median = 0;

    ranks(k, 2, 0);
    CHECK_EQ(stragglers_judge(k, 2, PCT, MIN_STEPS, slower, &median), 0);
    CHECK_EQ(stragglers_judge(k, 0, PCT, MIN_STEPS, slower, &median), 0);
}
