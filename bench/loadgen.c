/* loadgen: the measuring tools behind `make bench` (bench/README.md says what each measures).
 *
 *   loadgen rendezvous [--agents 8,64,512] [--nprocs 8] [--reps 3] [--rendezvousd PATH]
 *       starts a leader-only rendezvousd per repetition and plays every agent of the job
 *       itself on one libuv loop; prints one markdown row per size (medians)
 *   loadgen launch [--runs N] [--warmup N] [--until TEXT] [--label TEXT] [--timeout S] -- CMD...
 *       runs CMD N times, timing start to exit (or until TEXT appears in its output)
 *   loadgen teardown --pid-dir DIR --world N [--victim R] [--watch PID]... [-- CMD...]
 *       waits for N ranks' pid files, SIGKILLs rank R and times until every rank is gone
 *   loadgen sleeper DIR
 *       a rank for the teardown benchmark: writes DIR/$RANK with its pid, then sleeps
 *   loadgen stats
 *       reads numbers, one a line, and prints "median p90 min n"
 *   loadgen flood --port PORT [--seconds S] [--hold N] [--hello | --early | --frame BYTES]
 *       opens connections to 127.0.0.1:PORT as fast as it can for S seconds, holding the
 *       newest N open and silent (or each sending a well-formed hello and nothing more, a
 *       one-frame hello whose tag is not the key's, or the header of a BYTES-long frame and
 *       as much of its payload as the socket takes); prints the number of attempts
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <uv.h>

#include "auth.h"
#include "frame.h"
#include "fsutil.h"
#include "jobspec.h"
#include "monotime.h"
#include "banned.h"

extern char **environ;

/* Everything a rendezvous run may take before it counts as failed: far above any result we
 * would accept, short enough that a stuck leader does not stall `make bench`. */
#define RUN_DEADLINE_MS   60000
/* How often the job dir is checked for endpoint.json while the leader starts. */
#define ENDPOINT_POLL_MS  1
/* How long the simulated ranks' kv_get may wait for the key of a rank on another agent. */
#define KV_GET_TIMEOUT_MS 30000
/* The project's target for a rendezvous of up to 12,500 agents (100,000 ranks): join, a store
 * round and a barrier within 2 s, the leader under 256 MiB. */
#define TARGET_MS         2000.0
#define TARGET_MIB        256.0
/* Sizes and repetitions are bounded so that a typo cannot exhaust the machine. */
#define AGENTS_MAX        16384
/* Descriptors a rendezvous needs besides one per agent, here and in the leader (which
 * inherits this limit): the leader's PENDING_CONNS_MAX and its slack (leader_fds_needed()). */
#define FDS_SLACK         (1024 + 256 + 64)
/* A flood's bounds: at most this long, at most this many connections held. */
#define FLOOD_SECONDS_MAX 60
#define FLOOD_HOLD_MAX    8192
#define SIZES_MAX         8
#define REPS_MAX          50
#define RUNS_MAX          1000
/* The teardown poll period: ~0.5 ms resolution at a few percent of one core. */
#define POLL_NS           500000L

/* Milliseconds with their fraction: a store round trip here takes well under one. */
static double now_ms(void)
{
    return 1e3 * monotime_s();
}

static double cpu_self_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Sorts v in place; the median, the 90th percentile (nearest rank) and the minimum. */
static void summarize(double *v, int n, double *median, double *p90, double *min)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    *median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    *p90 = v[(int)ceil(0.9 * n) - 1];
    *min = v[0];
}

static int parse_long(const char *what, const char *s, long min, long max, long *out)
{
    char *end;
    long v;

    errno = 0;
    v = s ? strtol(s, &end, 10) : 0;
    if (!s || errno || end == s || *end || v < min || v > max) {
        fprintf(stderr, "loadgen: %s: '%s' is not a number in %ld..%ld\n", what, s ? s : "", min,
                max);
        return -EINVAL;
    }
    *out = v;
    return 0;
}

/* Raises the descriptor limit to its hard maximum: every simulated agent holds one socket
 * here and one in the leader, which inherits the limit. Returns 0, or -1 with one line when
 * the hard limit is below need. */
static int raise_nofile(const char *what, long need)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
        fprintf(stderr, "loadgen: cannot read the descriptor limit: %s\n", strerror(errno));
        return -1;
    }
    if (rl.rlim_max != RLIM_INFINITY && (rlim_t)need > rl.rlim_max) {
        fprintf(stderr, "loadgen: %s needs %ld descriptors, the hard limit ('ulimit -Hn') is %lu\n",
                what, need, (unsigned long)rl.rlim_max);
        return -1;
    }
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    return 0;
}

/* --- the leader's resources, from /proc ------------------------------------------------ */

/* A "Key:   N kB" line of /proc/PID/status, in KiB, or -1. */
static long proc_status_kib(pid_t pid, const char *key)
{
    char path[64], line[256];
    size_t klen = strlen(key);
    long v = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
    f = fopen(path, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, key, klen) && line[klen] == ':') {
            v = strtol(line + klen + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

/* CPU time PID has used, in ms (nanoseconds in /proc/PID/schedstat), or -1. */
static double proc_cpu_ms(pid_t pid)
{
    char path[64];
    unsigned long long ns;
    FILE *f;
    int n;

    snprintf(path, sizeof(path), "/proc/%ld/schedstat", (long)pid);
    f = fopen(path, "r");
    if (!f)
        return -1;
    n = fscanf(f, "%llu", &ns);
    fclose(f);
    return n == 1 ? (double)ns / 1e6 : -1;
}

/* True while pid runs; a zombie (dead, not yet reaped) counts as gone. */
static bool proc_alive(pid_t pid)
{
    char path[64], buf[512];
    const char *p;
    ssize_t n;
    int fd;

    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

/* --- rendezvous: simulated agents against a real leader ------------------------------- */

enum agent_state { AG_CONNECTING, AG_JOINING, AG_STORE, AG_BARRIER, AG_EXITING };

struct run;

struct sim_agent {
    uv_tcp_t tcp;
    uv_connect_t creq;
    struct run *run;
    int node;
    enum agent_state state;
    struct frame_reader rd;
    struct auth_handshake hs;
    struct auth_session sess;
    int rank_base;
    int gets_done;
    bool finished, open;
    uint8_t *out; /* frames queued during one callback, written at its end */
    size_t out_len, out_cap;
};

struct write_req {
    uv_write_t req;
    uint8_t data[];
};

struct run {
    uv_loop_t loop;
    uv_process_t leader;
    uv_timer_t poll, deadline;
    struct auth_key key;
    char dir[PATH_MAX];
    int nagents, nprocs, world;
    struct sim_agent *agents;
    int handles; /* open handles of the run, agents included */
    int assigned, stored, released, finished;
    double t_spawn, t_up, t0, t_first_assign, t_assigned, t_stored, t_released, t_finished;
    double cpu0, leader_cpu_ms, loadgen_cpu_ms;
    long rss_base_kib, hwm_kib;
    bool leader_running, leader_ok;
    int64_t leader_status;
    int leader_signal;
    char error[512];
};

static void fail(struct run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void on_handle_closed(uv_handle_t *h)
{
    struct run *r = h->data;

    r->handles--;
}

static void close_handle(struct run *r, uv_handle_t *h)
{
    h->data = r;
    if (!uv_is_closing(h))
        uv_close(h, on_handle_closed);
}

static void agent_close(struct sim_agent *a)
{
    if (!a->open)
        return;
    a->open = false;
    uv_read_stop((uv_stream_t *)&a->tcp);
    close_handle(a->run, (uv_handle_t *)&a->tcp);
}

/* Stops the run: every agent hangs up and the leader is killed if it still runs. */
static void stop(struct run *r)
{
    for (int i = 0; i < r->nagents; i++)
        agent_close(&r->agents[i]);
    uv_timer_stop(&r->poll);
    uv_timer_stop(&r->deadline);
    if (r->leader_running)
        uv_process_kill(&r->leader, SIGKILL);
}

static void fail(struct run *r, const char *fmt, ...)
{
    va_list ap;

    if (r->error[0])
        return;
    va_start(ap, fmt);
    vsnprintf(r->error, sizeof(r->error), fmt, ap);
    va_end(ap);
    stop(r);
}

static int out_reserve(struct sim_agent *a, size_t more)
{
    if (a->out_len + more <= a->out_cap)
        return 0;
    size_t cap = a->out_cap ? a->out_cap : 1024;
    while (cap < a->out_len + more)
        cap *= 2;
    uint8_t *p = realloc(a->out, cap);
    if (!p)
        return -ENOMEM;
    a->out = p;
    a->out_cap = cap;
    return 0;
}

/* Queues one raw handshake frame. */
static int queue_raw(struct sim_agent *a, const uint8_t *data, size_t n)
{
    if (out_reserve(a, FRAME_HDR_LEN + n) < 0)
        return -ENOMEM;
    frame_put_header(a->out + a->out_len, (uint32_t)n);
    memcpy(a->out + a->out_len + FRAME_HDR_LEN, data, n);
    a->out_len += FRAME_HDR_LEN + n;
    return 0;
}

/* Queues one sealed JSON frame built from fmt, as the daemon's peer_send would send it. */
static int queue_msg(struct sim_agent *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int queue_msg(struct sim_agent *a, const char *fmt, ...)
{
    va_list ap;
    uint8_t *payload;
    int n;

    if (out_reserve(a, FRAME_HDR_LEN + AUTH_OVERHEAD + 512) < 0)
        return -ENOMEM;
    payload = a->out + a->out_len + FRAME_HDR_LEN;
    va_start(ap, fmt);
    n = vsnprintf((char *)payload + AUTH_SEQ_LEN, 512, fmt, ap);
    va_end(ap);
    if (n < 0 || n >= 512)
        return -EMSGSIZE;
    auth_seal(&a->sess, payload, (size_t)n);
    frame_put_header(a->out + a->out_len, (uint32_t)n + AUTH_OVERHEAD);
    a->out_len += FRAME_HDR_LEN + (size_t)n + AUTH_OVERHEAD;
    return 0;
}

static void on_written(uv_write_t *req, int status)
{
    struct sim_agent *a = req->data;

    if (status < 0 && status != UV_ECANCELED && a->open)
        fail(a->run, "node %d: cannot write to the leader: %s", a->node, uv_strerror(status));
    free(req);
}

static void flush(struct sim_agent *a)
{
    struct write_req *w;
    uv_buf_t b;
    int ret;

    if (!a->out_len || !a->open)
        return;
    /* As the daemon's peers do (daemon/peer.c): one write(2) when the kernel takes it all,
     * without uv_write()'s request and its epoll_ctl(2) per write. */
    if (uv_stream_get_write_queue_size((uv_stream_t *)&a->tcp) == 0) {
        b = uv_buf_init((char *)a->out, (unsigned)a->out_len);
        ret = uv_try_write((uv_stream_t *)&a->tcp, &b, 1);
        if (ret == (int)a->out_len) {
            a->out_len = 0;
            return;
        }
        if (ret > 0) {
            memmove(a->out, a->out + ret, a->out_len - (size_t)ret);
            a->out_len -= (size_t)ret;
        } else if (ret != UV_EAGAIN) {
            fail(a->run, "node %d: cannot write to the leader: %s", a->node, uv_strerror(ret));
            return;
        }
    }
    w = malloc(sizeof(*w) + a->out_len);
    if (!w) {
        fail(a->run, "out of memory");
        return;
    }
    memcpy(w->data, a->out, a->out_len);
    b = uv_buf_init((char *)w->data, (unsigned)a->out_len);
    a->out_len = 0;
    w->req.data = a;
    ret = uv_write(&w->req, (uv_stream_t *)&a->tcp, &b, 1, on_written);
    if (ret < 0) {
        free(w);
        fail(a->run, "node %d: cannot write to the leader: %s", a->node, uv_strerror(ret));
    }
}

/* The value of "name" in the compact JSON j[0..n) that jansson writes, or NULL. The leader's
 * messages are scanned, not parsed: the benchmark measures the leader, and a full parse of
 * every agent's copy of the node list would make the load generator the bottleneck. */
static const char *field(const char *j, size_t n, const char *name)
{
    char pat[64];
    int k = snprintf(pat, sizeof(pat), "\"%s\":", name);
    const char *p = memmem(j, n, pat, (size_t)k);

    return p ? p + k : NULL;
}

static bool field_is(const char *j, size_t n, const char *name, const char *str)
{
    const char *v = field(j, n, name);
    size_t len = strlen(str);

    return v && (size_t)(j + n - v) > len + 2 && v[0] == '"' && !memcmp(v + 1, str, len) &&
           v[len + 1] == '"';
}

static long long field_int(const char *j, size_t n, const char *name)
{
    const char *v = field(j, n, name);

    return v ? strtoll(v, NULL, 10) : -1;
}

/* What rank r publishes: an address, as ranks publish for their own collectives. */
static void rank_value(int r, char *out, size_t cap)
{
    snprintf(out, cap, "127.0.0.1:%d", 20000 + r % 40000);
}

static void on_all_released(struct run *r)
{
    r->t_released = now_ms();
    /* Every agent now reports its ranks gone, as real agents do when training ends; the
     * leader answers "finish" once the whole world has exited. */
    for (int i = 0; i < r->nagents; i++) {
        struct sim_agent *a = &r->agents[i];
        a->state = AG_EXITING;
        for (int k = 0; k < r->nprocs; k++)
            queue_msg(a,
                      "{\"type\":\"rank_exit\",\"rank\":%d,\"code\":0,\"signal\":0,"
                      "\"oom\":false,\"killed\":false,\"tail\":\"\"}",
                      a->rank_base + k);
        flush(a);
    }
}

static void on_all_finished(struct run *r)
{
    r->t_finished = now_ms();
    r->hwm_kib = proc_status_kib(r->leader.pid, "VmHWM");
    r->leader_cpu_ms = proc_cpu_ms(r->leader.pid);
    r->loadgen_cpu_ms = cpu_self_ms() - r->cpu0;
    for (int i = 0; i < r->nagents; i++)
        agent_close(&r->agents[i]);
    uv_timer_stop(&r->deadline);
}

static void handle_msg(struct sim_agent *a, const char *j, size_t n)
{
    struct run *r = a->run;
    char want[64];
    long long id;

    if (field_is(j, n, "type", "hb"))
        return;
    if (field_is(j, n, "type", "error") || field_is(j, n, "type", "abort")) {
        fail(r, "node %d: the leader sent %.*s", a->node, (int)(n > 300 ? 300 : n), j);
        return;
    }
    switch (a->state) {
    case AG_JOINING:
        if (!field_is(j, n, "type", "assign"))
            break;
        a->rank_base = (int)field_int(j, n, "rank_base");
        if (field_int(j, n, "world_size") != r->world || a->rank_base != a->node * r->nprocs) {
            fail(r, "node %d: assign with world size %lld and rank base %d", a->node,
                 field_int(j, n, "world_size"), a->rank_base);
            return;
        }
        if (r->assigned == 0)
            r->t_first_assign = now_ms();
        if (++r->assigned == r->nagents)
            r->t_assigned = now_ms();
        /* Every local rank publishes its address at once, as ranks started together do, and
         * then waits for a rank of the next agent. The agent forwards a put as quiet and tells
         * its rank at once (daemon/agent.c), so the gets follow the puts without a reply
         * between: a reply to a put is an unexpected message here. */
        a->state = AG_STORE;
        for (int k = 0; k < r->nprocs; k++) {
            rank_value(a->rank_base + k, want, sizeof(want));
            queue_msg(a,
                      "{\"type\":\"kv_put\",\"id\":%d,\"key\":\"addr/%d\",\"value\":\"%s\","
                      "\"quiet\":true}",
                      k + 1, a->rank_base + k, want);
        }
        for (int k = 0; k < r->nprocs; k++)
            queue_msg(a, "{\"type\":\"kv_get\",\"id\":%d,\"key\":\"addr/%d\",\"timeout_ms\":%d}",
                      k + 1001, (a->rank_base + k + r->nprocs) % r->world, KV_GET_TIMEOUT_MS);
        return;
    case AG_STORE:
        id = field_int(j, n, "id");
        if (field_is(j, n, "type", "kv_val") && id > 1000 && id <= 1000 + r->nprocs) {
            int peer = (a->rank_base + (int)(id - 1001) + r->nprocs) % r->world;
            rank_value(peer, want, sizeof(want));
            if (!field_is(j, n, "value", want)) {
                fail(r, "node %d: wrong value for 'addr/%d': %.*s", a->node, peer, (int)n, j);
                return;
            }
            if (++a->gets_done < r->nprocs)
                return;
            if (++r->stored == r->nagents)
                r->t_stored = now_ms();
            a->state = AG_BARRIER;
            queue_msg(a, "{\"type\":\"barrier\",\"id\":2000,\"name\":\"bench\",\"count\":%d}",
                      r->nprocs);
            return;
        }
        break;
    case AG_BARRIER:
        if (!field_is(j, n, "type", "barrier_done") || !field_is(j, n, "name", "bench"))
            break;
        if (++r->released == r->nagents)
            on_all_released(r);
        return;
    case AG_EXITING:
        if (!field_is(j, n, "type", "finish"))
            break;
        if (field_int(j, n, "status") != 0) {
            fail(r, "node %d: finish with status %lld", a->node, field_int(j, n, "status"));
            return;
        }
        a->finished = true;
        if (++r->finished == r->nagents)
            on_all_finished(r);
        return;
    default:
        break;
    }
    fail(r, "node %d: unexpected message: %.*s", a->node, (int)(n > 300 ? 300 : n), j);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    static char chunk[64 * 1024];

    (void)h;
    (void)suggested;
    *buf = uv_buf_init(chunk, sizeof(chunk));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct sim_agent *a = s->data;
    struct run *r = a->run;
    const uint8_t *payload, *json;
    size_t len, n;
    int ret;

    if (nread == 0 || !a->open)
        return;
    if (nread < 0) {
        if (!a->finished)
            fail(r, "node %d: the leader closed the link: %s", a->node, uv_strerror((int)nread));
        agent_close(a);
        return;
    }
    if (frame_reader_feed(&a->rd, buf->base, (size_t)nread) < 0) {
        fail(r, "out of memory");
        return;
    }
    while (a->open && (ret = frame_reader_next(&a->rd, &payload, &len)) != 0) {
        if (ret < 0) {
            fail(r, "node %d: bad frame from the leader", a->node);
            return;
        }
        if (auth_open(&a->sess, payload, len, &json, &n) < 0) {
            fail(r, "node %d: a frame from the leader failed authentication", a->node);
            return;
        }
        handle_msg(a, (const char *)json, n);
    }
    flush(a);
}

static void on_connect(uv_connect_t *req, int status)
{
    struct sim_agent *a = req->data;
    uint8_t hello[AUTH_EARLY_LEN];

    if (!a->open)
        return;
    if (status < 0) {
        fail(a->run, "node %d: cannot connect to the leader: %s", a->node, uv_strerror(status));
        return;
    }
    uv_tcp_nodelay(&a->tcp, 1);
    /* The one-frame hello and the join in one write, as the daemon's agent sends them
     * (daemon/peer.c); the leader's first frame, its assign, proves the leader. */
    a->state = AG_JOINING;
    if (auth_early_hello(&a->hs, &a->run->key, hello, &a->sess) < 0 ||
        queue_raw(a, hello, sizeof(hello)) ||
        queue_msg(a,
                  "{\"type\":\"join\",\"node_rank\":%d,\"hostname\":\"sim%d\","
                  "\"addr\":\"127.0.0.1\",\"nprocs\":%d,\"gpus\":\"\"}",
                  a->node, a->node, a->run->nprocs)) {
        fail(a->run, "node %d: cannot start the handshake", a->node);
        return;
    }
    uv_read_start((uv_stream_t *)&a->tcp, on_alloc, on_read);
    flush(a);
}

static void start_agents(struct run *r, int port)
{
    struct sockaddr_in sa;

    uv_ip4_addr("127.0.0.1", port, &sa);
    r->rss_base_kib = proc_status_kib(r->leader.pid, "VmRSS");
    r->cpu0 = cpu_self_ms();
    r->t0 = now_ms();
    for (int i = 0; i < r->nagents; i++) {
        struct sim_agent *a = &r->agents[i];
        int ret;

        uv_tcp_init(&r->loop, &a->tcp);
        a->tcp.data = a;
        a->creq.data = a;
        a->open = true;
        r->handles++;
        ret = uv_tcp_connect(&a->creq, &a->tcp, (struct sockaddr *)&sa, on_connect);
        if (ret < 0) {
            fail(r, "node %d: cannot connect to the leader: %s", i, uv_strerror(ret));
            return;
        }
    }
}

static void on_poll(uv_timer_t *t)
{
    struct run *r = t->data;
    char path[PATH_MAX + 32], *text = NULL;
    json_t *ep;
    size_t len;
    int port = -1;

    snprintf(path, sizeof(path), "%s/endpoint.json", r->dir);
    if (fs_read_all(path, 4096, &text, &len) < 0)
        return;
    ep = json_loadb(text, len, 0, NULL);
    free(text);
    if (ep && json_is_integer(json_object_get(ep, "port")))
        port = (int)json_integer_value(json_object_get(ep, "port"));
    json_decref(ep);
    if (port <= 0)
        return;
    uv_timer_stop(t);
    r->t_up = now_ms();
    start_agents(r, port);
}

static void on_deadline(uv_timer_t *t)
{
    struct run *r = t->data;

    fail(r, "no result within %d ms: %d of %d agents assigned, %d stored, %d released, %d finished",
         RUN_DEADLINE_MS, r->assigned, r->nagents, r->stored, r->released, r->finished);
}

static void on_leader_exit(uv_process_t *p, int64_t status, int sig)
{
    struct run *r = p->data;

    r->leader_running = false;
    r->leader_status = status;
    r->leader_signal = sig;
    if (r->finished == r->nagents && !r->error[0]) {
        r->leader_ok = status == 0 && sig == 0;
        if (!r->leader_ok)
            fail(r, "the leader exited with status %lld, signal %d", (long long)status, sig);
    } else if (!r->error[0]) {
        fail(r, "the leader exited early with status %lld, signal %d", (long long)status, sig);
    }
    close_handle(r, (uv_handle_t *)p);
    uv_timer_stop(&r->poll);
    uv_timer_stop(&r->deadline);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* Writes the job dir as gpurun would: the key and a job.json of nagents nodes. */
static int make_job_dir(struct run *r)
{
    struct jobspec spec;
    char path[PATH_MAX + 32], id[64];
    char *argv[] = {"true", NULL};
    int ret;

    const char *tmp = getenv("TMPDIR");
    snprintf(r->dir, sizeof(r->dir), "%s/gr-bench-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(r->dir)) {
        fprintf(stderr, "loadgen: cannot create a job dir in '%s': %s\n", tmp ? tmp : "/tmp",
                strerror(errno));
        return -errno;
    }
    ret = auth_key_generate(&r->key);
    snprintf(path, sizeof(path), "%s/key", r->dir);
    if (ret == 0)
        ret = auth_key_write(path, &r->key);
    if (ret < 0) {
        fprintf(stderr, "loadgen: cannot write '%s': %s\n", path, strerror(-ret));
        return ret;
    }
    jobspec_init(&spec);
    snprintf(id, sizeof(id), "bench-rdv-%d", r->nagents);
    spec.job_id = strdup(id);
    spec.nnodes = r->nagents;
    spec.nprocs = r->nprocs;
    spec.loopback = true;
    spec.join_timeout_ms = RUN_DEADLINE_MS;
    ret = spec.job_id ? jobspec_set_argv(&spec, 1, argv) : -ENOMEM;
    snprintf(path, sizeof(path), "%s/job.json", r->dir);
    if (ret == 0)
        ret = jobspec_save(&spec, path);
    jobspec_release(&spec);
    if (ret < 0)
        fprintf(stderr, "loadgen: cannot write '%s': %s\n", path, strerror(-ret));
    return ret;
}

/* One rendezvous of nagents agents of nprocs ranks. Returns 0 with r's timings filled, or -1
 * with r->error saying why. */
static int run_once(struct run *r, const char *daemon)
{
    char *args[] = {(char *)daemon,  "--job-dir",   r->dir, "--node-rank", "0",
                    "--leader-only", "--log-level", "warn", NULL};
    uv_stdio_container_t stdio[3] = {
        {.flags = UV_IGNORE}, {.flags = UV_IGNORE}, {.flags = UV_INHERIT_FD, .data.fd = 2}};
    uv_process_options_t po = {
        .file = daemon, .args = args, .stdio_count = 3, .stdio = stdio, .exit_cb = on_leader_exit};
    int ret = -1;

    r->world = r->nagents * r->nprocs;
    r->agents = calloc((size_t)r->nagents, sizeof(*r->agents));
    if (!r->agents || uv_loop_init(&r->loop) < 0) {
        free(r->agents);
        snprintf(r->error, sizeof(r->error), "out of memory");
        return -1;
    }
    for (int i = 0; i < r->nagents; i++) {
        r->agents[i].run = r;
        r->agents[i].node = i;
        frame_reader_init(&r->agents[i].rd, FRAME_MAX_DEFAULT);
    }
    if (make_job_dir(r) < 0) {
        snprintf(r->error, sizeof(r->error), "cannot make the job dir");
        goto out;
    }
    uv_timer_init(&r->loop, &r->poll);
    uv_timer_init(&r->loop, &r->deadline);
    r->poll.data = r->deadline.data = r;
    r->handles += 2;
    r->t_spawn = now_ms();
    ret = uv_spawn(&r->loop, &r->leader, &po);
    if (ret < 0) {
        snprintf(r->error, sizeof(r->error), "cannot start '%s': %s", daemon, uv_strerror(ret));
        ret = -1;
    } else {
        r->leader.data = r;
        r->leader_running = true;
        r->handles++;
        uv_timer_start(&r->poll, on_poll, ENDPOINT_POLL_MS, ENDPOINT_POLL_MS);
        uv_timer_start(&r->deadline, on_deadline, RUN_DEADLINE_MS, 0);
        uv_run(&r->loop, UV_RUN_DEFAULT);
    }
    close_handle(r, (uv_handle_t *)&r->poll);
    close_handle(r, (uv_handle_t *)&r->deadline);
    uv_run(&r->loop, UV_RUN_DEFAULT);
    ret = r->error[0] || !r->leader_ok ? -1 : 0;
    if (ret < 0 && !r->error[0])
        snprintf(r->error, sizeof(r->error), "the run did not finish");
out:
    if (uv_loop_close(&r->loop) != 0 && !r->error[0]) {
        snprintf(r->error, sizeof(r->error), "handles left open");
        ret = -1;
    }
    for (int i = 0; i < r->nagents; i++) {
        frame_reader_release(&r->agents[i].rd);
        free(r->agents[i].out);
        auth_session_release(&r->agents[i].sess);
    }
    free(r->agents);
    r->agents = NULL;
    if (r->dir[0])
        nftw(r->dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    return ret;
}

/* The columns of the rendezvous table, one value per repetition. */
enum {
    C_UP,
    C_FIRST,
    C_ASSIGN,
    C_STORE,
    C_BARRIER,
    C_FINISH,
    C_LCPU,
    C_GCPU,
    C_RSS0,
    C_HWM,
    C_COUNT
};

static int cmd_rendezvous(int argc, char **argv)
{
    const char *daemon = "build/rendezvousd";
    long sizes[SIZES_MAX] = {8, 64, 512}, nprocs = 8, reps = 3;
    int nsizes = 3;

    for (int i = 1; i < argc; i++) {
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--agents") && val) {
            char *list = strdup(val), *save = NULL;
            nsizes = 0;
            for (char *s = strtok_r(list, ",", &save); s; s = strtok_r(NULL, ",", &save)) {
                if (nsizes == SIZES_MAX ||
                    parse_long("--agents", s, 1, AGENTS_MAX, &sizes[nsizes++]) < 0) {
                    free(list);
                    return 2;
                }
            }
            free(list);
        } else if (!strcmp(argv[i], "--nprocs") && val) {
            if (parse_long("--nprocs", val, 1, 1024, &nprocs) < 0)
                return 2;
        } else if (!strcmp(argv[i], "--reps") && val) {
            if (parse_long("--reps", val, 1, REPS_MAX, &reps) < 0)
                return 2;
        } else if (!strcmp(argv[i], "--rendezvousd") && val) {
            daemon = val;
        } else {
            fprintf(stderr, "loadgen: rendezvous: unknown or incomplete option '%s'\n", argv[i]);
            return 2;
        }
        i++;
    }
    {
        long most = 0;
        char what[64];
        for (int s = 0; s < nsizes; s++)
            most = sizes[s] > most ? sizes[s] : most;
        snprintf(what, sizeof(what), "a rendezvous of %ld agents", most);
        if (raise_nofile(what, most + FDS_SLACK) < 0)
            return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    printf("| ranks | agents | leader up ms | first assign ms | all assigned ms | store round ms "
           "| barrier released ms | finish ms | leader CPU ms | loadgen CPU ms "
           "| leader RSS MiB (start -> peak) | target |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n");
    fflush(stdout);
    for (int s = 0; s < nsizes; s++) {
        double col[C_COUNT][REPS_MAX], med[C_COUNT], p90, min;
        for (int k = 0; k < reps; k++) {
            struct run r = {.nagents = (int)sizes[s], .nprocs = (int)nprocs};
            if (run_once(&r, daemon) < 0) {
                fprintf(stderr, "loadgen: rendezvous of %ld agents: %s\n", sizes[s], r.error);
                return 1;
            }
            col[C_UP][k] = r.t_up - r.t_spawn;
            col[C_FIRST][k] = r.t_first_assign - r.t0;
            col[C_ASSIGN][k] = r.t_assigned - r.t0;
            col[C_STORE][k] = r.t_stored - r.t0;
            col[C_BARRIER][k] = r.t_released - r.t0;
            col[C_FINISH][k] = r.t_finished - r.t0;
            col[C_LCPU][k] = r.leader_cpu_ms;
            col[C_GCPU][k] = r.loadgen_cpu_ms;
            col[C_RSS0][k] = (double)r.rss_base_kib / 1024;
            col[C_HWM][k] = (double)r.hwm_kib / 1024;
        }
        for (int c = 0; c < C_COUNT; c++)
            summarize(col[c], (int)reps, &med[c], &p90, &min);
        printf("| %ld | %ld | %.1f | %.1f | %.1f | %.1f | **%.1f** | %.1f | %.0f | %.0f | %.1f -> "
               "%.1f | %s |\n",
               sizes[s] * nprocs, sizes[s], med[C_UP], med[C_FIRST], med[C_ASSIGN], med[C_STORE],
               med[C_BARRIER], med[C_FINISH], med[C_LCPU], med[C_GCPU], med[C_RSS0], med[C_HWM],
               med[C_BARRIER] < TARGET_MS && med[C_HWM] < TARGET_MIB ? "met" : "**missed**");
        fflush(stdout);
    }
    return 0;
}

/* --- launch: start-to-exit or start-to-first-line of a command ------------------------- */

struct child {
    pid_t pid;
    int out_fd; /* read end of its stdout, or -1 */
};

static int spawn_child(char **cmd, bool pipe_output, const char *log, struct child *c)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    sigset_t none;
    int fds[2] = {-1, -1}, ret;

    c->out_fd = -1;
    if (pipe_output && pipe2(fds, O_CLOEXEC) < 0)
        return -errno;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);
    /* Its own process group, so that a command that overruns can be stopped whole. */
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
    posix_spawnattr_setpgroup(&attr, 0);
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (pipe_output) {
        posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
        posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    } else {
        posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        posix_spawn_file_actions_adddup2(&fa, 1, 2);
    }
    ret = posix_spawnp(&c->pid, cmd[0], &fa, &attr, cmd, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (fds[1] >= 0)
        close(fds[1]);
    if (ret != 0) {
        if (fds[0] >= 0)
            close(fds[0]);
        return -ret;
    }
    c->out_fd = fds[0];
    return 0;
}

/* Reads the child's output (when piped), noting when until (NULL: any line) shows, until the
 * child exits or deadline passes. Sets *t_seen (NAN when never seen) and *t_exit; returns the
 * wait status or -ETIMEDOUT. */
static int wait_child(struct child *c, const char *until, double deadline, double *t_seen,
                      double *t_exit)
{
    char buf[8192];
    size_t keep = 0, ulen = until ? strlen(until) : 0;
    int st;

    *t_seen = NAN;
    for (;;) {
        struct pollfd pfd = {.fd = c->out_fd, .events = POLLIN};
        pid_t p = waitpid(c->pid, &st, WNOHANG);
        ssize_t n;

        if (p == c->pid) {
            *t_exit = now_ms();
            break;
        }
        if (now_ms() > deadline) {
            kill(-c->pid, SIGKILL);
            waitpid(c->pid, &st, 0);
            st = -ETIMEDOUT;
            break;
        }
        if (c->out_fd < 0) {
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
            continue;
        }
        /* The output is drained to the end (a closed pipe would fail the command), and the
         * child's exit is checked every millisecond meanwhile. */
        if (poll(&pfd, 1, 1) <= 0)
            continue;
        n = read(c->out_fd, buf + keep, sizeof(buf) - keep);
        if (n <= 0) {
            if (n == 0 || errno != EINTR) {
                close(c->out_fd);
                c->out_fd = -1;
            }
            continue;
        }
        if (isnan(*t_seen) && (until ? memmem(buf, keep + (size_t)n, until, ulen) != NULL
                                     : memchr(buf, '\n', (size_t)n) != NULL))
            *t_seen = now_ms();
        /* Keep the tail, in case the text straddles two reads. */
        size_t have = keep + (size_t)n, tail = ulen > 1 ? ulen - 1 : 0;
        if (tail > have)
            tail = have;
        memmove(buf, buf + have - tail, tail);
        keep = tail;
    }
    if (c->out_fd >= 0)
        close(c->out_fd);
    c->out_fd = -1;
    return st;
}

static int cmd_launch(int argc, char **argv)
{
    long runs = 20, timeout_s = 60, warmup = 1;
    const char *label = NULL, *log = "/dev/null", *until = NULL;
    double v[RUNS_MAX], ex[RUNS_MAX], med, p90, min, exit_med;
    char **cmd = NULL;
    int i;

    for (i = 1; i < argc && strcmp(argv[i], "--"); i++) {
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--runs") && val) {
            if (parse_long("--runs", val, 1, RUNS_MAX, &runs) < 0)
                return 2;
        } else if (!strcmp(argv[i], "--warmup") && val) {
            if (parse_long("--warmup", val, 0, 100, &warmup) < 0)
                return 2;
        } else if (!strcmp(argv[i], "--timeout") && val) {
            if (parse_long("--timeout", val, 1, 3600, &timeout_s) < 0)
                return 2;
        } else if (!strcmp(argv[i], "--until") && val && *val) {
            until = val;
        } else if (!strcmp(argv[i], "--label") && val) {
            label = val;
        } else if (!strcmp(argv[i], "--log") && val) {
            log = val;
        } else {
            fprintf(stderr, "loadgen: launch: unknown or incomplete option '%s'\n", argv[i]);
            return 2;
        }
        i++;
    }
    if (i + 1 >= argc) {
        fprintf(stderr, "loadgen: launch: missing '-- CMD...'\n");
        return 2;
    }
    cmd = argv + i + 1;
    for (long k = -warmup; k < runs; k++) {
        struct child c;
        double t0 = now_ms(), t_seen = NAN, t_exit = NAN;
        int st, ret = spawn_child(cmd, until != NULL, log, &c);

        if (ret < 0) {
            fprintf(stderr, "loadgen: cannot run '%s': %s\n", cmd[0], strerror(-ret));
            return 1;
        }
        st = wait_child(&c, until, t0 + (double)timeout_s * 1e3, &t_seen, &t_exit);
        if (st == -ETIMEDOUT || !WIFEXITED(st) || WEXITSTATUS(st) != 0 ||
            (until && isnan(t_seen))) {
            fprintf(stderr, "loadgen: '%s' %s\n", label ? label : cmd[0],
                    st == -ETIMEDOUT  ? "timed out"
                    : !WIFEXITED(st)  ? "was killed by a signal"
                    : WEXITSTATUS(st) ? "exited non-zero"
                                      : "never printed the text it was timed to");
            return 1;
        }
        if (k >= 0) {
            v[k] = (until ? t_seen : t_exit) - t0;
            ex[k] = t_exit - t0;
        }
    }
    summarize(ex, (int)runs, &exit_med, &p90, &min);
    summarize(v, (int)runs, &med, &p90, &min);
    printf("| %s | %ld | **%.1f** | %.1f | %.1f | %.1f |\n", label ? label : cmd[0], runs, med, p90,
           min, exit_med);
    return 0;
}

/* --- teardown: SIGKILL one rank, time until all are gone -------------------------------- */

static int read_pid(const char *dir, int rank, pid_t *out)
{
    char path[PATH_MAX + 16], buf[32];
    ssize_t n;
    int fd;

    snprintf(path, sizeof(path), "%s/%d", dir, rank);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -EAGAIN;
    buf[n] = '\0';
    *out = (pid_t)strtol(buf, NULL, 10);
    return *out > 0 ? 0 : -EAGAIN;
}

#define WATCH_MAX 64

static int cmd_teardown(int argc, char **argv)
{
    const char *dir = NULL, *log = "/dev/null";
    long world = 0, victim = -1, timeout_ms = 10000, settle_ms = 200;
    pid_t watch[WATCH_MAX], *ranks = NULL;
    int nwatch = 0, i, st = -1, ret = 1;
    double t0, t_ranks = NAN, t_watch = NAN, t_exit = NAN, deadline;
    struct child c = {.pid = -1, .out_fd = -1};
    char **cmd = NULL;

    for (i = 1; i < argc && strcmp(argv[i], "--"); i++) {
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        long pid;
        if (!val) {
            fprintf(stderr, "loadgen: teardown: option '%s' needs a value\n", argv[i]);
            return 2;
        }
        if (!strcmp(argv[i], "--pid-dir")) {
            dir = val;
        } else if (!strcmp(argv[i], "--log")) {
            log = val;
        } else if (!strcmp(argv[i], "--world")) {
            if (parse_long("--world", val, 1, 65536, &world) < 0)
                return 2;
        } else if (!strcmp(argv[i], "--victim")) {
            if (parse_long("--victim", val, 0, 65535, &victim) < 0)
                return 2;
        } else if (!strcmp(argv[i], "--timeout-ms")) {
            if (parse_long("--timeout-ms", val, 1, 600000, &timeout_ms) < 0)
                return 2;
        } else if (!strcmp(argv[i], "--watch") && nwatch < WATCH_MAX) {
            if (parse_long("--watch", val, 1, INT_MAX, &pid) < 0)
                return 2;
            watch[nwatch++] = (pid_t)pid;
        } else {
            fprintf(stderr, "loadgen: teardown: unknown option '%s'\n", argv[i]);
            return 2;
        }
        i++;
    }
    if (!dir || !world) {
        fprintf(stderr, "loadgen: teardown: --pid-dir and --world are required\n");
        return 2;
    }
    if (victim < 0)
        victim = world - 1;
    if (i + 1 < argc)
        cmd = argv + i + 1;
    ranks = calloc((size_t)world, sizeof(*ranks));
    if (!ranks)
        return 1;
    if (cmd) {
        int r = spawn_child(cmd, false, log, &c);
        if (r < 0) {
            fprintf(stderr, "loadgen: cannot run '%s': %s\n", cmd[0], strerror(-r));
            goto out;
        }
    }
    /* Every rank up. */
    deadline = now_ms() + 30000;
    for (int r = 0; r < world;) {
        if (read_pid(dir, r, &ranks[r]) == 0) {
            r++;
            continue;
        }
        bool watch_gone = false;
        for (int w = 0; w < nwatch; w++)
            watch_gone |= !proc_alive(watch[w]);
        if (now_ms() > deadline || watch_gone ||
            (c.pid > 0 && waitpid(c.pid, &st, WNOHANG) == c.pid)) {
            fprintf(stderr, "loadgen: teardown: rank %d did not start (%s)\n", r,
                    now_ms() > deadline ? "timed out"
                    : watch_gone        ? "a watched process exited"
                                        : "the job exited");
            goto out;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    /* Let the daemons finish their own start-up work (spawning, first heartbeats). */
    {
        struct timespec ts = {settle_ms / 1000, (settle_ms % 1000) * 1000000};
        nanosleep(&ts, NULL);
    }
    t0 = now_ms();
    if (kill(ranks[victim], SIGKILL) < 0) {
        fprintf(stderr, "loadgen: cannot kill rank %ld (pid %ld): %s\n", victim,
                (long)ranks[victim], strerror(errno));
        goto out;
    }
    deadline = t0 + (double)timeout_ms;
    for (;;) {
        double t = now_ms();
        bool ranks_left = false, watch_left = false;

        for (int r = 0; r < world && !ranks_left; r++)
            ranks_left = proc_alive(ranks[r]);
        for (int w = 0; w < nwatch && !watch_left; w++)
            watch_left = proc_alive(watch[w]);
        if (!ranks_left && isnan(t_ranks))
            t_ranks = t;
        if (!watch_left && nwatch && isnan(t_watch))
            t_watch = t;
        if (c.pid > 0 && isnan(t_exit) && waitpid(c.pid, &st, WNOHANG) == c.pid)
            t_exit = t;
        if (!ranks_left && (!nwatch || !isnan(t_watch)) && (c.pid <= 0 || !isnan(t_exit)))
            break;
        if (t > deadline) {
            fprintf(stderr, "loadgen: teardown: %s still running %ld ms after the kill\n",
                    ranks_left ? "ranks" : "the job", timeout_ms);
            goto out;
        }
        struct timespec ts = {0, POLL_NS};
        nanosleep(&ts, NULL);
    }
    printf("ranks_gone_ms=%.1f", t_ranks - t0);
    if (nwatch)
        printf(" watched_gone_ms=%.1f", t_watch - t0);
    if (c.pid > 0)
        printf(" exit_ms=%.1f status=%d", t_exit - t0,
               WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    printf("\n");
    ret = 0;
out:
    if (c.pid > 0 && isnan(t_exit) && waitpid(c.pid, &st, WNOHANG) == 0) {
        kill(-c.pid, SIGKILL);
        waitpid(c.pid, &st, 0);
    }
    free(ranks);
    return ret;
}

/* A rank of the teardown benchmark: publishes its pid atomically as DIR/RANK, then sleeps until
 * killed (a stray one gives up after ten minutes). SIGTERM ends it at once. */
static int cmd_sleeper(int argc, char **argv)
{
    /* gpurun and torchrun set RANK; OpenMPI's mpirun its own name for it. */
    const char *rank = getenv("RANK") ? getenv("RANK") : getenv("OMPI_COMM_WORLD_RANK");
    char tmp[PATH_MAX], path[PATH_MAX], text[32];
    int fd, n;

    if (argc < 2 || !rank) {
        fprintf(stderr, "loadgen: sleeper: usage: RANK=R loadgen sleeper DIR\n");
        return 2;
    }
    snprintf(tmp, sizeof(tmp), "%s/%s.tmp", argv[1], rank);
    snprintf(path, sizeof(path), "%s/%s", argv[1], rank);
    n = snprintf(text, sizeof(text), "%ld\n", (long)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, text, (size_t)n) != n || close(fd) < 0 || rename(tmp, path) < 0) {
        fprintf(stderr, "loadgen: sleeper: cannot write '%s': %s\n", path, strerror(errno));
        return 1;
    }
    alarm(600);
    for (;;)
        pause();
}

static int cmd_stats(void)
{
    double v[RUNS_MAX], med, p90, min;
    int n = 0;

    while (n < RUNS_MAX && scanf("%lf", &v[n]) == 1)
        n++;
    if (!n) {
        fprintf(stderr, "loadgen: stats: no numbers on stdin\n");
        return 1;
    }
    summarize(v, n, &med, &p90, &min);
    printf("%.1f %.1f %.1f %d\n", med, p90, min, n);
    return 0;
}

/* --- flood: connections of strangers, as fast as they go ------------------------------ */

static int cmd_flood(int argc, char **argv)
{
    long port = 0, seconds = 5, hold = 1024, attempts = 0, failed = 0, frame = 0;
    struct sockaddr_in sa = {.sin_family = AF_INET};
    uint8_t hello[FRAME_HDR_LEN + AUTH_HELLO_LEN], early[FRAME_HDR_LEN + AUTH_EARLY_LEN];
    bool send_hello = false, send_early = false;
    uint8_t *big = NULL;
    int *ring;
    double end;

    for (int i = 1; i < argc; i++) {
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--hello")) {
            send_hello = true;
            continue;
        }
        if (!strcmp(argv[i], "--early")) {
            send_early = true;
            continue;
        }
        if (!strcmp(argv[i], "--port") && val) {
            if (parse_long("--port", val, 1, 65535, &port) < 0)
                return 2;
        } else if (!strcmp(argv[i], "--seconds") && val) {
            if (parse_long("--seconds", val, 1, FLOOD_SECONDS_MAX, &seconds) < 0)
                return 2;
        } else if (!strcmp(argv[i], "--hold") && val) {
            if (parse_long("--hold", val, 1, FLOOD_HOLD_MAX, &hold) < 0)
                return 2;
        } else if (!strcmp(argv[i], "--frame") && val) {
            if (parse_long("--frame", val, 1, FRAME_MAX_DEFAULT, &frame) < 0)
                return 2;
        } else {
            fprintf(stderr, "loadgen: flood: unknown or incomplete option '%s'\n", argv[i]);
            return 2;
        }
        i++;
    }
    if (!port) {
        fprintf(stderr, "loadgen: flood: --port is required\n");
        return 2;
    }
    if (send_hello + send_early + (frame > 0) > 1) {
        fprintf(stderr, "loadgen: flood: --hello, --early and --frame exclude each other\n");
        return 2;
    }
    if (raise_nofile("a flood", hold + 16) < 0)
        return 1;
    signal(SIGPIPE, SIG_IGN);
    ring = malloc((size_t)hold * sizeof(*ring));
    if (frame) {
        big = calloc(1, FRAME_HDR_LEN + (size_t)frame);
        if (big)
            frame_put_header(big, (uint32_t)frame);
    }
    if (!ring || (frame && !big)) {
        fprintf(stderr, "loadgen: flood: out of memory\n");
        return 1;
    }
    for (long i = 0; i < hold; i++)
        ring[i] = -1;
    /* The hello of a client that will never send its proof: "GRH1" and a nonce. */
    frame_put_header(hello, AUTH_HELLO_LEN);
    memcpy(hello + FRAME_HDR_LEN, "GRH1", 4);
    memset(hello + FRAME_HDR_LEN + 4, 0x5a, AUTH_HELLO_LEN - 4);
    /* A one-frame hello made without the key: "GRJ1", a nonce and a tag that is not its
     * HMAC, which the leader checks and refuses. */
    frame_put_header(early, AUTH_EARLY_LEN);
    memcpy(early + FRAME_HDR_LEN, "GRJ1", 4);
    memset(early + FRAME_HDR_LEN + 4, 0xa5, AUTH_EARLY_LEN - 4);
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    end = now_ms() + (double)seconds * 1000;
    while (now_ms() < end) {
        int *slot = &ring[attempts % hold];
        int fd;
        if (*slot >= 0)
            close(*slot);
        *slot = -1;
        attempts++;
        fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            failed++;
            continue;
        }
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS) {
            failed++;
            close(fd);
            continue;
        }
        /* Loopback connects at once unless the backlog is full; then this write fails and
         * the connection stays silent. */
        if (send_hello)
            (void)send(fd, hello, sizeof(hello), MSG_NOSIGNAL | MSG_DONTWAIT);
        else if (send_early)
            (void)send(fd, early, sizeof(early), MSG_NOSIGNAL | MSG_DONTWAIT);
        else if (frame)
            (void)send(fd, big, FRAME_HDR_LEN + (size_t)frame, MSG_NOSIGNAL | MSG_DONTWAIT);
        *slot = fd;
    }
    for (long i = 0; i < hold; i++)
        if (ring[i] >= 0)
            close(ring[i]);
    free(ring);
    free(big);
    printf("%ld attempts in %ld s (%ld failed)\n", attempts, seconds, failed);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "rendezvous"))
        return cmd_rendezvous(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "launch"))
        return cmd_launch(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "teardown"))
        return cmd_teardown(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "sleeper"))
        return cmd_sleeper(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "stats"))
        return cmd_stats();
    if (argc >= 2 && !strcmp(argv[1], "flood"))
        return cmd_flood(argc - 1, argv + 1);
    fprintf(stderr, "usage: loadgen rendezvous|launch|teardown|sleeper|stats|flood [options]\n"
                    "(see the comment at the top of bench/loadgen.c and bench/README.md)\n");
    return 2;
}
