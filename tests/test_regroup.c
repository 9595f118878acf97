/* Tests of daemon/regroup: when a node's loss heals in process (the ranks of the other nodes
 * regroup with a spare's) and why not, on jobs of the tests' own: the case of
 * tests/integ/train_regroup.sh (2 nodes of 1 rank and a spare), then each condition that
 * sends the loss back to a restart of every rank. */
#include <stdbool.h>
#include <string.h>

#include "../daemon/regroup.h"
#include "test.h"
#include "banned.h"

/* 3 nodes of 2 ranks, every rank running and able; node `lost` lost, a spare, a restart left. */
static struct regroup_in job(struct regroup_rank *ranks, int lost)
{
    for (int r = 0; r < 6; r++)
        ranks[r] = (struct regroup_rank){.node = r / 2, .running = true, .able = true};
    return (struct regroup_in){
        .lost = lost, .restartable = true, .spares_cover = true, .ranks = ranks, .world_size = 6};
}

TEST(regroup_heals_a_covered_loss)
{
    struct regroup_rank ranks[6];
    struct regroup_in in = job(ranks, 2);
    char why[128] = "";

    CHECK(regroup_decide(&in, why, sizeof(why)));
    /* The lost node's ranks are gone with it: they neither run nor matter. */
    ranks[4].running = ranks[5].running = false;
    ranks[4].able = false;
    CHECK(regroup_decide(&in, why, sizeof(why)));
    /* 2 nodes of 1 rank (train_regroup.sh). */
    in.world_size = 2;
    ranks[1].node = 1;
    in.lost = 1;
    CHECK(regroup_decide(&in, why, sizeof(why)));
}

TEST(regroup_refuses_with_why)
{
    struct regroup_rank ranks[6];
    struct regroup_in in = job(ranks, 1);
    char why[128];

    in.restartable = false;
    CHECK(!regroup_decide(&in, why, sizeof(why)));
    CHECK_STR(why, "no restart is left for a node failure");
    in = job(ranks, 1);
    in.spares_cover = false;
    CHECK(!regroup_decide(&in, why, sizeof(why)));
    CHECK_STR(why, "no spare can take node 1's place");
    in = job(ranks, 1);
    in.aborting = true;
    CHECK(!regroup_decide(&in, why, sizeof(why)));
    CHECK_STR(why, "another failure is being handled");
    /* A rank elsewhere that cannot regroup would wait for ever in its collectives: every rank
     * restarts. */
    in = job(ranks, 1);
    ranks[5].able = false;
    CHECK(!regroup_decide(&in, why, sizeof(why)));
    CHECK_STR(why, "rank 5 on node 2 did not say it can regroup");
    in = job(ranks, 1);
    ranks[0].running = false;
    CHECK(!regroup_decide(&in, why, sizeof(why)));
    CHECK_STR(why, "rank 0 on node 0 has exited");
    /* One node's job: nobody is left to regroup. */
    in = job(ranks, 0);
    for (int r = 0; r < 6; r++)
        ranks[r].node = 0;
    CHECK(!regroup_decide(&in, why, sizeof(why)));
    CHECK_STR(why, "no rank runs on another node");
}
