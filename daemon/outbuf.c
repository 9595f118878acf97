/* The merged output stream's writer (outbuf.h). Why a thread and blocking writes rather than
 * O_NONBLOCK on the fd: the daemon's stdout is an open file description it shares with
 * gpurun, the other daemons and often its own stderr (2>&1, a terminal); O_NONBLOCK there
 * would make their writes fail with EAGAIN. A non-blocking write to a tty or socket may also
 * stop inside a line, where another daemon's line could land. A blocking write of whole lines
 * of at most PIPE_BUF bytes keeps each line whole on a pipe or tty, exactly as the loop's
 * write(2) did, and only the writer thread waits for the reader. (redis's bio.c moves its
 * blocking close and fsync off its single-threaded loop the same way.)
 *
 * The queue is a ring of whole lines under one mutex; the loop appends, the thread takes a
 * batch of whole lines, writes it without the lock and tells the loop (uv_async_t) when the
 * loop waits for something: a drain while dropping, or the end while closing. The struct is
 * shared by the loop and the thread and freed by whichever lets go last (refs), so that a
 * thread blocked forever in write(2) for a reader that never reads costs the loop nothing. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "outbuf.h"
#include "banned.h"

/* A batch to a regular file: no other reader's atomicity to keep (O_APPEND and the file's
 * position lock keep writes whole), so fewer, larger writes. */
#define OUTBUF_FILE_BATCH (64 * 1024)

#if OUTBUF_LINE_MAX > PIPE_BUF
#error "a line must fit one atomic pipe write"
#endif

struct outbuf {
    uv_loop_t *loop;
    int fd;
    size_t cap, batch_max;
    int nsrc;
    outbuf_notice_fn notice;
    void *arg;

    /* Under mu, shared with the writer thread. */
    uv_mutex_t mu;
    uv_cond_t cv;
    char *ring;
    size_t head, len; /* the queued bytes: ring[head..head+len) modulo cap */
    bool dropping;    /* a line was dropped: drop every line until the queue drains */
    uint64_t *drops;  /* per source, since its last notice */
    uint64_t dropped, written;
    int error;
    bool waiting;    /* the thread waits for lines */
    bool writing;    /* the thread is inside write(2) */
    size_t inflight; /* the bytes of that write */
    bool closing;    /* the loop waits for the end: tell it of every batch */
    bool stop;       /* exit once the queue is empty */
    bool abandon;    /* exit now, leaving the queue */
    bool loop_gone;  /* the async handle is closed: never send on it */
    int refs;        /* the loop's and the thread's */

    /* The writer thread's alone. */
    char *batch;

    /* The loop's alone. */
    uv_async_t async;
    uv_timer_t linger;
    uint64_t seen_written;
    size_t unwritten;         /* given up on by the linger timer */
    uint64_t unwritten_lines; /* the lines in them and in the drops not yet told */
    int handles_open;
    bool closed; /* outbuf_close() was called */
    outbuf_closed_fn closed_cb;
    void *closed_arg;
};

static void outbuf_free(struct outbuf *o)
{
    uv_mutex_destroy(&o->mu);
    uv_cond_destroy(&o->cv);
    free(o->ring);
    free(o->batch);
    free(o->drops);
    free(o);
}

/* Drops one reference under mu; returns whether it was the last (then free after unlock). */
static bool unref_locked(struct outbuf *o)
{
    return --o->refs == 0;
}

/* --- the ring (under mu) ------------------------------------------------------------------ */

static void ring_put(struct outbuf *o, const char *s, size_t n)
{
    size_t tail = (o->head + o->len) % o->cap;
    size_t first = n < o->cap - tail ? n : o->cap - tail;

    memcpy(o->ring + tail, s, first);
    memcpy(o->ring, s + first, n - first);
    o->len += n;
}

/* Moves the longest run of whole lines that fits a batch from the ring to o->batch. Every
 * queued line ends in '\n' or '\r' and fits a batch, so there is always one. Returns its
 * length. */
static size_t ring_take(struct outbuf *o)
{
    size_t n = o->len < o->batch_max ? o->len : o->batch_max;
    size_t first = n < o->cap - o->head ? n : o->cap - o->head;
    const char *nl;

    memcpy(o->batch, o->ring + o->head, first);
    memcpy(o->batch + first, o->ring, n - first);
    /* The last line's end: '\n', or '\r' for a redraw. */
    for (nl = o->batch + n - 1; *nl != '\n' && *nl != '\r'; nl--)
        ;
    n = (size_t)(nl - o->batch) + 1;
    o->head = (o->head + n) % o->cap;
    o->len -= n;
    /* Empty: start over at the front, so that a reader that keeps up keeps the ring's
     * first pages warm and never touches the rest. */
    if (!o->len)
        o->head = 0;
    return n;
}

static void wake_writer(struct outbuf *o)
{
    if (o->waiting)
        uv_cond_signal(&o->cv);
}

/* The queue drained after drops: queues each source's notice, where its lines are missing,
 * and takes lines again. */
static void tell_drops(struct outbuf *o)
{
    char line[OUTBUF_LINE_MAX];

    o->dropping = false;
    for (int i = 0; i < o->nsrc; i++) {
        size_t n;

        if (!o->drops[i])
            continue;
        n = o->notice ? o->notice(o->arg, i, o->drops[i], line, sizeof(line)) : 0;
        o->drops[i] = 0;
        if (n && n <= sizeof(line) && line[n - 1] == '\n' && o->cap - o->len >= n)
            ring_put(o, line, n);
    }
    wake_writer(o);
}

/* --- the writer thread -------------------------------------------------------------------- */

/* Writes all of p[0..n). Partial writes only come from signals (blocked in this thread) or
 * from an fd someone else made non-blocking: then it waits for room with poll(2). */
static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);

        if (w < 0) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};

            if (errno == EINTR)
                continue;
            if (errno != EAGAIN)
                return -errno;
            poll(&pfd, 1, -1);
            continue;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void tell_loop(struct outbuf *o)
{
    if (!o->loop_gone && (o->dropping || o->closing || o->error))
        uv_async_send(&o->async);
}

static void *writer_main(void *arg)
{
    struct outbuf *o = arg;
    bool last;

    uv_mutex_lock(&o->mu);
    for (;;) {
        size_t n;
        int err;

        while (!o->len && !o->stop && !o->abandon) {
            o->waiting = true;
            uv_cond_wait(&o->cv, &o->mu);
            o->waiting = false;
        }
        if (o->abandon || !o->len)
            break;
        n = ring_take(o);
        o->writing = true;
        o->inflight = n;
        uv_mutex_unlock(&o->mu);
        err = write_all(o->fd, o->batch, n);
        uv_mutex_lock(&o->mu);
        o->writing = false;
        o->inflight = 0;
        if (err < 0) {
            /* The stream is gone (EPIPE: its reader quit): nothing queued can reach it. */
            o->error = err;
            o->head = o->len = 0;
        } else {
            o->written += n;
        }
        tell_loop(o);
    }
    last = unref_locked(o);
    uv_mutex_unlock(&o->mu);
    if (last)
        outbuf_free(o);
    return NULL;
}

/* --- the loop's side ---------------------------------------------------------------------- */

static void on_outbuf_handle_closed(uv_handle_t *h)
{
    struct outbuf *o = h->data;
    outbuf_closed_fn cb = o->closed_cb;
    void *cb_arg = o->closed_arg;
    size_t unwritten = o->unwritten;
    uint64_t lines = o->unwritten_lines;
    bool last;

    if (--o->handles_open > 0)
        return;
    uv_mutex_lock(&o->mu);
    last = unref_locked(o);
    uv_mutex_unlock(&o->mu);
    if (last)
        outbuf_free(o);
    if (cb)
        cb(cb_arg, unwritten, lines);
}

/* Lets go of the loop: from here on the thread never touches the async handle. */
static void finish(struct outbuf *o)
{
    uv_close((uv_handle_t *)&o->async, on_outbuf_handle_closed);
    uv_close((uv_handle_t *)&o->linger, on_outbuf_handle_closed);
}

/* While closing: ends once everything is written or the stream failed. */
static void check_closed(struct outbuf *o)
{
    bool done;

    uv_mutex_lock(&o->mu);
    if (o->dropping && !o->len && !o->error)
        tell_drops(o);
    done = o->error || (!o->len && !o->writing);
    if (done) {
        o->stop = true;
        o->loop_gone = true;
        wake_writer(o);
    }
    uv_mutex_unlock(&o->mu);
    if (done)
        finish(o);
}

static void on_outbuf_async(uv_async_t *h)
{
    struct outbuf *o = h->data;
    bool progress;

    uv_mutex_lock(&o->mu);
    if (o->dropping && !o->len && !o->error)
        tell_drops(o);
    progress = o->written != o->seen_written;
    o->seen_written = o->written;
    uv_mutex_unlock(&o->mu);
    if (!o->closed)
        return;
    if (progress)
        uv_timer_again(&o->linger);
    check_closed(o);
}

/* The lines that will never reach the stream once the writer is abandoned: those queued, the
 * batch in write(2) (a pipe takes it whole or not at all), and the drops not yet told.
 * Under mu. */
static uint64_t count_lines(const struct outbuf *o)
{
    uint64_t n = 0;

    for (size_t i = 0; i < o->len; i++) {
        char c = o->ring[(o->head + i) % o->cap];
        n += c == '\n' || c == '\r';
    }
    for (size_t i = 0; i < o->inflight; i++)
        n += o->batch[i] == '\n' || o->batch[i] == '\r';
    for (int i = 0; i < o->nsrc; i++)
        n += o->drops[i];
    return n;
}

static void on_outbuf_linger(uv_timer_t *h)
{
    struct outbuf *o = h->data;

    uv_mutex_lock(&o->mu);
    o->unwritten = o->len + o->inflight;
    o->unwritten_lines = count_lines(o);
    o->abandon = true;
    o->loop_gone = true;
    wake_writer(o);
    uv_mutex_unlock(&o->mu);
    finish(o);
}

int outbuf_start(uv_loop_t *loop, const struct outbuf_config *cfg, struct outbuf **out)
{
    struct outbuf *o = NULL;
    pthread_attr_t attr;
    pthread_t thread;
    sigset_t all, old;
    struct stat st;
    int ret = -ENOMEM, err;
    bool locks = false;

    if (cfg->cap < OUTBUF_LINE_MAX || cfg->nsrc < 1)
        return -EINVAL;
    o = calloc(1, sizeof(*o));
    if (!o)
        goto out;
    o->loop = loop;
    o->fd = cfg->fd;
    o->cap = cfg->cap;
    o->nsrc = cfg->nsrc;
    o->notice = cfg->notice;
    o->arg = cfg->arg;
    o->batch_max = fstat(cfg->fd, &st) == 0 && S_ISREG(st.st_mode) ? OUTBUF_FILE_BATCH : PIPE_BUF;
    o->ring = malloc(o->cap);
    o->batch = malloc(o->batch_max);
    o->drops = calloc((size_t)o->nsrc, sizeof(*o->drops));
    if (!o->ring || !o->batch || !o->drops)
        goto out;
    if ((ret = uv_mutex_init(&o->mu)) < 0)
        goto out;
    if ((ret = uv_cond_init(&o->cv)) < 0) {
        uv_mutex_destroy(&o->mu);
        goto out;
    }
    locks = true;
    /* Every signal stays with the loop's thread (uv_signal_t, SIGCHLD): the writer blocks
     * them all from its first instruction, so none interrupts a write inside a line. */
    sigfillset(&all);
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    o->refs = 2;
    err = pthread_create(&thread, &attr, writer_main, o);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (err) {
        ret = -err;
        goto out;
    }
    uv_async_init(loop, &o->async, on_outbuf_async);
    uv_timer_init(loop, &o->linger);
    o->async.data = o->linger.data = o;
    o->handles_open = 2;
    /* Only a closing outbuf keeps the loop running (its linger timer). */
    uv_unref((uv_handle_t *)&o->async);
    *out = o;
    return 0;
out:
    if (o) {
        if (locks) {
            outbuf_free(o);
        } else {
            free(o->ring);
            free(o->batch);
            free(o->drops);
            free(o);
        }
    }
    return ret;
}

int outbuf_line(struct outbuf *o, int src, const char *line, size_t n)
{
    int ret = 0;

    if (!n || n > OUTBUF_LINE_MAX || src < 0 || src >= o->nsrc ||
        (line[n - 1] != '\n' && line[n - 1] != '\r') || memchr(line, '\n', n - 1) ||
        memchr(line, '\r', n - 1))
        return -EINVAL;
    if (o->closed)
        return -EPIPE;
    uv_mutex_lock(&o->mu);
    if (o->error) {
        ret = -EPIPE;
        goto out;
    }
    if (o->dropping && !o->len)
        tell_drops(o);
    if (o->dropping || o->cap - o->len < n) {
        o->dropping = true;
        o->drops[src]++;
        o->dropped++;
        ret = -ENOBUFS;
        goto out;
    }
    ring_put(o, line, n);
    wake_writer(o);
out:
    uv_mutex_unlock(&o->mu);
    return ret;
}

void outbuf_stats(struct outbuf *o, struct outbuf_stats *st)
{
    uv_mutex_lock(&o->mu);
    st->queued = o->len;
    st->written = o->written;
    st->dropped = o->dropped;
    st->error = o->error;
    uv_mutex_unlock(&o->mu);
}

void outbuf_close(struct outbuf *o, uint64_t linger_ms, outbuf_closed_fn cb, void *arg)
{
    o->closed = true;
    o->closed_cb = cb;
    o->closed_arg = arg;
    uv_mutex_lock(&o->mu);
    o->closing = true;
    o->seen_written = o->written;
    uv_mutex_unlock(&o->mu);
    /* The linger counts from now, not from the loop's last wake-up (its cached time). */
    uv_update_time(o->linger.loop);
    uv_timer_start(&o->linger, on_outbuf_linger, linger_ms, linger_ms);
    check_closed(o);
}

/* Closes the descriptors lo..hi (async-signal-safe): close_range where the kernel has it
 * (5.9), else one close(2) each up to max, the process's limit. */
static void close_span(unsigned lo, unsigned hi, unsigned max)
{
#ifdef SYS_close_range
    if (syscall(SYS_close_range, lo, hi, 0) == 0)
        return;
#endif
    for (unsigned fd = lo; fd <= hi && fd < max; fd++)
        close((int)fd);
}

/* Closes every descriptor from 3 up but keep_a and keep_b; max: the process's limit. */
static void close_others(int keep_a, int keep_b, unsigned max)
{
    int lo = keep_a < keep_b ? keep_a : keep_b, hi = keep_a < keep_b ? keep_b : keep_a;
    unsigned from = 3;

    if (lo >= 3) {
        if ((unsigned)lo > from)
            close_span(from, (unsigned)lo - 1, max);
        from = (unsigned)lo + 1;
    }
    if (hi >= 3 && hi != lo) {
        if ((unsigned)hi > from)
            close_span(from, (unsigned)hi - 1, max);
        from = (unsigned)hi + 1;
    }
    close_span(from, ~0U, max);
}

int outbuf_write_after_exit(int fd, const char *text, size_t n)
{
    long open_max = sysconf(_SC_OPEN_MAX);
    unsigned max = open_max > 0 && open_max < 1 << 20 ? (unsigned)open_max : 1u << 20;
    int hup[2];
    pid_t pid;

    if (n > PIPE_BUF)
        return -EINVAL;
    /* Its write end stays with us alone (O_CLOEXEC; the child closes it): our exit is its
     * end of file. */
    if (pipe2(hup, O_CLOEXEC) < 0)
        return -errno;
    pid = fork();
    if (pid < 0) {
        int err = -errno;
        close(hup[0]);
        close(hup[1]);
        return err;
    }
    if (pid == 0) {
        /* Async-signal-safe calls only: the parent has threads. */
        char c;
        struct pollfd pfd = {.fd = hup[0], .events = POLLIN};

        close(hup[1]);
        close_others(fd, hup[0], max);
        while (poll(&pfd, 1, -1) < 0 && errno == EINTR)
            ;
        while (read(hup[0], &c, 1) < 0 && errno == EINTR)
            ;
        _exit(write_all(fd, text, n) == 0 ? 0 : 1);
    }
    close(hup[0]);
    /* hup[1] is left open on purpose: it closes when this process exits. */
    return 0;
}
