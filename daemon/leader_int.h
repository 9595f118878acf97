/* The leader's state, shared by its two files: leader.c (admission, dispatch, restarts, spares,
 * the hang and straggler rules) and leader_view.c (what the leader tells: the status view, whose
 * JSON is the contract gpurun status and summary.json read, and the failure records).
 * Internal to rendezvousd. */
#ifndef GPURUN_DAEMON_LEADER_INT_H
#define GPURUN_DAEMON_LEADER_INT_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>
#include <uv.h>

#include "admit.h"
#include "auth.h"
#include "hang.h"
#include "hvd.h"
#include "jobspec.h"
#include "leader.h"
#include "peer.h"
#include "proto.h"
#include "refusals.h"
#include "spares.h"
#include "stall.h"
#include "store.h"

/* A new connection gets this long to finish its handshake and send its first message. */
#define HANDSHAKE_TIMEOUT_MS   5000
/* Connections accepted per turn of the loop: the rest wait in the kernel's backlog until the
 * next turn, so that a flood of connections cannot keep the loop in accept() while
 * heartbeats, joins and the tick wait behind it. */
#define ACCEPTS_PER_TURN       64
/* Descriptors the leader needs besides one per node and its stranger slots: status clients,
 * the listeners (ours and horovod's), the loop's own, log files, and horovod's clients. */
#define FDS_SLACK              (CLIENTS_MAX + 192)
/* Connections refused before they proved the job key are counted per source address and
 * reason (refusals.h): the first of a burst is logged at once, the rest in one summary line
 * per source every this long, so that a flood cannot fill the job's output. */
#define REFUSAL_WINDOW_MS      5000
/* A status client that asks nothing for this long is dropped, so that idle clients cannot
 * hold the CLIENTS_MAX slots; `gpurun status --watch` asks every second or two. */
#define CLIENT_IDLE_MS         30000
/* Status clients served at once. */
#define CLIENTS_MAX            64
/* Resolution of every deadline (store waits, handshakes, heartbeats, the join): fine enough
 * for timeouts of seconds, and 20 wake-ups a second cost nothing. */
#define TICK_MS                50
/* A restart (max_restarts) waits this long after the failed generation is gone, doubling
 * with each restart up to RESTART_BACKOFF_MAX_MS: a rank that fails at once (a bad node, a
 * missing file) must not spin through its restarts in milliseconds, and a transient fault
 * (a file system hiccup, a peer's port still in TIME_WAIT) gets time to pass. */
#define RESTART_BACKOFF_MS     1000
#define RESTART_BACKOFF_MAX_MS 30000
/* Earlier generations' failures a live status reply carries, the newest (summary.json has
 * them all): each may hold a 4 KiB tail, and max_restarts goes to 1,000. */
#define LIVE_FAILURES_MAX      10
/* Rank 0's losses kept for status's sparkline: one per step it reported, the newest this
 * many (a status line's width). */
#define LOSS_HISTORY           48
/* After "finish", how long the leader waits for agents to hang up before closing. */
#define FINISH_LINGER_MS       2000
/* After "abort", agents get kill_grace plus this to report their ranks gone. */
#define ABORT_SLACK_MS         3000
/* How late a rank's newest report (or sign of life in the store, or under --hang-watch
 * output its first byte after a silence: agent.c's output_watch_ms) may reach the leader:
 * agents batch them every 250 ms (agent.c's PROGRESS_FLUSH_MS), plus the link. A hang is
 * declared this much after the timeout, so that a rank reporting just inside the timeout is
 * never blamed. */
#define HANG_MARGIN_MS         300
/* Stragglers (check_stragglers): how often the rule looks, the steps a rank's average needs
 * first, and the most a status shows. */
#define STRAGGLER_CHECK_MS     1000
#define STRAGGLER_MIN_STEPS    10
#define STRAGGLERS_SHOWN       8
/* A hang's teardown first captures every rank's stack: agents get this long for it. */
#define STACK_CAPTURE_MS       5000
/* How often the leader looks for the batch script's pre-timeout request (PREEMPT_FILE). */
#define PREEMPT_POLL_MS        200
/* The link test (pre-flight): a node whose link is below this fraction of the median of the
 * nodes' links is slow, unless its probe took less than LINK_SLOW_MIN_MS (a scheduling pause
 * of the leader's loop, not a link, at the speed of a datacentre's). */
#define LINK_SLOW_FRACTION     0.1
#define LINK_SLOW_MIN_MS       50.0
/* The file in the job dir by which the batch script, on the batch host with the leader,
 * passes on Slurm's pre-timeout signal: it holds the signal's number. The job dir is the
 * user's own 0700 directory, as trusted as job.json; the signal then reaches only the ranks
 * that asked for it (srun would signal every process of the step). */
#define PREEMPT_FILE           "preempt"
/* Past the time limit, how long the leader of a Slurm job leaves Slurm to end the job before
 * it ends the job itself: Slurm's limit check runs every 30 s or so, then KillWait. */
#define LIMIT_BACKSTOP_MS      120000
/* A SIGTERM within this of the time limit is Slurm's (or gpurun --local's) time limit
 * ending the job, not a cancel: Slurm never ends a job before its limit, and the daemons
 * start a moment after the job does. */
#define TIMEOUT_SLACK_MS       3000
/* The job's start as its launcher saw it (the batch script's, gpurun --local's): wall-clock
 * milliseconds, for the time limit's origin. */
#define JOB_START_ENV          "GPURUN_JOB_START_MS"
/* A store wait longer than this lasts as long as the job: it keeps now + timeout_ms, which
 * the wire allows up to INT64_MAX, from overflowing. */
#define KV_WAIT_MAX_MS         (INT64_MAX / 2)

enum conn_role { ROLE_NEW, ROLE_AGENT, ROLE_CLIENT };
enum job_state { JOB_JOINING, JOB_RUNNING, JOB_ABORTING, JOB_FINISHED };
/* A rank's last line in a status reply: cut to this many bytes, and left out past this many
 * ranks, so that the reply of 2,048 ranks (about 260 bytes each) stays well inside a frame. */
#define STATUS_LINE_MAX    64
#define STATUS_LINES_RANKS 2048

/* PHASE_LOST: its node was lost while it ran; its end is unknown, but it is not running. */
enum rank_phase { PHASE_PENDING, PHASE_JOINED, PHASE_RUNNING, PHASE_EXITED, PHASE_LOST };

struct conn {
    struct peer peer;
    struct conn *prev, *next;
    struct conn *qprev, *qnext; /* ROLE_NEW: the pending queue, oldest first */
    bool queued;                /* in the pending queue (an evicted one left it) */
    enum conn_role role;
    int node;    /* ROLE_AGENT: node rank */
    bool logged; /* the reason of its close is logged already */
    /* ROLE_NEW: the link probe before its join (MSG_PROBE): in the round under way, the
     * bytes of the frames after its first and when that first came (uv_hrtime, ns); the best
     * round's rate (Mbit/s) and time (ms). */
    uint64_t probe_bytes, probe_t0;
    double probe_mbit, probe_ms;
};

struct node {
    struct conn *conn;
    char hostname[128];
    char addr[64];
    int mem_port; /* its memory link's (daemon/memlink.h), 0: none */
    int nprocs;
    int rank_base;
    int exited; /* ranks of this node reported gone */
    int slot;   /* the job's node it serves (its ranks: slot * nprocs on), -1: a spare */
    bool joined, lost, done;
    bool fenced;                 /* taken out of the job for its fault: never used again */
    char preflight[256];         /* the pre-flight check it failed (preflight.h), "" */
    char preflight_skipped[256]; /* a pre-flight check not made and why, "" */
    double link_mbit;            /* its link to the leader as timed before its join; 0: not timed */
    double link_ms;              /* how long the timed part of the probe took */
};

struct rank {
    enum rank_phase phase;
    struct proto_progress prog; /* its last report */
    int64_t report_ms;          /* when its last report reached its agent; 0: it never reported */
    int64_t released_ms;        /* when a barrier it was in last released (every rank there) */
    /* Its last sign of life in the store as its agent saw it (a put, a delete, a get's value,
     * a barrier arrival): progress "active". 0: none. */
    int64_t active_ms;
    int64_t first_ms, first_step; /* its first report, for the rate of steps */
    int code, signal;
    bool oom, killed;
    bool waiting;      /* in a barrier or a get with a timeout: waits on the others (its agent) */
    int64_t output_ms; /* when its last byte of output came; 0: none yet */
    char *last_line;   /* its last line of output, valid UTF-8 (PROTO_LINE_MAX bytes at most):
                        * allocated with its first, NULL before; 100,000 ranks' room up front
                        * was a sixth of a large job's leader */
    /* Its time per step as its agent made it (steptime.h): seconds, over how many steps
     * (0: not known yet). */
    double step_avg;
    int64_t step_avg_steps;
    double slower;       /* > 0: a straggler, this much slower than the median (0.38: 38%) */
    bool straggler_said; /* its straggler line is logged */
    json_t *stack;       /* a string: its stack as captured before a hang's teardown, or NULL */
    json_t *error;       /* the exception it recorded (TORCHELASTIC_ERROR_FILE), or NULL */
    /* Where its state came from in this generation: its last memory checkpoint load ("memory":
     * its node's own copy, "node N": the holder's; "" none) and the copy's step. */
    char loaded_from[16];
    int64_t loaded_step;
    bool regroup_ok; /* it said it can regroup in process (progress "regroup_ok") */
};

struct leader {
    uv_loop_t *loop;
    uv_tcp_t server;
    uv_timer_t tick;    /* deadlines, every TICK_MS */
    uv_timer_t hb;      /* heartbeats to agents, every hb_interval_ms */
    struct stall stall; /* the tick's lateness: time the loop did not run */
    int handles_open;
    const struct jobspec *spec;
    struct auth_key key;
    const char *job_dir;
    char advertise[64];
    int port, master_port;
    uint32_t max_frame;
    leader_done_fn done;
    void *arg;

    struct conn *conns;
    struct conn *qhead, *qtail; /* connections not yet admitted (ROLE_NEW), oldest first */
    uv_check_t accept_check;    /* after each poll: the next turn's accepts */
    int accepts;                /* accepted in this turn of the loop */
    bool accept_deferred;       /* a connection waits in the backlog for the next turn */
    int npending, nclients;
    int strangers_max;        /* pending slots beyond the nodes still to join (pending_max) */
    int agents_open;          /* nodes whose agent's link is open (nodes[i].conn) */
    struct refusals refusals; /* connections closed before the handshake, to summarise */
    struct auth_seen seen;    /* the nonces of the agents' one-frame hellos (auth.h) */
    struct node *nodes;       /* every agent's: the job's nnodes, then the spares */
    int nphys;                /* nnodes + spare_nodes */
    int *slot_node;           /* the node serving each of the job's nnodes slots */
    json_t *swaps;            /* each spare that took a failed node's place */
    char idle_why[160];       /* at the end: why spares stayed idle (spares.h); "": none */
    int joined;
    struct rank *ranks;
    struct hang_rank *hang_signs; /* the hang rule's view of the ranks, refilled each check */
    int world_size, exited;
    struct store *store;
    json_t *barriers;       /* name -> ranks arrived */
    struct hvd_server *hvd; /* horovod's HTTP rendezvous (hvd.h) */

    enum job_state state;
    const char *outcome;
    json_t *first_failure;
    int status;
    bool restartable; /* the failure is one a new generation may get past */
    /* The first failure was logged as a generation's, a restart to follow (fail()): if the
     * job ends on it after all, finish() logs it as the job's. */
    bool failure_pending;
    int failure_class; /* the first failure's class (FAILURE_*), -1: none given */
    bool abort_stacks; /* the abort asks agents to capture stacks first (a hang) */
    bool hang_warned;  /* the "--hang-timeout cannot apply" warning is out */
    int generation;    /* 0, then one more per restart (max_restarts) */
    json_t *failures;  /* the first failure of every earlier generation */
    int64_t t_start, t_joined, t_first_step, t_abort, t_finish;
    int64_t t_limit0;         /* the time limit's origin on the loop's clock: the job's start as its
                               * launcher said (JOB_START_ENV), else t_start */
    int64_t started_epoch_ms; /* that start as the launcher said it, ms since the epoch; 0:
                               * not said */
    int64_t t_generation;     /* when the current generation's ranks were assigned */
    /* Since when every running rank waits on the others, as the agents last said (0: not
     * so). A barrier's release or a key's put ends waits before the agents' next progress
     * says so; it resets this, and a deadlock is called only when the waits outlast the
     * hang timeout from here. */
    int64_t t_all_wait;
    int64_t t_straggler_check;
    bool stragglers_seen; /* a straggler was named: the leader's metrics file exists */
    bool metrics_warned;  /* "cannot write the leader's metrics" was said once */
    int64_t restart_at;   /* when the next generation starts (a restart's backoff); 0: none */
    /* The ranks met (together.h): a node saw a socket on MASTER_PORT, or a rank used the
     * store or a barrier. A job of several ranks that ends without is said to have trained
     * alone (alone: the line that says so and how to fix it; NULL: not said). */
    bool met;
    char *alone;
    /* Rank 0's last LOSS_HISTORY (step, loss) reports, oldest first from hist_next once full:
     * the loss's recent course for status (loss_history). */
    int64_t hist_step[LOSS_HISTORY];
    double hist_loss[LOSS_HISTORY];
    int hist_n, hist_next;
    int64_t t_preempt_poll;
    int64_t t_preempt; /* when the pre-timeout signal went out; 0: never */
    int preempt_sig;
    int requeues;         /* Slurm's requeues of the job before this segment */
    json_t *segments;     /* how each earlier segment ended (segments_load) */
    bool summary_writing; /* summary.json is being written off the loop (write_summary) */
    bool closing, done_called;
};

static inline int64_t now_ms(const struct leader *l)
{
    return (int64_t)uv_now(l->loop);
}

/* The node that runs rank r: every node runs nprocs ranks, so r's slot is r / nprocs, and the
 * node serving that slot runs it (a spare, once it took a failed node's place). */
static inline int node_of(const struct leader *l, int r)
{
    return l->slot_node[r / l->spec->nprocs];
}

/* --- leader_view.c ------------------------------------------------------------------------ */

struct jtext;
/* Rank r as gpurun status (detail false) and summary.json (true) show it, and summary.json's
 * line of it as text: the same members in the same order as the view's compact dump
 * (test_summary.c holds the two to the same text). */
json_t *leader_rank_view(const struct leader *l, int r, bool detail);
void leader_rank_line(const struct leader *l, int r, struct jtext *t);
/* Node i as the view shows it at time t, and summary.json's line of it, held to the same
 * text likewise. */
json_t *leader_node_view(const struct leader *l, int i, int64_t t);
void leader_node_line(const struct leader *l, int i, int64_t t, struct jtext *j);

/* Rank 0's loss at a step it had not reported before, for the view's loss_history. */
void leader_history_add(struct leader *l, int64_t step, double loss);
/* How each earlier segment of a requeued job ended, from its summary (an array). */
json_t *leader_segments_load(const char *job_dir, int requeues);
/* The job as gpurun status and summary.json see it (the header comment of leader_view.c). */
json_t *leader_job_view(struct leader *l, bool for_summary, bool detail);
/* summary.json's text (the job view, then its nodes and its ranks one line each), *n bytes;
 * NULL when out of memory. */
char *leader_summary_text(struct leader *l, size_t *n);

/* --- leader_ranks.c: the ranks' traffic ------------------------------------------------------ */

/* msg (borrowed) to every node's agent still linked and serving or spare. */
void leader_broadcast(struct leader *l, json_t *msg);
/* The store's callback (store.h): a waiting get's value, to the agent that asked. */
void leader_on_store_ready(void *owner, int64_t id, const char *key, const char *value, void *arg);
/* An agent's store request (put, get, add, delete) on behalf of a rank. */
void leader_do_kv(struct leader *l, struct conn *c, struct msg *m);
/* A node's ranks all arrived at a barrier: released once every node's are. */
void leader_do_barrier(struct leader *l, struct conn *c, struct msg *m);
/* An agent's progress batch: reports, waits, output and store signs, the ranks meeting. */
void leader_do_progress(struct leader *l, struct conn *c, struct msg *m);

/* --- leader_life.c: failures, restarts, the end ---------------------------------------------- */

/* The class of a rank's failed exit (jobspec.h's failure_class). */
int leader_exit_class(const struct msg *m);
/* Whether a failure of class cls (FAILURE_*) may restart the job (--restart-on). */
bool leader_restart_on(const struct leader *l, int cls);
/* Records the first failure; later ones are consequences and only logged. restartable: a
 * rank's own failure (exit, signal, hang), which a restart in the same
 * allocation may get past; a lost node, a cancel or a join timeout is not. */
void leader_fail(struct leader *l, int status, const char *outcome, bool restartable,
                 json_t *failure);
/* The nodes as the spares' rules see them, into nodes (room for nphys); returns the fleet. */
struct spares_fleet leader_fleet(const struct leader *l, struct spares_node *nodes);
/* One swap of a plan (spares.h) made: the node is fenced (its daemon, if still there, told
 * to end: it never serves this job again) and the spare takes its slot; logged with why,
 * and kept for status and summary.json as the generation's with its cause. */
void leader_swap(struct leader *l, const struct spares_swap *w, int generation, const char *why,
                 const char *cause);
/* The job's end: its outcome judged (the ranks met?), every agent told, summary.json. */
void leader_finish(struct leader *l);
/* Whether spares can take the place of every node the failure and the losses took from the
 * job (nodes serving it that are lost, and the node a FAILURE_NODE names): then a restart
 * may go on without them. Node 0 lost or named: never. */
bool leader_spares_cover(const struct leader *l, const json_t *failure);
/* horovod's rendezvous (a job that uses horovod only) learns the nodes of the job's slots
 * (its host list), and serves the addresses the job's nodes joined from and advertise: those
 * of every node that joined, spares included (one may take a slot). */
int leader_hvd_layout(struct leader *l);
/* Calls off what a failure may still start: a restart waiting for its backoff gives way to a
 * cancel, the time limit or a lost node, and the failure that ended the last generation
 * joins the earlier ones, so that the new cause becomes the job's record (fail()). */
void leader_abandon_restart(struct leader *l);
/* After a rank's end or a node's loss: the job ends, restarts (after its backoff), or goes on. */
void leader_check_end(struct leader *l);
/* Every node's assign for the generation: the nodes serving the job their ranks, the spares
 * none ("spare"). */
void leader_send_assign(struct leader *l);
/* Node `lost` was lost (failure: its record, owned from here): where the rule says so
 * (regroup.h), the job goes on as the next generation in process (a spare takes the node's
 * place and gets an assign, the other nodes a "regroup" and their ranks keep running), and
 * returns true; else false, failure untouched, and why not logged. */
bool leader_regroup(struct leader *l, int lost, json_t *failure);
/* The time limit's origin on the loop's clock (at t_start): the job's start as the launcher
 * said in JOB_START_ENV, up to a day back; else t_start. *epoch_ms gets that start in ms
 * since the epoch, or 0. */
int64_t leader_limit_origin(int64_t t_start, int64_t *epoch_ms);
/* Whether the job has reached its time limit (job.json's time_limit_s), give or take the
 * moment between the job's start and the leader's. */
bool leader_at_time_limit(const struct leader *l);
/* The cause a timeout's record gives (a static string). */
const char *leader_timeout_cause(const struct leader *l);
/* After "finish": the leader is done once summary.json is written and every agent hung up,
 * or the linger ran out. */
void leader_check_linger(struct leader *l);
/* Logs the summaries of refusals due at now (all of them when flush). */
void leader_log_refusals(struct leader *l, int64_t now, bool flush);
/* A failure's record (cause, rank, node, hostname, code, signal, tail); never NULL unless out
 * of memory, whatever bytes the texts hold. */
json_t *leader_failure_new(const char *cause, int rank, int node, const char *host, int code,
                           int sig, const char *tail);
/* failure with its class (FAILURE_*) added; returns failure. */
json_t *leader_classed(json_t *failure, int cls);
/* summary.json, written off the loop; the leader is done only once it is written
 * (leader_check_linger). */
void leader_write_summary(struct leader *l);
/* Frees the leader once it is closed and nothing of it is pending (handles, the summary). */
void leader_maybe_free(struct leader *l);
/* Frees what the leader owns, and the leader: at its end, or a start that failed part-way
 * (every field it has not set yet is zero). */
void leader_release(struct leader *l);

/* --- leader_join.c: admission and the join --------------------------------------------------- */

/* c, a new connection, joins the pending queue (the newest). */
void leader_pending_add(struct leader *l, struct conn *c);
/* c leaves the queue: admitted (agent or status client) or closed. */
void leader_pending_remove(struct leader *l, struct conn *c);
/* A frame of an agent's link probe: a round's first starts its clock, its last ends it, and
 * the best round is kept. */
void leader_do_probe(struct conn *c, const struct msg *m);
/* A node's join: checked, recorded, and once every node is in, the ranks assigned. */
void leader_do_join(struct leader *l, struct conn *c, struct msg *m);
/* Over the pending limit: closes the connection admit_victim() names (admit.h); an agent,
 * which sends its hello at once, is always younger than the silent strangers ahead of it. */
void leader_evict_pending(struct leader *l);

/* --- leader_watch.c: the tick's rules -------------------------------------------------------- */

/* The batch script's request (PREEMPT_FILE), taken once. */
void leader_poll_preempt(struct leader *l, int64_t now);
/* Stragglers: the rule is stragglers.h's; here each rank's average is gathered, a rank
 * newly named is logged once (rank_view's "slower", job_view's "stragglers" show them), and
 * the leader's metrics file is written. */
void leader_check_stragglers(struct leader *l, int64_t now);
/* Hangs (hang.h): a verdict worded and the job failed, every rank's stack captured first. */
void leader_check_hang(struct leader *l, int64_t now);
/* Every other node silent past the timeout together: from the leader's side that is its own
 * link (or host) far more likely than each of theirs, so the record says the leader lost them
 * all rather than blame the first in its list. The leader's node is node 0; its own agent
 * talks to it over the host's loopback and stays heard. It takes two others at least (with
 * one, either side may be at fault: the single loss says which side saw it), nodes not done
 * (a finished node's link is no one's concern), and a job over several hosts (--local's
 * nodes share one). "Together": when the first passes the timeout, every other has been
 * silent for all but two heartbeat periods of it, where heartbeats phase apart by up to one. */
void leader_check_all_lost(struct leader *l, int64_t now);

#endif
