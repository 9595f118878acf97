/* The tcp backend of the collectives (coll.h): a ring between the ranks, connected through the
 * rank library's store, and one non-blocking engine that moves every collective's bytes around
 * it in pipelined chunks, over each link's TCP connection or, between two ranks of one
 * machine, through a shared-memory ring (coll_shm.c). */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "coll.h"
#include "coll_backend.h"
#include "coll_tcp.h"
#include "errmsg.h"
#include "gr.h"
#include "monotime.h"
#include "banned.h"

/* Reduction granularity over TCP: received bytes are staged in a buffer of this size and added
 * into place once a whole chunk is in, so that the addition runs on data still in cache and the
 * chunk can travel on to the next rank while the following one arrives. 64 KiB measured up to
 * 1.5x faster than 256 KiB for 1 MiB buffers (a step waits less for its first chunk) and the
 * same from 4 MiB up (bench/allreduce.sh). A multiple of 8 so that chunks hold whole elements
 * of every type. */
#define CHUNK_BYTES    (64 * 1024)
/* The hello a connecting rank sends: magic, then seq, world, from and to ranks (big-endian
 * uint32), the acceptor's token, and the connector's machine (the kernel's boot_id; zeros
 * when unknown or shared memory is off). The acceptor answers with the ack: magic, a byte
 * saying whether it offers a shared-memory ring (1) or not (0), the ring's name and cookie.
 * The connector then confirms with one byte whether it mapped the ring (1) or not (0). */
#define HELLO_MAGIC    "GRCOLL2"
#define ACK_MAGIC      "GRCOLLOK"
#define HELLO_BYTES    (8 + 4 * 4 + TOKEN_BYTES + BOOT_ID_BYTES)
#define ACK_BYTES      (8 + 1 + SHM_NAME_BYTES + TOKEN_BYTES)
/* "host port token" in the store: an address, a port and 32 hex digits. */
#define ADDR_VALUE_MAX (INET6_ADDRSTRLEN + 8 + 2 * TOKEN_BYTES + 4)

static struct coll_tcp *state(struct coll *c)
{
    return *coll_state(c);
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

/* A collective's transfer (struct coll_xfer) and its send limit are coll_tcp.h's: the
 * shared-memory data path (coll_shm.c) follows them too. */

static void xfer_load_send(struct coll_xfer *x)
{
    x->so = 0;
    if (x->st < x->nsend)
        x->span(x, x->st, true, &x->sp, &x->slen);
}

static void xfer_load_recv(struct coll_xfer *x)
{
    x->ro = x->rc = 0;
    if (x->rt < x->nrecv) {
        x->span(x, x->rt, false, &x->rp, &x->rlen);
        x->rreduce = x->reduce_step && x->reduce_step(x, x->rt);
    }
}

/* Moves past finished steps (empty spans included). */
static void xfer_advance(struct coll_xfer *x)
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

/* Fails the ring: the error is kept, both links are closed so that the neighbours see the
 * failure at once instead of waiting for their timeout. */
static int ring_fail(struct coll *c, int err)
{
    struct coll_tcp *tcp = state(c);

    close_fd(&tcp->send_fd);
    close_fd(&tcp->recv_fd);
    return coll_fail(c, err);
}

static int prev_rank(const struct coll_tcp *tcp)
{
    return (tcp->rank + tcp->world - 1) % tcp->world;
}

static int next_rank(const struct coll_tcp *tcp)
{
    return (tcp->rank + 1) % tcp->world;
}

/* Reads what rank-1 has sent over TCP; 1 when bytes came, 0 when none were there, or the
 * error. */
static int tcp_recv(struct coll_xfer *x)
{
    struct coll *c = x->c;
    struct coll_tcp *tcp = x->tcp;
    size_t want;
    char *dst;
    ssize_t got;

    if (x->rreduce) {
        size_t end = x->rc + CHUNK_BYTES < x->rlen ? x->rc + CHUNK_BYTES : x->rlen;
        dst = (char *)tcp->scratch + (x->ro - x->rc);
        want = end - x->ro;
    } else {
        dst = x->rp + x->ro;
        want = x->rlen - x->ro;
    }
    do
        got = recv(tcp->recv_fd, dst, want, MSG_DONTWAIT);
    while (got < 0 && errno == EINTR);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    if (got < 0) {
        int e = errno;
        coll_set_err(c, "cannot receive from rank %d (%s) during %s: %s", prev_rank(tcp),
                     tcp->prev_addr, x->what, errmsg_strerror(e));
        return ring_fail(c, e == ECONNRESET ? -ECONNRESET : -e);
    }
    if (got == 0) {
        coll_set_err(c, "rank %d (%s) closed the connection during %s", prev_rank(tcp),
                     tcp->prev_addr, x->what);
        return ring_fail(c, -ECONNRESET);
    }
    x->ro += (size_t)got;
    if (!x->rreduce) {
        x->rc = x->ro;
    } else if (x->ro - x->rc == CHUNK_BYTES || x->ro == x->rlen) {
        /* A whole chunk (or the span's last piece) is in: add it into place. */
        x->add(x->rp + x->rc, tcp->scratch, (x->ro - x->rc) / x->elem);
        x->rc = x->ro;
    }
    return 1;
}

/* Sends what may go to rank+1 over TCP; 1 when bytes went, 0 when none could, or the error. */
static int tcp_send(struct coll_xfer *x)
{
    struct coll *c = x->c;
    struct coll_tcp *tcp = x->tcp;
    size_t limit = coll_xfer_send_limit(x);
    ssize_t put;

    if (limit <= x->so)
        return 0;
    do
        put = send(tcp->send_fd, x->sp + x->so, limit - x->so, MSG_DONTWAIT | MSG_NOSIGNAL);
    while (put < 0 && errno == EINTR);
    if (put < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return 0;
    if (put < 0) {
        int e = errno;
        coll_set_err(c, "cannot send to rank %d (%s) during %s: %s", next_rank(tcp), tcp->next_addr,
                     x->what, e == EPIPE ? "connection closed" : errmsg_strerror(e));
        return ring_fail(c, e == EPIPE || e == ECONNRESET ? -ECONNRESET : -e);
    }
    x->so += (size_t)put;
    return 1;
}

/* Reads what came on a link's TCP connection where only doorbells (or, on the link to rank+1
 * over TCP, nothing at all) may come: 0 when the peer is still there, or the error when it
 * closed. */
static int drain(struct coll_xfer *x, bool next)
{
    struct coll *c = x->c;
    struct coll_tcp *tcp = x->tcp;
    int fd = next ? tcp->send_fd : tcp->recv_fd, peer = next ? next_rank(tcp) : prev_rank(tcp);
    const char *addr = next ? tcp->next_addr : tcp->prev_addr;
    char b[64];
    ssize_t got;

    for (;;) {
        got = recv(fd, b, sizeof(b), MSG_DONTWAIT);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (got > 0 && next && !tcp->send_ring) {
            coll_set_err(c, "rank %d (%s) sent unexpected bytes during %s", peer, addr, x->what);
            return ring_fail(c, -EPROTO);
        }
        if (got <= 0 && !next && tcp->recv_ring) {
            tcp->prev_closed = true;
            return 0;
        }
        if (got <= 0) {
            coll_set_err(c, "rank %d (%s) closed the connection during %s", peer, addr, x->what);
            return ring_fail(c, -ECONNRESET);
        }
    }
}

/* Moves what one direction of x can now (recv: from rank-1, else to rank+1): all of it over
 * TCP, fewer and larger calls; one piece from a shared ring, so that what the piece brought
 * in (and this rank added to) goes on to rank+1 while it is still in the cache (1.1-1.3x at
 * 16-256 MiB, bench/allreduce.sh). 1 when bytes moved, 0 when none could, or the error. */
static int move_some(struct coll_xfer *x, bool recv)
{
    struct coll_tcp *tcp = x->tcp;
    int (*move)(struct coll_xfer *) = recv ? (tcp->recv_ring ? coll_shm_recv : tcp_recv)
                                           : (tcp->send_ring ? coll_shm_send : tcp_send);
    int moved = 0, ret;

    while (recv ? x->rt < x->nrecv : x->st < x->nsend) {
        if ((ret = move(x)) <= 0)
            return ret < 0 ? ret : moved;
        moved = 1;
        xfer_advance(x);
        if (tcp->recv_ring)
            break;
    }
    return moved;
}

/* Receives and sends in turn for as long as either moves: 1 when anything moved, 0, or the
 * error. */
static int xfer_move(struct coll_xfer *x)
{
    int in, out, moved = 0;

    do {
        if ((in = move_some(x, true)) < 0)
            return in;
        if ((out = move_some(x, false)) < 0)
            return out;
        moved |= in | out;
    } while (in || out);
    return moved;
}

/* Waits for something x can move, the last move having been at last (ms): 0 when there may
 * be, or the error (a neighbour gone, nothing for the timeout, poll failing). */
static int xfer_wait(struct coll_xfer *x, int64_t last)
{
    struct coll *c = x->c;
    struct coll_tcp *tcp = x->tcp;
    bool want_recv = x->rt < x->nrecv;
    bool want_send = x->st < x->nsend && coll_xfer_send_limit(x) > x->so;
    int timeout_ms = coll_timeout_ms(c), ret;
    struct pollfd pfd[2];
    int64_t left;

    /* On shared rings alone, look a while before sleeping: the neighbour is likely a piece
     * away. */
    if ((want_recv || want_send) && (!want_recv || tcp->recv_ring) &&
        (!want_send || tcp->send_ring) && coll_shm_spin(x, want_recv, want_send))
        return 0;
    if (want_recv && tcp->recv_ring && coll_shm_recv_ready(x))
        return 0;
    if (want_recv && tcp->prev_closed) {
        coll_set_err(c, "rank %d (%s) closed the connection during %s", prev_rank(tcp),
                     tcp->prev_addr, x->what);
        return ring_fail(c, -ECONNRESET);
    }
    if (want_send && tcp->send_ring && coll_shm_send_ready(x))
        return 0;
    left = last + timeout_ms - monotime_ms();
    if (left <= 0) {
        if (want_recv)
            coll_set_err(c, "no data from rank %d (%s) for %d ms during %s", prev_rank(tcp),
                         tcp->prev_addr, timeout_ms, x->what);
        else
            coll_set_err(c, "rank %d (%s) took nothing for %d ms during %s", next_rank(tcp),
                         tcp->next_addr, timeout_ms, x->what);
        return ring_fail(c, -ETIMEDOUT);
    }
    /* The link from rank-1 while this rank waits for it: its data, or its doorbells. The
     * link to rank+1 only while there is something left to send it (once it has all it needs
     * from us it may finish and close before this rank has its own part): room over TCP,
     * doorbells over a shared ring, and its end closing. */
    pfd[0] =
        (struct pollfd){.fd = want_recv && !tcp->prev_closed ? tcp->recv_fd : -1, .events = POLLIN};
    pfd[1] = (struct pollfd){.fd = -1};
    if (x->st < x->nsend) {
        pfd[1] = (struct pollfd){.fd = tcp->send_fd, .events = POLLIN | POLLRDHUP};
        if (!tcp->send_ring && want_send)
            pfd[1].events |= POLLOUT;
    }
    ret = poll(pfd, 2, left > INT_MAX ? INT_MAX : (int)left);
    if (ret < 0 && errno != EINTR) {
        int e = errno;
        coll_set_err(c, "cannot poll the ring during %s: %s", x->what, errmsg_strerror(e));
        return ring_fail(c, -e);
    }
    if (ret <= 0)
        return 0;
    /* Over TCP the next recv() reads the data (or says what went wrong). */
    if (tcp->recv_ring && pfd[0].revents && (ret = drain(x, false)) < 0)
        return ret;
    if ((pfd[1].revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) && (ret = drain(x, true)) < 0)
        return ret;
    return 0;
}

static int xfer_run(struct coll_xfer *x)
{
    int64_t last = monotime_ms();
    int ret;

    x->st = x->rt = 0;
    xfer_load_send(x);
    xfer_load_recv(x);
    xfer_advance(x);
    while (x->st < x->nsend || x->rt < x->nrecv) {
        if ((ret = xfer_move(x)) < 0)
            return ret;
        if (ret > 0)
            last = monotime_ms();
        else if ((ret = xfer_wait(x, last)) < 0)
            return ret;
    }
    return 0;
}

/* --- allreduce and broadcast ---------------------------------------------------------------- */

/* The allreduce goes through the buffer in parts of W x COLL_RING_SEGMENT_BYTES (coll.h), each a
 * ring allreduce of its own. A part's first step sends the rank's own data, but like every
 * step it goes at the pace at which the step before (the last of the part before) comes in:
 * without that brake a rank ran ahead into later parts, its data left the cache before it
 * was passed on, and 4 ranks through shared memory measured 3.2-3.3 GB/s at 256 MiB instead
 * of 3.6-4.0. */

/* The elements of x per part, and the steps of one part. */
static size_t part_elems(const struct coll_xfer *x)
{
    return (size_t)x->tcp->world * (COLL_RING_SEGMENT_BYTES / x->elem);
}

static int part_steps(const struct coll_tcp *tcp)
{
    return 2 * (tcp->world - 1);
}

/* Segment k of the part that begins at element base: its n elements split into world
 * segments, the first n % world one element longer. */
static void segment(const struct coll_xfer *x, size_t base, int k, char **p, size_t *len)
{
    size_t n = x->n - base < part_elems(x) ? x->n - base : part_elems(x);
    size_t w = (size_t)x->tcp->world, q = n / w, r = n % w, kk = (size_t)k;
    size_t off = base + kk * q + (kk < r ? kk : r);

    *p = x->buf + off * x->elem;
    *len = (q + (kk < r)) * x->elem;
}

/* Within a part, steps 0..W-2 reduce-scatter, steps W-1..2W-3 all-gather. In the
 * reduce-scatter, step t sends segment rank-t and adds segment rank-t-1 into place, so that
 * after W-1 steps this rank holds the full sum of segment rank+1, whose additions went
 * around the ring in a fixed order; the all-gather then passes every finished segment around
 * as it is. */
static void allreduce_span(const struct coll_xfer *x, int t, bool send, char **p, size_t *len)
{
    int w = x->tcp->world, r = x->tcp->rank, steps = part_steps(x->tcp), u = t % steps, k;
    size_t base = (size_t)(t / steps) * part_elems(x);

    if (u < w - 1)
        k = send ? r - u : r - u - 1;
    else
        k = send ? r + 1 - (u - (w - 1)) : r - (u - (w - 1));
    segment(x, base, ((k % w) + w) % w, p, len);
}

static bool allreduce_reduces(const struct coll_xfer *x, int t)
{
    return t % part_steps(x->tcp) < x->tcp->world - 1;
}

static int tcp_allreduce(struct coll *c, void *buf, size_t n, enum coll_host_type t)
{
    struct coll_tcp *tcp = state(c);
    size_t per = (size_t)tcp->world * (COLL_RING_SEGMENT_BYTES / host_types[t].elem);
    size_t parts = n ? (n + per - 1) / per : 1;
    struct coll_xfer x = {
        .c = c,
        .tcp = tcp,
        .what = "allreduce",
        .nsend = (int)parts * part_steps(tcp),
        .nrecv = (int)parts * part_steps(tcp),
        .lag = 1,
        .span = allreduce_span,
        .reduce_step = allreduce_reduces,
        .add = host_types[t].add,
        .elem = host_types[t].elem,
        .buf = buf,
        .n = n,
    };

    if (parts > (size_t)(INT_MAX / part_steps(tcp))) {
        coll_set_err(c, "allreduce of %zu elements: more than %d steps around %d ranks", n, INT_MAX,
                     tcp->world);
        return -EINVAL;
    }
    return xfer_run(&x);
}

static void broadcast_span(const struct coll_xfer *x, int t, bool send, char **p, size_t *len)
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
    struct coll_tcp *tcp = state(c);
    struct coll_xfer x = {
        .c = c,
        .tcp = tcp,
        .what = "broadcast",
        .nsend = next_rank(tcp) == root ? 0 : 1,
        .nrecv = tcp->rank == root ? 0 : 1,
        .lag = tcp->rank == root ? 1 : 0,
        .span = broadcast_span,
        .elem = 1,
        .buf = buf,
        .n = bytes,
    };

    return xfer_run(&x);
}

/* --- set-up --------------------------------------------------------------------------------- */

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
        int64_t left = deadline - monotime_ms();
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
    struct coll_tcp *tcp = state(c);
    int fd = -1, ret = -1, soerr = 0, gai;
    socklen_t slen = sizeof(soerr);

    if (parse_addr_value(value, host, sizeof(host), port, sizeof(port), token) < 0) {
        coll_set_err(c, "rank %d published a malformed address '%.80s'", next_rank(tcp), value);
        ret = -EPROTO;
        goto out;
    }
    snprintf(tcp->next_addr, sizeof(tcp->next_addr), strchr(host, ':') ? "[%s]:%s" : "%s:%s", host,
             port);
    if ((gai = getaddrinfo(host, port, &hints, &ai)) != 0 || !ai) {
        coll_set_err(c, "cannot resolve rank %d's address '%s': %s", next_rank(tcp), tcp->next_addr,
                     gai_strerror(gai));
        ret = -EPROTO;
        goto out;
    }
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        ret = -errno;
        coll_set_err(c, "cannot create a socket: %s", errmsg_strerror(errno));
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
    make_hello(hello, seq, tcp->world, tcp->rank, next_rank(tcp), token, boot_id);
    if ((ret = io_full(fd, hello, sizeof(hello), true, deadline)) < 0) {
        coll_set_err(c, "cannot send the hello to rank %d (%s): %s", next_rank(tcp), tcp->next_addr,
                     errmsg_strerror(-ret));
        goto out;
    }
    tcp->send_fd = fd;
    fd = -1;
    ret = 0;
    goto out;
connect_failed:
    coll_set_err(c, "cannot connect to rank %d at '%s': %s", next_rank(tcp), tcp->next_addr,
                 errmsg_strerror(-ret));
out:
    if (fd >= 0)
        close(fd);
    if (ai)
        freeaddrinfo(ai);
    return ret;
}

/* Rank-1 runs on this machine: a shared ring for its link, offered in the ack (TCP stays, if
 * the ring cannot be made). */
static void offer_ring(struct coll *c, char *shm_name, unsigned char *ack)
{
    struct coll_tcp *tcp = state(c);
    int err = coll_shm_create(shm_name, ack + 9 + SHM_NAME_BYTES, &tcp->recv_ring);

    if (err < 0) {
        coll_set_err(c, "cannot make a shared ring for rank %d: %s", prev_rank(tcp),
                     errmsg_strerror(err));
        return;
    }
    ack[8] = 1;
    memcpy(ack + 9, shm_name, strlen(shm_name) + 1);
}

/* Accepts connections on lfd until one presents a hello with this rank's token (a connection
 * with another token is a stranger, closed and forgotten), checks that it comes from rank-1
 * for this same ring, and answers the ack. */
static int tcp_accept_prev(struct coll *c, int lfd, unsigned seq, const unsigned char *token,
                           const unsigned char *boot_id, char *shm_name, int64_t deadline)
{
    struct coll_tcp *tcp = state(c);
    unsigned char hello[HELLO_BYTES], ack[ACK_BYTES] = ACK_MAGIC;
    int fd = -1, ret = -1;

    for (;;) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);

        if ((ret = wait_fd(lfd, POLLIN, deadline)) < 0) {
            coll_set_err(c, "rank %d did not connect: %s", prev_rank(tcp), errmsg_strerror(-ret));
            goto out;
        }
        fd = accept4(lfd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED)
                continue;
            ret = -errno;
            coll_set_err(c, "cannot accept rank %d's connection: %s", prev_rank(tcp),
                         errmsg_strerror(errno));
            goto out;
        }
        format_addr((struct sockaddr *)&ss, tcp->prev_addr, sizeof(tcp->prev_addr));
        if ((ret = io_full(fd, hello, sizeof(hello), false, deadline)) == 0 &&
            !memcmp(hello, HELLO_MAGIC, 8) && !memcmp(hello + 24, token, TOKEN_BYTES))
            break;
        if (ret == -ETIMEDOUT) {
            coll_set_err(c, "no hello from '%s' (expected rank %d)", tcp->prev_addr,
                         prev_rank(tcp));
            goto out;
        }
        close_fd(&fd);
    }
    if (get_u32(hello + 8) != seq || get_u32(hello + 12) != (uint32_t)tcp->world ||
        get_u32(hello + 16) != (uint32_t)prev_rank(tcp) ||
        get_u32(hello + 20) != (uint32_t)tcp->rank) {
        coll_set_err(c,
                     "'%s' joined as rank %u of %u (ring %u) for rank %u; expected rank %d of %d "
                     "(ring %u) for rank %d",
                     tcp->prev_addr, get_u32(hello + 16), get_u32(hello + 12), get_u32(hello + 8),
                     get_u32(hello + 20), prev_rank(tcp), tcp->world, seq, tcp->rank);
        ret = -EPROTO;
        goto out;
    }
    if (coll_shm_same_machine(boot_id, hello + 24 + TOKEN_BYTES))
        offer_ring(c, shm_name, ack);
    if ((ret = io_full(fd, ack, sizeof(ack), true, deadline)) < 0) {
        coll_set_err(c, "cannot answer rank %d (%s): %s", prev_rank(tcp), tcp->prev_addr,
                     errmsg_strerror(-ret));
        goto out;
    }
    tcp->recv_fd = fd;
    fd = -1;
    ret = 0;
out:
    if (fd >= 0)
        close(fd);
    return ret;
}

/* The CPUs this process may run on (1 when that cannot be read), on machines of any size.
 * Ranks that a launcher pinned to one CPU each count as oversubscribed (struct coll_tcp):
 * they then yield where they could spin, which costs a system call per look, not progress. */
static int usable_cpus(void)
{
    long conf = sysconf(_SC_NPROCESSORS_CONF);
    int n = conf > CPU_SETSIZE ? (int)conf : CPU_SETSIZE, count = 1;
    cpu_set_t *set = CPU_ALLOC(n);
    size_t size = CPU_ALLOC_SIZE(n);

    if (set && sched_getaffinity(0, size, set) == 0 && CPU_COUNT_S(size, set) > 0)
        count = CPU_COUNT_S(size, set);
    CPU_FREE(set);
    return count;
}

/* The backend's state for c's rank (coll_state), links closed; NULL without memory. */
static struct coll_tcp *state_new(struct coll *c)
{
    struct coll_tcp *tcp = calloc(1, sizeof(*tcp));

    if (!tcp)
        return NULL;
    tcp->rank = coll_rank(c);
    tcp->world = coll_world_size(c);
    tcp->send_fd = tcp->recv_fd = -1;
    *coll_state(c) = tcp;
    return tcp;
}

static void describe(struct coll *c)
{
    struct coll_tcp *tcp = state(c);

    coll_set_describe(c, "tcp ring of %d ranks: to rank %d (%s) over %s, from rank %d (%s) over %s",
                      tcp->world, next_rank(tcp), tcp->next_addr,
                      tcp->send_ring ? "shared memory" : "tcp", prev_rank(tcp), tcp->prev_addr,
                      tcp->recv_ring ? "shared memory" : "tcp");
}

static int tcp_open(struct coll *c, struct gr *g)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE},
                    *ai = NULL;
    unsigned seq = coll_next_seq(g);
    unsigned char token[TOKEN_BYTES], ack[ACK_BYTES], boot_id[BOOT_ID_BYTES], yes = 0;
    char host[INET6_ADDRSTRLEN], key[64], value[ADDR_VALUE_MAX], *v, shm_name[SHM_NAME_BYTES] = "";
    struct sockaddr_storage ss;
    socklen_t slen = sizeof(ss);
    int64_t deadline = monotime_ms() + coll_timeout_ms(c);
    int lfd = -1, ret = -1, gai, port;
    size_t vlen = 0;
    struct coll_tcp *tcp = state_new(c);

    if (!tcp) {
        coll_set_err(c, "out of memory for the ring");
        ret = -ENOMEM;
        goto out;
    }
    if (!g) {
        coll_set_err(c, "the tcp backend needs the rank library for %d ranks", tcp->world);
        ret = -EINVAL;
        goto out;
    }
    tcp->oversubscribed = gr_local_world_size(g) > usable_cpus();
    tcp->scratch = malloc(CHUNK_BYTES);
    if (!tcp->scratch) {
        coll_set_err(c, "out of memory for the ring's buffer");
        ret = -ENOMEM;
        goto out;
    }
    if (getrandom(token, sizeof(token), 0) != (ssize_t)sizeof(token)) {
        ret = -errno;
        coll_set_err(c, "cannot draw the ring's token: %s", errmsg_strerror(errno));
        goto out;
    }
    own_addr(host, sizeof(host));
    if ((gai = getaddrinfo(host, "0", &hints, &ai)) != 0 || !ai) {
        coll_set_err(c, "cannot use '%s' as this node's address: %s", host, gai_strerror(gai));
        ret = -EINVAL;
        goto out;
    }
    lfd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0) {
        ret = -errno;
        coll_set_err(c, "cannot create a socket: %s", errmsg_strerror(errno));
        goto out;
    }
    tune_socket(lfd);
    if (bind(lfd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(lfd, 16) < 0 ||
        getsockname(lfd, (struct sockaddr *)&ss, &slen) < 0) {
        ret = -errno;
        coll_set_err(c, "cannot listen on '%s': %s", host, errmsg_strerror(errno));
        goto out;
    }
    port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                          : ((struct sockaddr_in *)&ss)->sin_port);
    v = value + snprintf(value, sizeof(value), "%s %d ", host, port);
    for (int i = 0; i < TOKEN_BYTES; i++)
        v += snprintf(v, 3, "%02x", token[i]);
    snprintf(key, sizeof(key), "coll/%u/addr/%d", seq, tcp->rank);
    if ((ret = gr_kv_put(g, key, value, strlen(value))) < 0) {
        coll_set_err(c, "cannot publish '%s': %s", key, gr_strerror(g));
        goto out;
    }
    snprintf(key, sizeof(key), "coll/%u/addr/%d", seq, next_rank(tcp));
    ret = gr_kv_get(g, key, value, sizeof(value) - 1, &vlen, coll_timeout_ms(c));
    if (ret < 0) {
        coll_set_err(c, "cannot read rank %d's address '%s': %s", next_rank(tcp), key,
                     gr_strerror(g));
        goto out;
    }
    value[vlen] = '\0';
    /* Every rank connects to rank+1 first, then accepts rank-1, then reads rank+1's answer
     * and confirms, then reads rank-1's confirmation: each wait is for a step its peer takes
     * before waiting itself, so the ring forms whatever the order the ranks arrive in. */
    coll_shm_machine(boot_id);
    if ((ret = tcp_connect_next(c, value, seq, boot_id, deadline)) < 0 ||
        (ret = tcp_accept_prev(c, lfd, seq, token, boot_id, shm_name, deadline)) < 0)
        goto out;
    if ((ret = io_full(tcp->send_fd, ack, sizeof(ack), false, deadline)) < 0 ||
        memcmp(ack, ACK_MAGIC, 8)) {
        coll_set_err(c, "rank %d (%s) did not accept the connection: %s", next_rank(tcp),
                     tcp->next_addr, ret < 0 ? errmsg_strerror(-ret) : "wrong answer");
        ret = ret < 0 ? ret : -EPROTO;
        goto out;
    }
    ack[9 + SHM_NAME_BYTES - 1] = '\0';
    yes =
        ack[8] == 1 && coll_shm_attach((char *)ack + 9, ack + 9 + SHM_NAME_BYTES, &tcp->send_ring);
    if ((ret = io_full(tcp->send_fd, &yes, 1, true, deadline)) < 0 ||
        (ret = io_full(tcp->recv_fd, &yes, 1, false, deadline)) < 0) {
        coll_set_err(c, "cannot agree on the links with ranks %d and %d: %s", next_rank(tcp),
                     prev_rank(tcp), errmsg_strerror(-ret));
        goto out;
    }
    if (yes != 1)
        coll_shm_detach(&tcp->recv_ring);
    describe(c);
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
    struct coll_tcp *tcp = state(c);

    if (!tcp)
        return;
    coll_shm_detach(&tcp->send_ring);
    coll_shm_detach(&tcp->recv_ring);
    close_fd(&tcp->send_fd);
    close_fd(&tcp->recv_fd);
    free(tcp->scratch);
    free(tcp);
    *coll_state(c) = NULL;
}

const struct coll_backend coll_tcp_backend = {
    .name = "tcp",
    .open = tcp_open,
    .allreduce = tcp_allreduce,
    .broadcast = tcp_broadcast,
    .close = tcp_close,
};
