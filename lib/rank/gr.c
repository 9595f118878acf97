/* The rank library: synchronous requests over the agent's Unix socket. Every request is one
 * frame of plain JSON (the socket's directory and SO_PEERCRED already keep strangers out, so
 * there is no sealing), and the reply with the same id is read before the call returns. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "errmsg.h"
#include "frame.h"
#include "gr.h"
#include "gr_pmix.h"
#include "monotime.h"
#include "proto.h"
#include "banned.h"

_Static_assert(GR_KEY_MAX == PROTO_KEY_MAX, "gr.h and proto.h disagree on the key limit");
_Static_assert(GR_NAME_MAX == PROTO_NAME_MAX, "gr.h and proto.h disagree on the name limit");
_Static_assert(GR_VALUE_MAX == PROTO_VALUE_MAX / 4 * 3, "GR_VALUE_MAX must encode to the limit");

/* gr.h's struct gr_progress, read by lib/proto.h's list of the progress record's fields: each
 * key from the member of its name, whose type the compiler holds to the key's kind; every
 * member but size has its line. */
struct gr_field {
    const char *key;
    char kind; /* 'I': an int64_t; 'F': a double */
    enum proto_progress_range range;
    size_t off, len; /* where the member is in the struct */
};
#define GR_FIELD(k, kind, req, member, range)                                                      \
    {k, kind, range, offsetof(struct gr_progress, member),                                         \
     sizeof(((struct gr_progress *)0)->member)},
static const struct gr_field gr_fields[] = {PROGRESS_FIELDS(GR_FIELD)};
#define GR_N_FIELDS (sizeof(gr_fields) / sizeof(gr_fields[0]))

#define GR_KIND_OF(x) _Generic((x), int64_t : 'I', double : 'F')
#define GR_KIND(k, kind, req, member, range)                                                       \
    _Static_assert(GR_KIND_OF(((struct gr_progress *)0)->member) == (kind),                        \
                   "gr_progress." #member " is not of the kind PROGRESS_FIELDS says");
#define GR_SIZE(k, kind, req, member, range) +sizeof(((struct gr_progress *)0)->member)
PROGRESS_FIELDS(GR_KIND)
/* size, then step, then the others: none that the list lacks. */
_Static_assert(offsetof(struct gr_progress, step)
                       PROGRESS_FIELDS(GR_SIZE) == sizeof(struct gr_progress),
               "gr.h's struct gr_progress has a member that PROGRESS_FIELDS does not list");

/* How long a request that waits for nobody (hello, kv_put, kv_del, finalize) may go
 * unanswered before the agent is taken for stuck. The agent answers these from memory or
 * after one round trip to the leader; two minutes covers a leader busy with thousands of
 * joins and still ends a hang that the daemon's supervision missed. */
#define GR_REQUEST_TIMEOUT_MS (120 * 1000)
/* Time the agent gets to deliver its answer to a kv_get after the wait it was asked for ran
 * out: the leader's timer, the hop to the agent and the agent's forward. */
#define GR_REPLY_GRACE_MS     (10 * 1000)
/* The wait a kv_get asks for when the caller said -1 (a day); when it runs out the library
 * asks again, so the wait really is unbounded. */
#define GR_WAIT_FOREVER_MS    (24LL * 3600 * 1000)
/* Requests given up on (a barrier past its timeout) whose late replies are skipped. A rank
 * that abandons more than this many without the agent answering any has lost its agent. */
#define GR_ABANDONED_MAX      16
/* Longest token accepted from GPURUN_TOKEN: hex of up to 128 bytes (the agent uses 32). */
#define GR_TOKEN_MAX          256
/* Bytes read from the socket at a time; a largest reply (a 256 KiB value) takes a few. */
#define GR_READ_CHUNK         (64 * 1024)

struct gr {
    int fd;
    int rank, world_size, local_rank, local_world_size, node_rank;
    int generation;  /* GPURUN_RESTART_COUNT at init; the later one gr_regroup gave */
    int dead;        /* 0, or the error (-ECONNRESET, -EPROTO...) that made the link unusable */
    bool agent_said; /* the last request's error came from an error reply, not from here */
    json_int_t next_id;
    uint64_t barrier_seq;
    json_int_t abandoned[GR_ABANDONED_MAX];
    int nabandoned;
    struct frame_reader rd;
    struct gr_pmix *px; /* set: the rank runs under PMIx, there is no agent and no fd */
    char sock[sizeof(((struct sockaddr_un *)0)->sun_path)];
    struct errmsg err; /* the last failure, for gr_strerror */
};

/* The failures of gr_init and gr_finalize have no struct gr left to hold their text. */
static _Thread_local struct errmsg init_err;

/* Records a failure as errmsg_set() does, and the link is unusable from now on: the stream may
 * be out of step. */
__attribute__((format(printf, 3, 4))) static int broken(struct gr *g, int err, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    g->dead = errmsg_vset(&g->err, err, fmt, ap);
    va_end(ap);
    return err;
}

/* --- environment ------------------------------------------------------------------------ */

/* A decimal number of the environment, digits only, within [min, INT_MAX]. */
static int env_int(const char *name, int min, int *out)
{
    const char *s = getenv(name);
    long long v = 0;

    if (!s)
        return errmsg_set(&init_err, -ENOENT, "'%s' is not set: not started by rendezvousd", name);
    if (!*s)
        return errmsg_set(&init_err, -EINVAL, "'%s' is empty: expected a number", name);
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return errmsg_set(&init_err, -EINVAL, "'%s' is '%.64s': expected a decimal number",
                              name, s);
        v = v * 10 + (*p - '0');
        if (v > INT_MAX)
            return errmsg_set(&init_err, -EINVAL, "'%s' is '%.64s': out of range", name, s);
    }
    if (v < min)
        return errmsg_set(&init_err, -EINVAL, "'%s' is %lld: must be at least %d", name, v, min);
    *out = (int)v;
    return 0;
}

static int env_token(const char **out)
{
    const char *s = getenv("GPURUN_TOKEN");
    size_t n;

    if (!s)
        return errmsg_set(&init_err, -ENOENT,
                          "'GPURUN_TOKEN' is not set: not started by rendezvousd");
    n = strlen(s);
    if (n == 0 || n > GR_TOKEN_MAX || n % 2)
        return errmsg_set(&init_err, -EINVAL,
                          "'GPURUN_TOKEN' has %zu characters: expected hex digits", n);
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')))
            return errmsg_set(&init_err, -EINVAL, "'GPURUN_TOKEN' is not hex (character %zu)", i);
    }
    *out = s;
    return 0;
}

static int read_env(struct gr *g, const char **token)
{
    const char *sock = getenv("GPURUN_SOCK");
    int ret;

    if (!sock)
        return errmsg_set(&init_err, -ENOENT,
                          "'GPURUN_SOCK' is not set: not started by rendezvousd");
    if (!*sock || strlen(sock) >= sizeof(g->sock))
        return errmsg_set(&init_err, -EINVAL, "'GPURUN_SOCK' is not a socket path of 1..%zu bytes",
                          sizeof(g->sock) - 1);
    memcpy(g->sock, sock, strlen(sock) + 1);
    if ((ret = env_int("RANK", 0, &g->rank)) < 0 ||
        (ret = env_int("WORLD_SIZE", 1, &g->world_size)) < 0 ||
        (ret = env_int("LOCAL_RANK", 0, &g->local_rank)) < 0 ||
        (ret = env_int("LOCAL_WORLD_SIZE", 1, &g->local_world_size)) < 0 ||
        (ret = env_int("NODE_RANK", 0, &g->node_rank)) < 0 || (ret = env_token(token)) < 0)
        return ret;
    if (g->rank >= g->world_size)
        return errmsg_set(&init_err, -EINVAL, "'RANK' is %d: not below 'WORLD_SIZE' %d", g->rank,
                          g->world_size);
    if (g->local_rank >= g->local_world_size)
        return errmsg_set(&init_err, -EINVAL, "'LOCAL_RANK' is %d: not below 'LOCAL_WORLD_SIZE' %d",
                          g->local_rank, g->local_world_size);
    if (g->local_world_size > g->world_size)
        return errmsg_set(&init_err, -EINVAL, "'LOCAL_WORLD_SIZE' %d is above 'WORLD_SIZE' %d",
                          g->local_world_size, g->world_size);
    return 0;
}

/* --- the link ---------------------------------------------------------------------------- */

/* A connect() a signal interrupts goes on in the background: wait for it to settle. */
static int connect_unix(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd, ret = -1;

    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int soerr = 0;
        socklen_t sl = sizeof(soerr);

        if (errno != EINTR) {
            ret = -errno;
            goto out;
        }
        while (poll(&pfd, 1, -1) < 0)
            if (errno != EINTR) {
                ret = -errno;
                goto out;
            }
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 || soerr) {
            ret = soerr ? -soerr : -errno;
            goto out;
        }
    }
    return fd;
out:
    close(fd);
    return ret;
}

static int send_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return errno == EPIPE ? -ECONNRESET : -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Sends msg (steals it) as one frame; what names the request in error texts. */
static int send_msg(struct gr *g, json_t *msg, const char *what)
{
    uint8_t *buf = NULL;
    char *text = NULL;
    size_t n;
    int ret = -1;

    text = json_dumps(msg, JSON_COMPACT);
    if (!text) {
        ret = errmsg_set(&g->err, -ENOMEM, "%s: cannot encode the request", what);
        goto out;
    }
    n = strlen(text);
    buf = malloc(FRAME_HDR_LEN + n);
    if (!buf) {
        ret = errmsg_set(&g->err, -ENOMEM, "%s: out of memory", what);
        goto out;
    }
    frame_put_header(buf, (uint32_t)n);
    memcpy(buf + FRAME_HDR_LEN, text, n);
    ret = send_all(g->fd, buf, FRAME_HDR_LEN + n);
    if (ret == -ECONNRESET)
        ret = broken(g, ret, "%s: agent '%s' closed the connection", what, g->sock);
    else if (ret < 0)
        ret = broken(g, ret, "%s: cannot send to agent '%s': %s", what, g->sock,
                     errmsg_strerror(ret));
out:
    free(buf);
    free(text);
    json_decref(msg);
    return ret;
}

static bool is_reply(enum msg_type t)
{
    return t == MSG_OK || t == MSG_KV_VAL || t == MSG_MEM_COPY || t == MSG_REGROUP ||
           t == MSG_ERROR;
}

static void abandon(struct gr *g, json_int_t id)
{
    if (g->nabandoned == GR_ABANDONED_MAX) {
        memmove(g->abandoned, g->abandoned + 1, sizeof(g->abandoned[0]) * (GR_ABANDONED_MAX - 1));
        g->nabandoned--;
    }
    g->abandoned[g->nabandoned++] = id;
}

static bool take_abandoned(struct gr *g, json_int_t id)
{
    for (int i = 0; i < g->nabandoned; i++) {
        if (g->abandoned[i] == id) {
            g->abandoned[i] = g->abandoned[--g->nabandoned];
            return true;
        }
    }
    return false;
}

/* Reads frames until the reply to id, skipping heartbeats and late replies to abandoned
 * requests. Returns 0 with *m filled (the caller releases it), -ETIMEDOUT when timeout_ms
 * (-1: none) passed first (no text set), or a link error (text set, link broken). */
static int read_reply(struct gr *g, json_int_t id, int64_t timeout_ms, struct msg *m,
                      const char *what)
{
    int64_t deadline = timeout_ms < 0 ? -1 : monotime_ms() + timeout_ms;
    uint8_t chunk[GR_READ_CHUNK];

    for (;;) {
        struct proto_error pe;
        const uint8_t *p;
        size_t n;
        int r = frame_reader_next(&g->rd, &p, &n);

        if (r < 0)
            return broken(g, -EPROTO, "%s: bad frame from agent '%s': %s", what, g->sock,
                          r == -EMSGSIZE ? "longer than the limit" : "empty");
        if (r == 1) {
            if (proto_decode(p, n, m, &pe) < 0)
                return broken(g, -EPROTO, "%s: garbage from agent '%s': %s", what, g->sock,
                              pe.why.text);
            if (m->type == MSG_HB ||
                (is_reply(m->type) && m->id != id && take_abandoned(g, m->id))) {
                proto_msg_release(m);
                continue;
            }
            if (!is_reply(m->type) || m->id != id) {
                r = broken(
                    g, -EPROTO, "%s: unexpected '%s' (id %lld) from agent '%s' awaiting reply %lld",
                    what, proto_type_name(m->type), (long long)m->id, g->sock, (long long)id);
                proto_msg_release(m);
                return r;
            }
            return 0;
        }

        int wait = -1;
        if (deadline >= 0) {
            int64_t left = deadline - monotime_ms();
            if (left <= 0)
                return -ETIMEDOUT;
            wait = left > INT_MAX ? INT_MAX : (int)left;
        }
        struct pollfd pfd = {.fd = g->fd, .events = POLLIN};
        r = poll(&pfd, 1, wait);
        if (r < 0 && errno != EINTR)
            return broken(g, -errno, "%s: cannot wait for agent '%s': %s", what, g->sock,
                          errmsg_strerror(errno));
        if (r <= 0)
            continue;
        ssize_t got = recv(g->fd, chunk, sizeof(chunk), 0);
        if (got < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (got == 0 || (got < 0 && errno == ECONNRESET))
            return broken(g, -ECONNRESET, "%s: agent '%s' closed the connection", what, g->sock);
        if (got < 0)
            return broken(g, -errno, "%s: cannot read from agent '%s': %s", what, g->sock,
                          errmsg_strerror(errno));
        if (frame_reader_feed(&g->rd, chunk, (size_t)got) < 0)
            return broken(g, -ENOMEM, "%s: out of memory reading from agent '%s'", what, g->sock);
    }
}

static const struct {
    const char *code;
    int err;
} error_codes[] = {
    {"timeout", -ETIMEDOUT}, {"not_found", -ENOENT},   {"too_large", -E2BIG},
    {"aborted", -ECANCELED}, {"denied", -EACCES},      {"no_space", -ENOSPC},
    {"bad_name", -EINVAL},   {"unsupported", -ENOSYS},
};

/* Sends req (steals it) with the given id and waits up to timeout_ms (-1: no limit) for the
 * reply, which must be of type want. Returns 0 with *m filled (the caller releases it), the
 * errno an error reply maps to, or -ETIMEDOUT, with g's text naming what and subject. */
static int request(struct gr *g, json_t *req, json_int_t id, int64_t timeout_ms, enum msg_type want,
                   struct msg *m, const char *what, const char *subject)
{
    int ret;

    g->agent_said = false;
    if (g->dead) {
        json_decref(req);
        return g->dead;
    }
    if (!req)
        return errmsg_set(&g->err, -EINVAL, "%s '%s': cannot build the request (is it UTF-8 text?)",
                          what, subject);
    ret = send_msg(g, req, what);
    if (ret < 0)
        return ret;
    ret = read_reply(g, id, timeout_ms, m, what);
    if (ret == -ETIMEDOUT) {
        abandon(g, id);
        return errmsg_set(&g->err, ret, "%s '%s': no answer from agent '%s' within %lld ms", what,
                          subject, g->sock, (long long)timeout_ms);
    }
    if (ret < 0)
        return ret;
    if (m->type == MSG_ERROR) {
        g->agent_said = true;
        ret = -EPROTO;
        for (size_t i = 0; i < sizeof(error_codes) / sizeof(error_codes[0]); i++)
            if (!strcmp(m->key, error_codes[i].code))
                ret = error_codes[i].err;
        if (ret == -EPROTO)
            broken(g, ret, "%s '%s': agent refused with '%s': %s", what, subject, m->key, m->value);
        else
            errmsg_set(&g->err, ret, "%s '%s': %s", what, subject, m->value);
        proto_msg_release(m);
        return ret;
    }
    if (m->type != want) {
        ret = broken(g, -EPROTO, "%s '%s': agent answered '%s' instead of '%s'", what, subject,
                     proto_type_name(m->type), proto_type_name(want));
        proto_msg_release(m);
        return ret;
    }
    return 0;
}

/* A request answered by "ok". */
static int request_ok(struct gr *g, json_t *req, json_int_t id, int64_t timeout_ms,
                      const char *what, const char *subject)
{
    struct msg m;
    int ret = request(g, req, id, timeout_ms, MSG_OK, &m, what, subject);

    if (ret == 0)
        proto_msg_release(&m);
    return ret;
}

/* --- under PMIx --------------------------------------------------------------------------- */

/* A rank that srun --mpi=pmix (or another PMIx launcher) started without rendezvousd: no
 * agent's socket, a PMIx server's rank and namespace instead. Only when built with libpmix. */
static bool under_pmix(void)
{
#ifdef HAVE_PMIX
    return !getenv("GPURUN_SOCK") && getenv("PMIX_RANK") && getenv("PMIX_NAMESPACE");
#else
    return false;
#endif
}

/* The generation the agent started this rank in (GPURUN_RESTART_COUNT; 0 where unset). */
static int restart_count(void)
{
    const char *gen = getenv("GPURUN_RESTART_COUNT");
    char *end;
    long v;

    if (!gen || !*gen)
        return 0;
    v = strtol(gen, &end, 10);
    return !*end && v >= 0 && v < INT_MAX ? (int)v : 0;
}

static int init_pmix(struct gr *g)
{
    struct gr_pmix_place pl;
    int ret = gr_pmix_open(&g->px, &pl, &init_err);

    if (ret < 0)
        return ret;
    g->rank = pl.rank;
    g->world_size = pl.world_size;
    g->local_rank = pl.local_rank;
    g->local_world_size = pl.local_world_size;
    g->node_rank = pl.node_rank;
    return 0;
}

/* --- the API ----------------------------------------------------------------------------- */

static void gr_free(struct gr *g)
{
    if (!g)
        return;
    if (g->fd >= 0)
        close(g->fd);
    frame_reader_release(&g->rd);
    free(g);
}

int gr_init(struct gr **out)
{
    const char *token = NULL;
    struct gr *g = NULL;
    int ret = -1;

    *out = NULL;
    init_err.text[0] = '\0';
    g = calloc(1, sizeof(*g));
    if (!g) {
        ret = errmsg_set(&init_err, -ENOMEM, "out of memory");
        goto out;
    }
    g->fd = -1;
    g->next_id = 1;
    frame_reader_init(&g->rd, FRAME_MAX_DEFAULT);
    if (under_pmix()) {
        ret = init_pmix(g);
        if (ret < 0)
            goto out;
        *out = g;
        g = NULL;
        ret = 0;
        goto out;
    }
    ret = read_env(g, &token);
    if (ret < 0)
        goto out;
    g->generation = restart_count();
    g->fd = connect_unix(g->sock);
    if (g->fd < 0) {
        ret = errmsg_set(&init_err, g->fd, "cannot connect to agent '%s': %s", g->sock,
                         errmsg_strerror(g->fd));
        goto out;
    }
    /* The hello is answered with id 0; its failures go to init_err once g is freed. */
    ret = request_ok(
        g, proto_pack("{s:s, s:i, s:s}", "type", "hello", "rank", g->rank, "token", token), 0,
        GR_REQUEST_TIMEOUT_MS, "hello", g->sock);
    if (ret < 0) {
        init_err = g->err;
        goto out;
    }
    g->err.text[0] = '\0';
    *out = g;
    g = NULL;
    ret = 0;
out:
    gr_free(g);
    return ret;
}

int gr_rank(const struct gr *g)
{
    return g->rank;
}

int gr_world_size(const struct gr *g)
{
    return g->world_size;
}

int gr_local_rank(const struct gr *g)
{
    return g->local_rank;
}

int gr_local_world_size(const struct gr *g)
{
    return g->local_world_size;
}

int gr_node_rank(const struct gr *g)
{
    return g->node_rank;
}

static int check_key(struct gr *g, const char *what, const char *key)
{
    size_t n = strlen(key);

    if (n == 0)
        return errmsg_set(&g->err, -EINVAL, "%s: empty key", what);
    if (n > GR_KEY_MAX)
        return errmsg_set(&g->err, -E2BIG,
                          "%s '%.32s...': key of %zu bytes is over the limit of %d", what, key, n,
                          GR_KEY_MAX);
    return 0;
}

int gr_kv_put(struct gr *g, const char *key, const void *val, size_t len)
{
    char *b64 = NULL;
    json_int_t id;
    int ret = -1;

    if (g->dead)
        return g->dead;
    ret = check_key(g, "kv_put", key);
    if (ret < 0)
        goto out;
    if (len > GR_VALUE_MAX) {
        ret = errmsg_set(&g->err, -E2BIG,
                         "kv_put '%s': value of %zu bytes is over the store's limit of %d", key,
                         len, GR_VALUE_MAX);
        goto out;
    }
    if (g->px) {
        ret = gr_pmix_put(g->px, key, val, len, &g->err);
        goto out;
    }
    b64 = malloc(4 * ((len + 2) / 3) + 1);
    if (!b64) {
        ret = errmsg_set(&g->err, -ENOMEM, "kv_put '%s': out of memory", key);
        goto out;
    }
    EVP_EncodeBlock((unsigned char *)b64, val, (int)len);
    id = g->next_id++;
    ret = request_ok(
        g, proto_pack("{s:s, s:I, s:s, s:s}", "type", "kv_put", "id", id, "key", key, "value", b64),
        id, GR_REQUEST_TIMEOUT_MS, "kv_put", key);
out:
    free(b64);
    return ret;
}

static bool is_b64(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' ||
           c == '/';
}

/* Strict base64: whole quads of the alphabet, '=' only as the last one or two characters.
 * Returns the decoded length or -1. out holds 3 * n / 4 bytes. */
static long b64_decode(const char *s, size_t n, uint8_t *out)
{
    size_t pad = 0;

    if (n % 4 || n / 4 * 3 > INT_MAX)
        return -1;
    if (n >= 4 && s[n - 1] == '=')
        pad = s[n - 2] == '=' ? 2 : 1;
    for (size_t i = 0; i < n - pad; i++)
        if (!is_b64(s[i]))
            return -1;
    if (EVP_DecodeBlock(out, (const unsigned char *)s, (int)n) != (int)(n / 4 * 3))
        return -1;
    return (long)(n / 4 * 3 - pad);
}

static int kv_get_once(struct gr *g, const char *key, void *buf, size_t cap, size_t *len,
                       int64_t wait_ms)
{
    uint8_t *tmp = NULL;
    struct msg m = {0};
    bool have = false;
    json_int_t id;
    size_t n;
    long got;
    int ret = -1;

    id = g->next_id++;
    ret = request(g,
                  proto_pack("{s:s, s:I, s:s, s:I}", "type", "kv_get", "id", id, "key", key,
                             "timeout_ms", (json_int_t)wait_ms),
                  id, wait_ms + GR_REPLY_GRACE_MS, MSG_KV_VAL, &m, "kv_get", key);
    if (ret < 0)
        goto out;
    have = true;
    /* The length of the JSON string, not strlen: a NUL inside must not pass as an end. */
    n = m.value_len;
    tmp = malloc(n / 4 * 3 + 1);
    if (!tmp) {
        ret = errmsg_set(&g->err, -ENOMEM, "kv_get '%s': out of memory", key);
        goto out;
    }
    got = b64_decode(m.value, n, tmp);
    if (got < 0) {
        ret = broken(g, -EPROTO, "kv_get '%s': agent sent a value that is not base64", key);
        goto out;
    }
    *len = (size_t)got;
    if ((size_t)got > cap) {
        ret = errmsg_set(&g->err, -ENOBUFS, "kv_get '%s': value of %ld bytes does not fit in %zu",
                         key, got, cap);
        goto out;
    }
    if (got > 0)
        memcpy(buf, tmp, (size_t)got);
    ret = 0;
out:
    if (have)
        proto_msg_release(&m);
    free(tmp);
    return ret;
}

int gr_kv_get(struct gr *g, const char *key, void *buf, size_t cap, size_t *len, int timeout_ms)
{
    int ret;

    if (g->dead)
        return g->dead;
    ret = check_key(g, "kv_get", key);
    if (ret < 0)
        return ret;
    if (timeout_ms < -1)
        return errmsg_set(&g->err, -EINVAL, "kv_get '%s': timeout %d ms is not -1 or more", key,
                          timeout_ms);
    if (g->px)
        return gr_pmix_get(g->px, key, buf, cap, len, timeout_ms, &g->err);
    do {
        ret = kv_get_once(g, key, buf, cap, len,
                          timeout_ms < 0 ? GR_WAIT_FOREVER_MS : (int64_t)timeout_ms);
    } while (ret == -ETIMEDOUT && timeout_ms < 0);
    /* An agent may say "timeout" for a key that is missing when asked not to wait. */
    if (ret == -ETIMEDOUT && timeout_ms == 0 && g->agent_said)
        ret = errmsg_set(&g->err, -ENOENT, "kv_get '%s': no such key", key);
    return ret;
}

int gr_kv_del(struct gr *g, const char *key)
{
    json_int_t id;
    int ret;

    if (g->dead)
        return g->dead;
    ret = check_key(g, "kv_del", key);
    if (ret < 0)
        return ret;
    if (g->px)
        return errmsg_set(&g->err, -EOPNOTSUPP,
                          "kv_del '%s': not under PMIx, where a put cannot be taken back", key);
    id = g->next_id++;
    return request_ok(g, proto_pack("{s:s, s:I, s:s}", "type", "kv_del", "id", id, "key", key), id,
                      GR_REQUEST_TIMEOUT_MS, "kv_del", key);
}

int gr_barrier(struct gr *g, const char *name, int timeout_ms)
{
    char implicit[32];
    json_int_t id;
    int ret;

    if (g->dead)
        return g->dead;
    if (timeout_ms < -1)
        return errmsg_set(&g->err, -EINVAL, "barrier: timeout %d ms is not -1 or more", timeout_ms);
    if (name) {
        size_t n = strlen(name);
        if (n == 0 || name[0] == '#')
            return errmsg_set(&g->err, -EINVAL,
                              "barrier '%s': names are non-empty and do not start with '#'", name);
        if (n > GR_NAME_MAX)
            return errmsg_set(&g->err, -E2BIG,
                              "barrier '%.32s...': name of %zu bytes is over the limit of %d", name,
                              n, GR_NAME_MAX);
    } else {
        snprintf(implicit, sizeof(implicit), "#%llu", (unsigned long long)g->barrier_seq++);
        name = implicit;
    }
    if (g->px)
        return gr_pmix_fence(g->px, name, timeout_ms, &g->err);
    id = g->next_id++;
    ret = request_ok(g, proto_pack("{s:s, s:I, s:s}", "type", "barrier", "id", id, "name", name),
                     id, timeout_ms, "barrier", name);
    if (ret == -ETIMEDOUT && !g->dead)
        errmsg_set(&g->err, ret, "barrier '%s': not every rank arrived within %d ms", name,
                   timeout_ms);
    return ret;
}

/* The node's memory checkpoint directory into *dir: 0, or -ENOSYS / -EINVAL with g's text
 * saying why. */
static int mem_dir(struct gr *g, const char *what, const char *name, const char **dir)
{
    *dir = getenv(PROTO_MEM_DIR_ENV);
    if (g->px || !*dir || !**dir)
        return errmsg_set(&g->err, -ENOSYS,
                          "%s '%s': this node keeps no memory checkpoints (%s unset)", what,
                          name ? name : "", PROTO_MEM_DIR_ENV);
    if (!proto_mem_name_ok(name))
        return errmsg_set(&g->err, -EINVAL,
                          "%s '%.80s': not a name (letters, digits, '_', '-', '.'; at most %d)",
                          what, name ? name : "", PROTO_MEM_NAME_MAX);
    return 0;
}

int gr_mem_tmp_path(struct gr *g, const char *name, char *buf, size_t n)
{
    const char *dir;
    int ret;

    if (g->dead)
        return g->dead;
    if ((ret = mem_dir(g, "mem_save", name, &dir)) < 0)
        return ret;
    if (proto_mem_path(buf, n, dir, g->rank, name, true) < 0)
        return errmsg_set(&g->err, -ENAMETOOLONG, "mem_save '%s': '%s' is too long a path", name,
                          dir);
    return 0;
}

int gr_mem_keep(struct gr *g, const char *name, int64_t step)
{
    const char *dir;
    json_int_t id;
    int ret;

    if (g->dead)
        return g->dead;
    if ((ret = mem_dir(g, "mem_save", name, &dir)) < 0)
        return ret;
    id = g->next_id++;
    return request_ok(g,
                      proto_pack("{s:s, s:I, s:s, s:I}", "type", "mem_save", "id", id, "name", name,
                                 "step", (json_int_t)step),
                      id, GR_REQUEST_TIMEOUT_MS, "mem_save", name);
}

int gr_mem_save(struct gr *g, const char *name, const void *data, size_t len, int64_t step)
{
    char path[PATH_MAX];
    int fd, ret = gr_mem_tmp_path(g, name, path, sizeof(path));

    if (ret < 0)
        return ret;
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return errmsg_set(&g->err, -errno, "mem_save '%s': cannot create '%s': %s", name, path,
                          strerror(errno));
    for (size_t done = 0; done < len && ret == 0;) {
        ssize_t n = write(fd, (const char *)data + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            ret = errmsg_set(&g->err, n < 0 ? -errno : -EIO, "mem_save '%s': cannot write '%s': %s",
                             name, path, n < 0 ? strerror(errno) : "no room");
        else
            done += (size_t)n;
    }
    close(fd);
    if (ret < 0) {
        unlink(path);
        return ret;
    }
    return gr_mem_keep(g, name, step);
}

int gr_mem_find(struct gr *g, const char *name, char *buf, size_t n, int64_t *step, uint64_t *size)
{
    struct msg m;
    json_int_t id;
    const char *dir;
    int ret;

    if (g->dead)
        return g->dead;
    if ((ret = mem_dir(g, "mem_load", name, &dir)) < 0)
        return ret;
    id = g->next_id++;
    ret = request(g, proto_pack("{s:s, s:I, s:s}", "type", "mem_load", "id", id, "name", name), id,
                  GR_REQUEST_TIMEOUT_MS, MSG_MEM_COPY, &m, "mem_load", name);
    if (ret < 0)
        return ret;
    if (strlen(m.value) >= n)
        ret = errmsg_set(&g->err, -ENAMETOOLONG, "mem_load '%s': '%s' is too long a path", name,
                         m.value);
    else {
        snprintf(buf, n, "%s", m.value);
        *step = m.step;
        *size = (uint64_t)m.size;
    }
    proto_msg_release(&m);
    return ret;
}

int gr_mem_load(struct gr *g, const char *name, void **data, size_t *len, int64_t *step)
{
    char path[PATH_MAX];
    char *buf = NULL;
    uint64_t size;
    size_t done = 0;
    int64_t at;
    int fd, ret;

    *data = NULL;
    *len = 0;
    ret = gr_mem_find(g, name, path, sizeof(path), &at, &size);
    if (ret < 0)
        return ret;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errmsg_set(&g->err, -errno, "mem_load '%s': cannot open '%s': %s", name, path,
                          strerror(errno));
    buf = size < SIZE_MAX ? malloc(size ? (size_t)size : 1) : NULL;
    if (!buf) {
        ret = errmsg_set(&g->err, -ENOMEM, "mem_load '%s': out of memory for %llu bytes", name,
                         (unsigned long long)size);
        goto out;
    }
    while (done < size) {
        ssize_t n = read(fd, buf + done, (size_t)size - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            ret = errmsg_set(&g->err, n < 0 ? -errno : -EIO,
                             "mem_load '%s': '%s' ends at %zu of its %llu bytes", name, path, done,
                             (unsigned long long)size);
            goto out;
        }
        done += (size_t)n;
    }
    *data = buf;
    *len = (size_t)size;
    *step = at;
    buf = NULL;
out:
    close(fd);
    free(buf);
    return ret;
}

int gr_report(struct gr *g, const struct gr_progress *p)
{
    json_t *req;
    size_t i;

    if (g->dead)
        return g->dead;
    if (p->size < GR_PROGRESS_SIZE_1)
        return errmsg_set(&g->err, -EINVAL,
                          "report: struct gr_progress of size %zu, under its first layout's %zu "
                          "(made without GR_PROGRESS_INIT?)",
                          p->size, (size_t)GR_PROGRESS_SIZE_1);
    for (i = 0; i < GR_N_FIELDS; i++) {
        const struct gr_field *f = &gr_fields[i];
        int64_t v;

        if (f->kind != 'I' || f->off + f->len > p->size)
            continue;
        memcpy(&v, (const char *)p + f->off, sizeof(v));
        if (!proto_progress_in_range((double)v, f->range))
            return errmsg_set(&g->err, -EINVAL, "report: %s %lld is out of its range (%s)", f->key,
                              (long long)v, f->range == PROGRESS_POS ? "above 0" : "0 or more");
    }
    /* Under PMIx there is no agent to tell. */
    if (g->px)
        return 0;
    req = json_pack("{s:s}", "type", "report");
    /* A field past the caller's struct is unknown, as is a number out of its range: left out
     * (a rate or a norm below 0 too, as in Python). */
    for (i = 0; req && i < GR_N_FIELDS; i++) {
        const struct gr_field *f = &gr_fields[i];
        const char *x = (const char *)p + f->off;
        json_t *v = NULL;

        if (f->off + f->len > p->size)
            continue;
        if (f->kind == 'I') {
            int64_t n;

            memcpy(&n, x, sizeof(n));
            v = json_integer((json_int_t)n);
        } else {
            double d;

            memcpy(&d, x, sizeof(d));
            if (!proto_progress_in_range(d, f->range))
                continue;
            v = json_real(d);
        }
        if (!v || json_object_set_new(req, f->key, v) < 0) {
            json_decref(req);
            req = NULL;
        }
    }
    if (!req)
        return errmsg_set(&g->err, -ENOMEM, "report: cannot build the message");
    return send_msg(g, req, "report");
}

int gr_on_preempt(struct gr *g, int *sig)
{
    const char *env = getenv("GPURUN_PREEMPT_SIGNAL");
    json_int_t id;
    long n = SIGUSR1;
    char *end;

    if (g->dead)
        return g->dead;
    if (env && *env) {
        n = strtol(env, &end, 10);
        if (*end || n < 1 || n > 64)
            return errmsg_set(&g->err, -EINVAL, "GPURUN_PREEMPT_SIGNAL '%s' is not a signal number",
                              env);
    }
    if (sig)
        *sig = (int)n;
    /* Under PMIx the launcher's own signal rules apply. */
    if (g->px)
        return 0;
    id = g->next_id++;
    return request_ok(g, proto_pack("{s:s, s:I}", "type", "preempt", "id", id), id,
                      GR_REQUEST_TIMEOUT_MS, "preempt", g->sock);
}

int gr_generation(const struct gr *g)
{
    return g->generation;
}

int gr_regroup_enable(struct gr *g)
{
    json_int_t id;

    if (g->dead)
        return g->dead;
    if (g->px)
        return errmsg_set(&g->err, -ENOSYS, "regroup: under PMIx there is no agent to regroup");
    id = g->next_id++;
    return request_ok(g, proto_pack("{s:s, s:I}", "type", "regroup_ok", "id", id), id,
                      GR_REQUEST_TIMEOUT_MS, "regroup_ok", g->sock);
}

int gr_regroup(struct gr *g, int64_t timeout_ms)
{
    struct msg m;
    json_int_t id;
    int ret;

    if (g->dead)
        return g->dead;
    if (g->px)
        return errmsg_set(&g->err, -ENOSYS, "regroup: under PMIx there is no agent to regroup");
    id = g->next_id++;
    ret = request(
        g, proto_pack("{s:s, s:I, s:i}", "type", "regroup", "id", id, "generation", g->generation),
        id, timeout_ms, MSG_REGROUP, &m, "regroup", g->sock);
    if (ret < 0)
        return ret;
    if (m.generation <= g->generation) {
        ret = broken(g, -EPROTO, "regroup: the agent named generation %d, not one after %d",
                     m.generation, g->generation);
        proto_msg_release(&m);
        return ret;
    }
    g->generation = m.generation;
    /* The new generation's barriers count from "#0", as its spare's new ranks do. */
    g->barrier_seq = 0;
    proto_msg_release(&m);
    return g->generation;
}

int gr_finalize(struct gr *g)
{
    json_int_t id;
    int ret;

    if (!g)
        return 0;
    if (g->px) {
        struct errmsg err;
        ret = gr_pmix_close(g->px, &err);
        init_err.text[0] = '\0';
        if (ret < 0)
            init_err = err;
        g->px = NULL;
        gr_free(g);
        return ret;
    }
    id = g->next_id++;
    ret = request_ok(g, proto_pack("{s:s, s:I}", "type", "finalize", "id", id), id,
                     GR_REQUEST_TIMEOUT_MS, "finalize", g->sock);
    if (ret < 0)
        init_err = g->err;
    gr_free(g);
    return ret;
}

const char *gr_strerror(const struct gr *g)
{
    return g ? g->err.text : init_err.text;
}
