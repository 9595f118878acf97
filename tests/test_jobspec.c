/* Tests of lib/jobspec: job.json written and read back, and the errors a hand-edited or
 * foreign file must get, each naming the file and the key. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "jobspec.h"
#include "test.h"
#include "banned.h"

static const char *spec_path(const char *name)
{
    static char path[4200];
    snprintf(path, sizeof(path), "%s/%s", test_tmpdir(), name);
    return path;
}

static const char *write_text(const char *name, const char *text)
{
    const char *path = spec_path(name);
    CHECK_EQ(fs_write_atomic(path, text, strlen(text), 0600), 0);
    return path;
}

/* Loads text as a spec; returns jobspec_load's result with err filled. */
static int load_text(const char *text, struct errmsg *err)
{
    const char *path = write_text("job.json", text);
    struct jobspec spec;
    int rc;

    jobspec_init(&spec);
    memset(err, 0, sizeof(*err));
    rc = jobspec_load(&spec, path, err);
    jobspec_release(&spec);
    return rc;
}

TEST(jobspec_defaults)
{
    struct jobspec spec;

    jobspec_init(&spec);
    CHECK_EQ(spec.nnodes, 1);
    CHECK_EQ(spec.nprocs, 1);
    CHECK_EQ(spec.join_timeout_ms, 300000);
    CHECK_EQ(spec.hb_interval_ms, 1000);
    CHECK_EQ(spec.hb_timeout_ms, 10000);
    CHECK_EQ(spec.hang_timeout_ms, 0);
    CHECK_EQ(spec.kill_grace_ms, 5000);
    CHECK_EQ(spec.max_restarts, 0);
    CHECK(!spec.loopback);
    CHECK(spec.job_id == NULL && spec.argv == NULL && spec.env == NULL && spec.workdir == NULL);
    CHECK(spec.name == NULL);
    jobspec_release(&spec);
}

TEST(jobspec_round_trip)
{
    char *argv[] = {"python3", "train.py", "--lr", "3e-4", "with space", "\"quoted\""};
    const char *path = spec_path("job.json");
    struct jobspec spec, back;
    struct errmsg err = {{0}};
    struct stat st;

    jobspec_init(&spec);
    spec.job_id = strdup("local-1700000000-42");
    spec.workdir = strdup("/scratch/run 1");
    spec.name = strdup("train.py \"v2\"");
    spec.nnodes = 3;
    spec.nprocs = 8;
    spec.join_timeout_ms = 1234;
    spec.hb_interval_ms = 50;
    spec.hb_timeout_ms = 500;
    spec.hang_timeout_ms = 60000;
    spec.kill_grace_ms = 0;
    spec.max_restarts = 2;
    spec.loopback = true;
    CHECK_EQ(jobspec_set_argv(&spec, 6, argv), 0);
    CHECK_EQ(jobspec_add_env(&spec, "NCCL_DEBUG=INFO"), 0);
    CHECK_EQ(jobspec_add_env(&spec, "EMPTY="), 0);
    CHECK_EQ(jobspec_add_env(&spec, "X=a=b"), 0);
    CHECK_EQ(jobspec_save(&spec, path), 0);
    CHECK_EQ(stat(path, &st), 0);
    CHECK_EQ(st.st_mode & 0777, 0600);

    jobspec_init(&back);
    if (jobspec_load(&back, path, &err) != 0)
        test_fail(__FILE__, __LINE__, "load failed: %s", err.text);
    CHECK_STR(back.job_id, spec.job_id);
    CHECK_STR(back.workdir, spec.workdir);
    CHECK_STR(back.name, "train.py \"v2\"");
    CHECK_EQ(back.nnodes, 3);
    CHECK_EQ(back.nprocs, 8);
    CHECK_EQ(back.join_timeout_ms, 1234);
    CHECK_EQ(back.hb_interval_ms, 50);
    CHECK_EQ(back.hb_timeout_ms, 500);
    CHECK_EQ(back.hang_timeout_ms, 60000);
    CHECK_EQ(back.kill_grace_ms, 0);
    CHECK_EQ(back.max_restarts, 2);
    CHECK(back.loopback);
    for (int i = 0; i < 6; i++)
        CHECK_STR(back.argv[i], argv[i]);
    CHECK(back.argv[6] == NULL);
    CHECK_STR(back.env[0], "NCCL_DEBUG=INFO");
    CHECK_STR(back.env[1], "EMPTY=");
    CHECK_STR(back.env[2], "X=a=b");
    CHECK(back.env[3] == NULL);

    /* Saving again replaces the file; the copy reads the same. */
    back.nprocs = 2;
    CHECK_EQ(jobspec_save(&back, path), 0);
    jobspec_release(&spec);
    jobspec_init(&spec);
    CHECK_EQ(jobspec_load(&spec, path, &err), 0);
    CHECK_EQ(spec.nprocs, 2);
    CHECK_STR(spec.argv[5], "\"quoted\"");
    jobspec_release(&spec);
    jobspec_release(&back);
}

TEST(jobspec_minimal_file_takes_defaults)
{
    const char *path = write_text("job.json", "{\"job_id\": \"j\", \"argv\": [\"true\"]}");
    struct jobspec spec;
    struct errmsg err;

    jobspec_init(&spec);
    CHECK_EQ(jobspec_load(&spec, path, &err), 0);
    CHECK_STR(spec.job_id, "j");
    CHECK_STR(spec.argv[0], "true");
    CHECK(spec.argv[1] == NULL);
    CHECK_EQ(spec.nnodes, 1);
    CHECK_EQ(spec.kill_grace_ms, 5000);
    CHECK(spec.workdir == NULL);
    CHECK(spec.name == NULL);
    jobspec_release(&spec);
}

/* The job's name: written only when set, read back as written, a string or an error. */
TEST(jobspec_name_key)
{
    char *argv[] = {"python3", "train.py"};
    const char *path = spec_path("job.json");
    struct jobspec spec, back;
    struct errmsg err = {{0}};
    char *text = NULL;
    size_t len;

    jobspec_init(&spec);
    spec.job_id = strdup("j");
    CHECK_EQ(jobspec_set_argv(&spec, 2, argv), 0);
    CHECK_EQ(jobspec_save(&spec, path), 0);
    CHECK_EQ(fs_read_all(path, 65536, &text, &len), 0);
    if (strstr(text, "\"name\""))
        test_fail(__FILE__, __LINE__, "a spec without a name wrote one: %s", text);
    free(text);
    text = NULL;

    spec.name = strdup("resnet-50 run");
    CHECK_EQ(jobspec_save(&spec, path), 0);
    CHECK_EQ(fs_read_all(path, 65536, &text, &len), 0);
    CHECK_CONTAINS(text, "\"name\": \"resnet-50 run\"");
    free(text);
    jobspec_init(&back);
    CHECK_EQ(jobspec_load(&back, path, &err), 0);
    CHECK_STR(back.name, "resnet-50 run");
    jobspec_release(&back);

    /* Not UTF-8: nothing written, as for every string of the spec. */
    free(spec.name);
    spec.name = strdup("caf\xe9");
    CHECK_EQ(jobspec_save(&spec, spec_path("latin1.json")), -EINVAL);
    CHECK_EQ(access(spec_path("latin1.json"), F_OK), -1);
    jobspec_release(&spec);

    CHECK_EQ(load_text("{\"job_id\":\"j\",\"argv\":[\"x\"],\"name\":3}", &err), -EINVAL);
    CHECK_CONTAINS(err.text, spec_path("job.json"));
    CHECK_CONTAINS(err.text, "'name' must be a string");
}

/* --output-ranks: kept as given, checked against the job's ranks where it is read. */
TEST(jobspec_output_ranks_key)
{
    char *argv[] = {"x"};
    const char *path = spec_path("job.json");
    struct jobspec spec, back;
    struct errmsg err = {{0}};

    jobspec_init(&spec);
    spec.job_id = strdup("j");
    spec.nnodes = 2;
    spec.nprocs = 2;
    spec.output_ranks = strdup("0,2-3");
    CHECK_EQ(jobspec_set_argv(&spec, 1, argv), 0);
    CHECK_EQ(jobspec_save(&spec, path), 0);
    jobspec_init(&back);
    CHECK_EQ(jobspec_load(&back, path, &err), 0);
    CHECK_STR(back.output_ranks, "0,2-3");
    jobspec_release(&back);
    jobspec_release(&spec);

    CHECK_EQ(load_text("{\"job_id\":\"j\",\"argv\":[\"x\"],\"nprocs\":2,\"output_ranks\":\"1-2\"}",
                       &err),
             -EINVAL);
    CHECK_CONTAINS(err.text, spec_path("job.json"));
    CHECK_CONTAINS(err.text, "'output_ranks': '1-2' is not a rank 0..1");
}

/* The container keys: kept as given, checked where they are read. */
TEST(jobspec_container_keys)
{
    char *argv[] = {"python3"};
    const char *path = spec_path("job.json");
    struct jobspec spec, back;
    struct errmsg err = {{0}};

    jobspec_init(&spec);
    spec.job_id = strdup("j");
    spec.container_image = strdup("localhost/train:1");
    spec.container_mounts = strdup("/data:/data:ro");
    spec.container_workdir = strdup("/work");
    spec.container_env = strdup("PATH");
    spec.container_runtime = strdup("podman");
    CHECK_EQ(jobspec_set_argv(&spec, 1, argv), 0);
    CHECK_EQ(jobspec_save(&spec, path), 0);
    jobspec_init(&back);
    CHECK_EQ(jobspec_load(&back, path, &err), 0);
    CHECK_STR(back.container_image, "localhost/train:1");
    CHECK_STR(back.container_mounts, "/data:/data:ro");
    CHECK_STR(back.container_workdir, "/work");
    CHECK_STR(back.container_env, "PATH");
    CHECK_STR(back.container_runtime, "podman");
    jobspec_release(&back);
    jobspec_release(&spec);

    CHECK_EQ(load_text("{\"job_id\":\"j\",\"argv\":[\"x\"],\"container_image\":\"i\","
                       "\"container_mounts\":\"data:/data\"}",
                       &err),
             -EINVAL);
    CHECK_CONTAINS(err.text,
                   "'container_mounts': 'data:/data': the source must be an absolute path");
    CHECK_EQ(load_text("{\"job_id\":\"j\",\"argv\":[\"x\"],\"container_image\":\"i\","
                       "\"container_runtime\":\"lxc\"}",
                       &err),
             -EINVAL);
    CHECK_CONTAINS(err.text, "'container_runtime': no runtime 'lxc'");
    CHECK_EQ(load_text("{\"job_id\":\"j\",\"argv\":[\"x\"],\"container_env\":\"A\"}", &err),
             -EINVAL);
    CHECK_CONTAINS(err.text, "container options without 'container_image'");
}

TEST(jobspec_unknown_key)
{
    struct errmsg err;

    CHECK_EQ(load_text("{\"job_id\":\"j\",\"argv\":[\"x\"],\"nodes\":2}", &err), -EINVAL);
    CHECK_CONTAINS(err.text, spec_path("job.json"));
    CHECK_CONTAINS(err.text, "unknown key 'nodes'");
}

TEST(jobspec_out_of_range)
{
    static const char *const bad[][2] = {
        {"{\"job_id\":\"j\",\"argv\":[\"x\"],\"nnodes\":0}", "'nnodes'"},
        {"{\"job_id\":\"j\",\"argv\":[\"x\"],\"nnodes\":65537}", "'nnodes'"},
        {"{\"job_id\":\"j\",\"argv\":[\"x\"],\"nprocs\":-1}", "'nprocs'"},
        {"{\"job_id\":\"j\",\"argv\":[\"x\"],\"hb_interval_ms\":9}", "'hb_interval_ms'"},
        {"{\"job_id\":\"j\",\"argv\":[\"x\"],\"max_restarts\":4294967296}", "'max_restarts'"},
        {"{\"job_id\":\"j\",\"argv\":[\"x\"],\"kill_grace_ms\":-1}", "'kill_grace_ms'"},
    };
    struct errmsg err;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECK_EQ(load_text(bad[i][0], &err), -EINVAL);
        CHECK_CONTAINS(err.text, spec_path("job.json"));
        CHECK_CONTAINS(err.text, bad[i][1]);
    }
    /* The bounds themselves are in range. */
    CHECK_EQ(load_text("{\"job_id\":\"j\",\"argv\":[\"x\"],\"nnodes\":65536,\"nprocs\":1}", &err),
             0);
}

TEST(jobspec_wrong_types)
{
    static const char *const bad[][2] = {
        {"{\"job_id\":\"j\",\"argv\":[\"x\"],\"nnodes\":\"2\"}", "'nnodes'"},
        {"{\"job_id\":\"j\",\"argv\":[\"x\"],\"nnodes\":2.5}", "'nnodes'"},
        {"{\"job_id\":7,\"argv\":[\"x\"]}", "'job_id'"},
        {"{\"job_id\":\"j\",\"argv\":\"x\"}", "'argv'"},
        {"{\"job_id\":\"j\",\"argv\":[\"x\", 1]}", "'argv'"},
        {"{\"job_id\":\"j\",\"argv\":[\"x\"],\"env\":{\"A\":\"1\"}}", "'env'"},
        {"{\"job_id\":\"j\",\"argv\":[\"x\"],\"loopback\":1}", "'loopback'"},
        {"{\"job_id\":\"j\",\"argv\":[\"x\"],\"workdir\":null}", "'workdir'"},
        {"{\"job_id\":\"j\",\"argv\":[\"x\"],\"version\":2}", "'version'"},
        {"{\"job_id\":\"j\",\"argv\":[\"x\"],\"env\":[\"NOEQUALS\"]}", "'env'"},
    };
    struct errmsg err;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (load_text(bad[i][0], &err) != -EINVAL)
            test_fail(__FILE__, __LINE__, "accepted: %s", bad[i][0]);
        CHECK_CONTAINS(err.text, spec_path("job.json"));
        CHECK_CONTAINS(err.text, bad[i][1]);
    }
}

TEST(jobspec_missing_job_id_or_argv)
{
    struct errmsg err;

    CHECK_EQ(load_text("{\"argv\":[\"x\"]}", &err), -EINVAL);
    CHECK_CONTAINS(err.text, spec_path("job.json"));
    CHECK_CONTAINS(err.text, "'job_id'");
    CHECK_EQ(load_text("{\"job_id\":\"j\"}", &err), -EINVAL);
    CHECK_CONTAINS(err.text, "'argv'");
    CHECK_EQ(load_text("{\"job_id\":\"j\",\"argv\":[]}", &err), -EINVAL);
    CHECK_CONTAINS(err.text, "'argv'");
}

TEST(jobspec_not_json_or_not_object)
{
    struct errmsg err;

    CHECK_EQ(load_text("{\"job_id\":\"j\",\n\"argv\":[\"x\"],,}", &err), -EINVAL);
    CHECK_CONTAINS(err.text, spec_path("job.json"));
    /* file:line, the line of the error. */
    CHECK_CONTAINS(err.text, ":2:");
    CHECK_EQ(load_text("[1, 2]", &err), -EINVAL);
    CHECK_CONTAINS(err.text, "not a JSON object");
    CHECK_EQ(load_text("{\"job_id\":\"j\",\"job_id\":\"k\",\"argv\":[\"x\"]}", &err), -EINVAL);
}

TEST(jobspec_missing_file)
{
    struct jobspec spec;
    struct errmsg err = {{0}};

    jobspec_init(&spec);
    CHECK_EQ(jobspec_load(&spec, spec_path("nope.json"), &err), -ENOENT);
    CHECK_CONTAINS(err.text, spec_path("nope.json"));
    jobspec_release(&spec);
}

TEST(jobspec_add_env_checks_form)
{
    struct jobspec spec;

    jobspec_init(&spec);
    CHECK_EQ(jobspec_add_env(&spec, "NOEQUALS"), -EINVAL);
    CHECK_EQ(jobspec_add_env(&spec, "=value"), -EINVAL);
    CHECK(spec.env == NULL);
    CHECK_EQ(jobspec_add_env(&spec, "A=1"), 0);
    CHECK_STR(spec.env[0], "A=1");
    CHECK(spec.env[1] == NULL);
    jobspec_release(&spec);
}

TEST(jobspec_set_argv_replaces)
{
    char *one[] = {"a", "b"}, *two[] = {"c"};
    struct jobspec spec;

    jobspec_init(&spec);
    CHECK_EQ(jobspec_set_argv(&spec, 2, one), 0);
    CHECK_EQ(jobspec_set_argv(&spec, 1, two), 0);
    CHECK_STR(spec.argv[0], "c");
    CHECK(spec.argv[1] == NULL);
    jobspec_release(&spec);
}

/* A command line is bytes, not necessarily UTF-8; JSON strings are UTF-8. A spec that
 * cannot be written as it is must fail to save, never lose an argument on the way. */
TEST(jobspec_save_refuses_what_json_cannot_hold)
{
    char *argv[] = {"prog", "caf\xe9", "last"};
    const char *path = spec_path("job.json");
    struct jobspec spec;

    jobspec_init(&spec);
    spec.job_id = strdup("j");
    CHECK_EQ(jobspec_set_argv(&spec, 3, argv), 0);
    CHECK_EQ(jobspec_save(&spec, path), -EINVAL);
    CHECK_EQ(access(path, F_OK), -1);

    CHECK_EQ(jobspec_set_argv(&spec, 1, argv), 0);
    CHECK_EQ(jobspec_add_env(&spec, "LANG=caf\xe9"), 0);
    CHECK_EQ(jobspec_save(&spec, path), -EINVAL);
    CHECK_EQ(access(path, F_OK), -1);

    jobspec_release(&spec);
    jobspec_init(&spec);
    spec.job_id = strdup("j");
    CHECK_EQ(jobspec_set_argv(&spec, 1, argv), 0);
    spec.workdir = strdup("/tmp/caf\xe9");
    CHECK_EQ(jobspec_save(&spec, path), -EINVAL);
    CHECK_EQ(access(path, F_OK), -1);
    jobspec_release(&spec);
}

/* --spare-nodes alone implies a restart per spare for the failures a spare fixes; the user's
 * --max-restarts and --restart-on stand, and a choice that leaves the spares idle is said. */
TEST(jobspec_spares_imply_restarts)
{
    struct jobspec spec;
    char note[256];

    jobspec_init(&spec);
    CHECK(!jobspec_spare_restarts(&spec, false, false, note, sizeof(note)));
    CHECK_STR(note, "");
    CHECK_EQ(spec.max_restarts, 0);

    spec.spare_nodes = 2;
    CHECK(jobspec_spare_restarts(&spec, false, false, note, sizeof(note)));
    CHECK_EQ(spec.max_restarts, 2);
    CHECK_EQ(spec.restart_on, RESTART_ON_SPARES);
    CHECK_STR(note, "--spare-nodes 2: up to 2 restarts after a node or hang failure, for a spare "
                    "to take the failed node's place (--max-restarts sets another number)");

    /* --restart-on given: its classes are kept. */
    spec.max_restarts = 0;
    spec.restart_on = RESTART_ON_ALL;
    CHECK(jobspec_spare_restarts(&spec, false, true, note, sizeof(note)));
    CHECK_EQ(spec.max_restarts, 2);
    CHECK_EQ(spec.restart_on, RESTART_ON_ALL);
    CHECK_CONTAINS(note, "after a failure --restart-on names");

    /* --max-restarts given: the user's number, even below the spares. */
    spec.max_restarts = 1;
    spec.restart_on = RESTART_ON_DEFAULT;
    CHECK(!jobspec_spare_restarts(&spec, true, false, note, sizeof(note)));
    CHECK_EQ(spec.max_restarts, 1);
    CHECK_EQ(spec.restart_on, RESTART_ON_DEFAULT);
    CHECK_STR(note, "");

    /* --max-restarts 0, or --restart-on without node and hang: the spares will stay idle. */
    spec.max_restarts = 0;
    CHECK(!jobspec_spare_restarts(&spec, true, false, note, sizeof(note)));
    CHECK_EQ(spec.max_restarts, 0);
    CHECK_STR(note, "--spare-nodes 2 with --max-restarts 0: the spares will stay idle (a spare "
                    "takes a failed node's place at a restart)");
    spec.spare_nodes = 1;
    spec.restart_on = 1 << FAILURE_SIGNAL;
    CHECK(!jobspec_spare_restarts(&spec, false, true, note, sizeof(note)));
    CHECK_EQ(spec.max_restarts, 0);
    CHECK_CONTAINS(note, "--restart-on names neither node nor hang");
    CHECK_CONTAINS(note, "the spare will stay idle");
    jobspec_release(&spec);
}
