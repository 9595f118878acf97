/* Printing rank logs. Lines are copied as read, whatever their length, so that a log full of
 * progress bars or binary junk comes out as it went in. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include <uv.h>

#include "logidx.h"
#include "logs.h"
#include "banned.h"

/* The rank of a file named "rank-N.log", or -1 for any other name. */
static int log_rank(const char *name)
{
    long r = 0;
    const char *p = name + 5;

    if (strncmp(name, "rank-", 5) || *p < '0' || *p > '9' || (*p == '0' && p[1] != '.'))
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        r = r * 10 + (*p - '0');
        if (r > INT_MAX)
            return -1;
    }
    return strcmp(p, ".log") ? -1 : (int)r;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Copies path to out, each line prefixed with prefix (NULL: none). */
static int copy_log(FILE *out, const char *path, const char *prefix, struct errmsg *err)
{
    FILE *in = fopen(path, "re");
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int ret = 0;

    if (!in)
        return errmsg_set(err, -errno, "cannot open '%s': %s", path, uv_strerror(-errno));
    while ((n = getline(&line, &cap, in)) > 0) {
        if (prefix)
            fputs(prefix, out);
        fwrite(line, 1, (size_t)n, out);
        if (prefix && line[n - 1] != '\n')
            fputc('\n', out);
    }
    if (ferror(in))
        ret = errmsg_set(err, -EIO, "cannot read '%s': %s", path, uv_strerror(-EIO));
    free(line);
    fclose(in);
    return ret;
}

/* --- merging by time ------------------------------------------------------------------------ */

/* One rank log being merged: its next line and when that line was written. */
struct merge_src {
    int rank;
    FILE *log, *idx;
    char *line;
    size_t cap;
    ssize_t n;               /* the next line's length; <= 0: the log is done */
    int64_t off;             /* where the next line starts in the log */
    int64_t rec_end, rec_ms; /* the index record that covers off (the first with end > off) */
    int64_t t;               /* the next line's time */
};

/* Reads src's next line and finds its time: the record of the write that put its first byte
 * in the log. A line past the last record (a write whose record was lost) keeps the last
 * time. */
static void merge_next(struct merge_src *m)
{
    struct log_index_record rec;

    if (m->n > 0)
        m->off += m->n;
    m->n = getline(&m->line, &m->cap, m->log);
    if (m->n <= 0)
        return;
    while (m->rec_end <= m->off && fread(&rec, sizeof(rec), 1, m->idx) == 1) {
        m->rec_end = rec.end;
        m->rec_ms = rec.unix_ms;
    }
    m->t = m->rec_ms;
}

/* Whether a's next line goes before b's: the earlier, and between lines of the same
 * millisecond the lower rank. */
static bool merge_before(const struct merge_src *a, const struct merge_src *b)
{
    return a->t < b->t || (a->t == b->t && a->rank < b->rank);
}

/* Restores the heap of h[0..n) below i (h[0]'s line goes first). */
static void merge_sift(struct merge_src **h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, min = i;
        if (l < n && merge_before(h[l], h[min]))
            min = l;
        if (r < n && merge_before(h[r], h[min]))
            min = r;
        if (min == i)
            return;
        struct merge_src *t = h[i];
        h[i] = h[min];
        h[min] = t;
        i = min;
    }
}

/* Prints every rank's lines in the order they were written, each prefixed "[N] ", from the
 * logs and their indexes (logidx.h), holding every rank's two files open at once. Returns 0;
 * 1, having printed nothing, when that cannot be done (a rank without an index, from before
 * them; more ranks than this process may open files for); or a negative errno with err
 * filled. */
static int merge_logs(FILE *out, const char *dir, const int *ranks, int nranks, struct errmsg *err)
{
    struct merge_src *src = calloc((size_t)nranks, sizeof(*src));
    struct merge_src **heap = calloc((size_t)nranks, sizeof(*heap));
    char path[PATH_MAX + 32];
    int n = 0, ret = 0;

    if (!src || !heap) {
        ret = errmsg_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < nranks && ret == 0; i++) {
        src[i].rank = ranks[i];
        snprintf(path, sizeof(path), "%s/rank-%d.idx", dir, ranks[i]);
        src[i].idx = fopen(path, "re");
        if (src[i].idx) {
            snprintf(path, sizeof(path), "%s/rank-%d.log", dir, ranks[i]);
            src[i].log = fopen(path, "re");
        }
        if (!src[i].idx || !src[i].log)
            ret = errno == ENOENT || errno == EMFILE || errno == ENFILE
                      ? 1
                      : errmsg_set(err, -errno, "cannot open '%s': %s", path, uv_strerror(-errno));
    }
    if (ret != 0)
        goto out;
    for (int i = 0; i < nranks; i++) {
        merge_next(&src[i]);
        if (src[i].n > 0)
            heap[n++] = &src[i];
    }
    for (int i = n / 2 - 1; i >= 0; i--)
        merge_sift(heap, n, i);
    while (n > 0) {
        struct merge_src *m = heap[0];
        fprintf(out, "[%d] ", m->rank);
        fwrite(m->line, 1, (size_t)m->n, out);
        if (m->line[m->n - 1] != '\n')
            fputc('\n', out);
        merge_next(m);
        if (m->n <= 0)
            heap[0] = heap[--n];
        merge_sift(heap, n, 0);
    }
    for (int i = 0; i < nranks; i++)
        if (ferror(src[i].log))
            ret = errmsg_set(err, -EIO, "cannot read the log of rank %d in '%s'", src[i].rank, dir);
out:
    for (int i = 0; src && i < nranks; i++) {
        if (src[i].log)
            fclose(src[i].log);
        if (src[i].idx)
            fclose(src[i].idx);
        free(src[i].line);
    }
    free(src);
    free(heap);
    return ret;
}

int logs_print(FILE *out, const char *job_dir, int rank, struct errmsg *err)
{
    char dir[PATH_MAX], path[PATH_MAX + 32], prefix[32];
    int *ranks = NULL, nranks = 0, cap = 0, ret = -1;
    DIR *d = NULL;
    struct dirent *e;

    if (snprintf(dir, sizeof(dir), "%s/logs", job_dir) >= (int)sizeof(dir))
        return errmsg_set(err, -ENAMETOOLONG, "job dir '%s': path too long", job_dir);
    if (rank >= 0) {
        snprintf(path, sizeof(path), "%s/rank-%d.log", dir, rank);
        ret = copy_log(out, path, NULL, err);
        if (ret == -ENOENT)
            errmsg_set(err, ret, "no log of rank %d in '%s'", rank, dir);
        return ret;
    }
    d = opendir(dir);
    if (!d) {
        ret = errmsg_set(err, -errno, "cannot open '%s': %s", dir, uv_strerror(-errno));
        goto out;
    }
    while ((e = readdir(d))) {
        int r = log_rank(e->d_name);
        if (r < 0)
            continue;
        if (nranks == cap) {
            int *nr = realloc(ranks, (size_t)(cap ? cap * 2 : 64) * sizeof(*nr));
            if (!nr) {
                ret = errmsg_set(err, -ENOMEM, "out of memory");
                goto out;
            }
            ranks = nr;
            cap = cap ? cap * 2 : 64;
        }
        ranks[nranks++] = r;
    }
    if (nranks == 0) {
        ret = errmsg_set(err, -ENOENT, "no rank logs in '%s' yet", dir);
        goto out;
    }
    qsort(ranks, (size_t)nranks, sizeof(*ranks), cmp_int);
    ret = merge_logs(out, dir, ranks, nranks, err);
    if (ret <= 0)
        goto out;
    /* A job dir from before the indexes, or too many ranks to open at once: rank by rank. */
    for (int i = 0; i < nranks; i++) {
        snprintf(path, sizeof(path), "%s/rank-%d.log", dir, ranks[i]);
        snprintf(prefix, sizeof(prefix), "[%d] ", ranks[i]);
        ret = copy_log(out, path, prefix, err);
        if (ret < 0)
            goto out;
    }
    ret = 0;
out:
    free(ranks);
    if (d)
        closedir(d);
    return ret;
}

/* --- following ----------------------------------------------------------------------------- */

/* One rank's log being followed: where reading stopped, and a line not yet ended. */
struct tail {
    int rank;
    long long off;
    char *part; /* bytes after the last newline printed; NULL: none */
    size_t npart;
};

struct follow {
    struct tail *t;
    int n, cap;
};

static struct tail *tail_of(struct follow *f, int rank)
{
    for (int i = 0; i < f->n; i++)
        if (f->t[i].rank == rank)
            return &f->t[i];
    if (f->n == f->cap) {
        int cap = f->cap ? f->cap * 2 : 64;
        struct tail *nt = realloc(f->t, (size_t)cap * sizeof(*nt));
        if (!nt)
            return NULL;
        f->t = nt;
        f->cap = cap;
    }
    f->t[f->n] = (struct tail){.rank = rank};
    return &f->t[f->n++];
}

/* Prints what rank's log gained since the last call: whole lines, each with prefix (NULL:
 * none); with last, also a partial line, ended with a newline. */
static int pump(FILE *out, const char *dir, struct tail *t, const char *prefix, bool last,
                struct errmsg *err)
{
    char path[PATH_MAX + 32], buf[65536];
    FILE *in;
    size_t n;
    int ret = 0;

    snprintf(path, sizeof(path), "%s/rank-%d.log", dir, t->rank);
    in = fopen(path, "re");
    if (!in)
        return errno == ENOENT
                   ? 0
                   : errmsg_set(err, -errno, "cannot open '%s': %s", path, uv_strerror(-errno));
    if (fseeko(in, (off_t)t->off, SEEK_SET) < 0) {
        fclose(in);
        return errmsg_set(err, -errno, "cannot read '%s': %s", path, uv_strerror(-errno));
    }
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0) {
        char *p = buf, *nl;
        t->off += (long long)n;
        while ((nl = memchr(p, '\n', n - (size_t)(p - buf)))) {
            if (prefix)
                fputs(prefix, out);
            if (t->npart)
                fwrite(t->part, 1, t->npart, out);
            fwrite(p, 1, (size_t)(nl - p) + 1, out);
            t->npart = 0;
            p = nl + 1;
        }
        if (p < buf + n) {
            size_t more = (size_t)(buf + n - p);
            char *np = realloc(t->part, t->npart + more);
            if (!np) {
                ret = errmsg_set(err, -ENOMEM, "out of memory");
                break;
            }
            t->part = np;
            memcpy(t->part + t->npart, p, more);
            t->npart += more;
        }
    }
    if (ferror(in) && ret == 0)
        ret = errmsg_set(err, -EIO, "cannot read '%s': %s", path, uv_strerror(-EIO));
    fclose(in);
    if (last && t->npart && ret == 0) {
        if (prefix)
            fputs(prefix, out);
        fwrite(t->part, 1, t->npart, out);
        fputc('\n', out);
        t->npart = 0;
    }
    return ret;
}

/* Adds the ranks whose logs exist now to f (in rank order of discovery). */
static int discover(struct follow *f, const char *dir, int rank, struct errmsg *err)
{
    DIR *d;
    struct dirent *e;

    if (rank >= 0)
        return tail_of(f, rank) ? 0 : errmsg_set(err, -ENOMEM, "out of memory");
    d = opendir(dir);
    if (!d)
        return errno == ENOENT
                   ? 0
                   : errmsg_set(err, -errno, "cannot open '%s': %s", dir, uv_strerror(-errno));
    while ((e = readdir(d))) {
        int r = log_rank(e->d_name);
        if (r >= 0 && !tail_of(f, r)) {
            closedir(d);
            return errmsg_set(err, -ENOMEM, "out of memory");
        }
    }
    closedir(d);
    return 0;
}

static int cmp_tail(const void *a, const void *b)
{
    return cmp_int(&((const struct tail *)a)->rank, &((const struct tail *)b)->rank);
}

int logs_follow(FILE *out, const char *job_dir, int rank, logs_ended_fn ended, void *arg,
                struct errmsg *err)
{
    struct follow f = {0};
    char dir[PATH_MAX], prefix[32];
    struct timespec ts = {LOGS_POLL_MS / 1000, (LOGS_POLL_MS % 1000) * 1000000L};
    bool last = false;
    int ret = 0;

    if (snprintf(dir, sizeof(dir), "%s/logs", job_dir) >= (int)sizeof(dir))
        return errmsg_set(err, -ENAMETOOLONG, "job dir '%s': path too long", job_dir);
    for (;;) {
        /* Asked before reading: what the job wrote before it ended is read after. */
        last = ended(arg);
        ret = discover(&f, dir, rank, err);
        if (ret < 0)
            break;
        if (f.n > 1)
            qsort(f.t, (size_t)f.n, sizeof(*f.t), cmp_tail);
        for (int i = 0; i < f.n && ret == 0; i++) {
            snprintf(prefix, sizeof(prefix), "[%d] ", f.t[i].rank);
            ret = pump(out, dir, &f.t[i], rank >= 0 ? NULL : prefix, last, err);
        }
        fflush(out);
        if (ret < 0 || last)
            break;
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < f.n; i++)
        free(f.t[i].part);
    free(f.t);
    return ret;
}
