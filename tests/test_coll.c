/* Tests of the collectives (kernels/coll/coll.h) in a world of one rank: every operation leaves the
 * data as it is and opens no socket, whichever backend; the errors of a bad backend or root;
 * the device-memory operations refused by the backends without them. The ring itself runs
 * with real ranks in tests/integ/coll_*.sh (tests/helpers/coll_rank.c); the nccl backend has
 * tests/test_coll_nccl.c. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "coll/coll.h"
#include "test.h"
#include "banned.h"

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;

    CHECK(d != NULL);
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Every operation on a world of one: the buffers come back bit for bit, NaN and -0 included. */
static void check_noop(struct coll *c)
{
    float f[5] = {1.5f, -0.0f, NAN, 3e38f, 1e-45f}, f0[5];
    double d[3] = {0.1, -2.5, 1e300}, d0[3];
    unsigned char b[7] = "abcdef", b0[7];

    memcpy(f0, f, sizeof(f));
    memcpy(d0, d, sizeof(d));
    memcpy(b0, b, sizeof(b));
    CHECK_EQ(coll_rank(c), 0);
    CHECK_EQ(coll_world_size(c), 1);
    CHECK_EQ(coll_allreduce_sum_f32(c, f, 5), 0);
    CHECK(!memcmp(f, f0, sizeof(f)));
    CHECK_EQ(coll_allreduce_avg_f32(c, f, 5), 0);
    CHECK(!memcmp(f, f0, sizeof(f)));
    CHECK_EQ(coll_allreduce_sum_f32(c, NULL, 0), 0);
    CHECK_EQ(coll_allreduce_sum_f64(c, d, 3), 0);
    CHECK(!memcmp(d, d0, sizeof(d)));
    CHECK_EQ(coll_broadcast(c, b, sizeof(b), 0), 0);
    CHECK(!memcmp(b, b0, sizeof(b)));
    CHECK_EQ(coll_barrier(c), 0);
    CHECK_STR(coll_strerror(c), "");
}

TEST(coll_single_is_a_noop)
{
    struct coll *c = NULL;
    struct errmsg err = {"unchanged"};
    int fds = count_fds();

    CHECK_EQ(coll_open("single", NULL, &c, &err), 0);
    CHECK(c != NULL);
    CHECK_STR(err.text, "");
    CHECK_STR(coll_backend(c), "single");
    CHECK_STR(coll_describe(c), "single: one rank");
    check_noop(c);
    CHECK_EQ(count_fds(), fds);
    coll_close(c);
}

TEST(coll_tcp_world_of_one_opens_no_socket)
{
    struct coll *c = NULL;
    struct errmsg err;
    int fds = count_fds();

    CHECK_EQ(coll_open("tcp", NULL, &c, &err), 0);
    CHECK_STR(coll_backend(c), "tcp");
    CHECK_STR(coll_describe(c), "tcp: one rank");
    CHECK_EQ(count_fds(), fds);
    coll_set_timeout(c, 10);
    check_noop(c);
    CHECK_EQ(count_fds(), fds);
    coll_close(c);
    CHECK_EQ(count_fds(), fds);
}

TEST(coll_unknown_backend)
{
    struct coll *c = (struct coll *)&c;
    struct errmsg err;

    CHECK_EQ(coll_open("nccl2", NULL, &c, &err), -EINVAL);
    CHECK(c == NULL);
    CHECK_STR(err.text, "unknown collectives backend 'nccl2' (single, tcp, nccl)");
    CHECK_EQ(coll_open(NULL, NULL, &c, &err), -EINVAL);
    CHECK(c == NULL);
    /* Without an error buffer the return still says it. */
    CHECK_EQ(coll_open("", NULL, &c, NULL), -EINVAL);
    CHECK(c == NULL);
}

TEST(coll_broadcast_root_out_of_range)
{
    struct coll *c = NULL;
    struct errmsg err;
    int v = 7;

    CHECK_EQ(coll_open("single", NULL, &c, &err), 0);
    CHECK_EQ(coll_broadcast(c, &v, sizeof(v), 1), -EINVAL);
    CHECK_STR(coll_strerror(c), "broadcast from rank 1: no such rank in a world of 1");
    CHECK_EQ(coll_broadcast(c, &v, sizeof(v), -1), -EINVAL);
    CHECK_EQ(v, 7);
    /* A refused call does not break the collectives. */
    CHECK_EQ(coll_barrier(c), 0);
    CHECK_EQ(coll_broadcast(c, &v, sizeof(v), 0), 0);
    coll_close(c);
}

TEST(coll_close_and_strerror_take_null)
{
    coll_close(NULL);
    CHECK_STR(coll_strerror(NULL), "");
}

/* single and tcp have no device memory: each device operation is refused with -ENOTSUP and a
 * message, before any argument is looked at, and the collectives stay usable. */
TEST(coll_dev_ops_need_nccl)
{
    const char *backends[] = {"single", "tcp"};
    float x = 2.5f;

    for (int i = 0; i < 2; i++) {
        struct coll *c = NULL;
        struct errmsg err;
        char want[128];

        CHECK_EQ(coll_open(backends[i], NULL, &c, &err), 0);
        snprintf(want, sizeof(want), "the %s backend has no device-memory operations", backends[i]);
        CHECK_EQ(coll_dev_allreduce_avg(c, &x, 1, COLL_F32, NULL), -ENOTSUP);
        CHECK_CONTAINS(coll_strerror(c), "device allreduce: ");
        CHECK_CONTAINS(coll_strerror(c), want);
        CHECK_EQ(coll_dev_reduce_scatter_avg(c, &x, &x, 1, COLL_BF16, NULL), -ENOTSUP);
        CHECK_CONTAINS(coll_strerror(c), "device reduce-scatter: ");
        CHECK_EQ(coll_dev_all_gather(c, &x, &x, 1, (enum coll_dtype)7, NULL), -ENOTSUP);
        CHECK_CONTAINS(coll_strerror(c), "device all-gather: ");
        CHECK_CONTAINS(coll_strerror(c), want);
        CHECK_EQ(coll_dev_allreduce_avg(c, NULL, 0, COLL_F32, NULL), -ENOTSUP);
        CHECK(x == 2.5f);
        CHECK_EQ(coll_barrier(c), 0);
        CHECK_EQ(coll_allreduce_avg_f32(c, &x, 1), 0);
        CHECK(x == 2.5f);
        coll_close(c);
    }
}
