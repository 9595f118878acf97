/* Horovod's rendezvous without horovodrun: the HTTP key-value server that horovodrun starts
 * for its gloo controller (horovod/runner/http/http_server.py, RendezvousServer with
 * RendezvousHandler), served by the leader in its own loop. Ranks reach it through
 * HOROVOD_GLOO_RENDEZVOUS_ADDR and _PORT (daemon/rankenv.c); horovod's C++ side
 * (horovod/common/gloo/http_store.cc) and its Python client (http_client.py) speak to it.
 *
 * Like horovodrun's, this endpoint is NOT authenticated: anyone who can reach the leader's
 * address can read and write the horovod store of the job (only that store: the job's own
 * store, its key and its control link stay behind the authenticated leader port). It binds
 * the leader's own address, so that a --local job serves loopback only.
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
 * Malformed requests get 400 (and 405, 411, 413, 431, 408 for the cases those name) and one
 * log_warn line naming the peer; the server keeps serving everyone else.
 *
 * Not served: horovod's elastic mode (HOROVOD_ELASTIC, whose driver fills a "rank_and_size"
 * scope; gpurun never sets HOROVOD_ELASTIC, and there an elastic script's GET gets 404), and
 * IPv6 leaders (horovod's C++ client cannot parse an IPv6 address in a URL). */
#ifndef GPURUN_HVD_H
#define GPURUN_HVD_H

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

/* The port the server listens on. */
int hvd_server_port(const struct hvd_server *h);

/* The job's layout, as horovodrun's RendezvousServer.init(host_alloc_plan) takes it: nnodes
 * nodes of nprocs ranks each, hosts[i] (borrowed for the call) the name node i reported.
 * Names every node for horovod (hvd_server_host), sizes the three kinds of scope and empties
 * the store. Returns 0, or -ENOMEM (the store is then empty and the layout may lack scopes,
 * which then behave as ad-hoc ones). */
int hvd_server_layout(struct hvd_server *h, int nnodes, int nprocs, const char *const *hosts);

/* Node node's HOROVOD_HOSTNAME: the name it reported when every node's name is distinct and
 * made of [A-Za-z0-9._-] (it names the "local_" scope inside a URL path), else "node<N>" for
 * every node (several --local nodes share one machine's name). Borrowed until the next
 * hvd_server_layout or the close; NULL before a layout or for a node out of range. */
const char *hvd_server_host(const struct hvd_server *h, int node);

/* Empties the store and every scope's finished ranks, keeping the layout: a new generation
 * must not read the addresses of the last one's ranks. */
void hvd_server_reset(struct hvd_server *h);

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
