/* Tests of daemon/spares: the swap plans before a restart and before the first assign, and
 * whether the spares cover a failure, on fleets of the tests' own (the cases of
 * tests/integ/local_spares.sh and slurm_spares.sh); why a job's idle spares took no place,
 * for each way a job ends with spares left, and nothing where none is idle or the job
 * completed. */
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

/* A 4-node job with 2 spares (nodes 4 and 5), every node fit and serving its own slot. */
static struct spares_fleet fleet(struct spares_node *n, int *slot_node)
{
    for (int i = 0; i < 6; i++)
        n[i] = (struct spares_node){.slot = i < 4 ? i : -1, .fit = true};
    for (int s = 0; s < 4; s++)
        slot_node[s] = s;
    return (struct spares_fleet){.nodes = n, .nphys = 6, .nnodes = 4, .slot_node = slot_node};
}

/* A lost node and a named one: each gets the next spare, in slot order, the named one's
 * cause kept even where it was lost too. */
TEST(spares_restart_plan_lost_and_named)
{
    struct spares_node n[6];
    int slot_node[4];
    struct spares_fleet f = fleet(n, slot_node);
    struct spares_swap w[4];

    CHECK_EQ(spares_plan_restart(&f, -1, NULL, 2, w), 0);
    n[3].lost = true;
    n[3].fit = false;
    n[1].lost = true;
    CHECK_EQ(spares_plan_restart(&f, 1, NULL, 2, w), 2);
    CHECK_EQ(w[0].slot, 1);
    CHECK_EQ(w[0].node, 1);
    CHECK_EQ(w[0].spare, 4);
    CHECK_EQ(w[0].cause, SPARES_NAMED);
    CHECK_EQ(w[1].slot, 3);
    CHECK_EQ(w[1].spare, 5);
    CHECK_EQ(w[1].cause, SPARES_LOST);
}

/* Node 0, the leader's, is never replaced; a node with no spare left keeps its place. */
TEST(spares_restart_plan_node0_and_no_spare_left)
{
    struct spares_node n[6];
    int slot_node[4];
    struct spares_fleet f = fleet(n, slot_node);
    struct spares_swap w[4];

    n[0].lost = true;
    CHECK_EQ(spares_plan_restart(&f, 0, NULL, 2, w), 0);
    n[0].lost = false;
    n[5].fit = false; /* a spare that lost its link */
    n[1].lost = n[2].lost = true;
    CHECK_EQ(spares_plan_restart(&f, -1, NULL, 2, w), 1);
    CHECK_EQ(w[0].node, 1);
    CHECK_EQ(w[0].spare, 4);
}

/* --straggler-action replace: the node with a straggling rank gives its place, the slowest
 * of its ranks named; without the action (slower NULL) it stays. */
TEST(spares_restart_plan_straggler)
{
    struct spares_node n[6];
    int slot_node[4];
    struct spares_fleet f = fleet(n, slot_node);
    struct spares_swap w[4];
    double slower[8] = {0};

    slower[5] = 0.4;
    slower[4] = 0.6;
    CHECK_EQ(spares_plan_restart(&f, -1, NULL, 2, w), 0);
    CHECK_EQ(spares_plan_restart(&f, -1, slower, 2, w), 1);
    CHECK_EQ(w[0].node, 2);
    CHECK_EQ(w[0].cause, SPARES_STRAGGLER);
    CHECK_EQ(w[0].rank, 4);
    /* A spare already serving a slot (a swap of an earlier generation) is no spare. */
    n[4].slot = 2;
    slot_node[2] = 4;
    n[2].slot = -1;
    n[2].fit = false;
    CHECK_EQ(spares_plan_restart(&f, -1, slower, 2, w), 1);
    CHECK_EQ(w[0].node, 4);
    CHECK_EQ(w[0].spare, 5);
}

/* Pre-flight: a failed node gives its place to a spare that passed; a spare that failed is
 * passed over; where none is left, or node 0 failed, the plan says which slot ends the job. */
TEST(spares_preflight_plan)
{
    struct spares_node n[6];
    int slot_node[4];
    struct spares_fleet f = fleet(n, slot_node);
    struct spares_swap w[4];

    CHECK_EQ(spares_plan_preflight(&f, w), 0);
    n[2].preflight = true;
    n[4].preflight = true;
    CHECK_EQ(spares_plan_preflight(&f, w), 1);
    CHECK_EQ(w[0].node, 2);
    CHECK_EQ(w[0].spare, 5);
    CHECK_EQ(w[0].cause, SPARES_PREFLIGHT);
    n[3].preflight = true;
    CHECK_EQ(spares_plan_preflight(&f, w), -1 - 3);
    n[3].preflight = false;
    n[0].preflight = true;
    CHECK_EQ(spares_plan_preflight(&f, w), -1 - 0);
}

/* The spares cover a failure where they are at least as many as the nodes it took; never
 * where node 0 is lost or named. */
TEST(spares_cover_counts_the_nodes_taken)
{
    struct spares_node n[6];
    int slot_node[4];
    struct spares_fleet f = fleet(n, slot_node);

    CHECK(!spares_cover(&f, -1, false)); /* nothing taken: nothing to cover */
    n[1].lost = true;
    CHECK(spares_cover(&f, -1, false));
    CHECK(spares_cover(&f, 2, false));
    n[3].lost = true;
    CHECK(!spares_cover(&f, 2, false)); /* three taken, two spares */
    n[3].lost = false;
    CHECK(!spares_cover(&f, 2, true));
    n[0].lost = true;
    CHECK(!spares_cover(&f, -1, false));
    n[0].lost = false;
    n[4].fit = n[5].fit = false;
    CHECK(!spares_cover(&f, -1, false));
}
