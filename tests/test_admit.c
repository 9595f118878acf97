/* Tests of daemon/admit: the pending limit, the stranger slots a descriptor limit leaves, and
 * which waiting connection a flood evicts (test_daemon.c's flood tests run the same rules
 * against a real leader). */
#include <stdbool.h>

#include "../daemon/admit.h"
#include "test.h"
#include "banned.h"

TEST(admit_pending_limit_holds_every_node_still_to_join)
{
    CHECK_EQ(admit_pending_max(10, 0, PENDING_CONNS_MAX), 10 + PENDING_CONNS_MAX);
    CHECK_EQ(admit_pending_max(10, 10, PENDING_CONNS_MAX), PENDING_CONNS_MAX);
    CHECK_EQ(admit_pending_max(12500, 3, 64), 12497 + 64);
}

/* Without a limit, or with room, PENDING_CONNS_MAX; a tight limit shrinks the slots to what
 * it leaves, never under PENDING_CONNS_MIN. */
TEST(admit_strangers_fit_the_descriptor_limit)
{
    CHECK_EQ(admit_strangers_max(-1, 100000, 256), PENDING_CONNS_MAX);
    CHECK_EQ(admit_strangers_max(1 << 20, 1000, 256), PENDING_CONNS_MAX);
    CHECK_EQ(admit_strangers_max(1024, 2, 256), 1024 - 2 - 256);
    CHECK_EQ(admit_strangers_max(1024 + 256 + 2, 2, 256), PENDING_CONNS_MAX);
    CHECK_EQ(admit_strangers_max(1024 + 256 + 1, 2, 256), PENDING_CONNS_MAX - 1);
    CHECK_EQ(admit_strangers_max(300, 2, 256), PENDING_CONNS_MIN);
    CHECK_EQ(admit_strangers_max(0, 2, 256), PENDING_CONNS_MIN);
}

/* The oldest that sent nothing valid goes first, else the oldest in its handshake; one that
 * proved the key never; the newest is not preferred. */
TEST(admit_victim_is_the_oldest_silent_stranger)
{
    struct admit_conn q[4] = {
        {.proved = true, .heard = true},
        {.heard = true},
        {.heard = false},
        {.heard = false},
    };

    CHECK_EQ(admit_victim(q, 4), 2);
    q[2].heard = q[3].heard = true;
    CHECK_EQ(admit_victim(q, 4), 1);
    q[1].proved = q[2].proved = q[3].proved = true;
    CHECK_EQ(admit_victim(q, 4), -1);
    CHECK_EQ(admit_victim(q, 0), -1);
}
