/* Collectives between ranks: the backend table, the world-of-one shortcut, the checks every
 * backend shares, and the tcp backend's ring (connection set-up through the rank library's
 * store, shared-memory rings for the links between ranks of one machine, then one non-blocking
 * engine that moves every collective's bytes around the ring in pipelined chunks). The nccl
 * backend is kernels/coll_nccl.c. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"
#include "coll_backend.h"
#include "gr.h"
#include "banned.h"

/* Reduction granularity over TCP: received bytes are staged in a buffer of this size and added
 * into place once a whole chunk is in, so that the addition runs on data still in cache and the
 * chunk can travel on to the next rank while the following one arrives. 64 KiB measured up to
 * 1.5x faster than 256 KiB for 1 MiB buffers (a step waits less for its first chunk) and the
 * same from 4 MiB up (bench/allreduce.sh). A multiple of 8 so that chunks hold whole elements
 * of every type. */
#define CHUNK_BYTES     (64 * 1024)
/* The data of a shared-memory link: a byte ring the size of a large socket buffer, so that a
 * sender runs ahead of its receiver by a few chunks as over TCP. A multiple of 64. */
#define SHM_RING_BYTES  (4 * 1024 * 1024)
/* The most a side moves through a shared ring at once before it publishes the move: the
 * receiver starts adding a piece while the sender copies the next. 64 KiB measured up to 1.3x
 * faster than whole spans at 4 MiB, and as fast as 32 KiB and 256 KiB. */
#define SHM_PIECE_BYTES (64 * 1024)
/* Every operation's stream on a shared-memory link is padded to this, so that the next one
 * starts aligned for elements of every type. */
#define SHM_PAD         64
/* The hello a connecting rank sends: magic, then seq, world, from and to ranks (big-endian
 * uint32), the acceptor's token, and the connector's machine (the kernel's boot_id; zeros
 * when unknown or shared memory is off). The acceptor answers with the ack: magic, a byte
 * saying whether it offers a shared-memory ring (1) or not (0), the ring's name and cookie.
 * The connector then confirms with one byte whether it mapped the ring (1) or not (0). */
#define HELLO_MAGIC     "GRCOLL2"
#define ACK_MAGIC       "GRCOLLOK"
#define TOKEN_BYTES     16
#define BOOT_ID_BYTES   36
#define HELLO_BYTES     (8 + 4 * 4 + TOKEN_BYTES + BOOT_ID_BYTES)
#define SHM_NAME_BYTES  48
#define ACK_BYTES       (8 + 1 + SHM_NAME_BYTES + TOKEN_BYTES)
/* "host port token" in the store: an address, a port and 32 hex digits. */
#define ADDR_VALUE_MAX  (INET6_ADDRSTRLEN + 8 + 2 * TOKEN_BYTES + 4)

struct coll;

/* The shared part of a shared-memory link, mapped by both ends; the data follows at
 * SHM_DATA_OFF. head counts the bytes the sender has written since the link was made, tail the
 * bytes the receiver has taken; each side waiting for the other raises its flag before it
 * sleeps in poll(), and the other side, after moving head or tail, lowers it and writes one
 * byte (a doorbell) on the link's TCP connection. All accesses are sequentially consistent, so
 * that a side either sees the other's progress or its flag: no wake-up is lost. */
struct shm_ring {
    unsigned char cookie[TOKEN_BYTES];
    _Alignas(64) _Atomic uint64_t head;
    _Alignas(64) _Atomic uint64_t tail;
    _Alignas(64) _Atomic uint32_t recv_waiting;
    _Alignas(64) _Atomic uint32_t send_waiting;
};
#define SHM_DATA_OFF  4096
#define SHM_MAP_BYTES (SHM_DATA_OFF + SHM_RING_BYTES)

struct coll {
    const struct coll_backend *be;
    int rank;
    int world;
    int timeout_ms;
    /* The first transport error: once set, every call returns it. */
    int broken;
    char err[320];
    /* tcp: the link to rank+1 (we only send data on it) and from rank-1 (we only receive
     * data). A link between two ranks of one machine carries its data through a shared ring
     * (send_ring, recv_ring; NULL for a link over TCP) and only doorbells over TCP. */
    int send_fd;
    int recv_fd;
    struct shm_ring *send_ring;
    struct shm_ring *recv_ring;
    /* rank-1 closed its end of a shared-memory link: what it wrote before may still be in the
     * ring, and only a wait for more is an error. */
    bool prev_closed;
    char next_addr[INET6_ADDRSTRLEN + 8];
    char prev_addr[INET6_ADDRSTRLEN + 8];
    unsigned char *scratch;
    char describe[256];
    /* A backend of another file: its own state (coll_state). */
    void *state;
};

/* The process-wide count of coll_open calls: the "<seq>" of the store keys. */
static unsigned open_seq;

static void set_err(struct coll *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void set_err(struct coll *c, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
}

void coll_set_err(struct coll *c, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
}

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* strerror() in the grammar of our messages: "connection refused". */
static const char *errstr(int err)
{
    static _Thread_local char buf[64];

    snprintf(buf, sizeof(buf), "%s", strerror(err < 0 ? -err : err));
    if (buf[0] >= 'A' && buf[0] <= 'Z' && !(buf[1] >= 'A' && buf[1] <= 'Z'))
        buf[0] = (char)(buf[0] - 'A' + 'a');
    return buf;
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* --- reductions ------------------------------------------------------------------------------ */

/* dst[i] = dst[i] + src[i]: the local partial sum first, then the one that came in. Elementwise,
 * so vectorising changes no result. */
static void add_f32(void *dst, const void *src, size_t n)
{
    float *restrict d = dst;
    const float *restrict s = src;

#pragma omp simd
    for (size_t i = 0; i < n; i++)
        d[i] = d[i] + s[i];
}

static void add_f64(void *dst, const void *src, size_t n)
{
    double *restrict d = dst;
    const double *restrict s = src;

#pragma omp simd
    for (size_t i = 0; i < n; i++)
        d[i] = d[i] + s[i];
}

/* The host allreduces' element types, for the ring. */
static const struct {
    size_t elem;
    void (*add)(void *dst, const void *src, size_t n);
} host_types[] = {
    [COLL_HOST_F32] = {sizeof(float), add_f32},
    [COLL_HOST_F64] = {sizeof(double), add_f64},
};

/* --- the ring engine ------------------------------------------------------------------------- */

/* One collective as two streams of steps: step t sends a span of the buffer to rank+1 and
 * receives a span from rank-1, either added into place (reduce) or copied. Send step t may
 * only send the bytes that receive step t - lag has already completed (none to wait for when
 * t - lag < 0): in a ring allreduce what a rank passes on at step t is what it reduced at
 * step t-1 (lag 1), in a broadcast what it just received (lag 0). Both spans of such a pair
 * have the same length. */
struct xfer {
    struct coll *c;
    const char *what;
    int nsend, nrecv, lag;
    /* The span of step t, set by the operation. */
    void (*span)(const struct xfer *x, int t, bool send, char **p, size_t *len);
    bool (*reduce_step)(const struct xfer *x, int t);
    void (*add)(void *dst, const void *src, size_t n);
    size_t elem;
    /* The operation's own data. */
    char *buf;
    size_t n;
    /* Progress: send step and offset; receive step, offset and the part reduced. */
    int st, rt;
    size_t so, ro, rc;
    char *sp, *rp;
    size_t slen, rlen;
    bool rreduce;
    /* Shared rings: whether this operation's padding is behind us (see shm_pad). */
    bool saligned, raligned;
};

static void xfer_load_send(struct xfer *x)
{
    x->so = 0;
    if (x->st < x->nsend)
        x->span(x, x->st, true, &x->sp, &x->slen);
}

static void xfer_load_recv(struct xfer *x)
{
    x->ro = x->rc = 0;
    if (x->rt < x->nrecv) {
        x->span(x, x->rt, false, &x->rp, &x->rlen);
        x->rreduce = x->reduce_step && x->reduce_step(x, x->rt);
    }
}

/* Moves past finished steps (empty spans included). */
static void xfer_advance(struct xfer *x)
{
    while (x->st < x->nsend && x->so == x->slen) {
        x->st++;
        xfer_load_send(x);
    }
    while (x->rt < x->nrecv && x->rc == x->rlen) {
        x->rt++;
        xfer_load_recv(x);
    }
}

/* How far into its span the current send step may go. */
static size_t xfer_send_limit(const struct xfer *x)
{
    int dep = x->st - x->lag;

    if (dep < 0 || x->rt > dep)
        return x->slen;
    if (x->rt == dep)
        return x->rc;
    return 0;
}

/* Fails the ring: the error is kept, both links are closed so that the neighbours see the
 * failure at once instead of waiting for their timeout. */
static int ring_fail(struct coll *c, int err)
{
    c->broken = err;
    close_fd(&c->send_fd);
    close_fd(&c->recv_fd);
    return err;
}

static int prev_rank(const struct coll *c)
{
    return (c->rank + c->world - 1) % c->world;
}

static int next_rank(const struct coll *c)
{
    return (c->rank + 1) % c->world;
}

/* Reads what rank-1 has sent over TCP; 1 when bytes came, 0 when none were there, or the
 * error. */
static int tcp_recv(struct xfer *x)
{
    struct coll *c = x->c;
    size_t want;
    char *dst;
    ssize_t got;

    if (x->rreduce) {
        size_t end = x->rc + CHUNK_BYTES < x->rlen ? x->rc + CHUNK_BYTES : x->rlen;
        dst = (char *)c->scratch + (x->ro - x->rc);
        want = end - x->ro;
    } else {
        dst = x->rp + x->ro;
        want = x->rlen - x->ro;
    }
    do
        got = recv(c->recv_fd, dst, want, MSG_DONTWAIT);
    while (got < 0 && errno == EINTR);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    if (got < 0) {
        int e = errno;
        set_err(c, "cannot receive from rank %d (%s) during %s: %s", prev_rank(c), c->prev_addr,
                x->what, errstr(e));
        return ring_fail(c, e == ECONNRESET ? -ECONNRESET : -e);
    }
    if (got == 0) {
        set_err(c, "rank %d (%s) closed the connection during %s", prev_rank(c), c->prev_addr,
                x->what);
        return ring_fail(c, -ECONNRESET);
    }
    x->ro += (size_t)got;
    if (!x->rreduce) {
        x->rc = x->ro;
    } else if (x->ro - x->rc == CHUNK_BYTES || x->ro == x->rlen) {
        /* A whole chunk (or the span's last piece) is in: add it into place. */
        x->add(x->rp + x->rc, c->scratch, (x->ro - x->rc) / x->elem);
        x->rc = x->ro;
    }
    return 1;
}

/* Sends what may go to rank+1 over TCP; 1 when bytes went, 0 when none could, or the error. */
static int tcp_send(struct xfer *x)
{
    struct coll *c = x->c;
    size_t limit = xfer_send_limit(x);
    ssize_t put;

    if (limit <= x->so)
        return 0;
    do
        put = send(c->send_fd, x->sp + x->so, limit - x->so, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (put < 0 && errno == EINTR);
    if (put < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    if (put < 0) {
        int e = errno;
        set_err(c, "cannot send to rank %d (%s) during %s: %s", next_rank(c), c->next_addr, x->what,
                e == EPIPE ? "connection closed" : errstr(e));
        return ring_fail(c, e == EPIPE || e == ECONNRESET ? -ECONNRESET : -e);
    }
    x->so += (size_t)put;
    return 1;
}

/* Rings a shared-memory link's doorbell: one byte on its TCP connection. A peer that has
 * closed does not need waking (and if it died, the data path says so), so errors are left. */
static void doorbell(int fd)
{
    char b = 0;

    if (fd >= 0)
        while (send(fd, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno == EINTR)
            ;
}

/* Every operation's stream on a shared ring starts at a multiple of SHM_PAD: both sides skip
 * the same padding before their first byte of the operation, so that elements never straddle
 * the end of the ring. */
static uint64_t shm_pad(uint64_t pos, bool aligned)
{
    return aligned ? 0 : (SHM_PAD - pos % SHM_PAD) % SHM_PAD;
}

/* How many bytes of the current receive step can be taken from the ring in one piece (whole
 * elements when they are added), and where they start. */
static size_t shm_recv_usable(const struct xfer *x, uint64_t *from)
{
    struct shm_ring *r = x->c->recv_ring;
    uint64_t tail = atomic_load(&r->tail), avail = atomic_load(&r->head) - tail;
    uint64_t pad = shm_pad(tail, x->raligned);
    size_t off, n = x->rlen - x->ro;

    /* The sender stores its padding with its first bytes: no more than padding is nothing. */
    if (avail <= pad)
        return 0;
    *from = tail + pad;
    off = (size_t)(*from % SHM_RING_BYTES);
    if (n > avail - pad)
        n = (size_t)(avail - pad);
    if (n > SHM_RING_BYTES - off)
        n = SHM_RING_BYTES - off;
    if (n > SHM_PIECE_BYTES)
        n = SHM_PIECE_BYTES;
    if (x->rreduce)
        n -= n % x->elem;
    return n;
}

/* Takes what rank-1 has put in the shared ring: added into place or copied, straight from the
 * ring. 1 when bytes came, 0 when there were none to take. */
static int shm_recv(struct xfer *x)
{
    struct coll *c = x->c;
    struct shm_ring *r = c->recv_ring;
    uint64_t from = 0;
    size_t n = shm_recv_usable(x, &from);
    const char *src = (const char *)r + SHM_DATA_OFF + from % SHM_RING_BYTES;

    if (n == 0)
        return 0;
    if (x->rreduce)
        x->add(x->rp + x->ro, src, n / x->elem);
    else
        memcpy(x->rp + x->ro, src, n);
    x->ro += n;
    x->rc = x->ro;
    x->raligned = true;
    atomic_store(&r->tail, from + n);
    if (atomic_exchange(&r->send_waiting, 0))
        doorbell(c->recv_fd);
    return 1;
}

/* How many bytes of the current send step fit in the ring in one piece, and where. */
static size_t shm_send_usable(const struct xfer *x, uint64_t *at)
{
    struct shm_ring *r = x->c->send_ring;
    uint64_t head = atomic_load(&r->head), used = head - atomic_load(&r->tail);
    uint64_t pad = shm_pad(head, x->saligned), space = SHM_RING_BYTES - used;
    size_t limit = xfer_send_limit(x), off, n;

    if (limit <= x->so || space <= pad)
        return 0;
    *at = head + pad;
    off = (size_t)(*at % SHM_RING_BYTES);
    n = limit - x->so;
    if (n > space - pad)
        n = (size_t)(space - pad);
    if (n > SHM_RING_BYTES - off)
        n = SHM_RING_BYTES - off;
    if (n > SHM_PIECE_BYTES)
        n = SHM_PIECE_BYTES;
    return n;
}

/* Puts what may go to rank+1 in the shared ring; 1 when bytes went, 0 when none could. */
static int shm_send(struct xfer *x)
{
    struct coll *c = x->c;
    struct shm_ring *r = c->send_ring;
    uint64_t at = 0;
    size_t n = shm_send_usable(x, &at);

    if (n == 0)
        return 0;
    memcpy((char *)r + SHM_DATA_OFF + at % SHM_RING_BYTES, x->sp + x->so, n);
    x->so += n;
    x->saligned = true;
    atomic_store(&r->head, at + n);
    if (atomic_exchange(&r->recv_waiting, 0))
        doorbell(c->send_fd);
    return 1;
}

/* Before sleeping on a shared ring: raises this side's flag, then looks again, so that the
 * other side either saw the flag or made the progress seen here. True when there is
 * something to do after all. */
static bool shm_recv_ready(struct xfer *x)
{
    uint64_t from;

    atomic_store(&x->c->recv_ring->recv_waiting, 1);
    return shm_recv_usable(x, &from) > 0;
}

static bool shm_send_ready(struct xfer *x)
{
    uint64_t at;

    atomic_store(&x->c->send_ring->send_waiting, 1);
    return shm_send_usable(x, &at) > 0;
}

/* Reads what came on a link's TCP connection where only doorbells (or, on the link to rank+1
 * over TCP, nothing at all) may come: 0 when the peer is still there, or the error when it
 * closed. */
static int drain(struct xfer *x, bool next)
{
    struct coll *c = x->c;
    int fd = next ? c->send_fd : c->recv_fd, peer = next ? next_rank(c) : prev_rank(c);
    const char *addr = next ? c->next_addr : c->prev_addr;
    char b[64];
    ssize_t got;

    for (;;) {
        got = recv(fd, b, sizeof(b), MSG_DONTWAIT);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (got > 0 && next && !c->send_ring) {
            set_err(c, "rank %d (%s) sent unexpected bytes during %s", peer, addr, x->what);
            return ring_fail(c, -EPROTO);
        }
        if (got <= 0 && !next && c->recv_ring) {
            c->prev_closed = true;
            return 0;
        }
        if (got <= 0) {
            set_err(c, "rank %d (%s) closed the connection during %s", peer, addr, x->what);
            return ring_fail(c, -ECONNRESET);
        }
    }
}

static int xfer_run(struct xfer *x)
{
    struct coll *c = x->c;
    int (*do_recv)(struct xfer *) = c->recv_ring ? shm_recv : tcp_recv;
    int (*do_send)(struct xfer *) = c->send_ring ? shm_send : tcp_send;
    int64_t last = now_ms();
    int ret;

    x->st = x->rt = 0;
    xfer_load_send(x);
    xfer_load_recv(x);
    xfer_advance(x);
    while (x->st < x->nsend || x->rt < x->nrecv) {
        struct pollfd pfd[2];
        bool moved = false, want_recv;
        int64_t left;

        /* Take what has arrived first: it may unlock sends. */
        while (x->rt < x->nrecv) {
            if ((ret = do_recv(x)) < 0)
                return ret;
            if (!ret)
                break;
            moved = true;
            xfer_advance(x);
        }
        while (x->st < x->nsend) {
            if ((ret = do_send(x)) < 0)
                return ret;
            if (!ret)
                break;
            moved = true;
            xfer_advance(x);
        }
        if (moved) {
            last = now_ms();
            continue;
        }
        want_recv = x->rt < x->nrecv;
        if (want_recv && c->recv_ring && shm_recv_ready(x))
            continue;
        if (want_recv && c->prev_closed) {
            set_err(c, "rank %d (%s) closed the connection during %s", prev_rank(c), c->prev_addr,
                    x->what);
            return ring_fail(c, -ECONNRESET);
        }
        if (x->st < x->nsend && c->send_ring && xfer_send_limit(x) > x->so && shm_send_ready(x))
            continue;
        left = last + c->timeout_ms - now_ms();
        if (left <= 0) {
            if (want_recv)
                set_err(c, "no data from rank %d (%s) for %d ms during %s", prev_rank(c),
                        c->prev_addr, c->timeout_ms, x->what);
            else
                set_err(c, "rank %d (%s) took nothing for %d ms during %s", next_rank(c),
                        c->next_addr, c->timeout_ms, x->what);
            return ring_fail(c, -ETIMEDOUT);
        }
        /* The link from rank-1 while this rank waits for it: its data, or its doorbells.
         * The link to rank+1 only while there is something left to send it (once it has all
         * it needs from us it may finish and close before this rank has its own part): room
         * over TCP, doorbells over a shared ring, and its end closing. */
        pfd[0] =
            (struct pollfd){.fd = want_recv && !c->prev_closed ? c->recv_fd : -1, .events = POLLIN};
        pfd[1] = (struct pollfd){.fd = -1};
        if (x->st < x->nsend) {
            pfd[1] = (struct pollfd){.fd = c->send_fd, .events = POLLIN | POLLRDHUP};
            if (!c->send_ring && xfer_send_limit(x) > x->so)
                pfd[1].events |= POLLOUT;
        }
        ret = poll(pfd, 2, left > INT_MAX ? INT_MAX : (int)left);
        if (ret < 0 && errno != EINTR) {
            int e = errno;
            set_err(c, "cannot poll the ring during %s: %s", x->what, errstr(e));
            return ring_fail(c, -e);
        }
        if (ret <= 0)
            continue;
        /* Over TCP the next recv() reads the data (or says what went wrong). */
        if (c->recv_ring && pfd[0].revents && (ret = drain(x, false)) < 0)
            return ret;
        if ((pfd[1].revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) &&
            (ret = drain(x, true)) < 0)
            return ret;
    }
    return 0;
}

/* --- tcp: allreduce and broadcast ----------------------------------------------------------- */

/* Segment k of the buffer: the n elements split into world parts, the first n % world one
 * element longer. */
static void segment(const struct xfer *x, int k, char **p, size_t *len)
{
    size_t w = (size_t)x->c->world, q = x->n / w, r = x->n % w, kk = (size_t)k;
    size_t off = kk * q + (kk < r ? kk : r);

    *p = x->buf + off * x->elem;
    *len = (q + (kk < r)) * x->elem;
}

/* Steps 0..W-2 reduce-scatter, steps W-1..2W-3 all-gather. In the reduce-scatter, step t sends
 * segment rank-t and adds segment rank-t-1 into place, so that after W-1 steps this rank holds
 * the full sum of segment rank+1, whose additions went around the ring in a fixed order; the
 * all-gather then passes every finished segment around as it is. */
static void allreduce_span(const struct xfer *x, int t, bool send, char **p, size_t *len)
{
    int w = x->c->world, r = x->c->rank, k;

    if (t < w - 1)
        k = send ? r - t : r - t - 1;
    else
        k = send ? r + 1 - (t - (w - 1)) : r - (t - (w - 1));
    segment(x, ((k % w) + w) % w, p, len);
}

static bool allreduce_reduces(const struct xfer *x, int t)
{
    return t < x->c->world - 1;
}

static int tcp_allreduce(struct coll *c, void *buf, size_t n, enum coll_host_type t)
{
    struct xfer x = {
        .c = c,
        .what = "allreduce",
        .nsend = 2 * (c->world - 1),
        .nrecv = 2 * (c->world - 1),
        .lag = 1,
        .span = allreduce_span,
        .reduce_step = allreduce_reduces,
        .add = host_types[t].add,
        .elem = host_types[t].elem,
        .buf = buf,
        .n = n,
    };

    return xfer_run(&x);
}

static void broadcast_span(const struct xfer *x, int t, bool send, char **p, size_t *len)
{
    (void)t;
    (void)send;
    *p = x->buf;
    *len = x->n;
}

/* The root sends, every other rank receives and passes on what it has, but the rank before
 * the root: a pipeline along the ring. */
static int tcp_broadcast(struct coll *c, void *buf, size_t bytes, int root)
{
    struct xfer x = {
        .c = c,
        .what = "broadcast",
        .nsend = next_rank(c) == root ? 0 : 1,
        .nrecv = c->rank == root ? 0 : 1,
        .lag = c->rank == root ? 1 : 0,
        .span = broadcast_span,
        .elem = 1,
        .buf = buf,
        .n = bytes,
    };

    return xfer_run(&x);
}

/* --- tcp: set-up ------------------------------------------------------------------------------ */

static void put_u32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void format_addr(const struct sockaddr *sa, char *out, size_t cap)
{
    char host[INET6_ADDRSTRLEN] = "?", port[8] = "?";

    getnameinfo(
        sa, sa->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in),
        host, sizeof(host), port, sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(out, cap, sa->sa_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, port);
}

/* The address this rank listens on. The agent's GPURUN_NODE_ADDR is the address its node
 * reaches the leader from, which the other nodes can reach too. Without it (a rank started
 * some other way), the interface the kernel routes MASTER_ADDR (or, without that, this
 * node's own name) through: a UDP connect sends nothing and picks the interface as a real
 * connection would, across subnets and network namespaces alike. */
static void own_addr(char *host, size_t cap)
{
    const char *node = getenv("GPURUN_NODE_ADDR"), *master = getenv("MASTER_ADDR");
    char self[256];
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM, .ai_flags = AI_NUMERICSERV}, *ai = NULL;
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int fd = -1;

    if (node && *node && strcmp(node, "0.0.0.0") && strcmp(node, "::")) {
        snprintf(host, cap, "%s", node);
        return;
    }
    snprintf(host, cap, "127.0.0.1");
    /* Neither (srun --mpi=pmix, say): what this node's name resolves to, as MPI does. */
    if ((!master || !*master) && gethostname(self, sizeof(self)) == 0) {
        self[sizeof(self) - 1] = '\0';
        master = self;
    }
    if (!master || !*master || getaddrinfo(master, "9", &hints, &ai) || !ai)
        goto out;
    fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
        goto out;
    getnameinfo((struct sockaddr *)&ss, len, host, (socklen_t)cap, NULL, 0, NI_NUMERICHOST);
out:
    if (fd >= 0)
        close(fd);
    if (ai)
        freeaddrinfo(ai);
}

/* No Nagle delay on the last small piece of a step. The buffer sizes are left to the kernel's
 * autotuning (up to net.ipv4.tcp_wmem's 4 MiB): a size set by hand is capped at
 * net.core.wmem_max, 208 KiB by default, and measured no faster where the cap allows 4 MiB. */
static void tune_socket(int fd)
{
    int one = 1;

    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Waits until fd is ready for events or the deadline passes: 0, -ETIMEDOUT or the error. */
static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int64_t left = deadline - now_ms();
        int ret;

        if (left <= 0)
            return -ETIMEDOUT;
        ret = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
        if (ret > 0)
            return 0;
        if (ret < 0 && errno != EINTR)
            return -errno;
    }
}

/* Reads or writes exactly len bytes on a non-blocking fd before the deadline: 0, -ECONNRESET
 * when the peer closed, -ETIMEDOUT or the error. */
static int io_full(int fd, void *buf, size_t len, bool out, int64_t deadline)
{
    size_t done = 0;

    while (done < len) {
        ssize_t k = out ? send(fd, (char *)buf + done, len - done, MSG_DONTWAIT | MSG_NOSIGNAL)
                        : recv(fd, (char *)buf + done, len - done, MSG_DONTWAIT);
        int ret;

        if (k > 0) {
            done += (size_t)k;
            continue;
        }
        if (k == 0)
            return -ECONNRESET;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return errno == EPIPE ? -ECONNRESET : -errno;
        if ((ret = wait_fd(fd, out ? POLLOUT : POLLIN, deadline)) < 0)
            return ret;
    }
    return 0;
}

static void make_hello(unsigned char *h, unsigned seq, int world, int from, int to,
                       const unsigned char *token, const unsigned char *boot_id)
{
    memcpy(h, HELLO_MAGIC, 8);
    put_u32(h + 8, seq);
    put_u32(h + 12, (uint32_t)world);
    put_u32(h + 16, (uint32_t)from);
    put_u32(h + 20, (uint32_t)to);
    memcpy(h + 24, token, TOKEN_BYTES);
    memcpy(h + 24 + TOKEN_BYTES, boot_id, BOOT_ID_BYTES);
}

/* --- tcp: shared-memory links ---------------------------------------------------------------- */

/* This machine's identity for shared memory: the kernel's boot_id, the same for every process
 * of one boot and different on any other machine. Zeros (never offered nor accepted) when it
 * cannot be read or when GPURUN_COLL_SHM=0 asks for TCP on every link. */
static void shm_machine(unsigned char *boot_id)
{
    const char *env = getenv("GPURUN_COLL_SHM");
    int fd;

    memset(boot_id, 0, BOOT_ID_BYTES);
    if (env && !strcmp(env, "0"))
        return;
    fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    if (read(fd, boot_id, BOOT_ID_BYTES) != BOOT_ID_BYTES)
        memset(boot_id, 0, BOOT_ID_BYTES);
    close(fd);
}

static bool shm_same_machine(const unsigned char *a, const unsigned char *b)
{
    static const unsigned char zero[BOOT_ID_BYTES];

    return memcmp(a, zero, BOOT_ID_BYTES) && !memcmp(a, b, BOOT_ID_BYTES);
}

/* Creates a ring for the link from rank-1 under a random name (name: SHM_NAME_BYTES) with a
 * random cookie the sender checks after mapping it. The caller unlinks the name once the
 * sender has answered. */
static int shm_create(struct coll *c, char *name, unsigned char *cookie, struct shm_ring **out)
{
    unsigned char rnd[TOKEN_BYTES];
    char *p = name + snprintf(name, SHM_NAME_BYTES, "/gpurun-coll-");
    void *map = MAP_FAILED;
    int fd = -1, ret = -1;

    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd) ||
        getrandom(cookie, TOKEN_BYTES, 0) != TOKEN_BYTES) {
        ret = -errno;
        goto out;
    }
    for (int i = 0; i < TOKEN_BYTES; i++)
        p += snprintf(p, 3, "%02x", rnd[i]);
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        ret = -errno;
        goto out;
    }
    if (ftruncate(fd, SHM_MAP_BYTES) < 0 || (map = mmap(NULL, SHM_MAP_BYTES, PROT_READ | PROT_WRITE,
                                                        MAP_SHARED, fd, 0)) == MAP_FAILED) {
        ret = -errno;
        shm_unlink(name);
        goto out;
    }
    /* A new file reads as zeros: head, tail and both flags start at 0. */
    memcpy(((struct shm_ring *)map)->cookie, cookie, TOKEN_BYTES);
    *out = map;
    ret = 0;
out:
    if (ret < 0)
        set_err(c, "cannot make a shared ring for rank %d: %s", prev_rank(c), errstr(ret));
    if (fd >= 0)
        close(fd);
    return ret;
}

/* Maps the ring rank+1 offered; false when this process cannot see it (another machine's or
 * another container's /dev/shm) or it is not the one offered. */
static bool shm_attach(const char *name, const unsigned char *cookie, struct shm_ring **out)
{
    struct stat st;
    void *map;
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);

    if (fd < 0)
        return false;
    map = fstat(fd, &st) == 0 && st.st_size == SHM_MAP_BYTES
              ? mmap(NULL, SHM_MAP_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
              : MAP_FAILED;
    close(fd);
    if (map == MAP_FAILED)
        return false;
    if (memcmp(((struct shm_ring *)map)->cookie, cookie, TOKEN_BYTES)) {
        munmap(map, SHM_MAP_BYTES);
        return false;
    }
    *out = map;
    return true;
}

static void shm_detach(struct shm_ring **r)
{
    if (*r)
        munmap(*r, SHM_MAP_BYTES);
    *r = NULL;
}

/* Parses "host port token" as published by a rank. */
static int parse_addr_value(const char *v, char *host, size_t hcap, char *port, size_t pcap,
                            unsigned char *token)
{
    const char *sp1 = strchr(v, ' '), *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;

    if (!sp1 || !sp2 || (size_t)(sp1 - v) >= hcap || (size_t)(sp2 - sp1 - 1) >= pcap ||
        strlen(sp2 + 1) != 2 * TOKEN_BYTES)
        return -EPROTO;
    snprintf(host, hcap, "%.*s", (int)(sp1 - v), v);
    snprintf(port, pcap, "%.*s", (int)(sp2 - sp1 - 1), sp1 + 1);
    for (int i = 0; i < TOKEN_BYTES; i++) {
        unsigned b;
        if (sscanf(sp2 + 1 + 2 * i, "%2x", &b) != 1)
            return -EPROTO;
        token[i] = (unsigned char)b;
    }
    return 0;
}

/* Connects to rank+1 from its published value (non-blocking, before the deadline) and sends
 * the hello; the ack is read later, once this rank has accepted its own peer. */
static int tcp_connect_next(struct coll *c, const char *value, unsigned seq,
                            const unsigned char *boot_id, int64_t deadline)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV},
                    *ai = NULL;
    char host[INET6_ADDRSTRLEN], port[8];
    unsigned char token[TOKEN_BYTES], hello[HELLO_BYTES];
    int fd = -1, ret = -1, soerr = 0, gai;
    socklen_t slen = sizeof(soerr);

    if (parse_addr_value(value, host, sizeof(host), port, sizeof(port), token) < 0) {
        set_err(c, "rank %d published a malformed address '%.80s'", next_rank(c), value);
        ret = -EPROTO;
        goto out;
    }
    snprintf(c->next_addr, sizeof(c->next_addr), strchr(host, ':') ? "[%s]:%s" : "%s:%s", host,
             port);
    if ((gai = getaddrinfo(host, port, &hints, &ai)) != 0 || !ai) {
        set_err(c, "cannot resolve rank %d's address '%s': %s", next_rank(c), c->next_addr,
                gai_strerror(gai));
        ret = -EPROTO;
        goto out;
    }
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        ret = -errno;
        set_err(c, "cannot create a socket: %s", errstr(errno));
        goto out;
    }
    tune_socket(fd);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) {
        ret = -errno;
        goto connect_failed;
    }
    if ((ret = wait_fd(fd, POLLOUT, deadline)) < 0)
        goto connect_failed;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &slen) < 0 || soerr) {
        ret = soerr ? -soerr : -errno;
        goto connect_failed;
    }
    make_hello(hello, seq, c->world, c->rank, next_rank(c), token, boot_id);
    if ((ret = io_full(fd, hello, sizeof(hello), true, deadline)) < 0) {
        set_err(c, "cannot send the hello to rank %d (%s): %s", next_rank(c), c->next_addr,
                errstr(-ret));
        goto out;
    }
    c->send_fd = fd;
    fd = -1;
    ret = 0;
    goto out;
connect_failed:
    set_err(c, "cannot connect to rank %d at '%s': %s", next_rank(c), c->next_addr, errstr(-ret));
out:
    if (fd >= 0)
        close(fd);
    if (ai)
        freeaddrinfo(ai);
    return ret;
}

/* Accepts connections on lfd until one presents a hello with this rank's token (a connection
 * with another token is a stranger, closed and forgotten), checks that it comes from rank-1
 * for this same ring, and answers the ack. */
static int tcp_accept_prev(struct coll *c, int lfd, unsigned seq, const unsigned char *token,
                           const unsigned char *boot_id, char *shm_name, int64_t deadline)
{
    unsigned char hello[HELLO_BYTES], ack[ACK_BYTES] = ACK_MAGIC;
    int fd = -1, ret = -1;

    for (;;) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);

        if ((ret = wait_fd(lfd, POLLIN, deadline)) < 0) {
            set_err(c, "rank %d did not connect: %s", prev_rank(c), errstr(-ret));
            goto out;
        }
        fd = accept4(lfd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED)
                continue;
            ret = -errno;
            set_err(c, "cannot accept rank %d's connection: %s", prev_rank(c), errstr(errno));
            goto out;
        }
        format_addr((struct sockaddr *)&ss, c->prev_addr, sizeof(c->prev_addr));
        if ((ret = io_full(fd, hello, sizeof(hello), false, deadline)) == 0 &&
            !memcmp(hello, HELLO_MAGIC, 8) && !memcmp(hello + 24, token, TOKEN_BYTES))
            break;
        if (ret == -ETIMEDOUT) {
            set_err(c, "no hello from '%s' (expected rank %d)", c->prev_addr, prev_rank(c));
            goto out;
        }
        close_fd(&fd);
    }
    if (get_u32(hello + 8) != seq || get_u32(hello + 12) != (uint32_t)c->world ||
        get_u32(hello + 16) != (uint32_t)prev_rank(c) || get_u32(hello + 20) != (uint32_t)c->rank) {
        set_err(c,
                "'%s' joined as rank %u of %u (ring %u) for rank %u; expected rank %d of %d "
                "(ring %u) for rank %d",
                c->prev_addr, get_u32(hello + 16), get_u32(hello + 12), get_u32(hello + 8),
                get_u32(hello + 20), prev_rank(c), c->world, seq, c->rank);
        ret = -EPROTO;
        goto out;
    }
    /* Rank-1 runs on this machine: offer it a shared ring (TCP stays, if it cannot). */
    if (shm_same_machine(boot_id, hello + 24 + TOKEN_BYTES) &&
        shm_create(c, shm_name, ack + 9 + SHM_NAME_BYTES, &c->recv_ring) == 0) {
        ack[8] = 1;
        memcpy(ack + 9, shm_name, strlen(shm_name) + 1);
    }
    if ((ret = io_full(fd, ack, sizeof(ack), true, deadline)) < 0) {
        set_err(c, "cannot answer rank %d (%s): %s", prev_rank(c), c->prev_addr, errstr(-ret));
        goto out;
    }
    c->recv_fd = fd;
    fd = -1;
    ret = 0;
out:
    if (fd >= 0)
        close(fd);
    return ret;
}

static int tcp_open(struct coll *c, struct gr *g)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE},
                    *ai = NULL;
    unsigned seq = coll_next_seq();
    unsigned char token[TOKEN_BYTES], ack[ACK_BYTES], boot_id[BOOT_ID_BYTES], yes = 0;
    char host[INET6_ADDRSTRLEN], key[64], value[ADDR_VALUE_MAX], *v, shm_name[SHM_NAME_BYTES] = "";
    struct sockaddr_storage ss;
    socklen_t slen = sizeof(ss);
    int64_t deadline = now_ms() + c->timeout_ms;
    int lfd = -1, ret = -1, gai, port;
    size_t vlen = 0;

    if (!g) {
        set_err(c, "the tcp backend needs the rank library for %d ranks", c->world);
        ret = -EINVAL;
        goto out;
    }
    c->scratch = malloc(CHUNK_BYTES);
    if (!c->scratch) {
        set_err(c, "out of memory for the ring's buffer");
        ret = -ENOMEM;
        goto out;
    }
    if (getrandom(token, sizeof(token), 0) != (ssize_t)sizeof(token)) {
        ret = -errno;
        set_err(c, "cannot draw the ring's token: %s", errstr(errno));
        goto out;
    }
    own_addr(host, sizeof(host));
    if ((gai = getaddrinfo(host, "0", &hints, &ai)) != 0 || !ai) {
        set_err(c, "cannot use '%s' as this node's address: %s", host, gai_strerror(gai));
        ret = -EINVAL;
        goto out;
    }
    lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0) {
        ret = -errno;
        set_err(c, "cannot create a socket: %s", errstr(errno));
        goto out;
    }
    tune_socket(lfd);
    if (bind(lfd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(lfd, 16) < 0 ||
        getsockname(lfd, (struct sockaddr *)&ss, &slen) < 0) {
        ret = -errno;
        set_err(c, "cannot listen on '%s': %s", host, errstr(errno));
        goto out;
    }
    port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                          : ((struct sockaddr_in *)&ss)->sin_port);
    v = value + snprintf(value, sizeof(value), "%s %d ", host, port);
    for (int i = 0; i < TOKEN_BYTES; i++)
        v += snprintf(v, 3, "%02x", token[i]);
    snprintf(key, sizeof(key), "coll/%u/addr/%d", seq, c->rank);
    if ((ret = gr_kv_put(g, key, value, strlen(value))) < 0) {
        set_err(c, "cannot publish '%s': %s", key, gr_strerror(g));
        goto out;
    }
    snprintf(key, sizeof(key), "coll/%u/addr/%d", seq, next_rank(c));
    ret = gr_kv_get(g, key, value, sizeof(value) - 1, &vlen, c->timeout_ms);
    if (ret < 0) {
        set_err(c, "cannot read rank %d's address '%s': %s", next_rank(c), key, gr_strerror(g));
        goto out;
    }
    value[vlen] = '\0';
    /* Every rank connects to rank+1 first, then accepts rank-1, then reads rank+1's answer
     * and confirms, then reads rank-1's confirmation: each wait is for a step its peer takes
     * before waiting itself, so the ring forms whatever the order the ranks arrive in. */
    shm_machine(boot_id);
    if ((ret = tcp_connect_next(c, value, seq, boot_id, deadline)) < 0 ||
        (ret = tcp_accept_prev(c, lfd, seq, token, boot_id, shm_name, deadline)) < 0)
        goto out;
    if ((ret = io_full(c->send_fd, ack, sizeof(ack), false, deadline)) < 0 ||
        memcmp(ack, ACK_MAGIC, 8)) {
        set_err(c, "rank %d (%s) did not accept the connection: %s", next_rank(c), c->next_addr,
                ret < 0 ? errstr(-ret) : "wrong answer");
        ret = ret < 0 ? ret : -EPROTO;
        goto out;
    }
    ack[9 + SHM_NAME_BYTES - 1] = '\0';
    yes = ack[8] == 1 && shm_attach((char *)ack + 9, ack + 9 + SHM_NAME_BYTES, &c->send_ring);
    if ((ret = io_full(c->send_fd, &yes, 1, true, deadline)) < 0 ||
        (ret = io_full(c->recv_fd, &yes, 1, false, deadline)) < 0) {
        set_err(c, "cannot agree on the links with ranks %d and %d: %s", next_rank(c), prev_rank(c),
                errstr(-ret));
        goto out;
    }
    if (yes != 1)
        shm_detach(&c->recv_ring);
    ret = 0;
out:
    /* Both ends have mapped the ring or given up on it: its name is not needed any more. */
    if (shm_name[0])
        shm_unlink(shm_name);
    if (lfd >= 0)
        close(lfd);
    if (ai)
        freeaddrinfo(ai);
    return ret;
}

static void tcp_close(struct coll *c)
{
    shm_detach(&c->send_ring);
    shm_detach(&c->recv_ring);
    close_fd(&c->send_fd);
    close_fd(&c->recv_fd);
    free(c->scratch);
    c->scratch = NULL;
}

static int single_open(struct coll *c, struct gr *g)
{
    (void)g;
    if (c->world != 1) {
        set_err(c, "the single backend runs one rank, not %d (use tcp)", c->world);
        return -EINVAL;
    }
    return 0;
}

/* --- the interface --------------------------------------------------------------------------- */

static const struct coll_backend single_backend = {
    .name = "single",
    .open = single_open,
};

static const struct coll_backend tcp_backend = {
    .name = "tcp",
    .open = tcp_open,
    .allreduce = tcp_allreduce,
    .broadcast = tcp_broadcast,
    .close = tcp_close,
};

static const struct coll_backend *const backends[] = {
    &single_backend,
    &tcp_backend,
    &coll_nccl_backend,
};

#define N_BACKENDS (sizeof(backends) / sizeof(backends[0]))

unsigned coll_next_seq(void)
{
    return __atomic_fetch_add(&open_seq, 1, __ATOMIC_RELAXED);
}

int coll_fail(struct coll *c, int err)
{
    c->broken = err;
    return err;
}

int coll_timeout_ms(const struct coll *c)
{
    return c->timeout_ms;
}

void **coll_state(struct coll *c)
{
    return &c->state;
}

void coll_set_describe(struct coll *c, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(c->describe, sizeof(c->describe), fmt, ap);
    va_end(ap);
}

/* Whether c's operations are no-ops: one rank, on a backend that does not run alone. */
static bool trivial(const struct coll *c)
{
    return c->world == 1 && !c->be->alone;
}

int coll_open(const char *backend, struct gr *g, struct coll **out, char *err, size_t errlen)
{
    struct coll *c = NULL;
    int ret = -1;

    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    c = calloc(1, sizeof(*c));
    if (!c) {
        if (err && errlen)
            snprintf(err, errlen, "out of memory for the collectives");
        return -ENOMEM;
    }
    c->send_fd = c->recv_fd = -1;
    c->timeout_ms = COLL_TIMEOUT_MS_DEFAULT;
    c->rank = g ? gr_rank(g) : 0;
    c->world = g ? gr_world_size(g) : 1;
    for (size_t i = 0; i < N_BACKENDS; i++)
        if (backend && !strcmp(backend, backends[i]->name))
            c->be = backends[i];
    if (!c->be) {
        char names[64] = "";
        for (size_t i = 0, len = 0; i < N_BACKENDS && len < sizeof(names); i++)
            len += (size_t)snprintf(names + len, sizeof(names) - len, "%s%s", i ? ", " : "",
                                    backends[i]->name);
        set_err(c, "unknown collectives backend '%s' (%s)", backend ? backend : "", names);
        ret = -EINVAL;
        goto out;
    }
    if (c->world > 1 || c->be->alone || c->be == &single_backend)
        if ((ret = c->be->open(c, g)) < 0)
            goto out;
    /* A backend of another file describes itself. */
    if (!c->describe[0] && c->world == 1)
        snprintf(c->describe, sizeof(c->describe), "%s: one rank", c->be->name);
    else if (!c->describe[0])
        snprintf(c->describe, sizeof(c->describe),
                 "%s ring of %d ranks: to rank %d (%s) over %s, from rank %d (%s) over %s",
                 c->be->name, c->world, next_rank(c), c->next_addr,
                 c->send_ring ? "shared memory" : "tcp", prev_rank(c), c->prev_addr,
                 c->recv_ring ? "shared memory" : "tcp");
    /* A shared ring that could not be made leaves a message but no failure. */
    c->err[0] = '\0';
    *out = c;
    c = NULL;
    ret = 0;
out:
    if (c) {
        if (err && errlen)
            snprintf(err, errlen, "%s", c->err);
        coll_close(c);
    }
    return ret;
}

int coll_rank(const struct coll *c)
{
    return c->rank;
}

int coll_world_size(const struct coll *c)
{
    return c->world;
}

const char *coll_backend(const struct coll *c)
{
    return c->be->name;
}

void coll_set_timeout(struct coll *c, int timeout_ms)
{
    if (timeout_ms > 0)
        c->timeout_ms = timeout_ms;
}

static int coll_allreduce(struct coll *c, void *buf, size_t n, enum coll_host_type t)
{
    if (c->broken)
        return c->broken;
    if (trivial(c) || n == 0)
        return 0;
    c->err[0] = '\0';
    return c->be->allreduce(c, buf, n, t);
}

int coll_allreduce_sum_f32(struct coll *c, float *buf, size_t n)
{
    return coll_allreduce(c, buf, n, COLL_HOST_F32);
}

int coll_allreduce_avg_f32(struct coll *c, float *buf, size_t n)
{
    int ret = coll_allreduce(c, buf, n, COLL_HOST_F32);
    float w = (float)c->world;

    if (ret < 0 || c->world == 1)
        return ret;
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        buf[i] = buf[i] / w;
    return 0;
}

int coll_allreduce_sum_f64(struct coll *c, double *buf, size_t n)
{
    return coll_allreduce(c, buf, n, COLL_HOST_F64);
}

int coll_broadcast(struct coll *c, void *buf, size_t bytes, int root)
{
    if (c->broken)
        return c->broken;
    if (root < 0 || root >= c->world) {
        set_err(c, "broadcast from rank %d: no such rank in a world of %d", root, c->world);
        return -EINVAL;
    }
    if (trivial(c) || bytes == 0)
        return 0;
    c->err[0] = '\0';
    return c->be->broadcast(c, buf, bytes, root);
}

/* An allreduce of one element: no rank gets the sum before every rank has given its part. */
int coll_barrier(struct coll *c)
{
    float one = 1.0f;

    if (c->broken)
        return c->broken;
    if (trivial(c))
        return 0;
    c->err[0] = '\0';
    return c->be->allreduce(c, &one, 1, COLL_HOST_F32);
}

/* The checks every device operation starts with: 0 to go on, or the error to return. */
static int dev_check(struct coll *c, const char *what, bool has_op)
{
    if (c->broken)
        return c->broken;
    if (!has_op) {
        set_err(c, "%s: the %s backend has no device-memory operations (nccl has)", what,
                c->be->name);
        return -ENOTSUP;
    }
    c->err[0] = '\0';
    return 0;
}

static int dev_check_dtype(struct coll *c, const char *what, bool has_op, enum coll_dtype dt)
{
    int ret = dev_check(c, what, has_op);

    if (ret == 0 && dt != COLL_F32 && dt != COLL_BF16) {
        set_err(c, "%s: unknown dtype %d", what, (int)dt);
        return -EINVAL;
    }
    return ret;
}

static int null_buffer(struct coll *c, const char *what)
{
    set_err(c, "%s: a null buffer", what);
    return -EINVAL;
}

int coll_dev_allreduce_avg(struct coll *c, void *buf, size_t n, enum coll_dtype dt, void *stream)
{
    const char *what = "device allreduce";
    int ret = dev_check_dtype(c, what, c->be->dev_allreduce_avg != NULL, dt);

    if (ret < 0 || n == 0)
        return ret;
    if (!buf)
        return null_buffer(c, what);
    return c->be->dev_allreduce_avg(c, buf, n, dt, stream);
}

int coll_dev_reduce_scatter_avg(struct coll *c, const void *send, void *recv, size_t count,
                                enum coll_dtype dt, void *stream)
{
    const char *what = "device reduce-scatter";
    int ret = dev_check_dtype(c, what, c->be->dev_reduce_scatter_avg != NULL, dt);

    if (ret < 0 || count == 0)
        return ret;
    if (!send || !recv)
        return null_buffer(c, what);
    return c->be->dev_reduce_scatter_avg(c, send, recv, count, dt, stream);
}

int coll_dev_all_gather(struct coll *c, const void *send, void *recv, size_t count,
                        enum coll_dtype dt, void *stream)
{
    const char *what = "device all-gather";
    int ret = dev_check_dtype(c, what, c->be->dev_all_gather != NULL, dt);

    if (ret < 0 || count == 0)
        return ret;
    if (!send || !recv)
        return null_buffer(c, what);
    return c->be->dev_all_gather(c, send, recv, count, dt, stream);
}

int coll_dev_broadcast(struct coll *c, void *buf, size_t bytes, int root, void *stream)
{
    const char *what = "device broadcast";
    int ret = dev_check(c, what, c->be->dev_broadcast != NULL);

    if (ret < 0)
        return ret;
    if (root < 0 || root >= c->world) {
        set_err(c, "%s from rank %d: no such rank in a world of %d", what, root, c->world);
        return -EINVAL;
    }
    if (bytes == 0)
        return 0;
    if (!buf)
        return null_buffer(c, what);
    return c->be->dev_broadcast(c, buf, bytes, root, stream);
}

void coll_close(struct coll *c)
{
    if (!c)
        return;
    if (c->be && c->be->close)
        c->be->close(c);
    free(c);
}

const char *coll_describe(const struct coll *c)
{
    return c->describe;
}

const char *coll_strerror(const struct coll *c)
{
    return c ? c->err : "";
}
