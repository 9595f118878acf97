/* The gpurun wire protocol: every message of every link, in one place.
 *
 * Links
 *   agent  -> leader   TCP, authenticated (auth.h), one per node
 *   client -> leader   TCP, authenticated, for status queries
 *   rank   -> agent    Unix socket in a 0700 directory; the agent checks the peer's uid with
 *                      SO_PEERCRED and the first frame must be a valid "hello"
 *   agent  -> agent    TCP, authenticated: a memory link (daemon/memlink.h), from a node to
 *                      the one that keeps its memory checkpoints
 *   rank   -> leader   horovod's HTTP rendezvous (daemon/hvd.h) on the leader's address, port
 *                      hvd_port: NOT authenticated, as horovodrun's is; not this protocol
 *
 * Framing (frame.h): 4-byte big-endian length, then the payload. On TCP links the payload is
 * seq | JSON | tag (auth.h); on the Unix socket it is the JSON alone. The JSON is one object
 * whose "type" selects a row of the table below (lib/proto.c has it as data: each field's
 * key, kind and whether it may be left out), so a missing field, a field of the wrong type
 * or an unknown field is an error: the receiver answers an "error" frame, logs one line
 * and, for anything but a request it can refuse, closes the link. Lengths over the reader's limit
 * close the link before any allocation. Before its handshake is done a TCP link accepts only frames
 * of the handshake's size (68 bytes at most, PEER_HANDSHAKE_FRAME_MAX in daemon/peer.h) and buffers
 * one at a time, so a peer without the job key costs the leader about 1.3 KiB, and all of them
 * together (PENDING_CONNS_MAX) about 1.3 MiB, whatever they send; after it, the limit is the
 * daemon's max_frame (FRAME_MAX_DEFAULT, 1 MiB).
 *
 * Requests carry an "id" (an integer the sender chooses, echoed in the reply). Replies are
 * "ok", "kv_val" or "error".
 *
 * type          direction         fields
 * hello         rank->agent       rank, token (hex of the per-rank token)
 * join          agent->leader     node_rank, hostname, addr, nprocs, gpus, preflight (optional:
 *                                 the pre-flight check the node failed and its figure; absent
 *                                 or "": it passed), preflight_skipped (optional: a check
 *                                 asked for but not made, and why), mem_port
 *                                 (optional: its memory link's port, daemon/memlink.h)
 * assign        leader->agent     generation, world_size, rank_base, nnodes, master_addr,
 *                                 master_port (no node list: sent to every agent it would
 *                                 cost O(nodes^2) bytes; the status view has the nodes),
 *                                 hvd_port, hvd_host (optional: the leader's horovod
 *                                 rendezvous port and this node's HOROVOD_HOSTNAME), spare
 *                                 (optional, default false: the node is a hot spare of this
 *                                 generation and starts no rank; rank_base is then 0),
 *                                 mem_addr, mem_port, mem_node (optional: the memory link
 *                                 of the node that keeps this node's memory checkpoints)
 * hb            both ways         (none): a heartbeat, over a link that carried nothing
 *                                 else for hb_interval (any frame proves its sender alive)
 * kv_put        rank->agent->leader  id, key, value (a string; the rank library uses base64)
 * kv_get        rank->agent->leader  id, key, timeout_ms (0: answer at once; the reply waits
 *                                 until the key exists or the timeout passes)
 * kv_del        rank->agent->leader  id, key
 * barrier       rank->agent       id, name
 *               agent->leader     id, name, count (how many ranks of that node arrived)
 * barrier_done  leader->agent     name: every rank of the world has arrived
 * report        rank->agent       a progress record: the keys of PROGRESS_FIELDS below,
 *                                 step required, every other optional (absent is
 *                                 unknown, as a NaN is, which JSON cannot say)
 * progress      agent->leader     ranks [{rank, age_ms, and the rank's progress record}]
 *                                 (the numbers only where the rank gave them; age_ms: how
 *                                 long before this frame the rank's last report reached
 *                                 the agent, so that the leader's report times are exact
 *                                 whatever the batching); waiting, output, active, met,
 *                                 loaded, regroup_ok
 *                                 (optional: struct msg below says what each holds)
 * preempt       rank->agent       id: this rank handles the pre-timeout signal (the signal
 *                                 in its GPURUN_PREEMPT_SIGNAL): send it there. A rank that
 *                                 never asks never gets it (docs/design.md, section 4)
 * signal        leader->agent     signal: the pre-timeout signal came (the batch script's trap
 *                                 hands it to the leader through the job dir's "preempt"
 *                                 file): deliver it to the ranks that asked for it
 * finalize      rank->agent       id: the rank is done with the library
 * rank_exit     agent->leader     rank, code, signal, oom, killed (the agent's own teardown
 *                                 killed it: a consequence, not a failure), tail (last lines
 *                                 of its log), stack (optional: its stack as captured before
 *                                 a hang's teardown), error (optional: the exception the rank
 *                                 recorded in its TORCHELASTIC_ERROR_FILE, as an object
 *                                 {type, message, file, line, traceback})
 * abort         leader->agent     cause, stacks (optional, default false: capture every
 *                                 rank's stack before killing it); kill every rank now
 *               agent->leader     cause, status: the agent saw a failure no rank_exit says
 *                                 (a signal S to the daemon: 128+S)
 * finish        leader->agent     status: the job is over; exit with this status
 * status        client->leader    id
 * status_reply  leader->client    id, job (an object: see the leader's status view)
 * ok            reply             id
 * kv_val        reply             id, value
 * error         reply             id, code, msg  (code: "bad_request", "timeout", "too_large",
 *                                 "denied", "aborted", "not_found", "no_space", "bad_name",
 *                                 "unsupported")
 * probe         agent->leader     seq: before its join, an agent on another host than the
 *                                 leader's sends PROTO_PROBE_ROUNDS rounds of
 *                                 PROTO_PROBE_FRAMES of these (seq 0, 1, ...), each but a
 *                                 round's first followed in its frame by a NUL byte and a
 *                                 pad of PROTO_PROBE_PAD bytes, so that the leader times its
 *                                 link (pre-flight: the link throughput test); no reply. The
 *                                 pad is raw bytes, not JSON: a link is timed, not a parser
 *                                 (the one message with bytes after it: struct msg's
 *                                 tail_len)
 * mem_save      rank->agent       id, name, step: keep the file the rank wrote as its next
 *                                 memory checkpoint of name (proto_mem_path's ".tmp") as
 *                                 its copy; ok, or error no_space / bad_name / not_found /
 *                                 unsupported
 * mem_load      rank->agent       id, name: where the rank's copy of name is
 * mem_copy      agent->rank       id, path, step, size: the answer to mem_load (or error
 *                                 not_found)
 * mem_put       agent->agent      id, rank, name, step, size: on a memory link (daemon/
 *                                 memlink.h), a copy of rank's name follows in size bytes of
 *                                 sealed frames once the receiver says ok; its answer to
 *                                 mem_get
 * mem_get       agent->agent      id, rank, name: send me your copy of rank's name (mem_put,
 *                                 or error not_found)
 * regroup_ok    rank->agent       id: this rank can regroup in process (gr_regroup_enable):
 *                                 where its node stays and a spare takes a lost node's
 *                                 place, it waits in "regroup" instead of being restarted;
 *                                 ok. Its agent tells the leader (progress "regroup_ok")
 * regroup       rank->agent       id, generation: the rank's collectives failed in this
 *                                 generation; answered (regroup: id, generation) once the
 *                                 leader names a later one, or error aborted
 *               leader->agent     generation, mem_addr, mem_port, mem_node (optional, as in
 *                                 assign): the job goes on as this generation with this
 *                                 node's ranks running as they are (a spare took a lost
 *                                 node's place); answer the ranks' regroup requests
 */
#ifndef GPURUN_PROTO_H
#define GPURUN_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "errmsg.h"

/* Store limits: a key is a short name, a value holds an NCCL unique id (128 bytes) or an
 * address list many times over; the total bounds the leader's memory whatever ranks do. */
#define PROTO_KEY_MAX        256
#define PROTO_VALUE_MAX      (256 * 1024)
#define PROTO_STORE_MAX      (64 * 1024 * 1024)
#define PROTO_STORE_KEYS_MAX 1000000
#define PROTO_NAME_MAX       256
#define PROTO_TAIL_MAX       4096
/* A rank's last line of output in a progress message (the agent keeps 239 bytes of a line). */
#define PROTO_LINE_MAX       256
/* A captured stack: every thread of a Python rank, or a native backtrace, trimmed at its end. */
#define PROTO_STACK_MAX      (32 * 1024)
/* The link probe before a join: rounds of frames, the first of each empty (the round's
 * start), the others of a pad each; the leader times frames 1..N-1 of each round and keeps
 * the best round (a pause of either side's process is passing, a slow link is not). 288 KiB
 * in all: a few ms on a datacentre link (it is on the way of every job's start), 50 ms at
 * 50 Mbit/s; a round's 96 KiB take about 80 ms, longer than a pause (LINK_SLOW_MIN_MS), on a
 * link of 10 Mbit/s. */
#define PROTO_PROBE_ROUNDS   3
#define PROTO_PROBE_FRAMES   2
#define PROTO_PROBE_PAD      (96 * 1024)

enum msg_type {
    MSG_HELLO,
    MSG_JOIN,
    MSG_ASSIGN,
    MSG_HB,
    MSG_KV_PUT,
    MSG_KV_GET,
    MSG_KV_DEL,
    MSG_BARRIER,
    MSG_BARRIER_DONE,
    MSG_REPORT,
    MSG_PROGRESS,
    MSG_PREEMPT,
    MSG_SIGNAL,
    MSG_FINALIZE,
    MSG_RANK_EXIT,
    MSG_ABORT,
    MSG_FINISH,
    MSG_STATUS,
    MSG_STATUS_REPLY,
    MSG_OK,
    MSG_KV_VAL,
    MSG_ERROR,
    MSG_PROBE,
    MSG_MEM_SAVE,
    MSG_MEM_LOAD,
    MSG_MEM_COPY,
    MSG_MEM_PUT,
    MSG_MEM_GET,
    MSG_REGROUP_OK,
    MSG_REGROUP,
    MSG_TYPE_COUNT
};

/* A decoded message. Strings and objects are borrowed from root, or from text where the fast
 * path read it, and live until proto_msg_release(). Fields a type does not have stay
 * zero/NULL; optional ones too. */
/* A rank's progress: what it reports (gpurun.report, gr_report) and what every link carries
 * on: the report message, each entry of a progress message, each rank of the status view and
 * of summary.json. A number the rank did not give is NAN (left out of JSON: unknown, not 0);
 * total_steps 0: unknown. */
struct proto_progress {
    json_int_t step;        /* the step just done (required in a report) */
    json_int_t total_steps; /* the steps the run aims at, for the bar and the ETA */
    double loss, lr, tokens_per_s, grad_norm;
    double step_time; /* seconds of the step's own work, without waiting on the other ranks:
                       * the stragglers rule */
};

/* The values a progress field can have, as a rank's library checks them before sending (the
 * wire takes any number, and any integer not negative): a number out of its range is left
 * out of the report as unknown, an integer out of it is refused. */
enum proto_progress_range {
    PROGRESS_ANY,    /* any finite number: a loss, a learning rate */
    PROGRESS_NONNEG, /* 0 or more: a count, a rate, a norm */
    PROGRESS_POS,    /* more than 0: a duration, where 0 is unknown */
};

/* The progress record's keys, the one list: X(key, kind, required, member, range) for each,
 * kind 'I' (a json_int_t member, an integer on the wire) or 'F' (a double, a number),
 * required whether a report must have it. Made from it: the report's row and
 * proto_progress_pack/unpack (lib/proto.c), and the rank library's gr_report (lib/rank/gr.c),
 * which reads each field from gr.h's struct gr_progress by the same member name. The Python
 * package's report() keeps a copy that tests/python/test_gpurun.py holds to this one.
 *
 * A new field is a member of struct proto_progress and a line here; a member at the end of
 * struct gr_progress, unknown in GR_PROGRESS_INIT (lib/rank/gr.h); a keyword of report() and
 * a line in its copy (lib/rank/python/gpurun/__init__.py). Then status and summary.json carry
 * it, and client/view.c shows it where it should be seen. The compiler refuses a member of
 * either struct without its line, or of a type its kind does not say; the report tests
 * (test_gr.c, test_gpurun.py) fail until every key of the list reaches the wire. */
#define PROGRESS_FIELDS(X)                                                                         \
    X("step", 'I', true, step, PROGRESS_NONNEG)                                                    \
    X("loss", 'F', false, loss, PROGRESS_ANY)                                                      \
    X("lr", 'F', false, lr, PROGRESS_ANY)                                                          \
    X("tokens_per_s", 'F', false, tokens_per_s, PROGRESS_NONNEG)                                   \
    X("grad_norm", 'F', false, grad_norm, PROGRESS_NONNEG)                                         \
    X("total_steps", 'I', false, total_steps, PROGRESS_NONNEG)                                     \
    X("step_time", 'F', false, step_time, PROGRESS_POS)

struct msg {
    enum msg_type type;
    json_t *root;     /* the JSON tree; NULL where the fast path read it: proto_msg_json */
    char *text;       /* the fast path's block (owned), or NULL */
    size_t text_len;  /* the message's length in it */
    size_t value_len; /* the length of value: a JSON string may hold a NUL */
    size_t tail_len;  /* probe: the bytes after the message's NUL (its pad, not read) */
    json_int_t id;
    const char *key;   /* kv_*: key; barrier, barrier_done: name; error: code */
    const char *value; /* kv_put, kv_val: value; hello: token; error: msg; abort: cause;
                          rank_exit: tail */
    const char *stack; /* rank_exit: the captured stack, or NULL */
    const char *hostname, *addr, *gpus, *master_addr;
    const char *hvd_host;          /* assign: HOROVOD_HOSTNAME of the node, or NULL */
    const char *preflight;         /* join: the failed pre-flight check, or NULL */
    const char *preflight_skipped; /* join: a pre-flight check not made and why, or NULL */
    int node_rank, nprocs, rank, generation, world_size, rank_base, nnodes, master_port;
    int hvd_port; /* assign: horovod's rendezvous port, or 0 */
    int count, code, signal, oom, killed, status, stacks;
    int spare; /* assign: the node is a hot spare of the generation, with no rank */
    /* kv_put: answered only when refused (an agent's forward: the agent told its rank at
     * once, as torch's TCPStore does not wait for its server's word on a set either) */
    int quiet;
    /* join: the port of the node's memory link (daemon/memlink.h), 0: none; assign: the
     * memory link of the node that keeps this node's copies (mem_addr, mem_port; its node
     * rank mem_node), absent: none */
    const char *mem_addr;
    int mem_port, mem_node;
    int met; /* progress: a socket on MASTER_PORT showed on the node: the ranks met (sent
              * once, true; absent: not yet) */
    json_int_t timeout_ms;
    /* mem_save, mem_copy: the step of a memory checkpoint (daemon/memckpt.h); mem_copy: its
     * size in bytes (its path: value; a mem_* name: key) */
    json_int_t step, size;
    struct proto_progress progress; /* report */
    json_t *array;                  /* progress: ranks; status_reply: job (an object) */
    json_t *error;                  /* rank_exit: the recorded exception (an object), or NULL */
    /* progress: the node's ranks now waiting on the others (in a barrier, or for a key with
     * a timeout), an array of rank numbers, the whole set, sent when it changed; or NULL */
    json_t *waiting;
    /* progress: the node's ranks whose output moved since the last flush, an array of
     * {rank, line, age_ms}: the last line (valid UTF-8, at most PROTO_LINE_MAX bytes) and how
     * long ago any byte came; or NULL */
    json_t *output;
    /* progress: the node's ranks active in the store since the last flush, an array of
     * {rank, age_ms}: how long ago the rank's last put, delete, get answered with a value or
     * arrival at a barrier came; or NULL */
    json_t *active;
    /* progress: the node's ranks that took a memory checkpoint since the last flush, an
     * array of {rank, from, step}: from "memory" (the node's own) or "node N" (the holder of
     * its copies), the copy's step; or NULL */
    json_t *loaded;
    /* progress: the node's ranks that said they can regroup in process since the last flush
     * (regroup_ok), an array of rank numbers; or NULL */
    json_t *regroup_ok;
};

/* Where a decode failed and why, for one log line and one error frame: the text, and the id
 * that the error frame answers, which a plain struct errmsg has no room for. */
struct proto_error {
    struct errmsg why;
    json_int_t id; /* the message's integer "id" when it had one, else 0: for the reply */
};

/* Decodes one JSON payload of len bytes. Returns 0 and fills m (release it with
 * proto_msg_release), or -EBADMSG with err->why saying what is wrong ("not JSON at byte 7",
 * "unknown type 'x'", "'join': 'nprocs' must be an integer", a key over PROTO_KEY_MAX...). */
int proto_decode(const uint8_t *buf, size_t len, struct msg *m, struct proto_error *err);

/* proto_decode without the fast path: every message through a jansson tree. For the tests,
 * which hold the two paths to the same result. */
int proto_decode_tree(const uint8_t *buf, size_t len, struct msg *m, struct proto_error *err);

/* Whether a and b, two decoded messages, hold the same type and field values. */
bool proto_msg_same(const struct msg *a, const struct msg *b);

/* Drops the reference decode took; m may be decoded into again. */
void proto_msg_release(struct msg *m);

/* The message as a JSON object (borrowed, until proto_msg_release): the tree it was read
 * from, or for a message the fast path read, parsed now. NULL when out of memory. */
json_t *proto_msg_json(struct msg *m);

/* Messages longer than this always go through jansson (the fast path copies a message
 * twice). */
#define PROTO_FAST_MAX 4096

/* The wire name of a type ("kv_put"), or "?" for an out-of-range value. */
const char *proto_type_name(enum msg_type t);

/* Memory checkpoints (daemon/memckpt.h): a state's name (letters, digits, '_', '-' and '.',
 * not starting with '.', at most PROTO_MEM_NAME_MAX bytes) and the files a rank and its
 * daemon agree on in the node's directory (PROTO_MEM_DIR_ENV): "DIR/rRANK.NAME" the copy,
 * and with ".tmp" the rank's next one being written. */
#define PROTO_MEM_NAME_MAX 64
#define PROTO_MEM_DIR_ENV  "GPURUN_MEM_DIR"
bool proto_mem_name_ok(const char *name);
/* The directory of node's copies in job job_id, into buf (n bytes): in /dev/shm (in TMPDIR
 * where /dev/shm cannot be written), of the job and node, so that the nodes of gpurun --local
 * never share one. 0, -EINVAL (a job id with a '/', a node below 0) or -ENAMETOOLONG. */
int proto_mem_dir(char *buf, size_t n, const char *job_id, int node);
/* The path into buf (n bytes): 0, -EINVAL (a bad name or rank), -ENAMETOOLONG. */
int proto_mem_path(char *buf, size_t n, const char *dir, int rank, const char *name, bool tmp);

/* Sets key to v in object o when v is finite; one that is not (NAN: not known) is left out,
 * as JSON has no NaN. */
void proto_set_number(json_t *o, const char *key, double v);

/* Whether v is a value of range r (finite, and for PROGRESS_NONNEG 0 or more, for
 * PROGRESS_POS more than 0). */
bool proto_progress_in_range(double v, enum proto_progress_range r);

/* A record with nothing known: step 0, total_steps 0, every number NAN. */
void proto_progress_init(struct proto_progress *p);

/* Sets p's fields in object o: step and total_steps, and each number that is known. Returns
 * 0, or -ENOMEM (o may then hold some of them). */
int proto_progress_pack(json_t *o, const struct proto_progress *p);
/* The same members as text: ,"key":value for each, as proto_progress_pack's dump writes them
 * (lib/jtext.h). */
struct jtext;
void proto_progress_text(struct jtext *t, const struct proto_progress *p);

/* The store's replies as text, byte for byte what proto_pack()'s tree dumps (json_dumpb,
 * JSON_COMPACT) to: {"type":"ok","id":ID} and {"type":"kv_val","id":ID,"value":VALUE}
 * (value: a C string of valid UTF-8, as a decoded kv_put holds). A large job's store round
 * is two of these a rank. */
void proto_ok_text(struct jtext *t, json_int_t id);
void proto_kv_val_text(struct jtext *t, json_int_t id, const char *value);

/* An assign's fields (the names of struct msg's; strings borrowed, valid UTF-8), and its
 * text as proto_pack() of them in this order dumps it: one for each of a large job's 12,500
 * nodes, where a tree of 13 members to build, dump and free was 4% of the leader's start. */
struct proto_assign {
    int generation, world_size, rank_base, nnodes;
    const char *master_addr;
    int master_port, hvd_port;
    const char *hvd_host;
    bool spare;
    const char *mem_addr;
    int mem_port, mem_node;
};
void proto_assign_text(struct jtext *t, const struct proto_assign *a);

/* Reads p's fields from object o (a progress entry, a status view's rank): each one present
 * must have its type (an integer for step and total_steps, not negative; a number for the
 * others); one absent is unknown (NAN, or 0), step too unless it is required (required_step).
 * Other keys are the caller's. Returns 0, or -EBADMSG with err naming the field. */
int proto_progress_unpack(const json_t *o, bool required_step, struct proto_progress *p,
                          struct errmsg *err);

/* Builds a message: json_pack() with fmt, then checks the result against the table row of
 * its "type", so that nothing leaves a process that the receiver would refuse. Returns a new
 * object (caller decrefs) or NULL when fmt's arguments do not make a valid message. */
json_t *proto_pack(const char *fmt, ...);

#endif
