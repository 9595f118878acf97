/* Job-key authentication for gpurun's TCP links (docs/design.md, section 5).
 *
 * Every job has a 256-bit key, kept as 64 hex digits in a 0600 file of the job dir. A TCP
 * link opens with a three-frame handshake of fixed-size binary frames, so that nothing is
 * parsed as JSON before the peer has proved it holds the key:
 *
 *   client -> server  hello:     "GRH1" nonce_c[32]
 *   server -> client  challenge: "GRC1" nonce_s[32] HMAC(K, "gpurun srv" nonce_c nonce_s)
 *   client -> server  proof:     "GRP1" HMAC(K, "gpurun cli" nonce_c nonce_s)
 *
 * Both nonces are fresh from the kernel's generator (getrandom), so each side proves the key
 * on a transcript it chose half of: a recorded handshake cannot be replayed. The client
 * checks the server too, so a process squatting on a daemon's port learns nothing. Each
 * direction then gets its own session key, HMAC(K, "gpurun c2s" nonce_c nonce_s) and
 * "gpurun s2c" likewise, and every later frame's payload is
 *
 *   seq[8, big-endian] json[n] tag[32] where tag = HMAC-SHA256(session key, seq json)
 *
 * seq counts the frames of that direction from 0; a frame whose seq is not the next one is
 * a replay or a reorder and is refused, and a frame of another job or link fails its tag.
 *
 * An agent's link to its leader opens with one frame instead, so that the join rides in the
 * same write and the leader answers nothing before it has something to say (a heartbeat or
 * the assign):
 *
 *   client -> server  early hello: "GRJ1" nonce_c[32] HMAC(K, "gpurun early" nonce_c zero[32])
 *
 * and the session keys are HMAC(K, "gpurun ec2s" nonce_c zero[32]) and "gpurun es2c"
 * likewise. The client's freshness makes every server frame new to it, and the server's first
 * frame, under a key only holders of K have, proves the server. The server's freshness is its
 * memory: it refuses a nonce it has seen (struct auth_seen; bounded, as an agent opens its
 * link once), so a recorded hello replayed to it fails. A job's key is its leader's alone (a
 * new one for every start of the batch script, every requeue; a key copied by hand into
 * another job's dir would lose this), so no other server takes the recording, and only the
 * leader accepts the one frame (the memory links between agents and gpurun status keep the
 * three). A server squatting on the leader's port before it listens learns what an agent
 * sends before its answer (the join, the link probe, heartbeats), which a listener on the
 * wire reads anyway: frames are signed, not encrypted. One that stays silent is found at the
 * heartbeat timeout instead of at the handshake.
 *
 * All comparisons of secrets are constant-time (CRYPTO_memcmp). */
#ifndef GPURUN_AUTH_H
#define GPURUN_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define AUTH_KEY_LEN     32
#define AUTH_NONCE_LEN   32
#define AUTH_TAG_LEN     32
#define AUTH_SEQ_LEN     8
#define AUTH_HELLO_LEN   (4 + AUTH_NONCE_LEN)
#define AUTH_CHAL_LEN    (4 + AUTH_NONCE_LEN + AUTH_TAG_LEN)
#define AUTH_PROOF_LEN   (4 + AUTH_TAG_LEN)
#define AUTH_EARLY_LEN   (4 + AUTH_NONCE_LEN + AUTH_TAG_LEN)
/* Bytes a sealed frame adds around its JSON. */
#define AUTH_OVERHEAD    (AUTH_SEQ_LEN + AUTH_TAG_LEN)
/* The key file holds the key as hex plus an optional newline. */
#define AUTH_KEYFILE_LEN (2 * AUTH_KEY_LEN)

struct auth_key {
    uint8_t k[AUTH_KEY_LEN];
};

/* HMAC-SHA256 under one key, its inner and outer SHA-256 states computed once (auth.c):
 * a frame's tag then costs its own hashing only. Plain bytes: a copy is a copy. */
struct auth_hmac {
    uint64_t inner[16], outer[16];
};

/* One direction pair of an established link: the keys, and tx_mac and rx_mac made from them
 * (auth_session_key). */
struct auth_session {
    uint8_t tx_key[AUTH_KEY_LEN];
    uint8_t rx_key[AUTH_KEY_LEN];
    uint64_t tx_seq;
    uint64_t rx_seq;
    struct auth_hmac tx_mac, rx_mac;
};

/* The state of one side of a handshake in progress. */
struct auth_handshake {
    struct auth_key key;
    uint8_t nonce_c[AUTH_NONCE_LEN];
    uint8_t nonce_s[AUTH_NONCE_LEN];
    int state; /* internal: which frame comes next */
};

/* HMAC(key, label) into out: a value of the job that only holders of its key can compute
 * (the job mark's, jobmark.h). label is borrowed. */
void auth_key_derive(const struct auth_key *key, const char *label, uint8_t out[AUTH_TAG_LEN]);

/* Fills n bytes of buf from the kernel's generator (getrandom(2)). Returns 0, or -EIO when
 * it fails. */
int auth_random(void *buf, size_t n);

/* Fills key with 32 fresh random bytes. Returns 0, or -EIO when the RNG fails. */
int auth_key_generate(struct auth_key *key);

/* Creates path with mode 0600 (O_EXCL: an existing file is an error, -EEXIST) holding the
 * key in hex. Returns 0 or a negative errno. */
int auth_key_write(const char *path, const struct auth_key *key);

/* Reads a key written by auth_key_write(). Refuses a file that others can read or write
 * (-EPERM), that is not 64 hex digits (-EINVAL), or cannot be read (negative errno). */
int auth_key_read(const char *path, struct auth_key *key);

/* Client, step 1: starts a handshake; writes the hello frame's payload to out. Returns 0 or
 * -EIO (RNG failure). */
int auth_client_hello(struct auth_handshake *hs, const struct auth_key *key,
                      uint8_t out[AUTH_HELLO_LEN]);

/* Client, step 2: checks the server's challenge (in, len bytes); on success writes the proof
 * payload to out and the established session to sess. Returns 0, -EBADMSG for a frame of the
 * wrong shape, -EACCES when the server does not hold the key. */
int auth_client_proof(struct auth_handshake *hs, const uint8_t *in, size_t len,
                      uint8_t out[AUTH_PROOF_LEN], struct auth_session *sess);

/* Server, step 1: takes the client's hello and writes the challenge payload to out. Returns
 * 0, -EBADMSG for a frame of the wrong shape, -EIO (RNG failure). */
int auth_server_challenge(struct auth_handshake *hs, const struct auth_key *key, const uint8_t *in,
                          size_t len, uint8_t out[AUTH_CHAL_LEN]);

/* Server, step 2: checks the client's proof; on success fills sess. Returns 0, -EBADMSG for a
 * frame of the wrong shape, -EACCES for a wrong key. */
int auth_server_finish(struct auth_handshake *hs, const uint8_t *in, size_t len,
                       struct auth_session *sess);

/* Client: the one-frame hello into out and the session it opens into sess (the server's
 * first frame, opened with it, proves the server). Returns 0 or -EIO (RNG failure). */
int auth_early_hello(struct auth_handshake *hs, const struct auth_key *key,
                     uint8_t out[AUTH_EARLY_LEN], struct auth_session *sess);

/* Whether a first frame of len bytes is a one-frame hello (by its magic). */
bool auth_is_early_hello(const uint8_t *in, size_t len);

/* Server: checks a one-frame hello; on success fills sess, with the client's nonce in
 * hs->nonce_c for the caller's auth_seen_add. Returns 0, -EBADMSG for a frame of the wrong
 * shape (an all-zero nonce included), -EACCES for a wrong key. */
int auth_early_accept(struct auth_handshake *hs, const struct auth_key *key, const uint8_t *in,
                      size_t len, struct auth_session *sess);

/* The nonces of the one-frame hellos a server took, at most max (0: no bound; the leader's
 * is a few times its nodes, each of whose agents opens its link once): a zeroed struct is
 * empty. */
struct auth_seen {
    uint8_t (*slots)[AUTH_NONCE_LEN];
    size_t cap, n, max;
};

/* Remembers nonce. Returns 0, -EEXIST when it was seen before (a replay), -ENOSPC when max
 * are remembered already, -EINVAL for the all-zero nonce, -ENOMEM. */
int auth_seen_add(struct auth_seen *s, const uint8_t nonce[AUTH_NONCE_LEN]);
void auth_seen_release(struct auth_seen *s);

/* Makes tx_mac and rx_mac from tx_key and rx_key (a handshake does; a session whose keys
 * were set by hand needs it). */
void auth_session_key(struct auth_session *s);

/* Wipes the session's keys and states; the session may be filled by a handshake again. A
 * zeroed session, or one released already, is fine. */
void auth_session_release(struct auth_session *s);

/* Seals a frame in place: buf holds AUTH_SEQ_LEN free bytes, then the n message bytes, then
 * AUTH_TAG_LEN free bytes; writes the seq and the tag and advances tx_seq. The payload to
 * send is then buf[0 .. n + AUTH_OVERHEAD). */
void auth_seal(struct auth_session *s, uint8_t *buf, size_t n);

/* Opens a received payload of len bytes: checks its seq and tag. Returns 0 and sets *msg
 * (borrowed from payload) and *n, advancing rx_seq; -EBADMSG when the payload is too short
 * or the tag is wrong; -EPROTO when the tag is right but seq is not the next one (a replay). */
int auth_open(struct auth_session *s, const uint8_t *payload, size_t len, const uint8_t **msg,
              size_t *n);

/* Hex helpers. auth_hex writes 2n digits and a NUL to out; auth_unhex reads exactly 2n
 * digits and returns 0 or -EINVAL. */
void auth_hex(const uint8_t *in, size_t n, char *out);
int auth_unhex(const char *in, uint8_t *out, size_t n);

#endif
