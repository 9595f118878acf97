/* Tests of daemon/memckpt: a copy is kept whole or not at all, a newer copy replaces the
 * older one only once it is complete, the cap refuses with the sizes said and keeps the
 * older copy, bad names are refused, and the close leaves nothing behind. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../daemon/memckpt.h"
#include "test.h"
#include "banned.h"

/* Writes n bytes of c as rank's temp file of name, as a rank does. */
static void write_tmp(struct memckpt *m, int rank, const char *name, char c, size_t n)
{
    char path[4200], buf[4096];
    int fd;

    CHECK_EQ(memckpt_tmp_path(m, rank, name, path, sizeof(path)), 0);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    CHECK(fd >= 0);
    memset(buf, c, sizeof(buf));
    for (size_t done = 0; done < n;) {
        size_t k = n - done < sizeof(buf) ? n - done : sizeof(buf);
        CHECK_EQ(write(fd, buf, k), (ssize_t)k);
        done += k;
    }
    close(fd);
}

static char first_byte(const char *path)
{
    char c = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    CHECK(fd >= 0);
    CHECK_EQ(read(fd, &c, 1), 1);
    close(fd);
    return c;
}

TEST(memckpt_keeps_the_newest_complete_copy)
{
    char dir[4096], path[4200];
    struct memckpt *m;
    struct errmsg err;
    int64_t step;
    uint64_t size;

    snprintf(dir, sizeof(dir), "%s/mem", test_tmpdir());
    CHECK_EQ(memckpt_open(dir, 1 << 20, &m), 0);
    CHECK_EQ(memckpt_find(m, 3, "state", path, sizeof(path), &step, &size), -ENOENT);
    write_tmp(m, 3, "state", 'a', 1000);
    CHECK_EQ(memckpt_keep(m, 3, "state", 10, &err), 0);
    CHECK_EQ(memckpt_find(m, 3, "state", path, sizeof(path), &step, &size), 0);
    CHECK_EQ(step, 10);
    CHECK_EQ(size, 1000);
    CHECK_EQ(first_byte(path), 'a');
    /* A rank killed while writing its next copy: the temp file is there, not kept, and the
     * older copy is what a load finds. */
    write_tmp(m, 3, "state", 'b', 500);
    CHECK_EQ(memckpt_find(m, 3, "state", path, sizeof(path), &step, &size), 0);
    CHECK_EQ(step, 10);
    CHECK_EQ(first_byte(path), 'a');
    /* Its next save replaces it whole. */
    write_tmp(m, 3, "state", 'c', 2000);
    CHECK_EQ(memckpt_keep(m, 3, "state", 20, &err), 0);
    CHECK_EQ(memckpt_find(m, 3, "state", path, sizeof(path), &step, &size), 0);
    CHECK_EQ(step, 20);
    CHECK_EQ(size, 2000);
    CHECK_EQ(first_byte(path), 'c');
    CHECK_EQ(memckpt_kept(m), 2000);
    /* Another rank's, another name's: apart. */
    write_tmp(m, 4, "state", 'd', 100);
    CHECK_EQ(memckpt_keep(m, 4, "state", 20, &err), 0);
    write_tmp(m, 3, "optim.0", 'e', 100);
    CHECK_EQ(memckpt_keep(m, 3, "optim.0", 20, &err), 0);
    CHECK_EQ(memckpt_kept(m), 2200);
    /* A keep without a temp file. */
    CHECK_EQ(memckpt_keep(m, 5, "state", 1, &err), -ENOENT);
    memckpt_close(m);
    CHECK_EQ(access(dir, F_OK), -1);
}

TEST(memckpt_cap_refuses_and_keeps_the_older_copy)
{
    char dir[4096], path[4200];
    struct memckpt *m;
    struct errmsg err;
    int64_t step;
    uint64_t size;

    snprintf(dir, sizeof(dir), "%s/mem", test_tmpdir());
    CHECK_EQ(memckpt_open(dir, 3000, &m), 0);
    write_tmp(m, 0, "state", 'a', 2000);
    CHECK_EQ(memckpt_keep(m, 0, "state", 1, &err), 0);
    /* A replacement counts without the copy it replaces: 2,500 fits 3,000. */
    write_tmp(m, 0, "state", 'b', 2500);
    CHECK_EQ(memckpt_keep(m, 0, "state", 2, &err), 0);
    write_tmp(m, 1, "state", 'c', 600);
    CHECK_EQ(memckpt_keep(m, 1, "state", 2, &err), -ENOSPC);
    CHECK_STR(err.text, "rank 1's memory checkpoint 'state' (600 bytes) does not fit "
                        "--mem-ckpt-max 3000 bytes beside the 2500 kept; the older copy stays");
    CHECK_EQ(memckpt_tmp_path(m, 1, "state", path, sizeof(path)), 0);
    CHECK_EQ(access(path, F_OK), -1); /* the refused temp file is gone */
    CHECK_EQ(memckpt_find(m, 1, "state", path, sizeof(path), &step, &size), -ENOENT);
    write_tmp(m, 0, "state", 'd', 3001);
    CHECK_EQ(memckpt_keep(m, 0, "state", 3, &err), -ENOSPC);
    CHECK_EQ(memckpt_find(m, 0, "state", path, sizeof(path), &step, &size), 0);
    CHECK_EQ(step, 2);
    CHECK_EQ(first_byte(path), 'b');
    memckpt_close(m);
}

TEST(memckpt_names_and_the_rule)
{
    char dir[4096], path[4200];
    struct memckpt *m;
    struct errmsg err;

    snprintf(dir, sizeof(dir), "%s/mem", test_tmpdir());
    CHECK_EQ(memckpt_open(dir, 100, &m), 0);
    CHECK_EQ(memckpt_tmp_path(m, 0, "../x", path, sizeof(path)), -EINVAL);
    CHECK_EQ(memckpt_tmp_path(m, 0, ".hidden", path, sizeof(path)), -EINVAL);
    CHECK_EQ(memckpt_tmp_path(m, 0, "", path, sizeof(path)), -EINVAL);
    CHECK_EQ(memckpt_tmp_path(m, -1, "state", path, sizeof(path)), -EINVAL);
    CHECK_EQ(memckpt_tmp_path(m, 0, "state", path, 8), -ENAMETOOLONG);
    CHECK_EQ(memckpt_keep(m, 0, "a/b", 1, &err), -EINVAL);
    memckpt_close(m);
    CHECK(memckpt_fits(0, 0, 100, 100));
    CHECK(!memckpt_fits(0, 0, 101, 100));
    CHECK(memckpt_fits(90, 90, 100, 100));
    CHECK(!memckpt_fits(91, 90, 100, 100));
    CHECK(memckpt_default_cap(1) >= memckpt_default_cap(4) * 4 - 4);
}

/* Writes text as path (a whole small file). */
static void put_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

    CHECK(fd >= 0);
    CHECK_EQ(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

TEST(memckpt_sweep_removes_only_dead_daemons_stores)
{
    char parent[4200], dead[4300], path[4400], own[4300], bare[4300], other[4300];
    struct memckpt *m;
    struct errmsg err;
    struct stat st;

    snprintf(parent, sizeof(parent), "%s/shm", test_tmpdir());
    CHECK_EQ(mkdir(parent, 0700), 0);
    /* A store this process owns (memckpt_open writes its owner file): kept. */
    snprintf(own, sizeof(own), "%s/gpurun-live-n0", parent);
    CHECK_EQ(memckpt_open(own, 1 << 20, &m), 0);
    write_tmp(m, 0, "state", 'a', 100);
    CHECK_EQ(memckpt_keep(m, 0, "state", 1, &err), 0);
    /* A killed daemon's: its pid no longer runs, or runs as another process (start time). */
    snprintf(dead, sizeof(dead), "%s/gpurun-dead-n1", parent);
    CHECK_EQ(mkdir(dead, 0700), 0);
    snprintf(path, sizeof(path), "%s/owner", dead);
    put_file(path, "2147483646 12345\n");
    snprintf(path, sizeof(path), "%s/r1.state", dead);
    put_file(path, "old state");
    snprintf(other, sizeof(other), "%s/gpurun-reused-n0", parent);
    CHECK_EQ(mkdir(other, 0700), 0);
    snprintf(path, sizeof(path), "%s/owner", other);
    snprintf(bare, sizeof(bare), "%ld 1\n", (long)getpid());
    put_file(path, bare);
    /* Without an owner file (not a store, or one being made), and not ours by name: left. */
    snprintf(bare, sizeof(bare), "%s/gpurun-bare-n0", parent);
    CHECK_EQ(mkdir(bare, 0700), 0);
    snprintf(path, sizeof(path), "%s/other-dead", parent);
    CHECK_EQ(mkdir(path, 0700), 0);
    snprintf(path, sizeof(path), "%s/other-dead/owner", parent);
    put_file(path, "2147483646 12345\n");

    CHECK_EQ(memckpt_sweep(parent, "gpurun-"), 2);
    CHECK_EQ(stat(dead, &st), -1);
    CHECK_EQ(stat(other, &st), -1);
    CHECK_EQ(stat(own, &st), 0);
    CHECK_EQ(stat(bare, &st), 0);
    snprintf(path, sizeof(path), "%s/other-dead", parent);
    CHECK_EQ(stat(path, &st), 0);
    CHECK_EQ(memckpt_sweep(parent, "gpurun-"), 0);
    /* The close takes the owner file too: nothing is left of the store. */
    memckpt_close(m);
    CHECK_EQ(stat(own, &st), -1);
}
