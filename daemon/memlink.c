/* A node's memory link (memlink.h): its listener, the links it serves, and its worker, which
 * sends the node's copies to their holder and fetches the ones the node lacks. */
#include "memlink.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>

#include "errmsg.h"
#include "frame.h"
#include "proto.h"
#include "banned.h"

/* A sealed frame's largest payload: a chunk, or a message. */
#define SEALED_MAX      (MEMLINK_CHUNK + AUTH_OVERHEAD)
/* Events kept for the loop; past this, the ones that only inform (sent, received) are
 * dropped, never a fetch's answer. */
#define EVENTS_SOFT_MAX 1024

enum job_kind { JOB_PUSH, JOB_FETCH };

struct job {
    struct job *next;
    enum job_kind kind;
    int rank;
    char name[MEMCKPT_NAME_MAX + 1];
    uint64_t cookie;
};

/* One end of an established link: its socket, session and a buffer of one sealed frame. */
struct link {
    int fd;
    struct auth_session sess;
    uint8_t *buf; /* FRAME_HDR_LEN + SEALED_MAX bytes */
};

struct memlink {
    struct memckpt *m;
    struct auth_key key;
    void (*wake)(void *ctx);
    void *ctx;
    int lfd, port;
    int stop_pipe[2];
    pthread_t acceptor, worker;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* a job queued, a link ended, a stop */
    bool stopping;
    char holder_addr[64]; /* where the worker sends and fetches; "" none */
    int holder_port;
    unsigned holder_gen; /* changes with the holder: the worker's link is then stale */
    struct job *jobs, **jobs_tail;
    struct memlink_event *events;
    size_t nevents, events_alloc;
    int conns[MEMLINK_CONNS_MAX]; /* the served links' sockets, -1: free */
    int nconns;
    int worker_fd; /* the worker's link's socket, -1: none (for the stop's shutdown) */
    uint64_t sent, received;
};

/* --- plain I/O with timeouts (SO_RCVTIMEO/SO_SNDTIMEO set on every socket) ----------------- */

static int write_all(int fd, const void *p, size_t n)
{
    const uint8_t *b = p;

    while (n > 0) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
        }
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads n bytes. -ECONNRESET at the end of the stream, -ETIMEDOUT after MEMLINK_IO_MS of
 * silence; with idle_ok, a silence before the first byte is -EAGAIN (a link between
 * messages). */
static int read_all(int fd, void *p, size_t n, bool idle_ok)
{
    uint8_t *b = p;
    size_t got = 0;

    while (got < n) {
        ssize_t r = recv(fd, b + got, n - got, 0);
        if (r == 0)
            return -ECONNRESET;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return got == 0 && idle_ok ? -EAGAIN : -ETIMEDOUT;
            return -errno;
        }
        got += (size_t)r;
    }
    return 0;
}

static int send_frame(int fd, const uint8_t *payload, size_t n)
{
    uint8_t hdr[FRAME_HDR_LEN];
    int ret;

    frame_put_header(hdr, (uint32_t)n);
    ret = write_all(fd, hdr, sizeof(hdr));
    return ret < 0 ? ret : write_all(fd, payload, n);
}

/* A frame of 1..max bytes into buf; its length in *n. */
static int recv_frame(int fd, uint8_t *buf, size_t max, size_t *n, bool idle_ok)
{
    uint8_t hdr[FRAME_HDR_LEN];
    uint32_t len;
    int ret = read_all(fd, hdr, sizeof(hdr), idle_ok);

    if (ret < 0)
        return ret;
    len = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
    if (len == 0 || len > max)
        return -EMSGSIZE;
    *n = len;
    return read_all(fd, buf, len, false);
}

/* --- sealed frames -------------------------------------------------------------------------- */

/* Seals the n bytes at link->buf + FRAME_HDR_LEN + AUTH_SEQ_LEN and sends them. */
static int send_sealed(struct link *c, size_t n)
{
    frame_put_header(c->buf, (uint32_t)(n + AUTH_OVERHEAD));
    auth_seal(&c->sess, c->buf + FRAME_HDR_LEN, n);
    return write_all(c->fd, c->buf, FRAME_HDR_LEN + n + AUTH_OVERHEAD);
}

static int recv_sealed(struct link *c, const uint8_t **msg, size_t *n, bool idle_ok)
{
    size_t len;
    int ret = recv_frame(c->fd, c->buf, SEALED_MAX, &len, idle_ok);

    if (ret < 0)
        return ret;
    return auth_open(&c->sess, c->buf, len, msg, n) < 0 ? -EBADMSG : 0;
}

/* Sends message o (taken: decref'd here); NULL (proto_pack refused it) is -EINVAL. */
static int send_msg(struct link *c, json_t *o)
{
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    size_t n = text ? strlen(text) : 0;
    int ret;

    json_decref(o);
    if (!text)
        return -EINVAL;
    if (n > MEMLINK_CHUNK) {
        free(text);
        return -EMSGSIZE;
    }
    memcpy(c->buf + FRAME_HDR_LEN + AUTH_SEQ_LEN, text, n);
    free(text);
    ret = send_sealed(c, n);
    return ret;
}

static int recv_msg(struct link *c, struct msg *m, bool idle_ok, struct errmsg *why)
{
    const uint8_t *p;
    size_t n;
    struct proto_error perr;
    int ret = recv_sealed(c, &p, &n, idle_ok);

    if (ret < 0)
        return ret;
    if (proto_decode(p, n, m, &perr) < 0) {
        *why = perr.why;
        return -EPROTO;
    }
    return 0;
}

static int send_error(struct link *c, json_int_t id, const char *code, const char *text)
{
    return send_msg(c, proto_pack("{s:s, s:I, s:s, s:s}", "type", "error", "id", id, "code", code,
                                  "msg", text));
}

/* The bytes of the open copy fd, size of them, in sealed chunks. A file shorter than size
 * (it cannot be: a copy is renamed whole) cuts the link. */
static int send_copy(struct link *c, int fd, uint64_t size)
{
    uint64_t off = 0;

    while (off < size) {
        size_t n = size - off < MEMLINK_CHUNK ? (size_t)(size - off) : MEMLINK_CHUNK;
        uint8_t *p = c->buf + FRAME_HDR_LEN + AUTH_SEQ_LEN;
        size_t got = 0;
        int ret;

        while (got < n) {
            ssize_t r = pread(fd, p + got, n - got, (off_t)(off + got));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                return r < 0 ? -errno : -EIO;
            got += (size_t)r;
        }
        ret = send_sealed(c, n);
        if (ret < 0)
            return ret;
        off += n;
    }
    return 0;
}

/* Receives size bytes of rank's name into the store's incoming file and keeps it as the
 * copy of step; on any failure the file is removed and the older copy stays. */
static int recv_copy(struct memlink *l, struct link *c, int rank, const char *name, int64_t step,
                     uint64_t size, struct errmsg *err)
{
    char path[4200];
    uint64_t got = 0;
    int fd, ret = 0;

    if (memckpt_in_path(l->m, rank, name, path, sizeof(path)) < 0)
        return errmsg_set(err, -EINVAL, "'%.80s' is not a memory checkpoint's name", name);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return errmsg_set(err, -errno, "cannot write '%s': %s", path, strerror(errno));
    while (got < size) {
        const uint8_t *p;
        size_t n;
        ret = recv_sealed(c, &p, &n, false);
        if (ret < 0) {
            errmsg_set(err, ret, "the transfer was cut at byte %llu of %llu: %s",
                       (unsigned long long)got, (unsigned long long)size,
                       ret == -EBADMSG ? "a frame failed its tag" : strerror(-ret));
            break;
        }
        if (n > size - got) {
            ret = errmsg_set(err, -EPROTO, "more bytes than the %llu announced",
                             (unsigned long long)size);
            break;
        }
        if (write(fd, p, n) != (ssize_t)n) {
            ret = errmsg_set(err, errno ? -errno : -ENOSPC, "cannot write '%s': %s", path,
                             strerror(errno ? errno : ENOSPC));
            break;
        }
        got += n;
    }
    if (close(fd) < 0 && ret == 0)
        ret = errmsg_set(err, -errno, "cannot write '%s': %s", path, strerror(errno));
    if (ret == 0)
        ret = memckpt_keep_from(l->m, rank, name, step, path, err);
    if (ret < 0)
        unlink(path);
    else {
        pthread_mutex_lock(&l->lock);
        l->received += size;
        pthread_mutex_unlock(&l->lock);
    }
    return ret;
}

/* --- events for the loop -------------------------------------------------------------------- */

static void event_add(struct memlink *l, const struct memlink_event *e)
{
    bool informs = e->kind == MEMLINK_SENT || e->kind == MEMLINK_RECEIVED;

    pthread_mutex_lock(&l->lock);
    if (informs && l->nevents >= EVENTS_SOFT_MAX) {
        pthread_mutex_unlock(&l->lock);
        return;
    }
    if (l->nevents == l->events_alloc) {
        size_t na = l->events_alloc ? 2 * l->events_alloc : 16;
        struct memlink_event *ne = realloc(l->events, na * sizeof(*ne));
        if (!ne) {
            pthread_mutex_unlock(&l->lock);
            return;
        }
        l->events = ne;
        l->events_alloc = na;
    }
    l->events[l->nevents++] = *e;
    pthread_mutex_unlock(&l->lock);
    if (l->wake)
        l->wake(l->ctx);
}

static void event_of(struct memlink_event *e, enum memlink_event_kind kind, int rank,
                     const char *name)
{
    memset(e, 0, sizeof(*e));
    e->kind = kind;
    e->rank = rank;
    snprintf(e->name, sizeof(e->name), "%s", name);
}

size_t memlink_take(struct memlink *l, struct memlink_event *out, size_t max)
{
    size_t n;

    pthread_mutex_lock(&l->lock);
    n = l->nevents < max ? l->nevents : max;
    if (n == 0) {
        pthread_mutex_unlock(&l->lock);
        return 0;
    }
    memcpy(out, l->events, n * sizeof(*out));
    memmove(l->events, l->events + n, (l->nevents - n) * sizeof(*out));
    l->nevents -= n;
    pthread_mutex_unlock(&l->lock);
    return n;
}

void memlink_bytes(struct memlink *l, uint64_t *sent, uint64_t *received)
{
    pthread_mutex_lock(&l->lock);
    *sent = l->sent;
    *received = l->received;
    pthread_mutex_unlock(&l->lock);
}

/* --- the served side ------------------------------------------------------------------------ */

static void set_timeouts(int fd)
{
    struct timeval tv = {MEMLINK_IO_MS / 1000, (MEMLINK_IO_MS % 1000) * 1000};
    int one = 1;

    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static int server_handshake(struct memlink *l, struct link *c)
{
    struct auth_handshake hs;
    uint8_t chal[AUTH_CHAL_LEN];
    size_t n;
    int ret = recv_frame(c->fd, c->buf, AUTH_HELLO_LEN, &n, false);

    if (ret < 0 || auth_server_challenge(&hs, &l->key, c->buf, n, chal) < 0 ||
        send_frame(c->fd, chal, sizeof(chal)) < 0 ||
        recv_frame(c->fd, c->buf, AUTH_PROOF_LEN, &n, false) < 0)
        ret = -EACCES;
    else
        ret = auth_server_finish(&hs, c->buf, n, &c->sess);
    memset(&hs, 0, sizeof(hs));
    return ret;
}

/* A peer's copy: said ok to when it fits, then received and kept. */
static int serve_put(struct memlink *l, struct link *c, const struct msg *m)
{
    struct memlink_event e;
    struct errmsg err;
    int ret;

    event_of(&e, MEMLINK_REFUSED, m->rank, m->key);
    e.step = m->step;
    e.size = (uint64_t)m->size;
    if (!proto_mem_name_ok(m->key) || m->rank < 0 || m->size < 0 || m->step < 0) {
        snprintf(e.why, sizeof(e.why), "a bad copy: rank %d, name '%.64s'", m->rank, m->key);
        e.ret = -EINVAL;
        event_add(l, &e);
        return send_error(c, m->id, "bad_name", e.why);
    }
    if (!memckpt_would_fit(l->m, m->rank, m->key, (uint64_t)m->size)) {
        snprintf(e.why, sizeof(e.why),
                 "rank %d's copy of '%s' (%lld bytes) does not fit this node's --mem-ckpt-max "
                 "beside what it keeps",
                 m->rank, m->key, (long long)m->size);
        e.ret = -ENOSPC;
        event_add(l, &e);
        return send_error(c, m->id, "no_space", e.why);
    }
    ret = send_msg(c, proto_pack("{s:s, s:I}", "type", "ok", "id", m->id));
    if (ret < 0)
        return ret;
    ret = recv_copy(l, c, m->rank, m->key, m->step, (uint64_t)m->size, &err);
    if (ret < 0) {
        e.ret = ret;
        snprintf(e.why, sizeof(e.why), "%.500s", err.text);
        event_add(l, &e);
        /* A cut link cannot answer; a copy refused after its bytes can. */
        if (ret == -ECONNRESET || ret == -ETIMEDOUT || ret == -EBADMSG || ret == -EPROTO ||
            ret == -EPIPE)
            return ret;
        return send_error(c, m->id, ret == -ENOSPC ? "no_space" : "bad_request", err.text);
    }
    e.kind = MEMLINK_RECEIVED;
    event_add(l, &e);
    return send_msg(c, proto_pack("{s:s, s:I}", "type", "ok", "id", m->id));
}

/* A peer's fetch: the copy as a mem_put and its bytes, or not_found. */
static int serve_get(struct memlink *l, struct link *c, const struct msg *m)
{
    int64_t step;
    uint64_t size;
    int fd = memckpt_open_copy(l->m, m->rank, m->key, &step, &size), ret;

    if (fd < 0)
        return send_error(c, m->id, "not_found", "no copy of that rank's state here");
    ret = send_msg(c, proto_pack("{s:s, s:I, s:i, s:s, s:I, s:I}", "type", "mem_put", "id", m->id,
                                 "rank", m->rank, "name", m->key, "step", (json_int_t)step, "size",
                                 (json_int_t)size));
    if (ret == 0)
        ret = send_copy(c, fd, size);
    close(fd);
    if (ret == 0) {
        pthread_mutex_lock(&l->lock);
        l->sent += size;
        pthread_mutex_unlock(&l->lock);
    }
    return ret;
}

struct served {
    struct memlink *l;
    int slot;
};

static bool stopping(struct memlink *l)
{
    bool s;

    pthread_mutex_lock(&l->lock);
    s = l->stopping;
    pthread_mutex_unlock(&l->lock);
    return s;
}

static void *serve_main(void *arg)
{
    struct served *sv = arg;
    struct memlink *l = sv->l;
    struct link c = {.fd = l->conns[sv->slot]};

    c.buf = malloc(FRAME_HDR_LEN + SEALED_MAX);
    if (c.buf && server_handshake(l, &c) == 0) {
        for (;;) {
            struct msg m;
            struct errmsg why = {""};
            int ret = recv_msg(&c, &m, true, &why);
            if (ret == -EAGAIN && !stopping(l))
                continue;
            if (ret < 0)
                break;
            if (m.type == MSG_MEM_PUT)
                ret = serve_put(l, &c, &m);
            else if (m.type == MSG_MEM_GET)
                ret = serve_get(l, &c, &m);
            else {
                send_error(&c, m.id, "bad_request", "a memory link carries mem_put and mem_get");
                ret = -EPROTO;
            }
            proto_msg_release(&m);
            if (ret < 0)
                break;
        }
    }
    auth_session_release(&c.sess);
    free(c.buf);
    pthread_mutex_lock(&l->lock);
    close(l->conns[sv->slot]);
    l->conns[sv->slot] = -1;
    l->nconns--;
    pthread_cond_broadcast(&l->cond);
    pthread_mutex_unlock(&l->lock);
    free(sv);
    return NULL;
}

static void *accept_main(void *arg)
{
    struct memlink *l = arg;

    for (;;) {
        struct pollfd p[2] = {{.fd = l->lfd, .events = POLLIN},
                              {.fd = l->stop_pipe[0], .events = POLLIN}};
        struct served *sv;
        pthread_t t;
        int fd, slot = -1;

        if (poll(p, 2, -1) < 0 && errno != EINTR)
            break;
        if (p[1].revents)
            break;
        if (!(p[0].revents & POLLIN))
            continue;
        fd = accept4(l->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        set_timeouts(fd);
        pthread_mutex_lock(&l->lock);
        for (int i = 0; i < MEMLINK_CONNS_MAX && slot < 0 && !l->stopping; i++)
            if (l->conns[i] < 0)
                slot = i;
        sv = slot >= 0 ? malloc(sizeof(*sv)) : NULL;
        if (sv) {
            l->conns[slot] = fd;
            l->nconns++;
            *sv = (struct served){l, slot};
        }
        pthread_mutex_unlock(&l->lock);
        if (!sv) {
            close(fd);
            continue;
        }
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, serve_main, sv) != 0) {
            pthread_mutex_lock(&l->lock);
            close(fd);
            l->conns[slot] = -1;
            l->nconns--;
            pthread_mutex_unlock(&l->lock);
            free(sv);
        }
        pthread_attr_destroy(&attr);
    }
    return NULL;
}

/* --- the worker ----------------------------------------------------------------------------- */

static void link_close(struct memlink *l, struct link *c)
{
    pthread_mutex_lock(&l->lock);
    l->worker_fd = -1;
    pthread_mutex_unlock(&l->lock);
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    auth_session_release(&c->sess);
}

static int link_open(struct memlink *l, struct link *c, const char *addr, int port,
                     struct errmsg *err)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST}, *ai = NULL;
    struct auth_handshake hs;
    uint8_t hello[AUTH_HELLO_LEN], proof[AUTH_PROOF_LEN];
    char ports[16];
    size_t n;
    int fd, ret;

    snprintf(ports, sizeof(ports), "%d", port);
    ret = getaddrinfo(addr, ports, &hints, &ai);
    if (ret != 0)
        return errmsg_set(err, -EINVAL, "'%s' is not an address: %s", addr, gai_strerror(ret));
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(ai);
        return errmsg_set(err, -errno, "socket: %s", strerror(errno));
    }
    set_timeouts(fd);
    pthread_mutex_lock(&l->lock);
    l->worker_fd = fd;
    ret = l->stopping ? -ECANCELED : 0;
    pthread_mutex_unlock(&l->lock);
    c->fd = fd;
    if (ret == 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) < 0)
        ret = -errno;
    freeaddrinfo(ai);
    if (ret < 0) {
        link_close(l, c);
        return errmsg_set(err, ret, "cannot connect to %s port %d: %s", addr, port, strerror(-ret));
    }
    if (auth_client_hello(&hs, &l->key, hello) < 0 || send_frame(fd, hello, sizeof(hello)) < 0 ||
        recv_frame(fd, c->buf, AUTH_CHAL_LEN, &n, false) < 0 ||
        auth_client_proof(&hs, c->buf, n, proof, &c->sess) < 0 ||
        send_frame(fd, proof, sizeof(proof)) < 0) {
        memset(&hs, 0, sizeof(hs));
        link_close(l, c);
        return errmsg_set(err, -EACCES, "the memory link to %s port %d did not authenticate", addr,
                          port);
    }
    memset(&hs, 0, sizeof(hs));
    return 0;
}

/* Waits for the answer to request id: ok (0), or the error's text in err. */
static int await_ok(struct link *c, json_int_t id, struct errmsg *err)
{
    struct msg m;
    int ret = recv_msg(c, &m, false, err);

    if (ret < 0)
        return ret == -EPROTO ? ret : errmsg_set(err, ret, "%s", strerror(-ret));
    if (m.type == MSG_OK && m.id == id)
        ret = 0;
    else if (m.type == MSG_ERROR)
        ret = errmsg_set(err, !strcmp(m.key, "no_space") ? -ENOSPC : -EREMOTEIO, "%s", m.value);
    else
        ret = errmsg_set(err, -EPROTO, "an answer of type '%s'", proto_type_name(m.type));
    proto_msg_release(&m);
    return ret;
}

static int do_push(struct memlink *l, struct link *c, const struct job *j, json_int_t id,
                   struct memlink_event *e, struct errmsg *err)
{
    int64_t step;
    uint64_t size;
    int fd = memckpt_open_copy(l->m, j->rank, j->name, &step, &size), ret;

    if (fd < 0)
        return errmsg_set(err, fd, "no copy of rank %d's '%s' here", j->rank, j->name);
    e->step = step;
    e->size = size;
    ret = send_msg(c, proto_pack("{s:s, s:I, s:i, s:s, s:I, s:I}", "type", "mem_put", "id", id,
                                 "rank", j->rank, "name", j->name, "step", (json_int_t)step, "size",
                                 (json_int_t)size));
    if (ret < 0)
        errmsg_set(err, ret, "%s", strerror(-ret));
    else if ((ret = await_ok(c, id, err)) == 0) {
        ret = send_copy(c, fd, size);
        if (ret < 0)
            errmsg_set(err, ret, "%s", strerror(-ret));
        else
            ret = await_ok(c, id, err);
    }
    close(fd);
    if (ret == 0) {
        pthread_mutex_lock(&l->lock);
        l->sent += size;
        pthread_mutex_unlock(&l->lock);
    }
    return ret;
}

static int do_fetch(struct memlink *l, struct link *c, const struct job *j, json_int_t id,
                    struct memlink_event *e, struct errmsg *err)
{
    struct msg m;
    int ret = send_msg(c, proto_pack("{s:s, s:I, s:i, s:s}", "type", "mem_get", "id", id, "rank",
                                     j->rank, "name", j->name));

    if (ret < 0)
        return errmsg_set(err, ret, "%s", strerror(-ret));
    ret = recv_msg(c, &m, false, err);
    if (ret < 0)
        return ret == -EPROTO ? ret : errmsg_set(err, ret, "%s", strerror(-ret));
    if (m.type == MSG_ERROR)
        ret = errmsg_set(err, !strcmp(m.key, "not_found") ? -ENOENT : -EREMOTEIO, "%s", m.value);
    else if (m.type != MSG_MEM_PUT || m.id != id || m.rank != j->rank || strcmp(m.key, j->name) ||
             m.size < 0)
        ret = errmsg_set(err, -EPROTO, "an answer that is not the copy asked for");
    else if (!memckpt_would_fit(l->m, j->rank, j->name, (uint64_t)m.size))
        /* Its bytes are on their way: the link is closed under them. */
        ret = errmsg_set(err, -EPIPE,
                         "rank %d's copy of '%s' (%lld bytes) does not fit this node's "
                         "--mem-ckpt-max beside what it keeps",
                         j->rank, j->name, (long long)m.size);
    else {
        e->step = m.step;
        e->size = (uint64_t)m.size;
        ret = recv_copy(l, c, j->rank, j->name, m.step, (uint64_t)m.size, err);
    }
    proto_msg_release(&m);
    return ret;
}

/* An error after which the link is no longer in step: it is closed. */
static bool link_broken(int ret)
{
    return ret != 0 && ret != -ENOENT && ret != -ENOSPC && ret != -EREMOTEIO;
}

static void *worker_main(void *arg)
{
    struct memlink *l = arg;
    struct link c = {.fd = -1};
    unsigned gen = 0;
    json_int_t id = 0;

    c.buf = malloc(FRAME_HDR_LEN + SEALED_MAX);
    for (;;) {
        struct job *j;
        char addr[64];
        int port;
        unsigned hgen;

        pthread_mutex_lock(&l->lock);
        while (!l->jobs && !l->stopping)
            pthread_cond_wait(&l->cond, &l->lock);
        if (l->stopping) {
            pthread_mutex_unlock(&l->lock);
            break;
        }
        j = l->jobs;
        l->jobs = j->next;
        if (!l->jobs)
            l->jobs_tail = &l->jobs;
        snprintf(addr, sizeof(addr), "%s", l->holder_addr);
        port = l->holder_port;
        hgen = l->holder_gen;
        pthread_mutex_unlock(&l->lock);

        struct memlink_event e;
        struct errmsg err = {""};
        int ret = 0;

        event_of(&e, j->kind == JOB_PUSH ? MEMLINK_SENT : MEMLINK_FETCHED, j->rank, j->name);
        e.cookie = j->cookie;
        if (c.fd >= 0 && hgen != gen)
            link_close(l, &c);
        /* A link kept from an earlier job may have been closed by its holder since: one
         * more try on a new one. */
        for (int attempt = 0; attempt < 2; attempt++) {
            bool reused = c.fd >= 0;
            if (!c.buf)
                ret = errmsg_set(&err, -ENOMEM, "out of memory");
            else if (!addr[0] || port <= 0)
                ret = errmsg_set(&err, -ENOENT, "no node keeps this node's memory checkpoints");
            else if (c.fd < 0 && (ret = link_open(l, &c, addr, port, &err)) == 0)
                gen = hgen;
            if (c.fd < 0)
                break;
            ret = j->kind == JOB_PUSH ? do_push(l, &c, j, ++id, &e, &err)
                                      : do_fetch(l, &c, j, ++id, &e, &err);
            if (link_broken(ret))
                link_close(l, &c);
            if (!link_broken(ret) || !reused || stopping(l))
                break;
        }
        e.ret = ret;
        if (ret < 0) {
            if (j->kind == JOB_PUSH)
                e.kind = MEMLINK_SEND_FAILED;
            snprintf(e.why, sizeof(e.why), "%.500s", err.text);
        }
        free(j);
        event_add(l, &e);
    }
    link_close(l, &c);
    free(c.buf);
    return NULL;
}

static void job_add(struct memlink *l, enum job_kind kind, int rank, const char *name,
                    uint64_t cookie)
{
    struct job *j;

    pthread_mutex_lock(&l->lock);
    if (kind == JOB_PUSH)
        for (j = l->jobs; j; j = j->next)
            if (j->kind == JOB_PUSH && j->rank == rank && !strcmp(j->name, name)) {
                pthread_mutex_unlock(&l->lock);
                return;
            }
    j = calloc(1, sizeof(*j));
    if (j) {
        j->kind = kind;
        j->rank = rank;
        j->cookie = cookie;
        snprintf(j->name, sizeof(j->name), "%s", name);
        *l->jobs_tail = j;
        l->jobs_tail = &j->next;
        pthread_cond_broadcast(&l->cond);
    }
    pthread_mutex_unlock(&l->lock);
    if (!j && kind == JOB_FETCH) {
        struct memlink_event e;
        event_of(&e, MEMLINK_FETCHED, rank, name);
        e.cookie = cookie;
        e.ret = -ENOMEM;
        snprintf(e.why, sizeof(e.why), "out of memory");
        event_add(l, &e);
    }
}

void memlink_push(struct memlink *l, int rank, const char *name)
{
    job_add(l, JOB_PUSH, rank, name, 0);
}

void memlink_fetch(struct memlink *l, int rank, const char *name, uint64_t cookie)
{
    job_add(l, JOB_FETCH, rank, name, cookie);
}

bool memlink_set_holder(struct memlink *l, const char *addr, int port)
{
    bool changed;

    if (!addr || port <= 0) {
        addr = "";
        port = 0;
    }
    pthread_mutex_lock(&l->lock);
    changed = strcmp(l->holder_addr, addr) || l->holder_port != port;
    if (changed) {
        snprintf(l->holder_addr, sizeof(l->holder_addr), "%s", addr);
        l->holder_port = port;
        l->holder_gen++;
    }
    pthread_mutex_unlock(&l->lock);
    return changed;
}

/* --- start and stop ------------------------------------------------------------------------- */

static int listen_on(const char *addr, int *port)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_PASSIVE},
                    *ai = NULL;
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int fd, ret = getaddrinfo(addr, "0", &hints, &ai), one = 1;

    if (ret != 0)
        return -EINVAL;
    fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        ret = -errno;
        freeaddrinfo(ai);
        return ret;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, MEMLINK_CONNS_MAX) < 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &len) < 0) {
        ret = -errno;
        close(fd);
        freeaddrinfo(ai);
        return ret;
    }
    freeaddrinfo(ai);
    *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                           : ((struct sockaddr_in *)&ss)->sin_port);
    return fd;
}

int memlink_start(struct memckpt *m, const struct auth_key *key, const char *bind_addr,
                  void (*wake)(void *ctx), void *ctx, struct memlink **out)
{
    struct memlink *l = calloc(1, sizeof(*l));
    int ret;

    *out = NULL;
    if (!l)
        return -ENOMEM;
    l->m = m;
    l->key = *key;
    l->wake = wake;
    l->ctx = ctx;
    l->jobs_tail = &l->jobs;
    l->worker_fd = -1;
    for (int i = 0; i < MEMLINK_CONNS_MAX; i++)
        l->conns[i] = -1;
    pthread_mutex_init(&l->lock, NULL);
    pthread_cond_init(&l->cond, NULL);
    l->lfd = listen_on(bind_addr, &l->port);
    if (l->lfd < 0) {
        ret = l->lfd;
        goto fail;
    }
    if (pipe2(l->stop_pipe, O_CLOEXEC) < 0) {
        ret = -errno;
        close(l->lfd);
        goto fail;
    }
    if (pthread_create(&l->acceptor, NULL, accept_main, l) != 0) {
        ret = -EAGAIN;
        goto fail_pipe;
    }
    if (pthread_create(&l->worker, NULL, worker_main, l) != 0) {
        (void)!write(l->stop_pipe[1], "x", 1);
        pthread_join(l->acceptor, NULL);
        ret = -EAGAIN;
        goto fail_pipe;
    }
    *out = l;
    return 0;
fail_pipe:
    close(l->stop_pipe[0]);
    close(l->stop_pipe[1]);
    close(l->lfd);
fail:
    pthread_cond_destroy(&l->cond);
    pthread_mutex_destroy(&l->lock);
    free(l);
    return ret;
}

int memlink_port(const struct memlink *l)
{
    return l->port;
}

void memlink_stop(struct memlink *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->lock);
    l->stopping = true;
    pthread_cond_broadcast(&l->cond);
    if (l->worker_fd >= 0)
        shutdown(l->worker_fd, SHUT_RDWR);
    for (int i = 0; i < MEMLINK_CONNS_MAX; i++)
        if (l->conns[i] >= 0)
            shutdown(l->conns[i], SHUT_RDWR);
    pthread_mutex_unlock(&l->lock);
    (void)!write(l->stop_pipe[1], "x", 1);
    pthread_join(l->acceptor, NULL);
    pthread_join(l->worker, NULL);
    pthread_mutex_lock(&l->lock);
    while (l->nconns > 0)
        pthread_cond_wait(&l->cond, &l->lock);
    pthread_mutex_unlock(&l->lock);
    close(l->lfd);
    close(l->stop_pipe[0]);
    close(l->stop_pipe[1]);
    while (l->jobs) {
        struct job *j = l->jobs;
        l->jobs = j->next;
        free(j);
    }
    free(l->events);
    pthread_cond_destroy(&l->cond);
    pthread_mutex_destroy(&l->lock);
    memset(&l->key, 0, sizeof(l->key));
    free(l);
}
