/* What the tcp backend's two files share: the ring's state and a collective's transfer in
 * progress, which the ring engine (coll_tcp.c) moves over each link's TCP connection or, on a
 * link between two ranks of one machine, through a shared-memory ring (coll_shm.c). Internal
 * to those two files. */
#ifndef GPURUN_COLL_TCP_H
#define GPURUN_COLL_TCP_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct coll;
struct coll_shm_ring;

/* The random token a rank publishes with its address and a shared ring's cookie. */
#define TOKEN_BYTES    16
/* A machine's identity: the kernel's boot_id, as text. */
#define BOOT_ID_BYTES  36
/* A shared ring's name in /dev/shm, with its terminating NUL. */
#define SHM_NAME_BYTES 48

/* The tcp backend's state (coll_state): the link to rank+1 (we only send data on it) and from
 * rank-1 (we only receive data). A link between two ranks of one machine carries its data
 * through a shared ring (send_ring, recv_ring; NULL for a link over TCP) and only doorbells
 * over TCP. */
struct coll_tcp {
    int rank, world;
    int send_fd;
    int recv_fd;
    struct coll_shm_ring *send_ring;
    struct coll_shm_ring *recv_ring;
    /* rank-1 closed its end of a shared-memory link: what it wrote before may still be in the
     * ring, and only a wait for more is an error. */
    bool prev_closed;
    /* More ranks of this job on this machine than CPUs this process may run on: a rank
     * waiting on a shared ring gives its CPU away while it looks (sched_yield) instead of
     * spinning, since the rank it waits for may need that CPU. */
    bool oversubscribed;
    char next_addr[INET6_ADDRSTRLEN + 8];
    char prev_addr[INET6_ADDRSTRLEN + 8];
    unsigned char *scratch;
};

/* One collective as two streams of steps: step t sends a span of the buffer to rank+1 and
 * receives a span from rank-1, either added into place (reduce) or copied. Send step t may
 * only send the bytes that receive step t - lag has already completed (none to wait for when
 * t - lag < 0): in a ring allreduce what a rank passes on at step t is what it reduced at
 * step t-1 (lag 1), in a broadcast what it just received (lag 0). Both spans of such a pair
 * have the same length, but where an allreduce goes from one part of the buffer to the next
 * (coll_tcp.c): there the step before only sets the pace. */
struct coll_xfer {
    struct coll *c;
    struct coll_tcp *tcp;
    const char *what;
    int nsend, nrecv, lag;
    /* The span of step t, set by the operation. */
    void (*span)(const struct coll_xfer *x, int t, bool send, char **p, size_t *len);
    bool (*reduce_step)(const struct coll_xfer *x, int t);
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
    /* Shared rings: whether this operation's padding is behind us (see coll_shm.c). */
    bool saligned, raligned;
};

/* How far into its span the current send step may go. */
static inline size_t coll_xfer_send_limit(const struct coll_xfer *x)
{
    int dep = x->st - x->lag;

    if (dep < 0 || x->rt > dep)
        return x->slen;
    /* A pair's spans are as long as each other, but for an allreduce's first step of a part
     * after the last step of the part before, which only sets its pace. */
    if (x->rt == dep)
        return x->rc < x->slen ? x->rc : x->slen;
    return 0;
}

/* ---- the shared-memory links (coll_shm.c) -------------------------------------------------- */

/* This machine's identity for shared memory (boot_id: BOOT_ID_BYTES), the same for every
 * process of one boot and different on any other machine. Zeros (never offered nor accepted)
 * when it cannot be read or when GPURUN_COLL_SHM=0 asks for TCP on every link. */
void coll_shm_machine(unsigned char *boot_id);
/* Whether the identities a and b are the same machine's (and not zeros). */
bool coll_shm_same_machine(const unsigned char *a, const unsigned char *b);

/* Creates a ring for the link from rank-1 under a random name (name: SHM_NAME_BYTES) with a
 * random cookie (TOKEN_BYTES) the sender checks after mapping it; *out is new (free with
 * coll_shm_detach). The caller unlinks the name once the sender has answered. Returns 0 or a
 * negative errno. */
int coll_shm_create(char *name, unsigned char *cookie, struct coll_shm_ring **out);
/* Maps the ring rank+1 offered into *out; false when this process cannot see it (another
 * machine's or another container's /dev/shm) or it is not the one offered (cookie). */
bool coll_shm_attach(const char *name, const unsigned char *cookie, struct coll_shm_ring **out);
/* Unmaps *r (NULL: nothing) and sets it to NULL. */
void coll_shm_detach(struct coll_shm_ring **r);

/* The data path of x over its shared rings (x->tcp->recv_ring, send_ring), in the engine's
 * contract: receive takes what rank-1 has put in the ring, added into place or copied, send
 * puts what may go to rank+1; each returns 1 when bytes moved, 0 when none could. */
int coll_shm_recv(struct coll_xfer *x);
int coll_shm_send(struct coll_xfer *x);
/* Before sleeping on a shared ring: raises this side's flag, then looks again, so that the
 * other side either saw the flag or made the progress seen here. True when there is
 * something to do after all. */
bool coll_shm_recv_ready(struct coll_xfer *x);
bool coll_shm_send_ready(struct coll_xfer *x);
/* Before sleeping on shared rings only (recv: the link from rank-1 carries what x waits
 * for; send: the link to rank+1 has a step that may go): looks at the rings for up to
 * SHM_SPIN_US (coll_shm.c), so that a neighbour a piece behind does not cost two wake-ups a
 * piece. True when something can move. */
bool coll_shm_spin(struct coll_xfer *x, bool recv, bool send);

#endif
