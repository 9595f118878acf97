/* Tests of daemon/stall on a clock of the test's own: a check on time, or a little late, or
 * early, is no stall; one a whole period late or more is, by what it lost beyond a period. */
#include <stdint.h>

#include "../daemon/stall.h"
#include "test.h"
#include "banned.h"

#define PERIOD 50

TEST(stall_on_time_or_a_little_late_is_none)
{
    struct stall s;
    int64_t t = 1000;

    stall_init(&s, PERIOD, t);
    for (int i = 0; i < 100; i++) {
        /* libuv's timers fire up to a millisecond or two late, under load some more. */
        t += PERIOD + i % 3;
        CHECK_EQ(stall_check(&s, t), 0);
    }
    t += 2 * PERIOD - 1;
    CHECK_EQ(stall_check(&s, t), 0);
}

TEST(stall_a_missed_check_counts_beyond_one_period)
{
    struct stall s;

    stall_init(&s, PERIOD, 0);
    CHECK_EQ(stall_check(&s, 2 * PERIOD), PERIOD);
    /* A process stopped for 12 s between two checks. */
    CHECK_EQ(stall_check(&s, 2 * PERIOD + 12000 + PERIOD), 12000);
    /* The next check on time: the stall is not counted twice. */
    CHECK_EQ(stall_check(&s, 2 * PERIOD + 12000 + 2 * PERIOD), 0);
}

TEST(stall_an_early_check_is_none)
{
    struct stall s;

    stall_init(&s, PERIOD, 500);
    /* A wake-up by a signal, or the same loop time twice. */
    CHECK_EQ(stall_check(&s, 510), 0);
    CHECK_EQ(stall_check(&s, 510), 0);
    /* Counted from the early call, not from the one before it. */
    CHECK_EQ(stall_check(&s, 510 + 3 * PERIOD), 2 * PERIOD);
}
