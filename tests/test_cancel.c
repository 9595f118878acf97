/* Tests of daemon/cancel: a cancel that follows a rank's death by the signal a cancel sends
 * explains it; a crash, SIGKILL, or a cancel long after (or before) does not. */
#include <signal.h>

#include "../daemon/cancel.h"
#include "test.h"
#include "banned.h"

TEST(cancel_explains_a_rank_killed_by_its_signal)
{
    /* Slurm's scancel: the rank's SIGTERM reached the leader 3 ms before the daemon's. */
    CHECK(cancel_explains(SIGTERM, 10000, 10003));
    CHECK(cancel_explains(SIGINT, 10000, 10000));
    CHECK(cancel_explains(SIGHUP, 10000, 10000 + CANCEL_EXPLAINS_MS));
}

TEST(cancel_does_not_explain_other_failures)
{
    /* A crash, an OOM kill, the scheduler's SIGKILL after its grace. */
    CHECK(!cancel_explains(SIGSEGV, 10000, 10003));
    CHECK(!cancel_explains(SIGKILL, 10000, 10003));
    CHECK(!cancel_explains(0, 10000, 10003));
    /* A user's own kill of a rank, cancelled by hand much later. */
    CHECK(!cancel_explains(SIGTERM, 10000, 10001 + CANCEL_EXPLAINS_MS));
    /* A cancel that came first is the job's record already: nothing to explain. */
    CHECK(!cancel_explains(SIGTERM, 10000, 9999));
}
