/* Collectives between ranks: the backend table, the world-of-one shortcut, and the tcp
 * backend's ring (connection set-up through the rank library's store, then one non-blocking
 * engine that moves every collective's bytes around the ring in pipelined chunks). */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"
#include "gr.h"
#include "banned.h"

/* Reduction granularity: received bytes are staged in a buffer of this size and added into
 * place once a whole chunk is in, so that the addition runs on data still in cache and the
 * chunk can travel on to the next rank while the following one arrives. 256 KiB sits in L2
 * and measured as fast as 1 MiB on loopback (bench/allreduce.sh). A multiple of 8 so that
 * chunks hold whole elements of every type. */
#define CHUNK_BYTES    (256 * 1024)
/* Socket buffers asked for: a few chunks in flight per link. The kernel caps the request at
 * net.core.wmem_max / rmem_max. */
#define SOCK_BUF_BYTES (4 * 1024 * 1024)
/* The hello a connecting rank sends: magic, then seq, world, from and to ranks (big-endian
 * uint32), then the acceptor's token. The acceptor answers with the 8-byte ack. */
#define HELLO_MAGIC    "GRCOLL1"
#define ACK_MAGIC      "GRCOLLOK"
#define TOKEN_BYTES    16
#define HELLO_BYTES    (8 + 4 * 4 + TOKEN_BYTES)
/* "host port token" in the store: an address, a port and 32 hex digits. */
#define ADDR_VALUE_MAX (INET6_ADDRSTRLEN + 8 + 2 * TOKEN_BYTES + 4)

struct coll;

/* A backend: what coll_open does after the common part, and the operations for a world of
 * more than one rank (a world of one never reaches them). */
struct coll_backend {
    const char *name;
    int (*open)(struct coll *c, struct gr *g);
    int (*allreduce)(struct coll *c, void *buf, size_t n, size_t elem,
                     void (*add)(void *dst, const void *src, size_t n));
    int (*broadcast)(struct coll *c, void *buf, size_t bytes, int root);
    void (*close)(struct coll *c);
};

struct coll {
    const struct coll_backend *be;
    int rank;
    int world;
    int timeout_ms;
    /* The first transport error: once set, every call returns it. */
    int broken;
    char err[320];
    /* tcp: the link to rank+1 (we only send on it) and from rank-1 (we only receive). */
    int send_fd;
    int recv_fd;
    char next_addr[INET6_ADDRSTRLEN + 8];
    char prev_addr[INET6_ADDRSTRLEN + 8];
    unsigned char *scratch;
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
    int root;
    /* Progress: send step and offset; receive step, offset and the part reduced. */
    int st, rt;
    size_t so, ro, rc;
    char *sp, *rp;
    size_t slen, rlen;
    bool rreduce;
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

/* Reads what rank-1 has sent; 1 when bytes came, 0 when none were there, or the error. */
static int xfer_recv(struct xfer *x)
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

/* Sends what may go to rank+1; 1 when bytes went, 0 when none could, or the error. */
static int xfer_send(struct xfer *x)
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

/* rank+1 never sends on our link to it: anything readable there is its end closing (or bytes
 * that do not belong to the ring). */
static int check_next(struct xfer *x)
{
    struct coll *c = x->c;
    char b;
    ssize_t got;

    do
        got = recv(c->send_fd, &b, 1, MSG_DONTWAIT);
    while (got < 0 && errno == EINTR);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    if (got > 0) {
        set_err(c, "rank %d (%s) sent unexpected bytes during %s", next_rank(c), c->next_addr,
                x->what);
        return ring_fail(c, -EPROTO);
    }
    set_err(c, "rank %d (%s) closed the connection during %s", next_rank(c), c->next_addr, x->what);
    return ring_fail(c, -ECONNRESET);
}

static int xfer_run(struct xfer *x)
{
    struct coll *c = x->c;
    int64_t last = now_ms();
    int ret;

    x->st = x->rt = 0;
    xfer_load_send(x);
    xfer_load_recv(x);
    xfer_advance(x);
    while (x->st < x->nsend || x->rt < x->nrecv) {
        struct pollfd pfd[2];
        bool moved = false;
        int64_t left;

        /* Drain what has arrived first: it may unlock sends. */
        while (x->rt < x->nrecv) {
            if ((ret = xfer_recv(x)) < 0)
                return ret;
            if (!ret)
                break;
            moved = true;
            xfer_advance(x);
        }
        while (x->st < x->nsend) {
            if ((ret = xfer_send(x)) < 0)
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
        if (x->st >= x->nsend && x->rt >= x->nrecv)
            break;
        left = last + c->timeout_ms - now_ms();
        if (left <= 0) {
            if (x->rt < x->nrecv)
                set_err(c, "no data from rank %d (%s) for %d ms during %s", prev_rank(c),
                        c->prev_addr, c->timeout_ms, x->what);
            else
                set_err(c, "rank %d (%s) took nothing for %d ms during %s", next_rank(c),
                        c->next_addr, c->timeout_ms, x->what);
            return ring_fail(c, -ETIMEDOUT);
        }
        pfd[0] = (struct pollfd){.fd = c->recv_fd, .events = x->rt < x->nrecv ? POLLIN : 0};
        /* Watch rank+1 only while there is something left to send it: once it has all it
         * needs from us it may finish and close before this rank has received its part. */
        pfd[1] = (struct pollfd){.fd = -1};
        if (x->st < x->nsend) {
            pfd[1] = (struct pollfd){.fd = c->send_fd, .events = POLLIN | POLLRDHUP};
            if (xfer_send_limit(x) > x->so)
                pfd[1].events |= POLLOUT;
        }
        ret = poll(pfd, 2, left > INT_MAX ? INT_MAX : (int)left);
        if (ret < 0 && errno != EINTR) {
            int e = errno;
            set_err(c, "cannot poll the ring during %s: %s", x->what, errstr(e));
            return ring_fail(c, -e);
        }
        if (ret > 0 && (pfd[1].revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) &&
            (ret = check_next(x)) < 0)
            return ret;
        /* POLLHUP/POLLERR on the receiving link: the next recv() says what happened. */
    }
    return 0;
}

/* --- tcp: allreduce and broadcast --------------------------------------------------------------
 */

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

static int tcp_allreduce(struct coll *c, void *buf, size_t n, size_t elem,
                         void (*add)(void *dst, const void *src, size_t n))
{
    struct xfer x = {
        .c = c,
        .what = "allreduce",
        .nsend = 2 * (c->world - 1),
        .nrecv = 2 * (c->world - 1),
        .lag = 1,
        .span = allreduce_span,
        .reduce_step = allreduce_reduces,
        .add = add,
        .elem = elem,
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
        .root = root,
    };

    return xfer_run(&x);
}

/* --- tcp: set-up -------------------------------------------------------------------------------
 */

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
 * some other way), the interface the kernel routes MASTER_ADDR through: a UDP connect sends
 * nothing and picks the interface as a real connection would, across subnets and network
 * namespaces alike. */
static void own_addr(char *host, size_t cap)
{
    const char *node = getenv("GPURUN_NODE_ADDR"), *master = getenv("MASTER_ADDR");
    struct addrinfo hints = {.ai_socktype = SOCK_DGRAM, .ai_flags = AI_NUMERICSERV}, *ai = NULL;
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int fd = -1;

    if (node && *node && strcmp(node, "0.0.0.0") && strcmp(node, "::")) {
        snprintf(host, cap, "%s", node);
        return;
    }
    snprintf(host, cap, "127.0.0.1");
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

static void tune_socket(int fd)
{
    int one = 1, size = SOCK_BUF_BYTES;

    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
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
                       const unsigned char *token)
{
    memcpy(h, HELLO_MAGIC, 8);
    put_u32(h + 8, seq);
    put_u32(h + 12, (uint32_t)world);
    put_u32(h + 16, (uint32_t)from);
    put_u32(h + 20, (uint32_t)to);
    memcpy(h + 24, token, TOKEN_BYTES);
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
static int tcp_connect_next(struct coll *c, const char *value, unsigned seq, int64_t deadline)
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
    make_hello(hello, seq, c->world, c->rank, next_rank(c), token);
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
                           int64_t deadline)
{
    unsigned char hello[HELLO_BYTES];
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
    if ((ret = io_full(fd, ACK_MAGIC, 8, true, deadline)) < 0) {
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
    unsigned seq = __atomic_fetch_add(&open_seq, 1, __ATOMIC_RELAXED);
    unsigned char token[TOKEN_BYTES], ack[8];
    char host[INET6_ADDRSTRLEN], key[64], value[ADDR_VALUE_MAX], *v;
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
    /* Accepted sockets inherit the buffer sizes, which must be set before the handshake for
     * the window scale to follow them. */
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
    if ((ret = tcp_connect_next(c, value, seq, deadline)) < 0 ||
        (ret = tcp_accept_prev(c, lfd, seq, token, deadline)) < 0)
        goto out;
    if ((ret = io_full(c->send_fd, ack, sizeof(ack), false, deadline)) < 0 ||
        memcmp(ack, ACK_MAGIC, 8)) {
        set_err(c, "rank %d (%s) did not accept the connection: %s", next_rank(c), c->next_addr,
                ret < 0 ? errstr(-ret) : "wrong answer");
        ret = ret < 0 ? ret : -EPROTO;
        goto out;
    }
    ret = 0;
out:
    if (lfd >= 0)
        close(lfd);
    if (ai)
        freeaddrinfo(ai);
    return ret;
}

static void tcp_close(struct coll *c)
{
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

static const struct coll_backend backends[] = {
    {"single", single_open, NULL, NULL, NULL},
    {"tcp", tcp_open, tcp_allreduce, tcp_broadcast, tcp_close},
};

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
    for (size_t i = 0; i < sizeof(backends) / sizeof(backends[0]); i++)
        if (backend && !strcmp(backend, backends[i].name))
            c->be = &backends[i];
    if (!c->be) {
        set_err(c, "unknown collectives backend '%s' (single, tcp)", backend ? backend : "");
        ret = -EINVAL;
        goto out;
    }
    if (c->world > 1 || c->be->open == single_open)
        if ((ret = c->be->open(c, g)) < 0)
            goto out;
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

static int coll_allreduce(struct coll *c, void *buf, size_t n, size_t elem,
                          void (*add)(void *dst, const void *src, size_t n))
{
    if (c->broken)
        return c->broken;
    if (c->world == 1 || n == 0)
        return 0;
    c->err[0] = '\0';
    return c->be->allreduce(c, buf, n, elem, add);
}

int coll_allreduce_sum_f32(struct coll *c, float *buf, size_t n)
{
    return coll_allreduce(c, buf, n, sizeof(float), add_f32);
}

int coll_allreduce_avg_f32(struct coll *c, float *buf, size_t n)
{
    int ret = coll_allreduce(c, buf, n, sizeof(float), add_f32);
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
    return coll_allreduce(c, buf, n, sizeof(double), add_f64);
}

int coll_broadcast(struct coll *c, void *buf, size_t bytes, int root)
{
    if (c->broken)
        return c->broken;
    if (root < 0 || root >= c->world) {
        set_err(c, "broadcast from rank %d: no such rank in a world of %d", root, c->world);
        return -EINVAL;
    }
    if (c->world == 1 || bytes == 0)
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
    if (c->world == 1)
        return 0;
    c->err[0] = '\0';
    return c->be->allreduce(c, &one, 1, sizeof(one), add_f32);
}

void coll_close(struct coll *c)
{
    if (!c)
        return;
    if (c->be && c->be->close)
        c->be->close(c);
    free(c);
}

const char *coll_strerror(const struct coll *c)
{
    return c ? c->err : "";
}
