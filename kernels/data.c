/* Token shards: opened and checked once, then read as one stream that the loader cuts into
 * the same global batches whatever the number of ranks; and the byte-level tokenizer that
 * writes shards from text.
 *
 * Shards are read with pread into our own buffers, not mmapped. A mapped file that is
 * truncated under the run turns the next access to the lost pages into SIGBUS: the run dies
 * with status 135 and no line. Checking the size (fstat) before each batch narrows that
 * window but cannot close it: a truncation between the check and the copy still faults.
 * Catching SIGBUS (sigsetjmp around the copy) could close it, but the handler is per process
 * while the jump is per thread, and it would have to coexist with the CUDA runtime's and the
 * sanitizers' own handlers. pread instead returns a short count, at any moment, so the error
 * can name the file and its sizes; and since every token passes through our hands, a token
 * rewritten in place to one not below vocab_size is caught before it indexes an embedding.
 * The cost, measured on 2 shared CPUs with a 100 MB shard in the page cache (best of 5 passes
 * over up to 20,000 batches): a rank's micro-step of 16 x 1024 tokens in 10.9 us against 10.0
 * us through the mapping, 4 x 128 (jobs/tiny.cfg) in 0.72 us against 0.29 us: one pread per
 * run of consecutive sequences (READ_CHUNK tokens at most), next to a training step of
 * milliseconds (jobs/tiny.cfg on one rank: 28,500 tokens/s either way, within the noise).
 * The check at open reads in parallel pieces: 100 MB in about 20 ms, as through the mapping. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"
#include "errmsg.h"
#include "fsutil.h"
#include "banned.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "shards are little-endian and read as they are: a big-endian host needs byte swaps"
#endif

#define HEADER_BYTES    (DATA_SHARD_HEADER_INTS * (int)sizeof(int32_t))
/* Text is read for prep in pieces of this size. */
#define PREP_READ_CHUNK (1 << 20)
/* Tokens a batch read takes per pread, into a buffer on the stack (16 KiB): a 1024-token
 * sequence in one call, a few calls for a micro-step of a GPT-2 run. */
#define READ_CHUNK      8192
/* Tokens the check at open reads per pread (256 KiB): a piece stays in a core's L2 cache
 * between the read and the check. */
#define OPEN_CHUNK      (128u << 10)

/* The largest of n tokens. */
static uint16_t max_token(const uint16_t *t, size_t n)
{
    uint16_t mx = 0;

    for (size_t i = 0; i < n; i++)
        mx = t[i] > mx ? t[i] : mx;
    return mx;
}

/* --- reading ------------------------------------------------------------------------------- */

/* n tokens of shard sh from its token off on (off + n <= ntokens) into buf, as they are on
 * disk. A short read means the file shrank since it was opened: an error naming both sizes. */
static int shard_pread(const struct data_shard *sh, uint64_t off, size_t n, uint16_t *buf,
                       struct errmsg *err)
{
    char *p = (char *)buf;
    size_t left = n * sizeof(uint16_t);
    off_t at = (off_t)(HEADER_BYTES + off * sizeof(uint16_t));

    while (left > 0) {
        ssize_t got = pread(sh->fd, p, left, at);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return errmsg_set(err, -errno, "cannot read data shard '%s': %s", sh->path,
                              strerror(errno));
        if (got == 0) {
            struct stat st;
            if (fstat(sh->fd, &st) == 0 && (uint64_t)st.st_size < sh->size)
                return errmsg_set(err, -EIO,
                                  "data shard '%s' shrank from %llu to %lld bytes while training "
                                  "read it",
                                  sh->path, (unsigned long long)sh->size, (long long)st.st_size);
            return errmsg_set(err, -EIO,
                              "data shard '%s' ended at byte %lld, %llu bytes before its size at "
                              "open: it changed while training read it",
                              sh->path, (long long)at,
                              (unsigned long long)(sh->size - (uint64_t)at));
        }
        p += got;
        at += got;
        left -= (size_t)got;
    }
    return 0;
}

/* The error for the first token of buf (n tokens, read from shard sh at token off) that is not
 * below vocab_size; there is one. */
static int vocab_error(const struct data_shard *sh, uint64_t off, const uint16_t *buf, size_t n,
                       int vocab_size, struct errmsg *err)
{
    size_t i = 0;

    while (i < n - 1 && buf[i] < vocab_size)
        i++;
    return errmsg_set(err, -EIO,
                      "data shard '%s': token %u at position %llu is not below vocab_size %d: the "
                      "file changed while training read it",
                      sh->path, buf[i], (unsigned long long)(off + i), vocab_size);
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

/* Copies take tokens of buf, the stream's tokens i.. of a span of n (i + take <= n), into the
 * span's inputs (token j to in[j], j < n - 1) and targets (token j to tg[j - 1], j >= 1), and
 * returns whether any is not below vocab_size: one pass, without branches in the loop. */
static bool spread(const uint16_t *buf, size_t take, uint64_t i, uint64_t n, int *in, int *tg,
                   int vocab_size)
{
    size_t lo = i == 0, hi = i + take == n ? take - 1 : take;
    unsigned bad = 0;

    /* The span's first token is only an input, its last only a target. */
    if (lo)
        in[0] = buf[0];
    if (hi < take)
        tg[n - 2] = buf[take - 1];
    for (size_t k = lo; k < hi; k++) {
        unsigned t = buf[k];
        in[i + k] = (int)t;
        tg[i + k - 1] = (int)t;
        bad |= t >= (unsigned)vocab_size;
    }
    return bad || buf[0] >= vocab_size || buf[take - 1] >= vocab_size;
}

/* The n tokens of the stream from g on (g + n <= ntokens, n >= 2 with in and tg, n >= 1 with
 * out), each checked below vocab_size: into out[0..n-1] when out is set, else spread into the
 * inputs in and targets tg of a span (spread above). So the span of k consecutive sequences of
 * T tokens (k T + 1 tokens) fills their inputs and targets at once. */
static int read_stream(const struct data_set *ds, uint64_t g, uint64_t n, uint16_t *out, int *in,
                       int *tg, struct errmsg *err)
{
    uint16_t chunk[READ_CHUNK];
    size_t s = shard_of(ds, g);
    uint64_t i = 0;
    int ret;

    while (i < n) {
        const struct data_shard *sh = &ds->shards[s];
        uint64_t off = g + i - sh->first, avail = sh->ntokens - off;
        size_t take;
        uint16_t *buf;
        bool bad;

        if (avail == 0) {
            s++;
            continue;
        }
        take = (size_t)(n - i < avail ? n - i : avail);
        if (!out && take > READ_CHUNK)
            take = READ_CHUNK;
        buf = out ? out + i : chunk;
        ret = shard_pread(sh, off, take, buf, err);
        if (ret < 0)
            return ret;
        bad = out ? max_token(buf, take) >= ds->vocab_size
                  : spread(buf, take, i, n, in, tg, ds->vocab_size);
        if (bad)
            return vocab_error(sh, off, buf, take, ds->vocab_size, err);
        i += take;
    }
    return 0;
}

int data_read(const struct data_set *ds, uint64_t g, uint64_t n, uint16_t *out, struct errmsg *err)
{
    if (n == 0)
        return 0;
    return read_stream(ds, g, n, out, NULL, NULL, err);
}

/* --- opening and checking shards ----------------------------------------------------------- */

/* Every token of sh below vocab_size: the pieces of OPEN_CHUNK tokens are read and checked in
 * parallel, each thread into a buffer of its own that stays in its cache; the failure of the
 * lowest piece is the one reported, so the first bad token is named whatever the threads. */
static int check_tokens(const struct data_shard *sh, int vocab_size, struct errmsg *err)
{
    int64_t npieces = (int64_t)((sh->ntokens + OPEN_CHUNK - 1) / OPEN_CHUNK);
    int64_t failed_piece = npieces;
    int ret = 0;

#ifdef _OPENMP
#pragma omp parallel
#endif
    {
        uint16_t *buf = malloc(OPEN_CHUNK * sizeof(uint16_t));
        struct errmsg e;

#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
        for (int64_t p = 0; p < npieces; p++) {
            uint64_t off = (uint64_t)p * OPEN_CHUNK;
            size_t n = sh->ntokens - off < OPEN_CHUNK ? (size_t)(sh->ntokens - off) : OPEN_CHUNK;
            int r = buf ? shard_pread(sh, off, n, buf, &e)
                        : errmsg_set(&e, -ENOMEM, "cannot check '%s': out of memory", sh->path);
            if (r == 0 && max_token(buf, n) >= vocab_size) {
                size_t i = 0;
                while (buf[i] < vocab_size)
                    i++;
                r = errmsg_set(&e, -EINVAL,
                               "'%s': token %u at position %llu is not below vocab_size %d",
                               sh->path, buf[i], (unsigned long long)(off + i), vocab_size);
            }
            if (r < 0) {
#ifdef _OPENMP
#pragma omp critical(data_check_tokens)
#endif
                if (p < failed_piece) {
                    failed_piece = p;
                    ret = r;
                    *err = e;
                }
            }
        }
        free(buf);
    }
    return ret;
}

static int shard_open(struct data_shard *sh, const char *path, int vocab_size, struct errmsg *err)
{
    struct stat st;
    int32_t hdr[DATA_SHARD_HEADER_INTS];
    uint64_t have;
    ssize_t got;

    sh->path = strdup(path);
    if (!sh->path)
        return errmsg_set(err, -ENOMEM, "cannot open '%s': out of memory", path);
    sh->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (sh->fd < 0)
        return errmsg_set(err, -errno, "cannot open '%s': %s", path, strerror(errno));
    if (fstat(sh->fd, &st) < 0)
        return errmsg_set(err, -errno, "cannot stat '%s': %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return errmsg_set(err, -EINVAL, "'%s': not a regular file", path);
    if (st.st_size < HEADER_BYTES)
        return errmsg_set(err, -EINVAL, "'%s': %lld bytes, too short for the %d-byte shard header",
                          path, (long long)st.st_size, HEADER_BYTES);
    sh->size = (uint64_t)st.st_size;
    do
        got = pread(sh->fd, hdr, sizeof(hdr), 0);
    while (got < 0 && errno == EINTR);
    if (got < 0)
        return errmsg_set(err, -errno, "cannot read '%s': %s", path, strerror(errno));
    if (got != (ssize_t)sizeof(hdr))
        return errmsg_set(err, -EIO,
                          "data shard '%s' shrank from %llu to %zd bytes while training read it",
                          path, (unsigned long long)sh->size, got);
    if (hdr[0] != DATA_SHARD_MAGIC)
        return errmsg_set(err, -EINVAL, "'%s': not a token shard (magic %d, expected %d)", path,
                          hdr[0], DATA_SHARD_MAGIC);
    if (hdr[1] != DATA_SHARD_VERSION)
        return errmsg_set(err, -EINVAL, "'%s': shard version %d, this reader knows %d", path,
                          hdr[1], DATA_SHARD_VERSION);
    if (hdr[2] < 0)
        return errmsg_set(err, -EINVAL, "'%s': negative token count %d in the header", path,
                          hdr[2]);
    sh->ntokens = (uint64_t)hdr[2];
    have = (sh->size - HEADER_BYTES) / sizeof(uint16_t);
    if (have < sh->ntokens)
        return errmsg_set(err, -EINVAL,
                          "'%s': truncated: the header says %llu tokens, the file holds %llu", path,
                          (unsigned long long)sh->ntokens, (unsigned long long)have);
    if (HEADER_BYTES + sh->ntokens * sizeof(uint16_t) != sh->size)
        return errmsg_set(
            err, -EINVAL,
            "'%s': the header says %llu tokens (%llu bytes) but the file has %llu bytes", path,
            (unsigned long long)sh->ntokens,
            (unsigned long long)(HEADER_BYTES + sh->ntokens * sizeof(uint16_t)),
            (unsigned long long)sh->size);
    return sh->ntokens > 0 ? check_tokens(sh, vocab_size, err) : 0;
}

static void shard_close(struct data_shard *sh)
{
    if (sh->fd >= 0)
        close(sh->fd);
    sh->fd = -1;
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
    sh->fd = -1;
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
        return errmsg_set(err, -ENOENT,
                          "'%s': no file matches (token shards are made by 'gpurun-train prep')",
                          elem);
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
    ds->vocab_size = vocab_size;
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

/* B sequences starting at sequence first (reduced modulo S) into inputs and targets: each run
 * of consecutive sequences up to the wrap at S is one span of the stream. */
static int fill(const struct data_loader *dl, uint64_t first, int *inputs, int *targets,
                struct errmsg *err)
{
    uint64_t T = (uint64_t)dl->T;

    for (uint64_t b = 0; b < (uint64_t)dl->B;) {
        uint64_t seq = (first + b) % dl->nseq;
        uint64_t k = (uint64_t)dl->B - b < dl->nseq - seq ? (uint64_t)dl->B - b : dl->nseq - seq;
        int ret =
            read_stream(dl->ds, seq * T, k * T + 1, NULL, inputs + b * T, targets + b * T, err);
        if (ret < 0)
            return ret;
        b += k;
    }
    return 0;
}

/* First sequence of step's global batch, not reduced modulo S. Steps before the restored
 * base count backwards from it. */
static uint64_t step_seq(const struct data_loader *dl, uint64_t step)
{
    if (step >= dl->base_step)
        return dl->base_seq + (step - dl->base_step) * dl->G;
    return dl->base_seq - (dl->base_step - step) * dl->G;
}

int data_loader_batch(const struct data_loader *dl, uint64_t step, int micro, int *inputs,
                      int *targets, struct errmsg *err)
{
    uint64_t first = step_seq(dl, step) + (uint64_t)micro * (uint64_t)dl->world * (uint64_t)dl->B +
                     (uint64_t)dl->rank * (uint64_t)dl->B;
    return fill(dl, first % dl->nseq, inputs, targets, err);
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

int data_loader_val_batch(const struct data_loader *dl, int e, int *inputs, int *targets,
                          struct errmsg *err)
{
    uint64_t WB = (uint64_t)dl->world * (uint64_t)dl->B;
    return fill(dl, ((uint64_t)e * WB + (uint64_t)dl->rank * (uint64_t)dl->B) % dl->nseq, inputs,
                targets, err);
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
