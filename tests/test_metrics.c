/* Tests of daemon/metrics: the Prometheus text a node writes for node_exporter's textfile
 * collector, sample by sample; label escaping; the file's name; the atomic write and the
 * removal. tests/integ/local_metrics.sh checks real jobs' files with promtool. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../daemon/metrics.h"
#include "test.h"
#include "banned.h"

static const struct metrics_rank two_ranks[] = {
    {.rank = 4,
     .step = 120,
     .loss = 2.5,
     .tokens_per_s = 8192,
     .report_age_ms = 1500,
     .step_seconds = 0.5,
     .output_age_ms = 250,
     .running = true},
    /* Never reported, never printed: no loss, throughput or ages, though it runs. */
    {.rank = 5,
     .step = 0,
     .loss = 0,
     .tokens_per_s = 0,
     .report_age_ms = -1,
     .step_seconds = NAN,
     .output_age_ms = -1,
     .running = true},
};

static const char want_two_ranks[] =
    "# HELP gpurun_node_state the job as this node's daemon sees it: 1 for the current state\n"
    "# TYPE gpurun_node_state gauge\n"
    "gpurun_node_state{job=\"77\",node=\"2\",host=\"node3\",state=\"joining\"} 0\n"
    "gpurun_node_state{job=\"77\",node=\"2\",host=\"node3\",state=\"spare\"} 0\n"
    "gpurun_node_state{job=\"77\",node=\"2\",host=\"node3\",state=\"running\"} 1\n"
    "gpurun_node_state{job=\"77\",node=\"2\",host=\"node3\",state=\"capture\"} 0\n"
    "gpurun_node_state{job=\"77\",node=\"2\",host=\"node3\",state=\"teardown\"} 0\n"
    "gpurun_node_state{job=\"77\",node=\"2\",host=\"node3\",state=\"done\"} 0\n"
    "# HELP gpurun_job_restarts times the job's ranks were restarted so far\n"
    "# TYPE gpurun_job_restarts gauge\n"
    "gpurun_job_restarts{job=\"77\",node=\"2\"} 1\n"
    "# HELP gpurun_node_heartbeat_age_seconds time since this node's daemon last heard the "
    "leader\n"
    "# TYPE gpurun_node_heartbeat_age_seconds gauge\n"
    "gpurun_node_heartbeat_age_seconds{job=\"77\",node=\"2\"} 0.250\n"
    "# HELP gpurun_rank_running 1 while the rank's process runs\n"
    "# TYPE gpurun_rank_running gauge\n"
    "gpurun_rank_running{job=\"77\",node=\"2\",rank=\"4\"} 1\n"
    "gpurun_rank_running{job=\"77\",node=\"2\",rank=\"5\"} 1\n"
    "# HELP gpurun_rank_step the step of the rank's last progress report\n"
    "# TYPE gpurun_rank_step gauge\n"
    "gpurun_rank_step{job=\"77\",node=\"2\",rank=\"4\"} 120\n"
    "gpurun_rank_step{job=\"77\",node=\"2\",rank=\"5\"} 0\n"
    "# HELP gpurun_rank_loss the loss of the rank's last progress report\n"
    "# TYPE gpurun_rank_loss gauge\n"
    "gpurun_rank_loss{job=\"77\",node=\"2\",rank=\"4\"} 2.5\n"
    "# HELP gpurun_rank_tokens_per_second the throughput of the rank's last progress report\n"
    "# TYPE gpurun_rank_tokens_per_second gauge\n"
    "gpurun_rank_tokens_per_second{job=\"77\",node=\"2\",rank=\"4\"} 8192\n"
    "# HELP gpurun_rank_step_seconds the rank's time per training step, averaged over about 50 "
    "steps (its own work where it reports step_time)\n"
    "# TYPE gpurun_rank_step_seconds gauge\n"
    "gpurun_rank_step_seconds{job=\"77\",node=\"2\",rank=\"4\"} 0.5\n"
    "# HELP gpurun_rank_report_age_seconds time since the rank's last progress report (what "
    "hang detection watches)\n"
    "# TYPE gpurun_rank_report_age_seconds gauge\n"
    "gpurun_rank_report_age_seconds{job=\"77\",node=\"2\",rank=\"4\"} 1.5\n"
    "# HELP gpurun_rank_output_age_seconds time since the rank's last output on stdout or "
    "stderr (--hang-watch output)\n"
    "# TYPE gpurun_rank_output_age_seconds gauge\n"
    "gpurun_rank_output_age_seconds{job=\"77\",node=\"2\",rank=\"4\"} 0.25\n";

TEST(metrics_render_every_sample)
{
    struct metrics_node n = {.job_id = "77",
                             .hostname = "node3",
                             .node = 2,
                             .state = "running",
                             .restarts = 1,
                             .leader_hb_age_ms = 250,
                             .ranks = two_ranks,
                             .nranks = 2};
    char *text = metrics_render(&n);

    CHECK(text != NULL);
    CHECK_STR(text, want_two_ranks);
    free(text);
}

/* Label values with the three bytes the format escapes; a NaN loss and a link to no leader
 * leave their samples out. */
TEST(metrics_render_escapes_and_omits)
{
    struct metrics_rank nan_loss = {.rank = 0,
                                    .step = 3,
                                    .loss = NAN,
                                    .tokens_per_s = 1,
                                    .report_age_ms = 10,
                                    .output_age_ms = -1,
                                    .running = false};
    struct metrics_node n = {.job_id = "a\"b\\c\nd",
                             .hostname = "h\"1",
                             .node = 0,
                             .state = "joining",
                             .restarts = 0,
                             .leader_hb_age_ms = -1,
                             .ranks = &nan_loss,
                             .nranks = 1};
    char *text = metrics_render(&n);

    CHECK(text != NULL);
    CHECK_CONTAINS(text, "gpurun_node_state{job=\"a\\\"b\\\\c\\nd\",node=\"0\",host=\"h\\\"1\","
                         "state=\"joining\"} 1\n");
    CHECK_CONTAINS(text, "gpurun_rank_running{job=\"a\\\"b\\\\c\\nd\",node=\"0\",rank=\"0\"} 0\n");
    CHECK(strstr(text, "gpurun_node_heartbeat_age_seconds{") == NULL);
    CHECK(strstr(text, "gpurun_rank_loss{") == NULL);
    CHECK_CONTAINS(text, "gpurun_rank_tokens_per_second{job=\"a\\\"b\\\\c\\nd\",node=\"0\","
                         "rank=\"0\"} 1\n");
    free(text);
}

TEST(metrics_path_names_the_job_and_node)
{
    char path[64];

    CHECK_EQ(metrics_path(path, sizeof(path), "/m", "1234", 3), 0);
    CHECK_STR(path, "/m/gpurun_1234_node3.prom");
    CHECK_EQ(metrics_path(path, sizeof(path), "/m", "local-2026/x y", 0), 0);
    CHECK_STR(path, "/m/gpurun_local-2026_x_y_node0.prom");
    CHECK_EQ(metrics_path(path, 16, "/m", "1234", 3), -ENAMETOOLONG);
}

/* The file appears whole, readable by another user (node_exporter's), no temp file stays;
 * a second write replaces it; remove takes it away and a second remove is not an error. */
TEST(metrics_write_and_remove)
{
    struct metrics_node n = {.job_id = "9",
                             .hostname = "h",
                             .node = 1,
                             .state = "running",
                             .leader_hb_age_ms = 0,
                             .ranks = two_ranks,
                             .nranks = 1};
    char dir[PATH_MAX], path[PATH_MAX + 64], buf[8192];
    struct stat st;
    struct dirent *e;
    FILE *f;
    DIR *d;
    size_t len;
    int files = 0;

    snprintf(dir, sizeof(dir), "%s/metrics", test_tmpdir());
    CHECK_EQ(mkdir(dir, 0755), 0);
    CHECK_EQ(metrics_write(dir, &n), 0);
    n.ranks = &two_ranks[1];
    CHECK_EQ(metrics_write(dir, &n), 0);
    CHECK_EQ(metrics_path(path, sizeof(path), dir, "9", 1), 0);
    CHECK_EQ(stat(path, &st), 0);
    CHECK_EQ(st.st_mode & 0777, 0644);
    f = fopen(path, "r");
    CHECK(f != NULL);
    len = fread(buf, 1, sizeof(buf) - 1, f);
    buf[len] = '\0';
    fclose(f);
    CHECK_CONTAINS(buf, "gpurun_rank_step{job=\"9\",node=\"1\",rank=\"5\"} 0\n");
    CHECK(strstr(buf, "rank=\"4\"") == NULL);
    d = opendir(dir);
    CHECK(d != NULL);
    while ((e = readdir(d)))
        files += e->d_name[0] != '.';
    closedir(d);
    CHECK_EQ(files, 1);
    CHECK_EQ(metrics_remove(dir, "9", 1), 0);
    CHECK(access(path, F_OK) < 0);
    CHECK_EQ(metrics_remove(dir, "9", 1), 0);
}

/* A folder that does not exist: an error, and nothing written anywhere. */
TEST(metrics_write_into_a_missing_folder)
{
    struct metrics_node n = {.job_id = "9", .hostname = "h", .node = 0, .state = "done"};
    char dir[PATH_MAX];

    snprintf(dir, sizeof(dir), "%s/no/such/dir", test_tmpdir());
    CHECK_EQ(metrics_write(dir, &n), -ENOENT);
}

/* The leader's file: every node serving the job with its straggler flag, each straggler's
 * ratio; labels escaped as the nodes' files escape them. */
TEST(metrics_leader_render_stragglers)
{
    struct metrics_leader_node nodes[] = {{.node = 0, .hostname = "n\"0", .straggler = false},
                                          {.node = 3, .hostname = "n3", .straggler = true}};
    struct metrics_leader_rank ranks[] = {{.rank = 5, .node = 3, .slower = 0.5}};
    struct metrics_leader m = {
        .job_id = "7", .nodes = nodes, .nnodes = 2, .ranks = ranks, .nranks = 1};
    char *text = metrics_leader_render(&m);

    CHECK(text != NULL);
    CHECK_STR(text,
              "# HELP gpurun_node_straggler 1 where a rank of the node is named a straggler "
              "(slower per step than the job's median by --straggler-threshold)\n"
              "# TYPE gpurun_node_straggler gauge\n"
              "gpurun_node_straggler{job=\"7\",node=\"0\",host=\"n\\\"0\"} 0\n"
              "gpurun_node_straggler{job=\"7\",node=\"3\",host=\"n3\"} 1\n"
              "# HELP gpurun_rank_straggler_ratio for a straggler, how much slower per step than "
              "the job's median (0.5: 50%)\n"
              "# TYPE gpurun_rank_straggler_ratio gauge\n"
              "gpurun_rank_straggler_ratio{job=\"7\",node=\"3\",rank=\"5\"} 0.5\n");
    free(text);
}
