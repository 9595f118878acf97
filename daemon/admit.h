/* Admission of connections before their join (docs/design.md, section 3): how many may wait
 * unadmitted, how many of those may be strangers under the process's descriptor limit, and
 * which one goes when there are too many. Pure: the leader counts, reads its limit, and
 * closes the connection the rule names. */
#ifndef GPURUN_ADMIT_H
#define GPURUN_ADMIT_H

#include <stdbool.h>

/* Connections allowed before admission, beyond one for every node that has not joined yet
 * (admit_pending_max()): so every agent of a job of any size can connect at once, and a flood of
 * strangers holds at most this many more. It also bounds the memory a flood can make the
 * leader hold: a connection that has not proved the job key costs about 1.3 KiB
 * (PEER_HANDSHAKE_FRAME_MAX in peer.h), so about 1.3 MiB, plus 1.3 KiB per node still to join
 * (16 MiB at 12,500 nodes, before the job runs), plus the one 64 KiB read buffer every peer
 * shares. */
#define PENDING_CONNS_MAX 1024
/* The fewest stranger slots a leader starts with: under a descriptor limit too low for
 * PENDING_CONNS_MAX (1,024, the usual `ulimit -n`) the stranger slots shrink to what the
 * limit leaves, down to this; below it the leader refuses to start (leader_fds_needed()). */
#define PENDING_CONNS_MIN 64

/* Connections allowed before admission: one for every one of nphys nodes still to join (so
 * that every agent of a job can connect at once), and strangers_max for strangers. */
int admit_pending_max(int nphys, int joined, int strangers_max);

/* The stranger slots a soft descriptor limit of nofile (< 0: none) leaves room for:
 * PENDING_CONNS_MAX, or fewer (not under PENDING_CONNS_MIN) when it cannot hold one
 * descriptor per node, slack (the leader's other descriptors) and PENDING_CONNS_MAX. A
 * flood then meets evictions before accept() meets EMFILE. */
int admit_strangers_max(long nofile, int nnodes, int slack);

/* A connection waiting for admission, as the eviction rule sees it. */
struct admit_conn {
    bool proved; /* it proved the job key (or is closing already): never evicted */
    bool heard;  /* it sent something valid (a well-formed hello) */
};

/* Over the pending limit one connection of q[0..n) (the oldest first) goes, never one that
 * proved the job key: the oldest of those that sent nothing valid yet, else the oldest
 * still in its handshake. Never the newest: refusing newcomers would lock a real agent out
 * for as long as a flood lasts, where this only delays it by the flood's turnover. Returns
 * its index, or -1 where every one proved the key. */
int admit_victim(const struct admit_conn *q, int n);

#endif
