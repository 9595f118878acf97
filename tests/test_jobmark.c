/* Tests of lib/jobmark.c: a mark's value, the rules that find and match it in an environment's
 * bytes, and the sweep that ends the processes carrying it. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jobmark.h"
#include "test.h"
#include "banned.h"

static const struct jobmark mark = {
    .job = 0x0123456789abcdefull, .daemon = 4242, .start = 987654, .rank = 3};

/* env as /proc/PID/environ gives it, from a C string whose '|' stand for the NULs. */
static size_t env_bytes(const char *text, char *out, size_t cap)
{
    size_t n = strlen(text);

    CHECK(n < cap);
    for (size_t i = 0; i < n; i++)
        out[i] = text[i] == '|' ? '\0' : text[i];
    return n;
}

static size_t find(const char *text, struct jobmark *out, size_t max)
{
    char buf[512];

    return jobmark_find(buf, env_bytes(text, buf, sizeof(buf)), out, max);
}

static bool same(const struct jobmark *a, const struct jobmark *b)
{
    return a->job == b->job && a->daemon == b->daemon && a->start == b->start && a->rank == b->rank;
}

TEST(jobmark_format_and_parse)
{
    char text[JOBMARK_LEN];
    struct jobmark m, big = {.job = ~0ull, .daemon = LONG_MAX, .start = ~0ull, .rank = INT_MAX};

    CHECK_EQ(jobmark_format(&mark, text, sizeof(text)), 0);
    CHECK_STR(text, "0123456789abcdef/4242/987654/3");
    CHECK_EQ(jobmark_parse(text, strlen(text), &m), 0);
    CHECK(same(&m, &mark));
    CHECK_EQ(jobmark_format(&big, text, sizeof(text)), 0);
    CHECK_EQ(jobmark_parse(text, strlen(text), &m), 0);
    CHECK(same(&m, &big));
    CHECK_EQ(jobmark_format(&mark, text, 10), -ENAMETOOLONG);
    /* Parsing stops at len: the bytes after it are not the value's. */
    CHECK_EQ(jobmark_parse("0123456789abcdef/1/2/3junk", 22, &m), 0);
    CHECK_EQ(m.rank, 3);
}

TEST(jobmark_parse_refuses_what_is_not_a_mark)
{
    static const char *const bad[] = {
        "",
        "0123456789abcdef",
        "0123456789abcdef/",
        "0123456789abcdef/1/2",
        "0123456789abcdef/1/2/",
        "0123456789abcdef/1/2/3/",
        "0123456789abcdef/1/2/3/4",
        "0123456789ABCDEF/1/2/3",
        "0123456789abcde/1/2/3",
        "0123456789abcdefa/1/2/3",
        "0123456789abcdef/0/2/3",
        "0123456789abcdef/-1/2/3",
        "0123456789abcdef/1//3",
        "0123456789abcdef/1/2/-3",
        "0123456789abcdef/1/2/3 ",
        "0123456789abcdef/ 1/2/3",
        "0123456789abcdef/1/2/2147483648",
        "0123456789abcdef/1/18446744073709551616/3",
        "0123456789abcdef/99999999999999999999/2/3",
    };
    struct jobmark m = mark;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (jobmark_parse(bad[i], strlen(bad[i]), &m) != -EINVAL)
            test_fail(__FILE__, __LINE__, "'%s' parsed as a mark", bad[i]);
    CHECK(same(&m, &mark)); /* untouched by a refusal */
}

/* Only an entry named GPURUN_JOB_MARK counts, wherever it is among the entries and whether
 * or not the last entry ends in a NUL; a name that merely starts so, or a value that holds
 * the text, does not. */
TEST(jobmark_find_in_environ_bytes)
{
    struct jobmark m[2];

    CHECK_EQ(find("", m, 2), 0);
    CHECK_EQ(find("PATH=/bin|HOME=/root|", m, 2), 0);
    CHECK_EQ(find("GPURUN_JOB_MARK=0123456789abcdef/4242/987654/3|PATH=/bin|", m, 2), 1);
    CHECK(same(&m[0], &mark));
    CHECK_EQ(find("PATH=/bin|GPURUN_JOB_MARK=0123456789abcdef/4242/987654/3", m, 2), 1);
    CHECK(same(&m[0], &mark));
    CHECK_EQ(find("A=1||GPURUN_JOB_MARK=0123456789abcdef/4242/987654/3||B=2|", m, 2), 1);
    CHECK_EQ(find("GPURUN_JOB_MARK=|", m, 2), 0);
    CHECK_EQ(find("GPURUN_JOB_MARK|", m, 2), 0);
    CHECK_EQ(find("GPURUN_JOB_MARKS=0123456789abcdef/4242/987654/3|", m, 2), 0);
    CHECK_EQ(find("XGPURUN_JOB_MARK=0123456789abcdef/4242/987654/3|", m, 2), 0);
    CHECK_EQ(find("FOO=GPURUN_JOB_MARK=0123456789abcdef/4242/987654/3|", m, 2), 0);
    CHECK_EQ(find("FOO=x|GPURUN_JOB_MARK=0123456789abcdef/4242/987654/3 |", m, 2), 0);
    /* A value that does not parse hides no later mark. */
    CHECK_EQ(find("GPURUN_JOB_MARK=junk|GPURUN_JOB_MARK=0123456789abcdef/4242/987654/3|", m, 2), 1);
    CHECK(same(&m[0], &mark));
    /* Two marks (an environment built by hand): both, in order; the count goes past max. */
    CHECK_EQ(find("GPURUN_JOB_MARK=0123456789abcdef/4242/987654/3|"
                  "GPURUN_JOB_MARK=fedcba9876543210/7/8/9|"
                  "GPURUN_JOB_MARK=fedcba9876543210/7/8/10",
                  m, 2),
             3);
    CHECK(same(&m[0], &mark));
    CHECK_EQ(m[1].job, 0xfedcba9876543210ull);
    CHECK_EQ(m[1].rank, 9);
}

TEST(jobmark_matches_by_scope)
{
    struct jobmark rank = mark, daemon = mark, restarted = mark, job = mark, other = mark;

    rank.rank = 4;
    daemon.daemon = 4243;
    restarted.start = 987655; /* the same pid, another process */
    other.job ^= 1;
    CHECK(jobmark_matches(&mark, &mark, JOBMARK_RANK));
    CHECK(!jobmark_matches(&rank, &mark, JOBMARK_RANK));
    CHECK(jobmark_matches(&rank, &mark, JOBMARK_DAEMON));
    CHECK(!jobmark_matches(&daemon, &mark, JOBMARK_DAEMON));
    CHECK(!jobmark_matches(&restarted, &mark, JOBMARK_DAEMON));
    CHECK(!jobmark_matches(&restarted, &mark, JOBMARK_RANK));
    CHECK(jobmark_matches(&daemon, &mark, JOBMARK_JOB));
    CHECK(jobmark_matches(&restarted, &mark, JOBMARK_JOB));
    CHECK(jobmark_matches(&job, &mark, JOBMARK_JOB));
    CHECK(!jobmark_matches(&other, &mark, JOBMARK_JOB));
    CHECK(!jobmark_matches(&other, &mark, JOBMARK_RANK));
    CHECK(!jobmark_matches(&mark, &mark, JOBMARK_STALE));
}

TEST(jobmark_owner_gone_rules)
{
    struct jobmark unknown = mark;

    unknown.start = 0;
    CHECK(jobmark_owner_gone(&mark, 0));         /* no process has its pid */
    CHECK(jobmark_owner_gone(&mark, 987655));    /* its pid is another process's now */
    CHECK(!jobmark_owner_gone(&mark, 987654));   /* it runs */
    CHECK(!jobmark_owner_gone(&unknown, 12345)); /* no start time: the pid's process counts */
    CHECK(jobmark_owner_gone(&unknown, 0));
}

TEST(jobmark_job_from_key)
{
    struct auth_key a = {{1}}, b = {{2}};

    CHECK(jobmark_job(&a) == jobmark_job(&a));
    CHECK(jobmark_job(&a) != jobmark_job(&b));
}

/* Starts sleep with only the environment entry env ("" for none); returns its pid once it
 * runs sleep (the pipe closes at the exec). */
static pid_t start_marked(const char *env)
{
    char *const argv[] = {(char *)"sleep", (char *)"30", NULL};
    char *const envp[] = {(char *)env, NULL};
    int fds[2];
    char c;
    pid_t pid;

    CHECK_EQ(pipe2(fds, O_CLOEXEC), 0);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        execve("/bin/sleep", argv, env[0] ? envp : envp + 1);
        _exit(127);
    }
    close(fds[1]);
    CHECK_EQ(read(fds[0], &c, 1), 0);
    close(fds[0]);
    return pid;
}

/* The signal that ended pid, reaped within 5 s; 0 if it still runs then (it is killed). */
static int ended_by(pid_t pid)
{
    int status;

    for (int i = 0; i < 500; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFSIGNALED(status) ? WTERMSIG(status) : -1;
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return 0;
}

static bool still_runs(pid_t pid)
{
    return waitpid(pid, NULL, WNOHANG) == 0;
}

/* Whether pid runs: it exists and is no zombie. */
static bool running(pid_t pid)
{
    unsigned long long start;

    return jobmark_proc_start(pid, &start) == 0;
}

static void env_entry(const struct jobmark *m, char *out, size_t n)
{
    char v[JOBMARK_LEN];

    CHECK_EQ(jobmark_format(m, v, sizeof(v)), 0);
    CHECK((size_t)snprintf(out, n, "%s=%s", JOBMARK_ENV, v) < n);
}

/* A sweep of one rank ends the processes carrying its mark and no other: not another rank's,
 * not another job's, not one without a mark. */
TEST(jobmark_sweep_ends_the_marked)
{
    struct jobmark want = mark, other_rank = mark, other_job = mark;
    char e1[128], e2[128], e3[128];
    struct jobmark_sweep_stats st;
    pid_t p1, p1b, p2, p3, p4;

    /* A job value of this test's own, so that nothing else on the machine carries it; and
     * this process, as it runs, for the daemon, so that the stale sweep of a daemon starting
     * meanwhile (another test's) leaves the marked ones alone. */
    want.job = other_rank.job = other_job.job = ((uint64_t)getpid() << 32) | 0x5eed;
    want.daemon = other_rank.daemon = other_job.daemon = getpid();
    CHECK_EQ(jobmark_proc_start(getpid(), &want.start), 0);
    other_rank.start = other_job.start = want.start;
    other_rank.rank = 4;
    other_job.job ^= 1;
    env_entry(&want, e1, sizeof(e1));
    env_entry(&other_rank, e2, sizeof(e2));
    env_entry(&other_job, e3, sizeof(e3));
    p1 = start_marked(e1);
    p1b = start_marked(e1);
    p2 = start_marked(e2);
    p3 = start_marked(e3);
    p4 = start_marked("");
    CHECK_EQ(jobmark_sweep(&want, JOBMARK_RANK, 0, &st), 0);
    CHECK_EQ(st.killed, 2);
    CHECK_INT(st.scanned, >=, 5);
    CHECK_EQ(ended_by(p1), SIGKILL);
    CHECK_EQ(ended_by(p1b), SIGKILL);
    CHECK(still_runs(p2));
    CHECK(still_runs(p3));
    /* skip spares the one named; the daemon's scope takes both ranks. */
    CHECK_EQ(jobmark_sweep(&want, JOBMARK_DAEMON, p2, &st), 0);
    CHECK_EQ(st.killed, 0);
    CHECK_EQ(jobmark_sweep(&want, JOBMARK_JOB, 0, &st), 0);
    CHECK_EQ(st.killed, 1);
    CHECK_EQ(ended_by(p2), SIGKILL);
    CHECK(still_runs(p3));
    CHECK(still_runs(p4));
    CHECK_EQ(jobmark_sweep(NULL, JOBMARK_JOB, 0, &st), -EINVAL);
    kill(p3, SIGKILL);
    kill(p4, SIGKILL);
    waitpid(p3, NULL, 0);
    waitpid(p4, NULL, 0);
}

/* A stale sweep ends a process whose mark names a daemon that is gone (no process, or a
 * zombie: a killed daemon whose parent was killed too waits for a subreaper), or whose pid is
 * another process's now, and spares one whose daemon runs. */
TEST(jobmark_sweep_stale)
{
    struct jobmark gone = mark, reused = mark, alive = mark, zombie = mark;
    char e1[128], e2[128], e3[128], e4[128], c;
    struct jobmark_sweep_stats st;
    pid_t dead = fork(), undead, p1, p2, p3, p4;
    int fds[2];
    siginfo_t si;

    CHECK(dead >= 0);
    if (dead == 0)
        _exit(0);
    CHECK_EQ(waitpid(dead, NULL, 0), dead);
    CHECK_EQ(pipe(fds), 0);
    undead = fork();
    CHECK(undead >= 0);
    if (undead == 0) {
        close(fds[1]);
        _exit(read(fds[0], &c, 1) < 0);
    }
    close(fds[0]);
    gone.job = reused.job = alive.job = zombie.job = ((uint64_t)getpid() << 32) | 0x57a1e;
    gone.daemon = dead;
    zombie.daemon = undead;
    CHECK_EQ(jobmark_proc_start(undead, &zombie.start), 0);
    alive.daemon = reused.daemon = getpid();
    CHECK_EQ(jobmark_proc_start(getpid(), &alive.start), 0);
    CHECK(alive.start > 0);
    reused.start = alive.start + 1;
    CHECK_EQ(jobmark_proc_start(dead, &gone.start), -ENOENT);
    /* The child exits and is left unreaped: a zombie. */
    close(fds[1]);
    CHECK_EQ(waitid(P_PID, (id_t)undead, &si, WEXITED | WNOWAIT), 0);
    unsigned long long start;
    CHECK_EQ(jobmark_proc_start(undead, &start), -ENOENT);
    env_entry(&gone, e1, sizeof(e1));
    env_entry(&reused, e2, sizeof(e2));
    env_entry(&alive, e3, sizeof(e3));
    env_entry(&zombie, e4, sizeof(e4));
    p1 = start_marked(e1);
    p2 = start_marked(e2);
    p3 = start_marked(e3);
    p4 = start_marked(e4);
    CHECK_EQ(jobmark_sweep(NULL, JOBMARK_STALE, 0, &st), 0);
    /* No count: the machine may hold stale marks of its own, and a daemon that starts
     * meanwhile (another test's) sweeps these too. What ended and what runs is the check. */
    CHECK_EQ(ended_by(p1), SIGKILL);
    CHECK_EQ(ended_by(p2), SIGKILL);
    CHECK_EQ(ended_by(p4), SIGKILL);
    CHECK(still_runs(p3));
    kill(p3, SIGKILL);
    waitpid(p3, NULL, 0);
    waitpid(undead, NULL, 0);
}

/* A stale sweep leaves alone a process of another pid namespace (a container's): the pid in
 * its mark is a pid of that namespace, which means nothing in ours. Needs CAP_SYS_ADMIN. */
TEST(jobmark_sweep_stale_other_pid_ns)
{
    struct jobmark gone = mark;
    char entry[128], c;
    struct jobmark_sweep_stats st;
    int ready[2], info[2];
    pid_t child, inner = 0;

    gone.job = ((uint64_t)getpid() << 32) | 0x9a5;
    gone.daemon = 999999; /* above the default pid_max: no process of ours has it */
    env_entry(&gone, entry, sizeof(entry));
    CHECK_EQ(pipe2(ready, O_CLOEXEC), 0);
    CHECK_EQ(pipe(info), 0);
    child = fork();
    CHECK(child >= 0);
    if (child == 0) {
        char *const argv[] = {(char *)"sleep", (char *)"30", NULL};
        char *const envp[] = {entry, NULL};
        if (unshare(CLONE_NEWPID) < 0)
            _exit(77);
        pid_t g = fork();
        if (g == 0) {
            execve("/bin/sleep", argv, envp);
            _exit(127);
        }
        if (write(info[1], &g, sizeof(g)) != sizeof(g))
            _exit(1);
        close(ready[1]);
        waitpid(g, NULL, 0);
        _exit(0);
    }
    close(info[1]);
    close(ready[1]);
    if (read(info[0], &inner, sizeof(inner)) != sizeof(inner)) {
        int status;
        waitpid(child, &status, 0);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 77)
            test_skip("cannot make a pid namespace here");
        test_fail(__FILE__, __LINE__, "no pid from the namespace's child: status 0x%x", status);
    }
    close(info[0]);
    /* The exec closed the grandchild's copy of the pipe; the child closed its own. */
    CHECK_EQ(read(ready[0], &c, 1), 0);
    close(ready[0]);
    CHECK_EQ(jobmark_sweep(NULL, JOBMARK_STALE, 0, &st), 0);
    /* A SIGKILL sent takes a moment to end its target: watched for 200 ms. */
    for (int i = 0; i < 20; i++) {
        if (!running(inner))
            test_fail(__FILE__, __LINE__, "the other namespace's process %d was ended", (int)inner);
        usleep(10000);
    }
    kill(inner, SIGKILL);
    CHECK_EQ(waitpid(child, NULL, 0), child);
}
