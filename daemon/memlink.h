/* A node's memory link (docs/design.md, section 4): the daemon-to-daemon TCP link that
 * replicates memory checkpoints (memckpt.h). Each node sends every copy its ranks keep to
 * the node that holds its copies (its holder, which the leader names in the assign), and a
 * node whose store has no copy of a rank's state (a spare that took a lost node's place)
 * fetches it from there. The holder keeps the copies in its own store, within its cap.
 *
 * A link is authenticated as the leader's are (auth.h: the job key's handshake, then every
 * frame sealed with its seq and tag); a copy travels as a mem_put header and its bytes in
 * sealed frames of MEMLINK_CHUNK, written into a file beside the store and kept (renamed
 * over the older copy) only once every byte has come: a transfer cut halfway, a frame that
 * fails its tag, a size that does not match, leave the older copy.
 *
 * The link's blocking I/O runs on threads of its own, never on the agent's loop: one sends
 * and fetches, in order; one accepts, and one serves each link accepted (at most
 * MEMLINK_CONNS_MAX at once). What the loop must hear of (a copy fetched, a send that
 * failed) is queued for memlink_take and announced by the wake function, which may be
 * called from any thread (uv_async_send). */
#ifndef GPURUN_MEMLINK_H
#define GPURUN_MEMLINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "auth.h"
#include "memckpt.h"

/* The bytes of a copy in one sealed frame. */
#define MEMLINK_CHUNK     (1u << 20)
/* Links served at once; one more is closed at its accept. */
#define MEMLINK_CONNS_MAX 16
/* How long a link may be silent in the middle of a message before it is given up. */
#define MEMLINK_IO_MS     10000

struct memlink;

enum memlink_event_kind {
    MEMLINK_SENT, /* a copy reached the holder and is kept there */
    MEMLINK_SEND_FAILED,
    MEMLINK_FETCHED,  /* a fetch's answer: ret 0 (now in the store), -ENOENT or an error */
    MEMLINK_RECEIVED, /* a peer's copy is kept here */
    MEMLINK_REFUSED,  /* a peer's copy was refused (ret: -ENOSPC, -EINVAL, or the cut) */
};

struct memlink_event {
    enum memlink_event_kind kind;
    int rank;
    char name[MEMCKPT_NAME_MAX + 1];
    int64_t step;
    uint64_t size;
    uint64_t cookie; /* MEMLINK_FETCHED: memlink_fetch's */
    int ret;
    char why[512];
};

/* Starts the link of the store m: a listener on bind_addr (a numeric IPv4 or IPv6 address)
 * on a port the kernel picks, and its threads. wake(ctx) is called when an event is queued.
 * Returns 0 with the link in *out, or a negative errno. */
int memlink_start(struct memckpt *m, const struct auth_key *key, const char *bind_addr,
                  void (*wake)(void *ctx), void *ctx, struct memlink **out);

/* The listener's port. */
int memlink_port(const struct memlink *l);

/* Where this node's copies go and come from: the holder's link (addr NULL or port 0: none).
 * Returns true when that is another holder than before. */
bool memlink_set_holder(struct memlink *l, const char *addr, int port);

/* Queues the copy of rank's name to be sent to the holder (the one kept when its turn
 * comes: a save made meanwhile is sent once). */
void memlink_push(struct memlink *l, int rank, const char *name);

/* Queues a fetch of rank's name from the holder into the store; its answer comes as a
 * MEMLINK_FETCHED event with cookie. */
void memlink_fetch(struct memlink *l, int rank, const char *name, uint64_t cookie);

/* Takes up to max queued events, oldest first; returns how many. */
size_t memlink_take(struct memlink *l, struct memlink_event *out, size_t max);

/* The bytes of copies sent and received so far. */
void memlink_bytes(struct memlink *l, uint64_t *sent, uint64_t *received);

/* Stops the threads (a transfer in flight is cut: its receiver keeps the older copy) and
 * frees l (NULL: nothing). The store is the caller's. */
void memlink_stop(struct memlink *l);

#endif
