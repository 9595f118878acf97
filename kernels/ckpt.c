/* Checkpoints: our format written through a temp file and a rename, with a SHA-256 trailer
 * that lets a load refuse a damaged file instead of training from garbage; and the reader
 * of llm.c's fp32 GPT-2 checkpoints. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "ckpt.h"
#include "errmsg.h"
#include "fsutil.h"
#include "banned.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoints are little-endian and written from memory: a big-endian host needs byte swaps"
#endif

#define CKPT_MAGIC      "GPRCKPT1"
#define CKPT_VERSION    1
#define CKPT_HEADER     256
#define CKPT_SHA_LEN    32 /* SHA-256 */
/* The config text is a dump of train.cfg, a few KiB; far more is a damaged header. */
#define CKPT_CONFIG_MAX (16u << 20)
/* Reads and writes of the parameter buffers go in pieces of this size so that hashing and
 * I/O stay in cache-sized steps and a short write is retried on a small remainder. */
#define IO_CHUNK        (8u << 20)

#define LLMC_HEADER_INTS  256 /* 1024 bytes */
/* llm.c's version 5 holds bf16 parameters (train_gpt2.cu's export). */
#define LLMC_VERSION_BF16 5

/* The on-disk header; fields are little-endian, sizes fixed. */
struct disk_header {
    char magic[8];
    uint32_t version;
    uint32_t header_size;
    int32_t n_layer, n_head, n_embd, seq_len, vocab_size, padded_vocab;
    int32_t world_size, batch_size, grad_accum, reserved;
    uint64_t nparams;
    uint64_t step;
    uint64_t opt_step;
    uint64_t rng[CKPT_RNG_WORDS];
    uint64_t data_step, data_next_seq, data_nseq, data_ntokens;
    uint64_t config_len;
    uint64_t file_size;
    uint8_t pad[96];
};
_Static_assert(sizeof(struct disk_header) == CKPT_HEADER, "the header is 256 bytes on disk");

int ckpt_path(char *buf, size_t len, const char *out_dir, uint64_t step)
{
    int n = snprintf(buf, len, "%s/ckpt_%08llu.bin", out_dir, (unsigned long long)step);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static uint64_t file_size_of(uint64_t config_len, uint64_t nparams)
{
    return CKPT_HEADER + config_len + 3 * nparams * sizeof(float) + CKPT_SHA_LEN;
}

/* --- save ---------------------------------------------------------------------------------- */

/* Writes len bytes of p to fd and into the hash. Returns 0 or a negative errno. */
static int write_hashed(int fd, EVP_MD_CTX *md, const void *p, size_t len)
{
    const char *c = p;

    while (len > 0) {
        size_t piece = len < IO_CHUNK ? len : IO_CHUNK;
        ssize_t n = write(fd, c, piece);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (md && EVP_DigestUpdate(md, c, (size_t)n) != 1)
            return -ENOMEM;
        c += n;
        len -= (size_t)n;
    }
    return 0;
}

/* The header of st's file, config_len bytes of config text. */
static void header_of(struct disk_header *h, const struct ckpt_state *st, uint64_t config_len)
{
    memset(h, 0, sizeof(*h));
    memcpy(h->magic, CKPT_MAGIC, sizeof(h->magic));
    h->version = CKPT_VERSION;
    h->header_size = CKPT_HEADER;
    h->n_layer = st->model.n_layer;
    h->n_head = st->model.n_head;
    h->n_embd = st->model.n_embd;
    h->seq_len = st->model.seq_len;
    h->vocab_size = st->model.vocab_size;
    h->padded_vocab = st->model.padded_vocab;
    h->world_size = st->world_size;
    h->batch_size = st->batch_size;
    h->grad_accum = st->grad_accum;
    h->nparams = st->nparams;
    h->step = st->step;
    h->opt_step = st->opt_step;
    memcpy(h->rng, st->rng, sizeof(h->rng));
    h->data_step = st->data.step;
    h->data_next_seq = st->data.next_seq;
    h->data_nseq = st->data.nseq;
    h->data_ntokens = st->data.ntokens;
    h->config_len = config_len;
    h->file_size = file_size_of(config_len, st->nparams);
}

/* The whole file of st into fd, which is at its start; durable: fsynced. Returns 0 or a
 * negative errno. */
static int write_state(int fd, const struct ckpt_state *st, const char *config, uint64_t config_len,
                       bool durable)
{
    struct disk_header h;
    unsigned char sha[EVP_MAX_MD_SIZE];
    unsigned int sha_len = 0;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int ret;

    if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
        EVP_MD_CTX_free(md);
        return -ENOMEM;
    }
    header_of(&h, st, config_len);
    ret = write_hashed(fd, md, &h, sizeof(h));
    if (ret == 0)
        ret = write_hashed(fd, md, config, (size_t)config_len);
    if (ret == 0)
        ret = write_hashed(fd, md, st->params, st->nparams * sizeof(float));
    if (ret == 0)
        ret = write_hashed(fd, md, st->m, st->nparams * sizeof(float));
    if (ret == 0)
        ret = write_hashed(fd, md, st->v, st->nparams * sizeof(float));
    if (ret == 0 && EVP_DigestFinal_ex(md, sha, &sha_len) != 1)
        ret = -ENOMEM;
    if (ret == 0)
        ret = write_hashed(fd, NULL, sha, CKPT_SHA_LEN);
    if (ret == 0 && durable && fsync(fd) < 0)
        ret = -errno;
    EVP_MD_CTX_free(md);
    return ret;
}

int ckpt_write(const char *path, const struct ckpt_state *st, const char *config,
               struct errmsg *err)
{
    uint64_t config_len = config ? strlen(config) : 0;
    int fd, ret;

    if (config_len > CKPT_CONFIG_MAX)
        return errmsg_set(err, -EINVAL, "cannot write '%s': config text of %llu bytes", path,
                          (unsigned long long)config_len);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return errmsg_set(err, -errno, "cannot create '%s': %s", path, strerror(errno));
    ret = write_state(fd, st, config, config_len, false);
    if (close(fd) < 0 && ret == 0)
        ret = -errno;
    if (ret < 0) {
        unlink(path);
        return errmsg_set(err, ret, "cannot write '%s': %s", path, strerror(-ret));
    }
    return 0;
}

int ckpt_save(const char *out_dir, const struct ckpt_state *st, const char *config,
              struct errmsg *err)
{
    char path[PATH_MAX], tmp[PATH_MAX + 32];
    uint64_t config_len = config ? strlen(config) : 0;
    int fd = -1, ret = -1;
    bool tmp_made = false;

    if (ckpt_path(path, sizeof(path), out_dir, st->step) < 0 ||
        snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof(tmp))
        return errmsg_set(err, -ENAMETOOLONG, "'%s': name too long", out_dir);
    if (config_len > CKPT_CONFIG_MAX)
        return errmsg_set(err, -EINVAL, "cannot write '%s': config text of %llu bytes", path,
                          (unsigned long long)config_len);
    ret = fs_mkdirs(out_dir, 0755);
    if (ret < 0)
        return errmsg_set(err, ret, "cannot create '%s': %s", out_dir, strerror(-ret));
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        ret = errmsg_set(err, -errno, "cannot create '%s': %s", tmp, strerror(errno));
        goto out;
    }
    tmp_made = true;
    ret = write_state(fd, st, config, config_len, true);
    if (ret < 0) {
        errmsg_set(err, ret, "cannot write '%s': %s", path, strerror(-ret));
        goto out;
    }
    if (close(fd) < 0) {
        fd = -1;
        ret = errmsg_set(err, -errno, "cannot write '%s': %s", path, strerror(errno));
        goto out;
    }
    fd = -1;
    if (rename(tmp, path) < 0) {
        ret = errmsg_set(err, -errno, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
        goto out;
    }
    tmp_made = false;
    ret = fs_fsync_dir(out_dir);
    if (ret < 0) {
        errmsg_set(err, ret, "cannot sync '%s': %s", out_dir, strerror(-ret));
        goto out;
    }
    ret = 0;
out:
    if (fd >= 0)
        close(fd);
    if (tmp_made)
        unlink(tmp);
    return ret;
}

/* --- find ---------------------------------------------------------------------------------- */

/* What a name in out_dir is to us. */
enum name_kind {
    NAME_OTHER,   /* not ours: never touched */
    NAME_CKPT,    /* "ckpt_<step>.bin" */
    NAME_TMP,     /* "ckpt_<step>.bin.tmp.<pid>": ckpt_save's temp file */
    NAME_DAMAGED, /* "ckpt_<step>.bin.damaged[.<n>]": set aside by ckpt_set_aside */
};

/* Reads the decimal number at *p (at least one digit, at most max) and moves *p past it.
 * Returns it, or -1. */
static long long number_at(const char **p, long long max)
{
    long long v = 0;

    if (!(**p >= '0' && **p <= '9'))
        return -1;
    for (; **p >= '0' && **p <= '9'; (*p)++) {
        if (v > (max - 9) / 10)
            return -1;
        v = v * 10 + (**p - '0');
    }
    return v;
}

/* The kind of name, with its step (and for a temp file the writer's pid) filled. The patterns
 * are exact: anything else is NAME_OTHER. */
static enum name_kind name_kind_of(const char *name, long long *step, long long *pid)
{
    const char *p = name + 5;

    if (strncmp(name, "ckpt_", 5) || (*step = number_at(&p, LLONG_MAX)) < 0 ||
        strncmp(p, ".bin", 4))
        return NAME_OTHER;
    p += 4;
    if (!*p)
        return NAME_CKPT;
    if (!strncmp(p, ".tmp.", 5)) {
        p += 5;
        *pid = number_at(&p, INT_MAX);
        return *pid > 0 && !*p ? NAME_TMP : NAME_OTHER;
    }
    if (!strncmp(p, ".damaged", 8)) {
        p += 8;
        if (!*p)
            return NAME_DAMAGED;
        p++;
        return p[-1] == '.' && number_at(&p, INT_MAX) >= 0 && !*p ? NAME_DAMAGED : NAME_OTHER;
    }
    return NAME_OTHER;
}

struct found {
    long long step;
    enum name_kind kind;
    char *path;
};

/* Newest step first; at one step the checkpoint before what was set aside. */
static int by_step_desc(const void *a, const void *b)
{
    const struct found *x = a, *y = b;
    if (x->step != y->step)
        return x->step < y->step ? 1 : -1;
    return (x->kind == NAME_DAMAGED) - (y->kind == NAME_DAMAGED);
}

/* The entries of out_dir whose name is of a kind in the bit set kinds (1 << NAME_CKPT...),
 * newest first, into *list (new, free_list). A missing out_dir holds none. */
static int list_ckpts(const char *out_dir, unsigned kinds, struct found **list, size_t *n,
                      struct errmsg *err)
{
    DIR *d = opendir(out_dir);
    struct dirent *e;
    struct found *v = NULL;
    size_t cnt = 0;

    *list = NULL;
    *n = 0;
    if (!d) {
        if (errno == ENOENT)
            return 0;
        return errmsg_set(err, -errno, "cannot read '%s': %s", out_dir, strerror(errno));
    }
    while ((e = readdir(d))) {
        long long step = -1, pid = -1;
        enum name_kind kind = name_kind_of(e->d_name, &step, &pid);
        struct found *nv;
        size_t len;
        if (kind == NAME_OTHER || !(kinds & (1u << kind)))
            continue;
        nv = realloc(v, (cnt + 1) * sizeof(*v));
        if (!nv)
            goto nomem;
        v = nv;
        len = strlen(out_dir) + strlen(e->d_name) + 2;
        v[cnt].step = step;
        v[cnt].kind = kind;
        v[cnt].path = malloc(len);
        if (!v[cnt].path)
            goto nomem;
        snprintf(v[cnt].path, len, "%s/%s", out_dir, e->d_name);
        cnt++;
    }
    closedir(d);
    if (cnt > 1)
        qsort(v, cnt, sizeof(*v), by_step_desc);
    *list = v;
    *n = cnt;
    return 0;
nomem:
    closedir(d);
    for (size_t i = 0; i < cnt; i++)
        free(v[i].path);
    free(v);
    return errmsg_set(err, -ENOMEM, "cannot read '%s': out of memory", out_dir);
}

static void free_list(struct found *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(list[i].path);
    free(list);
}

/* Reads the header of path and checks what does not need the body: a regular file, magic,
 * version, sizes against each other and against the file, and (name_step >= 0) the step its
 * name says. Returns 0, or with err filled -EBADMSG (damaged), -EPROTONOSUPPORT (another
 * format version), or the errno of a file that cannot be read. */
static int read_header(int fd, const char *path, long long name_step, struct disk_header *h,
                       struct errmsg *err)
{
    struct stat st;
    ssize_t n;

    if (fstat(fd, &st) < 0)
        return errmsg_set(err, -errno, "cannot stat '%s': %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return errmsg_set(err, S_ISDIR(st.st_mode) ? -EISDIR : -ENXIO,
                          "cannot read '%s': not a regular file", path);
    n = pread(fd, h, sizeof(*h), 0);
    if (n < 0)
        return errmsg_set(err, -errno, "cannot read '%s': %s", path, strerror(errno));
    if ((size_t)n < sizeof(*h))
        return errmsg_set(err, -EBADMSG,
                          "'%s': truncated: %zd bytes, shorter than the %d-byte header", path, n,
                          CKPT_HEADER);
    if (memcmp(h->magic, CKPT_MAGIC, sizeof(h->magic)))
        return errmsg_set(err, -EBADMSG, "'%s': not a gpurun checkpoint", path);
    /* Versions count up from 1: a higher one is a newer writer's file, which this reader must
     * neither use nor take for damage; 0 is no writer's. */
    if (h->version > CKPT_VERSION)
        return errmsg_set(
            err, -EPROTONOSUPPORT,
            "'%s': checkpoint format version %u is newer than this gpurun-train's (%d)", path,
            h->version, CKPT_VERSION);
    if (h->version != CKPT_VERSION)
        return errmsg_set(err, -EBADMSG, "'%s': damaged header (checkpoint version %u)", path,
                          h->version);
    if (h->header_size != CKPT_HEADER || h->config_len > CKPT_CONFIG_MAX ||
        h->nparams > (UINT64_MAX / 16) || h->file_size != file_size_of(h->config_len, h->nparams))
        return errmsg_set(err, -EBADMSG, "'%s': damaged header (its sizes disagree)", path);
    if ((uint64_t)st.st_size != h->file_size)
        return errmsg_set(err, -EBADMSG, "'%s': truncated: %lld bytes, the header says %llu", path,
                          (long long)st.st_size, (unsigned long long)h->file_size);
    /* ckpt_save names a file for the step in its header. */
    if (name_step >= 0 && h->step != (uint64_t)name_step)
        return errmsg_set(err, -EBADMSG, "'%s': the header says step %llu", path,
                          (unsigned long long)h->step);
    return 0;
}

/* Opens path for reading without blocking on a FIFO that someone named like a checkpoint. */
static int open_ro(const char *path)
{
    return open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
}

bool ckpt_is_name(const char *name)
{
    long long step, pid;

    return name_kind_of(name, &step, &pid) == NAME_CKPT;
}

/* Whether the checkpoint file of list entry f has a valid header of its step. */
static bool complete(const struct found *f)
{
    struct disk_header h;
    struct errmsg ignored;
    int fd = open_ro(f->path);
    bool ok;

    if (fd < 0)
        return false;
    ok = read_header(fd, f->path, f->step, &h, &ignored) == 0;
    close(fd);
    return ok;
}

int ckpt_newest_step(const char *out_dir, long long *step, struct errmsg *err)
{
    struct found *list;
    size_t n, i;
    int ret;

    *step = -1;
    ret = list_ckpts(out_dir, 1u << NAME_CKPT, &list, &n, err);
    if (ret < 0)
        return ret;
    for (i = 0; i < n && *step < 0; i++)
        if (complete(&list[i]))
            *step = list[i].step;
    free_list(list, n);
    return 0;
}

int ckpt_prune(const char *out_dir, int keep, struct errmsg *err)
{
    struct found *list;
    size_t n, i;
    long long oldest_kept;
    int ret, seen = 0;

    if (keep < 1)
        return errmsg_set(err, -EINVAL, "'%s': keep %d checkpoints: at least 1", out_dir, keep);
    ret = list_ckpts(out_dir, 1u << NAME_CKPT | 1u << NAME_DAMAGED, &list, &n, err);
    if (ret < 0)
        return ret;
    /* The step of the keep-th newest complete checkpoint: what is older goes, what is newer
     * (complete or not) or at that step (set aside) stays. */
    for (i = 0; i < n && seen < keep; i++)
        if (list[i].kind == NAME_CKPT && complete(&list[i]))
            seen++;
    oldest_kept = seen == keep ? list[i - 1].step : -1;
    for (; i < n && ret == 0; i++) {
        struct stat st;
        /* Not ours to remove: a directory or a link someone gave the name. */
        if (list[i].step >= oldest_kept || lstat(list[i].path, &st) < 0 || !S_ISREG(st.st_mode))
            continue;
        if (unlink(list[i].path) < 0 && errno != ENOENT)
            ret = errmsg_set(err, -errno, "cannot remove '%s': %s", list[i].path, strerror(errno));
    }
    free_list(list, n);
    return ret;
}

/* --- load ---------------------------------------------------------------------------------- */

/* Reads len bytes at the file position into p (NULL: read and discard through scratch) and
 * into the hash. Returns 0, -EINVAL at an early end, or a negative errno. */
static int read_hashed(int fd, EVP_MD_CTX *md, void *p, size_t len, char *scratch)
{
    char *c = p;

    while (len > 0) {
        size_t piece = len < IO_CHUNK ? len : IO_CHUNK;
        char *dst = c ? c : scratch;
        ssize_t n = read(fd, dst, piece);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -EINVAL;
        if (md && EVP_DigestUpdate(md, dst, (size_t)n) != 1)
            return -ENOMEM;
        if (c)
            c += n;
        len -= (size_t)n;
    }
    return 0;
}

static int check_shape(const char *path, const struct disk_header *h, const struct ckpt_model *want,
                       struct errmsg *err)
{
    const struct {
        const char *name;
        int have, want;
    } f[] = {
        {"n_layer", h->n_layer, want->n_layer},
        {"n_head", h->n_head, want->n_head},
        {"n_embd", h->n_embd, want->n_embd},
        {"seq_len", h->seq_len, want->seq_len},
        {"vocab_size", h->vocab_size, want->vocab_size},
        {"padded_vocab", h->padded_vocab, want->padded_vocab},
    };

    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
        if (f[i].have != f[i].want)
            return errmsg_set(err, -EINVAL, "'%s': %s is %d in the checkpoint, %d in the config",
                              path, f[i].name, f[i].have, f[i].want);
    return 0;
}

/* Reads path into st (st->params, m, v: buffers of nparams floats, undefined after a failure),
 * its header's step being name_step, the step its name says: its shape must be *expect, its
 * parameter count nparams, its checksum right. The config text is read for the checksum and
 * not kept. Returns 0, or a negative errno with err filled: -EBADMSG for a damaged file (not
 * our format, truncated, sizes that disagree, another step, checksum mismatch),
 * -EPROTONOSUPPORT for a newer format version, -EINVAL for a valid checkpoint of another
 * model, another errno (-EACCES, -EISDIR for a directory...) for a file that cannot be read. */
static int load_file(const char *path, long long name_step, const struct ckpt_model *expect,
                     size_t nparams, struct ckpt_state *st, struct errmsg *err)
{
    struct disk_header h;
    unsigned char sha[EVP_MAX_MD_SIZE], stored[CKPT_SHA_LEN];
    unsigned int sha_len = 0;
    EVP_MD_CTX *md = NULL;
    char *text = NULL;
    int fd, ret = -1;

    fd = open_ro(path);
    if (fd < 0)
        return errmsg_set(err, -errno, "cannot open '%s': %s", path, strerror(errno));
    ret = read_header(fd, path, name_step, &h, err);
    if (ret < 0)
        goto out;
    ret = check_shape(path, &h, expect, err);
    if (ret < 0)
        goto out;
    if (h.nparams != nparams) {
        ret = errmsg_set(err, -EINVAL, "'%s': %llu parameters in the checkpoint, %zu in the model",
                         path, (unsigned long long)h.nparams, nparams);
        goto out;
    }
    text = malloc(h.config_len + 1);
    md = EVP_MD_CTX_new();
    if (!text || !md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
        ret = errmsg_set(err, -ENOMEM, "cannot read '%s': out of memory", path);
        goto out;
    }
    ret = read_hashed(fd, md, &h, sizeof(h), NULL);
    if (ret == 0)
        ret = read_hashed(fd, md, text, h.config_len, NULL);
    if (ret == 0)
        ret = read_hashed(fd, md, st->params, nparams * sizeof(float), NULL);
    if (ret == 0)
        ret = read_hashed(fd, md, st->m, nparams * sizeof(float), NULL);
    if (ret == 0)
        ret = read_hashed(fd, md, st->v, nparams * sizeof(float), NULL);
    if (ret == 0)
        ret = read_hashed(fd, NULL, stored, sizeof(stored), NULL);
    if (ret == -EINVAL) {
        /* The size was checked: the file shrank while being read. */
        ret = errmsg_set(err, -EBADMSG, "'%s': truncated while being read", path);
        goto out;
    }
    if (ret < 0) {
        errmsg_set(err, ret, "cannot read '%s': %s", path, strerror(-ret));
        goto out;
    }
    if (EVP_DigestFinal_ex(md, sha, &sha_len) != 1 || sha_len != CKPT_SHA_LEN) {
        ret = errmsg_set(err, -ENOMEM, "cannot read '%s': SHA-256 failed", path);
        goto out;
    }
    if (memcmp(sha, stored, CKPT_SHA_LEN)) {
        ret = errmsg_set(err, -EBADMSG, "'%s': checksum mismatch: the file is damaged", path);
        goto out;
    }
    st->model = *expect;
    st->world_size = h.world_size;
    st->batch_size = h.batch_size;
    st->grad_accum = h.grad_accum;
    st->step = h.step;
    st->opt_step = h.opt_step;
    memcpy(st->rng, h.rng, sizeof(st->rng));
    st->data.step = h.data_step;
    st->data.next_seq = h.data_next_seq;
    st->data.nseq = h.data_nseq;
    st->data.ntokens = h.data_ntokens;
    st->nparams = nparams;
    ret = 0;
out:
    free(text);
    EVP_MD_CTX_free(md);
    close(fd);
    return ret;
}

int ckpt_read(const char *path, const struct ckpt_model *expect, size_t nparams,
              struct ckpt_state *st, struct errmsg *err)
{
    return load_file(path, -1, expect, nparams, st, err);
}

/* --- resume -------------------------------------------------------------------------------- */

void ckpt_newest_release(struct ckpt_newest *nw)
{
    free(nw->path);
    for (size_t i = 0; i < nw->ndamaged; i++)
        free(nw->damaged[i].path);
    free(nw->damaged);
    memset(nw, 0, sizeof(*nw));
}

int ckpt_load_newest(const char *out_dir, const struct ckpt_model *expect, size_t nparams,
                     struct ckpt_state *st, struct ckpt_newest *nw, struct errmsg *err)
{
    struct found *list;
    size_t n, i;
    int ret;

    memset(nw, 0, sizeof(*nw));
    ret = list_ckpts(out_dir, 1u << NAME_CKPT, &list, &n, err);
    if (ret < 0)
        return ret;
    nw->damaged = calloc(n ? n : 1, sizeof(*nw->damaged));
    if (!nw->damaged) {
        ret = errmsg_set(err, -ENOMEM, "cannot read '%s': out of memory", out_dir);
        goto out;
    }
    for (i = 0; i < n; i++) {
        struct ckpt_damaged *d = &nw->damaged[nw->ndamaged];
        ret = load_file(list[i].path, list[i].step, expect, nparams, st, &d->why);
        if (ret == 0)
            break;
        /* Only damage lets an older checkpoint stand in: a newer format, a file that cannot
         * be read or one of another model stop here, with every file left as it is. */
        if (ret != -EBADMSG) {
            *err = d->why;
            goto out;
        }
        d->path = list[i].path;
        list[i].path = NULL;
        nw->ndamaged++;
    }
    if (i == n) {
        ret = 0;
        if (nw->ndamaged == 1)
            ret = errmsg_set(err, -EBADMSG, "%s; no older checkpoint in '%s'",
                             nw->damaged[0].why.text, out_dir);
        else if (nw->ndamaged > 1)
            ret = errmsg_set(err, -EBADMSG,
                             "none of the %zu checkpoints in '%s' is valid; the newest: %s",
                             nw->ndamaged, out_dir, nw->damaged[0].why.text);
        goto out;
    }
    nw->path = list[i].path;
    list[i].path = NULL;
    ret = 1;
out:
    if (ret <= 0)
        ckpt_newest_release(nw);
    free_list(list, n);
    return ret;
}

/* Suffixes tried for a file set aside: a later damage of the same step gets the next. */
#define ASIDE_TRIES 100

int ckpt_set_aside(const char *path, char *aside, size_t len, struct errmsg *err)
{
    for (int k = 1; k <= ASIDE_TRIES; k++) {
        int m = k == 1 ? snprintf(aside, len, "%s.damaged", path)
                       : snprintf(aside, len, "%s.damaged.%d", path, k);
        struct stat st;
        if (m < 0 || (size_t)m >= len)
            return errmsg_set(err, -ENAMETOOLONG, "cannot set '%s' aside: name too long", path);
        if (lstat(aside, &st) == 0)
            continue;
        if (errno != ENOENT)
            return errmsg_set(err, -errno, "cannot set '%s' aside: '%s': %s", path, aside,
                              strerror(errno));
        if (rename(path, aside) < 0)
            return errmsg_set(err, -errno, "cannot rename '%s' to '%s': %s", path, aside,
                              strerror(errno));
        return 0;
    }
    return errmsg_set(err, -EEXIST, "cannot set '%s' aside: %d damaged copies of it are there",
                      path, ASIDE_TRIES);
}

/* Whether st was last modified before t. */
static bool modified_before(const struct stat *st, const struct timespec *t)
{
    return st->st_mtim.tv_sec < t->tv_sec ||
           (st->st_mtim.tv_sec == t->tv_sec && st->st_mtim.tv_nsec < t->tv_nsec);
}

int ckpt_clean_tmp(const char *out_dir, const struct timespec *started, int *removed,
                   uint64_t *bytes, struct errmsg *err)
{
    DIR *d = opendir(out_dir);
    struct dirent *e;
    char path[PATH_MAX];
    int ret = 0;

    *removed = 0;
    *bytes = 0;
    if (!d)
        return errno == ENOENT
                   ? 0
                   : errmsg_set(err, -errno, "cannot read '%s': %s", out_dir, strerror(errno));
    while (ret == 0 && (e = readdir(d))) {
        long long step, pid;
        struct stat st;
        if (name_kind_of(e->d_name, &step, &pid) != NAME_TMP)
            continue;
        if (snprintf(path, sizeof(path), "%s/%s", out_dir, e->d_name) >= (int)sizeof(path))
            continue;
        if (lstat(path, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid())
            continue;
        /* Both must hold: no live process has the pid (a live one of another user answers
         * EPERM and keeps its file; ours is not writing yet, so a file of our pid is an
         * earlier process's), and the file did not change since this process started (a
         * writer on another node sharing out_dir has a pid that means nothing here, and its
         * file changes while it writes). A file kept by mistake goes at a later start; one
         * removed by mistake would fail a live run's save. */
        if ((pid_t)pid != getpid() && !(kill((pid_t)pid, 0) < 0 && errno == ESRCH))
            continue;
        if (!modified_before(&st, started))
            continue;
        if (unlink(path) < 0 && errno != ENOENT) {
            ret = errmsg_set(err, -errno, "cannot remove '%s': %s", path, strerror(errno));
            break;
        }
        (*removed)++;
        *bytes += (uint64_t)st.st_size;
    }
    closedir(d);
    return ret;
}

/* --- llm.c --------------------------------------------------------------------------------- */

size_t ckpt_llmc_nparams(const struct ckpt_model *m)
{
    size_t C = (size_t)m->n_embd, L = (size_t)m->n_layer;

    /* wte + wpe + per layer (ln1 2C, qkv 3C^2+3C, attproj C^2+C, ln2 2C, fc 4C^2+4C,
     * fcproj 4C^2+C) + lnf 2C. */
    return (size_t)m->padded_vocab * C + (size_t)m->seq_len * C + L * (12 * C * C + 13 * C) + 2 * C;
}

int ckpt_load_llmc(const char *path, int seq_len, struct ckpt_model *found, float **params,
                   size_t *nparams, struct errmsg *err)
{
    int32_t hdr[LLMC_HEADER_INTS];
    struct ckpt_model full, kept;
    struct stat st;
    float *buf = NULL;
    char *scratch = NULL;
    size_t n_full, n_kept, wte, wpe_kept, wpe_skip, rest;
    ssize_t got;
    int fd, ret = -1;

    *params = NULL;
    *nparams = 0;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errmsg_set(err, -errno, "cannot open '%s': %s", path, strerror(errno));
    if (fstat(fd, &st) < 0) {
        ret = errmsg_set(err, -errno, "cannot stat '%s': %s", path, strerror(errno));
        goto out;
    }
    got = pread(fd, hdr, sizeof(hdr), 0);
    if (got < 0) {
        ret = errmsg_set(err, -errno, "cannot read '%s': %s", path, strerror(errno));
        goto out;
    }
    if ((size_t)got < sizeof(hdr)) {
        ret = errmsg_set(err, -EINVAL, "'%s': %zd bytes, too short for llm.c's 1024-byte header",
                         path, got);
        goto out;
    }
    if (hdr[0] != LLMC_CKPT_MAGIC) {
        ret =
            errmsg_set(err, -EINVAL, "'%s': not an llm.c GPT-2 checkpoint (magic %d, expected %d)",
                       path, hdr[0], LLMC_CKPT_MAGIC);
        goto out;
    }
    if (hdr[1] == LLMC_VERSION_BF16) {
        ret = errmsg_set(err, -EINVAL,
                         "'%s': llm.c checkpoint version 5 holds bf16 parameters; only version 3 "
                         "(fp32) is read",
                         path);
        goto out;
    }
    if (hdr[1] != LLMC_CKPT_VERSION) {
        ret = errmsg_set(err, -EINVAL, "'%s': llm.c checkpoint version %d, this reader knows %d",
                         path, hdr[1], LLMC_CKPT_VERSION);
        goto out;
    }
    full.seq_len = hdr[2];
    full.vocab_size = hdr[3];
    full.n_layer = hdr[4];
    full.n_head = hdr[5];
    full.n_embd = hdr[6];
    full.padded_vocab = hdr[7];
    /* Bounds that keep the size arithmetic far from overflow; GPT-2 XL is 1024/50257/48/25/
     * 1600. */
    if (full.seq_len < 1 || full.seq_len > (1 << 20) || full.vocab_size < 1 ||
        full.vocab_size > (1 << 24) || full.n_layer < 1 || full.n_layer > 4096 || full.n_head < 1 ||
        full.n_embd < 1 || full.n_embd > (1 << 16) || full.n_embd % full.n_head ||
        full.padded_vocab < full.vocab_size || full.padded_vocab > (1 << 24)) {
        ret = errmsg_set(err, -EINVAL,
                         "'%s': implausible shape in the header (maxT %d, V %d, L %d, NH %d, C %d, "
                         "Vp %d)",
                         path, full.seq_len, full.vocab_size, full.n_layer, full.n_head,
                         full.n_embd, full.padded_vocab);
        goto out;
    }
    n_full = ckpt_llmc_nparams(&full);
    if ((uint64_t)st.st_size != sizeof(hdr) + n_full * sizeof(float)) {
        ret = errmsg_set(err, -EINVAL,
                         "'%s': %lld bytes, the header's shape needs %zu (%zu fp32 parameters)",
                         path, (long long)st.st_size, sizeof(hdr) + n_full * sizeof(float), n_full);
        goto out;
    }
    if (seq_len > full.seq_len) {
        ret = errmsg_set(err, -EINVAL,
                         "'%s': seq_len %d is longer than the checkpoint's %d positions", path,
                         seq_len, full.seq_len);
        goto out;
    }
    kept = full;
    if (seq_len > 0)
        kept.seq_len = seq_len;
    n_kept = ckpt_llmc_nparams(&kept);
    wte = (size_t)full.padded_vocab * (size_t)full.n_embd;
    wpe_kept = (size_t)kept.seq_len * (size_t)full.n_embd;
    wpe_skip = (size_t)(full.seq_len - kept.seq_len) * (size_t)full.n_embd;
    rest = n_kept - wte - wpe_kept;
    buf = malloc(n_kept * sizeof(float));
    scratch = malloc(IO_CHUNK);
    if (!buf || !scratch) {
        ret = errmsg_set(err, -ENOMEM, "cannot read '%s': out of memory for %zu parameters", path,
                         n_kept);
        goto out;
    }
    if (lseek(fd, (off_t)sizeof(hdr), SEEK_SET) < 0) {
        ret = errmsg_set(err, -errno, "cannot read '%s': %s", path, strerror(errno));
        goto out;
    }
    /* wte, the rows of wpe kept, the rows dropped, then everything after wpe. */
    ret = read_hashed(fd, NULL, buf, (wte + wpe_kept) * sizeof(float), NULL);
    if (ret == 0)
        ret = read_hashed(fd, NULL, NULL, wpe_skip * sizeof(float), scratch);
    if (ret == 0)
        ret = read_hashed(fd, NULL, buf + wte + wpe_kept, rest * sizeof(float), NULL);
    if (ret < 0) {
        ret = errmsg_set(err, ret == -EINVAL ? -EINVAL : ret, "cannot read '%s': %s", path,
                         ret == -EINVAL ? "truncated while being read" : strerror(-ret));
        goto out;
    }
    *found = kept;
    *params = buf;
    *nparams = n_kept;
    buf = NULL;
    ret = 0;
out:
    free(buf);
    free(scratch);
    close(fd);
    return ret;
}
