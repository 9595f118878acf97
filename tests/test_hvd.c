/* Tests of daemon/hvd, horovod's HTTP rendezvous, against a running server: its loop runs in a
 * thread of the test while the test is a plain blocking HTTP client, sending the requests
 * horovod's two clients send (http_store.cc's HTTPRequest and Python's urllib) and broken
 * ones. Every test ends by closing the server and checking that its loop closes (nothing
 * leaked). Also the HOROVOD_* variables daemon/rankenv gives a rank. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "../daemon/hvd.h"
#include "../daemon/rankenv.h"
#include "../daemon/refusals.h"
#include "log.h"
#include "test.h"
#include "banned.h"

/* How long the client waits for something the server does at once: generous for a loaded
 * two-core machine under ASan, never reached when it works. */
#define PROMPT_MS        3000
/* The request timeout the tests give the server, so that a stalled client is answered soon. */
#define SHORT_TIMEOUT_MS 300

/* --- the server, in a thread ------------------------------------------------------------- */

struct srv {
    uv_loop_t loop;
    uv_async_t async;
    pthread_t thread;
    sem_t ready, done;
    struct hvd_config cfg;
    struct hvd_server *h;
    int port, start_ret, loop_close_ret;
    void (*fn)(struct srv *s, void *arg); /* run in the loop's thread, then done is posted */
    void *arg;
    bool stop;
    int log_fd;
};

static void on_async(uv_async_t *a)
{
    struct srv *s = a->data;

    if (s->fn) {
        s->fn(s, s->arg);
        s->fn = NULL;
        sem_post(&s->done);
    }
    if (s->stop) {
        hvd_server_close(s->h);
        uv_close((uv_handle_t *)&s->async, NULL);
    }
}

static void *srv_main(void *arg)
{
    struct srv *s = arg;

    s->start_ret = hvd_server_start(&s->loop, &s->cfg, &s->h);
    if (s->start_ret == 0)
        s->port = hvd_server_port(s->h);
    sem_post(&s->ready);
    if (s->start_ret == 0)
        uv_run(&s->loop, UV_RUN_DEFAULT);
    else
        uv_close((uv_handle_t *)&s->async, NULL);
    uv_run(&s->loop, UV_RUN_DEFAULT);
    s->loop_close_ret = uv_loop_close(&s->loop);
    return NULL;
}

/* Starts a server with cfg's limits (bind_addr defaults to 127.0.0.1) and a log sink in the
 * test's scratch dir. */
static void srv_start(struct srv *s, const struct hvd_config *cfg)
{
    char path[4200];

    memset(s, 0, sizeof(*s));
    snprintf(path, sizeof(path), "%s/log", test_tmpdir());
    s->log_fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    CHECK(s->log_fd >= 0);
    log_setup("test_hvd", s->log_fd, LOG_WARN);
    if (cfg)
        s->cfg = *cfg;
    if (!s->cfg.bind_addr)
        s->cfg.bind_addr = "127.0.0.1";
    CHECK_EQ(uv_loop_init(&s->loop), 0);
    CHECK_EQ(uv_async_init(&s->loop, &s->async, on_async), 0);
    s->async.data = s;
    sem_init(&s->ready, 0, 0);
    sem_init(&s->done, 0, 0);
    CHECK_EQ(pthread_create(&s->thread, NULL, srv_main, s), 0);
    sem_wait(&s->ready);
    CHECK_EQ(s->start_ret, 0);
    CHECK(s->port > 0);
}

/* Runs fn(s, arg) in the server's thread and waits for it. */
static void srv_call(struct srv *s, void (*fn)(struct srv *, void *), void *arg)
{
    s->fn = fn;
    s->arg = arg;
    uv_async_send(&s->async);
    sem_wait(&s->done);
}

/* Closes the server and checks that the loop had nothing left open. */
static void srv_stop(struct srv *s)
{
    s->stop = true;
    uv_async_send(&s->async);
    CHECK_EQ(pthread_join(s->thread, NULL), 0);
    CHECK_EQ(s->loop_close_ret, 0);
    sem_destroy(&s->ready);
    sem_destroy(&s->done);
}

struct layout_args {
    int nnodes, nprocs;
    const char *const *hosts;
    int ret;
};

static void do_layout(struct srv *s, void *arg)
{
    struct layout_args *a = arg;

    a->ret = hvd_server_layout(s->h, a->nnodes, a->nprocs, a->hosts);
}

static void srv_layout(struct srv *s, int nnodes, int nprocs, const char *const *hosts)
{
    struct layout_args a = {nnodes, nprocs, hosts, -1};

    srv_call(s, do_layout, &a);
    CHECK_EQ(a.ret, 0);
}

struct counts {
    size_t bytes, keys, puts;
};

static void do_counts(struct srv *s, void *arg)
{
    struct counts *c = arg;

    c->bytes = hvd_server_bytes(s->h);
    c->keys = hvd_server_keys(s->h);
    c->puts = hvd_server_puts(s->h);
}

static struct counts srv_counts(struct srv *s)
{
    struct counts c;

    srv_call(s, do_counts, &c);
    return c;
}

static void do_reset(struct srv *s, void *arg)
{
    (void)arg;
    hvd_server_reset(s->h);
}

/* Lines of the server's log that contain a and (when not NULL) b. */
static int log_lines(const struct srv *s, const char *a, const char *b)
{
    static char text[1 << 20];
    ssize_t n = pread(s->log_fd, text, sizeof(text) - 1, 0);
    int lines = 0;

    CHECK(n >= 0);
    text[n] = '\0';
    for (char *p = text; *p;) {
        size_t len = strcspn(p, "\n");
        char save = p[len];
        p[len] = '\0';
        if (strstr(p, a) && (!b || strstr(p, b)))
            lines++;
        p[len] = save;
        p += len + (save == '\n');
    }
    return lines;
}

static const char *log_text(const struct srv *s)
{
    static char text[1 << 16];
    ssize_t n = pread(s->log_fd, text, sizeof(text) - 1, 0);

    text[n > 0 ? n : 0] = '\0';
    return text;
}

#define CHECK_LOG(s, a, b, want)                                                                   \
    do {                                                                                           \
        int n_ = log_lines((s), (a), (b));                                                         \
        if (n_ != (want))                                                                          \
            test_fail(__FILE__, __LINE__, "log has %d lines with \"%s\"%s%s, not %d:\n%s", n_,     \
                      (a), (b) ? " and " : "", (b) ? (b) : "", (want), log_text(s));               \
    } while (0)

/* --- the client ---------------------------------------------------------------------------- */

static int64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int dial(int port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    CHECK(fd >= 0);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

static void send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        CHECK(w > 0);
        p += w;
        n -= (size_t)w;
    }
}

struct resp {
    int status;
    char raw[1 << 16];
    size_t len;
    const char *body;
    size_t body_len;
    bool reset; /* the connection ended in a reset, not an orderly close */
};

/* Reads fd until the server closes it (or timeout_ms pass: then status is 0) and parses the
 * response, checking its framing: status line, Content-Length equal to the body's length. */
static void read_resp_at(const char *file, int line, int fd, struct resp *r, int timeout_ms)
{
    int64_t deadline = mono_ms() + timeout_ms;
    const char *end, *cl;

    r->len = 0;
    r->status = 0;
    r->reset = false;
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int64_t left = deadline - mono_ms();
        ssize_t n;
        if (left <= 0 || poll(&pfd, 1, (int)left) <= 0)
            return;
        n = recv(fd, r->raw + r->len, sizeof(r->raw) - 1 - r->len, 0);
        r->reset = n < 0;
        if (n <= 0)
            break;
        r->len += (size_t)n;
    }
    r->raw[r->len] = '\0';
    end = strstr(r->raw, "\r\n\r\n");
    if (!end || sscanf(r->raw, "HTTP/1.1 %d ", &r->status) != 1)
        test_fail(file, line, "not an HTTP response: \"%s\"", r->raw);
    r->body = end + 4;
    r->body_len = r->len - (size_t)(r->body - r->raw);
    /* Exactly as horovod's C++ client looks for it: case-sensitive. */
    cl = strstr(r->raw, "\r\nContent-Length: ");
    if (!cl || cl > end || strtoul(cl + 18, NULL, 10) != r->body_len)
        test_fail(file, line, "Content-Length does not match a body of %zu bytes: \"%s\"",
                  r->body_len, r->raw);
    if (!strstr(r->raw, "\r\nConnection: close\r\n"))
        test_fail(file, line, "no 'Connection: close': \"%s\"", r->raw);
}

/* Sends req (n bytes) on a new connection and reads the whole response. */
static void http_raw_at(const char *file, int line, int port, const char *req, size_t n,
                        struct resp *r)
{
    int fd = dial(port);

    send_all(fd, req, n);
    read_resp_at(file, line, fd, r, PROMPT_MS);
    close(fd);
    if (!r->status)
        test_fail(file, line, "no response in %d ms to \"%.*s\"", PROMPT_MS, (int)n, req);
}
#define http_raw(port, req, n, r) http_raw_at(__FILE__, __LINE__, (port), (req), (n), (r))

/* A request as horovod's C++ client (HTTPRequest.hpp) writes it. */
static int http_at(const char *file, int line, int port, const char *method, const char *path,
                   const char *body, size_t n, struct resp *r)
{
    static struct resp scratch;
    char *req = malloc(n + 256);
    int len;

    CHECK(req);
    len = snprintf(req, 256, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %zu\r\n\r\n",
                   method, path, n);
    memcpy(req + len, body, n);
    http_raw_at(file, line, port, req, (size_t)len + n, r ? r : &scratch);
    free(req);
    return (r ? r : &scratch)->status;
}
#define http(port, method, path, body, n, r)                                                       \
    http_at(__FILE__, __LINE__, (port), (method), (path), (body), (n), (r))
#define put(port, path, value) http((port), "PUT", (path), (value), strlen(value), NULL)
#define del(port, path)        http((port), "DELETE", (path), "", 0, NULL)

/* GET path: the value, or NULL on 404 (static storage). */
static const char *get_at(const char *file, int line, int port, const char *path)
{
    static struct resp r;
    static char value[1 << 16];

    http_at(file, line, port, "GET", path, "", 0, &r);
    if (r.status == 404)
        return NULL;
    if (r.status != 200)
        test_fail(file, line, "GET %s: status %d, not 200 or 404", path, r.status);
    memcpy(value, r.body, r.body_len);
    value[r.body_len] = '\0';
    return value;
}
#define get(port, path) get_at(__FILE__, __LINE__, (port), (path))

#define CHECK_GET(port, path, want)                                                                \
    do {                                                                                           \
        const char *got_ = get((port), (path)), *want_ = (want);                                   \
        if (want_ ? !got_ || strcmp(got_, want_) : got_ != NULL)                                   \
            test_fail(__FILE__, __LINE__, "GET %s: \"%s\", not \"%s\"", (path),                    \
                      got_ ? got_ : "(404)", want_ ? want_ : "(404)");                             \
    } while (0)

/* --- the store ----------------------------------------------------------------------------- */

TEST(hvd_put_then_get)
{
    /* gloo's values are binary: sockaddr_storage and a sequence number. */
    static const char bin[] = {'a', 0, 'b', '\r', '\n', (char)0xff, 0};
    struct srv s;
    struct resp r;

    srv_start(&s, NULL);
    CHECK_EQ(http(s.port, "PUT", "/global/3", bin, sizeof(bin), &r), 200);
    CHECK_EQ(r.body_len, 0);
    CHECK_EQ(http(s.port, "GET", "/global/3", "", 0, &r), 200);
    CHECK_EQ(r.body_len, sizeof(bin));
    CHECK(!memcmp(r.body, bin, sizeof(bin)));
    /* Python's urllib (horovod's http_client.py): its own headers, no body on GET. */
    static const char urllib_put[] = "PUT /runfunc/func HTTP/1.1\r\nAccept-Encoding: identity\r\n"
                                     "Content-Type: application/x-www-form-urlencoded\r\n"
                                     "Content-Length: 5\r\nHost: 127.0.0.1:1\r\n"
                                     "User-Agent: Python-urllib/3.11\r\nConnection: close\r\n\r\n"
                                     "gAR=x";
    static const char urllib_get[] = "GET /runfunc/func HTTP/1.1\r\nAccept-Encoding: identity\r\n"
                                     "Host: 127.0.0.1:1\r\nUser-Agent: Python-urllib/3.11\r\n"
                                     "Connection: close\r\n\r\n";
    http_raw(s.port, urllib_put, sizeof(urllib_put) - 1, &r);
    CHECK_EQ(r.status, 200);
    http_raw(s.port, urllib_get, sizeof(urllib_get) - 1, &r);
    CHECK_EQ(r.status, 200);
    CHECK_EQ(r.body_len, 5);
    CHECK(!memcmp(r.body, "gAR=x", 5));
    /* An empty value is a value. */
    CHECK_EQ(put(s.port, "/s/empty", ""), 200);
    CHECK_GET(s.port, "/s/empty", "");
    /* Keys of one name in two scopes are two keys. */
    CHECK_EQ(put(s.port, "/a/k", "in a"), 200);
    CHECK_EQ(put(s.port, "/b/k", "in b"), 200);
    CHECK_GET(s.port, "/a/k", "in a");
    CHECK_GET(s.port, "/b/k", "in b");
    CHECK_EQ(srv_counts(&s).keys, 5);
    CHECK_LOG(&s, "refused", NULL, 0);
    srv_stop(&s);
}

TEST(hvd_get_of_a_missing_key_is_404)
{
    struct srv s;
    struct resp r;

    srv_start(&s, NULL);
    CHECK_EQ(http(s.port, "GET", "/global/0", "", 0, &r), 404);
    CHECK_EQ(put(s.port, "/global/1", "x"), 200);
    CHECK_GET(s.port, "/global/0", NULL);
    CHECK_GET(s.port, "/local_x/1", NULL);
    CHECK_GET(s.port, "/global/1", "x");
    /* A 404 is how horovod polls for a key: no log line. */
    CHECK_LOG(&s, "horovod", NULL, 0);
    srv_stop(&s);
}

TEST(hvd_put_replaces_and_counts_bytes)
{
    struct srv s;
    struct counts c;

    srv_start(&s, NULL);
    CHECK_EQ(srv_counts(&s).puts, 0);
    CHECK_EQ(put(s.port, "/sc/key", "12345"), 200);
    c = srv_counts(&s);
    CHECK_EQ(c.puts, 1);
    /* "sc/key" (6) + the value (5) + the scope's name (2). */
    CHECK_EQ(c.bytes, 13);
    CHECK_EQ(c.keys, 1);
    CHECK_EQ(put(s.port, "/sc/key", "1234567890"), 200);
    CHECK_GET(s.port, "/sc/key", "1234567890");
    c = srv_counts(&s);
    CHECK_EQ(c.bytes, 18);
    CHECK_EQ(c.keys, 1);
    CHECK_EQ(put(s.port, "/sc/key", "1"), 200);
    CHECK_EQ(srv_counts(&s).bytes, 9);
    /* Each stored value counts, a replacement too: the job's ranks used it. */
    CHECK_EQ(srv_counts(&s).puts, 3);
    srv_stop(&s);
}

/* --- DELETE: RendezvousHandler ------------------------------------------------------------- */

TEST(hvd_delete_clears_a_layout_scope_once_every_member_finished)
{
    static const char *const hosts[] = {"hostA", "hostB"};
    char path[64];
    struct srv s;

    srv_start(&s, NULL);
    srv_layout(&s, 2, 2, hosts);
    /* "global" has 4 members; "local_hostA" and "local_hostB" 2; "cross_0" and "cross_1" 2. */
    for (int r = 0; r < 4; r++) {
        snprintf(path, sizeof(path), "/global/%d", r);
        CHECK_EQ(put(s.port, path, "addr"), 200);
        snprintf(path, sizeof(path), "/global/rank_%d", r);
        CHECK_EQ(put(s.port, path, "host"), 200);
    }
    CHECK_EQ(del(s.port, "/global/0"), 200);
    CHECK_EQ(del(s.port, "/global/1"), 200);
    CHECK_EQ(del(s.port, "/global/2"), 200);
    /* A finished rank's key stays: the others still read it. A second DELETE of one rank (a
     * retried request) does not count twice. */
    CHECK_GET(s.port, "/global/0", "addr");
    CHECK_EQ(del(s.port, "/global/2"), 200);
    CHECK_GET(s.port, "/global/3", "addr");
    CHECK_EQ(srv_counts(&s).keys, 8);
    /* Meanwhile one rank of hostB finished its local rendezvous. */
    CHECK_EQ(put(s.port, "/local_hostB/0", "b0"), 200);
    CHECK_EQ(put(s.port, "/local_hostB/1", "b1"), 200);
    CHECK_EQ(del(s.port, "/local_hostB/0"), 200);
    /* The last member: every key of the scope goes. */
    CHECK_EQ(del(s.port, "/global/3"), 200);
    for (int r = 0; r < 4; r++) {
        snprintf(path, sizeof(path), "/global/%d", r);
        CHECK_GET(s.port, path, NULL);
        snprintf(path, sizeof(path), "/global/rank_%d", r);
        CHECK_GET(s.port, path, NULL);
    }
    /* hostB's local scope still counts its first member (horovod would have forgotten it). */
    CHECK_GET(s.port, "/local_hostB/1", "b1");
    CHECK_EQ(del(s.port, "/local_hostB/1"), 200);
    CHECK_GET(s.port, "/local_hostB/0", NULL);
    CHECK_GET(s.port, "/local_hostB/1", NULL);
    /* The cross scopes have one member per node. */
    CHECK_EQ(put(s.port, "/cross_1/0", "c"), 200);
    CHECK_EQ(del(s.port, "/cross_1/0"), 200);
    CHECK_GET(s.port, "/cross_1/0", "c");
    CHECK_EQ(del(s.port, "/cross_1/1"), 200);
    CHECK_GET(s.port, "/cross_1/0", NULL);
    /* A cleared scope serves the next rendezvous (hvd.init after hvd.shutdown) from scratch:
     * its count started over. */
    CHECK_EQ(put(s.port, "/global/0", "again"), 200);
    for (int r = 0; r < 3; r++) {
        snprintf(path, sizeof(path), "/global/%d", r);
        CHECK_EQ(del(s.port, path), 200);
    }
    CHECK_GET(s.port, "/global/0", "again");
    CHECK_EQ(del(s.port, "/global/3"), 200);
    CHECK_GET(s.port, "/global/0", NULL);
    /* Every scope cleared: only the layout scopes' names are held. */
    CHECK_EQ(srv_counts(&s).keys, 0);
    CHECK_EQ(srv_counts(&s).bytes, strlen("global") + strlen("local_hostA") +
                                       strlen("local_hostB") + strlen("cross_0") +
                                       strlen("cross_1"));
    srv_stop(&s);
}

TEST(hvd_delete_removes_the_key_of_an_ad_hoc_scope)
{
    struct srv s;

    srv_start(&s, NULL);
    /* Before any layout every scope is ad-hoc, "global" too, as in horovod before init(). */
    CHECK_EQ(put(s.port, "/global/0", "x"), 200);
    CHECK_EQ(del(s.port, "/global/0"), 200);
    CHECK_GET(s.port, "/global/0", NULL);
    /* A process set's scope (gloo_context.cc: "global_process_set_hash_..."). */
    CHECK_EQ(put(s.port, "/global_process_set_hash_1f/0", "a0"), 200);
    CHECK_EQ(put(s.port, "/global_process_set_hash_1f/1", "a1"), 200);
    CHECK_EQ(del(s.port, "/global_process_set_hash_1f/0"), 200);
    CHECK_GET(s.port, "/global_process_set_hash_1f/0", NULL);
    CHECK_GET(s.port, "/global_process_set_hash_1f/1", "a1");
    CHECK_EQ(srv_counts(&s).keys, 1);
    /* The last key takes its scope along: nothing is held. */
    CHECK_EQ(del(s.port, "/global_process_set_hash_1f/1"), 200);
    CHECK_EQ(srv_counts(&s).keys, 0);
    CHECK_EQ(srv_counts(&s).bytes, 0);
    /* Keys and scopes that never were: 200, as horovod answers. */
    CHECK_EQ(del(s.port, "/nothing/7"), 200);
    CHECK_EQ(put(s.port, "/some/1", "v"), 200);
    CHECK_EQ(del(s.port, "/some/2"), 200);
    CHECK_GET(s.port, "/some/1", "v");
    CHECK_LOG(&s, "horovod", NULL, 0);
    srv_stop(&s);
}

TEST(hvd_layout_names_the_nodes)
{
    static const char *const distinct[] = {"n1.cluster", "n2.cluster", "gpu-3_x"};
    static const char *const same[] = {"box", "box"};
    static const char *const unsafe[] = {"ok", "a/b"};
    struct srv s;
    char path[64];

    srv_start(&s, NULL);
    srv_layout(&s, 3, 1, distinct);
    for (int i = 0; i < 3; i++)
        CHECK_STR(hvd_server_host(s.h, i), distinct[i]);
    CHECK(hvd_server_host(s.h, 3) == NULL);
    CHECK(hvd_server_host(s.h, -1) == NULL);
    /* One machine's name for two --local nodes: node0, node1, whose local scopes are the
     * layout's (a DELETE counts instead of removing the key). */
    srv_layout(&s, 2, 2, same);
    CHECK_STR(hvd_server_host(s.h, 0), "node0");
    CHECK_STR(hvd_server_host(s.h, 1), "node1");
    CHECK_EQ(put(s.port, "/local_node1/0", "v"), 200);
    CHECK_EQ(del(s.port, "/local_node1/0"), 200);
    CHECK_GET(s.port, "/local_node1/0", "v");
    CHECK_EQ(del(s.port, "/local_node1/1"), 200);
    CHECK_GET(s.port, "/local_node1/0", NULL);
    /* A name that cannot stand in a URL path renames every node. */
    srv_layout(&s, 2, 1, unsafe);
    CHECK_STR(hvd_server_host(s.h, 0), "node0");
    CHECK_STR(hvd_server_host(s.h, 1), "node1");
    /* A new layout starts with an empty store. */
    CHECK_EQ(put(s.port, "/adhoc/1", "v"), 200);
    srv_layout(&s, 1, 2, distinct);
    CHECK_GET(s.port, "/adhoc/1", NULL);
    snprintf(path, sizeof(path), "/local_%s/0", distinct[0]);
    CHECK_EQ(put(s.port, path, "v"), 200);
    CHECK_EQ(del(s.port, path), 200);
    CHECK_GET(s.port, path, "v");
    srv_stop(&s);
}

TEST(hvd_reset_empties_the_store_and_the_counts)
{
    static const char *const hosts[] = {"a", "b"};
    struct srv s;

    srv_start(&s, NULL);
    srv_layout(&s, 2, 1, hosts);
    CHECK_EQ(put(s.port, "/global/0", "old"), 200);
    CHECK_EQ(put(s.port, "/adhoc/0", "old"), 200);
    CHECK_EQ(del(s.port, "/global/0"), 200);
    srv_call(&s, do_reset, NULL);
    CHECK_GET(s.port, "/global/0", NULL);
    CHECK_GET(s.port, "/adhoc/0", NULL);
    CHECK_EQ(srv_counts(&s).keys, 0);
    /* Rank 0's DELETE of the last generation no longer counts: two are needed again. */
    CHECK_EQ(put(s.port, "/global/0", "new"), 200);
    CHECK_EQ(del(s.port, "/global/1"), 200);
    CHECK_GET(s.port, "/global/0", "new");
    CHECK_EQ(del(s.port, "/global/0"), 200);
    CHECK_GET(s.port, "/global/0", NULL);
    /* The layout stayed. */
    CHECK_STR(hvd_server_host(s.h, 1), "b");
    srv_stop(&s);
}

/* --- bad requests -------------------------------------------------------------------------- */

struct bad {
    const char *req;
    size_t len; /* 0: strlen(req) */
    int status;
    const char *why; /* in the log line and the response's body */
};

TEST(hvd_malformed_requests_are_refused)
{
    static const struct bad bad[] = {
        {"GARBAGE\r\n\r\n", 0, 400, "malformed request line"},
        {"GET\r\nHost: x\r\n\r\n", 0, 400, "malformed request line"},
        {"GET  /a/b HTTP/1.1\r\nHost: x\r\n\r\n", 0, 400, "malformed request line"},
        {"G(T /a/b HTTP/1.1\r\nHost: x\r\n\r\n", 0, 400, "malformed request line"},
        {"GET /a/b HTTP/2.0\r\nHost: x\r\n\r\n", 0, 400, "not an HTTP/1.0 or HTTP/1.1"},
        {"GET /a/b HTTP/1.1 x\r\nHost: x\r\n\r\n", 0, 400, "not an HTTP/1.0 or HTTP/1.1"},
        {"GET /ab HTTP/1.1\r\nHost: x\r\n\r\n", 0, 400, "path '/ab' is not /SCOPE/KEY"},
        {"GET /a/b/c HTTP/1.1\r\nHost: x\r\n\r\n", 0, 400, "path '/a/b/c' is not"},
        {"GET /a/ HTTP/1.1\r\nHost: x\r\n\r\n", 0, 400, "path '/a/' is not"},
        {"GET //b HTTP/1.1\r\nHost: x\r\n\r\n", 0, 400, "path '//b' is not"},
        {"GET a/b HTTP/1.1\r\nHost: x\r\n\r\n", 0, 400, "path 'a/b' is not"},
        {"GET /a/b\x7f HTTP/1.1\r\nHost: x\r\n\r\n", 0, 400, "is not /SCOPE/KEY"},
        {"GET /a/b HTTP/1.1\r\n\r\n", 0, 400, "HTTP/1.1 request without Host"},
        {"GET /a/b HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 0, 400, "more than one Host"},
        {"GET /a/b HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", 0, 400, "folded header line"},
        {"GET /a/b HTTP/1.1\r\nHost x\r\n\r\n", 0, 400, "header line without a name"},
        {"GET /a/b HTTP/1.1\r\nHo st: x\r\n\r\n", 0, 400, "malformed header name"},
        {"GET /a/b HTTP/1.1\r\nHost: x\r\nX: a\x01z\r\n\r\n", 0, 400, "control character"},
        {"GET /a/b HTTP/1.1\nHost: x\r\n\r\n", 0, 400, "not ended by CRLF"},
        {"GET /a/b HTTP/1.1\r\nHost: x\0y\r\n\r\n", 32, 400, "with a NUL"},
        {"POST /a/b HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 0, 405,
         "method 'POST' is not GET, PUT or DELETE"},
        {"PUT /a/b HTTP/1.1\r\nHost: x\r\n\r\n", 0, 411, "no Content-Length in a 'PUT'"},
        {"PUT /a/b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
         0, 501, "Transfer-Encoding 'chunked' is not supported"},
        {"PUT /a/b HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n", 0, 400,
         "Content-Length '1x' is not a number"},
        {"PUT /a/b HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", 0, 400, "not a number"},
        {"PUT /a/b HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n\r\n", 0, 400, "is empty"},
        {"PUT /a/b HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\ncontent-length: 1\r\n\r\nz", 0, 400,
         "more than one Content-Length"},
        /* A Content-Length that says less than the client sends. */
        {"PUT /a/b HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nabcd", 0, 400,
         "2 bytes after the body of Content-Length 2"},
        {"GET /a/b HTTP/1.1\r\nHost: x\r\n\r\nGET /a/b HTTP/1.1\r\nHost: x\r\n\r\n", 0, 400,
         "bytes after the body of Content-Length 0"},
    };
    const size_t nbad = sizeof(bad) / sizeof(bad[0]);
    struct srv s;
    struct resp r;

    srv_start(&s, NULL);
    CHECK_EQ(put(s.port, "/a/b", "kept"), 200);
    for (size_t i = 0; i < nbad; i++) {
        size_t len = bad[i].len ? bad[i].len : strlen(bad[i].req);
        http_raw(s.port, bad[i].req, len, &r);
        if (r.status != bad[i].status ||
            !memmem(r.body, r.body_len, bad[i].why, strlen(bad[i].why)))
            test_fail(__FILE__, __LINE__, "request %zu \"%s\": status %d \"%.*s\", not %d \"%s\"",
                      i, bad[i].req, r.status, (int)r.body_len, r.body, bad[i].status, bad[i].why);
        /* A line naming the peer and what was wrong, for the first of each reason while
         * refusals.h counts that many apart (four requests share "malformed request line"). */
        if (i < REFUSALS_SOURCES + 3 &&
            log_lines(&s, "refused a request from '127.0.0.1:", bad[i].why) < 1)
            test_fail(__FILE__, __LINE__, "no log line for request %zu with \"%s\":\n%s", i,
                      bad[i].why, log_text(&s));
    }
    CHECK_LOG(&s, "warn: horovod rendezvous: refused a request from '127.0.0.1:", NULL,
              REFUSALS_SOURCES);
    /* Nothing a bad request said reached the store, and the server serves on. */
    CHECK_GET(s.port, "/a/b", "kept");
    CHECK_EQ(srv_counts(&s).keys, 1);
    /* HTTP/1.0 needs no Host. */
    http_raw(s.port, "GET /a/b HTTP/1.0\r\n\r\n", 21, &r);
    CHECK_EQ(r.status, 200);
    srv_stop(&s);
}

TEST(hvd_oversize_header_and_body_are_refused)
{
    struct hvd_config cfg = {.header_max = 1024, .body_max = 4096};
    char req[2048], *body;
    struct srv s;
    struct resp r;
    int n;

    srv_start(&s, &cfg);
    /* A header that does not end within header_max bytes: 431 once they are in. */
    n = snprintf(req, sizeof(req), "GET /a/b HTTP/1.1\r\nHost: x\r\nX-Pad: ");
    memset(req + n, 'p', sizeof(req) - (size_t)n);
    http_raw(s.port, req, cfg.header_max, &r);
    CHECK_EQ(r.status, 431);
    CHECK_LOG(&s, "refused", "request line and headers longer than 1024 bytes", 1);
    /* A header of exactly header_max bytes passes. */
    n = snprintf(req, sizeof(req), "GET /a/b HTTP/1.1\r\nHost: x\r\nX-Pad: ");
    memset(req + n, 'p', cfg.header_max - (size_t)n - 4);
    memcpy(req + cfg.header_max - 4, "\r\n\r\n", 4);
    http_raw(s.port, req, cfg.header_max, &r);
    CHECK_EQ(r.status, 404);
    /* A body over body_max: refused from its Content-Length, before any of it is read. */
    n = snprintf(req, sizeof(req), "PUT /a/b HTTP/1.1\r\nHost: x\r\nContent-Length: 4097\r\n\r\n");
    http_raw(s.port, req, (size_t)n, &r);
    CHECK_EQ(r.status, 413);
    CHECK_LOG(&s, "refused", "body of 4097 bytes, over the limit of 4096", 1);
    /* The same with the body sent along: the server answers from the header and drops the
     * rest, closing in order (no reset that could destroy the answer on a real network). */
    {
        char *big = calloc(1, 20000);
        CHECK(big);
        n = snprintf(big, 20000, "PUT /a/b HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n",
                     20000 - 60);
        memset(big + n, 'b', (size_t)(20000 - n));
        int fd = dial(s.port);
        send_all(fd, big, 20000);
        read_resp_at(__FILE__, __LINE__, fd, &r, PROMPT_MS);
        close(fd);
        free(big);
        CHECK_EQ(r.status, 413);
        CHECK(!r.reset);
    }
    n = snprintf(req, sizeof(req),
                 "PUT /a/b HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n");
    http_raw(s.port, req, (size_t)n, &r);
    CHECK_EQ(r.status, 413);
    /* A body of exactly body_max bytes, in many small writes. */
    body = malloc(cfg.body_max);
    CHECK(body);
    for (size_t i = 0; i < cfg.body_max; i++)
        body[i] = (char)('a' + i % 26);
    {
        int fd = dial(s.port);
        n = snprintf(req, sizeof(req),
                     "PUT /a/big HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n", cfg.body_max);
        send_all(fd, req, (size_t)n);
        for (size_t off = 0; off < cfg.body_max; off += 1000)
            send_all(fd, body + off, cfg.body_max - off < 1000 ? cfg.body_max - off : 1000);
        read_resp_at(__FILE__, __LINE__, fd, &r, PROMPT_MS);
        close(fd);
        CHECK_EQ(r.status, 200);
    }
    CHECK_EQ(http(s.port, "GET", "/a/big", "", 0, &r), 200);
    CHECK_EQ(r.body_len, cfg.body_max);
    CHECK(!memcmp(r.body, body, cfg.body_max));
    free(body);
    srv_stop(&s);
}

TEST(hvd_store_limits)
{
    struct hvd_config cfg = {.store_bytes_max = 100, .store_keys_max = 3};
    struct srv s;
    struct resp r;

    srv_start(&s, &cfg);
    CHECK_EQ(put(s.port, "/s/1", "a"), 200);
    CHECK_EQ(put(s.port, "/s/2", "b"), 200);
    CHECK_EQ(put(s.port, "/s/3", "c"), 200);
    /* A fourth key: over the key limit. */
    CHECK_EQ(http(s.port, "PUT", "/s/4", "d", 1, &r), 507);
    CHECK_LOG(&s, "refused a request from '127.0.0.1:", "store full", 1);
    CHECK_LOG(&s, "refused", "'PUT /s/4'", 1);
    CHECK_GET(s.port, "/s/4", NULL);
    /* Replacing a value is not a new key; growing it past the byte limit is refused. */
    CHECK_EQ(put(s.port, "/s/3", "cc"), 200);
    CHECK_EQ(put(s.port, "/s/3",
                 "0123456789012345678901234567890123456789012345678901234567890123"
                 "456789012345678901234567890123456789"),
             507);
    CHECK_GET(s.port, "/s/3", "cc");
    /* Freed room is room again. */
    CHECK_EQ(del(s.port, "/s/1"), 200);
    CHECK_EQ(put(s.port, "/s/4", "d"), 200);
    CHECK_GET(s.port, "/s/4", "d");
    srv_stop(&s);
}

/* --- slow clients and many connections ------------------------------------------------------ */

TEST(hvd_stalled_client_gets_408_and_others_are_served)
{
    struct hvd_config cfg = {.timeout_ms = SHORT_TIMEOUT_MS};
    struct srv s;
    struct resp r;
    int half, silent, lying;
    int64_t t0;

    srv_start(&s, &cfg);
    t0 = mono_ms();
    half = dial(s.port);
    send_all(half, "PUT /a/b HTTP/1.1\r\nHo", 21);
    silent = dial(s.port);
    /* A Content-Length that says more than the client sends. */
    lying = dial(s.port);
    send_all(lying, "PUT /a/c HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n1234", 53);
    /* Served while the three hang on. */
    CHECK_EQ(put(s.port, "/a/d", "fine"), 200);
    CHECK_GET(s.port, "/a/d", "fine");
    CHECK(mono_ms() - t0 < SHORT_TIMEOUT_MS);
    read_resp_at(__FILE__, __LINE__, half, &r, PROMPT_MS);
    CHECK_EQ(r.status, 408);
    CHECK(mono_ms() - t0 >= SHORT_TIMEOUT_MS);
    read_resp_at(__FILE__, __LINE__, silent, &r, PROMPT_MS);
    CHECK_EQ(r.status, 408);
    read_resp_at(__FILE__, __LINE__, lying, &r, PROMPT_MS);
    CHECK_EQ(r.status, 408);
    close(half);
    close(silent);
    close(lying);
    CHECK_LOG(&s, "refused a request from '127.0.0.1:", "no whole request within 300 ms", 3);
    CHECK_LOG(&s, "refused", "(21 bytes came)", 1);
    CHECK_LOG(&s, "refused", "(0 bytes came)", 1);
    CHECK_LOG(&s, "refused", "(53 bytes came)", 1);
    /* The half request reached nothing. */
    CHECK_GET(s.port, "/a/c", NULL);
    /* A client that hangs up mid-request: one line, and nothing stored. */
    half = dial(s.port);
    send_all(half, "PUT /a/e HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12", 51);
    close(half);
    for (int64_t end = mono_ms() + PROMPT_MS; mono_ms() < end;)
        if (log_lines(&s, "went away in the middle of a request", NULL) == 1)
            break;
    CHECK_LOG(&s, "'127.0.0.1:", "went away in the middle of a request (51 bytes)", 1);
    CHECK_GET(s.port, "/a/e", NULL);
    srv_stop(&s);
}

TEST(hvd_many_connections)
{
    enum { CONNS_MAX = 8, CLIENTS = 64 };
    struct hvd_config cfg = {.conns_max = CONNS_MAX, .timeout_ms = SHORT_TIMEOUT_MS};
    int fds[CLIENTS], idle[CONNS_MAX], waiting;
    char req[128], path[32], value[32];
    struct srv s;
    struct resp r;
    int64_t t0;

    srv_start(&s, &cfg);
    /* Many more clients than slots, all connected at once, each with a whole PUT: the ones past
     * the limit wait in the backlog and are served in turn, none refused. */
    for (int i = 0; i < CLIENTS; i++) {
        int n = snprintf(req, sizeof(req),
                         "PUT /many/%d HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\nvalue%d", i,
                         5 + snprintf(value, sizeof(value), "%d", i), i);
        fds[i] = dial(s.port);
        send_all(fds[i], req, (size_t)n);
    }
    for (int i = 0; i < CLIENTS; i++) {
        read_resp_at(__FILE__, __LINE__, fds[i], &r, PROMPT_MS);
        if (r.status != 200)
            test_fail(__FILE__, __LINE__, "client %d: status %d, not 200", i, r.status);
        close(fds[i]);
    }
    for (int i = 0; i < CLIENTS; i++) {
        snprintf(path, sizeof(path), "/many/%d", i);
        snprintf(value, sizeof(value), "value%d", i);
        CHECK_GET(s.port, path, value);
    }
    CHECK_LOG(&s, "horovod", NULL, 0);
    /* Every slot held by a silent client: a whole request waits until the slots free up (the
     * silent ones time out), and is then answered. */
    for (int i = 0; i < CONNS_MAX; i++)
        idle[i] = dial(s.port);
    t0 = mono_ms();
    waiting = dial(s.port);
    send_all(waiting, "GET /many/1 HTTP/1.1\r\nHost: x\r\n\r\n", 33);
    read_resp_at(__FILE__, __LINE__, waiting, &r, SHORT_TIMEOUT_MS / 2);
    CHECK_EQ(r.status, 0);
    read_resp_at(__FILE__, __LINE__, waiting, &r, PROMPT_MS);
    CHECK_EQ(r.status, 200);
    CHECK(mono_ms() - t0 >= SHORT_TIMEOUT_MS);
    for (int i = 0; i < CONNS_MAX; i++) {
        read_resp_at(__FILE__, __LINE__, idle[i], &r, PROMPT_MS);
        CHECK_EQ(r.status, 408);
        close(idle[i]);
    }
    close(waiting);
    /* One line for the first; the rest are summarised. */
    CHECK_LOG(&s, "refused", "no whole request", 1);
    srv_stop(&s);
    CHECK_LOG(&s, "refused 8 connections from '127.0.0.1' in", "no whole request", 1);
}

TEST(hvd_close_with_requests_in_flight)
{
    struct srv s;
    int fds[4];

    srv_start(&s, NULL);
    CHECK_EQ(put(s.port, "/a/b", "v"), 200);
    fds[0] = dial(s.port);
    send_all(fds[0], "PUT /a/c HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12", 51);
    fds[1] = dial(s.port);
    fds[2] = dial(s.port);
    send_all(fds[2], "GET /a/", 7);
    fds[3] = dial(s.port);
    /* Give the server a moment to accept them all, then close it under them: the loop must
     * end with nothing left (srv_stop checks uv_loop_close). */
    usleep(100 * 1000);
    srv_stop(&s);
    for (int i = 0; i < 4; i++)
        close(fds[i]);
}

/* --- strangers, floods and the job's bounds ------------------------------------------------ */

/* ip (numeric) with port as a sockaddr; four at a time stay valid. */
static const struct sockaddr *sa_of(const char *ip, int port)
{
    static struct sockaddr_storage ss[4];
    static int next;
    struct sockaddr_storage *p = &ss[next++ % 4];

    memset(p, 0, sizeof(*p));
    if (uv_ip4_addr(ip, port, (struct sockaddr_in *)p) < 0)
        CHECK_EQ(uv_ip6_addr(ip, port, (struct sockaddr_in6 *)p), 0);
    return (const struct sockaddr *)p;
}

TEST(hvd_peer_allowed_is_this_host_or_the_jobs)
{
    struct sockaddr_storage allow[2];

    memcpy(&allow[0], sa_of("10.0.0.2", 0), sizeof(allow[0]));
    memcpy(&allow[1], sa_of("fd00::3", 0), sizeof(allow[1]));
    /* This host: the peer's address is the connection's own, whatever the list. */
    CHECK(hvd_peer_allowed(sa_of("127.0.0.1", 40000), sa_of("127.0.0.1", 41000), NULL, 0));
    CHECK(hvd_peer_allowed(sa_of("10.0.0.1", 40000), sa_of("10.0.0.1", 41000), allow, 2));
    /* Another loopback address is not this connection's own: a stranger. */
    CHECK(!hvd_peer_allowed(sa_of("127.0.0.2", 40000), sa_of("127.0.0.1", 41000), NULL, 0));
    /* The job's hosts, any port; IPv4-mapped IPv6 is IPv4. */
    CHECK(hvd_peer_allowed(sa_of("10.0.0.2", 5), sa_of("10.0.0.1", 41000), allow, 2));
    CHECK(hvd_peer_allowed(sa_of("::ffff:10.0.0.2", 5), sa_of("::", 41000), allow, 2));
    CHECK(hvd_peer_allowed(sa_of("fd00::3", 5), sa_of("fd00::1", 41000), allow, 2));
    CHECK(!hvd_peer_allowed(sa_of("10.0.0.3", 5), sa_of("10.0.0.1", 41000), allow, 2));
    CHECK(!hvd_peer_allowed(sa_of("fd00::4", 5), sa_of("fd00::1", 41000), allow, 2));
    CHECK(!hvd_peer_allowed(sa_of("10.0.0.2", 5), sa_of("10.0.0.1", 41000), allow, 0));
}

#define CHECK_NEED(nnodes, nprocs, want_bytes, want_keys, want_body)                               \
    do {                                                                                           \
        size_t b_, k_, y_;                                                                         \
        hvd_store_need((nnodes), (nprocs), &b_, &k_, &y_);                                         \
        if (b_ != (want_bytes) || k_ != (want_keys) || y_ != (want_body))                          \
            test_fail(__FILE__, __LINE__,                                                          \
                      "need of %d x %d: %zu bytes, %zu keys, body %zu; not "                       \
                      "%zu, %zu, %zu",                                                             \
                      (nnodes), (nprocs), b_, k_, y_, (size_t)(want_bytes), (size_t)(want_keys),   \
                      (size_t)(want_body));                                                        \
    } while (0)

TEST(hvd_store_need_is_what_the_ranks_can_use)
{
    /* A few ranks: the floor, 64 KiB; one rank's largest value is its global one (136 bytes a
     * peer) and its slack. */
    CHECK_NEED(1, 1, 64 * 1024, 256, 136 + 4096);
    CHECK_NEED(2, 2, 64 * 1024, 256, 4 * 136 + 4096);
    /* 64 ranks: 136 bytes for each of 64 + 8 + 8 peers and 4 KiB each, about 15 KiB a rank. */
    CHECK_NEED(8, 8, 64 * (136 * 80 + 4096), 64 * 16, 64 * 136 + 4096);
    /* 1024 ranks: quadratic (gloo's full mesh), 158 MiB, still under HVD_STORE_BYTES_MAX. */
    CHECK_NEED(128, 8, 1024 * (136 * 1160 + 4096), 1024 * 16, 1024 * 136 + 4096);
    CHECK(1024 * (136 * 1160 + 4096) < HVD_STORE_BYTES_MAX);
}

/* One connection from 127.0.0.2 (a stranger: the server listens on 127.0.0.1, and the job's
 * hosts are not given) sending req: the bytes that came back before the server closed it. */
static size_t stranger(int port, const char *req)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct sockaddr_in me = {.sin_family = AF_INET};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    size_t got = 0;
    char buf[4096];

    CHECK(fd >= 0);
    me.sin_addr.s_addr = htonl(INADDR_LOOPBACK + 1);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(bind(fd, (struct sockaddr *)&me, sizeof(me)), 0);
    CHECK_EQ(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    /* The server may have closed already: a failed send is the point, not an error. */
    (void)!send(fd, req, strlen(req), MSG_NOSIGNAL);
    for (;;) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        ssize_t n;
        if (poll(&pfd, 1, PROMPT_MS) <= 0)
            test_fail(__FILE__, __LINE__, "the server kept a stranger's connection %d ms",
                      PROMPT_MS);
        n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    return got;
}

struct allow_args {
    int n;
    const char *const *addrs;
    int ret;
};

static void do_allow(struct srv *s, void *arg)
{
    struct allow_args *a = arg;

    a->ret = hvd_server_allow(s->h, a->n, a->addrs);
}

TEST(hvd_a_stranger_is_closed_unanswered)
{
    enum { TRIES = 200 };
    static const char *const none[] = {"a-host-name"};
    static const char *const job[] = {"a-host-name", "127.0.0.2"};
    struct allow_args a = {2, job, -1}, b = {1, none, -1};
    struct srv s;

    srv_start(&s, NULL);
    CHECK_EQ(put(s.port, "/a/b", "the job's"), 200);
    for (int i = 0; i < TRIES; i++) {
        size_t got = stranger(s.port, i % 2 ? "GET /a/b HTTP/1.1\r\nHost: x\r\n\r\n"
                                            : "PUT /a/c HTTP/1.1\r\nHost: x\r\n"
                                              "Content-Length: 5\r\n\r\nfill!");
        if (got)
            test_fail(__FILE__, __LINE__, "stranger %d got %zu bytes of an answer", i, got);
    }
    /* Nothing stored; one line, the rest counted; the job's own host still served. */
    CHECK_EQ(srv_counts(&s).keys, 1);
    CHECK_GET(s.port, "/a/c", NULL);
    CHECK_LOG(&s, "horovod rendezvous", NULL, 1);
    CHECK_LOG(&s, "refused a connection from '127.0.0.2:", "not one of the job's hosts", 1);
    /* Once one of the job's hosts, served; a name on the list is skipped, not resolved. */
    srv_call(&s, do_allow, &b);
    CHECK_EQ(b.ret, 0);
    CHECK_EQ(stranger(s.port, "GET /a/b HTTP/1.1\r\nHost: x\r\n\r\n"), 0);
    srv_call(&s, do_allow, &a);
    CHECK_EQ(a.ret, 1);
    CHECK(stranger(s.port, "GET /a/b HTTP/1.1\r\nHost: x\r\n\r\n") > 0);
    srv_stop(&s);
    CHECK_LOG(&s, "refused 201 connections from '127.0.0.2' in", "not one of the job's hosts", 1);
}

TEST(hvd_a_flood_of_bad_requests_is_summarised)
{
    enum { FLOOD = 300 };
    struct srv s;
    struct resp r;

    srv_start(&s, NULL);
    for (int i = 0; i < FLOOD; i++) {
        http_raw(s.port, "GARBAGE\r\n\r\n", 11, &r);
        CHECK_EQ(r.status, 400);
    }
    /* The first in full, the rest in one summary line when the window ends (the close). */
    CHECK_LOG(&s, "horovod rendezvous", NULL, 1);
    srv_stop(&s);
    CHECK_LOG(&s, "horovod rendezvous", NULL, 2);
    CHECK_LOG(&s, "refused 300 connections from '127.0.0.1' in", "malformed request line", 1);
}

static void do_bytes_max(struct srv *s, void *arg)
{
    *(size_t *)arg = hvd_server_bytes_max(s->h);
}

TEST(hvd_layout_bounds_the_store_to_the_job)
{
    static const char *const hosts[] = {"a"};
    char value[4096 + 137];
    size_t max = 0, stored = 0;
    struct srv s;
    struct resp r;
    int status = 200;

    srv_start(&s, NULL);
    srv_call(&s, do_bytes_max, &max);
    CHECK_EQ(max, HVD_STORE_BYTES_MAX);
    srv_layout(&s, 1, 1, hosts);
    srv_call(&s, do_bytes_max, &max);
    CHECK_EQ(max, 64 * 1024);
    /* One rank's largest value, and a byte more. */
    memset(value, 'v', sizeof(value));
    CHECK_EQ(http(s.port, "PUT", "/global/0", value, 4096 + 136, &r), 200);
    CHECK_EQ(http(s.port, "PUT", "/global/0", value, 4096 + 137, &r), 413);
    /* Filling: refused at the bound, long before the config's 256 MiB. */
    for (int i = 0; i < 100 && status == 200; i++) {
        char path[32];
        snprintf(path, sizeof(path), "/fill/%d", i);
        status = http(s.port, "PUT", path, value, 4096, &r);
        stored += status == 200 ? 4096 : 0;
    }
    CHECK_EQ(status, 507);
    CHECK(srv_counts(&s).bytes <= 64 * 1024);
    CHECK(stored >= 56 * 1024);
    srv_stop(&s);
}

TEST(hvd_bind_address_must_be_numeric)
{
    struct hvd_server *h = NULL;
    uv_loop_t loop;

    CHECK_EQ(uv_loop_init(&loop), 0);
    CHECK_EQ(hvd_server_start(&loop, &(struct hvd_config){.bind_addr = "localhost"}, &h), -EINVAL);
    CHECK(h == NULL);
    CHECK_EQ(uv_run(&loop, UV_RUN_DEFAULT), 0);
    CHECK_EQ(uv_loop_close(&loop), 0);
}

/* --- the interface and the rank environment ------------------------------------------------ */

TEST(hvd_iface_of_an_address)
{
    char name[64];

    CHECK_EQ(hvd_iface_of("127.0.0.1", name, sizeof(name)), 0);
    CHECK_STR(name, "lo");
    /* TEST-NET-1 (RFC 5737): on no interface. */
    CHECK_EQ(hvd_iface_of("192.0.2.1", name, sizeof(name)), -ENOENT);
    CHECK_EQ(hvd_iface_of("localhost", name, sizeof(name)), -EINVAL);
    CHECK_EQ(hvd_iface_of("127.0.0.1", name, 2), -ENOENT);
}

static struct jobspec env_spec = {.job_id = (char *)"j1", .nnodes = 2, .nprocs = 2};

/* The rank environment of rank (node, local) in a 2 x 2 job, with base as the agent's. */
static char **env_of(int node, int local, char *const *base, int hvd_port, const char *iface)
{
    struct rankenv_rank re = {
        .spec = &env_spec,
        .rank = node * 2 + local,
        .local_rank = local,
        .local_world_size = 2,
        .world_size = 4,
        .node_rank = node,
        .nnodes = 2,
        .master_addr = "10.0.0.1",
        .master_port = 29500,
        .sock = "/tmp/s",
        .token = "00",
        .job_dir = "",
        .node_addr = node ? "10.0.0.2" : "10.0.0.1",
        .hostname = "box",
        .cpus = 4,
        .hvd_port = hvd_port,
        .hvd_host = node ? "node1" : "node0",
        .hvd_iface = iface,
    };
    char **env = rankenv_build(&re, base);

    CHECK(env);
    return env;
}

static const char *env_get(char **env, const char *k)
{
    size_t n = strlen(k);

    for (char **p = env; *p; p++)
        if (!strncmp(*p, k, n) && (*p)[n] == '=')
            return *p + n + 1;
    return NULL;
}

#define CHECK_ENV(env, k, want)                                                                    \
    do {                                                                                           \
        const char *got_ = env_get((env), (k)), *want_ = (want);                                   \
        if (want_ ? !got_ || strcmp(got_, want_) : got_ != NULL)                                   \
            test_fail(__FILE__, __LINE__, "%s=%s, not %s", (k), got_ ? got_ : "(unset)",           \
                      want_ ? want_ : "(unset)");                                                  \
    } while (0)

TEST(hvd_rank_environment_is_gloo_runs)
{
    /* gloo_run for -H node0:2,node1:2 -np 4: get_host_assignments' slots, then
     * create_slot_env_vars and create_run_env_vars. */
    static const char *const want[4][7] = {
        /* HOSTNAME, RANK, SIZE, LOCAL_RANK, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE */
        {"node0", "0", "4", "0", "2", "0", "2"},
        {"node0", "1", "4", "1", "2", "0", "2"},
        {"node1", "2", "4", "0", "2", "1", "2"},
        {"node1", "3", "4", "1", "2", "1", "2"},
    };
    static const char *const names[7] = {
        "HOROVOD_HOSTNAME",   "HOROVOD_RANK",       "HOROVOD_SIZE",       "HOROVOD_LOCAL_RANK",
        "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE",
    };

    for (int r = 0; r < 4; r++) {
        char **env = env_of(r / 2, r % 2, NULL, 41000, r / 2 ? "eth1" : "eth0");
        for (int i = 0; i < 7; i++)
            CHECK_ENV(env, names[i], want[r][i]);
        CHECK_ENV(env, "HOROVOD_GLOO_RENDEZVOUS_ADDR", "10.0.0.1");
        CHECK_ENV(env, "HOROVOD_GLOO_RENDEZVOUS_PORT", "41000");
        CHECK_ENV(env, "HOROVOD_CONTROLLER", "gloo");
        CHECK_ENV(env, "HOROVOD_CPU_OPERATIONS", "gloo");
        CHECK_ENV(env, "HOROVOD_GLOO_IFACE", r / 2 ? "eth1" : "eth0");
        CHECK_ENV(env, "HOROVOD_ELASTIC", NULL);
        rankenv_free(env);
    }
}

TEST(hvd_rank_environment_user_settings_win)
{
    char *base[] = {
        (char *)"HOROVOD_CONTROLLER=mpi",         (char *)"HOROVOD_CPU_OPERATIONS=ccl",
        (char *)"HOROVOD_GLOO_IFACE=ib0",         (char *)"HOROVOD_RANK=7",
        (char *)"HOROVOD_HOSTNAME=elsewhere",     (char *)"HOROVOD_GLOO_RENDEZVOUS_ADDR=192.0.2.9",
        (char *)"HOROVOD_GLOO_RENDEZVOUS_PORT=1", NULL};
    char **env = env_of(1, 0, base, 41000, "eth0");

    CHECK_ENV(env, "HOROVOD_CONTROLLER", "mpi");
    CHECK_ENV(env, "HOROVOD_CPU_OPERATIONS", "ccl");
    CHECK_ENV(env, "HOROVOD_GLOO_IFACE", "ib0");
    /* The layout and the server are gpurun's to say. */
    CHECK_ENV(env, "HOROVOD_RANK", "2");
    CHECK_ENV(env, "HOROVOD_HOSTNAME", "node1");
    CHECK_ENV(env, "HOROVOD_GLOO_RENDEZVOUS_ADDR", "10.0.0.1");
    CHECK_ENV(env, "HOROVOD_GLOO_RENDEZVOUS_PORT", "41000");
    rankenv_free(env);
    /* No server (a leader without one): no inherited address either; no interface found: none
     * set. */
    env = env_of(1, 0, base + 3, 0, NULL);
    CHECK_ENV(env, "HOROVOD_GLOO_RENDEZVOUS_ADDR", NULL);
    CHECK_ENV(env, "HOROVOD_GLOO_RENDEZVOUS_PORT", NULL);
    CHECK_ENV(env, "HOROVOD_GLOO_IFACE", NULL);
    CHECK_ENV(env, "HOROVOD_CONTROLLER", "gloo");
    rankenv_free(env);
}
