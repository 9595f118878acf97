/* Framed, authenticated connections on libuv. A peer is closed with peer_close() and freed
 * by its owner in on_closed, never inside its own read callback (the redis/libuv rule): a
 * close requested while frames are being dispatched only stops the dispatch loop. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "peer.h"
#include "banned.h"

/* One read's worth of buffer: reads are copied into the frame reader at once, so one
 * static buffer serves every peer of the single-threaded loop. */
#define PEER_READ_CHUNK      (64 * 1024)
/* Messages up to this size are serialised on the stack (heartbeats, store replies, joins). */
#define PEER_SMALL_MSG       4096
/* The first buffer of a peer's batch; it doubles as needed. Small: a broadcast from a read
 * callback gives every peer a batch of one message. */
#define PEER_BATCH_MIN       256
/* A peer that lets this much output pile up is not reading: close it rather than grow. */
#define PEER_WRITE_QUEUE_MAX (32u * 1024 * 1024)

struct peer_write {
    uv_write_t req;
    struct peer *peer;
    size_t len;
    size_t cap; /* a batch (peer.batch): bytes buf may hold */
    uint8_t buf[];
};

static char read_chunk[PEER_READ_CHUNK];

/* While a read callback dispatches, whatever any peer of the loop is sent is gathered in that
 * peer's batch, and every batch goes out in one write each as the callback ends: a store
 * round's replies, and the values one put releases to the agents that waited for them, are
 * then one syscall per peer instead of one per message. dirty lists the peers with a batch
 * (their memory lives on: a peer is freed from its close callback, never inside a read). */
static bool batching;
static struct peer *dirty;

int64_t peer_now_ms(const struct peer *p)
{
    return (int64_t)uv_now(p->h.handle.loop);
}

int peer_init(struct peer *p, uv_loop_t *loop, enum peer_kind kind, const struct auth_key *key,
              uint32_t max_frame, const struct peer_ops *ops, void *owner)
{
    int ret;

    memset(p, 0, sizeof(*p));
    p->kind = kind;
    p->ops = ops;
    p->owner = owner;
    if (key)
        p->key = *key;
    p->max_frame = max_frame;
    frame_reader_init(&p->rd, kind == PEER_UNIX ? max_frame : PEER_HANDSHAKE_FRAME_MAX);
    ret = kind == PEER_UNIX ? uv_pipe_init(loop, &p->h.pipe, 0) : uv_tcp_init(loop, &p->h.tcp);
    if (ret < 0)
        return ret;
    p->h.handle.data = p;
    p->opened_ms = p->last_rx_ms = (int64_t)uv_now(loop);
    snprintf(p->name, sizeof(p->name), "%s", kind == PEER_UNIX ? "unix peer" : "tcp peer");
    return 0;
}

static void on_close(uv_handle_t *h)
{
    struct peer *p = h->data;

    p->ops->on_closed(p, p->why);
}

static int write_now(struct peer *p, struct peer_write *w);

void peer_close(struct peer *p, const char *why)
{
    if (p->closing)
        return;
    /* What the read callback sent before the close goes first, as it would have unbatched:
     * the error frame that says why a link is dropped, say. */
    if (p->batch) {
        struct peer_write *w = p->batch;
        p->batch = NULL;
        write_now(p, w);
        if (p->closing)
            return;
    }
    p->closing = true;
    snprintf(p->why, sizeof(p->why), "%.200s", why ? why : "closed");
    if (!uv_is_closing(&p->h.handle)) {
        uv_read_stop(&p->h.stream);
        uv_close(&p->h.handle, on_close);
    }
}

void peer_release(struct peer *p)
{
    free(p->batch);
    p->batch = NULL;
    frame_reader_release(&p->rd);
    memset(&p->key, 0, sizeof(p->key));
    auth_session_release(&p->sess);
}

static void on_write(uv_write_t *req, int status)
{
    struct peer_write *w = (struct peer_write *)req;
    struct peer *p = w->peer;

    if (status < 0 && status != UV_ECANCELED && !p->closing) {
        char why[128];
        snprintf(why, sizeof(why), "cannot write: %s", uv_strerror(status));
        peer_close(p, why);
    }
    free(w);
}

/* Appends w's frame to p's batch; takes w. Returns 0 or -ENOMEM. */
static int batch_append(struct peer *p, struct peer_write *w)
{
    struct peer_write *b = p->batch;

    if (!b || b->len + w->len > b->cap) {
        size_t cap = b ? b->cap * 2 : PEER_BATCH_MIN;
        while (cap < (b ? b->len : 0) + w->len)
            cap *= 2;
        b = realloc(b, sizeof(*b) + cap);
        if (!b) {
            free(w);
            return -ENOMEM;
        }
        if (!p->batch)
            b->len = 0;
        b->cap = cap;
        p->batch = b;
    }
    memcpy(b->buf + b->len, w->buf, w->len);
    b->len += w->len;
    free(w);
    return 0;
}

/* Writes w (a frame or a batch of them) to p; takes w. */
static int write_now(struct peer *p, struct peer_write *w)
{
    uv_buf_t b = uv_buf_init((char *)w->buf, (unsigned)w->len);
    int ret;

    if (uv_stream_get_write_queue_size(&p->h.stream) + w->len > PEER_WRITE_QUEUE_MAX) {
        free(w);
        peer_close(p, "peer does not read its messages");
        return -ENOBUFS;
    }
    w->peer = p;
    /* Nothing queued before it: the kernel usually takes the whole frame at once, and
     * uv_try_write() costs one write(2) where uv_write() also costs a request, a callback and
     * an epoll_ctl(2) to stop watching for POLLOUT after every write (libuv re-arms the
     * watcher even when POLLOUT was never on): 8 of every 10 epoll_ctl calls of the leader at
     * 1,000 agents. What the kernel does not take goes through uv_write() as before. */
    if (uv_stream_get_write_queue_size(&p->h.stream) == 0) {
        ret = uv_try_write(&p->h.stream, &b, 1);
        if (ret == (int)w->len) {
            free(w);
            return 0;
        }
        if (ret < 0 && ret != UV_EAGAIN && ret != UV_ENOSYS) {
            free(w);
            peer_close(p, uv_strerror(ret));
            return ret;
        }
        if (ret > 0)
            b = uv_buf_init((char *)w->buf + ret, (unsigned)(w->len - (size_t)ret));
    }
    ret = uv_write(&w->req, &p->h.stream, &b, 1, on_write);
    if (ret < 0) {
        free(w);
        peer_close(p, uv_strerror(ret));
    }
    return ret;
}

/* Queues one frame whose payload is w->buf[FRAME_HDR_LEN..]: into p's batch while a read
 * callback dispatches, else at once. Takes w. */
static int queue_write(struct peer *p, struct peer_write *w)
{
    int ret;

    if (!batching)
        return write_now(p, w);
    if (uv_stream_get_write_queue_size(&p->h.stream) + (p->batch ? p->batch->len : 0) + w->len >
        PEER_WRITE_QUEUE_MAX) {
        free(w);
        peer_close(p, "peer does not read its messages");
        return -ENOBUFS;
    }
    if (!p->dirty) {
        p->dirty = true;
        p->batch_next = dirty;
        dirty = p;
    }
    ret = batch_append(p, w);
    if (ret < 0)
        peer_close(p, "out of memory");
    return ret;
}

/* Makes room for n more bytes at the end of p's batch, enlisting p among the peers to flush.
 * Returns 0, or -ENOBUFS (p is closed: it reads too little) or -ENOMEM (the caller falls back
 * to a frame of its own). */
static int batch_reserve(struct peer *p, size_t n)
{
    struct peer_write *b = p->batch;
    size_t len = b ? b->len : 0;

    if (uv_stream_get_write_queue_size(&p->h.stream) + len + n > PEER_WRITE_QUEUE_MAX) {
        peer_close(p, "peer does not read its messages");
        return -ENOBUFS;
    }
    if (!b || len + n > b->cap) {
        size_t cap = b ? b->cap * 2 : PEER_BATCH_MIN;
        while (cap < len + n)
            cap *= 2;
        b = realloc(b, sizeof(*b) + cap);
        if (!b)
            return -ENOMEM;
        b->len = len;
        b->cap = cap;
        p->batch = b;
    }
    if (!p->dirty) {
        p->dirty = true;
        p->batch_next = dirty;
        dirty = p;
    }
    return 0;
}

/* Ends batching: every peer's batch goes out in one write. */
static void batch_flush_all(void)
{
    batching = false;
    while (dirty) {
        struct peer *p = dirty;
        struct peer_write *w = p->batch;
        dirty = p->batch_next;
        p->batch_next = NULL;
        p->dirty = false;
        p->batch = NULL;
        if (w && !p->closing && w->len)
            write_now(p, w);
        else
            free(w);
    }
}

static int send_raw(struct peer *p, const uint8_t *data, size_t n)
{
    struct peer_write *w = malloc(sizeof(*w) + FRAME_HDR_LEN + n);

    if (!w)
        return -ENOMEM;
    w->len = FRAME_HDR_LEN + n;
    frame_put_header(w->buf, (uint32_t)n);
    memcpy(w->buf + FRAME_HDR_LEN, data, n);
    return queue_write(p, w);
}

/* Frames n bytes of JSON text, and a tail after a NUL byte where tail is not NULL: in place at
 * the end of p's batch while a read callback dispatches (no buffer of its own to allocate,
 * copy and free), else in a write of its own. */
static int frame_out(struct peer *p, const char *text, size_t n, const void *tail, size_t tail_n)
{
    size_t extra = p->kind == PEER_UNIX ? 0 : AUTH_OVERHEAD;
    size_t off = FRAME_HDR_LEN + (extra ? AUTH_SEQ_LEN : 0);
    size_t body = n + (tail ? 1 + tail_n : 0), total = FRAME_HDR_LEN + body + extra;
    struct peer_write *w = NULL;
    uint8_t *f;
    int r = batching ? batch_reserve(p, total) : 1;

    if (r == -ENOBUFS)
        return r;
    if (r == 0) {
        f = p->batch->buf + p->batch->len;
    } else {
        w = malloc(sizeof(*w) + total);
        if (!w)
            return -ENOMEM;
        f = w->buf;
    }
    memcpy(f + off, text, n);
    if (tail) {
        f[off + n] = '\0';
        memcpy(f + off + n + 1, tail, tail_n);
    }
    if (extra)
        auth_seal(&p->sess, f + FRAME_HDR_LEN, body);
    frame_put_header(f, (uint32_t)(body + extra));
    p->last_tx_ms = peer_now_ms(p);
    if (!w) {
        p->batch->len += total;
        return 0;
    }
    w->len = total;
    return queue_write(p, w);
}

int peer_send_tail(struct peer *p, json_t *msg, const void *tail, size_t tail_n)
{
    char small[PEER_SMALL_MSG], *big;
    size_t n;
    int r;

    if (!msg) {
        /* proto_pack() refused it: a message this program built wrong, never the peer's. */
        log_error("cannot send to '%s': message failed its own validation", p->name);
        return -EINVAL;
    }
    if (p->closing || !p->ready) {
        json_decref(msg);
        return -ENOTCONN;
    }
    /* Serialised into a stack buffer, which holds nearly every message; again into one of
     * its size only when it did not fit. */
    n = json_dumpb(msg, small, sizeof(small), JSON_COMPACT);
    if (n > 0 && n <= sizeof(small)) {
        json_decref(msg);
        return frame_out(p, small, n, tail, tail_n);
    }
    big = n ? malloc(n) : NULL;
    if (big)
        json_dumpb(msg, big, n, JSON_COMPACT);
    json_decref(msg);
    if (!big)
        return -ENOMEM;
    r = frame_out(p, big, n, tail, tail_n);
    free(big);
    return r;
}

int peer_send_text(struct peer *p, const char *text, size_t n)
{
    if (p->closing || !p->ready)
        return -ENOTCONN;
    return frame_out(p, text, n, NULL, 0);
}

int peer_send(struct peer *p, json_t *msg)
{
    return peer_send_tail(p, msg, NULL, 0);
}

bool peer_hb_due(const struct peer *p, int64_t interval_ms)
{
    /* The timer's own jitter must not skip a beat on an idle link: a frame sent in the last
     * tenth of the interval was the last heartbeat. */
    return peer_now_ms(p) - p->last_tx_ms >= interval_ms - interval_ms / 10;
}

void peer_excuse(struct peer *p, int64_t stall_ms, int64_t now_ms)
{
    int64_t age = now_ms - p->opened_ms, silence = now_ms - p->last_rx_ms;

    /* A frame read after the stall (the owner was stopped in epoll_wait, and what came
     * meanwhile is read before its first timer) left nothing to excuse. */
    p->age_excused_ms = p->age_excused_ms + stall_ms < age ? p->age_excused_ms + stall_ms : age;
    p->rx_excused_ms =
        p->rx_excused_ms + stall_ms < silence ? p->rx_excused_ms + stall_ms : silence;
}

int64_t peer_silence_ms(const struct peer *p, int64_t now_ms)
{
    return now_ms - p->last_rx_ms - p->rx_excused_ms;
}

int64_t peer_age_ms(const struct peer *p, int64_t now_ms)
{
    return now_ms - p->opened_ms - p->age_excused_ms;
}

int peer_send_error(struct peer *p, int64_t id, const char *code, const char *text)
{
    return peer_send(p, proto_pack("{s:s, s:I, s:s, s:s}", "type", "error", "id", (json_int_t)id,
                                   "code", code, "msg", text));
}

static void become_ready(struct peer *p)
{
    p->ready = p->heard = true;
    p->rd.max = p->max_frame;
    if (p->ops->on_ready)
        p->ops->on_ready(p);
}

/* The handshake frames; see auth.h for the exchange. */
static void handshake_step(struct peer *p, const uint8_t *payload, size_t len)
{
    uint8_t out[AUTH_CHAL_LEN];
    int ret;

    if (p->kind == PEER_TCP_SERVER && p->hs.state == 0 && p->seen &&
        auth_is_early_hello(payload, len)) {
        ret = auth_early_accept(&p->hs, &p->key, payload, len, &p->sess);
        if (ret == 0 && (ret = auth_seen_add(p->seen, p->hs.nonce_c)) == -EEXIST) {
            peer_close(p, "authentication failed: a replayed hello");
            return;
        }
        if (ret == -ENOSPC) {
            peer_close(p, "refused: more one-frame hellos than the job's agents could send");
            return;
        }
        if (ret == 0)
            become_ready(p);
    } else if (p->kind == PEER_TCP_SERVER && p->hs.state == 0) {
        ret = auth_server_challenge(&p->hs, &p->key, payload, len, out);
        p->heard = ret == 0;
        if (ret == 0)
            ret = send_raw(p, out, AUTH_CHAL_LEN);
    } else if (p->kind == PEER_TCP_SERVER) {
        ret = auth_server_finish(&p->hs, payload, len, &p->sess);
        if (ret == 0)
            become_ready(p);
    } else {
        ret = auth_client_proof(&p->hs, payload, len, out, &p->sess);
        if (ret == 0 && send_raw(p, out, AUTH_PROOF_LEN) == 0)
            become_ready(p);
    }
    if (ret == -EACCES)
        peer_close(p, "authentication failed: wrong job key");
    else if (ret == -EBADMSG)
        peer_close(p, "authentication failed: malformed handshake frame");
    else if (ret < 0 && !p->closing)
        peer_close(p, "authentication failed: internal error");
}

static void dispatch(struct peer *p, const uint8_t *payload, size_t len)
{
    struct proto_error err;
    const uint8_t *json = payload;
    size_t n = len;
    struct msg m;
    int ret;

    if (p->kind != PEER_UNIX) {
        ret = auth_open(&p->sess, payload, len, &json, &n);
        if (ret == -EPROTO) {
            peer_close(p, "replayed or reordered frame");
            return;
        }
        if (ret < 0) {
            peer_close(p, "frame failed authentication (wrong key, other job or tampered)");
            return;
        }
    }
    if (proto_decode(json, n, &m, &err) < 0) {
        if (p->ops->on_bad_message)
            p->ops->on_bad_message(p, &err);
        else
            peer_close(p, err.why.text);
        return;
    }
    p->ops->on_message(p, &m);
    proto_msg_release(&m);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    *buf = uv_buf_init(read_chunk, sizeof(read_chunk));
}

/* Closes p for a frame the reader refuses (ret: frame_reader_check's or _next's error). */
static void refuse_frame(struct peer *p, int ret)
{
    char why[96];

    if (ret == -EMSGSIZE) {
        snprintf(why, sizeof(why), "frame larger than %u bytes", p->rd.max);
        peer_close(p, why);
    } else {
        peer_close(p, "empty frame");
    }
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct peer *p = s->data;
    const uint8_t *payload;
    size_t len, done = 0;
    int ret;

    if (nread == 0 || p->closing)
        return;
    if (nread < 0) {
        if (nread == UV_EOF && frame_reader_pending(&p->rd))
            peer_close(p, "connection closed inside a frame (truncated frame)");
        else if (nread == UV_EOF)
            peer_close(p, "connection closed");
        else
            peer_close(p, uv_strerror((int)nread));
        return;
    }
    p->last_rx_ms = peer_now_ms(p);
    p->rx_excused_ms = 0;
    /* What this read's frames make the daemon send leaves in one write per peer. */
    batching = true;
    /* Before the handshake is done the reader takes one frame at a time, so that a frame of
     * the handshake's size is all it ever holds for a peer that has not proved the key, and
     * the rest of the read (the first message after the proof) meets the larger limit. */
    while (!p->closing && done < (size_t)nread) {
        size_t n = (size_t)nread - done;
        /* Whole frames are read where the read put them while nothing is buffered: no copy,
         * and no buffer per peer between reads (12,500 agents' would be 50 MB). Each meets
         * the limit of its moment, as through the reader. */
        if (frame_reader_pending(&p->rd) == 0 && n >= FRAME_HDR_LEN) {
            const uint8_t *h = (const uint8_t *)buf->base + done;
            uint32_t len32 =
                (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
            if (len32 == 0 || len32 > p->rd.max) {
                refuse_frame(p, len32 ? -EMSGSIZE : -EBADMSG);
                break;
            }
            if (n - FRAME_HDR_LEN >= len32) {
                done += FRAME_HDR_LEN + len32;
                if (!p->ready)
                    handshake_step(p, h + FRAME_HDR_LEN, len32);
                else
                    dispatch(p, h + FRAME_HDR_LEN, len32);
                continue;
            }
        }
        if (!p->ready && frame_reader_want(&p->rd) < n)
            n = frame_reader_want(&p->rd);
        ret = frame_reader_check(&p->rd, buf->base + done, n);
        if (ret < 0) {
            refuse_frame(p, ret);
            break;
        }
        if (frame_reader_feed(&p->rd, buf->base + done, n) < 0) {
            peer_close(p, "out of memory");
            break;
        }
        done += n;
        while (!p->closing && (ret = frame_reader_next(&p->rd, &payload, &len)) != 0) {
            if (ret < 0)
                refuse_frame(p, ret);
            else if (!p->ready)
                handshake_step(p, payload, len);
            else
                dispatch(p, payload, len);
        }
    }
    /* A reader left empty gives its buffer back until a frame is cut by a read again. */
    if (!p->closing && frame_reader_pending(&p->rd) == 0)
        frame_reader_release(&p->rd);
    batch_flush_all();
}

static void name_from_tcp(struct peer *p)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    char host[64] = "?";
    int port = 0;

    if (uv_tcp_getpeername(&p->h.tcp, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET) {
            uv_ip4_name((struct sockaddr_in *)&ss, host, sizeof(host));
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            uv_ip6_name((struct sockaddr_in6 *)&ss, host, sizeof(host));
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        }
    }
    snprintf(p->addr, sizeof(p->addr), "%s", host);
    snprintf(p->name, sizeof(p->name), "%s:%d", host, port);
}

static int start_reading(struct peer *p)
{
    /* An accepted socket has the listener's TCP_NODELAY (peer_accept): a setsockopt(2) less
     * for each of a large job's 12,500 agents. */
    if (p->kind == PEER_TCP_CLIENT)
        uv_tcp_nodelay(&p->h.tcp, 1);
    if (p->kind != PEER_UNIX)
        name_from_tcp(p);
    return uv_read_start(&p->h.stream, on_alloc, on_read);
}

int peer_accept(struct peer *p, uv_stream_t *server)
{
    int ret = uv_accept(server, &p->h.stream);

    if (ret < 0)
        return ret;
    ret = start_reading(p);
    if (ret == 0 && p->kind == PEER_UNIX)
        become_ready(p);
    return ret;
}

static void on_connect(uv_connect_t *req, int status)
{
    struct peer *p = req->handle->data;
    uint8_t hello[AUTH_HELLO_LEN];
    char why[160];
    int ret;

    if (p->closing)
        return;
    if (status < 0) {
        snprintf(why, sizeof(why), "cannot connect: %s", uv_strerror(status));
        peer_close(p, why);
        return;
    }
    ret = start_reading(p);
    if (ret == 0 && p->early) {
        /* The hello and what the owner sends once ready (its join) leave in one write. */
        uint8_t early[AUTH_EARLY_LEN];
        ret = auth_early_hello(&p->hs, &p->key, early, &p->sess) < 0 ? UV_EIO : 0;
        batching = true;
        if (ret == 0)
            ret = send_raw(p, early, sizeof(early));
        if (ret == 0)
            become_ready(p);
        batch_flush_all();
    } else {
        if (ret == 0)
            ret = auth_client_hello(&p->hs, &p->key, hello) < 0 ? UV_EIO : 0;
        if (ret == 0)
            ret = send_raw(p, hello, sizeof(hello));
    }
    if (ret < 0 && !p->closing)
        peer_close(p, uv_strerror(ret));
}

int peer_connect(struct peer *p, const struct sockaddr *addr)
{
    return uv_tcp_connect(&p->connect_req, &p->h.tcp, addr, on_connect);
}
