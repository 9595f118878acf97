/* Token shards: opened through mmap and checked once, then read as one stream that the
 * loader cuts into the same global batches whatever the number of ranks; and the byte-level
 * tokenizer that writes shards from text. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"
#include "errmsg.h"
#include "fsutil.h"
#include "banned.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "shards are little-endian and read in place: a big-endian host needs byte swaps"
#endif

#define HEADER_BYTES    (DATA_SHARD_HEADER_INTS * (int)sizeof(int32_t))
/* Text is read for prep in pieces of this size. */
#define PREP_READ_CHUNK (1 << 20)

/* --- opening and checking shards ----------------------------------------------------------- */

/* The largest token of n, in parallel: a pass over all the data at open is what lets the
 * loader trust every token later. */
static uint16_t max_token(const uint16_t *t, uint64_t n)
{
    uint16_t mx = 0;

#ifdef _OPENMP
#pragma omp parallel for reduction(max : mx) schedule(static)
#endif
    for (uint64_t i = 0; i < n; i++)
        if (t[i] > mx)
            mx = t[i];
    return mx;
}

static int shard_open(struct data_shard *sh, const char *path, int vocab_size, struct errmsg *err)
{
    struct stat st;
    const int32_t *hdr;
    uint64_t have;
    int fd, ret = -1;

    sh->path = strdup(path);
    if (!sh->path)
        return errmsg_set(err, -ENOMEM, "cannot open '%s': out of memory", path);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ret = errmsg_set(err, -errno, "cannot open '%s': %s", path, strerror(errno));
        goto out;
    }
    if (fstat(fd, &st) < 0) {
        ret = errmsg_set(err, -errno, "cannot stat '%s': %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        ret = errmsg_set(err, -EINVAL, "'%s': not a regular file", path);
        goto out;
    }
    if (st.st_size < HEADER_BYTES) {
        ret = errmsg_set(err, -EINVAL, "'%s': %lld bytes, too short for the %d-byte shard header",
                         path, (long long)st.st_size, HEADER_BYTES);
        goto out;
    }
    sh->map_len = (size_t)st.st_size;
    sh->map = mmap(NULL, sh->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (sh->map == MAP_FAILED) {
        sh->map = NULL;
        ret = errmsg_set(err, -errno, "cannot map '%s': %s", path, strerror(errno));
        goto out;
    }
    hdr = sh->map;
    if (hdr[0] != DATA_SHARD_MAGIC) {
        ret = errmsg_set(err, -EINVAL, "'%s': not a token shard (magic %d, expected %d)", path,
                         hdr[0], DATA_SHARD_MAGIC);
        goto out;
    }
    if (hdr[1] != DATA_SHARD_VERSION) {
        ret = errmsg_set(err, -EINVAL, "'%s': shard version %d, this reader knows %d", path, hdr[1],
                         DATA_SHARD_VERSION);
        goto out;
    }
    if (hdr[2] < 0) {
        ret = errmsg_set(err, -EINVAL, "'%s': negative token count %d in the header", path, hdr[2]);
        goto out;
    }
    sh->ntokens = (uint64_t)hdr[2];
    have = (sh->map_len - HEADER_BYTES) / sizeof(uint16_t);
    if (have < sh->ntokens) {
        ret = errmsg_set(err, -EINVAL,
                         "'%s': truncated: the header says %llu tokens, the file holds %llu", path,
                         (unsigned long long)sh->ntokens, (unsigned long long)have);
        goto out;
    }
    if (HEADER_BYTES + sh->ntokens * sizeof(uint16_t) != sh->map_len) {
        ret = errmsg_set(
            err, -EINVAL,
            "'%s': the header says %llu tokens (%llu bytes) but the file has %zu bytes", path,
            (unsigned long long)sh->ntokens,
            (unsigned long long)(HEADER_BYTES + sh->ntokens * sizeof(uint16_t)), sh->map_len);
        goto out;
    }
    sh->tokens = (const uint16_t *)((const char *)sh->map + HEADER_BYTES);
    if (sh->ntokens > 0 && max_token(sh->tokens, sh->ntokens) >= vocab_size) {
        uint64_t i = 0;
        while (sh->tokens[i] < vocab_size)
            i++;
        ret = errmsg_set(err, -EINVAL, "'%s': token %u at position %llu is not below vocab_size %d",
                         path, sh->tokens[i], (unsigned long long)i, vocab_size);
        goto out;
    }
    ret = 0;
out:
    if (fd >= 0)
        close(fd);
    return ret;
}

static void shard_close(struct data_shard *sh)
{
    if (sh->map)
        munmap(sh->map, sh->map_len);
    free(sh->path);
}

static int add_path(struct data_set *ds, const char *path, int vocab_size, struct errmsg *err)
{
    struct data_shard *sh = realloc(ds->shards, (ds->nshards + 1) * sizeof(*sh));
    int ret;

    if (!sh)
        return errmsg_set(err, -ENOMEM, "cannot open '%s': out of memory", path);
    ds->shards = sh;
    sh = &ds->shards[ds->nshards];
    memset(sh, 0, sizeof(*sh));
    ret = shard_open(sh, path, vocab_size, err);
    if (ret < 0) {
        shard_close(sh);
        return ret;
    }
    sh->first = ds->ntokens;
    ds->ntokens += sh->ntokens;
    ds->nshards++;
    return 0;
}

/* One element of a spec: a literal path, or a glob whose sorted matches are all added. */
static int add_element(struct data_set *ds, const char *elem, int vocab_size, struct errmsg *err)
{
    glob_t g;
    int rc, ret = 0;

    if (!strpbrk(elem, "*?["))
        return add_path(ds, elem, vocab_size, err);
    rc = glob(elem, 0, NULL, &g);
    if (rc == GLOB_NOMATCH)
        return errmsg_set(err, -ENOENT, "'%s': no file matches", elem);
    if (rc != 0)
        return errmsg_set(err, rc == GLOB_NOSPACE ? -ENOMEM : -EIO, "cannot expand '%s': %s", elem,
                          rc == GLOB_NOSPACE ? "out of memory" : "read error");
    for (size_t i = 0; i < g.gl_pathc && ret == 0; i++)
        ret = add_path(ds, g.gl_pathv[i], vocab_size, err);
    globfree(&g);
    return ret;
}

struct data_set *data_open(const char *spec, int vocab_size, struct errmsg *err)
{
    struct data_set *ds = calloc(1, sizeof(*ds));
    char *copy = NULL, *p, *next;

    if (!ds || !(ds->spec = strdup(spec)) || !(copy = strdup(spec))) {
        errmsg_set(err, -ENOMEM, "cannot open '%s': out of memory", spec);
        goto fail;
    }
    if (vocab_size < 1 || vocab_size > 65536) {
        errmsg_set(err, -EINVAL, "cannot open '%s': vocab_size %d is not 1..65536", spec,
                   vocab_size);
        goto fail;
    }
    for (p = copy; p; p = next) {
        char *e;
        next = strchr(p, ',');
        if (next)
            *next++ = '\0';
        while (isspace((unsigned char)*p))
            p++;
        e = p + strlen(p);
        while (e > p && isspace((unsigned char)e[-1]))
            *--e = '\0';
        if (!*p) {
            errmsg_set(err, -EINVAL, "'%s': an empty element in the list", spec);
            goto fail;
        }
        if (add_element(ds, p, vocab_size, err) < 0)
            goto fail;
    }
    free(copy);
    return ds;
fail:
    free(copy);
    data_close(ds);
    return NULL;
}

void data_close(struct data_set *ds)
{
    if (!ds)
        return;
    for (size_t i = 0; i < ds->nshards; i++)
        shard_close(&ds->shards[i]);
    free(ds->shards);
    free(ds->spec);
    free(ds);
}

/* --- the loader ------------------------------------------------------------------------------ */

int data_loader_init(struct data_loader *dl, const struct data_set *ds, int B, int T, int rank,
                     int world, int accum, struct errmsg *err)
{
    uint64_t S;

    if (B < 1 || T < 1 || world < 1 || rank < 0 || rank >= world || accum < 1)
        return errmsg_set(err, -EINVAL,
                          "'%s': bad loader arguments (batch %d, seq_len %d, rank %d of %d, "
                          "grad_accum %d)",
                          ds->spec, B, T, rank, world, accum);
    S = ds->ntokens > 0 ? (ds->ntokens - 1) / (uint64_t)T : 0;
    memset(dl, 0, sizeof(*dl));
    dl->ds = ds;
    dl->B = B;
    dl->T = T;
    dl->rank = rank;
    dl->world = world;
    dl->accum = accum;
    dl->nseq = S;
    dl->G = (uint64_t)world * (uint64_t)B * (uint64_t)accum;
    if (S < dl->G)
        return errmsg_set(err, -EINVAL,
                          "'%s': too few tokens: %llu tokens make %llu sequences of %d+1, one step "
                          "needs %llu (%d ranks x batch_size %d x grad_accum %d)",
                          ds->spec, (unsigned long long)ds->ntokens, (unsigned long long)S, T,
                          (unsigned long long)dl->G, world, B, accum);
    return 0;
}

/* Index of the shard that holds stream token g (g < ntokens). */
static size_t shard_of(const struct data_set *ds, uint64_t g)
{
    size_t lo = 0, hi = ds->nshards;

    /* The last shard whose first token is <= g and that holds tokens. */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (ds->shards[mid].first <= g)
            lo = mid;
        else
            hi = mid;
    }
    while (ds->shards[lo].ntokens == 0 || g >= ds->shards[lo].first + ds->shards[lo].ntokens)
        lo++;
    return lo;
}

/* n tokens of the stream from g on into out (g + n <= ntokens). */
static void copy_tokens(const struct data_set *ds, uint64_t g, int n, int *out)
{
    size_t s = shard_of(ds, g);

    while (n > 0) {
        const struct data_shard *sh = &ds->shards[s];
        uint64_t off = g - sh->first;
        uint64_t avail = sh->ntokens - off;
        int take = avail < (uint64_t)n ? (int)avail : n;
        for (int i = 0; i < take; i++)
            out[i] = sh->tokens[off + (uint64_t)i];
        out += take;
        n -= take;
        g += (uint64_t)take;
        s++;
    }
}

/* B sequences starting at sequence first (reduced modulo S) into inputs and targets. */
static void fill(const struct data_loader *dl, uint64_t first, int *inputs, int *targets)
{
    for (int b = 0; b < dl->B; b++) {
        uint64_t seq = (first + (uint64_t)b) % dl->nseq;
        uint64_t g = seq * (uint64_t)dl->T;
        copy_tokens(dl->ds, g, dl->T, inputs + (size_t)b * (size_t)dl->T);
        copy_tokens(dl->ds, g + 1, dl->T, targets + (size_t)b * (size_t)dl->T);
    }
}

/* First sequence of step's global batch, not reduced modulo S. Steps before the restored
 * base count backwards from it. */
static uint64_t step_seq(const struct data_loader *dl, uint64_t step)
{
    if (step >= dl->base_step)
        return dl->base_seq + (step - dl->base_step) * dl->G;
    return dl->base_seq - (dl->base_step - step) * dl->G;
}

void data_loader_batch(const struct data_loader *dl, uint64_t step, int micro, int *inputs,
                       int *targets)
{
    uint64_t first = step_seq(dl, step) + (uint64_t)micro * (uint64_t)dl->world * (uint64_t)dl->B +
                     (uint64_t)dl->rank * (uint64_t)dl->B;
    fill(dl, first % dl->nseq, inputs, targets);
}

uint64_t data_loader_epoch(const struct data_loader *dl, uint64_t step)
{
    return step_seq(dl, step) / dl->nseq;
}

struct data_pos data_loader_pos(const struct data_loader *dl, uint64_t step)
{
    struct data_pos pos = {
        .step = step,
        .next_seq = step_seq(dl, step),
        .nseq = dl->nseq,
        .ntokens = dl->ds->ntokens,
    };
    return pos;
}

void data_loader_restore(struct data_loader *dl, const struct data_pos *pos)
{
    dl->base_step = pos->step;
    dl->base_seq = pos->next_seq;
}

void data_loader_val_batch(const struct data_loader *dl, int e, int *inputs, int *targets)
{
    uint64_t WB = (uint64_t)dl->world * (uint64_t)dl->B;
    fill(dl, ((uint64_t)e * WB + (uint64_t)dl->rank * (uint64_t)dl->B) % dl->nseq, inputs, targets);
}

uint64_t data_loader_val_batches(const struct data_loader *dl)
{
    return dl->nseq / ((uint64_t)dl->world * (uint64_t)dl->B);
}

/* --- prep: the byte-level tokenizer ------------------------------------------------------------
 */

/* One output stream (train or val): tokens gather in buf after room for the header and go to
 * out_dir/<name>_NNNNNN.bin when a shard is full or the stream ends. */
struct prep_out {
    const char *out_dir;
    const char *name;
    uint64_t total;     /* tokens the stream will hold */
    uint64_t done;      /* tokens written to finished shards */
    int shard;          /* index of the shard being filled */
    uint64_t cap, fill; /* tokens buf holds, and has */
    char *buf;          /* header + cap uint16 */
};

static int prep_flush(struct prep_out *o, struct errmsg *err)
{
    char path[PATH_MAX];
    int32_t *hdr = (int32_t *)o->buf;
    int rc;

    if (snprintf(path, sizeof(path), "%s/%s_%06d.bin", o->out_dir, o->name, o->shard) >=
        (int)sizeof(path))
        return errmsg_set(err, -ENAMETOOLONG, "'%s': name too long", o->out_dir);
    memset(hdr, 0, HEADER_BYTES);
    hdr[0] = DATA_SHARD_MAGIC;
    hdr[1] = DATA_SHARD_VERSION;
    hdr[2] = (int32_t)o->fill;
    rc = fs_write_atomic(path, o->buf, HEADER_BYTES + o->fill * sizeof(uint16_t), 0644);
    if (rc < 0)
        return errmsg_set(err, rc, "cannot write '%s': %s", path, strerror(-rc));
    o->done += o->fill;
    o->fill = 0;
    o->shard++;
    return 0;
}

static int prep_put(struct prep_out *o, const unsigned char *p, size_t n, struct errmsg *err)
{
    while (n > 0) {
        uint16_t *tok;
        size_t take;
        if (!o->buf) {
            uint64_t left = o->total - o->done;
            o->cap = left < DATA_PREP_SHARD_TOKENS ? left : DATA_PREP_SHARD_TOKENS;
            o->buf = malloc(HEADER_BYTES + o->cap * sizeof(uint16_t));
            if (!o->buf)
                return errmsg_set(err, -ENOMEM, "cannot tokenize: out of memory");
        }
        tok = (uint16_t *)(o->buf + HEADER_BYTES);
        take = o->cap - o->fill < n ? (size_t)(o->cap - o->fill) : n;
        for (size_t i = 0; i < take; i++)
            tok[o->fill + i] = p[i];
        o->fill += take;
        p += take;
        n -= take;
        if (o->fill == o->cap) {
            int rc = prep_flush(o, err);
            free(o->buf);
            o->buf = NULL;
            if (rc < 0)
                return rc;
        }
    }
    return 0;
}

/* Removes shards of an earlier prep numbered from `from` on, which a glob would otherwise
 * still pick up. */
static int prep_remove_stale(const char *out_dir, const char *name, int from, struct errmsg *err)
{
    char path[PATH_MAX];

    for (int i = from;; i++) {
        snprintf(path, sizeof(path), "%s/%s_%06d.bin", out_dir, name, i);
        if (unlink(path) < 0) {
            if (errno == ENOENT)
                return 0;
            return errmsg_set(err, -errno, "cannot remove '%s': %s", path, strerror(errno));
        }
    }
}

int data_prep(const char *const *inputs, size_t n, const char *out_dir, double val_fraction,
              struct errmsg *err)
{
    struct prep_out train = {.out_dir = out_dir, .name = "train"};
    struct prep_out val = {.out_dir = out_dir, .name = "val"};
    unsigned char *chunk = NULL;
    uint64_t total = 0, pos = 0;
    int ret = -1, fd = -1;

    if (n == 0)
        return errmsg_set(err, -EINVAL, "prep: no input text");
    if (!(val_fraction > 0.0 && val_fraction < 1.0))
        return errmsg_set(err, -EINVAL, "prep: the validation fraction %g is not between 0 and 1",
                          val_fraction);
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (stat(inputs[i], &st) < 0)
            return errmsg_set(err, -errno, "cannot read '%s': %s", inputs[i], strerror(errno));
        if (!S_ISREG(st.st_mode))
            return errmsg_set(err, -EINVAL, "cannot read '%s': not a regular file", inputs[i]);
        total += (uint64_t)st.st_size;
    }
    /* The last val_fraction of the bytes, rounded up; both parts need two tokens to make one
     * (input, target) pair. */
    val.total = (uint64_t)((double)total * val_fraction + 0.999999);
    train.total = total - val.total;
    if (val.total < 2 || train.total < 2)
        return errmsg_set(err, -EINVAL,
                          "prep: %llu bytes of text are too few for train and validation parts",
                          (unsigned long long)total);
    ret = fs_mkdirs(out_dir, 0755);
    if (ret < 0)
        return errmsg_set(err, ret, "cannot create '%s': %s", out_dir, strerror(-ret));
    chunk = malloc(PREP_READ_CHUNK);
    if (!chunk) {
        ret = errmsg_set(err, -ENOMEM, "cannot tokenize: out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        fd = open(inputs[i], O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            ret = errmsg_set(err, -errno, "cannot read '%s': %s", inputs[i], strerror(errno));
            goto out;
        }
        for (;;) {
            ssize_t got = read(fd, chunk, PREP_READ_CHUNK);
            size_t k, to_train;
            if (got < 0 && errno == EINTR)
                continue;
            if (got < 0) {
                ret = errmsg_set(err, -errno, "cannot read '%s': %s", inputs[i], strerror(errno));
                goto out;
            }
            if (got == 0)
                break;
            k = (size_t)got;
            if (pos + k > total) {
                ret = errmsg_set(err, -EAGAIN, "cannot read '%s': it grew while being read",
                                 inputs[i]);
                goto out;
            }
            to_train = pos >= train.total      ? 0
                       : train.total - pos < k ? (size_t)(train.total - pos)
                                               : k;
            ret = prep_put(&train, chunk, to_train, err);
            if (ret == 0)
                ret = prep_put(&val, chunk + to_train, k - to_train, err);
            if (ret < 0)
                goto out;
            pos += k;
        }
        close(fd);
        fd = -1;
    }
    if (pos != total) {
        ret = errmsg_set(err, -EAGAIN, "cannot tokenize: the text shrank while being read");
        goto out;
    }
    ret = prep_remove_stale(out_dir, "train", train.shard, err);
    if (ret == 0)
        ret = prep_remove_stale(out_dir, "val", val.shard, err);
out:
    if (fd >= 0)
        close(fd);
    free(chunk);
    free(train.buf);
    free(val.buf);
    return ret;
}
