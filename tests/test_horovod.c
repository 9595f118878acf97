/* Tests of client/horovod: whether a job uses horovod (so that its leader opens horovod's
 * rendezvous port), from --horovod, the command's words and its script's text, as
 * lib/scripthead reads it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../client/args.h"
#include "../client/horovod.h"
#include "../lib/scripthead.h"
#include "test.h"
#include "banned.h"

#define ARGV(...) ((char *const[]){__VA_ARGS__, NULL})
#define ARGC(...) ((int)(sizeof((char *const[]){__VA_ARGS__}) / sizeof(char *)))
#define SEEN(text, ...)                                                                            \
    horovod_seen(ARGV(__VA_ARGS__), ARGC(__VA_ARGS__), (text), (text) ? strlen(text) : 0)

TEST(horovod_seen_in_the_command_or_its_script)
{
    const char *none = NULL;

    /* The command names it: a script, a wrapper, a module. */
    CHECK(SEEN(none, "python3", "train_horovod.py"));
    CHECK(SEEN(none, "./horovodrun-like.sh", "-np", "4"));
    CHECK(SEEN(none, "python3", "-m", "horovod.runner.launch"));
    /* The script does, in any case: an import, a framework's strategy name, a variable. */
    CHECK(SEEN("import torch\nimport horovod.torch as hvd\nhvd.init()\n", "python3", "bench.py"));
    CHECK(SEEN("trainer = Trainer(strategy=\"horovod\")\n", "python3", "fit.py"));
    CHECK(SEEN("port = os.environ['HOROVOD_GLOO_RENDEZVOUS_PORT']\n", "python3", "x.py"));
    CHECK(SEEN("# Horovod's synthetic benchmark\n", "python3", "bench.py"));
    /* Neither: torch's DDP, accelerate, a shell command. */
    CHECK(!SEEN("import torch.distributed as dist\ndist.init_process_group('nccl')\n", "python3",
                "ddp.py"));
    CHECK(!SEEN(none, "accelerate", "launch", "train.py"));
    CHECK(!SEEN("", "sh", "-c", "sleep 1"));
    /* The word cut by the end of what was read is not the word. */
    CHECK(!horovod_seen(ARGV("python3", "x.py"), 2, "import horovo", 13));
    CHECK(!horovod_seen(ARGV("python3", "x.py"), 2, "import horovod", 13));
}

/* Writes text to dir/name (mode mode) and returns the path (static, one at a time). */
static const char *write_file(const char *name, const char *text, mode_t mode)
{
    static char path[4200];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", test_tmpdir(), name);
    f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    CHECK_EQ(fclose(f), 0);
    CHECK_EQ(chmod(path, mode), 0);
    return path;
}

TEST(script_head_reads_the_script_the_command_runs)
{
    char buf[256], py[4200], sh[4200], elf[4200], dir[4200];
    int argc;

    snprintf(py, sizeof(py), "%s", write_file("b.py", "import horovod.torch\n", 0644));
    snprintf(sh, sizeof(sh), "%s", write_file("run", "#!/bin/sh\nexec horovod-thing\n", 0755));
    snprintf(elf, sizeof(elf), "%s", write_file("tool", "\177ELF horovod", 0755));
    snprintf(dir, sizeof(dir), "%s", test_tmpdir());
    /* The first word ending in ".py" that is a file. */
    argc = 3;
    CHECK_EQ(script_head(NULL, ARGV("python3", "missing.py", py), argc, buf, sizeof(buf)), 21);
    CHECK(!memcmp(buf, "import horovod.torch\n", 21));
    /* A script run as the command: read when it starts with "#!". */
    CHECK_EQ(script_head(NULL, ARGV(sh, "x"), 2, buf, sizeof(buf)), 29);
    /* A binary is not read; nor a directory, nor nothing. */
    CHECK_EQ(script_head(NULL, ARGV(elf), 1, buf, sizeof(buf)), 0);
    CHECK_EQ(script_head(NULL, ARGV(dir), 1, buf, sizeof(buf)), 0);
    CHECK_EQ(script_head(NULL, ARGV("python3", "-c", "pass"), 3, buf, sizeof(buf)), 0);
    /* At most cap bytes. */
    CHECK_EQ(script_head(NULL, ARGV("python3", py), 2, buf, 6), 6);
}

TEST(horovod_decide_choice_beats_the_rule)
{
    char py[4200], plain[4200];

    snprintf(py, sizeof(py), "%s", write_file("h.py", "import horovod.torch as hvd\n", 0644));
    snprintf(plain, sizeof(plain), "%s", write_file("p.py", "import torch\n", 0644));
    CHECK_EQ(horovod_decide(HOROVOD_AUTO, ARGV("python3", py), 2), 1);
    CHECK_EQ(horovod_decide(HOROVOD_AUTO, ARGV("python3", plain), 2), 0);
    CHECK_EQ(horovod_decide(HOROVOD_OFF, ARGV("python3", py), 2), 0);
    CHECK_EQ(horovod_decide(HOROVOD_ON, ARGV("python3", plain), 2), 1);
}

static int parse(struct gpurun_args *a, char *const *words, int n)
{
    struct errmsg err;

    args_init(a);
    memset(&err, 0, sizeof(err));
    return args_parse(a, n, (char **)words, &err);
}

TEST(horovod_option)
{
    struct gpurun_args a;

    CHECK_EQ(parse(&a, ARGV("gpurun", "--local", "--", "true"), 4), 0);
    CHECK_EQ(a.horovod, HOROVOD_AUTO);
    args_release(&a);
    CHECK_EQ(parse(&a, ARGV("gpurun", "--local", "--horovod", "--", "true"), 5), 0);
    CHECK_EQ(a.horovod, HOROVOD_ON);
    args_release(&a);
    CHECK_EQ(parse(&a, ARGV("gpurun", "--local", "--horovod=off", "--", "true"), 5), 0);
    CHECK_EQ(a.horovod, HOROVOD_OFF);
    args_release(&a);
    CHECK_EQ(parse(&a, ARGV("gpurun", "--local", "--horovod=auto", "--", "true"), 5), 0);
    CHECK_EQ(a.horovod, HOROVOD_AUTO);
    args_release(&a);
    CHECK(parse(&a, ARGV("gpurun", "--local", "--horovod=maybe", "--", "true"), 5) < 0);
    args_release(&a);
}
