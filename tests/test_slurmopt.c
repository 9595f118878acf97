/* Tests of client/slurmopt: the values of Slurm's options as sbatch reads them (time limits,
 * --signal, memory sizes, --mail-type, --dependency, --gres), shared by the command line and
 * a batch script read back. */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "../client/slurmopt.h"
#include "test.h"
#include "banned.h"

TEST(slurmopt_time_formats)
{
    static const struct {
        const char *s;
        long secs;
    } good[] = {
        {"1", 60},
        {"90", 5400},
        {"1:30", 90},
        {"1:02:03", 3723},
        {"2-0", 172800},
        {"1-2", 93600},
        {"1-2:3", 93780},
        {"1-2:3:4", 93784},
        {"UNLIMITED", 0},
        {"INFINITE", 0},
        {"0:1", 1},
        {"525600", 31536000},
        /* sbatch's --time=0: no limit, as UNLIMITED. */
        {"0", 0},
        {"0:0", 0},
        {"0-0", 0},
    };
    static const char *const bad[] = {"",       "a",          "1:",       "1:2:3:4", "1-",
                                      "-1",     "1-2-3",      "1.5",      " 1",      "1 ",
                                      "525601", "1234567890", "unlimited"};
    long v;

    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        v = -1;
        if (slurmopt_parse_time(good[i].s, &v) != 0 || v != good[i].secs)
            test_fail(__FILE__, __LINE__, "'%s': %ld seconds, expected %ld", good[i].s, v,
                      good[i].secs);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (slurmopt_parse_time(bad[i], &v) == 0)
            test_fail(__FILE__, __LINE__, "'%s' accepted as %ld seconds", bad[i], v);
    CHECK_EQ(slurmopt_parse_time("525601", &v), -ERANGE);
}

TEST(slurmopt_signal_values)
{
    static const struct {
        const char *s;
        int sig, time_s;
        bool batch, resv;
    } good[] = {
        {"USR1", SIGUSR1, 60, false, false},      {"B:USR1@120", SIGUSR1, 120, true, false},
        {"R:SIGUSR2@0", SIGUSR2, 0, false, true}, {"RB:12@65535", 12, 65535, true, true},
        {"br:usr2", SIGUSR2, 60, true, true},     {"10", 10, 60, false, false},
        {"sigusr1@5", SIGUSR1, 5, false, false},  {":USR1", SIGUSR1, 60, false, false},
    };
    static const struct {
        const char *s, *msg;
    } bad[] = {
        {"Q:USR1", "--signal: 'Q' is not R, B or RB (the flags before ':' in [{R|B}:]SIG[@TIME])"},
        {"BB:USR1",
         "--signal: 'BB' is not R, B or RB (the flags before ':' in [{R|B}:]SIG[@TIME])"},
        {"", "--signal: '' is not a signal (a number 1..64, or a name such as USR1 or SIGUSR1)"},
        {"B:", "--signal: '' is not a signal (a number 1..64, or a name such as USR1 or SIGUSR1)"},
        {"0", "--signal: '0' is not a signal (a number 1..64, or a name such as USR1 or SIGUSR1)"},
        {"65", "--signal: '65' is not a signal (a number 1..64, or a name such as USR1 or "
               "SIGUSR1)"},
        {"SIG", "--signal: 'SIG' is not a signal (a number 1..64, or a name such as USR1 or "
                "SIGUSR1)"},
        {"USR3@10", "--signal: 'USR3' is not a signal (a number 1..64, or a name such as USR1 "
                    "or SIGUSR1)"},
        {"10x", "--signal: '10x' is not a signal (a number 1..64, or a name such as USR1 or "
                "SIGUSR1)"},
        {"USR1@", "--signal: '' is not a TIME of 0..65535 seconds"},
        {"USR1@x", "--signal: 'x' is not a TIME of 0..65535 seconds"},
        {"USR1@-1", "--signal: '-1' is not a TIME of 0..65535 seconds"},
        {"USR1@65536", "--signal: '65536' is not a TIME of 0..65535 seconds"},
        {"USR1@1@2", "--signal: '1@2' is not a TIME of 0..65535 seconds"},
        {"B:TERM@90", "--signal: 'TERM': gpurun passes only USR1 or USR2 on to the ranks (the "
                      "time limit itself ends them with SIGTERM)"},
        {"ALRM", "--signal: 'ALRM': gpurun passes only USR1 or USR2 on to the ranks (the time "
                 "limit itself ends them with SIGTERM)"},
        {"64@1", "--signal: '64': gpurun passes only USR1 or USR2 on to the ranks (the time "
                 "limit itself ends them with SIGTERM)"},
    };

    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        struct slurmopt_signal sig = {0};
        struct errmsg err = {{0}};
        if (slurmopt_parse_signal(good[i].s, &sig, &err) != 0)
            test_fail(__FILE__, __LINE__, "'%s' refused: %s", good[i].s, err.text);
        if (sig.sig != good[i].sig || sig.time_s != good[i].time_s ||
            sig.batch_only != good[i].batch || sig.reservation != good[i].resv ||
            sig.text != good[i].s)
            test_fail(__FILE__, __LINE__,
                      "'%s': signal %d, %d s, B %d, R %d; expected %d, %d s, B %d, R %d", good[i].s,
                      sig.sig, sig.time_s, sig.batch_only, sig.reservation, good[i].sig,
                      good[i].time_s, good[i].batch, good[i].resv);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct slurmopt_signal sig = {0};
        struct errmsg err = {{0}};
        if (slurmopt_parse_signal(bad[i].s, &sig, &err) != -EINVAL)
            test_fail(__FILE__, __LINE__, "'%s' accepted as signal %d", bad[i].s, sig.sig);
        CHECK_STR(err.text, bad[i].msg);
        CHECK_EQ(sig.sig, 0);
    }
}

TEST(slurmopt_memory_sizes)
{
    static const struct {
        const char *text;
        unsigned long long mb;
    } good[] = {
        {"0", 0},     {"100", 100}, {"100M", 100}, {"100mb", 100},  {"1K", 1},
        {"1025k", 2}, {"2G", 2048}, {"2gB", 2048}, {"1T", 1 << 20}, {"1536M", 1536},
    };
    static const char *const bad[] = {"",   "M",   "10X",  "1.5G", "-1",
                                      " 1", "1G ", "1GBB", "1KM",  "G1"};
    unsigned long long mb;
    char buf[32];

    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        mb = 12345;
        if (slurmopt_parse_mem(good[i].text, &mb) != 0 || mb != good[i].mb)
            test_fail(__FILE__, __LINE__, "'%s': %llu MiB, not %llu", good[i].text, mb, good[i].mb);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (slurmopt_parse_mem(bad[i], &mb) != -EINVAL)
            test_fail(__FILE__, __LINE__, "'%s' taken as a size", bad[i]);
    CHECK_EQ(slurmopt_parse_mem("99999999999999999999", &mb), -ERANGE);
    CHECK_EQ(slurmopt_parse_mem("9999999999999T", &mb), -ERANGE);
    slurmopt_format_mem(buf, sizeof(buf), 80 * 1024);
    CHECK_STR(buf, "80G");
    slurmopt_format_mem(buf, sizeof(buf), 1536);
    CHECK_STR(buf, "1536M");
    slurmopt_format_mem(buf, sizeof(buf), 3 << 20);
    CHECK_STR(buf, "3T");
    slurmopt_format_mem(buf, sizeof(buf), 0);
    CHECK_STR(buf, "0M");
}

TEST(slurmopt_mail_types_dependencies_gres)
{
    static const char *const deps_ok[] = {
        "afterok:12",     "afterok:12:13",      "after:5+10",           "afterany:7_3",
        "afternotok:7_*", "singleton",          "afterok:1,afterany:2", "afterok:1?afternotok:2",
        "aftercorr:9",    "afterburstbuffer:4",
    };
    static const struct {
        const char *text, *why;
    } deps_bad[] = {
        {"foo", "'foo' is not after, afterany, afterburstbuffer, aftercorr, afternotok, afterok "
                "or singleton"},
        {"afterok", "'afterok' needs a job id (afterok:ID)"},
        {"afterok:", "'' is not a job id"},
        {"afterok:12x", "'12x' is not a job id"},
        {"afterok:12+5", "'12+5' is not a job id"},
        {"singleton:3", "'singleton' takes no job id"},
        {"afterok:1,afterany:2?after:3", "',' (all of) and '?' (any of) cannot be mixed"},
        {"afterok:1,", "'' is not after, afterany, afterburstbuffer, aftercorr, afternotok, "
                       "afterok or singleton"},
    };
    struct errmsg why;
    char bad[32];
    int r;

    for (size_t i = 0; i < sizeof(deps_ok) / sizeof(deps_ok[0]); i++)
        if (slurmopt_check_dependency(deps_ok[i], &why) != 0)
            test_fail(__FILE__, __LINE__, "'%s' refused: %s", deps_ok[i], why.text);
    for (size_t i = 0; i < sizeof(deps_bad) / sizeof(deps_bad[0]); i++) {
        why.text[0] = '\0';
        CHECK_EQ(slurmopt_check_dependency(deps_bad[i].text, &why), -EINVAL);
        CHECK_STR(why.text, deps_bad[i].why);
    }

    CHECK_EQ(slurmopt_parse_mail_type("END", bad, sizeof(bad)), (int)SLURMOPT_MAIL_END);
    CHECK_EQ(slurmopt_parse_mail_type("begin,Fail", bad, sizeof(bad)),
             (int)(SLURMOPT_MAIL_BEGIN | SLURMOPT_MAIL_FAIL));
    r = slurmopt_parse_mail_type("ALL", bad, sizeof(bad));
    CHECK_EQ(r,
             (int)(SLURMOPT_MAIL_BEGIN | SLURMOPT_MAIL_END | SLURMOPT_MAIL_FAIL |
                   SLURMOPT_MAIL_REQUEUE | SLURMOPT_MAIL_STAGE_OUT | SLURMOPT_MAIL_INVALID_DEPEND));
    CHECK_EQ(slurmopt_parse_mail_type("NONE", bad, sizeof(bad)), 0);
    CHECK_EQ(slurmopt_parse_mail_type("END,sometimes", bad, sizeof(bad)), -EINVAL);
    CHECK_STR(bad, "sometimes");
    CHECK_EQ(slurmopt_parse_mail_type("END,", bad, sizeof(bad)), -EINVAL);
    CHECK_STR(bad, "");

    CHECK_EQ(slurmopt_check_gres("nvme:1", &why), 0);
    CHECK_EQ(slurmopt_check_gres("gres:tmp:ssd:2,nvme", &why), 0);
    CHECK_EQ(slurmopt_check_gres("gpu:2", &why), -EINVAL);
    CHECK_STR(why.text, "the GPUs are --gpus-per-node's (or --no-gpus)");
    CHECK_EQ(slurmopt_check_gres("nvme:1,gres/gpu:a100:1", &why), -EINVAL);
    CHECK_EQ(slurmopt_check_gres("nvme:1,", &why), -EINVAL);
    CHECK_STR(why.text, "an item without a name ('')");
    CHECK_EQ(slurmopt_check_gres(":1", &why), -EINVAL);

    /* sbatch's --gres gpu[:TYPE][:N]: the GPU item out, the rest kept in order. */
    {
        static const struct {
            const char *in;
            int gpus;
            const char *type, *rest, *why;
        } cases[] = {
            {"gpu:2", 2, "", "", NULL},
            {"gpu:a100:4", 4, "a100", "", NULL},
            {"gpu", 1, "", "", NULL},
            {"gpu:h100_80gb", 1, "h100_80gb", "", NULL},
            {"nvme:1,gres/gpu:a100:2,tmp:ssd:3", 2, "a100", "nvme:1,tmp:ssd:3", NULL},
            {"gres:gpu:8,nvme", 8, "", "nvme", NULL},
            {"gpus:2", 0, "", "gpus:2", NULL},
            {"nvme:1", 0, "", "nvme:1", NULL},
            {"gpu:1,gpu:2", 0, "", "", "more than one GPU item"},
            {"gpu:a100:", 0, "", "", "'' is not a number of GPUs"},
            {"gpu::2", 0, "", "", "an empty GPU type"},
            {"gpu:2000", 0, "", "", "2000 GPUs: must be 1..1024 per node"},
            {"gpu:a/b:1", 0, "", "", "'a/b' is not a GPU type"},
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            char type[SLURMOPT_GPU_TYPE_MAX + 1], rest[SLURMOPT_GRES_LEN_MAX + 1];
            int gpus = -1;
            why.text[0] = '\0';
            r = slurmopt_split_gres(cases[i].in, &gpus, type, sizeof(type), rest, sizeof(rest),
                                    &why);
            if (cases[i].why) {
                if (r != -EINVAL || strcmp(why.text, cases[i].why))
                    test_fail(__FILE__, __LINE__, "'%s': %d '%s', not -EINVAL '%s'", cases[i].in, r,
                              why.text, cases[i].why);
                continue;
            }
            if (r != 0 || gpus != cases[i].gpus || strcmp(type, cases[i].type) ||
                strcmp(rest, cases[i].rest))
                test_fail(__FILE__, __LINE__, "'%s': %d, %d '%s' '%s', not %d '%s' '%s' (%s)",
                          cases[i].in, r, gpus, type, rest, cases[i].gpus, cases[i].type,
                          cases[i].rest, why.text);
        }
    }
}
