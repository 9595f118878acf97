/* Tests of lib/traincfg: a full train.cfg, the defaults, overrides, the sbatch time forms, the
 * JSON dump, and every kind of error with its exact "FILE:LINE: text". Each test runs in its
 * scratch directory with the file at jobs/t.cfg, the way a user names one. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "traincfg.h"
#include "test.h"
#include "banned.h"

#define CFG "jobs/t.cfg"

static void write_cfg(const char *text)
{
    CHECK_EQ(chdir(test_tmpdir()), 0);
    CHECK_EQ(fs_mkdirs("jobs", 0700), 0);
    CHECK_EQ(fs_write_atomic(CFG, text, strlen(text), 0600), 0);
}

/* Loads text as jobs/t.cfg and runs the checks; returns the first failure's code, err filled. */
static int load_text(const char *text, struct errmsg *err)
{
    struct traincfg cfg;
    int rc;

    write_cfg(text);
    memset(err, 0, sizeof(*err));
    CHECK_EQ(traincfg_init(&cfg), 0);
    rc = traincfg_load(&cfg, CFG, err);
    if (rc == 0)
        rc = traincfg_check(&cfg, err);
    traincfg_release(&cfg);
    return rc;
}

#define CHECK_LOAD_ERROR(cfg_text, msg)                                                            \
    do {                                                                                           \
        struct errmsg e_;                                                                          \
        CHECK_EQ(load_text(cfg_text, &e_), -EINVAL);                                               \
        CHECK_STR(e_.text, msg);                                                                   \
    } while (0)

static const char good_cfg[] = "# a small job\n"
                               "[job]\n"
                               "nodes = 2\n"
                               "gpus_per_node = 4\n"
                               "time = 1-02:30\n"
                               "partition = gpu\n"
                               "job_name = tiny run\n"
                               "\n"
                               "[model]\n"
                               "    n_layer = 2      # indented, with a comment\n"
                               "    n_head = 4\n"
                               "n_embd=64\n"
                               "seq_len = 128 ; libinih's inline comment\n"
                               "init_from = /abs/gpt2.bin\n"
                               "[data]\n"
                               "train = ../data/train_*.bin, /abs/extra.bin\n"
                               "val = ../data/val_000000.bin\n"
                               "[optim]\n"
                               "lr = 1e-3\n"
                               "min_lr = 1e-4\n"
                               "warmup_steps = 5\n"
                               "weight_decay = 0\n"
                               "grad_clip = 0.5\n"
                               "[train]\n"
                               "batch_size = 8\n"
                               "grad_accum = 2\n"
                               "steps = 40\n"
                               "out_dir = ../runs/t\n"
                               "resume = yes\n"
                               "seed = 7\n"
                               "device = cuda\n"
                               "dtype = fp32\n"
                               "zero = 1\n"
                               "threads = 2\n"
                               "sample_tokens = 0\n";

TEST(traincfg_good_file)
{
    struct traincfg cfg;
    struct errmsg err = {0};

    write_cfg(good_cfg);
    CHECK_EQ(traincfg_init(&cfg), 0);
    CHECK_EQ(traincfg_load(&cfg, CFG, &err), 0);
    CHECK_EQ(traincfg_check(&cfg, &err), 0);
    CHECK_EQ(cfg.nodes, 2);
    CHECK_EQ(cfg.gpus_per_node, 4);
    CHECK_EQ(cfg.time_min, (24 + 2) * 60 + 30);
    CHECK_STR(cfg.partition, "gpu");
    CHECK_STR(cfg.job_name, "tiny run");
    CHECK(cfg.account == NULL && cfg.output == NULL);
    CHECK_EQ(cfg.n_layer, 2);
    CHECK_EQ(cfg.n_head, 4);
    CHECK_EQ(cfg.n_embd, 64);
    CHECK_EQ(cfg.seq_len, 128);
    CHECK_EQ(cfg.vocab_size, 256);
    CHECK_STR(cfg.init_from, "/abs/gpt2.bin");
    /* Relative paths of the file are relative to its directory, each element of a list. */
    CHECK_STR(cfg.train, "jobs/../data/train_*.bin,/abs/extra.bin");
    CHECK_STR(cfg.val, "jobs/../data/val_000000.bin");
    CHECK(cfg.lr == 1e-3 && cfg.min_lr == 1e-4);
    CHECK_EQ(cfg.warmup_steps, 5);
    CHECK(cfg.weight_decay == 0.0 && cfg.grad_clip == 0.5);
    CHECK(cfg.beta1 == 0.9 && cfg.beta2 == 0.95 && cfg.eps == 1e-8);
    CHECK_EQ(cfg.batch_size, 8);
    CHECK_EQ(cfg.grad_accum, 2);
    CHECK_EQ(cfg.steps, 40);
    CHECK_STR(cfg.out_dir, "jobs/../runs/t");
    CHECK_EQ(cfg.resume, TRAINCFG_RESUME_ON);
    CHECK_EQ(cfg.seed, 7);
    CHECK_EQ(cfg.device, TRAINCFG_DEVICE_CUDA);
    CHECK_EQ(cfg.dtype, TRAINCFG_DTYPE_FP32);
    CHECK_EQ(cfg.zero, 1);
    CHECK_EQ(cfg.threads, 2);
    CHECK_EQ(cfg.sample_tokens, 0);
    CHECK_STR(cfg.path, CFG);
    traincfg_release(&cfg);
}

TEST(traincfg_defaults)
{
    struct traincfg cfg;
    struct errmsg err = {0};
    size_t n;
    const struct traincfg_key *k = traincfg_keys(&n);

    CHECK_EQ(traincfg_init(&cfg), 0);
    CHECK_EQ(cfg.nodes, 1);
    CHECK_EQ(cfg.gpus_per_node, 1);
    CHECK_EQ(cfg.time_min, 0);
    CHECK_EQ(cfg.n_layer, 12);
    CHECK_EQ(cfg.n_head, 12);
    CHECK_EQ(cfg.n_embd, 768);
    CHECK_EQ(cfg.seq_len, 1024);
    CHECK_EQ(cfg.vocab_size, 256);
    CHECK(cfg.lr == 6e-4 && cfg.min_lr == 0.0 && cfg.weight_decay == 0.1 && cfg.grad_clip == 1.0);
    CHECK_EQ(cfg.batch_size, 4);
    CHECK_EQ(cfg.grad_accum, 1);
    CHECK_EQ(cfg.eval_batches, 20);
    CHECK_STR(cfg.out_dir, "out");
    CHECK_EQ(cfg.resume, TRAINCFG_RESUME_AUTO); /* a re-run goes on, never starts over */
    CHECK_EQ(cfg.device, TRAINCFG_DEVICE_CPU);
    CHECK_EQ(cfg.dtype, TRAINCFG_DTYPE_BF16); /* the cuda backend's default */
    CHECK_EQ(cfg.zero, 0);
    CHECK_EQ(cfg.log_every, 1);
    CHECK_EQ(cfg.coll_timeout_s, 600); /* torch's default process group timeout is 10 min */
    CHECK(cfg.train == NULL && cfg.val == NULL && cfg.init_from == NULL && cfg.path == NULL);
    /* Without [data] train the defaults alone are not a job. */
    CHECK_EQ(traincfg_check(&cfg, &err), -EINVAL);
    CHECK_STR(err.text, "command line: [data] train is not set");
    traincfg_release(&cfg);

    /* Every row is well-formed: a default sits in its own range, every origin starts as the
     * default. */
    CHECK(n > 30 && n <= TRAINCFG_MAX_KEYS);
    CHECK_EQ(traincfg_init(&cfg), 0);
    for (size_t i = 0; i < n; i++) {
        CHECK(k[i].help && *k[i].help);
        CHECK_EQ(cfg.origin[i], TRAINCFG_FROM_DEFAULT);
        if (k[i].type == TRAINCFG_INT)
            CHECK(*(int *)((char *)&cfg + k[i].offset) >= k[i].min &&
                  *(int *)((char *)&cfg + k[i].offset) <= k[i].max);
        if (k[i].type == TRAINCFG_FLOAT)
            CHECK(*(double *)((char *)&cfg + k[i].offset) >= k[i].min &&
                  *(double *)((char *)&cfg + k[i].offset) <= k[i].max);
    }
    traincfg_release(&cfg);
}

TEST(traincfg_origins)
{
    struct traincfg cfg;
    struct errmsg err = {0};
    size_t n;
    const struct traincfg_key *k = traincfg_keys(&n);

    write_cfg("[model]\nn_layer = 3\n\n[train]\nsteps = 9\n");
    CHECK_EQ(traincfg_init(&cfg), 0);
    CHECK_EQ(traincfg_load(&cfg, CFG, &err), 0);
    CHECK_EQ(traincfg_override(&cfg, "train.steps=11", &err), 0);
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(k[i].name, "n_layer"))
            CHECK_EQ(cfg.origin[i], 2);
        else if (!strcmp(k[i].name, "steps"))
            CHECK_EQ(cfg.origin[i], TRAINCFG_FROM_CMDLINE);
        else
            CHECK_EQ(cfg.origin[i], TRAINCFG_FROM_DEFAULT);
    }
    CHECK_EQ(cfg.steps, 11);
    traincfg_release(&cfg);
}

TEST(traincfg_file_errors)
{
    CHECK_LOAD_ERROR("[train]\nsteps = 3\nstepz = 4\n", CFG ":3: 'train.stepz': unknown key");
    CHECK_LOAD_ERROR("[model]\nn_layer = 2\n[modle]\n", CFG ":3: unknown section '[modle]'");
    CHECK_LOAD_ERROR("steps = 3\n[train]\n", CFG ":1: 'steps' is outside any section");
    CHECK_LOAD_ERROR("[optim]\nlr = 1e-3\n\n  lr = 2e-3\n",
                     CFG ":4: 'optim.lr': given twice (first on line 2)");
    CHECK_LOAD_ERROR("[model]\nn_layer = four\n",
                     CFG ":2: 'model.n_layer': 'four' is not an integer");
    CHECK_LOAD_ERROR("[model]\nn_layer = 4.5\n",
                     CFG ":2: 'model.n_layer': '4.5' is not an integer");
    CHECK_LOAD_ERROR("[model]\nn_layer =\n", CFG ":2: 'model.n_layer': '' is not an integer");
    CHECK_LOAD_ERROR("[model]\nn_layer = 0\n",
                     CFG ":2: 'model.n_layer': 0 is out of range 1..1024");
    CHECK_LOAD_ERROR("[model]\nvocab_size = 70000\n",
                     CFG ":2: 'model.vocab_size': 70000 is out of range 1..65536");
    CHECK_LOAD_ERROR("[train]\nsteps = 99999999999999999999\n",
                     CFG ":2: 'train.steps': 99999999999999999999 is out of range 1..1000000000");
    CHECK_LOAD_ERROR("[optim]\nlr = fast\n", CFG ":2: 'optim.lr': 'fast' is not a number");
    CHECK_LOAD_ERROR("[optim]\nlr = nan\n", CFG ":2: 'optim.lr': 'nan' is not a number");
    CHECK_LOAD_ERROR("[optim]\nlr = -1\n", CFG ":2: 'optim.lr': -1 is out of range 0..10");
    CHECK_LOAD_ERROR("[train]\nresume = maybe\n",
                     CFG ":2: 'train.resume': 'maybe' is not auto or a boolean (true/false, "
                         "yes/no, on/off, 1/0)");
    CHECK_LOAD_ERROR("[train]\ndevice = gpu\n",
                     CFG ":2: 'train.device': 'gpu' is not one of cpu, cuda");
    CHECK_LOAD_ERROR("[train]\ndtype = fp16\n",
                     CFG ":2: 'train.dtype': 'fp16' is not one of bf16, fp32");
    CHECK_LOAD_ERROR("[train]\nzero = 2\n", CFG ":2: 'train.zero': 2 is out of range 0..1");
    CHECK_LOAD_ERROR("[job]\ntime = 1:2:3:4\n",
                     CFG ":2: 'job.time': '1:2:3:4' is not a time (MINUTES, MM:SS, HH:MM:SS, "
                         "D-HH[:MM[:SS]])");
    CHECK_LOAD_ERROR("[job]\nnodes = 1\nthis line has no value\n",
                     CFG ":3: expected '[section]' or 'key = value'");
    CHECK_LOAD_ERROR("[job\nnodes = 1\n", CFG ":1: expected '[section]' or 'key = value'");
    CHECK_LOAD_ERROR("[job]\nnodes = 1\n[train]\nseed = x\nbroken\n",
                     CFG ":4: 'train.seed': 'x' is not an integer");
}

TEST(traincfg_long_line)
{
    char text[400];
    int n = snprintf(text, sizeof(text), "[train]\nout_dir = ");

    memset(text + n, 'a', 250);
    snprintf(text + n + 250, sizeof(text) - (size_t)n - 250, "\n");
    CHECK_LOAD_ERROR(text, CFG ":2: line longer than 197 characters");
}

TEST(traincfg_cross_key_errors)
{
    /* The line of the key set last is the one named. */
    CHECK_LOAD_ERROR("[data]\ntrain = x.bin\n[model]\nn_layer = 2\nn_embd = 64\n\nn_head = 5\n",
                     CFG ":7: n_head (5) must divide n_embd (64)");
    CHECK_LOAD_ERROR("[data]\ntrain = x.bin\n[model]\nn_head = 5\nn_embd = 64\n",
                     CFG ":5: n_head (5) must divide n_embd (64)");
    /* A default on one side: the key that was set. */
    CHECK_LOAD_ERROR("[data]\ntrain = x.bin\n[model]\nn_embd = 100\n",
                     CFG ":4: n_head (12) must divide n_embd (100)");
    CHECK_LOAD_ERROR("[data]\ntrain = x.bin\n[optim]\nmin_lr = 0.01\n",
                     CFG ":4: min_lr (0.01) must not exceed lr (0.0006)");
    CHECK_LOAD_ERROR("[data]\ntrain = x.bin\n[optim]\nbeta2 = 1\n",
                     CFG ":4: beta2 (1) must be below 1");
    CHECK_LOAD_ERROR("[data]\ntrain = x.bin\n[optim]\neps = 0\n",
                     CFG ":4: eps (0) must be above 0");
    CHECK_LOAD_ERROR("[data]\ntrain = x.bin\n[model]\nseq_len = 65536\n[train]\nbatch_size = "
                     "65536\n",
                     CFG ":6: batch_size (65536) times seq_len (65536) is too large");
    CHECK_LOAD_ERROR("[model]\nn_layer = 2\n", CFG ": [data] train is not set");
}

/* dtype and zero belong to the cuda backend: set with device cpu they are errors naming the
 * key set last; dtype's default (bf16) is not, and a cpu run reads fp32. */
TEST(traincfg_cuda_keys)
{
    struct traincfg cfg;
    struct errmsg err = {0};
    const char *cpu[] = {"train.device=cpu"};
    json_t *j;

    CHECK_LOAD_ERROR("[data]\ntrain = x.bin\n[train]\ndtype = bf16\n",
                     CFG ":4: dtype 'bf16' needs device 'cuda' (the cpu backend computes in fp32)");
    CHECK_LOAD_ERROR("[data]\ntrain = x.bin\n[train]\ndtype = bf16\ndevice = cpu\n",
                     CFG ":5: dtype 'bf16' needs device 'cuda' (the cpu backend computes in fp32)");
    CHECK_LOAD_ERROR("[data]\ntrain = x.bin\n[train]\nzero = 1\n",
                     CFG ":4: zero (1) needs device 'cuda' (ZeRO-1 shards the cuda backend's "
                         "optimizer state)");
    CHECK_LOAD_ERROR("[data]\ntrain = x.bin\n[train]\nattention = own\n",
                     CFG ":4: attention 'own' needs device 'cuda' and dtype 'bf16' (the choice is "
                         "between bf16 attentions)");
    CHECK_LOAD_ERROR("[data]\ntrain = x.bin\n[train]\ndevice = cuda\ndtype = fp32\n"
                     "attention = cudnn\n",
                     CFG ":6: attention 'cudnn' needs device 'cuda' and dtype 'bf16' (the choice "
                         "is between bf16 attentions)");
    CHECK_LOAD_ERROR("[data]\ntrain = x.bin\n[train]\ndevice = cuda\nattention = flash\n",
                     CFG ":5: 'train.attention': 'flash' is not one of auto, cudnn, own");
    CHECK_EQ(load_text("[data]\ntrain = x.bin\n[train]\ndevice = cuda\nattention = own\n", &err),
             0);
    CHECK_EQ(load_text("[data]\ntrain = x.bin\n[train]\ndtype = fp32\nzero = 0\n", &err), 0);
    CHECK_EQ(
        load_text("[data]\ntrain = x.bin\n[train]\ndevice = cuda\ndtype = bf16\nzero = 1\n", &err),
        0);

    /* An override that turns a cuda file into a cpu run: the command line is named. */
    write_cfg(good_cfg);
    CHECK_EQ(traincfg_read(&cfg, CFG, cpu, 1, &err), -EINVAL);
    CHECK_STR(err.text, "command line: zero (1) needs device 'cuda' (ZeRO-1 shards the cuda "
                        "backend's optimizer state)");

    /* The effective dtype of a cpu run, also in the JSON a checkpoint keeps. */
    write_cfg("[data]\ntrain = x.bin\n");
    CHECK_EQ(traincfg_read(&cfg, CFG, NULL, 0, &err), 0);
    CHECK_EQ(cfg.dtype, TRAINCFG_DTYPE_FP32);
    j = traincfg_to_json(&cfg);
    CHECK(j != NULL);
    CHECK_STR(json_string_value(json_object_get(json_object_get(j, "train"), "dtype")), "fp32");
    json_decref(j);
    traincfg_release(&cfg);
    write_cfg("[data]\ntrain = x.bin\n[train]\ndevice = cuda\n");
    CHECK_EQ(traincfg_read(&cfg, CFG, NULL, 0, &err), 0);
    CHECK_EQ(cfg.dtype, TRAINCFG_DTYPE_BF16);
    CHECK_EQ(cfg.zero, 0);
    traincfg_release(&cfg);
}

TEST(traincfg_missing_file)
{
    struct traincfg cfg;
    struct errmsg err = {0};

    CHECK_EQ(chdir(test_tmpdir()), 0);
    CHECK_EQ(traincfg_init(&cfg), 0);
    CHECK_EQ(traincfg_load(&cfg, "jobs/none.cfg", &err), -ENOENT);
    CHECK_STR(err.text, "cannot read 'jobs/none.cfg': No such file or directory");
    traincfg_release(&cfg);
}

TEST(traincfg_overrides)
{
    struct traincfg cfg;
    struct errmsg err = {0};
    const char *ov[] = {
        "train.steps=12",         "data.val=",   "model.n_layer=6", "train.steps=13",
        "data.train=other/*.bin", "job.time=90", "train.resume=off"};

    write_cfg(good_cfg);
    CHECK_EQ(traincfg_read(&cfg, CFG, ov, sizeof(ov) / sizeof(ov[0]), &err), 0);
    CHECK_EQ(cfg.steps, 13); /* the later override wins */
    CHECK(cfg.val == NULL);  /* an empty value unsets */
    CHECK_EQ(cfg.n_layer, 6);
    CHECK_STR(cfg.train, "other/*.bin"); /* relative to the working directory */
    CHECK_EQ(cfg.time_min, 90);
    CHECK_EQ(cfg.resume, TRAINCFG_RESUME_OFF);
    CHECK_EQ(cfg.batch_size, 8); /* the file's values stay */
    traincfg_release(&cfg);

    CHECK_EQ(traincfg_init(&cfg), 0);
    CHECK_EQ(traincfg_override(&cfg, "train.stepz=3", &err), -EINVAL);
    CHECK_STR(err.text, "command line: 'train.stepz': unknown key");
    CHECK_EQ(traincfg_override(&cfg, "steps=3", &err), -EINVAL);
    CHECK_STR(err.text, "command line: 'steps=3': expected section.key=value");
    CHECK_EQ(traincfg_override(&cfg, "train.steps", &err), -EINVAL);
    CHECK_STR(err.text, "command line: 'train.steps': expected section.key=value");
    CHECK_EQ(traincfg_override(&cfg, "train.steps=-3", &err), -EINVAL);
    CHECK_STR(err.text, "command line: 'train.steps': -3 is out of range 1..1000000000");
    CHECK_EQ(traincfg_override(&cfg, "train.device=tpu", &err), -EINVAL);
    CHECK_STR(err.text, "command line: 'train.device': 'tpu' is not one of cpu, cuda");
    /* train.resume: auto, or any boolean spelling. */
    CHECK_EQ(traincfg_override(&cfg, "train.resume=1", &err), 0);
    CHECK_EQ(cfg.resume, TRAINCFG_RESUME_ON);
    CHECK_EQ(traincfg_override(&cfg, "train.resume=Auto", &err), 0);
    CHECK_EQ(cfg.resume, TRAINCFG_RESUME_AUTO);
    CHECK_EQ(traincfg_override(&cfg, "train.resume=no", &err), 0);
    CHECK_EQ(cfg.resume, TRAINCFG_RESUME_OFF);
    CHECK_EQ(traincfg_override(&cfg, "train.resume=sometimes", &err), -EINVAL);
    CHECK_STR(err.text, "command line: 'train.resume': 'sometimes' is not auto or a boolean "
                        "(true/false, yes/no, on/off, 1/0)");
    CHECK_EQ(cfg.resume, TRAINCFG_RESUME_OFF);
    {
        json_t *j;
        CHECK_EQ(traincfg_override(&cfg, "train.resume=auto", &err), 0);
        j = traincfg_to_json(&cfg);
        CHECK(j != NULL);
        CHECK_STR(json_string_value(json_object_get(json_object_get(j, "train"), "resume")),
                  "auto");
        json_decref(j);
    }
    traincfg_release(&cfg);

    /* A cross-key fault brought by an override names the command line. */
    {
        const char *bad[] = {"model.n_head=5"};
        CHECK_EQ(traincfg_read(&cfg, CFG, bad, 1, &err), -EINVAL);
        CHECK_STR(err.text, "command line: n_head (5) must divide n_embd (64)");
    }
    /* No file at all: overrides alone. */
    {
        const char *only[] = {"data.train=d.bin", "model.n_embd=96", "model.n_head=3"};
        CHECK_EQ(traincfg_read(&cfg, NULL, only, 3, &err), 0);
        CHECK_STR(cfg.train, "d.bin");
        CHECK_EQ(cfg.n_head, 3);
        traincfg_release(&cfg);
    }
}

TEST(traincfg_override_syntax)
{
    CHECK(traincfg_is_override("train.steps=3"));
    CHECK(traincfg_is_override("data.val="));
    CHECK(traincfg_is_override("optim.beta2=0.99"));
    CHECK(!traincfg_is_override("jobs/tiny.cfg"));
    CHECK(!traincfg_is_override("steps=3"));
    CHECK(!traincfg_is_override("./a.b=3"));
    CHECK(!traincfg_is_override(".steps=3"));
    CHECK(!traincfg_is_override("train.=3"));
    CHECK(!traincfg_is_override("Train.Steps=3"));
}

TEST(traincfg_time)
{
    static const struct {
        const char *s;
        int minutes;
    } good[] = {
        {"0", 0},      {"90", 90},       {"5:00", 5},         {"5:01", 6},
        {"0:30", 1},   {"1:00:00", 60},  {"2:30:59", 151},    {"1-0", 1440},
        {"1-2", 1560}, {"1-2:30", 1590}, {"1-2:30:01", 1591}, {"10-00:00:00", 14400},
    };
    static const char *const bad[] = {"",          "x",  "1:",   ":5",   "1:2:3:4", "-1", "1-",
                                      "1-2:3:4:5", "1h", "1 :2", "1--2", "1-2-3",   "+5"};
    int m;

    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        m = -1;
        if (traincfg_parse_time(good[i].s, &m) != 0 || m != good[i].minutes)
            test_fail(__FILE__, __LINE__, "'%s': %d, expected %d", good[i].s, m, good[i].minutes);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (traincfg_parse_time(bad[i], &m) != -EINVAL)
            test_fail(__FILE__, __LINE__, "'%s' was accepted", bad[i]);
    CHECK_EQ(traincfg_parse_time("99999999999", &m), -ERANGE);
    CHECK_EQ(traincfg_parse_time("9999999999-0", &m), -ERANGE);
}

TEST(traincfg_json)
{
    struct traincfg cfg;
    struct errmsg err = {0};
    json_t *j, *model, *train, *data;
    size_t n, total = 0;
    const char *sec;
    json_t *v;

    write_cfg(good_cfg);
    CHECK_EQ(traincfg_read(&cfg, CFG, NULL, 0, &err), 0);
    j = traincfg_to_json(&cfg);
    CHECK(j != NULL);
    model = json_object_get(j, "model");
    train = json_object_get(j, "train");
    data = json_object_get(j, "data");
    CHECK_EQ(json_integer_value(json_object_get(model, "n_embd")), 64);
    CHECK(json_real_value(json_object_get(json_object_get(j, "optim"), "lr")) == 1e-3);
    CHECK_STR(json_string_value(json_object_get(train, "device")), "cuda");
    CHECK(json_is_true(json_object_get(train, "resume")));
    CHECK_STR(json_string_value(json_object_get(data, "val")), "jobs/../data/val_000000.bin");
    CHECK(json_is_null(json_object_get(json_object_get(j, "job"), "account")));
    CHECK_EQ(json_integer_value(json_object_get(json_object_get(j, "job"), "time")), 1590);
    CHECK_STR(json_string_value(json_object_get(j, "file")), CFG);
    /* Every key of the table, once. */
    traincfg_keys(&n);
    json_object_foreach(j, sec, v)
    {
        if (json_is_object(v))
            total += json_object_size(v);
    }
    CHECK_EQ(total, n);
    json_decref(j);
    traincfg_release(&cfg);
}
