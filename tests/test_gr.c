/* Tests of the rank library against an agent the test plays itself: a forked process on a
 * Unix listener that reads the library's frames with the real decoder (so every request must
 * pass the protocol's strict formats) and answers what each test scripts, down to garbage,
 * split frames and a closed socket. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "frame.h"
#include "gr.h"
#include "proto.h"
#include "test.h"
#include "banned.h"

#define TOKEN "00ff10aa"

/* --- the agent's side ---------------------------------------------------------------------- */

struct conn {
    int fd;
    struct frame_reader rd;
};

typedef void (*peer_fn)(struct conn *c, int i);

static char sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
/* The rank the agent expects in the hello. */
static int hello_rank = 1;

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Reads the next message into *m; false at end of stream (with nothing half-sent). */
static bool conn_next(struct conn *c, struct msg *m)
{
    uint8_t buf[64 * 1024];

    for (;;) {
        struct proto_error pe;
        const uint8_t *p;
        size_t n;
        int r = frame_reader_next(&c->rd, &p, &n);

        CHECK_INT(r, >=, 0);
        if (r == 1) {
            if (proto_decode(p, n, m, &pe) < 0)
                test_fail(__FILE__, __LINE__, "agent cannot decode '%.*s': %s", (int)n, p,
                          pe.why.text);
            return true;
        }
        ssize_t got = read(c->fd, buf, sizeof(buf));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            CHECK_EQ(frame_reader_pending(&c->rd), 0);
            return false;
        }
        CHECK_EQ(frame_reader_feed(&c->rd, buf, (size_t)got), 0);
    }
}

static void conn_expect(struct conn *c, struct msg *m, enum msg_type t)
{
    if (!conn_next(c, m))
        test_fail(__FILE__, __LINE__, "agent: end of stream, expected '%s'", proto_type_name(t));
    CHECK_STR(proto_type_name(m->type), proto_type_name(t));
}

static void conn_expect_eof(struct conn *c)
{
    struct msg m;

    if (conn_next(c, &m))
        test_fail(__FILE__, __LINE__, "agent: got '%s', expected the end of the stream",
                  proto_type_name(m.type));
}

static void send_raw(int fd, const void *p, size_t n)
{
    CHECK_EQ(send(fd, p, n, MSG_NOSIGNAL), (long long)n);
}

/* Sends one frame whose JSON is printf-formatted. */
__attribute__((format(printf, 2, 3))) static void conn_send(struct conn *c, const char *fmt, ...)
{
    char json[4096];
    uint8_t hdr[FRAME_HDR_LEN];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(json, sizeof(json), fmt, ap);
    va_end(ap);
    CHECK(n > 0 && n < (int)sizeof(json));
    frame_put_header(hdr, (uint32_t)n);
    send_raw(c->fd, hdr, sizeof(hdr));
    send_raw(c->fd, json, (size_t)n);
}

static void conn_ok(struct conn *c, long long id)
{
    conn_send(c, "{\"type\":\"ok\",\"id\":%lld}", id);
}

/* The hello every connection opens with, answered ok. */
static void conn_hello(struct conn *c)
{
    struct msg m;

    conn_expect(c, &m, MSG_HELLO);
    CHECK_EQ(m.rank, hello_rank);
    CHECK_STR(m.value, TOKEN);
    proto_msg_release(&m);
    conn_ok(c, 0);
}

static void conn_finalize(struct conn *c)
{
    struct msg m;

    conn_expect(c, &m, MSG_FINALIZE);
    conn_ok(c, m.id);
    proto_msg_release(&m);
    conn_expect_eof(c);
}

/* The rank's environment for rank 1 of 4, the second of two on node 0. */
static void set_env(void)
{
    setenv("GPURUN_SOCK", sock_path, 1);
    setenv("GPURUN_TOKEN", TOKEN, 1);
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    setenv("NODE_RANK", "0", 1);
}

/* Forks an agent that serves nconn connections in turn with fn and exits 0. */
static pid_t peer_start(peer_fn fn, int nconn)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int lfd;
    pid_t pid;

    snprintf(sock_path, sizeof(sock_path), "%s/agent.sock", test_tmpdir());
    memcpy(sa.sun_path, sock_path, sizeof(sock_path));
    lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK_INT(lfd, >=, 0);
    CHECK_EQ(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    CHECK_EQ(listen(lfd, 8), 0);
    set_env();
    pid = fork();
    CHECK_INT(pid, >=, 0);
    if (pid == 0) {
        for (int i = 0; i < nconn; i++) {
            struct conn c = {.fd = accept(lfd, NULL, NULL)};
            CHECK_INT(c.fd, >=, 0);
            frame_reader_init(&c.rd, FRAME_MAX_DEFAULT);
            fn(&c, i);
            frame_reader_release(&c.rd);
            close(c.fd);
        }
        _exit(0);
    }
    close(lfd);
    return pid;
}

static void peer_wait(pid_t pid)
{
    int st = 0;

    CHECK_EQ(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        test_fail(__FILE__, __LINE__, "the agent process failed (status 0x%x)", st);
}

static struct gr *start(void)
{
    struct gr *g = NULL;
    int ret = gr_init(&g);

    if (ret < 0)
        test_fail(__FILE__, __LINE__, "gr_init: %d: %s", ret, gr_strerror(NULL));
    CHECK(g != NULL);
    return g;
}

/* --- the environment ------------------------------------------------------------------------ */

TEST(gr_init_without_sock)
{
    struct gr *g = (struct gr *)&g;

    set_env();
    unsetenv("GPURUN_SOCK");
    CHECK_EQ(gr_init(&g), -ENOENT);
    CHECK(g == NULL);
    CHECK_CONTAINS(gr_strerror(NULL), "'GPURUN_SOCK' is not set");
}

TEST(gr_init_missing_var)
{
    static const char *const vars[] = {"RANK",      "WORLD_SIZE",   "LOCAL_RANK",
                                       "NODE_RANK", "GPURUN_TOKEN", "LOCAL_WORLD_SIZE"};
    struct gr *g = NULL;

    snprintf(sock_path, sizeof(sock_path), "%s/none.sock", test_tmpdir());
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        set_env();
        unsetenv(vars[i]);
        CHECK_EQ(gr_init(&g), -ENOENT);
        CHECK(g == NULL);
        CHECK_CONTAINS(gr_strerror(NULL), vars[i]);
        CHECK_CONTAINS(gr_strerror(NULL), "is not set");
    }
}

TEST(gr_init_bad_env)
{
    static const struct {
        const char *var, *value, *text;
    } cases[] = {
        {"RANK", "1x", "expected a decimal number"},
        {"RANK", " 1", "expected a decimal number"},
        {"RANK", "+1", "expected a decimal number"},
        {"RANK", "-1", "expected a decimal number"},
        {"RANK", "", "is empty"},
        {"RANK", "99999999999", "out of range"},
        {"RANK", "4", "not below 'WORLD_SIZE' 4"},
        {"WORLD_SIZE", "0", "must be at least 1"},
        {"LOCAL_RANK", "2", "not below 'LOCAL_WORLD_SIZE' 2"},
        {"LOCAL_WORLD_SIZE", "8", "above 'WORLD_SIZE' 4"},
        {"NODE_RANK", "0x1", "expected a decimal number"},
        {"GPURUN_TOKEN", "abc", "expected hex digits"},
        {"GPURUN_TOKEN", "", "expected hex digits"},
        {"GPURUN_TOKEN", "00zz", "not hex"},
    };
    struct gr *g = NULL;

    /* A path nobody listens on: a well-formed environment would fail with -ENOENT. */
    snprintf(sock_path, sizeof(sock_path), "%s/none.sock", test_tmpdir());
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        set_env();
        setenv(cases[i].var, cases[i].value, 1);
        CHECK_EQ(gr_init(&g), -EINVAL);
        CHECK(g == NULL);
        CHECK_CONTAINS(gr_strerror(NULL), cases[i].var);
        CHECK_CONTAINS(gr_strerror(NULL), cases[i].text);
    }
    set_env();
    CHECK_EQ(gr_init(&g), -ENOENT);
    CHECK_CONTAINS(gr_strerror(NULL), "cannot connect to agent");
}

TEST(gr_init_refused)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct gr *g = NULL;
    int fd;

    /* A socket file whose listener is gone, as a dead agent leaves it. */
    snprintf(sock_path, sizeof(sock_path), "%s/dead.sock", test_tmpdir());
    memcpy(sa.sun_path, sock_path, sizeof(sock_path));
    fd = socket(AF_UNIX, SOCK_STREAM, 0);
    CHECK_EQ(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    close(fd);
    set_env();
    CHECK_EQ(gr_init(&g), -ECONNREFUSED);
    CHECK(g == NULL);
    CHECK_CONTAINS(gr_strerror(NULL), "cannot connect to agent '");
    CHECK_CONTAINS(gr_strerror(NULL), "dead.sock': connection refused");
}

/* --- under PMIx ----------------------------------------------------------------------------- */

#ifdef __SANITIZE_ADDRESS__
/* libpmix keeps 4 bytes of a PMIx_Init that finds no server (pmix_bfrops_base_value_load):
 * its leak, not the rank library's, which LeakSanitizer is told here (it reads this hook at
 * exit). */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void)
{
    return "leak:libpmix.so\n";
}
#endif

/* The variables a PMIx launcher gives a rank, with a server address nobody answers on. */
static void set_pmix_env(void)
{
    setenv("PMIX_RANK", "0", 1);
    setenv("PMIX_NAMESPACE", "gr.test.ns", 1);
    setenv("PMIX_SERVER_URI41", "pmix-server.1;tcp4://127.0.0.1:1", 1);
}

TEST(gr_init_sock_before_pmix)
{
    struct gr *g = NULL;

    /* rendezvousd's variables win over a PMIx launcher's: the agent is asked, not PMIx. */
    snprintf(sock_path, sizeof(sock_path), "%s/none.sock", test_tmpdir());
    set_env();
    set_pmix_env();
    CHECK_EQ(gr_init(&g), -ENOENT);
    CHECK(g == NULL);
    CHECK_CONTAINS(gr_strerror(NULL), "cannot connect to agent");
}

TEST(gr_init_pmix_unreachable)
{
    struct gr *g = NULL;
    int ret;

    set_env();
    unsetenv("GPURUN_SOCK");
    set_pmix_env();
    ret = gr_init(&g);
    CHECK(g == NULL);
#ifdef HAVE_PMIX
    CHECK_EQ(ret, -ECONNREFUSED);
    CHECK_CONTAINS(gr_strerror(NULL), "cannot connect to the PMIx server");
#else
    /* Built without libpmix: a PMIx launcher's rank is just not one of rendezvousd's. */
    CHECK_EQ(ret, -ENOENT);
    CHECK_CONTAINS(gr_strerror(NULL), "'GPURUN_SOCK' is not set");
#endif
}

/* --- hello and finalize ------------------------------------------------------------------ */

static void peer_hello_finalize(struct conn *c, int i)
{
    (void)i;
    conn_hello(c);
    conn_finalize(c);
}

TEST(gr_hello_and_finalize)
{
    pid_t pid = peer_start(peer_hello_finalize, 1);
    struct gr *g = start();

    CHECK_EQ(gr_rank(g), 1);
    CHECK_EQ(gr_world_size(g), 4);
    CHECK_EQ(gr_local_rank(g), 1);
    CHECK_EQ(gr_local_world_size(g), 2);
    CHECK_EQ(gr_node_rank(g), 0);
    CHECK_STR(gr_strerror(g), "");
    CHECK_EQ(gr_finalize(g), 0);
    CHECK_EQ(gr_finalize(NULL), 0);
    peer_wait(pid);
}

static void peer_hello_refused(struct conn *c, int i)
{
    struct msg m;

    conn_expect(c, &m, MSG_HELLO);
    proto_msg_release(&m);
    if (i == 0)
        conn_send(c, "{\"type\":\"error\",\"id\":0,\"code\":\"denied\",\"msg\":\"bad token for "
                     "rank 1\"}");
    /* i == 1: the agent hangs up without a word. */
}

TEST(gr_hello_refused)
{
    pid_t pid = peer_start(peer_hello_refused, 2);
    struct gr *g = NULL;

    CHECK_EQ(gr_init(&g), -EACCES);
    CHECK(g == NULL);
    CHECK_CONTAINS(gr_strerror(NULL), "bad token for rank 1");
    CHECK_EQ(gr_init(&g), -ECONNRESET);
    CHECK(g == NULL);
    CHECK_CONTAINS(gr_strerror(NULL), "closed the connection");
    peer_wait(pid);
}

/* --- the store ------------------------------------------------------------------------------ */

/* Base64 the agent must see for each put of gr_kv_put_base64, and the reverse for gets. */
static const struct {
    const char *raw;
    size_t len;
    const char *b64;
} b64_cases[] = {
    {"", 0, ""},
    {"\x00", 1, "AA=="},
    {"\x00\xff", 2, "AP8="},
    {"\x00\xff\x10", 3, "AP8Q"},
    {"\xfb\xff\xbf\x00", 4, "+/+/AA=="},
};

#define NCASES (sizeof(b64_cases) / sizeof(b64_cases[0]))

static void peer_put_base64(struct conn *c, int i)
{
    long long last_id = 0;
    struct msg m;

    (void)i;
    conn_hello(c);
    for (size_t k = 0; k < NCASES; k++) {
        conn_expect(c, &m, MSG_KV_PUT);
        CHECK_STR(m.key, "nccl/uid");
        CHECK_STR(m.value, b64_cases[k].b64);
        CHECK_INT(m.id, >, last_id);
        last_id = m.id;
        conn_ok(c, m.id);
        proto_msg_release(&m);
    }
    /* Every byte value, in a value whose length is not a multiple of 3. */
    conn_expect(c, &m, MSG_KV_PUT);
    {
        uint8_t out[512];
        size_t n = strlen(m.value);
        CHECK_EQ(n, 4 * ((256 + 2) / 3));
        CHECK_EQ(EVP_DecodeBlock(out, (const unsigned char *)m.value, (int)n), n / 4 * 3);
        for (int b = 0; b < 256; b++)
            CHECK_EQ(out[b], b);
        CHECK_STR(m.value + n - 4, "/w==");
    }
    conn_ok(c, m.id);
    proto_msg_release(&m);
    conn_finalize(c);
}

TEST(gr_kv_put_base64)
{
    pid_t pid = peer_start(peer_put_base64, 1);
    struct gr *g = start();
    uint8_t all[256];

    for (size_t k = 0; k < NCASES; k++)
        CHECK_EQ(gr_kv_put(g, "nccl/uid", b64_cases[k].raw, b64_cases[k].len), 0);
    for (int b = 0; b < 256; b++)
        all[b] = (uint8_t)b;
    CHECK_EQ(gr_kv_put(g, "all", all, sizeof(all)), 0);
    CHECK_EQ(gr_finalize(g), 0);
    peer_wait(pid);
}

static void peer_get_base64(struct conn *c, int i)
{
    struct msg m;

    (void)i;
    conn_hello(c);
    for (size_t k = 0; k < NCASES; k++) {
        conn_expect(c, &m, MSG_KV_GET);
        CHECK_STR(m.key, "k");
        CHECK_EQ(m.timeout_ms, 250);
        conn_send(c, "{\"type\":\"kv_val\",\"id\":%lld,\"value\":\"%s\"}", (long long)m.id,
                  b64_cases[k].b64);
        proto_msg_release(&m);
    }
    /* Too small a buffer, then a value that is not strict base64. */
    conn_expect(c, &m, MSG_KV_GET);
    conn_send(c, "{\"type\":\"kv_val\",\"id\":%lld,\"value\":\"AP8Q\"}", (long long)m.id);
    proto_msg_release(&m);
    conn_expect(c, &m, MSG_KV_GET);
    conn_send(c, "{\"type\":\"kv_val\",\"id\":%lld,\"value\":\"A=AA\"}", (long long)m.id);
    proto_msg_release(&m);
    conn_expect_eof(c);
}

TEST(gr_kv_get_base64)
{
    pid_t pid = peer_start(peer_get_base64, 1);
    struct gr *g = start();
    uint8_t buf[16];
    size_t len;

    for (size_t k = 0; k < NCASES; k++) {
        memset(buf, 0xee, sizeof(buf));
        len = 99;
        CHECK_EQ(gr_kv_get(g, "k", buf, sizeof(buf), &len, 250), 0);
        CHECK_EQ(len, b64_cases[k].len);
        CHECK(memcmp(buf, b64_cases[k].raw, len) == 0);
        CHECK_EQ(buf[len], 0xee);
    }
    len = 0;
    memset(buf, 0xee, sizeof(buf));
    CHECK_EQ(gr_kv_get(g, "k", buf, 2, &len, 250), -ENOBUFS);
    CHECK_EQ(len, 3);
    CHECK_EQ(buf[0], 0xee);
    CHECK_CONTAINS(gr_strerror(g), "value of 3 bytes does not fit in 2");
    CHECK_EQ(gr_kv_get(g, "k", buf, sizeof(buf), &len, 250), -EPROTO);
    CHECK_CONTAINS(gr_strerror(g), "not base64");
    /* The link is out of step now: nothing more goes out. */
    CHECK_EQ(gr_kv_put(g, "k", "v", 1), -EPROTO);
    CHECK_EQ(gr_finalize(g), -EPROTO);
    CHECK_CONTAINS(gr_strerror(NULL), "not base64");
    peer_wait(pid);
}

static const struct {
    const char *code;
    int err;
} error_cases[] = {
    {"timeout", -ETIMEDOUT}, {"not_found", -ENOENT}, {"too_large", -E2BIG},
    {"aborted", -ECANCELED}, {"denied", -EACCES},    {"bad_request", -EPROTO},
};

#define NERRORS (sizeof(error_cases) / sizeof(error_cases[0]))

static void peer_get_errors(struct conn *c, int i)
{
    struct msg m;

    (void)i;
    conn_hello(c);
    for (size_t k = 0; k < NERRORS; k++) {
        conn_expect(c, &m, MSG_KV_GET);
        CHECK_EQ(m.timeout_ms, 5);
        conn_send(c, "{\"type\":\"error\",\"id\":%lld,\"code\":\"%s\",\"msg\":\"agent says %s\"}",
                  (long long)m.id, error_cases[k].code, error_cases[k].code);
        proto_msg_release(&m);
    }
    conn_expect_eof(c);
}

TEST(gr_kv_get_errors)
{
    pid_t pid = peer_start(peer_get_errors, 1);
    struct gr *g = start();
    char want[64];
    uint8_t buf[8];
    size_t len;

    for (size_t k = 0; k < NERRORS; k++) {
        CHECK_EQ(gr_kv_get(g, "key", buf, sizeof(buf), &len, 5), error_cases[k].err);
        snprintf(want, sizeof(want), "agent says %s", error_cases[k].code);
        CHECK_CONTAINS(gr_strerror(g), want);
        CHECK_CONTAINS(gr_strerror(g), "kv_get 'key'");
    }
    /* An error the library does not know leaves the link unusable. */
    CHECK_EQ(gr_kv_del(g, "key"), -EPROTO);
    CHECK_EQ(gr_finalize(g), -EPROTO);
    peer_wait(pid);
}

static void peer_get_waits(struct conn *c, int i)
{
    struct msg m;

    (void)i;
    conn_hello(c);
    /* -1 asks for at least a day, 0 for no wait at all. */
    conn_expect(c, &m, MSG_KV_GET);
    CHECK_INT(m.timeout_ms, >=, 24LL * 3600 * 1000);
    conn_send(c, "{\"type\":\"kv_val\",\"id\":%lld,\"value\":\"AP8=\"}", (long long)m.id);
    proto_msg_release(&m);
    conn_expect(c, &m, MSG_KV_GET);
    CHECK_EQ(m.timeout_ms, 0);
    conn_send(c, "{\"type\":\"error\",\"id\":%lld,\"code\":\"not_found\",\"msg\":\"no key 'x'\"}",
              (long long)m.id);
    proto_msg_release(&m);
    /* An agent that says "timeout" for a missing key asked with no wait. */
    conn_expect(c, &m, MSG_KV_GET);
    CHECK_EQ(m.timeout_ms, 0);
    conn_send(c, "{\"type\":\"error\",\"id\":%lld,\"code\":\"timeout\",\"msg\":\"no key 'x'\"}",
              (long long)m.id);
    proto_msg_release(&m);
    /* The delete, then a sized query with no buffer. */
    conn_expect(c, &m, MSG_KV_DEL);
    CHECK_STR(m.key, "x");
    conn_ok(c, m.id);
    proto_msg_release(&m);
    conn_expect(c, &m, MSG_KV_GET);
    conn_send(c, "{\"type\":\"kv_val\",\"id\":%lld,\"value\":\"AAAA\"}", (long long)m.id);
    proto_msg_release(&m);
    conn_finalize(c);
}

TEST(gr_kv_get_waits)
{
    pid_t pid = peer_start(peer_get_waits, 1);
    struct gr *g = start();
    uint8_t buf[8];
    size_t len = 0;

    CHECK_EQ(gr_kv_get(g, "x", buf, sizeof(buf), &len, -1), 0);
    CHECK_EQ(len, 2);
    CHECK_EQ(buf[1], 0xff);
    CHECK_EQ(gr_kv_get(g, "x", buf, sizeof(buf), &len, 0), -ENOENT);
    CHECK_EQ(gr_kv_get(g, "x", buf, sizeof(buf), &len, 0), -ENOENT);
    CHECK_EQ(gr_kv_del(g, "x"), 0);
    CHECK_EQ(gr_kv_get(g, "x", NULL, 0, &len, 0), -ENOBUFS);
    CHECK_EQ(len, 3);
    CHECK_EQ(gr_finalize(g), 0);
    peer_wait(pid);
}

static void peer_limits(struct conn *c, int i)
{
    struct msg m;

    (void)i;
    conn_hello(c);
    /* Nothing of the refused calls arrives: the first request is the largest legal value. */
    conn_expect(c, &m, MSG_KV_PUT);
    CHECK_EQ(strlen(m.value), PROTO_VALUE_MAX);
    CHECK_EQ(strlen(m.key), GR_KEY_MAX);
    conn_ok(c, m.id);
    proto_msg_release(&m);
    conn_finalize(c);
}

TEST(gr_limits_checked_locally)
{
    pid_t pid = peer_start(peer_limits, 1);
    struct gr *g = start();
    char key[GR_KEY_MAX + 2];
    uint8_t *val = calloc(1, GR_VALUE_MAX + 1);
    size_t len;

    CHECK(val != NULL);
    memset(key, 'k', sizeof(key) - 1);
    key[sizeof(key) - 1] = '\0';
    CHECK_EQ(gr_kv_put(g, key, "v", 1), -E2BIG);
    CHECK_CONTAINS(gr_strerror(g), "key of 257 bytes is over the limit of 256");
    CHECK_EQ(gr_kv_get(g, key, val, 1, &len, 0), -E2BIG);
    CHECK_EQ(gr_kv_del(g, key), -E2BIG);
    CHECK_EQ(gr_barrier(g, key, 10), -E2BIG);
    CHECK_EQ(gr_kv_put(g, "v", val, GR_VALUE_MAX + 1), -E2BIG);
    CHECK_CONTAINS(gr_strerror(g), "value of 196609 bytes is over the store's limit of 196608");
    CHECK_EQ(gr_kv_put(g, "", "v", 1), -EINVAL);
    CHECK_EQ(gr_kv_put(g, "\xff\xfe", "v", 1), -EINVAL);
    CHECK_CONTAINS(gr_strerror(g), "UTF-8");
    CHECK_EQ(gr_kv_get(g, "k", val, 1, &len, -2), -EINVAL);
    CHECK_EQ(gr_barrier(g, "#0", 10), -EINVAL);
    CHECK_EQ(gr_barrier(g, "", 10), -EINVAL);
    CHECK_EQ(gr_barrier(g, "b", -5), -EINVAL);
    /* The same limits, just inside. */
    key[GR_KEY_MAX] = '\0';
    CHECK_EQ(gr_kv_put(g, key, val, GR_VALUE_MAX), 0);
    CHECK_EQ(gr_finalize(g), 0);
    free(val);
    peer_wait(pid);
}

/* --- a dead agent, a confused agent ------------------------------------------------------- */

static void peer_dies(struct conn *c, int i)
{
    struct msg m;

    conn_hello(c);
    if (i == 1) {
        /* Gone in the middle of a wait. */
        conn_expect(c, &m, MSG_KV_GET);
        proto_msg_release(&m);
    }
    if (i == 2) {
        /* Half a reply, then gone. */
        conn_expect(c, &m, MSG_BARRIER);
        proto_msg_release(&m);
        send_raw(c->fd, "\0\0\0\x20{\"type\":", 12);
    }
}

TEST(gr_agent_dies)
{
    pid_t pid = peer_start(peer_dies, 3);
    struct gr *g;
    uint8_t buf[8];
    size_t len;

    /* Connection 0: the agent exits right after the hello. */
    g = start();
    sleep_ms(50);
    /* SIGPIPE keeps its default action: raising it would end this test. */
    signal(SIGPIPE, SIG_DFL);
    CHECK_EQ(gr_kv_put(g, "k", "v", 1), -ECONNRESET);
    CHECK_CONTAINS(gr_strerror(g), "closed the connection");
    CHECK_EQ(gr_kv_put(g, "k", "v", 1), -ECONNRESET);
    CHECK_EQ(gr_report(g, &(struct gr_progress)GR_PROGRESS_INIT), -ECONNRESET);
    CHECK_EQ(gr_finalize(g), -ECONNRESET);

    g = start();
    CHECK_EQ(gr_kv_get(g, "k", buf, sizeof(buf), &len, -1), -ECONNRESET);
    CHECK_CONTAINS(gr_strerror(g), "kv_get: agent '");
    CHECK_EQ(gr_finalize(g), -ECONNRESET);

    g = start();
    CHECK_EQ(gr_barrier(g, NULL, -1), -ECONNRESET);
    CHECK_EQ(gr_finalize(g), -ECONNRESET);
    peer_wait(pid);
}

/* Each connection answers its first request with one kind of nonsense. */
static const struct {
    const char *frame; /* a JSON frame, or NULL for raw below */
    const char *raw;
    size_t raw_len;
    const char *text; /* what the error text must say */
} garbage[] = {
    {"not json", NULL, 0, "garbage from agent"},
    {"{\"type\":\"ok\"}", NULL, 0, "garbage from agent"},
    {"{\"type\":\"nonsense\",\"id\":1}", NULL, 0, "unknown message type 'nonsense'"},
    {"{\"type\":\"ok\",\"id\":999}", NULL, 0, "unexpected 'ok' (id 999)"},
    {"{\"type\":\"kv_val\",\"id\":%lld,\"value\":\"AA==\"}", NULL, 0, "answered 'kv_val'"},
    {"{\"type\":\"kv_put\",\"id\":%lld,\"key\":\"k\",\"value\":\"\"}", NULL, 0,
     "unexpected 'kv_put'"},
    {"{\"type\":\"error\",\"id\":%lld,\"code\":\"weird\",\"msg\":\"what\"}", NULL, 0,
     "refused with 'weird': what"},
    {NULL, "\x00\x20\x00\x00", 4, "bad frame from agent"},
    {NULL, "\x00\x00\x00\x00", 4, "bad frame from agent"},
};

#define NGARBAGE (sizeof(garbage) / sizeof(garbage[0]))

static void peer_garbage(struct conn *c, int i)
{
    struct msg m;

    conn_hello(c);
    conn_expect(c, &m, MSG_KV_PUT);
    if (garbage[i].frame) {
        char json[512];
        snprintf(json, sizeof(json), garbage[i].frame, (long long)m.id);
        conn_send(c, "%s", json);
    } else {
        send_raw(c->fd, garbage[i].raw, garbage[i].raw_len);
    }
    proto_msg_release(&m);
    /* The library sends nothing after a reply it cannot trust, not even its finalize. */
    conn_expect_eof(c);
}

TEST(gr_garbage_reply)
{
    pid_t pid = peer_start(peer_garbage, NGARBAGE);

    for (size_t i = 0; i < NGARBAGE; i++) {
        struct gr *g = start();
        CHECK_EQ(gr_kv_put(g, "k", "v", 1), -EPROTO);
        CHECK_CONTAINS(gr_strerror(g), garbage[i].text);
        CHECK_EQ(gr_kv_del(g, "k"), -EPROTO);
        CHECK_EQ(gr_finalize(g), -EPROTO);
    }
    peer_wait(pid);
}

/* --- barriers, progress, framing, signals ------------------------------------------------ */

static void peer_barriers(struct conn *c, int i)
{
    static const char *const names[] = {"#0", "#1", "epoch-1", "#2"};
    struct msg m;

    (void)i;
    conn_hello(c);
    for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
        conn_expect(c, &m, MSG_BARRIER);
        CHECK_STR(m.key, names[k]);
        CHECK(json_object_get(proto_msg_json(&m), "count") == NULL);
        /* A heartbeat before the answer is skipped. */
        conn_send(c, "{\"type\":\"hb\"}");
        conn_ok(c, m.id);
        proto_msg_release(&m);
    }
    conn_finalize(c);
}

TEST(gr_barrier_names)
{
    pid_t pid = peer_start(peer_barriers, 1);
    struct gr *g = start();

    CHECK_EQ(gr_barrier(g, NULL, -1), 0);
    CHECK_EQ(gr_barrier(g, NULL, 1000), 0);
    CHECK_EQ(gr_barrier(g, "epoch-1", 1000), 0);
    CHECK_EQ(gr_barrier(g, NULL, -1), 0);
    CHECK_EQ(gr_finalize(g), 0);
    peer_wait(pid);
}

static void peer_barrier_late(struct conn *c, int i)
{
    struct msg b, d;
    char both[256];
    int n;

    (void)i;
    conn_hello(c);
    conn_expect(c, &b, MSG_BARRIER);
    /* No answer until the rank has given up and moved on to its next request; then the late
     * answer and the new one arrive in one write. */
    conn_expect(c, &d, MSG_KV_DEL);
    n = snprintf(both + 4, sizeof(both) - 4, "{\"type\":\"ok\",\"id\":%lld}", (long long)b.id);
    frame_put_header((uint8_t *)both, (uint32_t)n);
    int m = snprintf(both + 8 + n, sizeof(both) - 8 - (size_t)n, "{\"type\":\"ok\",\"id\":%lld}",
                     (long long)d.id);
    frame_put_header((uint8_t *)both + 4 + n, (uint32_t)m);
    send_raw(c->fd, both, (size_t)(8 + n + m));
    proto_msg_release(&b);
    proto_msg_release(&d);
    conn_finalize(c);
}

TEST(gr_barrier_timeout)
{
    pid_t pid = peer_start(peer_barrier_late, 1);
    struct gr *g = start();
    int64_t t0 = now_ms();

    CHECK_EQ(gr_barrier(g, "slow", 100), -ETIMEDOUT);
    CHECK_INT(now_ms() - t0, >=, 100);
    CHECK_INT(now_ms() - t0, <, 2000);
    CHECK_CONTAINS(gr_strerror(g), "barrier 'slow': not every rank arrived within 100 ms");
    CHECK_EQ(gr_kv_del(g, "k"), 0);
    CHECK_EQ(gr_finalize(g), 0);
    peer_wait(pid);
}

/* The keys of a report message besides "type": n of them, each one of PROGRESS_FIELDS'. */
static void check_report_keys(struct msg *m, size_t n)
{
    json_t *o = proto_msg_json(m);

    CHECK(o != NULL);
    CHECK_EQ(json_object_size(o), n + 1);
}

static void peer_report(struct conn *c, int i)
{
    struct msg m;
    json_t *o;

    (void)i;
    conn_hello(c);
    conn_expect(c, &m, MSG_REPORT);
    CHECK_EQ(m.progress.step, 1LL << 40);
    /* What is not finite is left out: read back as NAN, not known. */
    CHECK(isnan(m.progress.loss) && isnan(m.progress.lr) && isnan(m.progress.grad_norm));
    CHECK(m.progress.tokens_per_s == 1234.5);
    /* step, total_steps (0: unknown) and tokens_per_s. */
    check_report_keys(&m, 3);
    proto_msg_release(&m);
    /* Every field known: every key of the list, each with its value. */
    conn_expect(c, &m, MSG_REPORT);
    o = proto_msg_json(&m);
#define HAS_KEY(k, kind, req, member, range) CHECK(json_object_get(o, k) != NULL);
    PROGRESS_FIELDS(HAS_KEY)
#define COUNT_KEY(k, kind, req, member, range) +1
    check_report_keys(&m, 0 PROGRESS_FIELDS(COUNT_KEY));
    CHECK_EQ(m.progress.step, 2);
    CHECK_EQ(m.progress.total_steps, 100);
    CHECK(m.progress.loss == 2.5 && m.progress.lr == 3e-4 && m.progress.grad_norm == 0.75 &&
          m.progress.tokens_per_s == 0 && m.progress.step_time == 0.5);
    proto_msg_release(&m);
    /* A negative rate, norm or step time is left out, as Python's report() does; a negative
     * loss or lr is a value. */
    conn_expect(c, &m, MSG_REPORT);
    CHECK_EQ(m.progress.step, 3);
    CHECK(m.progress.loss == -1.5 && m.progress.lr == -1e-4);
    CHECK(isnan(m.progress.tokens_per_s) && isnan(m.progress.grad_norm) &&
          isnan(m.progress.step_time));
    proto_msg_release(&m);
    /* A step time of 0 is unknown too. */
    conn_expect(c, &m, MSG_REPORT);
    CHECK_EQ(m.progress.step, 4);
    CHECK(isnan(m.progress.step_time));
    check_report_keys(&m, 2);
    proto_msg_release(&m);
    /* A caller built with a longer struct: the fields this library knows, and no other (the
     * decoder refuses a key it does not know). */
    conn_expect(c, &m, MSG_REPORT);
    CHECK_EQ(m.progress.step, 5);
    CHECK(m.progress.loss == 1.25);
    check_report_keys(&m, 3);
    proto_msg_release(&m);
    /* The refused reports sent nothing: the next thing is the finalize. */
    conn_finalize(c);
}

TEST(gr_report_fields)
{
    pid_t pid = peer_start(peer_report, 1);
    struct gr *g = start();
    struct gr_progress p = GR_PROGRESS_INIT;
    struct {
        struct gr_progress p;
        double later; /* a field of a later gr.h */
    } longer = {GR_PROGRESS_INIT, 7.5};

    p.step = 1LL << 40;
    p.lr = INFINITY;
    p.tokens_per_s = 1234.5;
    p.grad_norm = -INFINITY;
    CHECK_EQ(gr_report(g, &p), 0);
    p = (struct gr_progress)GR_PROGRESS_INIT;
    p.step = 2;
    p.loss = 2.5;
    p.lr = 3e-4;
    p.tokens_per_s = 0;
    p.grad_norm = 0.75;
    p.total_steps = 100;
    p.step_time = 0.5;
    CHECK_EQ(gr_report(g, &p), 0);
    p = (struct gr_progress)GR_PROGRESS_INIT;
    p.step = 3;
    p.loss = -1.5;
    p.lr = -1e-4;
    p.tokens_per_s = -5;
    p.grad_norm = -0.5;
    p.step_time = -0.25;
    CHECK_EQ(gr_report(g, &p), 0);
    p = (struct gr_progress)GR_PROGRESS_INIT;
    p.step = 4;
    p.step_time = 0;
    CHECK_EQ(gr_report(g, &p), 0);
    longer.p.size = sizeof(longer);
    longer.p.step = 5;
    longer.p.loss = 1.25;
    CHECK_EQ(gr_report(g, &longer.p), 0);

    /* Refused before anything is sent: a struct without its size (zeroed, or of a layout
     * before the first), a negative step or total_steps. The link stays usable. */
    memset(&p, 0, sizeof(p));
    p.step = 6;
    CHECK_EQ(gr_report(g, &p), -EINVAL);
    CHECK_CONTAINS(gr_strerror(g), "size 0, under its first layout's");
    CHECK_CONTAINS(gr_strerror(g), "GR_PROGRESS_INIT");
    p.size = GR_PROGRESS_SIZE_1 - 1;
    CHECK_EQ(gr_report(g, &p), -EINVAL);
    p = (struct gr_progress)GR_PROGRESS_INIT;
    p.step = -1;
    CHECK_EQ(gr_report(g, &p), -EINVAL);
    CHECK_CONTAINS(gr_strerror(g), "report: step -1 is out of its range");
    p.step = 6;
    p.total_steps = -2;
    CHECK_EQ(gr_report(g, &p), -EINVAL);
    CHECK_CONTAINS(gr_strerror(g), "total_steps -2");
    CHECK_EQ(gr_finalize(g), 0);
    peer_wait(pid);
}

static void peer_trickle(struct conn *c, int i)
{
    char frame[128];
    struct msg m;
    int n;

    (void)i;
    conn_hello(c);
    conn_expect(c, &m, MSG_KV_GET);
    /* One byte at a time, after a pause long enough for the signals to interrupt the wait. */
    n = snprintf(frame + 4, sizeof(frame) - 4, "{\"type\":\"kv_val\",\"id\":%lld,\"value\":\"%s\"}",
                 (long long)m.id, "AP8Q");
    frame_put_header((uint8_t *)frame, (uint32_t)n);
    proto_msg_release(&m);
    sleep_ms(100);
    for (int k = 0; k < n + 4; k++) {
        send_raw(c->fd, frame + k, 1);
        sleep_ms(1);
    }
    conn_finalize(c);
}

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
    (void)sig;
    alarms++;
}

TEST(gr_split_frames_and_signals)
{
    struct sigaction sa = {.sa_handler = on_alarm}; /* no SA_RESTART: calls fail with EINTR */
    struct itimerval every_ms = {{0, 1000}, {0, 1000}};
    pid_t pid = peer_start(peer_trickle, 1);
    struct gr *g = start();
    uint8_t buf[8];
    size_t len = 0;

    CHECK_EQ(sigaction(SIGALRM, &sa, NULL), 0);
    CHECK_EQ(setitimer(ITIMER_REAL, &every_ms, NULL), 0);
    CHECK_EQ(gr_kv_get(g, "k", buf, sizeof(buf), &len, 5000), 0);
    CHECK_EQ(len, 3);
    CHECK(memcmp(buf, "\x00\xff\x10", 3) == 0);
    CHECK_EQ(gr_finalize(g), 0);
    setitimer(ITIMER_REAL, &(struct itimerval){0}, NULL);
    CHECK_INT(alarms, >, 10);
    peer_wait(pid);
}

/* --- the example program ------------------------------------------------------------------- */

/* A one-rank agent with a real store: what gr_example needs of rendezvousd in a world of 1. */
static void peer_store(struct conn *c, int i)
{
    json_t *store = json_object();
    struct msg m;

    (void)i;
    conn_hello(c);
    while (conn_next(c, &m)) {
        const char *v;
        switch (m.type) {
        case MSG_KV_PUT:
            json_object_set_new(store, m.key, json_string(m.value));
            conn_ok(c, m.id);
            break;
        case MSG_KV_GET:
            v = json_string_value(json_object_get(store, m.key));
            if (v)
                conn_send(c, "{\"type\":\"kv_val\",\"id\":%lld,\"value\":\"%s\"}", (long long)m.id,
                          v);
            else
                conn_send(c,
                          "{\"type\":\"error\",\"id\":%lld,\"code\":\"not_found\",\"msg\":"
                          "\"no key\"}",
                          (long long)m.id);
            break;
        case MSG_BARRIER:
        case MSG_FINALIZE:
            conn_ok(c, m.id);
            break;
        case MSG_REPORT:
            break;
        default:
            test_fail(__FILE__, __LINE__, "agent: unexpected '%s'", proto_type_name(m.type));
        }
        proto_msg_release(&m);
    }
    /* What rank 0 published: the 128-byte id, base64, and its own address. */
    CHECK_EQ(strlen(json_string_value(json_object_get(store, "uid"))), 4 * ((128 + 2) / 3));
    CHECK_STR(json_string_value(json_object_get(store, "addr/0")), "bm9kZTA6Mjk1MDA=");
    json_decref(store);
}

TEST(gr_example_one_rank)
{
    const char *prog = test_build_path("tests/gr_example");
    char out_path[512], line[256] = "";
    pid_t pid, ex;
    FILE *f;
    int st;

    if (access(prog, X_OK) < 0)
        test_skip("'%s' is not built", prog);
    hello_rank = 0;
    pid = peer_start(peer_store, 1);
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    setenv("LOCAL_RANK", "0", 1);
    setenv("LOCAL_WORLD_SIZE", "1", 1);
    snprintf(out_path, sizeof(out_path), "%s/out", test_tmpdir());
    ex = fork();
    CHECK_INT(ex, >=, 0);
    if (ex == 0) {
        if (!freopen(out_path, "w", stdout))
            _exit(126);
        execl(prog, prog, "--steps", "3", (char *)NULL);
        _exit(127);
    }
    CHECK_EQ(waitpid(ex, &st, 0), ex);
    CHECK(WIFEXITED(st));
    CHECK_EQ(WEXITSTATUS(st), 0);
    peer_wait(pid);
    f = fopen(out_path, "r");
    CHECK(f != NULL);
    CHECK(fgets(line, sizeof(line), f) != NULL);
    fclose(f);
    CHECK_STR(line, "rank 0/1 local 0 node 0: store ok, barrier ok\n");
}

/* The agent's side of memory checkpoints: the save's temp file is there, whole, when the
 * request comes (it is kept by a rename: the agent's); a load reads the copy the reply names;
 * the refusals map to their errors. */
static void peer_mem(struct conn *c, int i)
{
    char tmp[4200], final[4200];
    struct msg m;
    struct stat st;

    (void)i;
    conn_hello(c);
    conn_expect(c, &m, MSG_MEM_SAVE);
    CHECK_STR(m.key, "state");
    CHECK_EQ(m.step, 42);
    snprintf(tmp, sizeof(tmp), "%s/r1.state.tmp", getenv(PROTO_MEM_DIR_ENV));
    snprintf(final, sizeof(final), "%s/r1.state", getenv(PROTO_MEM_DIR_ENV));
    CHECK_EQ(stat(tmp, &st), 0);
    CHECK_EQ(st.st_size, 5);
    CHECK_EQ(rename(tmp, final), 0);
    conn_ok(c, m.id);
    proto_msg_release(&m);
    conn_expect(c, &m, MSG_MEM_LOAD);
    conn_send(c, "{\"type\":\"mem_copy\",\"id\":%lld,\"path\":\"%s\",\"step\":42,\"size\":5}",
              (long long)m.id, final);
    proto_msg_release(&m);
    conn_expect(c, &m, MSG_MEM_SAVE);
    conn_send(c, "{\"type\":\"error\",\"id\":%lld,\"code\":\"no_space\",\"msg\":\"too big\"}",
              (long long)m.id);
    proto_msg_release(&m);
    conn_expect(c, &m, MSG_MEM_LOAD);
    conn_send(c, "{\"type\":\"error\",\"id\":%lld,\"code\":\"not_found\",\"msg\":\"none\"}",
              (long long)m.id);
    proto_msg_release(&m);
    conn_finalize(c);
}

TEST(gr_mem_save_and_load)
{
    pid_t pid;
    struct gr *g;
    void *data;
    size_t len;
    int64_t step;

    setenv(PROTO_MEM_DIR_ENV, test_tmpdir(), 1);
    pid = peer_start(peer_mem, 1);
    g = start();
    CHECK_EQ(gr_mem_save(g, "../x", "hello", 5, 1), -EINVAL);
    CHECK_EQ(gr_mem_save(g, "state", "hello", 5, 42), 0);
    CHECK_EQ(gr_mem_load(g, "state", &data, &len, &step), 0);
    CHECK_EQ(len, 5);
    CHECK_EQ(step, 42);
    CHECK(memcmp(data, "hello", 5) == 0);
    free(data);
    CHECK_EQ(gr_mem_save(g, "state", "hello!", 6, 43), -ENOSPC);
    CHECK(strstr(gr_strerror(g), "too big") != NULL);
    CHECK_EQ(gr_mem_load(g, "other", &data, &len, &step), -ENOENT);
    CHECK(data == NULL);
    CHECK_EQ(gr_finalize(g), 0);
    peer_wait(pid);
    unsetenv(PROTO_MEM_DIR_ENV);
}

/* Without the variable: no memory checkpoints on this node, and the link stays fine. */
TEST(gr_mem_without_a_directory)
{
    pid_t pid = peer_start(peer_hello_finalize, 1);
    struct gr *g = start();

    CHECK_EQ(gr_mem_save(g, "state", "x", 1, 0), -ENOSYS);
    CHECK_EQ(gr_finalize(g), 0);
    peer_wait(pid);
}

/* --- regrouping in process ------------------------------------------------------------------ */

static void peer_regroup(struct conn *c, int i)
{
    struct msg m;

    (void)i;
    conn_hello(c);
    conn_expect(c, &m, MSG_REGROUP_OK);
    conn_ok(c, m.id);
    proto_msg_release(&m);
    conn_expect(c, &m, MSG_BARRIER);
    CHECK_STR(m.key, "#0");
    conn_ok(c, m.id);
    proto_msg_release(&m);
    /* The rank's generation (GPURUN_RESTART_COUNT 2); the answer names the next. */
    conn_expect(c, &m, MSG_REGROUP);
    CHECK_EQ(m.generation, 2);
    conn_send(c, "{\"type\":\"regroup\",\"id\":%lld,\"generation\":3}", (long long)m.id);
    proto_msg_release(&m);
    /* The new generation's implicit barriers count from "#0" again. */
    conn_expect(c, &m, MSG_BARRIER);
    CHECK_STR(m.key, "#0");
    conn_ok(c, m.id);
    proto_msg_release(&m);
    /* The job is torn down instead. */
    conn_expect(c, &m, MSG_REGROUP);
    CHECK_EQ(m.generation, 3);
    conn_send(c,
              "{\"type\":\"error\",\"id\":%lld,\"code\":\"aborted\",\"msg\":\"the node's ranks "
              "are being torn down\"}",
              (long long)m.id);
    proto_msg_release(&m);
    /* An agent that names a generation that is not later breaks the link. */
    conn_expect(c, &m, MSG_REGROUP);
    conn_send(c, "{\"type\":\"regroup\",\"id\":%lld,\"generation\":3}", (long long)m.id);
    proto_msg_release(&m);
}

TEST(gr_regroup_generations)
{
    pid_t pid = peer_start(peer_regroup, 1);
    struct gr *g;

    setenv("GPURUN_RESTART_COUNT", "2", 1);
    g = start();
    unsetenv("GPURUN_RESTART_COUNT");
    CHECK_EQ(gr_generation(g), 2);
    CHECK_EQ(gr_regroup_enable(g), 0);
    CHECK_EQ(gr_barrier(g, NULL, 5000), 0);
    CHECK_EQ(gr_regroup(g, 5000), 3);
    CHECK_EQ(gr_generation(g), 3);
    CHECK_EQ(gr_barrier(g, NULL, 5000), 0);
    CHECK_EQ(gr_regroup(g, 5000), -ECANCELED);
    CHECK_CONTAINS(gr_strerror(g), "torn down");
    CHECK_EQ(gr_regroup(g, 5000), -EPROTO);
    CHECK_CONTAINS(gr_strerror(g), "not one after 3");
    CHECK_EQ(gr_generation(g), 3);
    gr_finalize(g);
    peer_wait(pid);
}
