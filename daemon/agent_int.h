/* The agent's own header, for its three files and no other: the records they share (struct
 * agent, one struct arank per local rank, struct ostream per output pipe) and the calls between
 * them, all on the loop's thread. agent.c runs the agent (its states, the leader and rank links,
 * stack capture, teardown), agent_spawn.c starts and reaps the ranks' processes, and
 * agent_output.c takes their output. */
#ifndef GPURUN_AGENT_INT_H
#define GPURUN_AGENT_INT_H

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>
#include <uv.h>

#include "agent.h"
#include "auth.h"
#include "jobmark.h"
#include "proto.h"
#include "steptime.h"
#include "stall.h"

/* Lines of a rank's output kept for the failure message, and their longest length. */
#define TAIL_LINES    10
#define TAIL_LINE_MAX 240
/* A line longer than this is passed on in pieces (cut between characters). */
#define LINE_MAX_LEN  4000
/* Per-rank secret: 128 bits, shown to the rank in GPURUN_TOKEN. */
#define TOKEN_BYTES   16

/* The agent's states, and what moves it from each:
 *   FINDING   looking for the leader (endpoint.json or --rendezvous) and dialling it.
 *             -> JOINING once connected: the one-frame hello (auth.h) and the join leave
 *                together, and the leader's first frame proves it;
 *             -> DONE when no leader answers within join_timeout (124), the link fails for
 *                another reason than a refused connection (125), or a signal cancels (128+N).
 *   JOINING   waiting for the leader's assign.
 *             -> RUNNING on the assign, which spawns the ranks;
 *             -> TEARDOWN on the leader's abort or finish (no rank to end yet);
 *             -> DONE as FINDING, join_timeout counting from the join plus a backstop.
 *   RUNNING   the ranks run.
 *             -> CAPTURE on the leader's abort that asks for stacks (a hang);
 *             -> TEARDOWN when a local rank fails or cannot be started (or the ranks' socket
 *                cannot be made), on the leader's abort, on its finish while ranks still run,
 *                when the leader is lost, or when a signal cancels;
 *             -> DONE once every rank is reported after the leader's finish.
 *   CAPTURE   the ranks' stacks are taken (SIGABRT to a Python rank, a tool for another).
 *             -> TEARDOWN once every capture is done or STACK_CAPTURE_MS pass, and as
 *                RUNNING's on finish, lost leader or signal (a rank failing meanwhile is no
 *                failure of its own, and another abort is ignored).
 *   TEARDOWN  the ranks get SIGCONT and SIGTERM, then SIGKILL after kill_grace.
 *             -> RUNNING on a restart's assign (generation + 1) once every rank is reported;
 *             -> DONE once every rank is reported after the leader's finish, or without a
 *                leader (self-fencing).
 *   DONE      the done callback was called (agent_end); the daemon closes the agent. */
/* AG_SPARE: a hot spare (jobspec.spare_nodes), joined, running no rank until an assign gives
 * it a failed node's place. */
enum agent_state { AG_FINDING, AG_JOINING, AG_SPARE, AG_RUNNING, AG_CAPTURE, AG_TEARDOWN, AG_DONE };

/* A rank's stack capture: none asked, SIGABRT sent to its Python process (the traceback
 * comes on its stderr), a native tool running, or finished. */
enum capture { CAP_NONE, CAP_PYTHON, CAP_TOOL, CAP_DONE };

struct agent;
struct arank;
struct bwait;
struct outbuf;
struct rgwait;
struct peer;
struct pending;
struct rconn;
struct stack_tool;

/* One output pipe of a rank. Allocated per spawn and freed in its close callback, so that a
 * restart can reuse the rank's record while an old pipe is still closing. */
struct ostream {
    uv_pipe_t pipe;
    struct agent *agent;
    struct arank *rank; /* NULL once detached from the rank (closing) */
    bool is_err;        /* the rank's stderr */
    bool cr;            /* the last byte read was a '\r' (stream_take) */
    size_t shown;       /* line[0..shown) went to the stream before its end (linepart.h) */
    int64_t last_ms;    /* when the last bytes came, monotonic */
    char line[LINE_MAX_LEN];
    size_t len;
};

/* One local rank: its process, output, log files, progress and exit. A restart resets it
 * (reset_generation in agent.c) but for its open log files. */
struct arank {
    struct agent *agent;
    uv_process_t proc;         /* its shim's, when spawned at its start (not a warm shim's) */
    pid_t pid;                 /* its shim's pid once spawned: the rank's process group */
    struct ostream *out, *err; /* NULL when closed */
    int local, rank;
    bool spawned, exited, reported, killed, oom;
    bool wants_preempt; /* asked for the pre-timeout signal (a "preempt" request) */
    bool muted;         /* not among --output-ranks: its output goes to its log only */
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
    int idxfd;        /* logs/rank-N.idx: when each stretch of the log was written */
    int64_t log_off;  /* the log's size: where the next write lands */
    bool log_midline; /* the log's last byte is not a newline */
    int64_t idx_ms;   /* the index record not yet written: the time of its first write, 0:
                       * none; it covers the log up to log_off */
    int alive_fd;     /* write end of its shim's heartbeat pipe (shim.h), or -1 */
    char token[2 * TOKEN_BYTES + 1];
    struct proto_progress prog; /* its last report (total_steps: the last one given) */
    struct steptime st;         /* seconds per step (steptime.h): gpurun_rank_step_seconds */
    bool dirty;
    int waits; /* its requests that wait on the other ranks: barriers, gets with a timeout */
    /* Its last sign of life in the store, for the leader's hang rule (rank_active in agent.c;
     * the loop's clock, 0: none yet); active_dirty: not yet sent. */
    int64_t active_ms;
    bool active_dirty;
    /* Liveness for any script: its last line of output (valid UTF-8, a redraw's too) and when
     * its last byte came (the loop's clock; 0: none yet); output_dirty: not yet sent;
     * output_sent_ms: the output_ms the leader last got (agent.c's output_json). */
    char last_line[TAIL_LINE_MAX];
    int64_t output_ms;
    int64_t output_sent_ms;
    bool output_dirty;
    /* Where its last memory checkpoint load came from ("memory", "node N"; "" none) and the
     * copy's step; loaded_dirty: not yet sent (progress "loaded"). */
    char loaded_from[16];
    int64_t loaded_step;
    bool loaded_dirty;
    /* It said it can regroup in process (regroup_ok); regroup_dirty: not yet sent. */
    bool regroup_ok, regroup_dirty;
    char tail[TAIL_LINES][TAIL_LINE_MAX];
    int tail_next, tail_count;
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
    struct peer *leader; /* the leader link from connect to its close callback, or NULL */
    uv_timer_t tick, hb;
    struct stall stall;  /* the tick's lateness: time the loop did not run (stall.h) */
    uv_fs_event_t watch; /* the job dir, for endpoint.json, until the leader is found */
    bool watching;
    uv_pipe_t listener;
    bool listener_open;
    int handles_open;
    bool closing;
    int64_t t_start, teardown_ms, last_flush_ms, next_connect_ms;
    int64_t last_output_flush_ms; /* output_json's last sending */
    bool flush_output;            /* the next flush sends the ranks' lines, however soon */
    bool waits_dirty;         /* a rank started or stopped waiting (arank.waits): the next progress
                               * flush tells the leader, whose hang rule never blames a waiting rank */
    int64_t capture_until;    /* AG_CAPTURE's deadline */
    int64_t met_check_ms;     /* when /proc/net/tcp was last read for MASTER_PORT (check_met) */
    bool met;                 /* a socket on MASTER_PORT showed on this node (together.h) */
    bool met_dirty;           /* ... and the leader has not been told */
    int64_t next_metrics_ms;  /* when the metrics file is next written */
    int64_t join_ms;          /* when the join was sent (AG_JOINING) */
    bool metrics_warned;      /* "cannot write metrics" was said once */
    struct stack_tool *tools; /* stack tools started, until their handles close */
    char capture_cause[PROTO_TAIL_MAX]; /* the leader's abort cause, for the teardown after */

    int world_size, rank_base, master_port, nnodes;
    int job_node;   /* the job's node this one serves (rank_base / nranks): its ranks' NODE_RANK */
    int generation; /* the leader's: how many times the job was restarted */
    int requeues;   /* Slurm's: how many times the job was requeued */
    char master_addr[64];
    int hvd_port;                      /* horovod's rendezvous on the leader, or 0 */
    char hvd_host[PROTO_NAME_MAX + 1]; /* HOROVOD_HOSTNAME, or "" */
    char hvd_iface[64];                /* HOROVOD_GLOO_IFACE, or "" */
    struct arank *ranks;
    int nranks, exited;
    char self_exe[PATH_MAX];   /* this program */
    char shim_exe[PATH_MAX];   /* the rank shim it runs (shim.h): gpurun-shim, or self_exe */
    char python_dir[PATH_MAX]; /* the gpurun Python package's folder, or "" */
    char **spawn_argv;         /* shim_exe --exec-rank PID ... -- argv... (agent_spawn_init) */
    int cgroup_slot;           /* spawn_argv's index of the rank's cgroup, or 0: none */
    int local_rank_slot;       /* spawn_argv's index of "--local_rank=N", or 0: none */
    char cgroup[PATH_MAX];     /* the job's cgroup (cgroup.h), or "" */
    struct jobmark mark;       /* this daemon's job mark; its rank is set per rank */
    int mark_slot;             /* spawn_argv's index of the rank's mark */
    /* The warm shims (agent_warm_prepare), one a local rank, NULL where none waits: the shim
     * started before the assign, waiting for its rank's arguments and environment. */
    struct warm_shim **warm;
    char sockdir[PATH_MAX];
    char sockpath[PATH_MAX];
    int container_rt; /* the runtime the ranks run in (container.h), CONTAINER_AUTO: none
                       * found, or the job has no image (agent_container_init) */
    struct container_rm *container_rms; /* its runtime's commands under way: removals, the
                                         * pre-flight's probe */
    int container_probe;                /* CONTAINER_PROBE_*: the pre-flight's */
    char container_why[256];            /* what the pre-flight found wrong, or "" */
    bool container_probe_runs;          /* the probe runs the job's Python (not an inspect) */
    /* The pre-flight checks (preflight.h) run on a thread of their own from the agent's
     * start, while it finds the leader and proves the key: their disk sync and NVML's load are
     * off the loop, which on node 0 is the leader's too. The join goes once both are done.
     * Not libuv's pool: its first use starts four threads and waits for each to run, a
     * millisecond before the agent's first connect on a loaded node. */
    uv_async_t preflight_async; /* sent by the thread: its checks done, then its spawns */
    pthread_t preflight_tid;
    bool preflight_threaded; /* preflight_tid is to be joined */
    bool preflight_checked;  /* set by the thread (atomics): its verdict is in */
    bool warm_spawned;       /* set by the thread (atomics): the warm shims are started */
    bool warm_adopted;       /* the loop watches them (agent_warm_adopt) */
    bool preflight_done;
    bool join_waits; /* the link is ready: the join goes when the checks are done */
    char preflight_why[256], preflight_skipped[256];

    struct rconn *rconns;
    struct pending *pend;
    size_t npend, cappend;
    int64_t next_id;
    json_t *barrier_counts;  /* name -> local ranks arrived */
    struct memckpt *mem;     /* the node's memory checkpoints (memckpt.h); NULL: none */
    struct memlink *memlink; /* their link to the holder (memlink.h; agent_mem.c); NULL: none */
    uv_async_t mem_async;    /* the link's threads wake the loop with it */
    bool mem_async_open;
    bool mem_send_failing; /* the last send to the holder failed (said once) */
    int mem_holder;        /* the node that holds this node's copies, -1: none */
    struct mwait *mwaits;  /* ranks' loads waiting on a fetch */
    uint64_t mem_cookie;   /* the last fetch's */
    struct bwait *bwaits;
    /* The ranks' regroup requests waiting for the leader's next generation (agent.c). */
    struct rgwait *rgwaits;

    struct outbuf *out;     /* the merged stream, our stdout (agent_output.c) */
    struct outbuf *err_out; /* the ranks' stderr, our stderr; NULL where that is stdout's
                             * file (2>&1, one terminal, a batch output file) */
    bool out_tty;           /* our stdout is a terminal: redraws stay redraws (linepart.h) */
    bool err_tty;           /* our stderr is one (where err_out writes) */

    bool failed_here; /* this node saw the first failure it knows of */
    bool cancelled;   /* a terminating signal was acted on: later ones change nothing */
    int status;       /* exit status when the leader cannot tell us one */
    /* The leader's finish came: status is the job's, and the agent ends once every rank is
     * reported. Not a state: it comes in RUNNING (the ranks exited, their output may still
     * drain) as well as in JOINING or TEARDOWN. */
    bool finished;
};

/* --- agent.c -------------------------------------------------------------------------------- */

/* Rank r's process was reaped and its exit recorded (agent_spawn.c): decides what it means
 * for the job (a failure tears the node down) and moves the state machine on. */
void agent_rank_exited(struct agent *a, struct arank *r);

/* Reports each rank whose exit is known and output drained, and ends the agent when the job
 * is over for this node. Called whenever a rank exits or a stream closes. */
void agent_check_done(struct agent *a);

/* Frees a closing agent once its last handle, rank connection and leader link are gone;
 * called from every close callback (a handle's owner is freed only there). */
void agent_maybe_free(struct agent *a);

/* --- agent_spawn.c: the ranks' processes ----------------------------------------------------- */

/* Prepares spawning: finds this program (the rank shim) and the gpurun Python package, makes
 * the job's cgroup where the machine allows, and builds a->spawn_argv. Returns 0, or a negative
 * errno with why (caller-owned) filled with a lowercase reason. a->spawn_argv is new: freed
 * with free() (its strings are borrowed from a and the spec). */
int agent_spawn_init(struct agent *a, struct errmsg *why);

/* Spawns rank r of a->ranks under the shim, in a process group (and cgroup) of its own, with
 * its environment, a fresh token, its log open and its stdout and stderr read; its exit comes
 * to agent_rank_exited(). Returns 0; a libuv error when the spawn failed, logged, with r
 * recorded as exited (127: no such command, else 126) and a tail line that says why; or -EIO
 * or -ENOMEM when it could not be prepared, logged, with r recorded as exited with 125. */
int agent_spawn_rank(struct agent *a, struct arank *r);

/* Warm shims: each local rank's shim started while the agent joins, so that its fork, exec
 * and start are off the path of the rank's start; agent_spawn_rank() hands it the rank's
 * arguments and environment through a pipe (shim.h, --spec-fd). None for a job in a container
 * image (its runtime's words depend on the rank), nor where one cannot be started: the rank
 * is spawned then. agent_warm_prepare() makes their pipes (the loop's thread, before the
 * pre-flight's starts), agent_warm_spawn() starts them (the pre-flight's thread: it waits for
 * each exec), agent_warm_adopt() watches them (the loop's, once the pre-flight is done). */
void agent_warm_prepare(struct agent *a);
void agent_warm_spawn(struct agent *a);
void agent_warm_adopt(struct agent *a);

/* Ends the warm shims no rank took (the job ended for this node, or the agent closes): their
 * pipe is closed and they are killed; their handles close as they exit. */
void agent_warm_release(struct agent *a);

/* Whether pid is a warm shim's whose handle is open: libuv reaps it, not kill_orphans. */
bool agent_warm_owns(const struct agent *a, pid_t pid);

/* Sends sig to rank r's process group, while it runs. */
void arank_signal(struct arank *r, int sig);

/* The error file torch's @record left for rank r (TORCHELASTIC_ERROR_FILE), as the
 * rank_exit's "error" object {type, message, file, line, traceback}: new (caller decrefs), or
 * NULL when there is none, it is too large, or it is not torch's (then said in a warning). */
json_t *agent_read_error_file(struct agent *a, struct arank *r);

/* --- agent_output.c: the ranks' output ------------------------------------------------------ */

/* Starts the writer of the merged stream on our stdout (outbuf.h). Returns 0 or a negative
 * errno; logs nothing. */
int agent_output_start(struct agent *a);

/* Closes the merged stream once the ranks' streams are closed: what is queued is still
 * written, for at most OUTPUT_LINGER_MS (5 s) of a reader that reads nothing; the agent counts
 * the writer as an open handle until then. */
void agent_output_close(struct agent *a);

/* Opens rank r's log and its index in the job dir unless they are open (a restart keeps
 * them); a log that cannot be opened is said in a warning and not written. */
void agent_open_log(struct agent *a, struct arank *r);

/* Ranks in containers (agent_container.c, container.h), for a job with an image. */
/* A runtime command under way (a removal, the pre-flight's probe): its process is the
 * agent's child, not a rank's orphan. */
struct container_rm {
    uv_process_t proc;
    struct agent *agent;
    struct container_rm *next;
    int out_fd;                    /* the probe's output (a file unlinked), or -1 */
    void (*then)(struct agent *a); /* the probe's: called once its verdict is in */
};
enum { CONTAINER_PROBE_NONE, CONTAINER_PROBE_RUNNING, CONTAINER_PROBE_DONE };
/* Picks the node's runtime into a->container_rt. */
void agent_container_init(struct agent *a);
/* The words that run rank r's command in its container, given its environment (env, what
 * the runtime's client gets) and cgroup (cgdir, NULL: none): malloc'd, container_argv_free;
 * NULL when out of memory. */
char **agent_container_words(struct agent *a, const struct arank *r, char *const *env,
                             const char *cgdir);
/* Removes what the runtime keeps of rank r's container (a stopped one whose client or conmon
 * was killed), in the background. */
void agent_container_remove(struct agent *a, const struct arank *r);
/* The node's checks before it joins, for a job with an image: the runtime is installed and
 * each mount's source exists (at once), then, in the background (a first podman run on a
 * node takes seconds, and the loop must go on), the image is on the node and runs the job's
 * Python (`python3 -c pass`, with the job's mounts and no pull). Returns true when the
 * verdict is in (a->container_why: "" or one line), false when then(a) will be called once
 * it is. */
bool agent_container_preflight(struct agent *a, void (*then)(struct agent *a));

/* Memory checkpoints (agent_mem.c): the store, opened at the start; the link, started at
 * the join (returns its port, 0: none); the holder the assign names; a rank's save and load
 * (a load the store cannot answer is fetched from the holder); a rank link's close; the
 * agent's close (the link stops) and its free (the store goes). */
struct peer;
void agent_mem_open(struct agent *a);
int agent_mem_link(struct agent *a);
void agent_mem_assign(struct agent *a, const struct msg *m);
void agent_mem_save(struct agent *a, struct peer *p, int rank, struct msg *m);
void agent_mem_load(struct agent *a, struct peer *p, int rank, struct msg *m);
void agent_mem_forget(struct agent *a, struct peer *p);
void agent_mem_close(struct agent *a);
void agent_mem_free(struct agent *a);

/* Writes a line into every rank log where the ranks of generation start. */
void agent_mark_restart(struct agent *a, int generation);
/* Writes into the log of rank r, which the daemon is ending, the cause. */
void agent_mark_ended(struct arank *r, const char *cause);

/* Writes the ranks' index records that are old enough to be complete; from the tick. */
void agent_flush_index(struct agent *a);

/* Writes r's last index record and closes its log and index. */
void arank_close_log(struct arank *r);

/* Appends data[0..n) to r's log and notes it in its index. Returns 0 (also without a log), or
 * -1 with errno set when the log could not take it all. */
int arank_log_append(struct arank *r, const void *data, size_t n);

/* Passes one line of r's output (s[0..n), no '\n') on: labelled to the merged stream (its
 * stderr's when is_err and that is another file), and into r's tail. */
void arank_emit_line(struct arank *r, const char *s, size_t n, bool is_err);

/* Called every tick: a rank's line that has waited without its end (LINEPART_TTY_MS on a
 * terminal, LINEPART_FILE_MS to a file or a pipe) goes to the stream as it stands. */
void agent_output_tick(struct agent *a);

/* The width of the terminal the ranks' output is shown on (our stdout's, else our stderr's
 * where the ranks' stderr has a writer of its own, else the one of gpurun --wait that
 * submitted the job: jobspec's term_cols), for their COLUMNS; 0 where there is none. Read at
 * each spawn: a window resized between restarts is followed. */
int agent_output_columns(const struct agent *a);

/* Keeps s[0..n) as the newest of r's last TAIL_LINES lines: made valid UTF-8 (utf8_sanitize:
 * invalid bytes and NULs replaced), cut at a character to fit TAIL_LINE_MAX. */
void arank_tail_add(struct arank *r, const char *s, size_t n);

/* Joins r's tail lines with '\n' into out (cap bytes, always terminated). */
void arank_tail_join(const struct arank *r, char *out, size_t cap);

/* Appends s[0..n) to r's captured stack (r->stack, allocated here and freed by the owner of
 * r), cut at PROTO_STACK_MAX bytes; anything but printable ASCII, tab and newline becomes '?'. */
void arank_stack_append(struct arank *r, const char *s, size_t n);

/* A new stream for one of r's pipes, its handle initialised on a's loop and counted open;
 * NULL when out of memory. End it with ostream_close(). */
struct ostream *ostream_new(struct agent *a, struct arank *r);

/* Starts reading o's pipe (after the spawn connected it). Returns 0 or a libuv error. */
int ostream_read_start(struct ostream *o);

/* Passes on the partial last line of the stream in *slot, detaches the stream from its rank,
 * sets *slot to NULL and closes it; it frees itself in its close callback. NULL *slot:
 * nothing. */
void ostream_close(struct ostream **slot);

/* The read buffer of every pipe the agent reads (ranks' output, stack tools): one static
 * buffer, as the loop runs one read callback at a time. */
void agent_on_out_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);

#endif
