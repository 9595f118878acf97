/* A small blocking client of the daemon's TCP protocol for tests: it connects, runs the
 * auth.h handshake as a client (or a forged one), sends sealed or raw frames and reads frames
 * with a timeout. Each test process owns its wires; nothing here is thread-safe. */
#ifndef GPURUN_TESTS_WIRE_H
#define GPURUN_TESTS_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "auth.h"
#include "frame.h"

struct wire {
    int fd;
    struct auth_session sess;
    uint8_t nonce_c[AUTH_NONCE_LEN], nonce_s[AUTH_NONCE_LEN]; /* the handshake's transcript */
    struct frame_reader rd;
    uint8_t *frame; /* the last frame read (wire_recv_frame), owned */
    size_t frame_len;
};

/* Connects w to host:port (numeric IPv4) with a blocking socket. Returns 0 or a negative
 * errno; on failure w->fd is -1 and w needs no wire_close(). */
int wire_connect(struct wire *w, const char *host, int port);

/* The local port of w's socket: the one the daemon names the peer by. */
int wire_local_port(const struct wire *w);

/* Runs the client side of the handshake with key. Returns 0 with w->sess set; -EACCES when
 * the server's challenge is not made with key; -EBADMSG for a malformed challenge;
 * -ECONNRESET when the server hung up; -ETIMEDOUT; another negative errno. */
int wire_handshake(struct wire *w, const struct auth_key *key, int timeout_ms);

/* Opens w with the one-frame hello (auth.h) under key: sends it and sets w->sess at once
 * (the server's first frame proves the server). The hello's bytes go to hello when not NULL,
 * for a replay. Returns 0 or a negative errno. */
int wire_early_hello(struct wire *w, const struct auth_key *key, uint8_t *hello);

/* A forged handshake: sends hello, takes any challenge and answers with a proof made with
 * key without checking the server, as a client holding the wrong key would. Returns 0 once
 * the proof is sent (w->sess then holds keys derived from key), or a negative errno. */
int wire_handshake_forged(struct wire *w, const struct auth_key *key, int timeout_ms);

/* The session the handshake of w would have given a client holding key instead (another
 * job's key): same nonces, keys derived from key, w's current sequence numbers. */
void wire_session_for_key(const struct wire *w, const struct auth_key *key,
                          struct auth_session *out);

/* Writes n raw bytes. Returns 0 or a negative errno (-EPIPE, -ECONNRESET once closed). */
int wire_send_raw(struct wire *w, const void *data, size_t n);

/* Writes one frame: the 4-byte header for n, then the payload. Returns like wire_send_raw. */
int wire_send_frame(struct wire *w, const void *payload, size_t n);

/* Seals json (n bytes, need not be valid JSON) with sess (w->sess when NULL) into a new buffer
 * holding the whole frame, header included (*out, caller frees), of *out_len bytes. Returns 0 or
 * -ENOMEM. Advances that session's tx sequence as sending it would. */
int wire_seal(struct wire *w, struct auth_session *sess, const char *json, size_t n, uint8_t **out,
              size_t *out_len);

/* Seals and sends json (NUL-terminated). Returns 0 or a negative errno. */
int wire_send_json(struct wire *w, const char *json);

/* Reads the next frame within timeout_ms: returns 0 with *payload (borrowed, valid until the
 * next receive or close) and *len; -ECONNRESET when the server closed the connection (EOF or
 * reset); -ETIMEDOUT; -EMSGSIZE/-EBADMSG for an unreadable frame. */
int wire_recv_frame(struct wire *w, int timeout_ms, const uint8_t **payload, size_t *len);

/* Reads the next sealed frame, opens it with w->sess and parses its JSON, skipping "hb"
 * heartbeats. Returns 0 with *msg (new reference, caller decrefs); -EPROTO when the frame
 * fails auth_open; -EBADMSG when it is not a JSON object; or wire_recv_frame's errors. */
int wire_recv_json(struct wire *w, int timeout_ms, json_t **msg);

/* Waits up to timeout_ms for the server to close the connection, reading and dropping
 * whatever frames come first. Returns 0 once closed, -ETIMEDOUT while still open. */
int wire_wait_closed(struct wire *w, int timeout_ms);

/* Closes the socket and frees w's buffers; safe on a wire that is already closed. */
void wire_close(struct wire *w);

#endif
