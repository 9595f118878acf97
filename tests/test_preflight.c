/* Tests of daemon/preflight's rule of a skipped check: the GPU memory check asked for but
 * not possible is named with why, never passed in silence; one not asked is no skip. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../daemon/preflight.h"
#include "test.h"
#include "banned.h"

TEST(preflight_memory_check_without_nvml_is_skipped)
{
    char s[256];

    preflight_memory_skip(50, "libnvidia-ml.so.1: cannot open shared object file", false, s,
                          sizeof(s));
    CHECK_STR(s, "GPU memory (--min-gpu-free 50): no NVML (libnvidia-ml.so.1: cannot open "
                 "shared object file)");
    preflight_memory_skip(90, "nvmlInit_v2: Driver Not Loaded", false, s, sizeof(s));
    CHECK_STR(s, "GPU memory (--min-gpu-free 90): no NVML (nvmlInit_v2: Driver Not Loaded)");
    preflight_memory_skip(90, NULL, false, s, sizeof(s));
    CHECK_STR(s, "GPU memory (--min-gpu-free 90): NVML lacks nvmlDeviceGetHandleByIndex_v2 or "
                 "nvmlDeviceGetMemoryInfo");
}

TEST(preflight_memory_check_made_or_off_is_no_skip)
{
    char s[256] = "x";

    preflight_memory_skip(90, NULL, true, s, sizeof(s));
    CHECK_STR(s, "");
    preflight_memory_skip(90, "", true, s, sizeof(s));
    CHECK_STR(s, "");
    s[0] = 'x';
    preflight_memory_skip(0, "libnvidia-ml.so.1: cannot open shared object file", false, s,
                          sizeof(s));
    CHECK_STR(s, "");
}

/* The job dir's check: a dir a file cannot be made in fails, naming it and why; a writable
 * one passes and keeps nothing of the check. */
TEST(preflight_job_dir_written)
{
    struct jobspec spec;
    char dir[4200], why[256], skipped[256];

    jobspec_init(&spec);
    spec.preflight = 1;
    spec.gpus_per_node = 0;
    spec.min_free_mb = 0;
    snprintf(dir, sizeof(dir), "%s/none", test_tmpdir());
    preflight_run(&spec, dir, 3, why, sizeof(why), skipped, sizeof(skipped));
    CHECK_CONTAINS(why, "job dir '");
    CHECK_CONTAINS(why, "/none' cannot be written: No such file or directory");
    CHECK_EQ(mkdir(dir, 0700), 0);
    preflight_run(&spec, dir, 3, why, sizeof(why), skipped, sizeof(skipped));
    CHECK_STR(why, "");
    CHECK_STR(skipped, "");
    CHECK_EQ(rmdir(dir), 0);
    jobspec_release(&spec);
}

/* Links are timed where a median of two of them could fail one: three nodes or more (spares
 * count), or gpurun preflight at any size. */
TEST(preflight_links_timed_where_they_can_be_judged)
{
    CHECK(!preflight_link_timed(1, false));
    CHECK(!preflight_link_timed(2, false));
    CHECK(preflight_link_timed(3, false));
    CHECK(preflight_link_timed(64, false));
    CHECK(preflight_link_timed(2, true));
    CHECK(preflight_link_timed(1, true));
}
