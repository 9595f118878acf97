/* Tests of kernels/data: shards written here byte by byte, every refusal with its message,
 * the global batch that stays the same whatever the ranks, batch size and accumulation, the
 * wrap into the next epoch, saved positions, and the byte-level prep read back. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"
#include "fsutil.h"
#include "test.h"
#include "banned.h"

/* Token i of the streams these tests write: distinct enough to tell sequences apart. */
static int tok_at(uint64_t i)
{
    return (int)((i * 7 + 3) % 251);
}

/* Writes a shard of n tokens tok_at(first..first+n-1) with the given header fields; extra
 * bytes are appended after the tokens (negative: cut from the end). */
static void write_shard_raw(const char *path, int32_t magic, int32_t version, int32_t count,
                            uint64_t first, uint64_t n, long extra)
{
    size_t len = 1024 + n * 2;
    char *buf = calloc(1, len + (extra > 0 ? (size_t)extra : 0));
    int32_t *hdr = (int32_t *)buf;
    uint16_t *t = (uint16_t *)(buf + 1024);

    CHECK(buf != NULL);
    hdr[0] = magic;
    hdr[1] = version;
    hdr[2] = count;
    for (uint64_t i = 0; i < n; i++)
        t[i] = (uint16_t)tok_at(first + i);
    len = (size_t)((long)len + extra);
    CHECK_EQ(fs_write_atomic(path, buf, len, 0644), 0);
    free(buf);
}

static void write_shard(const char *path, uint64_t first, uint64_t n)
{
    write_shard_raw(path, DATA_SHARD_MAGIC, DATA_SHARD_VERSION, (int32_t)n, first, n, 0);
}

static void in_tmpdir(void)
{
    CHECK_EQ(chdir(test_tmpdir()), 0);
}

/* Checks that sequence seq of the stream sits in row b of inputs/targets. */
static void check_row(const int *inputs, const int *targets, int T, int b, uint64_t seq)
{
    for (int t = 0; t < T; t++) {
        uint64_t g = seq * (uint64_t)T + (uint64_t)t;
        if (inputs[b * T + t] != tok_at(g) || targets[b * T + t] != tok_at(g + 1))
            test_fail(__FILE__, __LINE__,
                      "row %d, position %d: input %d target %d, expected sequence %llu: %d %d", b,
                      t, inputs[b * T + t], targets[b * T + t], (unsigned long long)seq, tok_at(g),
                      tok_at(g + 1));
    }
}

TEST(data_open_shards)
{
    struct errmsg err = {0};
    struct data_set *ds;
    struct data_loader dl;
    int in[4 * 5], tg[4 * 5];

    in_tmpdir();
    /* Three shards named so that only sorting puts them in stream order; sizes that make
     * sequences straddle the boundaries, and an empty shard between. */
    write_shard("s_b.bin", 7, 0);
    write_shard("s_a.bin", 0, 7);
    write_shard("s_c.bin", 7, 30);
    ds = data_open("s_*.bin", 256, &err);
    if (!ds)
        test_fail(__FILE__, __LINE__, "%s", err.text);
    CHECK_EQ(ds->nshards, 3);
    CHECK_STR(ds->shards[0].path, "s_a.bin");
    CHECK_EQ(ds->ntokens, 37);
    CHECK_EQ(data_loader_init(&dl, ds, 4, 5, 0, 1, 1, &err), 0);
    CHECK_EQ(dl.nseq, 7); /* (37 - 1) / 5 */
    CHECK_EQ(data_loader_batch(&dl, 0, 0, in, tg, &err), 0);
    for (int b = 0; b < 4; b++)
        check_row(in, tg, 5, b, (uint64_t)b);
    data_close(ds);

    /* A list: a literal path and a glob, in the list's order. */
    write_shard("t_1.bin", 0, 10);
    write_shard("t_2.bin", 10, 11);
    ds = data_open(" t_1.bin , t_[2].bin", 256, &err);
    if (!ds)
        test_fail(__FILE__, __LINE__, "%s", err.text);
    CHECK_EQ(ds->nshards, 2);
    CHECK_EQ(ds->ntokens, 21);
    CHECK_EQ(data_loader_init(&dl, ds, 4, 5, 0, 1, 1, &err), 0);
    CHECK_EQ(data_loader_batch(&dl, 0, 0, in, tg, &err), 0);
    for (int b = 0; b < 4; b++)
        check_row(in, tg, 5, b, (uint64_t)b);
    data_close(ds);
}

/* Opens spec expecting a failure with exactly msg. */
static void check_open_error(const char *spec, int vocab, int code, const char *msg)
{
    struct errmsg err = {0};
    struct data_set *ds = data_open(spec, vocab, &err);

    if (ds)
        test_fail(__FILE__, __LINE__, "'%s' was opened", spec);
    (void)code;
    CHECK_STR(err.text, msg);
}

TEST(data_shard_errors)
{
    in_tmpdir();
    write_shard_raw("magic.bin", 20240326, 1, 10, 0, 10, 0);
    check_open_error("magic.bin", 256, -EINVAL,
                     "'magic.bin': not a token shard (magic 20240326, expected 20240520)");
    write_shard_raw("version.bin", DATA_SHARD_MAGIC, 2, 10, 0, 10, 0);
    check_open_error("version.bin", 256, -EINVAL,
                     "'version.bin': shard version 2, this reader knows 1");
    write_shard_raw("trunc.bin", DATA_SHARD_MAGIC, 1, 10, 0, 10, -4);
    check_open_error("trunc.bin", 256, -EINVAL,
                     "'trunc.bin': truncated: the header says 10 tokens, the file holds 8");
    write_shard_raw("long.bin", DATA_SHARD_MAGIC, 1, 10, 0, 10, 6);
    check_open_error("long.bin", 256, -EINVAL,
                     "'long.bin': the header says 10 tokens (1044 bytes) but the file has 1050 "
                     "bytes");
    write_shard_raw("neg.bin", DATA_SHARD_MAGIC, 1, -5, 0, 10, 0);
    check_open_error("neg.bin", 256, -EINVAL, "'neg.bin': negative token count -5 in the header");
    CHECK_EQ(fs_write_atomic("short.bin", "abc", 3, 0644), 0);
    check_open_error("short.bin", 256, -EINVAL,
                     "'short.bin': 3 bytes, too short for the 1024-byte shard header");
    /* The first token of 200 or more is the one named, with its position. */
    write_shard("vocab.bin", 0, 100);
    {
        int first = -1;
        for (int i = 0; i < 100 && first < 0; i++)
            if (tok_at((uint64_t)i) >= 200)
                first = i;
        char msg[256];
        snprintf(msg, sizeof(msg),
                 "'vocab.bin': token %d at position %d is not below vocab_size 200",
                 tok_at((uint64_t)first), first);
        check_open_error("vocab.bin", 200, -EINVAL, msg);
    }
    check_open_error("none_*.bin", 256, -ENOENT,
                     "'none_*.bin': no file matches (token shards are made by 'gpurun-train "
                     "prep')");
    check_open_error("missing.bin", 256, -ENOENT,
                     "cannot open 'missing.bin': No such file or directory");
    check_open_error("vocab.bin,,vocab.bin", 256, -EINVAL,
                     "'vocab.bin,,vocab.bin': an empty element in the list");
    CHECK_EQ(mkdir("adir.bin", 0700), 0);
    check_open_error("adir.bin", 256, -EINVAL, "'adir.bin': not a regular file");
    /* One bad shard among good ones names the bad one. */
    write_shard("m_1.bin", 0, 10);
    write_shard_raw("m_2.bin", DATA_SHARD_MAGIC, 1, 10, 0, 10, -2);
    check_open_error("m_*.bin", 256, -EINVAL,
                     "'m_2.bin': truncated: the header says 10 tokens, the file holds 9");
}

TEST(data_too_few_tokens)
{
    struct errmsg err = {0};
    struct data_set *ds;
    struct data_loader dl;

    in_tmpdir();
    write_shard("few.bin", 0, 40); /* (40 - 1) / 8 = 4 sequences of 8+1 */
    ds = data_open("few.bin", 256, &err);
    CHECK(ds != NULL);
    CHECK_EQ(data_loader_init(&dl, ds, 2, 8, 0, 2, 1, &err), 0);
    CHECK_EQ(data_loader_init(&dl, ds, 2, 8, 1, 2, 2, &err), -EINVAL);
    CHECK_STR(err.text, "'few.bin': too few tokens: 40 tokens make 4 sequences of 8+1, one step "
                        "needs 8 (2 ranks x batch_size 2 x grad_accum 2)");
    CHECK_EQ(data_loader_init(&dl, ds, 2, 8, 2, 2, 1, &err), -EINVAL);
    CHECK_CONTAINS(err.text, "bad loader arguments");
    data_close(ds);
}

/* A shard that shrinks or is rewritten after data_open: the read that meets it is an error
 * naming the file and what changed, never SIGBUS (the shards were once mmapped). */
TEST(data_shard_changes_under_reads)
{
    struct errmsg err = {0};
    struct data_set *ds;
    struct data_loader dl;
    int in[4 * 8], tg[4 * 8];
    uint16_t first;
    char msg[256];

    in_tmpdir();
    write_shard("c_1.bin", 0, 100);
    write_shard("c_2.bin", 100, 1000); /* 1024 + 2000 bytes */
    ds = data_open("c_*.bin", 256, &err);
    if (!ds)
        test_fail(__FILE__, __LINE__, "%s", err.text);
    CHECK_EQ(data_loader_init(&dl, ds, 4, 8, 0, 1, 1, &err), 0);
    CHECK_EQ(data_loader_batch(&dl, 20, 0, in, tg, &err), 0);
    check_row(in, tg, 8, 0, 80);

    /* Cut in place (not replaced: the open descriptor sees it): sequence 80 lies in the part
     * cut off; the first shard still reads. */
    CHECK_EQ(truncate("c_2.bin", 2000), 0);
    CHECK_EQ(data_loader_batch(&dl, 20, 0, in, tg, &err), -EIO);
    CHECK_STR(err.text,
              "data shard 'c_2.bin' shrank from 3024 to 2000 bytes while training read it");
    CHECK_EQ(data_loader_batch(&dl, 1, 0, in, tg, &err), 0);
    check_row(in, tg, 8, 3, 7);
    /* The validation batches read the same way. */
    CHECK_EQ(data_loader_val_batch(&dl, 25, in, tg, &err), -EIO); /* sequences 100.. */
    CHECK_CONTAINS(err.text, "shrank from 3024 to 2000 bytes");
    CHECK_EQ(truncate("c_2.bin", 0), 0);
    CHECK_EQ(data_loader_batch(&dl, 4, 0, in, tg, &err), -EIO);
    CHECK_STR(err.text, "data shard 'c_2.bin' shrank from 3024 to 0 bytes while training read it");

    /* Rewritten in place with a token out of the vocabulary: caught before it is used. */
    {
        FILE *f = fopen("c_1.bin", "r+b");
        uint16_t big = 300;
        CHECK(f != NULL);
        CHECK_EQ(fseek(f, 1024 + 2 * 3, SEEK_SET), 0);
        CHECK_EQ(fwrite(&big, sizeof(big), 1, f), 1);
        CHECK_EQ(fclose(f), 0);
    }
    CHECK_EQ(data_loader_batch(&dl, 0, 0, in, tg, &err), -EIO);
    snprintf(msg, sizeof(msg),
             "data shard 'c_1.bin': token 300 at position 3 is not below vocab_size 256: the file "
             "changed while training read it");
    CHECK_STR(err.text, msg);
    CHECK_EQ(data_read(ds, 0, 1, &first, &err), 0);
    CHECK_EQ(first, tok_at(0));
    data_close(ds);
}

/* The rows rank r of world W gets at micro-step m of step s, checked against the sequences
 * the global-batch rule names, for several (W, B, accum) with the same G. */
TEST(data_global_batch_same_for_any_ranks)
{
    static const struct {
        int W, B, accum;
    } cfgs[] = {{1, 8, 1}, {1, 4, 2}, {2, 2, 2}, {2, 4, 1}, {4, 1, 2}, {1, 2, 4}, {8, 1, 1}};
    struct errmsg err = {0};
    struct data_set *ds;
    const int T = 6;
    int in[8 * 6], tg[8 * 6];
    int ref_in[8 * 6 * 4], ref_tg[8 * 6 * 4]; /* W=1, B=8, accum=1: the global batches */

    in_tmpdir();
    write_shard("g_0.bin", 0, 100);
    write_shard("g_1.bin", 100, 150); /* 249 / 6 = 41 sequences: step 5 wraps (40..47) */
    ds = data_open("g_*.bin", 256, &err);
    CHECK(ds != NULL);
    for (uint64_t s = 0; s < 8; s++) {
        struct data_loader ref;
        CHECK_EQ(data_loader_init(&ref, ds, 8, T, 0, 1, 1, &err), 0);
        CHECK_EQ(data_loader_batch(&ref, s, 0, ref_in, ref_tg, &err), 0);
        for (int b = 0; b < 8; b++)
            check_row(ref_in, ref_tg, T, b, (s * 8 + (uint64_t)b) % 41);
        for (size_t c = 0; c < sizeof(cfgs) / sizeof(cfgs[0]); c++) {
            int W = cfgs[c].W, B = cfgs[c].B, A = cfgs[c].accum;
            for (int r = 0; r < W; r++) {
                struct data_loader dl;
                CHECK_EQ(data_loader_init(&dl, ds, B, T, r, W, A, &err), 0);
                CHECK_EQ(dl.G, 8);
                for (int m = 0; m < A; m++) {
                    int row0 = m * W * B + r * B;
                    CHECK_EQ(data_loader_batch(&dl, s, m, in, tg, &err), 0);
                    if (memcmp(in, ref_in + row0 * T, sizeof(int) * (size_t)(B * T)) ||
                        memcmp(tg, ref_tg + row0 * T, sizeof(int) * (size_t)(B * T)))
                        test_fail(__FILE__, __LINE__,
                                  "W=%d B=%d accum=%d: rank %d micro %d of step %llu differs "
                                  "from rows %d.. of the global batch",
                                  W, B, A, r, m, (unsigned long long)s, row0);
                }
            }
        }
    }
    data_close(ds);
}

/* The epoch step begins in: how many times the data has been gone through before it (the
 * loader's position, over the set's sequences). */
static uint64_t epoch_of(const struct data_loader *dl, uint64_t step)
{
    return data_loader_pos(dl, step).next_seq / dl->nseq;
}

TEST(data_wrap_and_epochs)
{
    struct errmsg err = {0};
    struct data_set *ds;
    struct data_loader dl;
    int in[4 * 4], tg[4 * 4];

    in_tmpdir();
    write_shard("w.bin", 0, 41); /* 10 sequences of 4+1 */
    ds = data_open("w.bin", 256, &err);
    CHECK(ds != NULL);
    CHECK_EQ(data_loader_init(&dl, ds, 2, 4, 1, 2, 1, &err), 0); /* G = 4 */
    CHECK_EQ(epoch_of(&dl, 0), 0);
    CHECK_EQ(epoch_of(&dl, 2), 0); /* sequences 8..11: starts in epoch 0 */
    CHECK_EQ(epoch_of(&dl, 3), 1);
    CHECK_EQ(epoch_of(&dl, 5), 2);
    /* Step 2, rank 1: sequences 10, 11 = 0, 1 of the next pass. */
    CHECK_EQ(data_loader_batch(&dl, 2, 0, in, tg, &err), 0);
    check_row(in, tg, 4, 0, 0);
    check_row(in, tg, 4, 1, 1);
    /* Step 7, rank 1: 28 + 2 = 30, 31 -> 0, 1. */
    CHECK_EQ(data_loader_batch(&dl, 7, 0, in, tg, &err), 0);
    check_row(in, tg, 4, 0, 0);
    check_row(in, tg, 4, 1, 1);
    data_close(ds);
}

TEST(data_position_restore)
{
    struct errmsg err = {0};
    struct data_set *ds;
    struct data_loader a, b;
    struct data_pos pos;
    int in_a[2 * 4], tg_a[2 * 4], in_b[2 * 4], tg_b[2 * 4];

    in_tmpdir();
    write_shard("p.bin", 0, 201); /* 50 sequences of 4+1 */
    ds = data_open("p.bin", 256, &err);
    CHECK(ds != NULL);
    CHECK_EQ(data_loader_init(&a, ds, 2, 4, 1, 2, 3, &err), 0); /* G = 12 */
    pos = data_loader_pos(&a, 5);
    CHECK_EQ(pos.step, 5);
    CHECK_EQ(pos.next_seq, 60);
    CHECK_EQ(pos.nseq, 50);
    CHECK_EQ(pos.ntokens, 201);
    /* The same loader, fresh, restored: the same batches from step 5 on. */
    CHECK_EQ(data_loader_init(&b, ds, 2, 4, 1, 2, 3, &err), 0);
    data_loader_restore(&b, &pos);
    for (uint64_t s = 5; s < 9; s++)
        for (int m = 0; m < 3; m++) {
            CHECK_EQ(data_loader_batch(&a, s, m, in_a, tg_a, &err), 0);
            CHECK_EQ(data_loader_batch(&b, s, m, in_b, tg_b, &err), 0);
            CHECK(!memcmp(in_a, in_b, sizeof(in_a)) && !memcmp(tg_a, tg_b, sizeof(tg_a)));
        }
    CHECK_EQ(epoch_of(&b, 5), 1);
    /* A resume with another shape goes on from sequence 60: world 1, B 2, accum 1 (G = 2). */
    CHECK_EQ(data_loader_init(&b, ds, 2, 4, 0, 1, 1, &err), 0);
    data_loader_restore(&b, &pos);
    CHECK_EQ(data_loader_batch(&b, 5, 0, in_b, tg_b, &err), 0);
    check_row(in_b, tg_b, 4, 0, 10);
    check_row(in_b, tg_b, 4, 1, 11);
    CHECK_EQ(data_loader_batch(&b, 6, 0, in_b, tg_b, &err), 0);
    check_row(in_b, tg_b, 4, 0, 12);
    pos = data_loader_pos(&b, 7);
    CHECK_EQ(pos.next_seq, 64);
    data_close(ds);
}

TEST(data_val_batches)
{
    struct errmsg err = {0};
    struct data_set *ds;
    struct data_loader one, r0, r1;
    int in1[4 * 3], tg1[4 * 3], in2[2 * 3], tg2[2 * 3];

    in_tmpdir();
    write_shard("v.bin", 0, 31); /* 10 sequences of 3+1 */
    ds = data_open("v.bin", 256, &err);
    CHECK(ds != NULL);
    CHECK_EQ(data_loader_init(&one, ds, 4, 3, 0, 1, 1, &err), 0);
    CHECK_EQ(data_loader_init(&r0, ds, 2, 3, 0, 2, 1, &err), 0);
    CHECK_EQ(data_loader_init(&r1, ds, 2, 3, 1, 2, 1, &err), 0);
    CHECK_EQ(data_loader_val_batches(&one), 2);
    CHECK_EQ(data_loader_val_batches(&r0), 2);
    for (int e = 0; e < 3; e++) {
        CHECK_EQ(data_loader_val_batch(&one, e, in1, tg1, &err), 0);
        for (int b = 0; b < 4; b++)
            check_row(in1, tg1, 3, b, (uint64_t)(e * 4 + b) % 10);
        CHECK_EQ(data_loader_val_batch(&r0, e, in2, tg2, &err), 0);
        CHECK(!memcmp(in2, in1, sizeof(in2)) && !memcmp(tg2, tg1, sizeof(tg2)));
        CHECK_EQ(data_loader_val_batch(&r1, e, in2, tg2, &err), 0);
        CHECK(!memcmp(in2, in1 + 6, sizeof(in2)) && !memcmp(tg2, tg1 + 6, sizeof(tg2)));
    }
    data_close(ds);
}

static void write_text(const char *path, const char *text)
{
    CHECK_EQ(fs_write_atomic(path, text, strlen(text), 0644), 0);
}

TEST(data_prep_round_trip)
{
    struct errmsg err = {0};
    struct data_set *tr, *va;
    const char *inputs[] = {"a.txt", "b.txt"};
    char text[4096];
    uint16_t toks[4096];
    size_t n = 0, ntrain;

    in_tmpdir();
    /* Every byte value, so that the tokenizer is seen to keep bytes above 127 as they are. */
    for (int i = 0; i < 256; i++)
        text[n++] = (char)(i == 0 ? 1 : i);
    for (int i = 0; i < 1000; i++)
        text[n++] = "the quick brown fox\n"[i % 20];
    text[n] = '\0';
    CHECK_EQ(fs_write_atomic("a.txt", text, 700, 0644), 0);
    CHECK_EQ(fs_write_atomic("b.txt", text + 700, n - 700, 0644), 0);
    CHECK_EQ(data_prep(inputs, 2, "out/demo", 0.1, &err), 0);
    /* A shard left by an earlier, larger prep: must not survive the next. */
    write_shard("out/demo/train_000001.bin", 0, 10);
    CHECK_EQ(data_prep(inputs, 2, "out/demo", 0.1, &err), 0);
    CHECK_EQ(access("out/demo/train_000001.bin", F_OK), -1);
    tr = data_open("out/demo/train_*.bin", 256, &err);
    va = data_open("out/demo/val_*.bin", 256, &err);
    CHECK(tr != NULL && va != NULL);
    ntrain = n - (size_t)((double)n * 0.1 + 0.999999);
    CHECK_EQ(tr->nshards, 1);
    CHECK_EQ(tr->ntokens, ntrain);
    CHECK_EQ(va->ntokens, n - ntrain);
    CHECK_EQ(data_read(tr, 0, ntrain, toks, &err), 0);
    CHECK_EQ(data_read(va, 0, n - ntrain, toks + ntrain, &err), 0);
    for (size_t i = 0; i < n; i++) {
        unsigned want = (unsigned char)text[i];
        if (toks[i] != want)
            test_fail(__FILE__, __LINE__, "byte %zu: token %u, expected %u", i, toks[i], want);
    }
    data_close(tr);
    data_close(va);
}

TEST(data_prep_errors)
{
    struct errmsg err = {0};
    const char *missing[] = {"nope.txt"};
    const char *small[] = {"small.txt"};
    const char *dir[] = {"."};

    in_tmpdir();
    CHECK_EQ(data_prep(missing, 1, "out", 0.05, &err), -ENOENT);
    CHECK_STR(err.text, "cannot read 'nope.txt': No such file or directory");
    CHECK_EQ(data_prep(dir, 1, "out", 0.05, &err), -EINVAL);
    CHECK_STR(err.text, "cannot read '.': not a regular file");
    write_text("small.txt", "abc");
    CHECK_EQ(data_prep(small, 1, "out", 0.5, &err), -EINVAL);
    CHECK_STR(err.text, "prep: 3 bytes of text are too few for train and validation parts");
    CHECK_EQ(data_prep(small, 1, "out", 1.0, &err), -EINVAL);
    CHECK_STR(err.text, "prep: the validation fraction 1 is not between 0 and 1");
    CHECK_EQ(data_prep(small, 0, "out", 0.5, &err), -EINVAL);
    CHECK_STR(err.text, "prep: no input text");
    CHECK_EQ(access("out", F_OK), -1); /* nothing written on a refusal */
    write_text("small.txt", "abcd");
    CHECK_EQ(data_prep(small, 1, "out", 0.5, &err), 0);
}
