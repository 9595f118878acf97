/* Horovod's rendezvous without horovodrun: the HTTP key-value server that horovodrun starts
 * for its gloo controller (horovod/runner/http/http_server.py, RendezvousServer with
 * RendezvousHandler), served by the leader in its own loop. Ranks reach it through
 * HOROVOD_GLOO_RENDEZVOUS_ADDR and _PORT (daemon/rankenv.c); horovod's C++ side
 * (horovod/common/gloo/http_store.cc) and its Python client (http_client.py) speak to it.
 *
 * Horovod's clients cannot authenticate (they send plain HTTP with no secret), so the server
 * decides by the peer's address instead: it serves the job's own hosts (hvd_server_allow: the
 * addresses the job's nodes reached the leader from) and this host (a peer whose address is
 * the connection's own local address: a --local job's 127.0.0.1), and closes any other
 * connection unread. The leader starts the server only for a job that uses horovod (job.json's
 * "horovod"). It binds the leader's own address, so that a --local job serves loopback only.
 * Refusals are counted per address and reason and summarised (refusals.h), not logged one by
 * one: a flood writes a few lines a window.
 *
 * HTTP: one request per connection (both horovod clients open a connection per request and
 * read to Content-Length), HTTP/1.0 or 1.1, a Content-Length body and nothing else: chunked
 * bodies get 501, pipelined bytes 400. Every response says "Connection: close".
 *   GET /SCOPE/KEY     200 and the value, or 404
 *   PUT /SCOPE/KEY     stores the body as the value: 200, or 507 when the store is full
 *   DELETE /SCOPE/KEY  RendezvousHandler's: in one of the layout's scopes ("global",
 *                      "local_" + host, "cross_" + local rank), KEY (a rank) has finished;
 *                      once every member of the scope has, the scope's keys are removed. In
 *                      any other scope KEY is removed (and the scope with its last key). 200.
 * Malformed requests get 400 (and 405, 411, 413, 431, 408 for the cases those name) and a
 * log_warn line naming the peer (the first of a burst; the rest summarised); the server keeps
 * serving everyone else.
 *
 * Not served: horovod's elastic mode (HOROVOD_ELASTIC, whose driver fills a "rank_and_size"
 * scope; gpurun never sets HOROVOD_ELASTIC, and there an elastic script's GET gets 404), and
 * IPv6 leaders (horovod's C++ client cannot parse an IPv6 address in a URL). */
#ifndef GPURUN_HVD_H
#define GPURUN_HVD_H

#include <stdbool.h>
#include <stddef.h>

#include <uv.h>

/* The limits, each the default where a config field is 0. */
/* One request's line and headers: horovod's requests carry four or five short headers. */
#define HVD_HEADER_MAX      8192
/* One value: gloo's full-mesh rendezvous stores, per rank, one 136-byte address for every
 * other rank of the scope (gloo/rendezvous/context.cc), so 1 MiB holds a scope of 7,700
 * ranks. */
#define HVD_BODY_MAX        (1024 * 1024)
/* The store: the "global" scope peaks at world_size^2 * 136 bytes before it is cleared, so
 * 256 MiB serves a horovod world of 1,400 ranks; past that gloo's HTTP rendezvous (each rank
 * polls for each other rank's value) is impractical anyway. */
#define HVD_STORE_BYTES_MAX (256 * 1024 * 1024)
#define HVD_STORE_KEYS_MAX  1000000
/* Connections served at once; more wait in the kernel's listen backlog (accepted as slots
 * free up), which horovod's clients survive, where a refusal would count against the three
 * tries http_store.cc allows a request. Each rank has at most one request in flight. */
#define HVD_CONNS_MAX       512
/* Once the layout is known the store holds what the job's ranks can need, no more: gloo's
 * full-mesh rendezvous (connectFullMesh in gloo/rendezvous/context.cc) has each rank store
 * one value of HVD_GLOO_ADDR_BYTES (its tcp Address: a sockaddr_storage and a sequence
 * number) for every other rank of the scope, in each of horovod's three scopes (global,
 * local, cross; gloo_context.cc), plus HVD_RANK_SLACK bytes and HVD_RANK_KEYS keys a rank for
 * keys, scope names and a script's own use of the store. HVD_STORE_MIN is the floor: a few
 * ranks get 64 KiB. The per-request body limit is one rank's largest value and its slack. */
#define HVD_GLOO_ADDR_BYTES 136
#define HVD_RANK_SLACK      4096
#define HVD_RANK_KEYS       16
#define HVD_STORE_MIN       (64 * 1024)
#define HVD_STORE_KEYS_MIN  256
/* A request must arrive whole, and a response be taken, within this: what horovod's own
 * server allows a request (SINGLE_REQUEST_TIMEOUT, 3 s). A slow or stalled client gets 408. */
#define HVD_TIMEOUT_MS      3000

struct hvd_server;

struct hvd_config {
    const char *bind_addr; /* borrowed: numeric IPv4/IPv6 address; the port is the kernel's */
    size_t header_max, body_max, store_bytes_max, store_keys_max;
    int conns_max;
    int timeout_ms;
};

/* Listens on cfg->bind_addr, port 0, on loop. Returns 0 with a new server in *out (end it
 * with hvd_server_close), or a negative errno with the reason logged. Thread context: the
 * loop's thread, like every function below. */
int hvd_server_start(uv_loop_t *loop, const struct hvd_config *cfg, struct hvd_server **out);

/* The port the server listens on; 0 when h is NULL (no server: a job without horovod). */
int hvd_server_port(const struct hvd_server *h);

/* The job's layout, as horovodrun's RendezvousServer.init(host_alloc_plan) takes it: nnodes
 * nodes of nprocs ranks each, hosts[i] (borrowed for the call) the name node i reported.
 * Names every node for horovod (hvd_server_host), sizes the three kinds of scope, bounds the
 * store to the job's need (hvd_store_need) and empties it. Returns 0, or -ENOMEM (the store is then
 * empty and the layout may lack scopes, which then behave as ad-hoc ones). */
int hvd_server_layout(struct hvd_server *h, int nnodes, int nprocs, const char *const *hosts);

/* Node node's HOROVOD_HOSTNAME: the name it reported when every node's name is distinct and
 * made of [A-Za-z0-9._-] (it names the "local_" scope inside a URL path), else "node<N>" for
 * every node (several --local nodes share one machine's name). Borrowed until the next
 * hvd_server_layout or the close; NULL before a layout, for a node out of range or when h is
 * NULL. */
const char *hvd_server_host(const struct hvd_server *h, int node);

/* Empties the store and every scope's finished ranks, keeping the layout: a new generation
 * must not read the addresses of the last one's ranks. h may be NULL. */
void hvd_server_reset(struct hvd_server *h);

/* The job's hosts: n addresses (borrowed for the call; numeric IPv4 or IPv6) the server
 * serves besides this host; one that is not numeric is skipped (a node that advertises a name
 * is still served at the address it joined from, also on the list). Replaces the last list.
 * Returns the number of addresses kept, or -ENOMEM (the list is then unchanged). */
int hvd_server_allow(struct hvd_server *h, int n, const char *const *addrs);

/* Whether a connection from peer to local (the accepted socket's own address) is served:
 * peer's address is local's (this host), or one of allow's n addresses. Ports are ignored, and
 * an IPv4-mapped IPv6 address is its IPv4 one. Pure; for tests. */
bool hvd_peer_allowed(const struct sockaddr *peer, const struct sockaddr *local,
                      const struct sockaddr_storage *allow, int n);

/* The store limits a job of nnodes nodes of nprocs ranks needs (see HVD_GLOO_ADDR_BYTES):
 * bytes, keys and the largest body, written to the three pointers. Pure; for tests. */
void hvd_store_need(int nnodes, int nprocs, size_t *bytes, size_t *keys, size_t *body);

/* The limits in force (the config's until a layout, then the smaller of the config's and the
 * job's need): for tests and status. */
size_t hvd_server_bytes_max(const struct hvd_server *h);

/* Bytes of keys and values held and the number of keys: for tests and status. */
size_t hvd_server_bytes(const struct hvd_server *h);
size_t hvd_server_keys(const struct hvd_server *h);
/* How many values were stored since the start (0 for h NULL): whether horovod used it. */
size_t hvd_server_puts(const struct hvd_server *h);

/* Stops listening and closes every connection; the server frees itself once its handles are
 * closed (the loop must run on). Idempotent; h may be NULL. */
void hvd_server_close(struct hvd_server *h);

/* The name of the network interface that holds the numeric address addr ("lo" for
 * 127.0.0.1), written to out (cap bytes): what horovodrun gives HOROVOD_GLOO_IFACE, the
 * interface gloo then binds. Returns 0, or -ENOENT when no interface holds addr, -EINVAL when
 * addr is not numeric, or a libuv error. */
int hvd_iface_of(const char *addr, char *out, size_t cap);

#endif
