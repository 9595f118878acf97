/* Tests of the real rendezvousd against bad input: a job dir in the test's scratch dir, the
 * daemon started from the build the runner belongs to (the ASan runner starts the ASan
 * daemon), and a client (tests/helpers/wire.h) that attacks its leader port: wrong keys,
 * replayed and forged frames, bad lengths, bad JSON, oversized store entries, floods and bad
 * joins. Every test ends by stopping the daemon with SIGTERM and checking that it exited by
 * itself, and that its stderr holds no sanitizer report. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
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

#include "auth.h"
#include "fsutil.h"
#include "jobspec.h"
#include "proto.h"
#include "test.h"
#include "helpers/wire.h"
#include "banned.h"

/* How long a test waits for something the daemon does at once (a reply, a close, a log
 * line): generous for a loaded two-core machine under ASan, never reached when it works. */
#define PROMPT_MS            3000
/* The leader's handshake timeout (daemon/leader.c, HANDSHAKE_TIMEOUT_MS) and its tick. */
#define HANDSHAKE_TIMEOUT_MS 5000
#define TICK_MS              50
/* The job's status when an agent's link is lost: the daemon's own failure (125), as the
 * fenced node itself exits. */
#define STATUS_NODE_LOST     125

struct daemon {
    pid_t pid;
    char dir[PATH_MAX];
    char err_path[PATH_MAX + 16];
    char host[64];
    int port;
    struct auth_key key;
};

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* The whole file at path as a new string ("" when it does not exist). */
static char *slurp(const char *path)
{
    char *text = NULL;
    size_t len;

    if (fs_read_all(path, 64 << 20, &text, &len) < 0)
        return strdup("");
    return text;
}

/* Lines of text that contain a and (when not NULL) b. */
static int count_lines(const char *text, const char *a, const char *b)
{
    int n = 0;

    while (*text) {
        size_t len = strcspn(text, "\n");
        char *line = strndup(text, len);
        if (line && strstr(line, a) && (!b || strstr(line, b)))
            n++;
        free(line);
        text += len + (text[len] == '\n');
    }
    return n;
}

/* Waits until the daemon's stderr has at least want lines with a and b; returns how many. */
static int wait_log(const struct daemon *d, const char *a, const char *b, int want, int timeout_ms)
{
    int64_t deadline = mono_ms() + timeout_ms;
    int n;

    for (;;) {
        char *text = slurp(d->err_path);
        n = count_lines(text, a, b);
        free(text);
        if (n >= want || mono_ms() >= deadline)
            return n;
        sleep_ms(20);
    }
}

/* Checks that the daemon's stderr comes to have exactly want lines with a and b; shows the
 * whole log when it does not. */
static void expect_log_at(const char *file, int line, const struct daemon *d, const char *a,
                          const char *b, int want)
{
    int n = wait_log(d, a, b, want, PROMPT_MS);
    char *text;

    /* A line too many may still be on its way: look again a little later. */
    if (n == want) {
        sleep_ms(50);
        n = wait_log(d, a, b, want, 0);
    }
    if (n == want)
        return;
    text = slurp(d->err_path);
    test_fail(file, line, "rendezvousd's log has %d lines with \"%s\"%s%s%s, not %d:\n%s", n, a,
              b ? " and \"" : "", b ? b : "", b ? "\"" : "", want, text);
}
#define expect_log(d, a, b, want) expect_log_at(__FILE__, __LINE__, (d), (a), (b), (want))

/* Checks that the daemon logs the refusal of the connection named name in one line, which
 * says why. */
static void expect_one_line_at(const char *file, int line, const struct daemon *d, const char *name,
                               const char *why)
{
    char *text;

    expect_log_at(file, line, d, name, why, 1);
    text = slurp(d->err_path);
    if (count_lines(text, name, NULL) != 1)
        test_fail(file, line, "rendezvousd's log has %d lines about %s, not 1:\n%s",
                  count_lines(text, name, NULL), name, text);
    free(text);
}
#define expect_one_line(d, name, why) expect_one_line_at(__FILE__, __LINE__, (d), (name), (why))

/* In text, the refusals for why that summary lines account for ("refused N connections from
 * '127.0.0.1' in T s: WHY": N includes the one logged at once), and in *lines how many lines
 * mention why at all. */
static long summarised(const char *text, const char *why, int *lines)
{
    long total = 0;

    *lines = 0;
    while (*text) {
        size_t len = strcspn(text, "\n");
        char *line = strndup(text, len);
        const char *r = line ? strstr(line, "warn: refused ") : NULL;
        long n;
        if (line && strstr(line, why)) {
            ++*lines;
            if (r && sscanf(r, "warn: refused %ld connection", &n) == 1)
                total += n;
        }
        free(line);
        text += len + (text[len] == '\n');
    }
    return total;
}

/* Waits up to timeout_ms for the daemon's summaries of refusals for why to add up to want;
 * returns what they add up to. */
static long refused_count(const struct daemon *d, const char *why, long want, int timeout_ms)
{
    int64_t deadline = mono_ms() + timeout_ms;
    int lines;
    long n;

    for (;;) {
        char *text = slurp(d->err_path);
        n = summarised(text, why, &lines);
        free(text);
        if (n >= want || mono_ms() >= deadline)
            return n;
        sleep_ms(50);
    }
}

/* "127.0.0.1:PORT", the name the leader gives a connection in its log lines. */
static const char *peer_name(const struct wire *w)
{
    static char name[64];
    snprintf(name, sizeof(name), "'127.0.0.1:%d'", wire_local_port(w));
    return name;
}

/* Writes the job dir: key, and job.json for two nodes of one rank each that sleep, with
 * timeouts long enough that nothing but the test ends the job. */
static void make_job_dir(struct daemon *d, int nnodes)
{
    char path[PATH_MAX + 16];
    char *argv[] = {"sleep", "60"};
    struct jobspec spec;

    snprintf(d->dir, sizeof(d->dir), "%s/job", test_tmpdir());
    CHECK_EQ(mkdir(d->dir, 0700), 0);
    CHECK_EQ(auth_key_generate(&d->key), 0);
    snprintf(path, sizeof(path), "%s/key", d->dir);
    CHECK_EQ(auth_key_write(path, &d->key), 0);
    jobspec_init(&spec);
    spec.job_id = strdup("test-daemon-job");
    CHECK(spec.job_id != NULL);
    spec.nnodes = nnodes;
    spec.nprocs = 1;
    CHECK_EQ(jobspec_set_argv(&spec, 2, argv), 0);
    spec.join_timeout_ms = 60000;
    spec.hb_interval_ms = 1000;
    spec.hb_timeout_ms = 60000;
    spec.kill_grace_ms = 500;
    spec.loopback = true;
    snprintf(path, sizeof(path), "%s/job.json", d->dir);
    CHECK_EQ(jobspec_save(&spec, path), 0);
    jobspec_release(&spec);
}

/* Reads host and port from endpoint.json once the leader wrote it. */
static void read_endpoint(struct daemon *d)
{
    char path[PATH_MAX + 16];
    int64_t deadline = mono_ms() + 10000;
    json_t *ep = NULL;
    const char *host = NULL;
    json_int_t pid = 0;

    snprintf(path, sizeof(path), "%s/endpoint.json", d->dir);
    while (!ep) {
        int st;
        if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
            char *err = slurp(d->err_path);
            test_fail(__FILE__, __LINE__,
                      "rendezvousd exited (status 0x%x) before it listened:\n%s", st, err);
        }
        ep = json_load_file(path, 0, NULL);
        if (!ep) {
            CHECK(mono_ms() < deadline);
            sleep_ms(10);
        }
    }
    CHECK_EQ(json_unpack(ep, "{s:s, s:i, s:I}", "host", &host, "port", &d->port, "pid", &pid), 0);
    CHECK_EQ(pid, d->pid);
    CHECK(d->port > 0 && d->port < 65536);
    snprintf(d->host, sizeof(d->host), "%s", host);
    json_decref(ep);
}

/* Starts rendezvousd as node 0 on a fresh job dir of nnodes nodes; leader_only: with
 * --leader-only, so that the test plays every agent itself; nofile: its descriptor limits, or
 * NULL for the test's own. Its stderr goes to DIR/daemon.err. Returns without waiting for it
 * to listen. */
static void daemon_spawn(struct daemon *d, bool leader_only, int nnodes,
                         const struct rlimit *nofile)
{
    const char *prog = test_build_path("rendezvousd");
    char out_path[PATH_MAX + 16];

    memset(d, 0, sizeof(*d));
    if (access(prog, X_OK) < 0)
        test_fail(__FILE__, __LINE__, "cannot run '%s': %s (build it first)", prog,
                  strerror(errno));
    make_job_dir(d, nnodes);
    snprintf(d->err_path, sizeof(d->err_path), "%s/daemon.err", d->dir);
    snprintf(out_path, sizeof(out_path), "%s/daemon.out", d->dir);
    d->pid = fork();
    CHECK(d->pid >= 0);
    if (d->pid == 0) {
        int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        int err = open(d->err_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (out < 0 || err < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0)
            _exit(126);
        if (nofile && setrlimit(RLIMIT_NOFILE, nofile) < 0)
            _exit(126);
        if (leader_only)
            execl(prog, "rendezvousd", "--job-dir", d->dir, "--node-rank", "0", "--leader-only",
                  (char *)NULL);
        else
            execl(prog, "rendezvousd", "--job-dir", d->dir, "--node-rank", "0", (char *)NULL);
        _exit(127);
    }
}

/* Starts rendezvousd as node 0 of a 2-node job and waits until it listens (daemon_spawn). */
static void daemon_start(struct daemon *d, bool leader_only)
{
    daemon_spawn(d, leader_only, 2, NULL);
    read_endpoint(d);
}

/* Fails the test, with the daemon's log, when the daemon has exited. */
static void check_alive_at(const char *file, int line, const struct daemon *d)
{
    int st;

    if (waitpid(d->pid, &st, WNOHANG) == d->pid)
        test_fail(file, line, "rendezvousd exited (status 0x%x):\n%s", st, slurp(d->err_path));
}
#define check_alive(d) check_alive_at(__FILE__, __LINE__, (d))

/* Stops the daemon with SIGTERM and checks how it went: it exits by itself within a few
 * seconds, not by a signal or a crash status, and its stderr holds no sanitizer report.
 * Returns its exit status. */
static int daemon_stop(struct daemon *d)
{
    int64_t deadline;
    char *err;
    int st = 0;
    pid_t got = 0;

    CHECK_EQ(kill(d->pid, SIGTERM), 0);
    /* Agent teardown is kill_grace (500 ms) plus the leader's slack for late reports. */
    deadline = mono_ms() + 8000;
    while ((got = waitpid(d->pid, &st, WNOHANG)) == 0 && mono_ms() < deadline)
        sleep_ms(10);
    if (got == 0) {
        kill(d->pid, SIGKILL);
        waitpid(d->pid, &st, 0);
        err = slurp(d->err_path);
        test_fail(__FILE__, __LINE__, "rendezvousd did not exit within 8 s of SIGTERM:\n%s", err);
    }
    CHECK_EQ(got, d->pid);
    err = slurp(d->err_path);
    if (!WIFEXITED(st))
        test_fail(__FILE__, __LINE__, "rendezvousd was killed by signal %d:\n%s", WTERMSIG(st),
                  err);
    if (WEXITSTATUS(st) == 128 + SIGSEGV || WEXITSTATUS(st) == 128 + SIGABRT ||
        WEXITSTATUS(st) == 128 + SIGBUS || strstr(err, "ERROR: AddressSanitizer") ||
        strstr(err, "LeakSanitizer") || strstr(err, "runtime error:"))
        test_fail(__FILE__, __LINE__, "rendezvousd crashed (exit status %d):\n%s", WEXITSTATUS(st),
                  err);
    free(err);
    d->pid = -1;
    return WEXITSTATUS(st);
}

/* Stops a daemon whose job never started (no agent or no ranks): SIGTERM cancels the job,
 * whose status is 128+SIGTERM. */
static void daemon_stop_cancelled(struct daemon *d)
{
    CHECK_EQ(daemon_stop(d), 128 + SIGTERM);
}

/* --- client helpers ------------------------------------------------------------------------ */

static void client_open(const struct daemon *d, struct wire *w)
{
    CHECK_EQ(wire_connect(w, d->host, d->port), 0);
    CHECK_EQ(wire_handshake(w, &d->key, PROMPT_MS), 0);
}

static void send_json(struct wire *w, const char *json)
{
    CHECK_EQ(wire_send_json(w, json), 0);
}

/* The next message; fails the test on a close, a timeout or a bad frame. */
static json_t *recv_msg(struct wire *w)
{
    json_t *m = NULL;
    int ret = wire_recv_json(w, PROMPT_MS, &m);

    if (ret < 0)
        test_fail(__FILE__, __LINE__, "no message from the daemon: %s", strerror(-ret));
    return m;
}

static const char *type_of(json_t *m)
{
    const char *t = json_string_value(json_object_get(m, "type"));
    return t ? t : "(none)";
}

/* Sends a status request and checks the reply's shape; returns its "job" (new reference). */
static json_t *status(struct wire *w, int id)
{
    char req[64];
    json_t *m, *job = NULL;
    json_int_t rid = -1;

    snprintf(req, sizeof(req), "{\"type\":\"status\",\"id\":%d}", id);
    send_json(w, req);
    m = recv_msg(w);
    CHECK_STR(type_of(m), "status_reply");
    CHECK_EQ(json_unpack(m, "{s:I, s:O}", "id", &rid, "job", &job), 0);
    CHECK_EQ(rid, id);
    CHECK(json_is_object(job));
    json_decref(m);
    return job;
}

/* Expects an error frame answering request id (0 for a message that could not be read) with
 * code and a msg that contains what. */
static void expect_error(struct wire *w, json_int_t want_id, const char *code, const char *what)
{
    json_t *m = recv_msg(w);
    const char *c = NULL, *msg = NULL;
    json_int_t id;

    if (strcmp(type_of(m), "error")) {
        char *text = json_dumps(m, JSON_COMPACT);
        test_fail(__FILE__, __LINE__, "expected an error frame, got %s", text);
    }
    CHECK_EQ(json_unpack(m, "{s:I, s:s, s:s}", "id", &id, "code", &c, "msg", &msg), 0);
    CHECK_EQ(id, want_id);
    CHECK_STR(c, code);
    CHECK_CONTAINS(msg, what);
    json_decref(m);
}

/* The connection is closed by the daemon without a message first. */
static void expect_closed_silently(struct wire *w)
{
    json_t *m = NULL;
    int ret = wire_recv_json(w, PROMPT_MS, &m);

    if (ret == 0) {
        char *text = json_dumps(m, JSON_COMPACT);
        test_fail(__FILE__, __LINE__, "expected a close, got %s", text);
    }
    CHECK_EQ(ret, -ECONNRESET);
}

static void expect_closed(struct wire *w)
{
    CHECK_EQ(wire_wait_closed(w, PROMPT_MS), 0);
}

/* A status client still gets served: the daemon outlived whatever came before. */
static void check_serving(const struct daemon *d)
{
    struct wire w;
    json_t *job;

    check_alive(d);
    client_open(d, &w);
    job = status(&w, 99);
    CHECK_STR(json_string_value(json_object_get(job, "job_id")), "test-daemon-job");
    json_decref(job);
    wire_close(&w);
}

/* Sends a join as node with nprocs ranks. */
static void send_join(struct wire *w, int node, int nprocs)
{
    char req[256];

    snprintf(req, sizeof(req),
             "{\"type\":\"join\",\"node_rank\":%d,\"hostname\":\"fake%d\",\"addr\":\"127.0.0.1\","
             "\"nprocs\":%d,\"gpus\":\"\"}",
             node, node, nprocs);
    send_json(w, req);
}

/* Waits until node k shows as joined in the status view (the daemon's own agent). */
static void wait_node_joined(const struct daemon *d, int node)
{
    int64_t deadline = mono_ms() + 10000;
    struct wire w;

    client_open(d, &w);
    for (int id = 1;; id++) {
        json_t *job = status(&w, id);
        json_t *n = json_array_get(json_object_get(job, "nodes"), (size_t)node);
        const char *state = json_string_value(json_object_get(n, "state"));
        bool joined = state && !strcmp(state, "joined");
        json_decref(job);
        if (joined)
            break;
        CHECK(mono_ms() < deadline);
        sleep_ms(20);
    }
    wire_close(&w);
}

/* --- status -------------------------------------------------------------------------------- */

TEST(daemon_status_reply_describes_the_job)
{
    struct daemon d;
    struct wire c, agent;
    json_t *job, *nodes, *ranks, *m;
    const char *state = NULL, *job_id = NULL;
    int world = -1, nnodes = -1;

    daemon_start(&d, false);
    /* Node 0's own agent joins; node 1 is missing, so the job is still joining. */
    wait_node_joined(&d, 0);
    client_open(&d, &c);
    job = status(&c, 1);
    CHECK_EQ(json_unpack(job, "{s:s, s:s, s:i, s:i, s:o, s:o}", "job_id", &job_id, "state", &state,
                         "world_size", &world, "nnodes", &nnodes, "nodes", &nodes, "ranks", &ranks),
             0);
    CHECK_STR(job_id, "test-daemon-job");
    CHECK_STR(state, "joining");
    CHECK_EQ(world, 0);
    CHECK_EQ(nnodes, 2);
    CHECK_EQ(json_array_size(nodes), 2);
    CHECK_EQ(json_array_size(ranks), 0);
    CHECK_EQ(json_integer_value(json_object_get(json_array_get(nodes, 0), "node")), 0);
    CHECK_EQ(json_integer_value(json_object_get(json_array_get(nodes, 0), "nprocs")), 1);
    CHECK_STR(json_string_value(json_object_get(json_array_get(nodes, 1), "state")), "pending");
    json_decref(job);

    /* The test joins as node 1: the job starts. */
    client_open(&d, &agent);
    send_join(&agent, 1, 1);
    m = recv_msg(&agent);
    CHECK_STR(type_of(m), "assign");
    CHECK_EQ(json_integer_value(json_object_get(m, "world_size")), 2);
    CHECK_EQ(json_integer_value(json_object_get(m, "rank_base")), 1);
    CHECK_EQ(json_integer_value(json_object_get(m, "nnodes")), 2);
    CHECK_STR(json_string_value(json_object_get(m, "master_addr")), d.host);
    json_decref(m);

    /* The same status link, asked again, sees the running job and its two ranks. */
    job = status(&c, 2);
    CHECK_STR(json_string_value(json_object_get(job, "state")), "running");
    CHECK_EQ(json_integer_value(json_object_get(job, "world_size")), 2);
    ranks = json_object_get(job, "ranks");
    CHECK_EQ(json_array_size(ranks), 2);
    for (int r = 0; r < 2; r++) {
        json_t *e = json_array_get(ranks, (size_t)r);
        CHECK_EQ(json_integer_value(json_object_get(e, "rank")), r);
        CHECK_EQ(json_integer_value(json_object_get(e, "node")), r);
        CHECK_STR(json_string_value(json_object_get(e, "phase")), "running");
    }
    CHECK_STR(json_string_value(
                  json_object_get(json_array_get(json_object_get(job, "nodes"), 1), "hostname")),
              "fake1");
    json_decref(job);
    wire_close(&c);
    /* Node 1 hangs up: the job fails on the lost node, and the daemon tears its rank down. */
    wire_close(&agent);
    expect_log(&d, "node 1 ('fake1') lost", NULL, 1);
    CHECK_EQ(daemon_stop(&d), STATUS_NODE_LOST);
}

/* A job that ends while SIGTERMs keep coming (a cancel racing the end): rendezvousd always
 * exits with a status of its own, never by the signal's default action in the moment between
 * closing its signal watchers and exiting (a run under load once saw "killed by signal 15"). */
TEST(daemon_signals_at_its_end_never_kill_it)
{
    for (int round = 0; round < 5; round++) {
        struct daemon d;
        struct wire agent;
        json_t *m;
        pid_t flood;
        int st = 0;

        daemon_start(&d, false);
        wait_node_joined(&d, 0);
        client_open(&d, &agent);
        send_join(&agent, 1, 1);
        m = recv_msg(&agent);
        CHECK_STR(type_of(m), "assign");
        json_decref(m);
        /* From half a second on, a SIGTERM every 200 us until the daemon is gone. */
        flood = fork();
        CHECK(flood >= 0);
        if (flood == 0) {
            /* The node's connection is the parent's to close. */
            close(agent.fd);
            sleep_ms(500 - 40 * round);
            while (kill(d.pid, SIGTERM) == 0)
                usleep(200);
            _exit(0);
        }
        sleep_ms(480);
        wire_close(&agent);
        CHECK_EQ(waitpid(d.pid, &st, 0), d.pid);
        kill(flood, SIGKILL);
        waitpid(flood, NULL, 0);
        if (!WIFEXITED(st))
            test_fail(__FILE__, __LINE__, "round %d: rendezvousd was killed by signal %d:\n%s",
                      round, WTERMSIG(st), slurp(d.err_path));
        d.pid = -1;
        /* The next round's job dir takes the same name. */
        char old[PATH_MAX + 16];
        snprintf(old, sizeof(old), "%s.%d", d.dir, round);
        CHECK_EQ(rename(d.dir, old), 0);
    }
}

/* --- authentication ------------------------------------------------------------------------ */

TEST(daemon_wrong_key_refused)
{
    struct daemon d;
    struct auth_key other;
    struct wire w;
    char name[64];

    daemon_start(&d, true);
    CHECK_EQ(auth_key_generate(&other), 0);

    /* A client with another key that answers the challenge anyway. */
    CHECK_EQ(wire_connect(&w, d.host, d.port), 0);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    CHECK_EQ(wire_handshake_forged(&w, &other, PROMPT_MS), 0);
    /* Whatever it sends next is never parsed: no reply, the link is closed. */
    wire_send_json(&w, "{\"type\":\"status\",\"id\":1}");
    expect_closed_silently(&w);
    wire_close(&w);
    expect_one_line(&d, name, "wrong job key");

    /* An honest client with another key finds the server does not prove the job's key. */
    CHECK_EQ(wire_connect(&w, d.host, d.port), 0);
    CHECK_EQ(wire_handshake(&w, &other, PROMPT_MS), -EACCES);
    wire_close(&w);

    check_serving(&d);
    daemon_stop_cancelled(&d);
}

TEST(daemon_replayed_frame_refused)
{
    struct daemon d;
    struct wire w;
    uint8_t *frame, *second;
    size_t len, len2;
    char name[64];
    json_t *m;

    daemon_start(&d, true);
    client_open(&d, &w);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    CHECK_EQ(wire_seal(&w, NULL, "{\"type\":\"status\",\"id\":1}", 24, &frame, &len), 0);
    CHECK_EQ(wire_send_raw(&w, frame, len), 0);
    m = recv_msg(&w);
    CHECK_STR(type_of(m), "status_reply");
    json_decref(m);
    json_decref(status(&w, 2));
    /* The first frame again, byte for byte: its seq is old. */
    CHECK_EQ(wire_send_raw(&w, frame, len), 0);
    expect_closed_silently(&w);
    wire_close(&w);
    free(frame);
    expect_one_line(&d, name, "replayed");

    /* Reordered: the second frame sent before the first. */
    client_open(&d, &w);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    CHECK_EQ(wire_seal(&w, NULL, "{\"type\":\"status\",\"id\":1}", 24, &frame, &len), 0);
    CHECK_EQ(wire_seal(&w, NULL, "{\"type\":\"status\",\"id\":2}", 24, &second, &len2), 0);
    CHECK_EQ(wire_send_raw(&w, second, len2), 0);
    expect_closed_silently(&w);
    wire_close(&w);
    free(frame);
    free(second);
    expect_one_line(&d, name, "replayed or reordered");

    check_serving(&d);
    daemon_stop_cancelled(&d);
}

TEST(daemon_frame_of_another_key_refused)
{
    struct daemon d;
    struct auth_key other;
    struct auth_session forged;
    struct wire w, w2;
    uint8_t *frame;
    size_t len;
    char name[64];
    json_t *job;

    daemon_start(&d, true);
    CHECK_EQ(auth_key_generate(&other), 0);

    /* After an honest handshake, a frame sealed with keys derived from another job's key. */
    client_open(&d, &w);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    job = status(&w, 1);
    json_decref(job);
    wire_session_for_key(&w, &other, &forged);
    CHECK_EQ(wire_seal(&w, &forged, "{\"type\":\"status\",\"id\":2}", 24, &frame, &len), 0);
    CHECK_EQ(wire_send_raw(&w, frame, len), 0);
    free(frame);
    expect_closed_silently(&w);
    wire_close(&w);
    expect_one_line(&d, name, "failed authentication");

    /* A frame of another link of the same job, with the right seq for this one. */
    client_open(&d, &w);
    client_open(&d, &w2);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    forged = w2.sess;
    CHECK_EQ(wire_seal(&w2, &forged, "{\"type\":\"status\",\"id\":3}", 24, &frame, &len), 0);
    CHECK_EQ(wire_send_raw(&w, frame, len), 0);
    free(frame);
    expect_closed_silently(&w);
    wire_close(&w);
    expect_one_line(&d, name, "failed authentication");
    /* The link whose session made the frame is untouched; its seq 0 was never used. */
    job = status(&w2, 4);
    json_decref(job);
    wire_close(&w2);

    /* A frame whose JSON was changed after sealing. */
    client_open(&d, &w);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    CHECK_EQ(wire_seal(&w, NULL, "{\"type\":\"status\",\"id\":5}", 24, &frame, &len), 0);
    frame[FRAME_HDR_LEN + AUTH_SEQ_LEN + 22] = '6';
    CHECK_EQ(wire_send_raw(&w, frame, len), 0);
    free(frame);
    expect_closed_silently(&w);
    wire_close(&w);
    expect_one_line(&d, name, "failed authentication");

    check_serving(&d);
    daemon_stop_cancelled(&d);
}

/* --- framing ------------------------------------------------------------------------------- */

TEST(daemon_oversized_length_refused)
{
    static const uint8_t huge[4] = {0x7f, 0xff, 0xff, 0xff};
    static const uint8_t just_over[4] = {0x00, 0x10, 0x00, 0x01}; /* 1 MiB + 1 */
    struct daemon d;
    struct wire w;
    char name[64];

    daemon_start(&d, true);
    /* Before the handshake: the header alone is enough to be closed; the daemon does not
     * wait for (or buffer) the 2 GiB it announces. */
    CHECK_EQ(wire_connect(&w, d.host, d.port), 0);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    CHECK_EQ(wire_send_raw(&w, huge, sizeof(huge)), 0);
    expect_closed(&w);
    wire_close(&w);
    expect_one_line(&d, name, "frame larger than");

    /* After the handshake, one byte over the limit. */
    client_open(&d, &w);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    CHECK_EQ(wire_send_raw(&w, just_over, sizeof(just_over)), 0);
    expect_closed_silently(&w);
    wire_close(&w);
    expect_one_line(&d, name, "frame larger than");

    check_serving(&d);
    daemon_stop_cancelled(&d);
}

TEST(daemon_bad_frames_refused)
{
    static const char http[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    struct daemon d;
    struct wire w;
    uint8_t hello[AUTH_HELLO_LEN];
    char name[64];

    daemon_start(&d, true);

    /* A zero-length frame. */
    CHECK_EQ(wire_connect(&w, d.host, d.port), 0);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    CHECK_EQ(wire_send_frame(&w, "", 0), 0);
    expect_closed(&w);
    wire_close(&w);
    expect_one_line(&d, name, "empty frame");

    /* A header announcing 50 bytes (a handshake frame's size), 10 of them, then the end of
     * the stream. */
    CHECK_EQ(wire_connect(&w, d.host, d.port), 0);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    CHECK_EQ(wire_send_raw(&w,
                           "\0\0\0\x32"
                           "0123456789",
                           14),
             0);
    CHECK_EQ(shutdown(w.fd, SHUT_WR), 0);
    expect_closed(&w);
    wire_close(&w);
    expect_one_line(&d, name, "truncated frame");

    /* Someone speaking HTTP to the port: "GET " reads as a 1.2 GB length. */
    CHECK_EQ(wire_connect(&w, d.host, d.port), 0);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    CHECK_EQ(wire_send_raw(&w, http, sizeof(http) - 1), 0);
    expect_closed(&w);
    wire_close(&w);
    expect_one_line(&d, name, "frame larger than");

    /* A frame of the hello's size that is not a hello. */
    CHECK_EQ(wire_connect(&w, d.host, d.port), 0);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    memset(hello, 'x', sizeof(hello));
    CHECK_EQ(wire_send_frame(&w, hello, sizeof(hello)), 0);
    expect_closed(&w);
    wire_close(&w);
    expect_one_line(&d, name, "malformed handshake frame");

    /* JSON instead of a hello: nothing before the handshake is parsed as JSON. The same
     * reason from the same address within REFUSAL_WINDOW_MS is counted, not logged again. */
    CHECK_EQ(wire_connect(&w, d.host, d.port), 0);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    CHECK_EQ(wire_send_frame(&w, "{\"type\":\"status\",\"id\":1}", 24), 0);
    expect_closed(&w);
    wire_close(&w);
    expect_log(&d, "malformed handshake frame", NULL, 1);

    /* After the handshake: a sealed frame cut short, then the end of the stream. */
    client_open(&d, &w);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    {
        uint8_t *frame;
        size_t len;
        CHECK_EQ(wire_seal(&w, NULL, "{\"type\":\"status\",\"id\":1}", 24, &frame, &len), 0);
        CHECK_EQ(wire_send_raw(&w, frame, len - 5), 0);
        free(frame);
    }
    CHECK_EQ(shutdown(w.fd, SHUT_WR), 0);
    expect_closed_silently(&w);
    wire_close(&w);
    expect_one_line(&d, name, "truncated frame");

    /* A sealed payload shorter than its seq and tag. */
    client_open(&d, &w);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    CHECK_EQ(wire_send_frame(&w, "short", 5), 0);
    expect_closed_silently(&w);
    wire_close(&w);
    expect_one_line(&d, name, "failed authentication");

    check_serving(&d);
    daemon_stop_cancelled(&d);
    /* The leader's last words summarise what was counted. */
    CHECK_EQ(refused_count(&d, "malformed handshake frame", 2, 0), 2);
}

/* --- messages ------------------------------------------------------------------------------ */

TEST(daemon_bad_json_answered_with_error)
{
    /* id: what the error echoes, the message's own integer id when it parsed. */
    static const struct {
        const char *json, *what;
        int id;
    } cases[] = {
        {"{\"type\":\"status\",", "not JSON", 0},
        {"\xff\xfe", "not JSON", 0},
        {"[1, 2]", "not a JSON object", 0},
        {"{\"id\":1}", "no string 'type'", 1},
        {"{\"type\":7,\"id\":2}", "no string 'type'", 2},
        {"{\"type\":\"bogus\",\"id\":3}", "unknown message type 'bogus'", 3},
        {"{\"type\":\"status\",\"id\":4,\"extra\":true}", "extra", 4},
        {"{\"type\":\"status\",\"id\":\"one\"}", "'status'", 0},
        {"{\"type\":\"status\"}", "'status'", 0},
        {"{\"type\":\"status\",\"id\":1,\"id\":2}", "not JSON", 0},
        {"{\"type\":\"join\",\"node_rank\":4294967297,\"hostname\":\"h\",\"addr\":\"a\","
         "\"nprocs\":1,\"gpus\":\"\"}",
         "'node_rank' out of range", 0},
        {"{\"type\":\"join\",\"node_rank\":-1,\"hostname\":\"h\",\"addr\":\"a\",\"nprocs\":1,"
         "\"gpus\":\"\"}",
         "negative or out-of-range", 0},
    };
    struct daemon d;
    struct wire w;
    char name[64];
    json_t *job;
    size_t n = sizeof(cases) / sizeof(cases[0]);

    daemon_start(&d, true);
    client_open(&d, &w);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    for (size_t i = 0; i < n; i++) {
        printf("# case %zu: %s\n", i, cases[i].json);
        send_json(&w, cases[i].json);
        expect_error(&w, cases[i].id, "bad_request", cases[i].what);
    }
    /* The link is still usable, as a status client. */
    job = status(&w, 42);
    CHECK_EQ(json_integer_value(json_object_get(job, "nnodes")), 2);
    json_decref(job);
    /* And the same refusals after it became one. */
    send_json(&w, "{\"type\":\"status\",\"id\":1,\"extra\":true}");
    expect_error(&w, 1, "bad_request", "extra");
    job = status(&w, 43);
    json_decref(job);
    wire_close(&w);
    /* One log line per refused message, naming the connection. */
    expect_log(&d, name, "bad message", (int)n + 1);
    daemon_stop_cancelled(&d);
}

TEST(daemon_message_of_the_wrong_role_refused)
{
    struct daemon d;
    struct wire w;
    char name[64];

    daemon_start(&d, true);
    /* Store requests are for agents: a connection that has not joined is refused and
     * closed. */
    client_open(&d, &w);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    send_json(&w, "{\"type\":\"kv_put\",\"id\":5,\"key\":\"k\",\"value\":\"v\"}");
    expect_error(&w, 5, "denied", "join first");
    expect_closed_silently(&w);
    wire_close(&w);
    expect_one_line(&d, name, "not an agent");

    /* The same from a status client. */
    client_open(&d, &w);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    json_decref(status(&w, 1));
    send_json(&w, "{\"type\":\"kv_get\",\"id\":6,\"key\":\"k\",\"timeout_ms\":0}");
    expect_error(&w, 6, "denied", "join first");
    expect_closed_silently(&w);
    wire_close(&w);
    expect_one_line(&d, name, "not an agent");

    check_serving(&d);
    daemon_stop_cancelled(&d);
}

/* Joins two fake agents on a --leader-only daemon and reads their assigns. */
static void join_both(const struct daemon *d, struct wire a[2])
{
    for (int k = 0; k < 2; k++) {
        client_open(d, &a[k]);
        send_join(&a[k], k, 1);
    }
    for (int k = 0; k < 2; k++) {
        json_t *m = recv_msg(&a[k]);
        CHECK_STR(type_of(m), "assign");
        CHECK_EQ(json_integer_value(json_object_get(m, "rank_base")), k);
        json_decref(m);
    }
}

/* A request with a key and a value of the given lengths. */
static char *kv_put_json(int id, size_t key_len, size_t value_len)
{
    size_t cap = key_len + value_len + 128;
    char *buf = malloc(cap);
    int n;

    CHECK(buf != NULL);
    n = snprintf(buf, cap, "{\"type\":\"kv_put\",\"id\":%d,\"key\":\"", id);
    memset(buf + n, 'k', key_len);
    n += (int)key_len;
    n += snprintf(buf + n, cap - (size_t)n, "\",\"value\":\"");
    memset(buf + n, 'v', value_len);
    n += (int)value_len;
    snprintf(buf + n, cap - (size_t)n, "\"}");
    return buf;
}

static void expect_ok(struct wire *w, int id)
{
    json_t *m = recv_msg(w);
    if (strcmp(type_of(m), "ok")) {
        char *text = json_dumps(m, JSON_COMPACT);
        test_fail(__FILE__, __LINE__, "expected ok, got %.300s", text);
    }
    CHECK_EQ(json_integer_value(json_object_get(m, "id")), id);
    json_decref(m);
}

TEST(daemon_store_limits)
{
    struct daemon d;
    struct wire a[2];
    char *req, key[PROTO_KEY_MAX + 1], get[PROTO_KEY_MAX + 128];
    json_t *m;

    daemon_start(&d, true);
    join_both(&d, a);

    /* A key of PROTO_KEY_MAX bytes and a value of PROTO_VALUE_MAX are stored. */
    req = kv_put_json(1, PROTO_KEY_MAX, PROTO_VALUE_MAX);
    send_json(&a[0], req);
    free(req);
    expect_ok(&a[0], 1);
    memset(key, 'k', PROTO_KEY_MAX);
    key[PROTO_KEY_MAX] = '\0';
    snprintf(get, sizeof(get), "{\"type\":\"kv_get\",\"id\":2,\"key\":\"%s\",\"timeout_ms\":0}",
             key);
    send_json(&a[1], get);
    m = recv_msg(&a[1]);
    CHECK_STR(type_of(m), "kv_val");
    CHECK_EQ(json_integer_value(json_object_get(m, "id")), 2);
    CHECK_EQ(json_string_length(json_object_get(m, "value")), PROTO_VALUE_MAX);
    json_decref(m);

    /* One byte more of either is refused with an error frame; the link stays. */
    req = kv_put_json(3, PROTO_KEY_MAX + 1, 1);
    send_json(&a[0], req);
    free(req);
    expect_error(&a[0], 3, "bad_request", "key longer than 256 bytes");
    req = kv_put_json(4, 1, PROTO_VALUE_MAX + 1);
    send_json(&a[0], req);
    free(req);
    expect_error(&a[0], 4, "bad_request", "value longer than 262144 bytes");
    snprintf(get, sizeof(get), "{\"type\":\"kv_get\",\"id\":5,\"key\":\"%s\",\"timeout_ms\":0}",
             "k");
    send_json(&a[0], get);
    expect_error(&a[0], 5, "not_found", "no such key");
    /* Neither refused put left a key behind. */
    snprintf(get, sizeof(get),
             "{\"type\":\"kv_get\",\"id\":6,\"key\":\"kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"
             "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"
             "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk"
             "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk\",\"timeout_ms\":0}");
    send_json(&a[0], get);
    expect_error(&a[0], 6, "bad_request", "key longer than 256 bytes");

    /* A waiting get is answered by another node's put. */
    send_json(&a[1], "{\"type\":\"kv_get\",\"id\":7,\"key\":\"nccl\",\"timeout_ms\":10000}");
    send_json(&a[0], "{\"type\":\"kv_put\",\"id\":8,\"key\":\"nccl\",\"value\":\"abc\"}");
    expect_ok(&a[0], 8);
    m = recv_msg(&a[1]);
    CHECK_STR(type_of(m), "kv_val");
    CHECK_EQ(json_integer_value(json_object_get(m, "id")), 7);
    CHECK_STR(json_string_value(json_object_get(m, "value")), "abc");
    json_decref(m);
    /* A wait of the largest timeout the field holds is just a long wait. */
    send_json(&a[1], "{\"type\":\"kv_get\",\"id\":10,\"key\":\"late\","
                     "\"timeout_ms\":9223372036854775807}");
    send_json(&a[0], "{\"type\":\"kv_put\",\"id\":11,\"key\":\"late\",\"value\":\"x\"}");
    expect_ok(&a[0], 11);
    m = recv_msg(&a[1]);
    CHECK_STR(type_of(m), "kv_val");
    CHECK_EQ(json_integer_value(json_object_get(m, "id")), 10);
    json_decref(m);
    /* A get that waits in vain times out with an error naming the key. */
    send_json(&a[1], "{\"type\":\"kv_get\",\"id\":9,\"key\":\"never\",\"timeout_ms\":100}");
    expect_error(&a[1], 9, "timeout", "'never'");

    wire_close(&a[0]);
    wire_close(&a[1]);
    check_alive(&d);
    /* The job failed when its nodes hung up: node 0 was lost first. */
    expect_log(&d, "job failed", "lost: connection closed", 1);
    CHECK_EQ(daemon_stop(&d), STATUS_NODE_LOST);
}

/* A quiet put (an agent's forward of its rank's put, daemon/agent.c) is answered only when
 * refused: the next frame of its link answers the get sent after it, and finds its value.
 * One the store cannot keep is refused all the same, and then the job fails naming the
 * store's limits, for its rank was told it was kept. */
TEST(daemon_quiet_put_answered_only_when_refused)
{
    size_t cap = PROTO_VALUE_MAX + 128;
    char *req = malloc(cap);
    struct daemon d;
    struct wire a[2];
    json_t *m;
    int n, fill = PROTO_STORE_MAX / PROTO_VALUE_MAX;

    CHECK(req != NULL);
    daemon_start(&d, true);
    join_both(&d, a);
    send_json(&a[0], "{\"type\":\"kv_put\",\"id\":1,\"key\":\"k\",\"value\":\"v\",\"quiet\":true}");
    send_json(&a[0], "{\"type\":\"kv_get\",\"id\":2,\"key\":\"k\",\"timeout_ms\":0}");
    m = recv_msg(&a[0]);
    CHECK_STR(type_of(m), "kv_val");
    CHECK_EQ(json_integer_value(json_object_get(m, "id")), 2);
    CHECK_STR(json_string_value(json_object_get(m, "value")), "v");
    json_decref(m);
    /* A put without the flag is answered as before. */
    send_json(&a[1], "{\"type\":\"kv_put\",\"id\":3,\"key\":\"k2\",\"value\":\"w\"}");
    expect_ok(&a[1], 3);

    /* The store's bytes in values of the largest size: the last of them does not fit. */
    for (int i = 1; req && i <= fill; i++) {
        n = snprintf(req, cap, "{\"type\":\"kv_put\",\"id\":%d,\"key\":\"fill/%d\",\"value\":\"",
                     100 + i, i);
        memset(req + n, 'v', PROTO_VALUE_MAX);
        snprintf(req + n + PROTO_VALUE_MAX, cap - (size_t)n - PROTO_VALUE_MAX,
                 "\",\"quiet\":true}");
        send_json(&a[0], req);
    }
    expect_error(&a[0], 100 + fill, "too_large", "store full");
    expect_log(&d, "job failed: the job's store is full", "node 0 ('fake0') put 'fill/256'", 1);
    free(req);
    wire_close(&a[0]);
    wire_close(&a[1]);
    CHECK_EQ(daemon_stop(&d), 125);
}

/* An agent's one-frame hello (auth.h): its join rides in the same write and the assign, the
 * leader's first frame, opens under the session the hello made. The hello replayed on
 * another connection is refused at once, one made with another key too, and hellos past the
 * bound of the leader's memory of them, each with its line. */
TEST(daemon_one_frame_hello)
{
    struct auth_key other;
    struct daemon d;
    struct wire a[2], r;
    uint8_t hello[AUTH_EARLY_LEN];
    json_t *m;

    daemon_start(&d, true);
    CHECK_EQ(wire_connect(&a[0], d.host, d.port), 0);
    CHECK_EQ(wire_early_hello(&a[0], &d.key, hello), 0);
    send_join(&a[0], 0, 1);
    client_open(&d, &a[1]);
    send_join(&a[1], 1, 1);
    for (int k = 0; k < 2; k++) {
        m = recv_msg(&a[k]);
        CHECK_STR(type_of(m), "assign");
        CHECK_EQ(json_integer_value(json_object_get(m, "rank_base")), k);
        json_decref(m);
    }
    /* Served like any agent: a put and its value. */
    send_json(&a[0], "{\"type\":\"kv_put\",\"id\":1,\"key\":\"k\",\"value\":\"v\"}");
    expect_ok(&a[0], 1);

    CHECK_EQ(wire_connect(&r, d.host, d.port), 0);
    CHECK_EQ(wire_send_frame(&r, hello, sizeof(hello)), 0);
    CHECK_EQ(wire_wait_closed(&r, PROMPT_MS), 0);
    wire_close(&r);
    expect_log(&d, "authentication failed: a replayed hello", NULL, 1);

    CHECK_EQ(auth_key_generate(&other), 0);
    CHECK_EQ(wire_connect(&r, d.host, d.port), 0);
    CHECK_EQ(wire_early_hello(&r, &other, NULL), 0);
    CHECK_EQ(wire_wait_closed(&r, PROMPT_MS), 0);
    wire_close(&r);
    expect_log(&d, "authentication failed: wrong job key", NULL, 1);

    /* The memory of hellos is bounded (four an agent, and 64): a key holder looping on
     * hellos is refused past it. One taken above; 71 more fill it, each known taken by the
     * status reply that follows it. */
    for (int i = 0; i < 4 * 2 + 64 - 1; i++) {
        CHECK_EQ(wire_connect(&r, d.host, d.port), 0);
        CHECK_EQ(wire_early_hello(&r, &d.key, NULL), 0);
        json_decref(status(&r, 1));
        wire_close(&r);
    }
    CHECK_EQ(wire_connect(&r, d.host, d.port), 0);
    CHECK_EQ(wire_early_hello(&r, &d.key, NULL), 0);
    CHECK_EQ(wire_wait_closed(&r, PROMPT_MS), 0);
    wire_close(&r);
    expect_log(&d, "more one-frame hellos than the job's agents could send", NULL, 1);

    wire_close(&a[0]);
    wire_close(&a[1]);
    CHECK_EQ(daemon_stop(&d), STATUS_NODE_LOST);
}

/* --- joins --------------------------------------------------------------------------------- */

TEST(daemon_bad_join_refused)
{
    struct daemon d;
    struct wire w, agent;
    char name[64];
    json_t *m;

    /* The real daemon: node 0's own agent has joined. */
    daemon_start(&d, false);
    wait_node_joined(&d, 0);

    /* Node 0 again. */
    client_open(&d, &w);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    send_join(&w, 0, 1);
    expect_error(&w, 0, "denied", "node 0 joined twice");
    expect_closed_silently(&w);
    wire_close(&w);
    expect_one_line(&d, name, "node 0 joined twice");

    /* A node rank the job does not have. */
    client_open(&d, &w);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    send_join(&w, 2, 1);
    expect_error(&w, 0, "denied", "node rank 2 out of range");
    expect_closed_silently(&w);
    wire_close(&w);
    expect_one_line(&d, name, "node rank 2 out of range");

    /* A node without ranks. */
    client_open(&d, &w);
    send_join(&w, 1, 0);
    expect_error(&w, 0, "denied", "node 1 does not run job.json's nprocs ranks");
    expect_closed_silently(&w);
    wire_close(&w);

    /* None of that broke the join: node 1 joins for real and the job starts. */
    client_open(&d, &agent);
    send_join(&agent, 1, 1);
    m = recv_msg(&agent);
    CHECK_STR(type_of(m), "assign");
    json_decref(m);

    /* A join once the job runs. */
    client_open(&d, &w);
    snprintf(name, sizeof(name), "%s", peer_name(&w));
    send_join(&w, 1, 1);
    expect_error(&w, 0, "denied", "node 1 joined after the job started");
    expect_closed_silently(&w);
    wire_close(&w);
    expect_one_line(&d, name, "node 1 joined after the job started");
    /* A second join on the agent's own link is no message an agent sends. */
    send_join(&agent, 1, 1);
    expect_error(&agent, 0, "bad_request", "not a message for the leader");

    wire_close(&agent);
    CHECK_EQ(daemon_stop(&d), STATUS_NODE_LOST);
}

TEST(daemon_join_rank_count_must_match_the_job)
{
    struct daemon d;
    struct wire w, a[2];
    char name[64];

    daemon_start(&d, true);
    /* Ranks are node_rank * nprocs + local_rank: a node with another count is refused, even
     * one whose count would overflow the world size. */
    for (int k = 0; k < 2; k++) {
        client_open(&d, &w);
        snprintf(name, sizeof(name), "%s", peer_name(&w));
        send_join(&w, k, k ? 2 : INT_MAX);
        expect_error(&w, 0, "denied", "does not run job.json's nprocs ranks");
        expect_closed_silently(&w);
        wire_close(&w);
        expect_one_line(&d, name, "refused join");
    }
    /* The refusals left no trace: both nodes join and the world is two ranks. */
    for (int k = 0; k < 2; k++) {
        client_open(&d, &a[k]);
        send_join(&a[k], k, 1);
    }
    for (int k = 0; k < 2; k++) {
        json_t *m = recv_msg(&a[k]);
        CHECK_STR(type_of(m), "assign");
        CHECK_EQ(json_integer_value(json_object_get(m, "world_size")), 2);
        CHECK_EQ(json_integer_value(json_object_get(m, "rank_base")), k);
        json_decref(m);
    }
    wire_close(&a[0]);
    wire_close(&a[1]);
    expect_log(&d, "job failed", "lost: connection closed", 1);
    CHECK_EQ(daemon_stop(&d), STATUS_NODE_LOST);
}

/* --- floods -------------------------------------------------------------------------------- */

/* Opens n loopback connections to the daemon that never send a byte. */
static int *open_silent(const struct daemon *d, int n)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)d->port)};
    int *fds = calloc((size_t)n, sizeof(*fds));

    CHECK(fds != NULL);
    CHECK_EQ(inet_pton(AF_INET, d->host, &sa.sin_addr), 1);
    for (int i = 0; i < n; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        CHECK(fds[i] >= 0);
        CHECK_EQ(connect(fds[i], (struct sockaddr *)&sa, sizeof(sa)), 0);
    }
    return fds;
}

/* Whether the daemon closed fd: it reads EOF (or a reset) without blocking. */
static bool closed_by_peer(int fd, int timeout_ms)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    char c;
    ssize_t n;

    if (poll(&pfd, 1, timeout_ms) <= 0)
        return false;
    n = recv(fd, &c, 1, MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno == ECONNRESET);
}

TEST_T(daemon_connection_flood, 20)
{
    enum { FLOOD = 300 };
    struct daemon d;
    struct wire w;
    int *fds, closed = 0;
    int64_t opened;

    daemon_start(&d, true);
    opened = mono_ms();
    fds = open_silent(&d, FLOOD);
    /* A real client is served while the flood holds its connections. */
    check_serving(&d);
    /* It stays served past the handshake timeout: only unauthenticated links are dropped. */
    client_open(&d, &w);
    json_decref(status(&w, 1));
    for (int i = 0; i < FLOOD; i++)
        closed += closed_by_peer(fds[i], 1);
    CHECK_EQ(closed, 0);
    /* Each silent connection is dropped once it has had HANDSHAKE_TIMEOUT_MS. */
    for (int i = 0; i < FLOOD; i++) {
        int left = (int)(opened + HANDSHAKE_TIMEOUT_MS + 2000 - mono_ms());
        if (closed_by_peer(fds[i], left > 1 ? left : 1))
            closed++;
        close(fds[i]);
    }
    CHECK_EQ(closed, FLOOD);
    CHECK_INT(mono_ms() - opened, >=, HANDSHAKE_TIMEOUT_MS - TICK_MS);
    free(fds);
    /* One line at once; the rest are counted, and summarised as the leader closes. */
    expect_log(&d, "handshake timed out", NULL, 1);
    json_decref(status(&w, 2));
    wire_close(&w);
    daemon_stop_cancelled(&d);
    CHECK_EQ(refused_count(&d, "handshake timed out", FLOOD, 0), FLOOD);
}

TEST(daemon_pending_connection_limit)
{
    /* The leader's PENDING_CONNS_MAX plus one for each of the job's 2 nodes still to join,
     * and some over it. */
    enum { LIMIT = 1024 + 2, FLOOD = LIMIT + 16 };
    struct daemon d;
    int *fds, evicted = 0;

    daemon_start(&d, true);
    fds = open_silent(&d, FLOOD);
    /* Over the limit the oldest pending connections make room: the first FLOOD - LIMIT are
     * closed at once, the newest LIMIT are kept. */
    for (int i = 0; i < FLOOD; i++)
        evicted += closed_by_peer(fds[i], i < FLOOD - LIMIT ? 1000 : 0);
    CHECK_EQ(evicted, FLOOD - LIMIT);
    expect_log(&d, "too many pending connections", NULL, 1);
    /* While the flood still holds every slot, a real client gets in: it evicts the oldest. */
    check_serving(&d);
    for (int i = 0; i < FLOOD; i++)
        close(fds[i]);
    free(fds);
    daemon_stop_cancelled(&d);
    CHECK_EQ(refused_count(&d, "too many pending connections", FLOOD - LIMIT + 1, 0),
             FLOOD - LIMIT + 1);
}

TEST(daemon_pending_eviction_spares_key_holders)
{
    /* Over the limit (PENDING_CONNS_MAX plus the 2 nodes still to join) only strangers that
     * sent nothing valid are evicted: a client that proved the key and one in the middle of
     * its handshake (a well-formed hello answered) stay, though they are the oldest. */
    enum { LIMIT = 1024 + 2, FLOOD = LIMIT + 16 };
    uint8_t hello[FRAME_HDR_LEN + AUTH_HELLO_LEN];
    const uint8_t *payload;
    struct wire proven, halfway;
    struct daemon d;
    int *fds, evicted = 0;
    size_t len;
    json_t *job;

    daemon_start(&d, true);
    client_open(&d, &proven);
    CHECK_EQ(wire_connect(&halfway, d.host, d.port), 0);
    frame_put_header(hello, AUTH_HELLO_LEN);
    memcpy(hello + FRAME_HDR_LEN, "GRH1", 4);
    memset(hello + FRAME_HDR_LEN + 4, 0x5a, AUTH_HELLO_LEN - 4);
    CHECK_EQ(wire_send_raw(&halfway, hello, sizeof(hello)), 0);
    CHECK_EQ(wire_recv_frame(&halfway, PROMPT_MS, &payload, &len), 0);
    /* The proof reaches the daemon before the flood does. */
    sleep_ms(100);
    fds = open_silent(&d, FLOOD);
    /* 2 + FLOOD pending: the oldest FLOOD + 2 - LIMIT silent ones go. */
    for (int i = 0; i < FLOOD; i++)
        evicted += closed_by_peer(fds[i], i < FLOOD + 2 - LIMIT ? 1000 : 0);
    if (evicted != FLOOD + 2 - LIMIT || wire_wait_closed(&halfway, 0) == 0)
        test_fail(__FILE__, __LINE__,
                  "expected the %d oldest silent connections evicted and the one in its "
                  "handshake kept; got %d evicted, the one in its handshake %s",
                  FLOOD + 2 - LIMIT, evicted,
                  wire_wait_closed(&halfway, 0) == 0 ? "closed" : "open");
    /* The client that proved the key is still served. */
    job = status(&proven, 1);
    CHECK_STR(json_string_value(json_object_get(job, "job_id")), "test-daemon-job");
    json_decref(job);
    for (int i = 0; i < FLOOD; i++)
        close(fds[i]);
    free(fds);
    wire_close(&proven);
    wire_close(&halfway);
    daemon_stop_cancelled(&d);
}

/* A field of /proc/PID/status in KiB ("VmHWM", "VmRSS"). */
static long proc_status_kib(pid_t pid, const char *field)
{
    char path[64], line[256];
    size_t flen = strlen(field);
    long kib = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
    f = fopen(path, "re");
    if (!f)
        test_fail(__FILE__, __LINE__, "cannot open '%s': %s", path, strerror(errno));
    while (kib < 0 && fgets(line, sizeof(line), f))
        if (!strncmp(line, field, flen) && line[flen] == ':')
            kib = strtol(line + flen + 1, NULL, 10);
    fclose(f);
    if (kib < 0)
        test_fail(__FILE__, __LINE__, "no '%s' in '%s'", field, path);
    return kib;
}

/* The bound the leader documents on memory before authentication (PENDING_CONNS_MAX in
 * daemon/leader.c: about 1.3 MiB), with room for the allocator's and the sanitizers' own. */
#define PREAUTH_MEM_BOUND_KIB (8 * 1024)

TEST_T(daemon_preauth_memory_bounded, 30)
{
    /* Each flood connection announces a frame just under 1 MiB (the limit after the
     * handshake) and sends 64 KiB of it: a leader that buffered it would grow by 64 KiB each,
     * 32 MiB for the lot, where the bound allows 8. */
    enum { FLOOD = 500, BODY = 64 * 1024 };
    struct sockaddr_in sa = {.sin_family = AF_INET};
    uint8_t *msg = calloc(1, FRAME_HDR_LEN + BODY);
    struct daemon d;
    struct wire a[2];
    int *fds = calloc(FLOOD, sizeof(*fds)), closed = 0;
    long hwm_before, hwm_after;
    int64_t deadline;
    json_t *job;

    CHECK(msg != NULL && fds != NULL);
    frame_put_header(msg, FRAME_MAX_DEFAULT - 1);
    daemon_start(&d, true);
    join_both(&d, a);
    sa.sin_port = htons((uint16_t)d.port);
    CHECK_EQ(inet_pton(AF_INET, d.host, &sa.sin_addr), 1);
    hwm_before = proc_status_kib(d.pid, "VmHWM");
    /* All of them at once, each holding its connection open: nothing times out here, the
     * leader has to close them itself. */
    for (int i = 0; i < FLOOD; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        CHECK(fds[i] >= 0);
        CHECK_EQ(connect(fds[i], (struct sockaddr *)&sa, sizeof(sa)), 0);
        /* The leader may close before it has all of it: a short write or a reset is fine. */
        (void)send(fds[i], msg, FRAME_HDR_LEN + BODY, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    /* Closed at once: all of them within PROMPT_MS, before the handshake timeout (5 s) would
     * have closed them. */
    deadline = mono_ms() + PROMPT_MS;
    for (int i = 0; i < FLOOD; i++) {
        int left = (int)(deadline - mono_ms());
        closed += closed_by_peer(fds[i], left > 0 ? left : 0);
    }
    hwm_after = proc_status_kib(d.pid, "VmHWM");
    for (int i = 0; i < FLOOD; i++)
        close(fds[i]);
    if (closed != FLOOD || hwm_after - hwm_before > PREAUTH_MEM_BOUND_KIB)
        test_fail(__FILE__, __LINE__,
                  "a flood of %d connections: %d closed within %d ms (want all); the leader's "
                  "peak RSS grew by %ld KiB (%ld -> %ld; bound %d KiB)",
                  FLOOD, closed, PROMPT_MS, hwm_after - hwm_before, hwm_before, hwm_after,
                  PREAUTH_MEM_BOUND_KIB);
    expect_log(&d, "frame larger than 68 bytes", NULL, 1);
    /* The running job did not notice: its agents are served and it is still running. */
    send_json(&a[0], "{\"type\":\"kv_put\",\"id\":5,\"key\":\"k\",\"value\":\"v\"}");
    expect_ok(&a[0], 5);
    {
        struct wire w;
        client_open(&d, &w);
        job = status(&w, 1);
        wire_close(&w);
    }
    CHECK_STR(json_string_value(json_object_get(job, "state")), "running");
    json_decref(job);
    wire_close(&a[0]);
    expect_log(&d, "node 0 ('fake0') lost", NULL, 1);
    wire_close(&a[1]);
    CHECK_EQ(daemon_stop(&d), STATUS_NODE_LOST);
    CHECK_EQ(refused_count(&d, "frame larger than 68 bytes", FLOOD, 0), FLOOD);
    free(fds);
    free(msg);
}

TEST_T(daemon_refusal_flood_summarised, 30)
{
    /* A bounded flood of bad handshakes, BATCH connections open at a time. */
    enum { FLOOD = 2000, BATCH = 200 };
    struct sockaddr_in sa = {.sin_family = AF_INET};
    uint8_t frame[FRAME_HDR_LEN + AUTH_HELLO_LEN];
    int fds[BATCH], lines, closed = 0;
    int64_t t0;
    long n;
    char *text;
    struct daemon d;

    frame_put_header(frame, AUTH_HELLO_LEN);
    memset(frame + FRAME_HDR_LEN, 'x', AUTH_HELLO_LEN);
    daemon_start(&d, true);
    sa.sin_port = htons((uint16_t)d.port);
    CHECK_EQ(inet_pton(AF_INET, d.host, &sa.sin_addr), 1);
    t0 = mono_ms();
    for (int done = 0; done < FLOOD; done += BATCH) {
        for (int i = 0; i < BATCH; i++) {
            fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            CHECK(fds[i] >= 0);
            CHECK_EQ(connect(fds[i], (struct sockaddr *)&sa, sizeof(sa)), 0);
            CHECK_EQ(send(fds[i], frame, sizeof(frame), MSG_NOSIGNAL), (ssize_t)sizeof(frame));
        }
        for (int i = 0; i < BATCH; i++) {
            closed += closed_by_peer(fds[i], PROMPT_MS);
            close(fds[i]);
        }
    }
    CHECK_EQ(closed, FLOOD);
    /* The first is logged at once, the rest in a summary once the window (REFUSAL_WINDOW_MS,
     * 5 s) has passed: every refusal is accounted for while the daemon still runs. */
    n = refused_count(&d, "malformed handshake frame", FLOOD, 5000 + 2 * PROMPT_MS);
    text = slurp(d.err_path);
    summarised(text, "malformed handshake frame", &lines);
    if (n != FLOOD || lines > 3)
        test_fail(__FILE__, __LINE__,
                  "after %d refusals in %.1f s the log accounts for %ld in %d lines (want %d in "
                  "3 lines at most):\n%s",
                  FLOOD, (double)(mono_ms() - t0) / 1000, n, lines, FLOOD, text);
    CHECK_CONTAINS(text, "refused");
    CHECK_CONTAINS(text, " connections from '127.0.0.1' in ");
    free(text);
    check_serving(&d);
    daemon_stop_cancelled(&d);
    /* Nothing left to summarise at the end: the count stays what it was. */
    CHECK_EQ(refused_count(&d, "malformed handshake frame", FLOOD, 0), FLOOD);
}

/* The soft limit of "Max open files" in /proc/PID/limits. */
static long proc_nofile_soft(pid_t pid)
{
    char path[64], line[256];
    long soft = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%ld/limits", (long)pid);
    f = fopen(path, "re");
    if (!f)
        test_fail(__FILE__, __LINE__, "cannot open '%s': %s", path, strerror(errno));
    while (soft < 0 && fgets(line, sizeof(line), f))
        if (!strncmp(line, "Max open files", 14))
            soft = strtol(line + 14, NULL, 10);
    fclose(f);
    return soft;
}

TEST(daemon_descriptor_soft_limit_raised)
{
    struct rlimit rl;
    struct daemon d;
    long soft;

    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max < 512)
        test_skip("the hard descriptor limit is %lu: nothing to raise to",
                  (unsigned long)rl.rlim_max);
    rl.rlim_cur = 256;
    daemon_spawn(&d, true, 2, &rl);
    read_endpoint(&d);
    soft = proc_nofile_soft(d.pid);
    if (soft != (long)rl.rlim_max)
        test_fail(__FILE__, __LINE__, "started with a soft limit of 256: expected %lu, got %ld",
                  (unsigned long)rl.rlim_max, soft);
    check_serving(&d);
    daemon_stop_cancelled(&d);
}

TEST(daemon_descriptor_hard_limit_too_low_refused)
{
    /* A leader of 4,000 nodes under a hard limit of 2,000: one line, exit 125, before it
     * listens. */
    struct rlimit rl = {.rlim_cur = 2000, .rlim_max = 2000}, own;
    char path[PATH_MAX + 32];
    struct daemon d;
    int st, lines;
    char *err;

    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &own), 0);
    if (own.rlim_max != RLIM_INFINITY && own.rlim_max < rl.rlim_max)
        rl.rlim_cur = rl.rlim_max = own.rlim_max;
    daemon_spawn(&d, true, 4000, &rl);
    CHECK_EQ(waitpid(d.pid, &st, 0), d.pid);
    err = slurp(d.err_path);
    lines = count_lines(err, "", NULL);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 125 || lines != 1 ||
        !strstr(err, "descriptor limit too low: the leader of a job of 4000 nodes needs"))
        test_fail(__FILE__, __LINE__,
                  "expected exit 125 and one line 'descriptor limit too low: ...', got status "
                  "0x%x and %d lines:\n%s",
                  st, lines, err);
    snprintf(path, sizeof(path), "%s/endpoint.json", d.dir);
    CHECK(access(path, F_OK) < 0);
    free(err);
}

TEST_T(daemon_descriptor_limit_1024_flood, 30)
{
    /* `ulimit -n 1024` (soft and hard): a 2-node job starts, its stranger slots shrink to what
     * the limit leaves, and 1,500 silent connections (more than the leader has descriptors)
     * meet evictions, not EMFILE: both nodes still join and a status client gets in. */
    enum { FLOOD = 1500 };
    struct rlimit rl = {.rlim_cur = 1024, .rlim_max = 1024}, own;
    struct wire a[2];
    struct daemon d;
    int *fds, evicted = 0;
    char *err;

    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &own), 0);
    if (own.rlim_max != RLIM_INFINITY && own.rlim_max < FLOOD + 256)
        test_skip("the hard descriptor limit is %lu: the flood needs %d descriptors here",
                  (unsigned long)own.rlim_max, FLOOD + 256);
    own.rlim_cur = own.rlim_max;
    CHECK_EQ(setrlimit(RLIMIT_NOFILE, &own), 0);
    daemon_spawn(&d, true, 2, &rl);
    read_endpoint(&d);
    fds = open_silent(&d, FLOOD);
    for (int i = 0; i < FLOOD; i++)
        evicted += closed_by_peer(fds[i], i < FLOOD - 768 - 16 ? 2000 : 0);
    /* 1024 - FDS_SLACK (256) - 2 nodes = 766 stranger slots, plus the 2 nodes' own. */
    if (evicted < FLOOD - 768 - 16)
        test_fail(__FILE__, __LINE__,
                  "expected at least %d of %d silent connections evicted, %d were",
                  FLOOD - 768 - 16, FLOOD, evicted);
    join_both(&d, a);
    check_serving(&d);
    daemon_stop_cancelled(&d);
    for (int k = 0; k < 2; k++)
        wire_close(&a[k]);
    for (int i = 0; i < FLOOD; i++)
        close(fds[i]);
    free(fds);
    err = slurp(d.err_path);
    if (strstr(err, "too many open files") || strstr(err, "EMFILE"))
        test_fail(__FILE__, __LINE__, "the leader ran out of descriptors:\n%s", err);
    free(err);
}

TEST(daemon_status_client_limit)
{
    /* The leader's CLIENTS_MAX. */
    enum { CLIENTS = 64 };
    struct daemon d;
    struct wire w[CLIENTS + 1];
    char name[64];

    daemon_start(&d, true);
    for (int i = 0; i < CLIENTS; i++) {
        client_open(&d, &w[i]);
        json_decref(status(&w[i], i + 1));
    }
    /* One more is refused with a reason, and logged once. */
    client_open(&d, &w[CLIENTS]);
    snprintf(name, sizeof(name), "%s", peer_name(&w[CLIENTS]));
    send_json(&w[CLIENTS], "{\"type\":\"status\",\"id\":7}");
    expect_error(&w[CLIENTS], 7, "denied", "too many status clients");
    expect_closed_silently(&w[CLIENTS]);
    wire_close(&w[CLIENTS]);
    expect_one_line(&d, name, "too many status clients");
    /* The clients served still are; once one leaves, a newcomer takes its place. */
    json_decref(status(&w[0], 100));
    wire_close(&w[0]);
    /* The leader sees that end of stream before the newcomer's handshake is through. */
    check_serving(&d);
    for (int i = 1; i < CLIENTS; i++)
        wire_close(&w[i]);
    daemon_stop_cancelled(&d);
}

TEST(daemon_exit_status_out_of_range_refused)
{
    static const char *const bad[] = {
        "{\"type\":\"abort\",\"cause\":\"x\",\"status\":256}",
        "{\"type\":\"abort\",\"cause\":\"x\",\"status\":-1}",
        "{\"type\":\"rank_exit\",\"rank\":0,\"code\":256,\"signal\":0,\"oom\":false,"
        "\"killed\":false,\"tail\":\"\"}",
        "{\"type\":\"rank_exit\",\"rank\":0,\"code\":0,\"signal\":2147483647,\"oom\":false,"
        "\"killed\":false,\"tail\":\"\"}",
    };
    struct daemon d;
    struct wire a[2];

    /* A job's status is an exit status: 256 would read as 0, a success, and 128 + a huge
     * signal does not fit an int. */
    daemon_start(&d, true);
    join_both(&d, a);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        send_json(&a[0], bad[i]);
        expect_error(&a[0], 0, "bad_request", "out-of-range");
    }
    /* None of them counted: the first failure is this one, and its status is the job's. */
    send_json(&a[1], "{\"type\":\"rank_exit\",\"rank\":1,\"code\":7,\"signal\":0,\"oom\":false,"
                     "\"killed\":false,\"tail\":\"last words\"}");
    expect_log(&d, "job failed: rank 1 on node 1 ('fake1') exited with status 7", NULL, 1);
    wire_close(&a[0]);
    wire_close(&a[1]);
    CHECK_EQ(daemon_stop(&d), 7);
}
