/* One framed connection of the daemon: a TCP link (authenticated with the job key, both
 * roles) or a rank's Unix socket (plain frames). It owns its libuv handle, its frame reader
 * and its write buffers; the owner learns of messages and of the close through ops. */
#ifndef GPURUN_PEER_H
#define GPURUN_PEER_H

#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "auth.h"
#include "frame.h"
#include "proto.h"

/* The largest frame a TCP link accepts before its handshake is done: the handshake's own
 * frames (auth.h) are 36 to 68 bytes, so anything longer is not gpurun and the link is closed
 * as soon as the length word is read, before a byte of the payload is buffered. With the
 * reader's first buffer sized to one such frame (frame.h), a connection that has not proved
 * the job key costs its struct peer (1128 bytes on x86-64) with its owner's record, 72 bytes
 * of frame buffer and, while it is being written, the challenge (about 300 bytes): about
 * 1.3 KiB. The leader's bound on memory before authentication is that times its limit on
 * pending connections (PENDING_CONNS_MAX in leader.c, plus one per node still to join):
 * about 1.3 MiB whatever the flood, plus 1.3 KiB per node until the job runs. */
#define PEER_HANDSHAKE_FRAME_MAX AUTH_CHAL_LEN
_Static_assert(AUTH_EARLY_LEN <= PEER_HANDSHAKE_FRAME_MAX,
               "a one-frame hello is a handshake frame");
/* Once a peer has proved the key it also holds its session's two keyed HMAC contexts
 * (auth.h), about 1.8 KiB: 22 MiB of the leader's 125 MiB at 12,500 agents. */

struct peer;
struct peer_write;

struct peer_ops {
    /* The handshake finished (TCP) or the stream is open (Unix). May be NULL. */
    void (*on_ready)(struct peer *p);
    /* One valid message; m is borrowed for the call. The callback may peer_close(p). */
    void (*on_message)(struct peer *p, struct msg *m);
    /* A frame failed to decode: err says why. The link stays open unless the callback
     * closes it (the daemon answers an error frame and keeps serving). May be NULL: then
     * the link is closed. */
    void (*on_bad_message)(struct peer *p, const struct proto_error *err);
    /* The handle is closed: the owner unlinks p and frees it with peer_free(). why is
     * borrowed ("connection reset by peer", "wrong key", ...). */
    void (*on_closed)(struct peer *p, const char *why);
};

enum peer_kind { PEER_TCP_SERVER, PEER_TCP_CLIENT, PEER_UNIX };

struct peer {
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } h;
    uv_connect_t connect_req;
    enum peer_kind kind;
    const struct peer_ops *ops;
    void *owner; /* borrowed: the leader or agent the peer belongs to */
    void *data;  /* borrowed: the owner's per-peer record */
    struct frame_reader rd;
    struct auth_key key;
    struct auth_handshake hs;
    struct auth_session sess;
    /* TCP server: takes the one-frame hello (auth.h) too, remembering its nonces here; NULL:
     * the three-frame handshake only. Borrowed from the owner. */
    struct auth_seen *seen;
    bool early;               /* TCP client: opens with the one-frame hello (set before it) */
    bool ready;               /* handshake done (or Unix) */
    bool heard;               /* a valid frame came: a well-formed hello at least (or Unix) */
    bool closing;             /* peer_close was called */
    struct peer_write *batch; /* frames to write in one go as the read callback ends, or NULL */
    struct peer *batch_next;  /* the next peer with a batch (peer.c) */
    bool dirty;               /* on that list */
    uint32_t max_frame;       /* the reader's limit once the handshake is done */
    int64_t opened_ms, last_rx_ms;
    /* Of the time since opened_ms and since last_rx_ms, how much the owner's loop did not run
     * (peer_excuse): the peer is not judged on it. */
    int64_t age_excused_ms, rx_excused_ms;
    int64_t last_tx_ms; /* when peer_send last took a frame: a heartbeat sooner is not needed */
    char name[96];      /* "10.0.0.2:43210" or "rank 3": the subject of log lines */
    char addr[64];      /* TCP: the remote address without its port ("10.0.0.2"), else "" */
    char why[256];
};

/* Prepares p on loop. key is copied (ignored for PEER_UNIX); max_frame bounds payloads once
 * the handshake is done (PEER_HANDSHAKE_FRAME_MAX before, on TCP). Returns 0 or a libuv error.
 * After success the owner must end p with peer_close(). */
int peer_init(struct peer *p, uv_loop_t *loop, enum peer_kind kind, const struct auth_key *key,
              uint32_t max_frame, const struct peer_ops *ops, void *owner);

/* Server side: accepts a pending connection of server into p and starts reading (and the
 * handshake on TCP). Returns 0 or a libuv error (then p must still be peer_close()d). A TCP
 * server must have TCP_NODELAY set (uv_tcp_nodelay): Linux copies it to each socket it
 * accepts, and p's frames must not wait for Nagle's algorithm. */
int peer_accept(struct peer *p, uv_stream_t *server);

/* Client side: connects p to addr and runs the handshake; on_ready or on_closed follows. */
int peer_connect(struct peer *p, const struct sockaddr *addr);

/* Sends msg (stolen: always consumed) once the link is ready. Returns 0, -ENOTCONN when
 * the link is closing or not ready, -ENOMEM, or a libuv error. */
int peer_send(struct peer *p, json_t *msg);

/* peer_send() with n raw bytes of tail after the message and a NUL byte, in the same frame
 * and under its tag: a probe's pad (lib/proto.h), which the receiver neither parses nor
 * copies. */
int peer_send_tail(struct peer *p, json_t *msg, const void *tail, size_t n);

/* Sends n bytes of a message already serialised (borrowed): compact JSON text as
 * json_dumpb() writes it, valid as proto.h says. What a broadcast sends to every agent is
 * serialised once, and the store's replies without a tree. Returns as peer_send(). */
int peer_send_text(struct peer *p, const char *text, size_t n);

/* Whether p's other end needs a heartbeat now: nothing was sent to it for interval_ms. Any
 * frame proves the sender alive (the receiver's clock is last_rx_ms), so a heartbeat goes
 * only over an idle link: a leader busy with 12,500 agents sends none during a rendezvous. */
bool peer_hb_due(const struct peer *p, int64_t interval_ms);

/* Excuses p for stall_ms (stall.h) in which its owner's loop did not run, at now_ms: what p
 * sent meanwhile could not be read, so that time counts neither in its silence nor in its
 * age. Each is excused at most the time it has lasted, and the next frame read ends the
 * excuse of the silence. */
void peer_excuse(struct peer *p, int64_t stall_ms, int64_t now_ms);

/* How long p has been silent at now_ms (since its last frame, or since it was opened) over
 * the time its owner was running to hear it: what a heartbeat timeout judges. */
int64_t peer_silence_ms(const struct peer *p, int64_t now_ms);

/* How long p has been open at now_ms over the time its owner was running: what a handshake
 * timeout judges. */
int64_t peer_age_ms(const struct peer *p, int64_t now_ms);

/* Sends {"type":"error","id":id,"code":code,"msg":text}. */
int peer_send_error(struct peer *p, int64_t id, const char *code, const char *text);

/* Starts closing p once (idempotent): reading stops, pending writes are dropped by libuv,
 * on_closed follows from the close callback. why (borrowed, copied) is the reason. */
void peer_close(struct peer *p, const char *why);

/* Frees what p owns besides itself; call from on_closed before freeing the memory of p. */
void peer_release(struct peer *p);

/* Milliseconds of the loop's clock. */
int64_t peer_now_ms(const struct peer *p);

#endif
