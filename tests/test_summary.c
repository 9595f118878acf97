/* Tests of summary.json's rank lines (daemon/leader_view.c): the text the leader writes for
 * each rank equals the compact dump of the rank's view, for ranks in every state a job's end
 * leaves them in: never reported, reporting every number, a last line with control bytes and
 * quotes, a straggler, a state from memory, a stack and an exception; and the nodes' lines
 * likewise. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "jobspec.h"
#include "jtext.h"
#include "../daemon/leader_int.h"
#include "test.h"
#include "banned.h"

TEST(summary_rank_lines_are_the_views_dump)
{
    struct jobspec spec = {.nprocs = 2};
    struct rank ranks[6];
    int slot_node[3] = {0, 2, 1};
    struct leader l;
    uv_loop_t loop;

    CHECK_EQ(uv_loop_init(&loop), 0);
    memset(&l, 0, sizeof(l));
    memset(ranks, 0, sizeof(ranks));
    l.loop = &loop;
    l.spec = &spec;
    l.slot_node = slot_node;
    l.ranks = ranks;
    l.world_size = 6;
    for (int r = 0; r < 6; r++)
        proto_progress_init(&ranks[r].prog);
    /* 0: never reported, no output. 1: every number, a rate, a last line to escape. */
    ranks[1].phase = 1;
    ranks[1].report_ms = 1;
    ranks[1].first_ms = 1;
    ranks[1].first_step = 0;
    ranks[1].prog.step = 120;
    ranks[1].prog.total_steps = 1000;
    ranks[1].prog.loss = 2.5;
    ranks[1].prog.lr = 3e-4;
    ranks[1].prog.tokens_per_s = 123456.75;
    ranks[1].prog.grad_norm = 1.0;
    ranks[1].output_ms = 1;
    static char line1[PROTO_LINE_MAX + 1];
    snprintf(line1, sizeof(line1), "step 120 \"loss\" 2.5\\ \x1b[32mok\x1b[0m\t\xe2\x94\x80");
    ranks[1].last_line = line1;
    /* 2: a straggler with a step time, its state from memory, killed by a signal. */
    ranks[2].step_avg = 0.0293;
    ranks[2].step_avg_steps = 50;
    ranks[2].slower = 0.38;
    snprintf(ranks[2].loaded_from, sizeof(ranks[2].loaded_from), "node 0");
    ranks[2].loaded_step = 11;
    ranks[2].signal = 9;
    ranks[2].killed = true;
    /* 3: out of memory, an exit code, a stack and an exception. */
    ranks[3].oom = true;
    ranks[3].code = 137;
    ranks[3].stack = json_string("Thread 1:\n  File \"train.py\", line 3");
    ranks[3].error =
        json_pack("{s:{s:s, s:i}}", "message", "message", "RuntimeError: x", "timestamp", 17);
    /* 4: a number NaN (unknown: left out), 5: a loss of an integer value. */
    ranks[4].prog.loss = NAN;
    ranks[4].prog.step = 3;
    ranks[5].prog.loss = 2.0;
    for (int r = 0; r < 6; r++) {
        json_t *v = leader_rank_view(&l, r, true);
        char *want = v ? json_dumps(v, JSON_COMPACT) : NULL;
        struct jtext t;

        jtext_init(&t);
        leader_rank_line(&l, r, &t);
        CHECK(t.ok);
        CHECK(want != NULL);
        if (want && t.ok)
            CHECK_STR(t.p, want);
        free(want);
        json_decref(v);
        jtext_release(&t);
    }
    json_decref(ranks[3].stack);
    json_decref(ranks[3].error);
    uv_loop_close(&loop);
}

/* The nodes' lines likewise, for a node in each state: pending, joined with a heartbeat,
 * a spare, done with its link timed, lost, and fenced for a pre-flight check it failed. */
TEST(summary_node_lines_are_the_views_dump)
{
    struct jobspec spec = {.nprocs = 2};
    struct node nodes[6];
    struct conn conn;
    struct leader l;
    uv_loop_t loop;

    CHECK_EQ(uv_loop_init(&loop), 0);
    memset(&l, 0, sizeof(l));
    memset(nodes, 0, sizeof(nodes));
    memset(&conn, 0, sizeof(conn));
    l.loop = &loop;
    l.spec = &spec;
    l.nodes = nodes;
    l.nphys = 6;
    l.t_joined = 5;
    conn.peer.last_rx_ms = 1000;
    for (int i = 0; i < 6; i++) {
        snprintf(nodes[i].hostname, sizeof(nodes[i].hostname), "gpu-%03d", i);
        snprintf(nodes[i].addr, sizeof(nodes[i].addr), "10.0.0.%d", i + 1);
        nodes[i].nprocs = 2;
        nodes[i].slot = i;
        nodes[i].joined = i > 0;
    }
    nodes[1].conn = &conn;
    nodes[2].slot = -1;
    nodes[3].done = true;
    nodes[3].link_mbit = 9412.3456;
    nodes[4].lost = true;
    nodes[5].fenced = true;
    snprintf(nodes[5].preflight, sizeof(nodes[5].preflight), "gpu: \"cuda\" said \x1b[1mno\x1b[0m");
    snprintf(nodes[5].preflight_skipped, sizeof(nodes[5].preflight_skipped), "link: one node");
    for (int i = 0; i < 6; i++) {
        json_t *v = leader_node_view(&l, i, 1234);
        char *want = v ? json_dumps(v, JSON_COMPACT) : NULL;
        struct jtext t;

        jtext_init(&t);
        leader_node_line(&l, i, 1234, &t);
        CHECK(t.ok);
        CHECK(want != NULL);
        if (want && t.ok)
            CHECK_STR(t.p, want);
        /* What the batch script looks for (client/sbatch.c): a node given up, and only it. */
        if (t.ok)
            CHECK_EQ(strstr(t.p, "\"state\":\"lost\"") || strstr(t.p, "\"state\":\"fenced\""),
                     i == 4 || i == 5);
        free(want);
        json_decref(v);
        jtext_release(&t);
    }
    uv_loop_close(&loop);
}
