/* Tests of daemon/spares: why a job's idle spares took no place, for each way a job ends
 * with spares left, and nothing where none is idle or the job completed. */
#include <stdbool.h>
#include <string.h>

#include "../daemon/spares.h"
#include "jobspec.h"
#include "test.h"
#include "banned.h"

/* A 2-node job with one idle spare whose node 1 was lost, restarts implied by the spare. */
static struct spares_end lost_node1(void)
{
    return (struct spares_end){.idle = 1,
                               .outcome = "failed",
                               .cls = FAILURE_NODE,
                               .node = 1,
                               .started = true,
                               .lost = 1,
                               .max_restarts = 1,
                               .restarts = 0,
                               .restart_on = RESTART_ON_SPARES};
}

static const char *why(const struct spares_end *e)
{
    static char buf[256];
    return spares_idle_why(e, buf, sizeof(buf));
}

TEST(spares_none_idle_or_completed_says_nothing)
{
    struct spares_end e = lost_node1();

    e.idle = 0;
    CHECK(why(&e) == NULL);
    e = lost_node1();
    e.outcome = "completed";
    CHECK(why(&e) == NULL);
}

TEST(spares_idle_for_the_rules)
{
    struct spares_end e = lost_node1();

    e.max_restarts = 0;
    CHECK_STR(why(&e), "--max-restarts 0: a spare serves only at a restart");
    e = lost_node1();
    e.restart_on = 1 << FAILURE_HANG;
    CHECK_STR(why(&e), "--restart-on does not name node failures");
    e = lost_node1();
    e.restarts = 1;
    CHECK_STR(why(&e), "no restart left (1 of 1 made)");
}

TEST(spares_idle_for_the_failure)
{
    struct spares_end e = lost_node1();

    e.cls = FAILURE_SIGNAL;
    e.node = 1;
    CHECK_STR(why(&e), "a signal failure is the ranks' own, not their node's");
    e.cls = FAILURE_USER_ERROR;
    CHECK_STR(why(&e), "a user-error failure is the ranks' own, not their node's");
    e.cls = -1;
    CHECK_STR(why(&e), "the failure has no class, so names no node to replace");
    e = lost_node1();
    e.node = 0;
    CHECK_STR(why(&e), "node 0 failed, which runs the leader: no spare takes its place");
    e = lost_node1();
    e.lost = 2;
    CHECK_STR(why(&e), "2 nodes lost and 1 spare: too few to take every place");
    e = lost_node1();
    e.cls = FAILURE_HANG;
    e.node = -1;
    e.lost = 0;
    CHECK_STR(why(&e), "the failure named no node a spare could replace");
}

TEST(spares_idle_for_the_end)
{
    struct spares_end e = lost_node1();

    e.outcome = "cancelled";
    CHECK_STR(why(&e), "the job was cancelled");
    e.outcome = "timeout";
    CHECK_STR(why(&e), "the job reached its time limit, which no spare lifts");
    e = lost_node1();
    e.started = false;
    CHECK_STR(why(&e), "the job ended before its ranks started");
}
