/* The agent. One libuv loop holds: the leader link (TCP), the rank listener (Unix socket),
 * one process handle and two output pipes per rank, and two timers. Ranks run in their own
 * process groups (setsid through UV_PROCESS_DETACHED) so that a signal reaches everything a
 * rank started; the agent is a child subreaper so that what escapes the group still comes
 * back to it and is killed at the end. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "agent.h"
#include "cgroup.h"
#include "fsutil.h"
#include "log.h"
#include "logidx.h"
#include "metrics.h"
#include "peer.h"
#include "proto.h"
#include "hvd.h"
#include "outbuf.h"
#include "rankenv.h"
#include "shim.h"
#include "signame.h"
#include "sockdir.h"
#include "stacks.h"
#include "banned.h"

/* Deadline resolution: teardown escalation, hang detection, the leader's heartbeat. */
#define TICK_MS             20
/* Progress goes to the leader at most this often, batched for all local ranks. */
#define PROGRESS_FLUSH_MS   250
/* Lines of a rank's output kept for the failure message, and their longest length. */
#define TAIL_LINES          10
#define TAIL_LINE_MAX       240
/* A line longer than this is passed on in pieces. */
#define LINE_MAX_LEN        4000
/* After a rank exits, how long its output pipes may stay open (held by a child of it)
 * before its exit is reported anyway. */
#define OUTPUT_DRAIN_MS     200
/* How often endpoint.json is looked for, and connection attempts are retried. */
#define ENDPOINT_POLL_MS    20
#define CONNECT_RETRY_MS    100
/* An agent that has sent its join leaves the verdict to the leader, whose join timeout names
 * the missing nodes (and which its heartbeats show alive); the agent's own join timeout is
 * then a backstop this much later, for a leader that answers but never decides. */
#define JOIN_BACKSTOP_MS    5000
/* How often the node's metrics file is rewritten (--metrics-dir): node_exporter's scrapes
 * come every 15 s or so, and a rewrite costs one small file. */
#define METRICS_INTERVAL_MS 5000
/* Writes to a rank log this close together share one index record (log_append): the order of
 * lines across ranks is then known to this precision. */
#define INDEX_COALESCE_MS   20
/* Per-rank secret: 128 bits, shown to the rank in GPURUN_TOKEN. */
#define TOKEN_BYTES         16

/* FINDING -> JOINING -> RUNNING -> [CAPTURE ->] TEARDOWN -> DONE; a restart goes from
 * TEARDOWN back to RUNNING. CAPTURE is a hang's: stacks are taken before the kill. */
enum agent_state { AG_FINDING, AG_JOINING, AG_RUNNING, AG_CAPTURE, AG_TEARDOWN, AG_DONE };

/* How long the agent waits for a killed rank's cgroup to empty before it leaves the cgroup
 * to the job's end (killed processes leave within milliseconds), and how long the job's
 * cgroup may take at the end. */
#define RANK_CGROUP_WAIT_MS 50
#define JOB_CGROUP_WAIT_MS  1000
/* The shim's heartbeat pipe (shim.h): the fd after stdin, stdout and stderr. */
#define SHIM_ALIVE_FD       "3"

/* How long a hang's stack capture may take on this node before the teardown goes on
 * without the stacks still missing (the leader waits a little longer: leader.c). */
#define STACK_CAPTURE_MS 4000

/* A rank's stack capture: none asked, SIGABRT sent to its Python process (the traceback
 * comes on its stderr), a native tool running, or finished. */
enum capture { CAP_NONE, CAP_PYTHON, CAP_TOOL, CAP_DONE };

struct agent;
struct arank;

/* One output pipe of a rank. Allocated per spawn and freed in its close callback, so that a
 * restart can reuse the rank's record while an old pipe is still closing. */
struct ostream {
    uv_pipe_t pipe;
    struct agent *agent;
    struct arank *rank; /* NULL once detached from the rank (closing) */
    bool is_err;        /* the rank's stderr */
    char line[LINE_MAX_LEN];
    size_t len;
};

struct arank {
    struct agent *agent;
    uv_process_t proc;
    struct ostream *out, *err; /* NULL when closed */
    int local, rank;
    bool spawned, exited, reported, killed, oom;
    bool wants_preempt; /* asked for the pre-timeout signal (a "preempt" request) */
    pid_t preempt_pid;  /* the process that asked: the signal goes to it alone */
    int preempt_fd;     /* a pidfd of it (valid when wants_preempt; -1: none), so that a
                         * later signal can never reach another process that took its pid */
    enum capture cap;
    bool faulthandler; /* its environment has PYTHONFAULTHANDLER set (a capture's SIGABRT) */
    char *stack;       /* the captured stack (PROTO_STACK_MAX bytes at most), or NULL */
    size_t stack_len;
    int code, sig;
    int64_t exit_ms;
    int64_t progress_ms; /* when its last report arrived; 0: it never reported */
    long oom_base;
    int logfd;
    int idxfd;       /* logs/rank-N.idx: when each stretch of the log was written (open_log) */
    int64_t log_off; /* the log's size: where the next write lands */
    int64_t idx_ms;  /* the index record not yet written: the time of its first write, 0:
                      * none; it covers the log up to log_off */
    int alive_fd;    /* write end of its shim's heartbeat pipe (shim.h), or -1 */
    char token[2 * TOKEN_BYTES + 1];
    int64_t step, total_steps;
    double loss, lr, tokens_per_s, grad_norm;
    bool dirty;
    char tail[TAIL_LINES][TAIL_LINE_MAX];
    int tail_next, tail_count;
};

struct rconn {
    struct peer peer;
    struct rconn *prev, *next;
    struct arank *rank; /* after a valid hello */
    pid_t pid;          /* the connected process (SO_PEERCRED) */
};

/* A request forwarded to the leader, waiting for its reply. */
struct pending {
    int64_t id; /* ours, on the leader link */
    struct rconn *rc;
    int64_t rank_id;
};

/* A rank blocked in a barrier. */
struct bwait {
    struct bwait *next;
    struct rconn *rc;
    int64_t id;
    int rank;
    char *name;
};

struct agent {
    uv_loop_t *loop;
    const struct jobspec *spec;
    struct auth_key key;
    const char *job_dir;
    int node_rank;
    char hostname[128];
    char advertise[64];
    char rendezvous[128];
    uint32_t max_frame;
    agent_done_fn done;
    void *arg;

    enum agent_state state;
    struct peer *leader;
    bool leader_open;
    uv_timer_t tick, hb;
    uv_fs_event_t watch; /* the job dir, for endpoint.json, until the leader is found */
    bool watching;
    uv_pipe_t listener;
    bool listener_open;
    int handles_open;
    bool closing;
    int64_t t_start, teardown_ms, last_flush_ms, next_connect_ms;
    int64_t capture_until;              /* AG_CAPTURE's deadline */
    int64_t next_metrics_ms;            /* when the metrics file is next written */
    int64_t join_ms;                    /* when the join was sent (AG_JOINING) */
    bool metrics_warned;                /* "cannot write metrics" was said once */
    struct stack_tool *tools;           /* stack tools started, until their handles close */
    char capture_cause[PROTO_TAIL_MAX]; /* the leader's abort cause, for the teardown after */

    int world_size, rank_base, master_port, nnodes;
    int generation; /* the leader's: how many times the job was restarted */
    int requeues;   /* Slurm's: how many times the job was requeued */
    char master_addr[64];
    int hvd_port;                      /* horovod's rendezvous on the leader, or 0 */
    char hvd_host[PROTO_NAME_MAX + 1]; /* HOROVOD_HOSTNAME, or "" */
    char hvd_iface[64];                /* HOROVOD_GLOO_IFACE, or "" */
    struct arank *ranks;
    int nranks, exited;
    char self_exe[PATH_MAX];   /* this program, run as the rank shim (shim.h) */
    char python_dir[PATH_MAX]; /* the gpurun Python package's folder, or "" */
    char **spawn_argv;         /* self_exe --exec-rank PID ... -- argv... (build_spawn_argv) */
    int cgroup_slot;           /* spawn_argv's index of the rank's cgroup, or 0: none */
    char cgroup[PATH_MAX];     /* the job's cgroup (cgroup.h), or "" */
    char sockdir[PATH_MAX];
    char sockpath[PATH_MAX];

    struct rconn *rconns;
    struct pending *pend;
    size_t npend, cappend;
    int64_t next_id;
    json_t *barrier_counts; /* name -> local ranks arrived */
    struct bwait *bwaits;

    struct outbuf *out; /* the merged stream, our stdout (output section below) */

    bool failed_here; /* this node saw the first failure it knows of */
    int status;       /* exit status when the leader cannot tell us one */
    bool finished;
};

static int64_t now_ms(const struct agent *a)
{
    return (int64_t)uv_now(a->loop);
}

static void maybe_free(struct agent *a);
static void teardown(struct agent *a, const char *cause);
static void capture_check(struct agent *a);
static void check_done(struct agent *a);
static void stop_watching(struct agent *a);

/* --- output ------------------------------------------------------------------------------- */

static void tail_add(struct arank *r, const char *s, size_t n)
{
    if (n >= TAIL_LINE_MAX)
        n = TAIL_LINE_MAX - 1;
    memcpy(r->tail[r->tail_next], s, n);
    r->tail[r->tail_next][n] = '\0';
    r->tail_next = (r->tail_next + 1) % TAIL_LINES;
    if (r->tail_count < TAIL_LINES)
        r->tail_count++;
}

static void tail_join(const struct arank *r, char *out, size_t cap)
{
    size_t n = 0;

    out[0] = '\0';
    for (int i = 0; i < r->tail_count; i++) {
        int idx = (r->tail_next - r->tail_count + i + TAIL_LINES) % TAIL_LINES;
        int w = snprintf(out + n, cap - n, "%s%s", i ? "\n" : "", r->tail[idx]);
        if (w < 0 || (size_t)w >= cap - n)
            break;
        n += (size_t)w;
    }
}

/* Appends n bytes to r's captured stack; what passes PROTO_STACK_MAX is cut. JSON carries
 * the stack: anything but printable ASCII, tabs and newlines becomes '?'. */
static void stack_append(struct arank *r, const char *s, size_t n)
{
    if (!r->stack && !(r->stack = malloc(PROTO_STACK_MAX + 1)))
        return;
    if (r->stack_len + n > PROTO_STACK_MAX)
        n = PROTO_STACK_MAX - r->stack_len;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        r->stack[r->stack_len + i] =
            (c >= 0x20 && c < 0x7f) || c == '\t' || c == '\n' ? (char)c : '?';
    }
    r->stack_len += n;
    r->stack[r->stack_len] = '\0';
}

static void stack_add(struct arank *r, const char *s, size_t n)
{
    stack_append(r, s, n);
    stack_append(r, "\n", 1);
}

/* The merged stream (our stdout: a terminal, a pipe, the -o file or the batch output) is
 * written by a thread of its own (outbuf.h), never by the loop: a reader that stops (a
 * pager, Ctrl-S, a full pipe, a stalled file system) must not delay heartbeats and fail the
 * job. Up to this many bytes wait for a slow reader: 4 MiB, some 40,000 lines of 100 bytes,
 * rides out a pager's pause without a gap and is little next to a rank's own memory. Past it,
 * lines are dropped from the stream only (never from logs/rank-N.log), and once the reader
 * has caught up a notice takes their place: output_notice(). */
#define OUTPUT_QUEUE_MAX (4 << 20)
/* At the end, how long the queue waits for a reader that reads nothing at all: long enough
 * for a reader pausing a few seconds to get the end of the job's output, short enough that
 * a reader that never reads holds the job's status back only this long. */
#define OUTPUT_LINGER_MS 5000

/* "[gpurun] 12,345 lines not shown; complete in logs/rank-3.log": what stands in the merged
 * stream for local rank src's lines that it dropped. */
static size_t output_notice(void *arg, int src, uint64_t lines, char *buf, size_t cap)
{
    struct agent *a = arg;
    char num[32], grouped[48];
    int n = snprintf(num, sizeof(num), "%" PRIu64, lines), k = 0, w;

    for (int i = 0; i < n; i++) {
        if (i && (n - i) % 3 == 0)
            grouped[k++] = ',';
        grouped[k++] = num[i];
    }
    grouped[k] = '\0';
    w = snprintf(buf, cap, "[gpurun] %s line%s not shown; complete in logs/rank-%d.log\n", grouped,
                 lines == 1 ? "" : "s", a->ranks[src].rank);
    return w < 0 || (size_t)w >= cap ? 0 : (size_t)w;
}

static int output_start(struct agent *a)
{
    struct outbuf_config cfg = {
        .fd = STDOUT_FILENO,
        .cap = OUTPUT_QUEUE_MAX,
        .nsrc = a->nranks > 0 ? a->nranks : 1,
        .notice = output_notice,
        .arg = a,
    };

    return outbuf_start(a->loop, &cfg, &a->out);
}

/* Whether fds a and b are the same file (2>&1, one terminal). */
static bool same_file(int a, int b)
{
    struct stat sa, sb;

    return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

static void on_output_closed(void *arg, size_t unwritten)
{
    struct agent *a = arg;

    /* Not to a stderr that is the stream no one reads: the warning would block the loop. */
    if (unwritten && !same_file(STDOUT_FILENO, STDERR_FILENO))
        log_warn("cannot write the last %zu bytes of the ranks' output: its reader read nothing "
                 "for %d ms (each rank's output is complete in logs/)",
                 unwritten, OUTPUT_LINGER_MS);
    a->handles_open--;
    maybe_free(a);
}

/* After the ranks' streams are closed (their last partial lines queued): the rest of the
 * queue is written, for OUTPUT_LINGER_MS of a reader reading nothing at most. */
static void output_close(struct agent *a)
{
    if (!a->out)
        return;
    a->handles_open++;
    outbuf_close(a->out, OUTPUT_LINGER_MS, on_output_closed, a);
    a->out = NULL;
}

/* One merged-stream line "[R] text\n", queued whole: the writer writes whole lines of at most
 * PIPE_BUF bytes, so lines of ranks and of other daemons sharing the terminal or pipe never
 * interleave inside a line. */
_Static_assert(LINE_MAX_LEN + 32 <= OUTBUF_LINE_MAX, "a labelled line must fit one write");
static int64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Writes the rank's pending index record: the log up to log_off, written from idx_ms on. An
 * index that cannot be written is given up (gpurun logs then prints rank by rank). */
static void index_flush(struct arank *r)
{
    struct log_index_record rec = {.end = r->log_off, .unix_ms = r->idx_ms};

    if (!r->idx_ms)
        return;
    r->idx_ms = 0;
    if (r->idxfd >= 0 && write(r->idxfd, &rec, sizeof(rec)) != (ssize_t)sizeof(rec)) {
        close(r->idxfd);
        r->idxfd = -1;
    }
}

/* Appends n bytes to the rank's log and notes them in its index (logs/rank-N.idx, struct
 * log_index_record: what `gpurun logs` merges the ranks' lines by). Writes within
 * INDEX_COALESCE_MS of each other share one record, with the first one's time: the index
 * costs one write per stretch, not one per write of the log. Returns 0, or -1 with errno set
 * when the log could not take it all. */
static int log_append(struct arank *r, const void *data, size_t n)
{
    int64_t t;
    ssize_t w;

    if (r->logfd < 0)
        return 0;
    w = write(r->logfd, data, n);
    if (w <= 0)
        return -1;
    t = wall_ms();
    if (r->idx_ms && t - r->idx_ms >= INDEX_COALESCE_MS)
        index_flush(r);
    r->log_off += w;
    if (!r->idx_ms)
        r->idx_ms = t > 0 ? t : 1;
    return w == (ssize_t)n ? 0 : -1;
}

static void emit_line(struct arank *r, const char *s, size_t n)
{
    char buf[LINE_MAX_LEN + 32];
    int h = snprintf(buf, sizeof(buf), "[%d] ", r->rank);
    size_t len;

    if (n > sizeof(buf) - (size_t)h - 1)
        n = sizeof(buf) - (size_t)h - 1;
    memcpy(buf + h, s, n);
    len = (size_t)h + n;
    buf[len++] = '\n';
    /* A '\n' inside the text cannot come from stream_take(); a dropped line is counted. */
    if (r->agent->out)
        outbuf_line(r->agent->out, r->local, buf, len);
    tail_add(r, s, n);
}

/* The rank's log gets every byte, synchronously: it is a regular file in the job dir, where
 * the kernel's page cache takes a write without waiting for a reader; bounded and dropped it
 * would no longer be complete, and unbounded it would only move the wait into our memory. A
 * job dir on a stalled file system stalls the job's other files there too. */
static void stream_take(struct ostream *o, const char *data, size_t n)
{
    struct arank *r = o->rank;

    if (log_append(r, data, n) < 0)
        log_debug("cannot write rank %d's log: %s", r->rank, strerror(errno));
    for (size_t i = 0; i < n; i++) {
        if (data[i] == '\n' || o->len == sizeof(o->line)) {
            /* After SIGABRT, what a Python rank writes on stderr is faulthandler's dump. */
            if (o->is_err && r->cap == CAP_PYTHON)
                stack_add(r, o->line, o->len);
            emit_line(r, o->line, o->len);
            o->len = 0;
            if (data[i] == '\n')
                continue;
        }
        o->line[o->len++] = data[i];
    }
}

static char out_chunk[64 * 1024];

static void on_out_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    *buf = uv_buf_init(out_chunk, sizeof(out_chunk));
}

static void on_handle_closed(uv_handle_t *h)
{
    struct agent *a = h->data;

    a->handles_open--;
    maybe_free(a);
}

static void on_stream_closed(uv_handle_t *h)
{
    struct ostream *o = h->data;
    struct agent *a = o->agent;

    free(o);
    a->handles_open--;
    check_done(a);
    maybe_free(a);
}

/* Flushes a partial last line, detaches the stream from its rank and closes it. */
static void stream_close(struct ostream **slot)
{
    struct ostream *o = *slot;

    if (!o)
        return;
    *slot = NULL;
    if (o->len) {
        emit_line(o->rank, o->line, o->len);
        o->len = 0;
    }
    o->rank = NULL;
    uv_close((uv_handle_t *)&o->pipe, on_stream_closed);
}

static void on_out_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct ostream *o = s->data;
    struct arank *r = o->rank;

    if (nread > 0)
        stream_take(o, buf->base, (size_t)nread);
    else if (nread < 0)
        stream_close(r->out == o ? &r->out : &r->err);
}

static struct ostream *stream_new(struct agent *a, struct arank *r)
{
    struct ostream *o = calloc(1, sizeof(*o));

    if (!o)
        return NULL;
    o->agent = a;
    o->rank = r;
    uv_pipe_init(a->loop, &o->pipe, 0);
    o->pipe.data = o;
    a->handles_open++;
    return o;
}

/* --- the leader link ---------------------------------------------------------------------- */

static int send_leader(struct agent *a, json_t *msg)
{
    if (!a->leader || !a->leader->ready || a->leader->closing) {
        json_decref(msg);
        return -ENOTCONN;
    }
    return peer_send(a->leader, msg);
}

static void flush_progress(struct agent *a);

static json_t *read_error_file(struct agent *a, struct arank *r);

static void report_exit(struct agent *a, struct arank *r)
{
    char tail[PROTO_TAIL_MAX];
    json_t *msg, *err = NULL;

    if (r->reported)
        return;
    r->reported = true;
    /* The last progress first: the leader's view and summary.json end on the final step. */
    if (r->dirty)
        flush_progress(a);
    tail_join(r, tail, sizeof(tail));
    if ((r->code || r->sig) && !r->killed)
        err = read_error_file(a, r);
    msg = proto_pack("{s:s, s:i, s:i, s:i, s:b, s:b, s:s}", "type", "rank_exit", "rank", r->rank,
                     "code", r->code, "signal", r->sig, "oom", r->oom, "killed", r->killed, "tail",
                     tail);
    if (msg && r->stack)
        json_object_set_new(msg, "stack", json_string(r->stack));
    if (msg && err)
        json_object_set_new(msg, "error", err);
    else
        json_decref(err);
    send_leader(a, msg);
}

static void flush_progress(struct agent *a)
{
    json_t *arr = json_array();
    int64_t t = now_ms(a);

    for (int i = 0; i < a->nranks; i++) {
        struct arank *r = &a->ranks[i];
        if (!r->dirty)
            continue;
        r->dirty = false;
        json_array_append_new(
            arr, json_pack("{s:i, s:I, s:f, s:f, s:f, s:f, s:I, s:I}", "rank", r->rank, "step",
                           (json_int_t)r->step, "loss", r->loss, "lr", r->lr, "tokens_per_s",
                           r->tokens_per_s, "grad_norm", r->grad_norm, "total_steps",
                           (json_int_t)r->total_steps, "age_ms", (json_int_t)(t - r->progress_ms)));
    }
    a->last_flush_ms = t;
    if (json_array_size(arr) == 0) {
        json_decref(arr);
        return;
    }
    send_leader(a, proto_pack("{s:s, s:o}", "type", "progress", "ranks", arr));
}

/* --- rank processes ----------------------------------------------------------------------- */

/* The cgroup's count of OOM kills (v2 memory.events or v1 memory.oom_control), so that a
 * SIGKILL can be told apart: the count rises when the kernel's OOM killer did it. */
static long oom_kills(void)
{
    char line[512], path[PATH_MAX], *cg = NULL;
    FILE *f = fopen("/proc/self/cgroup", "re");
    long n = -1;

    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        if (!strncmp(line, "0::", 3)) {
            snprintf(path, sizeof(path), "/sys/fs/cgroup%s/memory.events", line + 3);
            cg = path;
        } else if (strstr(line, ":memory:")) {
            snprintf(path, sizeof(path), "/sys/fs/cgroup/memory%s/memory.oom_control",
                     strstr(line, ":memory:") + 8);
            cg = path;
            break;
        }
    }
    fclose(f);
    if (!cg || !(f = fopen(cg, "re")))
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "oom_kill %ld", &n) == 1)
            break;
    fclose(f);
    return n;
}

/* The rank's cgroup, below the job's. */
static void rank_cgroup(const struct agent *a, const struct arank *r, char *dir, size_t len)
{
    snprintf(dir, len, "%s/rank-%d", a->cgroup, r->rank);
}

static void signal_group(struct arank *r, int sig)
{
    if (r->spawned && !r->exited && r->proc.pid > 0)
        kill(-r->proc.pid, sig);
}

static void on_proc_closed(uv_handle_t *h)
{
    struct arank *r = h->data;
    struct agent *a = r->agent;

    a->handles_open--;
    maybe_free(a);
}

static void on_rank_exit(uv_process_t *p, int64_t status, int sig)
{
    struct arank *r = p->data;
    struct agent *a = r->agent;
    char cause[320];

    r->exited = true;
    r->code = (int)status;
    r->sig = sig;
    r->exit_ms = now_ms(a);
    a->exited++;
    r->oom = sig == SIGKILL && !r->killed && r->oom_base >= 0 && oom_kills() > r->oom_base;
    uv_close((uv_handle_t *)p, on_proc_closed);
    if (r->alive_fd >= 0) {
        close(r->alive_fd);
        r->alive_fd = -1;
    }
    /* What a rank started may still hold its group or its cgroup: it ends with the rank.
     * The shim removed the cgroup already unless it was killed itself (the teardown's
     * SIGKILL reaches the whole group). */
    kill(-p->pid, SIGKILL);
    if (a->cgroup[0]) {
        char dir[PATH_MAX + 16];
        rank_cgroup(a, r, dir, sizeof(dir));
        cgroup_remove(dir, RANK_CGROUP_WAIT_MS);
    }
    if ((status || sig) && !r->killed && a->state == AG_RUNNING) {
        /* Kill the neighbours at once, before the leader's abort comes back: that is what
         * keeps teardown within milliseconds. */
        if (sig)
            snprintf(cause, sizeof(cause), "rank %d was killed by signal %d", r->rank, sig);
        else
            snprintf(cause, sizeof(cause), "rank %d exited with status %d", r->rank, (int)status);
        a->failed_here = true;
        a->status = sig ? 128 + sig : (int)status;
        teardown(a, cause);
    }
    capture_check(a);
    check_done(a);
}

/* The folder holding the gpurun Python package, found from this program's path: the source
 * tree's lib/python (build/rendezvousd, build/asan/rendezvousd) or an installed
 * PREFIX/lib/gpurun/python (PREFIX/bin/rendezvousd). Empty when none is there. */
static void find_python_dir(struct agent *a)
{
    static const char *const rel[] = {"../lib/python", "../../lib/python", "../lib/gpurun/python"};
    char dir[PATH_MAX], probe[PATH_MAX + 64];
    const char *slash = strrchr(a->self_exe, '/');

    a->python_dir[0] = '\0';
    if (!slash)
        return;
    snprintf(dir, sizeof(dir), "%.*s", (int)(slash - a->self_exe), a->self_exe);
    for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
        snprintf(probe, sizeof(probe), "%s/%s/gpurun/__init__.py", dir, rel[i]);
        if (access(probe, R_OK) == 0) {
            snprintf(probe, sizeof(probe), "%s/%s", dir, rel[i]);
            if (!realpath(probe, a->python_dir))
                a->python_dir[0] = '\0';
            return;
        }
    }
}

/* Where rank r's torch error file goes (TORCHELASTIC_ERROR_FILE): beside its log. */
static void error_file_path(const struct agent *a, const struct arank *r, char *out, size_t cap)
{
    if (a->job_dir)
        snprintf(out, cap, "%.4000s/logs/rank-%d.error.json", a->job_dir, r->rank);
    else
        snprintf(out, cap, "%.4000s/rank-%d.error.json", a->sockdir, r->rank);
}

static char **build_env(struct agent *a, struct arank *r)
{
    extern char **environ;
    char errfile[PATH_MAX];
    cpu_set_t set;
    struct rankenv_rank re = {
        .spec = a->spec,
        .rank = r->rank,
        .local_rank = r->local,
        .local_world_size = a->nranks,
        .world_size = a->world_size,
        .node_rank = a->node_rank,
        .nnodes = a->nnodes,
        .restart_count = a->generation,
        .master_addr = a->master_addr,
        .master_port = a->master_port,
        .sock = a->sockpath,
        .token = r->token,
        .job_dir = a->job_dir,
        .node_addr = a->advertise,
        .hostname = a->hostname,
        .error_file = errfile,
        .python_dir = a->python_dir[0] ? a->python_dir : NULL,
        .cpus = 1,
        .hvd_port = a->hvd_port,
        .hvd_host = a->hvd_host[0] ? a->hvd_host : NULL,
        .hvd_iface = a->hvd_iface[0] ? a->hvd_iface : NULL,
    };

    error_file_path(a, r, errfile, sizeof(errfile));
    /* A file an earlier generation's rank left must not be read as this one's failure. */
    unlink(errfile);
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        re.cpus = CPU_COUNT(&set);
    return rankenv_build(&re, environ);
}

static void free_env(char **env)
{
    rankenv_free(env);
}

/* The error file of torch's @record (torch/distributed/elastic/multiprocessing/errors):
 * {"message": {"message": "Type: text", "extraInfo": {"py_callstack": "Traceback..."}}}, or
 * "message" a plain string. Parsed into {type, message, file, line, traceback} for the
 * leader; NULL when there is no file or it is not torch's. */
#define ERROR_FILE_MAX (256 * 1024)

static json_t *read_error_file(struct agent *a, struct arank *r)
{
    char path[PATH_MAX], where[PATH_MAX] = "";
    json_t *root, *msg, *out = NULL;
    const char *text = NULL, *stack = NULL, *colon;
    long line = 0;
    char *buf = NULL;
    size_t len;

    error_file_path(a, r, path, sizeof(path));
    if (fs_read_all(path, ERROR_FILE_MAX, &buf, &len) < 0)
        return NULL;
    root = json_loadb(buf, len, 0, NULL);
    free(buf);
    msg = json_object_get(root, "message");
    if (json_is_string(msg)) {
        text = json_string_value(msg);
    } else if (json_is_object(msg)) {
        text = json_string_value(json_object_get(msg, "message"));
        stack =
            json_string_value(json_object_get(json_object_get(msg, "extraInfo"), "py_callstack"));
    }
    if (!text) {
        log_warn("rank %d's error file '%s' is not torch's format: ignored", r->rank, path);
        goto out;
    }
    /* The innermost frame of the traceback that is the user's: its last 'File "X", line N'
     * line outside the installed packages (torch's own frames say less), else the last. */
    for (int pass = 0; pass < 2 && !where[0]; pass++) {
        for (const char *p = stack; p && (p = strstr(p, "File \"")); p++) {
            const char *q = strchr(p + 6, '"');
            long n;
            if (!q || sscanf(q, "\", line %ld", &n) != 1)
                continue;
            if (pass == 0 && (memmem(p, (size_t)(q - p), "-packages/", 10) ||
                              memmem(p, (size_t)(q - p), "/lib/python3", 12)))
                continue;
            snprintf(where, sizeof(where), "%.*s", (int)(q - p - 6), p + 6);
            line = n;
        }
    }
    colon = strstr(text, ": ");
    out = json_pack("{s:s%, s:s}", "type", text, colon ? (size_t)(colon - text) : strlen(text),
                    "message", colon ? colon + 2 : "");
    if (out && where[0]) {
        json_object_set_new(out, "file", json_string(where));
        json_object_set_new(out, "line", json_integer(line));
    }
    if (out && stack) {
        size_t sl = strlen(stack);
        const char *from = stack + (sl > PROTO_TAIL_MAX ? sl - PROTO_TAIL_MAX : 0);
        /* The end of the traceback is what names the failure; it starts on a character. */
        while (((unsigned char)*from & 0xc0) == 0x80)
            from++;
        json_object_set_new(out, "traceback", json_string(from));
    }
    if (out)
        log_info("rank %d recorded %s", r->rank, text);
out:
    json_decref(root);
    return out;
}

/* Opens the rank's log and its index (log_append), unless open already (a restart keeps
 * them). Without an index the log is still written. In a requeued job the log goes on from
 * the last segment's, after a line that says so. */
static void open_log(struct agent *a, struct arank *r)
{
    char path[PATH_MAX], line[160], when[32];
    time_t t = time(NULL);
    struct stat st;
    struct tm tm;

    if (!a->job_dir || r->logfd >= 0)
        return;
    snprintf(path, sizeof(path), "%s/logs/rank-%d.log", a->job_dir, r->rank);
    r->logfd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (r->logfd < 0) {
        log_warn("cannot open '%s': %s", path, strerror(errno));
        return;
    }
    r->log_off = fstat(r->logfd, &st) == 0 ? st.st_size : 0;
    snprintf(path, sizeof(path), "%s/logs/rank-%d.idx", a->job_dir, r->rank);
    r->idxfd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (a->requeues > 0) {
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
        int n = snprintf(line, sizeof(line),
                         "----- gpurun: %s: requeue %d, the job starts again -----\n", when,
                         a->requeues);
        (void)log_append(r, line, (size_t)n);
    }
}

static int spawn_rank(struct agent *a, struct arank *r)
{
    uv_process_options_t opt = {0};
    uv_stdio_container_t stdio[4];
    uint8_t tok[TOKEN_BYTES];
    char **env = NULL, msg[PATH_MAX + 64], cgdir[PATH_MAX + 16];
    int ret = -1, alive[2];

    if (RAND_bytes(tok, sizeof(tok)) != 1)
        return -EIO;
    auth_hex(tok, sizeof(tok), r->token);
    open_log(a, r);
    r->oom_base = oom_kills();
    env = build_env(a, r);
    if (!env)
        return -ENOMEM;
    /* Python reads any non-empty value as "on". */
    r->faulthandler = false;
    for (char **e = env; *e; e++)
        if (!strncmp(*e, "PYTHONFAULTHANDLER=", 19))
            r->faulthandler = (*e)[19] != '\0';
    r->out = stream_new(a, r);
    r->err = stream_new(a, r);
    if (r->err)
        r->err->is_err = true;
    if (!r->out || !r->err) {
        stream_close(&r->out);
        stream_close(&r->err);
        free_env(env);
        return -ENOMEM;
    }
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1].data.stream = (uv_stream_t *)&r->out->pipe;
    stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[2].data.stream = (uv_stream_t *)&r->err->pipe;
    /* The shim's heartbeat pipe, its fd 3 (SHIM_ALIVE_FD): a byte per heartbeat, end of
     * file when we die. Without one the shim still has the parent-death signal. */
    stdio[3].flags = UV_IGNORE;
    if (pipe2(alive, O_CLOEXEC | O_NONBLOCK) == 0) {
        stdio[3].flags = UV_INHERIT_FD;
        stdio[3].data.fd = alive[0];
        r->alive_fd = alive[1];
    } else {
        alive[0] = -1;
    }
    if (a->cgroup_slot) {
        rank_cgroup(a, r, cgdir, sizeof(cgdir));
        a->spawn_argv[a->cgroup_slot] = cgdir;
    }
    opt.file = a->spawn_argv[0];
    opt.args = a->spawn_argv;
    opt.env = env;
    opt.cwd = a->spec->workdir;
    opt.flags = UV_PROCESS_DETACHED;
    opt.stdio_count = 4;
    opt.stdio = stdio;
    opt.exit_cb = on_rank_exit;
    r->proc.data = r;
    ret = uv_spawn(a->loop, &r->proc, &opt);
    free_env(env);
    if (alive[0] >= 0)
        close(alive[0]);
    if (ret < 0) {
        /* The handle is initialised even on failure and must be closed. */
        a->handles_open++;
        uv_close((uv_handle_t *)&r->proc, on_proc_closed);
        stream_close(&r->out);
        stream_close(&r->err);
        snprintf(msg, sizeof(msg), "cannot execute '%s': %s", a->spec->argv[0], uv_strerror(ret));
        log_error("rank %d: %s", r->rank, msg);
        tail_add(r, msg, strlen(msg));
        r->exited = true;
        r->code = ret == UV_ENOENT ? 127 : 126;
        a->exited++;
        return ret;
    }
    r->spawned = true;
    a->handles_open++;
    uv_read_start((uv_stream_t *)&r->out->pipe, on_out_alloc, on_out_read);
    uv_read_start((uv_stream_t *)&r->err->pipe, on_out_alloc, on_out_read);
    return 0;
}

/* --- rank connections --------------------------------------------------------------------- */

static struct pending *pending_add(struct agent *a, struct rconn *rc, int64_t rank_id)
{
    if (a->npend == a->cappend) {
        size_t cap = a->cappend ? 2 * a->cappend : 16;
        struct pending *np = realloc(a->pend, cap * sizeof(*np));
        if (!np)
            return NULL;
        a->pend = np;
        a->cappend = cap;
    }
    a->pend[a->npend] = (struct pending){.id = ++a->next_id, .rc = rc, .rank_id = rank_id};
    return &a->pend[a->npend++];
}

/* Forwards a store request with our own id; the reply goes back with the rank's id. */
static void forward_kv(struct agent *a, struct rconn *rc, struct msg *m)
{
    struct pending *p = pending_add(a, rc, m->id);
    json_t *fwd;

    if (!p) {
        peer_send_error(&rc->peer, m->id, "too_large", "agent out of memory");
        return;
    }
    fwd = json_deep_copy(proto_msg_json(m));
    json_object_set_new(fwd, "id", json_integer(p->id));
    if (send_leader(a, fwd) < 0) {
        a->npend--;
        peer_send_error(&rc->peer, m->id, "aborted", "no connection to the leader");
    }
}

static void barrier_arrive(struct agent *a, struct rconn *rc, struct msg *m)
{
    struct bwait *w;
    json_t *n;
    json_int_t count;

    /* A rank that gave up waiting and calls the same barrier again has arrived once: it
     * only gets the reply under its new request id. */
    for (w = a->bwaits; w; w = w->next) {
        if (w->rank == rc->rank->rank && !strcmp(w->name, m->key)) {
            w->rc = rc;
            w->id = m->id;
            return;
        }
    }
    w = calloc(1, sizeof(*w));
    if (!w || !(w->name = strdup(m->key))) {
        free(w);
        peer_send_error(&rc->peer, m->id, "too_large", "agent out of memory");
        return;
    }
    w->rc = rc;
    w->id = m->id;
    w->rank = rc->rank->rank;
    w->next = a->bwaits;
    a->bwaits = w;
    n = json_object_get(a->barrier_counts, m->key);
    count = (n ? json_integer_value(n) : 0) + 1;
    if (count < a->nranks) {
        json_object_set_new(a->barrier_counts, m->key, json_integer(count));
        return;
    }
    json_object_del(a->barrier_counts, m->key);
    send_leader(a, proto_pack("{s:s, s:I, s:s, s:i}", "type", "barrier", "id",
                              (json_int_t)++a->next_id, "name", m->key, "count", a->nranks));
}

static void barrier_release(struct agent *a, const char *name)
{
    struct bwait **pp = &a->bwaits;

    while (*pp) {
        struct bwait *w = *pp;
        if (strcmp(w->name, name)) {
            pp = &w->next;
            continue;
        }
        *pp = w->next;
        if (w->rc)
            peer_send(&w->rc->peer, proto_pack("{s:s, s:I}", "type", "ok", "id", w->id));
        free(w->name);
        free(w);
    }
}

static void rank_hello(struct agent *a, struct rconn *rc, struct msg *m)
{
    int local = m->rank - a->rank_base;
    struct arank *r = local >= 0 && local < a->nranks ? &a->ranks[local] : NULL;

    if (!r || strlen(m->value) != strlen(r->token) ||
        CRYPTO_memcmp(m->value, r->token, strlen(r->token))) {
        log_error("refused rank connection claiming rank %d: wrong token", m->rank);
        peer_send_error(&rc->peer, 0, "denied", "wrong rank or token");
        peer_close(&rc->peer, "wrong token");
        return;
    }
    rc->rank = r;
    snprintf(rc->peer.name, sizeof(rc->peer.name), "rank %d", r->rank);
    peer_send(&rc->peer, proto_pack("{s:s, s:I}", "type", "ok", "id", (json_int_t)0));
}

static void on_rank_message(struct peer *p, struct msg *m)
{
    struct rconn *rc = (struct rconn *)p;
    struct agent *a = p->owner;
    struct arank *r = rc->rank;

    if (!r) {
        if (m->type == MSG_HELLO) {
            rank_hello(a, rc, m);
        } else {
            peer_send_error(p, m->id, "denied", "say hello first");
            peer_close(p, "request before hello");
        }
        return;
    }
    switch (m->type) {
    case MSG_KV_PUT:
    case MSG_KV_GET:
    case MSG_KV_DEL:
        forward_kv(a, rc, m);
        break;
    case MSG_BARRIER:
        barrier_arrive(a, rc, m);
        break;
    case MSG_REPORT:
        r->step = m->step;
        r->loss = m->loss;
        r->lr = m->lr;
        r->tokens_per_s = m->tokens_per_s;
        r->grad_norm = m->grad_norm;
        if (m->total_steps > 0)
            r->total_steps = m->total_steps;
        r->dirty = true;
        r->progress_ms = now_ms(a);
        break;
    case MSG_PREEMPT:
        if (r->wants_preempt && r->preempt_fd >= 0)
            close(r->preempt_fd);
        r->wants_preempt = true;
        r->preempt_pid = rc->pid;
        /* The asker is alive now (it waits for this reply): pin it. */
        r->preempt_fd = (int)syscall(SYS_pidfd_open, rc->pid, 0);
        peer_send(p, proto_pack("{s:s, s:I}", "type", "ok", "id", m->id));
        break;
    case MSG_FINALIZE:
        peer_send(p, proto_pack("{s:s, s:I}", "type", "ok", "id", m->id));
        break;
    default:
        log_error("refused '%s' from rank %d: not a rank request", proto_type_name(m->type),
                  r->rank);
        peer_send_error(p, m->id, "bad_request", "not a rank request");
        break;
    }
}

static void on_rank_bad_message(struct peer *p, const struct proto_error *err)
{
    struct rconn *rc = (struct rconn *)p;

    log_error("bad message from %s: %s", p->name, err->text);
    peer_send_error(p, err->id, "bad_request", err->text);
    /* The first frame must be a valid hello (proto.h): a connection that starts with
     * anything else is not a rank's. */
    if (!rc->rank)
        peer_close(p, "bad message before hello");
}

static void on_rank_closed(struct peer *p, const char *why)
{
    struct rconn *rc = (struct rconn *)p;
    struct agent *a = p->owner;

    (void)why;
    if (rc->prev)
        rc->prev->next = rc->next;
    else
        a->rconns = rc->next;
    if (rc->next)
        rc->next->prev = rc->prev;
    for (size_t i = 0; i < a->npend; i++)
        if (a->pend[i].rc == rc)
            a->pend[i].rc = NULL;
    for (struct bwait *w = a->bwaits; w; w = w->next)
        if (w->rc == rc)
            w->rc = NULL;
    peer_release(p);
    free(rc);
    maybe_free(a);
}

static const struct peer_ops rank_ops = {
    .on_message = on_rank_message,
    .on_bad_message = on_rank_bad_message,
    .on_closed = on_rank_closed,
};

static void on_rank_connection(uv_stream_t *server, int status)
{
    struct agent *a = server->data;
    struct rconn *rc;
    struct ucred cred;
    socklen_t len = sizeof(cred);
    uv_os_fd_t fd;

    if (status < 0)
        return;
    rc = calloc(1, sizeof(*rc));
    if (!rc || peer_init(&rc->peer, a->loop, PEER_UNIX, NULL, a->max_frame, &rank_ops, a) < 0) {
        free(rc);
        log_error("cannot accept a rank connection: out of memory");
        return;
    }
    rc->next = a->rconns;
    if (a->rconns)
        a->rconns->prev = rc;
    a->rconns = rc;
    if (peer_accept(&rc->peer, server) < 0) {
        peer_close(&rc->peer, "accept failed");
        return;
    }
    /* The socket's directory is 0700 already; the uid check also covers a socket path
     * handed to another user's process. */
    if (uv_fileno((uv_handle_t *)&rc->peer.h.pipe, &fd) < 0 ||
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || cred.uid != getuid()) {
        log_error("refused a rank connection from another user");
        peer_close(&rc->peer, "peer of another uid");
        return;
    }
    rc->pid = cred.pid;
}

static int listen_ranks(struct agent *a)
{
    const char *tmp = getenv("TMPDIR");
    int ret;

    tmp = tmp && *tmp ? tmp : "/tmp";
    /* Agents killed by SIGKILL leave their directory: the next one on the node removes it. */
    ret = sockdir_sweep(tmp);
    if (ret > 0)
        log_debug("removed %d socket directories of agents that are gone from '%s'", ret, tmp);
    ret = sockdir_create(tmp, a->sockdir, sizeof(a->sockdir));
    if (ret < 0) {
        log_error("cannot create a socket directory in '%s': %s", tmp, strerror(-ret));
        a->sockdir[0] = '\0';
        return ret;
    }
    snprintf(a->sockpath, sizeof(a->sockpath), "%.4000s/agent.sock", a->sockdir);
    uv_pipe_init(a->loop, &a->listener, 0);
    a->listener.data = a;
    a->listener_open = true;
    a->handles_open++;
    ret = uv_pipe_bind(&a->listener, a->sockpath);
    if (ret == 0)
        ret = uv_listen((uv_stream_t *)&a->listener, SOMAXCONN, on_rank_connection);
    if (ret < 0)
        log_error("cannot listen on '%s': %s", a->sockpath, uv_strerror(ret));
    return ret;
}

/* --- stack capture (a hang) -------------------------------------------------------------- */

/* A native stack tool run for one rank: its stdout goes to the rank's stack and log. */
struct stack_tool {
    uv_process_t proc;
    uv_pipe_t out;
    struct agent *agent;
    struct arank *rank; /* NULL once its rank's record was reset (a restart) */
    struct stack_tool *next;
    bool running;
    int open; /* handles not yet closed */
};

static void on_tool_closed(uv_handle_t *h)
{
    struct stack_tool *t = h->data;
    struct agent *a = t->agent;

    a->handles_open--;
    if (--t->open == 0) {
        struct stack_tool **pp = &a->tools;
        while (*pp != t)
            pp = &(*pp)->next;
        *pp = t->next;
        free(t);
    }
    maybe_free(a);
}

/* Ends every stack tool still running: a tool stuck on its target (gdb reading a large
 * process's symbols, a ptrace of a process in D state) must not outlive the capture. libuv
 * reaps it; kill_orphans() leaves it alone. */
static void stop_tools(struct agent *a)
{
    for (struct stack_tool *t = a->tools; t; t = t->next)
        if (t->running)
            uv_process_kill(&t->proc, SIGKILL);
}

/* The capture is over once every rank exited (a Python rank after its dump) or its tool
 * finished: the teardown goes on at once rather than at the next tick, so that a restart's
 * assign finds the agent in teardown. */
static bool capture_done(const struct agent *a);

static void capture_check(struct agent *a)
{
    if (a->state == AG_CAPTURE && capture_done(a))
        teardown(a, a->capture_cause);
}

static void on_tool_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct stack_tool *t = s->data;

    if (nread > 0 && t->rank) {
        stack_append(t->rank, buf->base, (size_t)nread);
        if (log_append(t->rank, buf->base, (size_t)nread) < 0)
            log_debug("cannot write rank %d's log: %s", t->rank->rank, strerror(errno));
    } else if (nread < 0) {
        uv_close((uv_handle_t *)&t->out, on_tool_closed);
    }
}

static void on_tool_exit(uv_process_t *p, int64_t status, int sig)
{
    struct stack_tool *t = p->data;

    (void)status;
    (void)sig;
    t->running = false;
    if (t->rank)
        t->rank->cap = CAP_DONE;
    uv_close((uv_handle_t *)p, on_tool_closed);
    capture_check(t->agent);
}

/* Runs eu-stack or gdb on pid for r; the capture is done when it exits. */
static int run_stack_tool(struct agent *a, struct arank *r, pid_t pid)
{
    uv_process_options_t opt = {0};
    uv_stdio_container_t stdio[3];
    char buf[2 * PATH_MAX], *argv[12], head[128];
    const char *tool;
    struct stack_tool *t;
    int ret;

    if (stacks_tool_argv(pid, buf, sizeof(buf), argv, &tool) < 0)
        return -ENOENT;
    t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    t->agent = a;
    t->rank = r;
    uv_pipe_init(a->loop, &t->out, 0);
    t->out.data = t->proc.data = t;
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1].data.stream = (uv_stream_t *)&t->out;
    stdio[2].flags = UV_IGNORE;
    opt.file = argv[0];
    opt.args = argv;
    opt.stdio_count = 3;
    opt.stdio = stdio;
    opt.exit_cb = on_tool_exit;
    ret = uv_spawn(a->loop, &t->proc, &opt);
    t->open = 2;
    a->handles_open += 2;
    t->next = a->tools;
    a->tools = t;
    t->running = ret == 0;
    if (ret < 0) {
        uv_close((uv_handle_t *)&t->proc, on_tool_closed);
        uv_close((uv_handle_t *)&t->out, on_tool_closed);
        return ret;
    }
    snprintf(head, sizeof(head), "--- stack of rank %d (pid %ld), by %s ---\n", r->rank, (long)pid,
             tool);
    stack_append(r, head, strlen(head));
    if (log_append(r, head, strlen(head)) < 0)
        log_debug("cannot write rank %d's log: %s", r->rank, strerror(errno));
    r->cap = CAP_TOOL;
    uv_read_start((uv_stream_t *)&t->out, on_out_alloc, on_tool_read);
    return 0;
}

/* Asks every live rank for its stack: SIGABRT to a Python rank with faulthandler (its
 * traceback comes on stderr and it dies; it counts as killed by us), a native tool for any
 * other. The teardown follows once every capture is done or STACK_CAPTURE_MS has passed. */
static void capture_stacks(struct agent *a, const char *cause)
{
    struct stack_target t;

    log_info("capturing the stacks of node %d's ranks: %s", a->node_rank, cause);
    a->state = AG_CAPTURE;
    a->capture_until = now_ms(a) + STACK_CAPTURE_MS;
    snprintf(a->capture_cause, sizeof(a->capture_cause), "%s", cause);
    for (int i = 0; i < a->nranks; i++) {
        struct arank *r = &a->ranks[i];
        r->cap = CAP_DONE;
        if (!r->spawned || r->exited || stacks_find_target(r->proc.pid, &t) < 0)
            continue;
        if (t.python && r->faulthandler) {
            /* No core file: a large process would take minutes to dump one. */
            struct rlimit none = {0, 0};
            char note[160];
            int len = snprintf(note, sizeof(note),
                               "[gpurun] the job hangs: SIGABRT to rank %d (pid %ld) for its "
                               "Python stack, which follows as 'Fatal Python error: Aborted'",
                               r->rank, (long)t.pid);
            emit_line(r, note, (size_t)len);
            if (len > (int)sizeof(note) - 2)
                len = (int)sizeof(note) - 2;
            note[len++] = '\n';
            if (log_append(r, note, (size_t)len) < 0)
                log_debug("cannot write rank %d's log: %s", r->rank, strerror(errno));
            prlimit(t.pid, RLIMIT_CORE, &none, NULL);
            r->killed = true;
            r->cap = CAP_PYTHON;
            kill(t.pid, SIGCONT);
            kill(t.pid, SIGABRT);
        } else if (run_stack_tool(a, r, t.pid) < 0) {
            log_warn("no stack of rank %d: neither eu-stack nor gdb is installed", r->rank);
        }
    }
}

/* Whether the capture is over: every rank exited (a Python rank after its dump) or its tool
 * finished. */
static bool capture_done(const struct agent *a)
{
    for (int i = 0; i < a->nranks; i++) {
        const struct arank *r = &a->ranks[i];
        if (r->cap == CAP_TOOL || (r->cap == CAP_PYTHON && !r->exited))
            return false;
    }
    return true;
}

/* --- teardown ----------------------------------------------------------------------------- */

/* Kills what a rank left behind outside its group: the agent is a subreaper, so such
 * processes are our children now. */
static void kill_orphans(struct agent *a)
{
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t self = getpid();

    (void)a;
    if (!d)
        return;
    while ((e = readdir(d))) {
        char path[64], buf[512], *p;
        long pid = strtol(e->d_name, &p, 10);
        int ppid = 0;
        FILE *f;

        if (*p || pid <= 0)
            continue;
        snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
        f = fopen(path, "re");
        if (!f)
            continue;
        if (fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')')))
            sscanf(p + 2, "%*c %d", &ppid);
        fclose(f);
        if (ppid != self)
            continue;
        bool ours = false;
        for (int i = 0; i < a->nranks; i++)
            ours |= a->ranks[i].spawned && !a->ranks[i].exited && a->ranks[i].proc.pid == pid;
        for (struct stack_tool *t = a->tools; t; t = t->next)
            ours |= t->running && t->proc.pid == pid;
        if (!ours) {
            log_info("killing process %ld left behind by a rank", pid);
            kill((pid_t)pid, SIGKILL);
            waitpid((pid_t)pid, NULL, 0);
        }
    }
    closedir(d);
}

static void teardown(struct agent *a, const char *cause)
{
    if (a->state == AG_TEARDOWN || a->state == AG_DONE)
        return;
    log_info("tearing down node %d's ranks: %s", a->node_rank, cause);
    a->state = AG_TEARDOWN;
    stop_tools(a);
    a->teardown_ms = now_ms(a);
    for (int i = 0; i < a->nranks; i++) {
        struct arank *r = &a->ranks[i];
        if (!r->spawned || r->exited)
            continue;
        r->killed = true;
        /* SIGCONT first: a stopped rank would not act on SIGTERM until continued. */
        signal_group(r, SIGCONT);
        signal_group(r, a->spec->kill_grace_ms > 0 ? SIGTERM : SIGKILL);
    }
    check_done(a);
}

/* The node's metrics file (metrics.h), rewritten every METRICS_INTERVAL_MS while the agent
 * lives. A folder it cannot write to is said once; the job goes on. */
static void write_metrics(struct agent *a)
{
    static const char *const state_names[] = {
        [AG_FINDING] = "joining", [AG_JOINING] = "joining",   [AG_RUNNING] = "running",
        [AG_CAPTURE] = "capture", [AG_TEARDOWN] = "teardown", [AG_DONE] = "done",
    };
    int64_t now = now_ms(a);
    struct metrics_rank *mr = calloc((size_t)a->nranks + 1, sizeof(*mr));
    struct metrics_node n = {
        .job_id = a->spec->job_id,
        .hostname = a->hostname,
        .node = a->node_rank,
        .state = state_names[a->state],
        .restarts = a->generation,
        .leader_hb_age_ms = a->leader && a->leader->ready ? now - a->leader->last_rx_ms : -1,
        .ranks = mr,
        .nranks = a->ranks ? a->nranks : 0,
    };
    int ret;

    a->next_metrics_ms = now + METRICS_INTERVAL_MS;
    if (!mr)
        return;
    for (int i = 0; i < n.nranks; i++) {
        const struct arank *r = &a->ranks[i];
        mr[i] = (struct metrics_rank){
            .rank = r->rank,
            .step = r->step,
            .loss = r->loss,
            .tokens_per_s = r->tokens_per_s,
            .report_age_ms = r->progress_ms ? now - r->progress_ms : -1,
            .running = r->spawned && !r->exited,
        };
    }
    ret = metrics_write(a->spec->metrics_dir, &n);
    free(mr);
    if (ret < 0 && !a->metrics_warned) {
        a->metrics_warned = true;
        log_warn("cannot write metrics into '%s': %s", a->spec->metrics_dir, strerror(-ret));
    }
}

/* The agent is finished with status: its metrics file goes, then the daemon hears of it. */
static void agent_end(struct agent *a, int status)
{
    int ret;

    a->state = AG_DONE;
    if (a->spec->metrics_dir &&
        (ret = metrics_remove(a->spec->metrics_dir, a->spec->job_id, a->node_rank)) < 0)
        log_warn("cannot remove the metrics file in '%s': %s", a->spec->metrics_dir,
                 strerror(-ret));
    a->done(a, status, a->arg);
}

static void finish(struct agent *a, int status)
{
    if (a->state == AG_DONE)
        return;
    a->state = AG_DONE;
    kill_orphans(a);
    if (a->cgroup[0] && cgroup_remove(a->cgroup, JOB_CGROUP_WAIT_MS) < 0)
        log_warn("cannot remove cgroup '%s': processes still in it", a->cgroup);
    agent_end(a, status);
}

/* Whether every rank's exit is known and its output drained; reports each as it becomes
 * so, and ends the agent when the job is over for this node. */
static void check_done(struct agent *a)
{
    int64_t t = now_ms(a);
    int all = 1;

    for (int i = 0; i < a->nranks; i++) {
        struct arank *r = &a->ranks[i];
        /* Torn down before its assign (an abort or finish while joining): no rank to wait for. */
        if (!r->spawned && a->state == AG_TEARDOWN)
            continue;
        if (!r->exited) {
            all = 0;
            continue;
        }
        if (!r->reported && ((!r->out && !r->err) || t - r->exit_ms > OUTPUT_DRAIN_MS))
            report_exit(a, r);
        all &= r->reported;
    }
    if (!all || a->nranks == 0)
        return;
    if (a->finished) {
        finish(a, a->status);
    } else if (!a->leader_open) {
        /* Self-fencing: without a leader nobody else will end this node's job. */
        finish(a, a->failed_here ? a->status : 125);
    }
}

/* --- leader link events ------------------------------------------------------------------- */

/* Forgets everything of the last generation but the log files: the ranks' records, the
 * barriers and the requests in flight (their ranks are gone). */
static void reset_generation(struct agent *a)
{
    for (struct stack_tool *t = a->tools; t; t = t->next)
        t->rank = NULL;
    for (int i = 0; i < a->nranks; i++) {
        struct arank *r = &a->ranks[i];
        int logfd = r->logfd, idxfd = r->idxfd;
        int64_t log_off = r->log_off;

        stream_close(&r->out);
        stream_close(&r->err);
        free(r->stack);
        if (r->wants_preempt && r->preempt_fd >= 0)
            close(r->preempt_fd);
        memset(r, 0, sizeof(*r));
        r->agent = a;
        r->local = i;
        r->logfd = logfd;
        r->idxfd = idxfd;
        r->log_off = log_off;
    }
    while (a->bwaits) {
        struct bwait *w = a->bwaits;
        a->bwaits = w->next;
        free(w->name);
        free(w);
    }
    json_object_clear(a->barrier_counts);
    a->npend = 0;
    a->exited = 0;
    a->failed_here = false;
    a->status = 0;
}

/* A line in every rank log between two generations, so that a reader sees where the
 * restarted ranks' output begins. */
static void mark_restart(struct agent *a, int generation)
{
    char line[160], when[32];
    time_t t = time(NULL);
    struct tm tm;
    int n;

    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    n = snprintf(line, sizeof(line),
                 "----- gpurun: %s: restart %d of %d, the ranks start again -----\n", when,
                 generation, a->spec->max_restarts);
    for (int i = 0; i < a->nranks; i++)
        (void)log_append(&a->ranks[i], line, (size_t)n);
}

static void on_assign(struct agent *a, struct msg *m)
{
    bool all_reported = true, restart;

    for (int i = 0; i < a->nranks; i++)
        all_reported &= a->ranks[i].reported;
    restart = a->state == AG_TEARDOWN && all_reported && m->generation > a->generation;
    if (a->state != AG_JOINING && !restart) {
        log_error("unexpected 'assign' from the leader");
        return;
    }
    if (restart) {
        reset_generation(a);
        mark_restart(a, (int)m->generation);
    }
    a->generation = m->generation;
    a->world_size = m->world_size;
    a->rank_base = m->rank_base;
    a->nnodes = m->nnodes;
    a->master_port = m->master_port;
    snprintf(a->master_addr, sizeof(a->master_addr), "%s", m->master_addr);
    a->hvd_port = m->hvd_port;
    snprintf(a->hvd_host, sizeof(a->hvd_host), "%s", m->hvd_host ? m->hvd_host : "");
    /* gloo binds the interface horovodrun names: here the one this node is reached at. */
    if (hvd_iface_of(a->advertise, a->hvd_iface, sizeof(a->hvd_iface)) < 0) {
        a->hvd_iface[0] = '\0';
        log_info("no interface holds '%s', this node's address: HOROVOD_GLOO_IFACE not set",
                 a->advertise);
    }
    a->state = AG_RUNNING;
    if (!restart && listen_ranks(a) < 0) {
        send_leader(a, proto_pack("{s:s, s:s, s:i}", "type", "abort", "cause",
                                  "agent cannot listen for its ranks", "status", 125));
        a->status = 125;
        a->failed_here = true;
        a->state = AG_TEARDOWN;
    }
    for (int i = 0; i < a->nranks; i++) {
        struct arank *r = &a->ranks[i];
        r->rank = a->rank_base + i;
        if (a->state == AG_RUNNING) {
            spawn_rank(a, r);
        } else {
            r->exited = true;
            r->code = 125;
            r->killed = true;
            a->exited++;
        }
    }
    log_info("node %d running ranks %d..%d of %d (generation %d)", a->node_rank, a->rank_base,
             a->rank_base + a->nranks - 1, a->world_size, a->generation);
    /* Failed spawns are exits too: report them, and fail the job on the first. */
    for (int i = 0; i < a->nranks; i++) {
        struct arank *r = &a->ranks[i];
        if (r->exited && r->code && a->state == AG_RUNNING) {
            a->failed_here = true;
            a->status = r->code;
            report_exit(a, r);
            teardown(a, "a rank could not be started");
        }
    }
    check_done(a);
}

/* The pre-timeout signal: to the ranks that asked for it ("preempt"), or to every rank when
 * the user chose the signal (--signal: job.json's preempt_all). */
static void deliver_preempt(struct agent *a, int sig)
{
    char sn[SIGNAME_LEN];
    int n = 0;

    for (int i = 0; i < a->nranks; i++) {
        struct arank *r = &a->ranks[i];
        if (!r->spawned || r->exited || !(r->wants_preempt || a->spec->preempt_all))
            continue;
        /* Only the process that asked: its children (a DataLoader's workers, started with
         * spawn and so without its handler) share its group and would die of it. The user's
         * own --signal goes to the whole group, as Slurm's does. */
        if (a->spec->preempt_all || r->preempt_pid <= 0)
            signal_group(r, sig);
        else if (r->preempt_fd >= 0)
            syscall(SYS_pidfd_send_signal, r->preempt_fd, sig, NULL, 0);
        else
            kill(r->preempt_pid, sig); /* a kernel without pidfds (before 5.3) */
        n++;
    }
    /* Said once per node where it matters: a rank that did not ask runs on to the limit. */
    if (n < a->nranks)
        log_warn("node %d: pre-timeout signal %s to %d of %d ranks: the others did not ask for "
                 "it (gpurun.on_preempt, gr_on_preempt) and run on to the time limit",
                 a->node_rank, signame(sig, sn), n, a->nranks);
    else
        log_info("node %d: pre-timeout signal %s to all %d ranks", a->node_rank, signame(sig, sn),
                 n);
}

static void on_leader_message(struct peer *p, struct msg *m)
{
    struct agent *a = p->owner;

    switch (m->type) {
    case MSG_ASSIGN:
        on_assign(a, m);
        break;
    case MSG_HB:
        break;
    case MSG_OK:
    case MSG_KV_VAL:
    case MSG_ERROR:
        for (size_t i = 0; i < a->npend; i++) {
            if (a->pend[i].id != m->id)
                continue;
            struct rconn *rc = a->pend[i].rc;
            int64_t rank_id = a->pend[i].rank_id;
            a->pend[i] = a->pend[--a->npend];
            if (rc) {
                json_t *back = json_deep_copy(proto_msg_json(m));
                json_object_set_new(back, "id", json_integer(rank_id));
                peer_send(&rc->peer, back);
            }
            return;
        }
        if (m->type == MSG_ERROR)
            log_error("leader refused a request: %s: %s", m->key, m->value);
        break;
    case MSG_BARRIER_DONE:
        barrier_release(a, m->key);
        break;
    case MSG_ABORT:
        if (m->stacks && a->state == AG_RUNNING)
            capture_stacks(a, m->value);
        else if (a->state != AG_CAPTURE)
            teardown(a, m->value);
        break;
    case MSG_SIGNAL:
        deliver_preempt(a, m->signal);
        break;
    case MSG_FINISH:
        a->finished = true;
        a->status = m->status;
        if (a->exited < a->nranks)
            teardown(a, "the job finished");
        check_done(a);
        break;
    default:
        log_error("unexpected '%s' from the leader", proto_type_name(m->type));
        break;
    }
}

static void on_leader_ready(struct peer *p)
{
    struct agent *a = p->owner;
    struct sockaddr_storage ss;
    int len = sizeof(ss);

    if (!a->advertise[0] && uv_tcp_getsockname(&p->h.tcp, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET)
            uv_ip4_name((struct sockaddr_in *)&ss, a->advertise, sizeof(a->advertise));
        else
            uv_ip6_name((struct sockaddr_in6 *)&ss, a->advertise, sizeof(a->advertise));
    }
    a->state = AG_JOINING;
    a->join_ms = now_ms(a);
    stop_watching(a);
    send_leader(a, proto_pack("{s:s, s:i, s:s, s:s, s:i, s:s}", "type", "join", "node_rank",
                              a->node_rank, "hostname", a->hostname, "addr", a->advertise, "nprocs",
                              a->nranks, "gpus", ""));
}

static void on_leader_closed(struct peer *p, const char *why)
{
    struct agent *a = p->owner;
    char cause[320];
    bool refused = strstr(why, "connection refused") != NULL;

    a->leader_open = false;
    a->leader = NULL;
    peer_release(p);
    free(p);
    if (a->closing) {
        maybe_free(a);
        return;
    }
    if (a->state == AG_FINDING && refused) {
        /* The leader is not listening yet (an explicit --rendezvous): try again. */
        a->next_connect_ms = now_ms(a) + CONNECT_RETRY_MS;
        return;
    }
    if (a->finished || a->state == AG_DONE) {
        check_done(a);
        return;
    }
    if (a->state == AG_FINDING || a->state == AG_JOINING) {
        log_error("node %d cannot join the leader: %s", a->node_rank, why);
        agent_end(a, 125);
        return;
    }
    snprintf(cause, sizeof(cause), "lost the leader: %s", why);
    log_error("node %d %s", a->node_rank, cause);
    teardown(a, cause);
    check_done(a);
}

static void on_leader_bad_message(struct peer *p, const struct proto_error *err)
{
    log_error("bad message from the leader: %s", err->text);
    peer_close(p, err->text);
}

static const struct peer_ops leader_ops = {
    .on_ready = on_leader_ready,
    .on_message = on_leader_message,
    .on_bad_message = on_leader_bad_message,
    .on_closed = on_leader_closed,
};

static int parse_hostport(const char *s, struct sockaddr_storage *ss)
{
    char host[128];
    const char *colon = strrchr(s, ':');
    char *end;
    long port;

    if (!colon || colon == s || (size_t)(colon - s) >= sizeof(host))
        return -EINVAL;
    port = strtol(colon + 1, &end, 10);
    if (*end || port <= 0 || port > 65535)
        return -EINVAL;
    snprintf(host, sizeof(host), "%.*s", (int)(colon - s), s);
    if (host[0] == '[' && host[strlen(host) - 1] == ']') {
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = '\0';
    }
    if (uv_ip4_addr(host, (int)port, (struct sockaddr_in *)ss) == 0 ||
        uv_ip6_addr(host, (int)port, (struct sockaddr_in6 *)ss) == 0)
        return 0;
    return -EINVAL;
}

/* endpoint.json, written by the leader once it listens: {"host": ..., "port": ...}. */
static int read_endpoint(struct agent *a, char *out, size_t cap)
{
    char path[PATH_MAX];
    json_t *root;
    const char *host;
    int port;

    snprintf(path, sizeof(path), "%s/endpoint.json", a->job_dir);
    root = json_load_file(path, 0, NULL);
    if (!root)
        return -ENOENT;
    if (json_unpack(root, "{s:s, s:i}", "host", &host, "port", &port) < 0) {
        json_decref(root);
        return -EINVAL;
    }
    snprintf(out, cap, "%s:%d", host, port);
    json_decref(root);
    return 0;
}

static void try_connect(struct agent *a)
{
    struct sockaddr_storage ss;
    char hp[160];
    int ret;

    if (a->leader || a->closing)
        return;
    if (a->rendezvous[0])
        snprintf(hp, sizeof(hp), "%s", a->rendezvous);
    else if (read_endpoint(a, hp, sizeof(hp)) < 0)
        return;
    if (parse_hostport(hp, &ss) < 0) {
        log_error("cannot use leader address '%s': not HOST:PORT with a numeric host", hp);
        a->rendezvous[0] = '\0';
        return;
    }
    a->leader = calloc(1, sizeof(*a->leader));
    if (!a->leader)
        return;
    ret = peer_init(a->leader, a->loop, PEER_TCP_CLIENT, &a->key, a->max_frame, &leader_ops, a);
    if (ret < 0) {
        free(a->leader);
        a->leader = NULL;
        return;
    }
    a->leader_open = true;
    snprintf(a->leader->name, sizeof(a->leader->name), "leader %.80s", hp);
    ret = peer_connect(a->leader, (struct sockaddr *)&ss);
    if (ret < 0) {
        log_error("cannot connect to the leader at '%s': %s", hp, uv_strerror(ret));
        peer_close(a->leader, uv_strerror(ret));
    }
}

/* endpoint.json appearing in the job dir: dial at once instead of at the next poll. The
 * poll stays: file systems without change notification (NFS) still work, a tick later. */
static void on_job_dir_change(uv_fs_event_t *h, const char *name, int events, int status)
{
    struct agent *a = h->data;

    (void)events;
    if (status == 0 && name && !strcmp(name, "endpoint.json") && a->state == AG_FINDING &&
        !a->leader)
        try_connect(a);
}

static void stop_watching(struct agent *a)
{
    if (!a->watching)
        return;
    a->watching = false;
    uv_close((uv_handle_t *)&a->watch, on_handle_closed);
}

static void on_tick(uv_timer_t *t)
{
    struct agent *a = t->data;
    int64_t now = now_ms(a);
    char cause[320];

    if (a->state == AG_FINDING && !a->leader && now >= a->next_connect_ms)
        try_connect(a);
    if (a->spec->metrics_dir && a->state != AG_DONE && now >= a->next_metrics_ms)
        write_metrics(a);
    for (int i = 0; i < a->nranks; i++)
        if (a->ranks[i].idx_ms && wall_ms() - a->ranks[i].idx_ms >= INDEX_COALESCE_MS)
            index_flush(&a->ranks[i]);
    if ((a->state == AG_FINDING && now - a->t_start > a->spec->join_timeout_ms) ||
        (a->state == AG_JOINING &&
         now - a->join_ms > (int64_t)a->spec->join_timeout_ms + JOIN_BACKSTOP_MS)) {
        if (a->state == AG_FINDING)
            log_error("node %d: no leader answered within %d ms", a->node_rank,
                      a->spec->join_timeout_ms);
        else
            log_error("node %d: joined, but the leader started no job within %d ms of it",
                      a->node_rank, a->spec->join_timeout_ms + JOIN_BACKSTOP_MS);
        agent_end(a, 124);
        return;
    }
    if (a->leader && a->leader->ready && now - a->leader->last_rx_ms > a->spec->hb_timeout_ms) {
        snprintf(cause, sizeof(cause), "no heartbeat for %" PRId64 " ms",
                 now - a->leader->last_rx_ms);
        peer_close(a->leader, cause);
    }
    if (a->state == AG_CAPTURE && (capture_done(a) || now >= a->capture_until))
        teardown(a, a->capture_cause);
    if (a->state == AG_TEARDOWN && now - a->teardown_ms >= a->spec->kill_grace_ms)
        for (int i = 0; i < a->nranks; i++)
            signal_group(&a->ranks[i], SIGKILL);
    if ((a->state == AG_RUNNING || a->state == AG_CAPTURE || a->state == AG_TEARDOWN) &&
        now - a->last_flush_ms >= PROGRESS_FLUSH_MS)
        flush_progress(a);
    if (a->state == AG_TEARDOWN || a->state == AG_RUNNING || a->state == AG_CAPTURE)
        check_done(a);
}

static void on_heartbeat(uv_timer_t *t)
{
    struct agent *a = t->data;

    if (a->leader && a->leader->ready && peer_hb_due(a->leader, a->spec->hb_interval_ms))
        send_leader(a, proto_pack("{s:s}", "type", "hb"));
    /* The shims' watch (shim.h): a full pipe (a shim that stopped reading) loses nothing. */
    for (int i = 0; i < a->nranks; i++)
        if (a->ranks[i].alive_fd >= 0 && write(a->ranks[i].alive_fd, "", 1) < 0)
            continue;
}

/* --- lifecycle ---------------------------------------------------------------------------- */

/* Where the ranks' cgroups go (cgroup.h). Said once per daemon where there are none. */
static void setup_cgroup(struct agent *a)
{
    static bool said;
    char why[PATH_MAX + 128];

    if (cgroup_job_create(a->cgroup, sizeof(a->cgroup), why, sizeof(why)) == 0) {
        log_debug("ranks run in cgroups under '%s'", a->cgroup);
        return;
    }
    a->cgroup[0] = '\0';
    if (!said)
        log_info("ranks run without cgroups of their own (%s): %s", why,
                 getenv("SLURM_JOB_ID") ? "Slurm's job cgroup, where it has one, contains them"
                                        : "they are ended by process group only");
    said = true;
}

/* Every rank runs under the shim (shim.h): this program again, with the rank's command.
 * Returns 0, or a negative errno with why (cap bytes) filled with a lowercase reason. */
static int build_spawn_argv(struct agent *a, char *why, size_t cap)
{
    static char pid[24], alive_ms[24];
    size_t n = 0, i = 0;
    ssize_t len = readlink("/proc/self/exe", a->self_exe, sizeof(a->self_exe) - 1);

    if (len <= 0) {
        int err = len < 0 ? errno : ENOENT;
        snprintf(why, cap, "cannot read '/proc/self/exe': %s", strerror(err));
        return -err;
    }
    a->self_exe[len] = '\0';
    find_python_dir(a);
    snprintf(pid, sizeof(pid), "%ld", (long)getpid());
    while (a->spec->argv[n])
        n++;
    snprintf(alive_ms, sizeof(alive_ms), "%d", a->spec->hb_timeout_ms);
    a->spawn_argv = calloc(n + 11, sizeof(char *));
    if (!a->spawn_argv) {
        snprintf(why, cap, "out of memory");
        return -ENOMEM;
    }
    a->spawn_argv[i++] = a->self_exe;
    a->spawn_argv[i++] = (char *)SHIM_FLAG;
    a->spawn_argv[i++] = pid;
    a->spawn_argv[i++] = (char *)"--alive-fd";
    a->spawn_argv[i++] = (char *)SHIM_ALIVE_FD;
    a->spawn_argv[i++] = (char *)"--alive-ms";
    a->spawn_argv[i++] = alive_ms;
    setup_cgroup(a);
    if (a->cgroup[0]) {
        a->spawn_argv[i++] = (char *)"--cgroup";
        a->cgroup_slot = (int)i;
        a->spawn_argv[i++] = a->cgroup; /* replaced per rank by spawn_rank() */
    }
    a->spawn_argv[i++] = (char *)"--";
    for (size_t k = 0; k < n; k++)
        a->spawn_argv[i++] = a->spec->argv[k];
    return 0;
}

int agent_start(uv_loop_t *loop, const struct agent_config *cfg, struct agent **out)
{
    struct agent *a = calloc(1, sizeof(*a));
    char why[PATH_MAX + 64] = "out of memory";
    int ret = -ENOMEM;

    if (!a)
        goto out;
    a->loop = loop;
    a->spec = cfg->spec;
    a->key = *cfg->key;
    a->job_dir = cfg->job_dir;
    a->requeues = cfg->requeues;
    a->node_rank = cfg->node_rank;
    a->max_frame = cfg->max_frame;
    a->done = cfg->done;
    a->arg = cfg->arg;
    a->t_start = now_ms(a);
    snprintf(a->hostname, sizeof(a->hostname), "%s", cfg->hostname);
    if (cfg->advertise)
        snprintf(a->advertise, sizeof(a->advertise), "%s", cfg->advertise);
    if (cfg->rendezvous)
        snprintf(a->rendezvous, sizeof(a->rendezvous), "%s", cfg->rendezvous);
    a->nranks = cfg->spec->nprocs;
    a->ranks = calloc((size_t)a->nranks, sizeof(*a->ranks));
    a->barrier_counts = json_object();
    if (!a->ranks || !a->barrier_counts)
        goto out;
    for (int i = 0; i < a->nranks; i++) {
        a->ranks[i].agent = a;
        a->ranks[i].local = i;
        a->ranks[i].logfd = a->ranks[i].idxfd = -1;
        a->ranks[i].alive_fd = -1;
    }
    ret = build_spawn_argv(a, why, sizeof(why));
    if (ret < 0)
        goto out;
    ret = output_start(a);
    if (ret < 0) {
        snprintf(why, sizeof(why), "cannot start the output writer: %s", uv_strerror(ret));
        goto out;
    }
    /* Orphans of our ranks come back to us, not to init: see kill_orphans(). */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    uv_timer_init(loop, &a->tick);
    uv_timer_init(loop, &a->hb);
    a->tick.data = a->hb.data = a;
    a->handles_open += 2;
    uv_timer_start(&a->tick, on_tick, TICK_MS, TICK_MS);
    uv_timer_start(&a->hb, on_heartbeat, (uint64_t)a->spec->hb_interval_ms,
                   (uint64_t)a->spec->hb_interval_ms);
    if (!a->rendezvous[0] && a->job_dir && uv_fs_event_init(loop, &a->watch) == 0) {
        a->watch.data = a;
        a->handles_open++;
        a->watching = true;
        if (uv_fs_event_start(&a->watch, on_job_dir_change, a->job_dir, 0) < 0)
            stop_watching(a);
    }
    try_connect(a);
    *out = a;
    a = NULL;
    ret = 0;
out:
    if (a) {
        if (a->cgroup[0])
            cgroup_remove(a->cgroup, 0);
        free(a->spawn_argv);
        free(a->ranks);
        json_decref(a->barrier_counts);
        free(a);
    }
    if (ret < 0)
        log_error("cannot start the agent: %s", why);
    return ret;
}

void agent_signal(struct agent *a, int sig)
{
    char cause[256], sn[SIGNAME_LEN];

    if (sig == SIGUSR1 || sig == SIGUSR2) {
        /* Inside a Slurm step, slurmstepd signals every process of the step itself
         * (`scancel --signal`): passing it on would deliver it twice. gpurun's own
         * pre-timeout signal comes through the leader instead ("signal"), so that it
         * reaches only the ranks that asked for it. */
        if (getenv("SLURM_STEP_ID"))
            return;
        if (sig == a->spec->preempt_signal) {
            deliver_preempt(a, sig);
            return;
        }
        for (int i = 0; i < a->nranks; i++)
            signal_group(&a->ranks[i], sig);
        return;
    }
    snprintf(cause, sizeof(cause), "cancelled: node %d ('%.64s') received %s", a->node_rank,
             a->hostname, signame(sig, sn));
    if (!a->failed_here) {
        a->failed_here = true;
        a->status = 128 + sig;
    }
    send_leader(
        a, proto_pack("{s:s, s:s, s:i}", "type", "abort", "cause", cause, "status", 128 + sig));
    if (a->state == AG_FINDING || a->state == AG_JOINING) {
        agent_end(a, 128 + sig);
        return;
    }
    teardown(a, cause);
}

static void maybe_free(struct agent *a)
{
    if (!a->closing || a->handles_open > 0 || a->rconns || a->leader)
        return;
    for (int i = 0; i < a->nranks; i++) {
        index_flush(&a->ranks[i]);
        if (a->ranks[i].logfd >= 0)
            close(a->ranks[i].logfd);
        if (a->ranks[i].idxfd >= 0)
            close(a->ranks[i].idxfd);
        if (a->ranks[i].alive_fd >= 0)
            close(a->ranks[i].alive_fd);
        if (a->ranks[i].wants_preempt && a->ranks[i].preempt_fd >= 0)
            close(a->ranks[i].preempt_fd);
        free(a->ranks[i].stack);
    }
    while (a->bwaits) {
        struct bwait *w = a->bwaits;
        a->bwaits = w->next;
        free(w->name);
        free(w);
    }
    if (a->sockpath[0])
        unlink(a->sockpath);
    if (a->sockdir[0])
        rmdir(a->sockdir);
    json_decref(a->barrier_counts);
    free(a->pend);
    free(a->spawn_argv);
    free(a->ranks);
    free(a);
}

void agent_close(struct agent *a)
{
    if (a->closing)
        return;
    a->closing = true;
    if (a->leader)
        peer_close(a->leader, "agent shutting down");
    for (struct rconn *rc = a->rconns; rc; rc = rc->next)
        peer_close(&rc->peer, "agent shutting down");
    for (int i = 0; i < a->nranks; i++) {
        stream_close(&a->ranks[i].out);
        stream_close(&a->ranks[i].err);
    }
    output_close(a);
    stop_watching(a);
    if (a->listener_open)
        uv_close((uv_handle_t *)&a->listener, on_handle_closed);
    uv_close((uv_handle_t *)&a->tick, on_handle_closed);
    uv_close((uv_handle_t *)&a->hb, on_handle_closed);
    maybe_free(a);
}
