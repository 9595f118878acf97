/* Tests of lib/fsutil: atomic replacement (content, mode, no temp file left, an open reader
 * keeps the old file), private directory trees, and whole-file reads with a limit. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "test.h"
#include "banned.h"

static const char *tmp_path(const char *name)
{
    static char path[4200];
    snprintf(path, sizeof(path), "%s/%s", test_tmpdir(), name);
    return path;
}

/* Number of entries of dir besides "." and "..". */
static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;

    CHECK(d);
    while ((de = readdir(d)))
        n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(d);
    return n;
}

static char *slurp(const char *path)
{
    char *text = NULL;
    size_t len;
    CHECK_EQ(fs_read_all(path, 1 << 20, &text, &len), 0);
    CHECK_EQ(strlen(text), len);
    return text;
}

TEST(fs_write_atomic_creates_and_replaces)
{
    char path[4200], *text;
    struct stat st;

    snprintf(path, sizeof(path), "%s", tmp_path("endpoint.json"));
    umask(022);
    CHECK_EQ(fs_write_atomic(path, "first", 5, 0644), 0);
    text = slurp(path);
    CHECK_STR(text, "first");
    free(text);
    CHECK_EQ(stat(path, &st), 0);
    CHECK_EQ(st.st_mode & 0777, 0644);

    /* Replacement takes the new mode and leaves nothing beside the file. */
    CHECK_EQ(fs_write_atomic(path, "second, longer", 14, 0600), 0);
    text = slurp(path);
    CHECK_STR(text, "second, longer");
    free(text);
    CHECK_EQ(stat(path, &st), 0);
    CHECK_EQ(st.st_mode & 0777, 0600);
    CHECK_EQ(count_entries(test_tmpdir()), 1);

    /* Shorter content leaves no tail of the old one; empty content is a file too. */
    CHECK_EQ(fs_write_atomic(path, "x", 1, 0600), 0);
    text = slurp(path);
    CHECK_STR(text, "x");
    free(text);
    CHECK_EQ(fs_write_atomic(path, "", 0, 0600), 0);
    CHECK_EQ(stat(path, &st), 0);
    CHECK_EQ(st.st_size, 0);
}

/* The same replacement without the fsyncs: content, mode, nothing left beside it. */
TEST(fs_publish_creates_and_replaces)
{
    char path[4200], *text;
    struct stat st;

    snprintf(path, sizeof(path), "%s", tmp_path("endpoint.json"));
    CHECK_EQ(fs_publish(path, "{\"port\": 1}", 11, 0600), 0);
    CHECK_EQ(fs_publish(path, "{\"port\": 2}", 11, 0600), 0);
    text = slurp(path);
    CHECK_STR(text, "{\"port\": 2}");
    free(text);
    CHECK_EQ(stat(path, &st), 0);
    CHECK_EQ(st.st_mode & 0777, 0600);
    CHECK_EQ(count_entries(test_tmpdir()), 1);
    CHECK_EQ(fs_publish(tmp_path("no/such/dir/endpoint.json"), "x", 1, 0600), -ENOENT);
    CHECK_EQ(count_entries(test_tmpdir()), 1);
}

/* A reader that opened the old file keeps reading the old content: the new file is another
 * inode put in its place, never the old one rewritten. */
TEST(fs_write_atomic_reader_sees_old_or_new)
{
    char path[4200], buf[16] = {0};
    struct stat before, after;
    int fd;

    snprintf(path, sizeof(path), "%s", tmp_path("summary.json"));
    CHECK_EQ(fs_write_atomic(path, "old-content", 11, 0600), 0);
    fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    CHECK_EQ(fstat(fd, &before), 0);
    CHECK_EQ(fs_write_atomic(path, "new-content", 11, 0600), 0);
    CHECK_EQ(stat(path, &after), 0);
    CHECK(before.st_ino != after.st_ino);
    CHECK_EQ(read(fd, buf, sizeof(buf) - 1), 11);
    CHECK_STR(buf, "old-content");
    close(fd);
}

TEST(fs_write_atomic_failure_leaves_nothing)
{
    char path[4200];

    /* No such directory. */
    snprintf(path, sizeof(path), "%s/missing/file", test_tmpdir());
    CHECK_EQ(fs_write_atomic(path, "x", 1, 0600), -ENOENT);
    /* The target is a directory: the rename fails and the temp file goes. */
    snprintf(path, sizeof(path), "%s", tmp_path("dir"));
    CHECK_EQ(mkdir(path, 0700), 0);
    CHECK_INT(fs_write_atomic(path, "x", 1, 0600), <, 0);
    CHECK_EQ(count_entries(test_tmpdir()), 1);
}

TEST(fs_write_atomic_relative_path)
{
    char *text;

    CHECK_EQ(chdir(test_tmpdir()), 0);
    CHECK_EQ(fs_write_atomic("plain", "rel", 3, 0600), 0);
    text = slurp("plain");
    CHECK_STR(text, "rel");
    free(text);
}

TEST(fs_mkdirs_creates_tree)
{
    char path[4200];
    struct stat st;

    umask(0);
    snprintf(path, sizeof(path), "%s/a/b/c", test_tmpdir());
    CHECK_EQ(fs_mkdirs(path, 0750), 0);
    CHECK_EQ(stat(path, &st), 0);
    CHECK(S_ISDIR(st.st_mode));
    CHECK_EQ(st.st_mode & 0777, 0750);
    snprintf(path, sizeof(path), "%s/a/b", test_tmpdir());
    CHECK_EQ(stat(path, &st), 0);
    CHECK_EQ(st.st_mode & 0777, 0700);
    snprintf(path, sizeof(path), "%s/a", test_tmpdir());
    CHECK_EQ(stat(path, &st), 0);
    CHECK_EQ(st.st_mode & 0777, 0700);
    /* Existing directories are fine, with or without a trailing slash. */
    snprintf(path, sizeof(path), "%s/a/b/c", test_tmpdir());
    CHECK_EQ(fs_mkdirs(path, 0700), 0);
    snprintf(path, sizeof(path), "%s/a/b/c/", test_tmpdir());
    CHECK_EQ(fs_mkdirs(path, 0700), 0);
    snprintf(path, sizeof(path), "%s/a//d", test_tmpdir());
    CHECK_EQ(fs_mkdirs(path, 0700), 0);
    snprintf(path, sizeof(path), "%s/a/d", test_tmpdir());
    CHECK_EQ(stat(path, &st), 0);
    CHECK(S_ISDIR(st.st_mode));
}

TEST(fs_mkdirs_refuses_a_file_in_the_way)
{
    char path[4200];

    snprintf(path, sizeof(path), "%s", tmp_path("file"));
    CHECK_EQ(fs_write_atomic(path, "x", 1, 0600), 0);
    snprintf(path, sizeof(path), "%s/file/sub", test_tmpdir());
    CHECK_EQ(fs_mkdirs(path, 0700), -ENOTDIR);
    /* The file itself, where a directory is asked for. */
    CHECK_EQ(fs_mkdirs(tmp_path("file"), 0700), -ENOTDIR);
    CHECK_INT(fs_mkdirs("", 0700), <, 0);
}

TEST(fs_read_all_limits)
{
    char path[4200], *text = NULL;
    size_t len = 0;

    snprintf(path, sizeof(path), "%s", tmp_path("f"));
    CHECK_EQ(fs_write_atomic(path, "0123456789", 10, 0600), 0);
    CHECK_EQ(fs_read_all(path, 10, &text, &len), 0);
    CHECK_EQ(len, 10);
    CHECK_STR(text, "0123456789");
    free(text);
    text = NULL;
    CHECK_EQ(fs_read_all(path, 9, &text, &len), -EFBIG);
    CHECK(text == NULL);
    CHECK_EQ(fs_read_all(tmp_path("none"), 10, &text, &len), -ENOENT);
    /* Binary content with NULs comes back whole. */
    CHECK_EQ(fs_write_atomic(path, "a\0b", 3, 0600), 0);
    CHECK_EQ(fs_read_all(path, 10, &text, &len), 0);
    CHECK_EQ(len, 3);
    CHECK(!memcmp(text, "a\0b", 4));
    free(text);
}

TEST(fs_read_fd_leaves_the_file_open)
{
    char *text = NULL;
    size_t len = 0;
    int fd;

    CHECK_EQ(fs_write_atomic(tmp_path("f"), "0123456789", 10, 0600), 0);
    fd = open(tmp_path("f"), O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0);
    CHECK_EQ(fs_read_fd(fd, 9, &text, &len), -EFBIG);
    CHECK(text == NULL);
    CHECK_EQ(fs_read_fd(fd, 10, &text, &len), 0);
    CHECK_EQ(len, 10);
    CHECK_STR(text, "0123456789");
    free(text);
    CHECK_EQ(fcntl(fd, F_GETFD), FD_CLOEXEC);
    close(fd);
}

/* Writes n bytes of 'x' to path. */
static void put_bytes(const char *path, size_t n)
{
    char buf[4096];
    FILE *f = fopen(path, "w");

    CHECK(f != NULL);
    memset(buf, 'x', sizeof(buf));
    for (size_t done = 0; done < n;) {
        size_t k = n - done < sizeof(buf) ? n - done : sizeof(buf);
        CHECK_EQ(fwrite(buf, 1, k, f), k);
        done += k;
    }
    CHECK_EQ(fclose(f), 0);
}

/* A tree with files two levels down and links to a file and a folder outside it: sized and
 * removed whole, the link's targets untouched. */
TEST(fs_remove_tree_spares_what_links_point_to)
{
    char tree[PATH_MAX], path[PATH_MAX + 64], outside[PATH_MAX], keep[PATH_MAX + 16];
    uint64_t size = 0, freed = 0;

    snprintf(tree, sizeof(tree), "%s/tree", test_tmpdir());
    snprintf(outside, sizeof(outside), "%s/outside", test_tmpdir());
    snprintf(keep, sizeof(keep), "%s/keep", outside);
    CHECK_EQ(fs_mkdirs(outside, 0700), 0);
    put_bytes(keep, 5000);
    snprintf(path, sizeof(path), "%s/logs/deep", tree);
    CHECK_EQ(fs_mkdirs(path, 0700), 0);
    snprintf(path, sizeof(path), "%s/job.json", tree);
    put_bytes(path, 100);
    snprintf(path, sizeof(path), "%s/logs/rank-0.log", tree);
    put_bytes(path, 70000);
    snprintf(path, sizeof(path), "%s/logs/deep/x", tree);
    put_bytes(path, 3);
    snprintf(path, sizeof(path), "%s/link-file", tree);
    CHECK_EQ(symlink(keep, path), 0);
    snprintf(path, sizeof(path), "%s/logs/link-dir", tree);
    CHECK_EQ(symlink(outside, path), 0);

    CHECK_EQ(fs_tree_size(tree, &size), 0);
    CHECK_EQ(size, 70103);
    CHECK_EQ(fs_remove_tree(tree, &freed), 0);
    CHECK_EQ(freed, 70103);
    CHECK(access(tree, F_OK) < 0);
    CHECK_EQ(access(keep, R_OK), 0);
    CHECK_EQ(fs_remove_tree(tree, NULL), -ENOENT);
}
