/* Memory checkpoints (memckpt.h): a table of copies over files in one directory. */
#include "memckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jobmark.h"
#include "proto.h"
#include "banned.h"

/* The file in a store's directory that names its daemon: "PID START\n". */
#define OWNER_FILE "owner"

struct copy {
    int rank;
    char name[MEMCKPT_NAME_MAX + 1];
    int64_t step;
    uint64_t size;
};

struct memckpt {
    pthread_mutex_t lock; /* the table's: the agent's loop and the memory link's threads */
    char dir[4096];
    uint64_t cap, kept;
    struct copy *copies;
    size_t n, alloc;
};

int memckpt_open(const char *dir, uint64_t cap, struct memckpt **out)
{
    struct memckpt *m;

    *out = NULL;
    if (strlen(dir) + MEMCKPT_NAME_MAX + 32 >= sizeof(m->dir))
        return -ENAMETOOLONG;
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        return -errno;
    m = calloc(1, sizeof(*m));
    if (!m)
        return -ENOMEM;
    snprintf(m->dir, sizeof(m->dir), "%s", dir);
    {
        unsigned long long start = 0;
        char path[sizeof(m->dir) + 16], text[64];
        FILE *f;
        snprintf(path, sizeof(path), "%s/" OWNER_FILE, dir);
        jobmark_proc_start((long)getpid(), &start);
        snprintf(text, sizeof(text), "%ld %llu\n", (long)getpid(), start);
        f = fopen(path, "we");
        if (f) {
            fputs(text, f);
            fclose(f);
        }
    }
    pthread_mutex_init(&m->lock, NULL);
    m->cap = cap;
    *out = m;
    return 0;
}

void memckpt_close(struct memckpt *m)
{
    DIR *d;
    struct dirent *e;
    char path[sizeof(m->dir) + 300];

    if (!m)
        return;
    d = opendir(m->dir);
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == 'r' || !strcmp(e->d_name, OWNER_FILE)) {
            snprintf(path, sizeof(path), "%s/%s", m->dir, e->d_name);
            unlink(path);
        }
    }
    if (d)
        closedir(d);
    rmdir(m->dir);
    pthread_mutex_destroy(&m->lock);
    free(m->copies);
    free(m);
}

/* Whether the store dir's owner file names a daemon no longer running. */
static bool owner_gone(const char *dir)
{
    char path[4200], text[64] = "";
    unsigned long long start, now = 0;
    long pid;
    FILE *f;
    bool gone;

    if (snprintf(path, sizeof(path), "%.4100s/" OWNER_FILE, dir) >= (int)sizeof(path) ||
        !(f = fopen(path, "re")))
        return false;
    gone = fgets(text, sizeof(text), f) && sscanf(text, "%ld %llu", &pid, &start) == 2 && pid > 0 &&
           (jobmark_proc_start(pid, &now) == -ENOENT || now != start);
    fclose(f);
    return gone;
}

int memckpt_sweep(const char *parent, const char *prefix)
{
    DIR *d = opendir(parent), *sub;
    struct dirent *e, *f;
    char dir[4200], path[4500];
    int removed = 0;

    if (strlen(parent) > 3000)
        return 0;

    while (d && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) ||
            snprintf(dir, sizeof(dir), "%.3000s/%.255s", parent, e->d_name) >= (int)sizeof(dir) ||
            !owner_gone(dir) || !(sub = opendir(dir)))
            continue;
        while ((f = readdir(sub)) != NULL)
            if (f->d_name[0] != '.' &&
                snprintf(path, sizeof(path), "%.4200s/%.255s", dir, f->d_name) < (int)sizeof(path))
                unlink(path);
        closedir(sub);
        if (rmdir(dir) == 0)
            removed++;
    }
    if (d)
        closedir(d);
    return removed;
}

const char *memckpt_dir(const struct memckpt *m)
{
    return m->dir;
}

static int copy_path(const struct memckpt *m, int rank, const char *name, bool tmp, char *buf,
                     size_t n)
{
    return proto_mem_path(buf, n, m->dir, rank, name, tmp);
}

int memckpt_tmp_path(const struct memckpt *m, int rank, const char *name, char *buf, size_t n)
{
    return copy_path(m, rank, name, true, buf, n);
}

static struct copy *find(const struct memckpt *m, int rank, const char *name)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->copies[i].rank == rank && !strcmp(m->copies[i].name, name))
            return &m->copies[i];
    return NULL;
}

bool memckpt_fits(uint64_t kept, uint64_t old, uint64_t add, uint64_t cap)
{
    return add <= cap && kept - old <= cap - add;
}

int memckpt_keep(struct memckpt *m, int rank, const char *name, int64_t step, struct errmsg *err)
{
    char tmp[sizeof(m->dir) + 100];

    if (copy_path(m, rank, name, true, tmp, sizeof(tmp)) < 0)
        return errmsg_set(err, -EINVAL,
                          "'%.80s' is not a memory checkpoint's name (letters, "
                          "digits, '_', '-', '.'; at most %d)",
                          name ? name : "", MEMCKPT_NAME_MAX);
    return memckpt_keep_from(m, rank, name, step, tmp, err);
}

int memckpt_in_path(const struct memckpt *m, int rank, const char *name, char *buf, size_t n)
{
    int ret = copy_path(m, rank, name, false, buf, n);
    size_t len;

    if (ret < 0)
        return ret;
    len = strlen(buf);
    if (len + 4 > n)
        return -ENAMETOOLONG;
    memcpy(buf + len, ".in", 4);
    return 0;
}

static int keep_locked(struct memckpt *m, int rank, const char *name, int64_t step, const char *src,
                       struct errmsg *err)
{
    char final[sizeof(m->dir) + 100];
    struct copy *c;
    struct stat st;
    uint64_t old;
    bool added = false;

    if (copy_path(m, rank, name, false, final, sizeof(final)) < 0)
        return errmsg_set(err, -EINVAL,
                          "'%.80s' is not a memory checkpoint's name (letters, "
                          "digits, '_', '-', '.'; at most %d)",
                          name ? name : "", MEMCKPT_NAME_MAX);
    if (stat(src, &st) < 0 || !S_ISREG(st.st_mode))
        return errmsg_set(err, -ENOENT, "rank %d wrote no '%s' into '%s'", rank, name, src);
    c = find(m, rank, name);
    old = c ? c->size : 0;
    if (!memckpt_fits(m->kept, old, (uint64_t)st.st_size, m->cap)) {
        unlink(src);
        return errmsg_set(err, -ENOSPC,
                          "rank %d's memory checkpoint '%s' (%" PRIu64 " bytes) does not fit "
                          "--mem-ckpt-max %" PRIu64 " bytes beside the %" PRIu64
                          " kept; the older copy stays",
                          rank, name, (uint64_t)st.st_size, m->cap, m->kept - old);
    }
    if (!c) {
        if (m->n == m->alloc) {
            size_t na = m->alloc ? 2 * m->alloc : 8;
            struct copy *nc = realloc(m->copies, na * sizeof(*nc));
            if (!nc)
                return errmsg_set(err, -ENOMEM, "out of memory");
            m->copies = nc;
            m->alloc = na;
        }
        c = &m->copies[m->n++];
        *c = (struct copy){.rank = rank};
        added = true;
        snprintf(c->name, sizeof(c->name), "%s", name);
    }
    if (rename(src, final) < 0) {
        int e = errno;
        if (added)
            m->n--;
        return errmsg_set(err, -e, "cannot keep '%s': %s", src, strerror(e));
    }
    m->kept = m->kept - old + (uint64_t)st.st_size;
    c->size = (uint64_t)st.st_size;
    c->step = step;
    return 0;
}

int memckpt_keep_from(struct memckpt *m, int rank, const char *name, int64_t step, const char *src,
                      struct errmsg *err)
{
    int ret;

    pthread_mutex_lock(&m->lock);
    ret = keep_locked(m, rank, name, step, src, err);
    pthread_mutex_unlock(&m->lock);
    return ret;
}

bool memckpt_would_fit(struct memckpt *m, int rank, const char *name, uint64_t size)
{
    const struct copy *c;
    bool fits;

    pthread_mutex_lock(&m->lock);
    c = find(m, rank, name);
    fits = memckpt_fits(m->kept, c ? c->size : 0, size, m->cap);
    pthread_mutex_unlock(&m->lock);
    return fits;
}

int memckpt_open_copy(struct memckpt *m, int rank, const char *name, int64_t *step, uint64_t *size)
{
    char path[sizeof(m->dir) + 100];
    const struct copy *c;
    int fd = -ENOENT;

    pthread_mutex_lock(&m->lock);
    c = proto_mem_name_ok(name) ? find(m, rank, name) : NULL;
    if (c && copy_path(m, rank, name, false, path, sizeof(path)) == 0) {
        *step = c->step;
        *size = c->size;
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            fd = -errno;
    }
    pthread_mutex_unlock(&m->lock);
    return fd;
}

size_t memckpt_list(struct memckpt *m, int lo, int hi, struct memckpt_entry *out, size_t max)
{
    size_t k = 0;

    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < m->n; i++) {
        const struct copy *c = &m->copies[i];
        if (c->rank < lo || c->rank >= hi)
            continue;
        if (k < max) {
            out[k].rank = c->rank;
            out[k].step = c->step;
            out[k].size = c->size;
            snprintf(out[k].name, sizeof(out[k].name), "%s", c->name);
        }
        k++;
    }
    pthread_mutex_unlock(&m->lock);
    return k;
}

int memckpt_find(struct memckpt *m, int rank, const char *name, char *path, size_t n, int64_t *step,
                 uint64_t *size)
{
    const struct copy *c;
    int ret = -ENOENT;

    pthread_mutex_lock(&m->lock);
    c = proto_mem_name_ok(name) ? find(m, rank, name) : NULL;
    if (c) {
        *step = c->step;
        *size = c->size;
        ret = copy_path(m, rank, name, false, path, n);
    }
    pthread_mutex_unlock(&m->lock);
    return ret;
}

uint64_t memckpt_kept(struct memckpt *m)
{
    uint64_t kept;

    pthread_mutex_lock(&m->lock);
    kept = m->kept;
    pthread_mutex_unlock(&m->lock);
    return kept;
}

uint64_t memckpt_default_cap(int nnodes)
{
    long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);

    if (pages <= 0 || psize <= 0)
        return 1ull << 30;
    return (uint64_t)pages * (uint64_t)psize / 4 / (uint64_t)(nnodes > 0 ? nnodes : 1);
}
