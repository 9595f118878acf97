/* Tests of kernels/ckpt: a bit-exact round trip, the newest checkpoint found among temp and
 * damaged files, a failed write (file size limit) that leaves the old checkpoint in place,
 * refusals of truncated, corrupt and mismatched files, the resume's search that passes over
 * damage only, pruning that never removes a file without newer complete ones, the removal of
 * killed saves' temp files, and llm.c checkpoints written here by hand. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"
#include "fsutil.h"
#include "test.h"
#include "banned.h"

static const struct ckpt_model shape = {
    .n_layer = 2, .n_head = 2, .n_embd = 8, .seq_len = 16, .vocab_size = 50, .padded_vocab = 64};

/* A state of n parameters whose values depend on seed, with every bit pattern class: signed
 * zeros, subnormals, infinities and a NaN payload must come back unchanged. */
static void make_state(struct ckpt_state *st, size_t n, uint64_t step, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 1;

    memset(st, 0, sizeof(*st));
    st->model = shape;
    st->world_size = 2;
    st->batch_size = 4;
    st->grad_accum = 3;
    st->step = step;
    st->opt_step = step + 100;
    for (int i = 0; i < CKPT_RNG_WORDS; i++)
        st->rng[i] = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1) + seed;
    st->data.step = step;
    st->data.next_seq = step * 24;
    st->data.nseq = 1000;
    st->data.ntokens = 64001;
    st->nparams = n;
    st->params = malloc(n * sizeof(float));
    st->m = malloc(n * sizeof(float));
    st->v = malloc(n * sizeof(float));
    CHECK(st->params && st->m && st->v);
    for (size_t i = 0; i < n; i++) {
        uint32_t bits[3];
        for (int k = 0; k < 3; k++) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            bits[k] = x;
        }
        memcpy(&st->params[i], &bits[0], 4);
        memcpy(&st->m[i], &bits[1], 4);
        memcpy(&st->v[i], &bits[2], 4);
    }
    if (n >= 4) {
        uint32_t nan_payload = 0x7fc12345u, subnormal = 1u, negzero = 0x80000000u,
                 inf = 0x7f800000u;
        memcpy(&st->params[0], &nan_payload, 4);
        memcpy(&st->params[1], &subnormal, 4);
        memcpy(&st->params[2], &negzero, 4);
        memcpy(&st->params[3], &inf, 4);
    }
}

static void free_state(struct ckpt_state *st)
{
    free(st->params);
    free(st->m);
    free(st->v);
}

static void check_same(const struct ckpt_state *a, const struct ckpt_state *b)
{
    CHECK(!memcmp(&a->model, &b->model, sizeof(a->model)));
    CHECK_EQ(a->world_size, b->world_size);
    CHECK_EQ(a->batch_size, b->batch_size);
    CHECK_EQ(a->grad_accum, b->grad_accum);
    CHECK_EQ(a->step, b->step);
    CHECK_EQ(a->opt_step, b->opt_step);
    CHECK(!memcmp(a->rng, b->rng, sizeof(a->rng)));
    CHECK(!memcmp(&a->data, &b->data, sizeof(a->data)));
    CHECK_EQ(a->nparams, b->nparams);
    CHECK(!memcmp(a->params, b->params, a->nparams * sizeof(float)));
    CHECK(!memcmp(a->m, b->m, a->nparams * sizeof(float)));
    CHECK(!memcmp(a->v, b->v, a->nparams * sizeof(float)));
}

static const char *out_dir(void)
{
    static char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s/out", test_tmpdir());
    return dir;
}

static const char *ckpt_file(uint64_t step)
{
    static char path[PATH_MAX];
    CHECK_EQ(ckpt_path(path, sizeof(path), out_dir(), step), 0);
    return path;
}

/* Loads the newest of out_dir, as a model of shape want, into a fresh state of n parameters;
 * nw and err as they came out. Returns ckpt_load_newest's return. */
static int load_newest_as(const struct ckpt_model *want, size_t n, struct ckpt_state *got,
                          struct ckpt_newest *nw, struct errmsg *err)
{
    memset(got, 0, sizeof(*got));
    got->params = calloc(n, sizeof(float));
    got->m = calloc(n, sizeof(float));
    got->v = calloc(n, sizeof(float));
    CHECK(got->params && got->m && got->v);
    return ckpt_load_newest(out_dir(), want, n, got, nw, err);
}

static int load_newest(size_t n, struct ckpt_state *got, struct ckpt_newest *nw, struct errmsg *err)
{
    return load_newest_as(&shape, n, got, nw, err);
}

/* Loads the newest of out_dir expecting success: path want (borrowed), after ndamaged newer
 * ones passed over as damaged; into a fresh state of n parameters. */
static void load_ok(size_t n, struct ckpt_state *got, const char *want, size_t ndamaged)
{
    struct errmsg err = {0};
    struct ckpt_newest nw;
    char path[PATH_MAX];

    snprintf(path, sizeof(path), "%s", want);
    if (load_newest(n, got, &nw, &err) != 1)
        test_fail(__FILE__, __LINE__, "load the newest of '%s': %s", out_dir(), err.text);
    CHECK_STR(nw.path, path);
    CHECK_EQ(nw.ndamaged, ndamaged);
    ckpt_newest_release(&nw);
}

/* Whether the file of step's checkpoint holds config (its text, after the 256-byte header)
 * and is the size that n parameters and that text make. */
static bool holds_config(uint64_t step, size_t n, const char *config)
{
    char *data = NULL;
    size_t len, clen = strlen(config);
    bool ok;

    CHECK_EQ(fs_read_all(ckpt_file(step), 1 << 24, &data, &len), 0);
    ok = len == 256 + clen + 3 * n * 4 + 32 && !memcmp(data + 256, config, clen);
    free(data);
    return ok;
}

/* Files in out_dir whose name contains what. */
static int count_files(const char *what)
{
    DIR *d = opendir(out_dir());
    struct dirent *e;
    int n = 0;

    CHECK(d != NULL);
    while ((e = readdir(d)))
        if (strstr(e->d_name, what))
            n++;
    closedir(d);
    return n;
}

TEST(ckpt_round_trip)
{
    struct errmsg err = {0};
    struct ckpt_state st, got;
    const size_t n = 100003; /* more than one I/O piece would be nice, but keep it quick */

    make_state(&st, n, 10, 1);
    CHECK_EQ(ckpt_save(out_dir(), &st, "{\"model\": {\"n_layer\": 2}}", &err), 0);
    load_ok(n, &got, ckpt_file(10), 0);
    check_same(&st, &got);
    CHECK(holds_config(10, n, "{\"model\": {\"n_layer\": 2}}"));
    CHECK_EQ(count_files(".tmp"), 0);
    free_state(&got);

    /* Without config text. */
    st.step = 11;
    CHECK_EQ(ckpt_save(out_dir(), &st, NULL, &err), 0);
    load_ok(n, &got, ckpt_file(11), 0);
    CHECK(holds_config(11, n, ""));
    check_same(&st, &got);
    free_state(&got);
    free_state(&st);
}

TEST(ckpt_newest_and_prune)
{
    struct errmsg err = {0};
    struct ckpt_state st, got;
    struct ckpt_newest nw;
    char path[PATH_MAX + 64];
    long long step = 0;

    /* No directory, an empty one: none. */
    CHECK_EQ(load_newest(64, &got, &nw, &err), 0);
    CHECK(nw.path == NULL);
    free_state(&got);
    CHECK_EQ(ckpt_newest_step(out_dir(), &step, &err), 0);
    CHECK_EQ(step, -1);
    CHECK_EQ(fs_mkdirs(out_dir(), 0700), 0);
    CHECK_EQ(load_newest(64, &got, &nw, &err), 0);
    CHECK(nw.path == NULL);
    free_state(&got);
    step = 0;
    CHECK_EQ(ckpt_newest_step(out_dir(), &step, &err), 0);
    CHECK_EQ(step, -1);

    make_state(&st, 64, 9, 2);
    CHECK_EQ(ckpt_save(out_dir(), &st, NULL, &err), 0);
    st.step = 100;
    CHECK_EQ(ckpt_save(out_dir(), &st, NULL, &err), 0);
    st.step = 20;
    CHECK_EQ(ckpt_save(out_dir(), &st, NULL, &err), 0);
    /* Not checkpoints, or not complete ones: a temp file of a later step, other names, a
     * file named for a later step that is cut short, and one whose header names another
     * step. */
    snprintf(path, sizeof(path), "%s.tmp.123", ckpt_file(500));
    CHECK_EQ(fs_write_atomic(path, "partial", 7, 0644), 0);
    snprintf(path, sizeof(path), "%s/ckpt_600.bin.old", out_dir());
    CHECK_EQ(fs_write_atomic(path, "x", 1, 0644), 0);
    snprintf(path, sizeof(path), "%s/ckpt_.bin", out_dir());
    CHECK_EQ(fs_write_atomic(path, "x", 1, 0644), 0);
    snprintf(path, sizeof(path), "%s", ckpt_file(100));
    {
        char *data = NULL;
        size_t len;
        CHECK_EQ(fs_read_all(path, 1 << 20, &data, &len), 0);
        CHECK_EQ(fs_write_atomic(ckpt_file(400), data, len - 1, 0644), 0);
        CHECK_EQ(fs_write_atomic(ckpt_file(300), data, len, 0644), 0); /* says step 100 */
        free(data);
    }
    /* The newest complete one is 100's (its header whole and its own step's); 400's and 300's
     * are passed over as damaged. */
    CHECK_EQ(ckpt_newest_step(out_dir(), &step, &err), 0);
    CHECK_EQ(step, 100);
    CHECK_EQ(load_newest(64, &got, &nw, &err), 1);
    CHECK_STR(nw.path, ckpt_file(100));
    CHECK_EQ(nw.ndamaged, 2);
    CHECK_STR(nw.damaged[0].path, ckpt_file(400));
    CHECK_STR(nw.damaged[1].path, ckpt_file(300));
    ckpt_newest_release(&nw);
    st.step = 100; /* the state saved at 9, 100 and 20 */
    check_same(&st, &got);
    free_state(&got);

    /* Prune keeps the newest two complete ones (100, 20) and what is newer than they, even
     * incomplete (400, 300); what is older goes (9). */
    CHECK_EQ(ckpt_prune(out_dir(), 2, &err), 0);
    CHECK_EQ(access(ckpt_file(400), F_OK), 0);
    CHECK_EQ(access(ckpt_file(300), F_OK), 0);
    CHECK_EQ(access(ckpt_file(100), F_OK), 0);
    CHECK_EQ(access(ckpt_file(20), F_OK), 0);
    CHECK_EQ(access(ckpt_file(9), F_OK), -1);
    CHECK_EQ(count_files(".tmp"), 1);
    CHECK_EQ(count_files("ckpt_600.bin.old"), 1);
    CHECK_EQ(count_files("ckpt_.bin"), 1);
    CHECK_EQ(ckpt_prune(out_dir(), 0, &err), -EINVAL);
    /* One complete checkpoint is never removed for want of a second. */
    CHECK_EQ(ckpt_prune(out_dir(), 1, &err), 0);
    CHECK_EQ(access(ckpt_file(100), F_OK), 0);
    CHECK_EQ(access(ckpt_file(20), F_OK), -1);
    CHECK_EQ(ckpt_prune(out_dir(), 2, &err), 0);
    CHECK_EQ(access(ckpt_file(100), F_OK), 0);
    load_ok(64, &got, ckpt_file(100), 2);
    free_state(&got);
    free_state(&st);
}

TEST(ckpt_failed_write_keeps_the_old)
{
    struct errmsg err = {0};
    struct ckpt_state old, fresh, got;
    struct rlimit rl = {.rlim_cur = 64 * 1024, .rlim_max = RLIM_INFINITY};
    const size_t n = 20000; /* 240 KB of parameters and moments: over the limit below */

    make_state(&old, n, 10, 3);
    CHECK_EQ(ckpt_save(out_dir(), &old, "old", &err), 0);
    /* A full disk, as near as a test gets: writes past 64 KiB fail with EFBIG. */
    signal(SIGXFSZ, SIG_IGN);
    CHECK_EQ(setrlimit(RLIMIT_FSIZE, &rl), 0);
    make_state(&fresh, n, 10, 4);
    CHECK_EQ(ckpt_save(out_dir(), &fresh, "new", &err), -EFBIG);
    {
        char msg[PATH_MAX + 64];
        snprintf(msg, sizeof(msg), "cannot write '%s': File too large", ckpt_file(10));
        CHECK_STR(err.text, msg);
    }
    fresh.step = 20;
    CHECK_EQ(ckpt_save(out_dir(), &fresh, "new", &err), -EFBIG);
    CHECK_EQ(count_files(".tmp"), 0);
    CHECK_EQ(access(ckpt_file(20), F_OK), -1);
    rl.rlim_cur = RLIM_INFINITY;
    CHECK_EQ(setrlimit(RLIMIT_FSIZE, &rl), 0);

    load_ok(n, &got, ckpt_file(10), 0);
    check_same(&old, &got);
    free_state(&got);
    free_state(&old);
    free_state(&fresh);
}

/* Rewrites byte off of path with its complement. */
static void flip_byte(const char *path, off_t off)
{
    int fd = open(path, O_RDWR);
    unsigned char c;

    CHECK(fd >= 0);
    CHECK_EQ(pread(fd, &c, 1, off), 1);
    c = (unsigned char)~c;
    CHECK_EQ(pwrite(fd, &c, 1, off), 1);
    close(fd);
}

/* Loading out_dir's one checkpoint as a model of shape want with n parameters fails
 * with code and msg; damage (-EBADMSG) is said with what it leaves: nothing older. */
static void check_load_error(const struct ckpt_model *want, size_t n, int code, const char *msg)
{
    struct errmsg err = {0};
    struct ckpt_state got;
    struct ckpt_newest nw;
    char full[PATH_MAX + 400];

    if (code == -EBADMSG)
        snprintf(full, sizeof(full), "%s; no older checkpoint in '%s'", msg, out_dir());
    else
        snprintf(full, sizeof(full), "%s", msg);
    CHECK_EQ(load_newest_as(want, n, &got, &nw, &err), code);
    CHECK_STR(err.text, full);
    CHECK(nw.path == NULL && nw.ndamaged == 0);
    free_state(&got);
}

TEST(ckpt_refuses_damage_and_mismatch)
{
    struct errmsg err = {0};
    struct ckpt_state st;
    struct ckpt_model other = shape;
    char *data = NULL, msg[PATH_MAX + 200];
    size_t len;
    const size_t n = 5000;
    const char *p = ckpt_file(7);

    make_state(&st, n, 7, 5);
    CHECK_EQ(ckpt_save(out_dir(), &st, "cfg", &err), 0);
    CHECK_EQ(fs_read_all(p, 1 << 20, &data, &len), 0);
    CHECK_EQ(len, 256 + 3 + 3 * n * 4 + 32);

    /* The model's shape, each field named. */
    other.n_layer = 3;
    snprintf(msg, sizeof(msg), "'%s': n_layer is 2 in the checkpoint, 3 in the config", p);
    check_load_error(&other, n, -EINVAL, msg);
    other = shape;
    other.padded_vocab = 128;
    snprintf(msg, sizeof(msg), "'%s': padded_vocab is 64 in the checkpoint, 128 in the config", p);
    check_load_error(&other, n, -EINVAL, msg);
    snprintf(msg, sizeof(msg), "'%s': 5000 parameters in the checkpoint, 4999 in the model", p);
    check_load_error(&shape, n - 1, -EINVAL, msg);

    /* One flipped bit anywhere: in the params, in the moments, in the trailer. */
    flip_byte(p, 256 + 3 + 17);
    snprintf(msg, sizeof(msg), "'%s': checksum mismatch: the file is damaged", p);
    check_load_error(&shape, n, -EBADMSG, msg);
    CHECK_EQ(fs_write_atomic(p, data, len, 0644), 0);
    flip_byte(p, (off_t)len - 1);
    check_load_error(&shape, n, -EBADMSG, msg);
    CHECK_EQ(fs_write_atomic(p, data, len, 0644), 0);
    flip_byte(p, 72); /* AdamW's step in the header */
    check_load_error(&shape, n, -EBADMSG, msg);
    /* A header of another step than the file's name says. */
    CHECK_EQ(fs_write_atomic(p, data, len, 0644), 0);
    flip_byte(p, 64);
    snprintf(msg, sizeof(msg), "'%s': the header says step 248", p);
    check_load_error(&shape, n, -EBADMSG, msg);

    /* Truncated, short, foreign, a later version, a header whose sizes disagree. */
    CHECK_EQ(fs_write_atomic(p, data, len - 100, 0644), 0);
    snprintf(msg, sizeof(msg), "'%s': truncated: %zu bytes, the header says %zu", p, len - 100,
             len);
    check_load_error(&shape, n, -EBADMSG, msg);
    CHECK_EQ(fs_write_atomic(p, data, 100, 0644), 0);
    snprintf(msg, sizeof(msg), "'%s': truncated: 100 bytes, shorter than the 256-byte header", p);
    check_load_error(&shape, n, -EBADMSG, msg);
    CHECK_EQ(fs_write_atomic(p, data, len, 0644), 0);
    flip_byte(p, 0);
    snprintf(msg, sizeof(msg), "'%s': not a gpurun checkpoint", p);
    check_load_error(&shape, n, -EBADMSG, msg);
    CHECK_EQ(fs_write_atomic(p, data, len, 0644), 0);
    flip_byte(p, 8);
    snprintf(msg, sizeof(msg),
             "'%s': checkpoint format version 254 is newer than this gpurun-train's (1)", p);
    check_load_error(&shape, n, -EPROTONOSUPPORT, msg);
    CHECK_EQ(fs_write_atomic(p, data, len, 0644), 0);
    {
        uint32_t zero = 0;
        int fd = open(p, O_RDWR);
        CHECK(fd >= 0);
        CHECK_EQ(pwrite(fd, &zero, 4, 8), 4);
        close(fd);
    }
    snprintf(msg, sizeof(msg), "'%s': damaged header (checkpoint version 0)", p);
    check_load_error(&shape, n, -EBADMSG, msg);
    CHECK_EQ(fs_write_atomic(p, data, len, 0644), 0);
    flip_byte(p, 56); /* nparams */
    snprintf(msg, sizeof(msg), "'%s': damaged header (its sizes disagree)", p);
    check_load_error(&shape, n, -EBADMSG, msg);

    /* And the intact file still loads. */
    CHECK_EQ(fs_write_atomic(p, data, len, 0644), 0);
    {
        struct ckpt_state got;
        load_ok(n, &got, p, 0);
        check_same(&st, &got);
        free_state(&got);
    }
    free(data);
    free_state(&st);
}

TEST(ckpt_load_newest_falls_back_past_damage_only)
{
    struct errmsg err = {0};
    struct ckpt_state s5, s10, got;
    struct ckpt_newest nw;
    char aside[PATH_MAX + 32], want[PATH_MAX + 300], path[PATH_MAX + 64];
    const size_t n = 3000;

    /* None: a missing out_dir, then one with only foreign and temp names. */
    CHECK_EQ(load_newest(n, &got, &nw, &err), 0);
    CHECK(nw.path == NULL && nw.ndamaged == 0);
    free_state(&got);
    CHECK_EQ(fs_mkdirs(out_dir(), 0700), 0);
    snprintf(path, sizeof(path), "%s.tmp.99", ckpt_file(50));
    CHECK_EQ(fs_write_atomic(path, "x", 1, 0644), 0);
    CHECK_EQ(load_newest(n, &got, &nw, &err), 0);
    free_state(&got);

    make_state(&s5, n, 5, 6);
    make_state(&s10, n, 10, 7);
    CHECK_EQ(ckpt_save(out_dir(), &s5, NULL, &err), 0);
    CHECK_EQ(ckpt_save(out_dir(), &s10, NULL, &err), 0);
    CHECK_EQ(load_newest(n, &got, &nw, &err), 1);
    CHECK_STR(nw.path, ckpt_file(10));
    CHECK_EQ(nw.ndamaged, 0);
    check_same(&s10, &got);
    ckpt_newest_release(&nw);
    free_state(&got);

    /* One flipped byte in the newest: the older one is loaded, the damaged one named. */
    flip_byte(ckpt_file(10), 1000);
    CHECK_EQ(load_newest(n, &got, &nw, &err), 1);
    CHECK_STR(nw.path, ckpt_file(5));
    check_same(&s5, &got);
    CHECK_EQ(nw.ndamaged, 1);
    CHECK_STR(nw.damaged[0].path, ckpt_file(10));
    snprintf(want, sizeof(want), "'%s': checksum mismatch: the file is damaged", ckpt_file(10));
    CHECK_STR(nw.damaged[0].why.text, want);
    /* Nothing was changed; the caller sets it aside. */
    CHECK_EQ(access(ckpt_file(10), F_OK), 0);
    CHECK_EQ(ckpt_set_aside(nw.damaged[0].path, aside, sizeof(aside), &err), 0);
    snprintf(want, sizeof(want), "%s.damaged", ckpt_file(10));
    CHECK_STR(aside, want);
    CHECK_EQ(access(ckpt_file(10), F_OK), -1);
    CHECK_EQ(access(want, F_OK), 0);
    ckpt_newest_release(&nw);
    ckpt_newest_release(&nw); /* idempotent */
    free_state(&got);

    /* A second damage of the same step gets the next name. */
    CHECK_EQ(ckpt_save(out_dir(), &s10, NULL, &err), 0);
    CHECK_EQ(ckpt_set_aside(ckpt_file(10), aside, sizeof(aside), &err), 0);
    snprintf(want, sizeof(want), "%s.damaged.2", ckpt_file(10));
    CHECK_STR(aside, want);

    /* A newer format version stops the search: no fallback, nothing changed. */
    CHECK_EQ(ckpt_save(out_dir(), &s10, NULL, &err), 0);
    {
        uint32_t v2 = 2;
        int fd = open(ckpt_file(10), O_RDWR);
        CHECK(fd >= 0);
        CHECK_EQ(pwrite(fd, &v2, 4, 8), 4);
        close(fd);
    }
    CHECK_EQ(load_newest(n, &got, &nw, &err), -EPROTONOSUPPORT);
    snprintf(want, sizeof(want),
             "'%s': checkpoint format version 2 is newer than this gpurun-train's (1)",
             ckpt_file(10));
    CHECK_STR(err.text, want);
    CHECK(nw.path == NULL && nw.ndamaged == 0);
    free_state(&got);
    CHECK_EQ(unlink(ckpt_file(10)), 0);

    /* A directory named like the newest checkpoint cannot be read: it stops the search. */
    CHECK_EQ(mkdir(ckpt_file(10), 0755), 0);
    CHECK_EQ(load_newest(n, &got, &nw, &err), -EISDIR);
    snprintf(want, sizeof(want), "cannot read '%s': not a regular file", ckpt_file(10));
    CHECK_STR(err.text, want);
    free_state(&got);
    /* ... and prune neither removes it nor counts it. */
    CHECK_EQ(ckpt_prune(out_dir(), 1, &err), 0);
    CHECK_EQ(access(ckpt_file(10), F_OK), 0);
    CHECK_EQ(access(ckpt_file(5), F_OK), 0);
    CHECK_EQ(rmdir(ckpt_file(10)), 0);

    /* A file without read permission (root reads it anyway: checked only for others). */
    if (geteuid() != 0) {
        CHECK_EQ(ckpt_save(out_dir(), &s10, NULL, &err), 0);
        CHECK_EQ(chmod(ckpt_file(10), 0), 0);
        CHECK_EQ(load_newest(n, &got, &nw, &err), -EACCES);
        snprintf(want, sizeof(want), "cannot open '%s': Permission denied", ckpt_file(10));
        CHECK_STR(err.text, want);
        free_state(&got);
        CHECK_EQ(unlink(ckpt_file(10)), 0);
    }

    /* A checkpoint of another model is an error, not damage: the older one is not tried. */
    {
        struct ckpt_model other = shape;
        other.n_layer = 3;
        memset(&got, 0, sizeof(got));
        got.params = calloc(n, 4);
        got.m = calloc(n, 4);
        got.v = calloc(n, 4);
        CHECK_EQ(ckpt_load_newest(out_dir(), &other, n, &got, &nw, &err), -EINVAL);
        snprintf(want, sizeof(want), "'%s': n_layer is 2 in the checkpoint, 3 in the config",
                 ckpt_file(5));
        CHECK_STR(err.text, want);
        free_state(&got);
    }

    /* Damage with nothing valid behind it: an error naming the newest damaged file. */
    flip_byte(ckpt_file(5), 300);
    CHECK_EQ(load_newest(n, &got, &nw, &err), -EBADMSG);
    snprintf(want, sizeof(want),
             "'%s': checksum mismatch: the file is damaged; no older checkpoint in '%s'",
             ckpt_file(5), out_dir());
    CHECK_STR(err.text, want);
    CHECK_EQ(access(ckpt_file(5), F_OK), 0);
    free_state(&got);
    /* Two of them; a name whose header says another step counts as damage. */
    {
        char *data = NULL;
        size_t len;
        CHECK_EQ(fs_read_all(ckpt_file(5), 1 << 20, &data, &len), 0);
        CHECK_EQ(fs_write_atomic(ckpt_file(7), data, len, 0644), 0);
        free(data);
    }
    CHECK_EQ(load_newest(n, &got, &nw, &err), -EBADMSG);
    snprintf(want, sizeof(want),
             "none of the 2 checkpoints in '%s' is valid; the newest: '%s': the header says step 5",
             out_dir(), ckpt_file(7));
    CHECK_STR(err.text, want);
    free_state(&got);
    free_state(&s5);
    free_state(&s10);
}

TEST(ckpt_prune_keeps_damaged_until_newer_complete)
{
    struct errmsg err = {0};
    struct ckpt_state st;
    char aside[PATH_MAX + 32], aside2[PATH_MAX + 32];

    make_state(&st, 64, 10, 8);
    CHECK_EQ(ckpt_save(out_dir(), &st, NULL, &err), 0);
    CHECK_EQ(ckpt_set_aside(ckpt_file(10), aside, sizeof(aside), &err), 0);
    st.step = 5;
    CHECK_EQ(ckpt_save(out_dir(), &st, NULL, &err), 0);
    /* A resumed run from 5 saving steps 6 .. 12, pruning to 2 after each. */
    for (uint64_t s = 6; s <= 12; s++) {
        st.step = s;
        CHECK_EQ(ckpt_save(out_dir(), &st, NULL, &err), 0);
        CHECK_EQ(ckpt_prune(out_dir(), 2, &err), 0);
        /* The one set aside at step 10 stays while a checkpoint at or below 10 is kept. */
        if (access(aside, F_OK) != (s <= 11 ? 0 : -1))
            test_fail(__FILE__, __LINE__, "after step %llu: '%s' %s", (unsigned long long)s, aside,
                      s <= 11 ? "removed too early" : "still there");
        CHECK_EQ(access(ckpt_file(s), F_OK), 0);
        CHECK_EQ(access(ckpt_file(s - 1), F_OK), 0);
        CHECK_EQ(access(ckpt_file(s - 2), F_OK), -1);
    }
    /* Set aside at the step of a checkpoint saved again and kept: stays with it. */
    CHECK_EQ(ckpt_set_aside(ckpt_file(11), aside2, sizeof(aside2), &err), 0);
    st.step = 11;
    CHECK_EQ(ckpt_save(out_dir(), &st, NULL, &err), 0);
    CHECK_EQ(ckpt_prune(out_dir(), 2, &err), 0);
    CHECK_EQ(access(aside2, F_OK), 0);
    CHECK_EQ(access(ckpt_file(11), F_OK), 0);
    CHECK_EQ(access(ckpt_file(12), F_OK), 0);
    free_state(&st);
}

/* Writes an empty file in out_dir named name, last modified at mtime (seconds). */
static void touch_at(const char *name, time_t mtime)
{
    char path[PATH_MAX + 64];
    struct timespec ts[2] = {{.tv_sec = mtime}, {.tv_sec = mtime}};

    snprintf(path, sizeof(path), "%s/%s", out_dir(), name);
    CHECK_EQ(fs_write_atomic(path, "0123456789", 10, 0644), 0);
    CHECK_EQ(utimensat(AT_FDCWD, path, ts, 0), 0);
}

static bool exists(const char *name)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/%s", out_dir(), name);
    return access(path, F_OK) == 0;
}

TEST(ckpt_clean_tmp_removes_only_dead_savers_files)
{
    struct errmsg err = {0};
    struct timespec started;
    char dead_name[64], dead_new[64], live_name[64], own_name[64], dir_name[64];
    uint64_t bytes = 1;
    int removed = -1, status;
    pid_t dead = fork();
    time_t past;

    /* A pid no process has: a child that has exited and been reaped. */
    CHECK(dead >= 0);
    if (dead == 0)
        _exit(0);
    CHECK_EQ(waitpid(dead, &status, 0), dead);
    clock_gettime(CLOCK_REALTIME, &started);
    /* A missing out_dir holds none. */
    CHECK_EQ(ckpt_clean_tmp(out_dir(), &started, &removed, &bytes, &err), 0);
    CHECK_EQ(removed, 0);
    CHECK_EQ(fs_mkdirs(out_dir(), 0700), 0);
    past = started.tv_sec - 60;
    snprintf(dead_name, sizeof(dead_name), "ckpt_00000007.bin.tmp.%d", (int)dead);
    snprintf(dead_new, sizeof(dead_new), "ckpt_00000008.bin.tmp.%d", (int)dead);
    snprintf(live_name, sizeof(live_name), "ckpt_00000007.bin.tmp.%d", (int)getppid());
    snprintf(own_name, sizeof(own_name), "ckpt_00000009.bin.tmp.%d", (int)getpid());
    snprintf(dir_name, sizeof(dir_name), "ckpt_00000010.bin.tmp.%d", (int)dead);
    touch_at(dead_name, past);
    touch_at(own_name, past);
    touch_at(live_name, past);               /* a live process's: kept */
    touch_at(dead_new, started.tv_sec + 60); /* changed since the start: kept */
    {
        char path[PATH_MAX + 64];
        snprintf(path, sizeof(path), "%s/%s", out_dir(), dir_name);
        CHECK_EQ(mkdir(path, 0755), 0); /* not a regular file: kept */
    }
    /* Near misses of the pattern: kept. */
    {
        static const char *const others[] = {
            "ckpt_00000007.bin.tmp.", "ckpt_00000007.bin.tmp.12x",
            "ckpt_.bin.tmp.5",        "ckpt_00000007.bin.tmp.0",
            "ckpt_7.tmp.5",           "other.bin.tmp.5",
            "xckpt_7.bin.tmp.5",      "ckpt_00000007.bin.tmp.99999999999"};
        for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++)
            touch_at(others[i], past);
        CHECK_EQ(ckpt_clean_tmp(out_dir(), &started, &removed, &bytes, &err), 0);
        CHECK_EQ(removed, 2);
        CHECK_EQ(bytes, 20);
        CHECK(!exists(dead_name));
        CHECK(!exists(own_name));
        CHECK(exists(live_name));
        CHECK(exists(dead_new));
        CHECK(exists(dir_name));
        for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++)
            if (!exists(others[i]))
                test_fail(__FILE__, __LINE__, "'%s' removed, expected kept", others[i]);
    }
}

/* --- llm.c ------------------------------------------------------------------------------------ */

/* Writes an llm.c checkpoint of shape m: header, then parameter i = i (exact in fp32 below
 * 2^24). */
static size_t write_llmc(const char *path, const struct ckpt_model *m, int version, long cut)
{
    size_t n = ckpt_llmc_nparams(m), len = 1024 + n * 4;
    char *buf = calloc(1, len);
    int32_t *hdr = (int32_t *)buf;
    float *p = (float *)(buf + 1024);

    CHECK(buf != NULL);
    hdr[0] = LLMC_CKPT_MAGIC;
    hdr[1] = version;
    hdr[2] = m->seq_len;
    hdr[3] = m->vocab_size;
    hdr[4] = m->n_layer;
    hdr[5] = m->n_head;
    hdr[6] = m->n_embd;
    hdr[7] = m->padded_vocab;
    for (size_t i = 0; i < n; i++)
        p[i] = (float)i;
    CHECK_EQ(fs_write_atomic(path, buf, (size_t)((long)len - cut), 0644), 0);
    free(buf);
    return n;
}

TEST(ckpt_llmc_import)
{
    struct errmsg err = {0};
    struct ckpt_model found;
    float *params = NULL;
    size_t n, got_n;
    char path[PATH_MAX];
    const size_t C = 8, Vp = 64, T = 16, L = 2;

    /* The layout's size, counted tensor by tensor as llm.c lists them. */
    n = Vp * C + T * C + L * C + L * C + L * 3 * C * C + L * 3 * C + L * C * C + L * C + L * C +
        L * C + L * 4 * C * C + L * 4 * C + L * C * 4 * C + L * C + C + C;
    CHECK_EQ(ckpt_llmc_nparams(&shape), n);

    snprintf(path, sizeof(path), "%s/gpt2.bin", test_tmpdir());
    CHECK_EQ(write_llmc(path, &shape, 3, 0), n);
    CHECK_EQ(ckpt_load_llmc(path, 0, &found, &params, &got_n, &err), 0);
    CHECK(!memcmp(&found, &shape, sizeof(found)));
    CHECK_EQ(got_n, n);
    for (size_t i = 0; i < n; i++)
        if (params[i] != (float)i)
            test_fail(__FILE__, __LINE__, "parameter %zu is %g", i, params[i]);
    free(params);

    /* A shorter context keeps wte, the first 5 rows of wpe, and everything after wpe. */
    CHECK_EQ(ckpt_load_llmc(path, 5, &found, &params, &got_n, &err), 0);
    CHECK_EQ(found.seq_len, 5);
    CHECK_EQ(found.padded_vocab, 64);
    CHECK_EQ(got_n, n - (T - 5) * C);
    for (size_t i = 0; i < got_n; i++) {
        size_t src = i < Vp * C + 5 * C ? i : i + (T - 5) * C;
        if (params[i] != (float)src)
            test_fail(__FILE__, __LINE__, "parameter %zu is %g, expected %zu", i, params[i], src);
    }
    free(params);
    CHECK_EQ(ckpt_load_llmc(path, 16, &found, &params, &got_n, &err), 0);
    CHECK_EQ(got_n, n);
    free(params);
}

TEST(ckpt_llmc_errors)
{
    struct errmsg err = {0};
    struct ckpt_model found, bad = shape;
    float *params = (float *)1;
    size_t got_n;
    char path[PATH_MAX], msg[PATH_MAX + 200];

    snprintf(path, sizeof(path), "%s/gpt2.bin", test_tmpdir());
#define LLMC_ERR(seq, expect)                                                                      \
    do {                                                                                           \
        CHECK_EQ(ckpt_load_llmc(path, seq, &found, &params, &got_n, &err), -EINVAL);               \
        CHECK_STR(err.text, expect);                                                               \
        CHECK(params == NULL);                                                                     \
    } while (0)

    write_llmc(path, &shape, 5, 0);
    snprintf(msg, sizeof(msg),
             "'%s': llm.c checkpoint version 5 holds bf16 parameters; only version 3 (fp32) is "
             "read",
             path);
    LLMC_ERR(0, msg);
    write_llmc(path, &shape, 2, 0);
    snprintf(msg, sizeof(msg), "'%s': llm.c checkpoint version 2, this reader knows 3", path);
    LLMC_ERR(0, msg);
    write_llmc(path, &shape, 3, 4);
    snprintf(msg, sizeof(msg),
             "'%s': %zu bytes, the header's shape needs %zu (%zu fp32 parameters)", path,
             1024 + ckpt_llmc_nparams(&shape) * 4 - 4, 1024 + ckpt_llmc_nparams(&shape) * 4,
             ckpt_llmc_nparams(&shape));
    LLMC_ERR(0, msg);
    write_llmc(path, &shape, 3, 0);
    snprintf(msg, sizeof(msg), "'%s': seq_len 17 is longer than the checkpoint's 16 positions",
             path);
    LLMC_ERR(17, msg);
    bad.n_head = 3;
    write_llmc(path, &bad, 3, 0);
    snprintf(msg, sizeof(msg),
             "'%s': implausible shape in the header (maxT 16, V 50, L 2, NH 3, C 8, Vp 64)", path);
    LLMC_ERR(0, msg);
    /* Our own checkpoint is not llm.c's. */
    {
        struct ckpt_state st;
        make_state(&st, 300, 1, 1); /* over llm.c's 1024-byte header */
        CHECK_EQ(ckpt_save(test_tmpdir(), &st, NULL, &err), 0);
        free_state(&st);
        CHECK_EQ(ckpt_path(path, sizeof(path), test_tmpdir(), 1), 0);
        snprintf(msg, sizeof(msg),
                 "'%s': not an llm.c GPT-2 checkpoint (magic 1129467975, expected 20240326)", path);
        LLMC_ERR(0, msg);
    }
    CHECK_EQ(fs_write_atomic(path, "short", 5, 0644), 0);
    snprintf(msg, sizeof(msg), "'%s': 5 bytes, too short for llm.c's 1024-byte header", path);
    LLMC_ERR(0, msg);
#undef LLMC_ERR
}

/* The checkpoint's own name and nothing else: not a save's temp file, not one set aside as
 * damaged, not another file of the out_dir. */
TEST(ckpt_is_name_exact)
{
    CHECK(ckpt_is_name("ckpt_00000012.bin"));
    CHECK(ckpt_is_name("ckpt_123456789.bin"));
    CHECK(!ckpt_is_name("ckpt_00000012.bin.tmp.77"));
    CHECK(!ckpt_is_name("ckpt_00000012.bin.damaged"));
    CHECK(!ckpt_is_name("ckpt_.bin"));
    CHECK(!ckpt_is_name("ckpt_12x.bin"));
    CHECK(!ckpt_is_name("metrics.jsonl"));
    CHECK(!ckpt_is_name("ckpt_00000012.bin~"));
}
