/* The unit-test runner (the API is tests/test.h). Each test runs forked, in its own process
 * group, with its output captured in a temp file and a timeout; the runner prints one TAP line
 * per test, the captured output as "# " lines when it fails, and a summary line. The runner is
 * a child subreaper, so that processes a test leaves behind (even ones that moved to their own
 * process group, like a daemon's ranks) come back to it and are killed before the next test. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test.h"
#include "banned.h"

/* Exit status a test process uses for "skipped" (automake's convention, also used by the
 * integration scripts). */
#define SKIP_STATUS  77
/* Captured output shown for a failed test: the tail, enough for a backtrace and the log lines
 * before it, without flooding the terminal when a test loops on a message. */
#define SHOW_MAX     (64 * 1024)
/* Rounds of the leftover-process sweep: each round kills the runner's children, whose own
 * children then come back to the runner for the next round. */
#define SWEEP_ROUNDS 32

enum outcome { OUT_NONE, OUT_PASS, OUT_FAIL, OUT_SKIP };

struct test {
    const char *name;
    const char *file;
    test_fn fn;
    int timeout_s;
    size_t order; /* registration order: a file's tests run as they are written */
};

/* What a test process reports to the runner: a page shared across the fork, so that a skip
 * reason survives the process and a failure in any process of the test sticks. */
struct shared {
    int outcome;
    char reason[512];
};

static struct test *tests;
static size_t n_tests, cap_tests;

static struct shared *shared;
static char build_dir[PATH_MAX];
static char base_dir[PATH_MAX];      /* per-run scratch root, holds one dir per test */
static char test_dir[PATH_MAX + 16]; /* the running test's scratch dir (made on first use) */
static char path_buf[2 * PATH_MAX];  /* test_build_path()'s result */
static const char *name_prefix = ""; /* shown before every test name ("asan/") */

void test_register(const char *name, const char *file, test_fn fn, int timeout_s)
{
    if (n_tests == cap_tests) {
        size_t cap = cap_tests ? 2 * cap_tests : 64;
        struct test *nt = realloc(tests, cap * sizeof(*nt));
        if (!nt) {
            fprintf(stderr, "runner: out of memory registering '%s'\n", name);
            exit(2);
        }
        tests = nt;
        cap_tests = cap;
    }
    tests[n_tests] = (struct test){name, file, fn, timeout_s > 0 ? timeout_s : 1, n_tests};
    n_tests++;
}

void test_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;

    fflush(stdout);
    fprintf(stderr, "%s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    if (shared)
        shared->outcome = OUT_FAIL;
    /* _exit: a failed test's leaks are noise, and atexit handlers may be what broke. */
    _exit(1);
}

void test_skip(const char *fmt, ...)
{
    va_list ap;

    fflush(stdout);
    fflush(stderr);
    if (shared && shared->outcome != OUT_FAIL) {
        va_start(ap, fmt);
        vsnprintf(shared->reason, sizeof(shared->reason), fmt, ap);
        va_end(ap);
        for (char *p = shared->reason; *p; p++)
            if (*p == '\n')
                *p = ' ';
        shared->outcome = OUT_SKIP;
    }
    _exit(SKIP_STATUS);
}

const char *test_tmpdir(void)
{
    if (mkdir(test_dir, 0700) < 0 && errno != EEXIST)
        test_fail(__FILE__, __LINE__, "cannot create '%s': %s", test_dir, strerror(errno));
    return test_dir;
}

const char *test_build_path(const char *name)
{
    snprintf(path_buf, sizeof(path_buf), "%s/%s", build_dir, name);
    return path_buf;
}

/* --- selection ------------------------------------------------------------------------------ */

/* A filter is a glob matched against the test's name, its file ("tests/test_frame.c"), the
 * file's base name, its stem ("test_frame") and its module ("frame"). A filter that starts
 * with the runner's name prefix ("asan/") is matched without it. */
static bool filter_match(const char *pat, const struct test *t)
{
    const char *base = strrchr(t->file, '/');
    char stem[256];
    size_t plen = strlen(name_prefix);

    if (plen && !strncmp(pat, name_prefix, plen))
        pat += plen;
    base = base ? base + 1 : t->file;
    snprintf(stem, sizeof(stem), "%s", base);
    if (strlen(stem) > 2 && !strcmp(stem + strlen(stem) - 2, ".c"))
        stem[strlen(stem) - 2] = '\0';
    if (!fnmatch(pat, t->name, 0) || !fnmatch(pat, t->file, 0) || !fnmatch(pat, base, 0) ||
        !fnmatch(pat, stem, 0))
        return true;
    return !strncmp(stem, "test_", 5) && !fnmatch(pat, stem + 5, 0);
}

static bool selected(const struct test *t, char **filters, int n_filters)
{
    if (n_filters == 0)
        return true;
    for (int i = 0; i < n_filters; i++)
        if (filter_match(filters[i], t))
            return true;
    return false;
}

static int cmp_test(const void *a, const void *b)
{
    const struct test *x = a, *y = b;
    int c = strcmp(x->file, y->file);
    return c ? c : (x->order > y->order) - (x->order < y->order);
}

/* --- processes ------------------------------------------------------------------------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The parent pid and state letter of pid from /proc. Returns 0, or -1 when it is gone. */
static int proc_stat(pid_t pid, pid_t *ppid, char *state)
{
    char path[64], buf[512];
    const char *p;
    ssize_t n;
    int fd;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    /* "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ')' ends it. */
    p = strrchr(buf, ')');
    if (!p || strlen(p) < 5)
        return -1;
    *state = p[2];
    *ppid = (pid_t)strtol(p + 4, NULL, 10);
    return 0;
}

/* Kills every child of the runner but keep (the finished test's zombie, which holds its group
 * id), reaps them, and goes on with their children, which come back to the runner, until none
 * is left. Returns how many were still running. */
static int sweep_leftovers(pid_t keep)
{
    pid_t self = getpid(), found[256];
    int running = 0;

    for (int round = 0; round < SWEEP_ROUNDS; round++) {
        DIR *d = opendir("/proc");
        struct dirent *de;
        size_t n = 0;

        if (!d)
            break;
        while ((de = readdir(d)) && n < sizeof(found) / sizeof(found[0])) {
            char *end, state;
            long pid = strtol(de->d_name, &end, 10);
            pid_t ppid;
            if (*end || pid <= 0 || pid == keep || proc_stat((pid_t)pid, &ppid, &state) < 0 ||
                ppid != self)
                continue;
            if (state != 'Z' && kill((pid_t)pid, SIGKILL) == 0)
                running++;
            found[n++] = (pid_t)pid;
        }
        closedir(d);
        if (n == 0)
            break;
        /* Once a killed process is reaped, its children have come back to us. */
        for (size_t i = 0; i < n; i++)
            waitpid(found[i], NULL, 0);
    }
    return running;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if (flag == FTW_DP || flag == FTW_D)
        rmdir(path);
    else
        unlink(path);
    return 0;
}

static void rm_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) == 0)
        nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* The body of the forked test process. */
static void run_child(const struct test *t, int out_fd)
{
    sigset_t none;
    int devnull;

    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGCHLD, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull >= 0) {
        dup2(devnull, 0);
        close(devnull);
    }
    dup2(out_fd, 1);
    dup2(out_fd, 2);
    close(out_fd);
    setvbuf(stdout, NULL, _IOLBF, 0);
    t->fn();
    if (shared->outcome != OUT_FAIL)
        shared->outcome = OUT_PASS;
    fflush(stdout);
    /* exit, not _exit: under ASan the leak check runs now and fails the test on a leak. */
    exit(0);
}

/* Prints the tail of the captured output as "# " lines. */
static void show_output(int fd)
{
    struct stat st;
    off_t start = 0;
    char buf[4096];
    bool bol = true;
    ssize_t n;

    if (fstat(fd, &st) < 0 || st.st_size == 0)
        return;
    if (st.st_size > SHOW_MAX) {
        start = st.st_size - SHOW_MAX;
        printf("# (%lld bytes of output cut)\n", (long long)start);
    }
    if (lseek(fd, start, SEEK_SET) < 0)
        return;
    while ((n = read(fd, buf, sizeof(buf))) > 0) {
        for (ssize_t i = 0; i < n; i++) {
            if (bol)
                fputs("# ", stdout);
            putchar(buf[i]);
            bol = buf[i] == '\n';
        }
    }
    if (!bol)
        putchar('\n');
}

/* Runs one test; prints its TAP line. Returns its outcome. */
static enum outcome run_test(const struct test *t, int number, int timeout_factor)
{
    char out_path[PATH_MAX + 16];
    enum outcome res = OUT_FAIL;
    double deadline;
    bool timed_out = false;
    siginfo_t info;
    sigset_t chld;
    int status = 0, out_fd, leftovers;
    pid_t pid;

    snprintf(test_dir, sizeof(test_dir), "%s/%d", base_dir, number);
    snprintf(out_path, sizeof(out_path), "%s/out.XXXXXX", base_dir);
    out_fd = mkstemp(out_path);
    if (out_fd < 0) {
        printf("not ok %d - %s%s\n# cannot create '%s': %s\n", number, name_prefix, t->name,
               out_path, strerror(errno));
        return OUT_FAIL;
    }
    unlink(out_path);
    memset(shared, 0, sizeof(*shared));
    fflush(stdout);
    fflush(stderr);

    pid = fork();
    if (pid < 0) {
        printf("not ok %d - %s%s\n# cannot fork: %s\n", number, name_prefix, t->name,
               strerror(errno));
        close(out_fd);
        return OUT_FAIL;
    }
    if (pid == 0)
        run_child(t, out_fd);
    setpgid(pid, pid);

    /* Wait for the test, reaping the orphans that come back to us meanwhile, so that a test
     * polling for a daemon's death (kill(pid, 0)) does not see a zombie forever. */
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    deadline = now_s() + (double)t->timeout_s * timeout_factor;
    for (;;) {
        memset(&info, 0, sizeof(info));
        if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid != 0) {
            if (info.si_pid == pid)
                break;
            waitpid(info.si_pid, NULL, 0);
            continue;
        }
        double left = deadline - now_s();
        if (left <= 0) {
            timed_out = true;
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            waitid(P_PID, (id_t)pid, &info, WEXITED | WNOWAIT);
            break;
        }
        if (left > 0.25)
            left = 0.25;
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        sigtimedwait(&chld, NULL, &ts);
    }
    /* The test process is a zombie now, so its pid (the group id) cannot be reused yet: kill
     * what is left of the test, then reap it. */
    leftovers = sweep_leftovers(pid);
    kill(-pid, SIGKILL);
    waitpid(pid, &status, 0);

    if (timed_out) {
        res = OUT_FAIL;
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && shared->outcome == OUT_PASS) {
        res = OUT_PASS;
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == SKIP_STATUS &&
               shared->outcome == OUT_SKIP) {
        res = OUT_SKIP;
    }

    if (res == OUT_PASS) {
        printf("ok %d - %s%s\n", number, name_prefix, t->name);
    } else if (res == OUT_SKIP) {
        printf("ok %d - %s%s # SKIP %s\n", number, name_prefix, t->name,
               shared->reason[0] ? shared->reason : "no reason given");
    } else {
        printf("not ok %d - %s%s\n", number, name_prefix, t->name);
        show_output(out_fd);
        if (timed_out)
            printf("# timed out after %d s (process group killed)\n",
                   t->timeout_s * timeout_factor);
        else if (WIFSIGNALED(status))
            printf("# killed by signal %d (%s)\n", WTERMSIG(status), strsignal(WTERMSIG(status)));
        else if (shared->outcome == OUT_FAIL && WEXITSTATUS(status) == 0)
            printf("# a process of the test failed a check\n");
        else if (shared->outcome == OUT_PASS)
            printf("# the checks passed, then the test exited with status %d (a report at exit: "
                   "a leak?)\n",
                   WEXITSTATUS(status));
        else if (shared->outcome != OUT_FAIL)
            printf("# exited with status %d before the end of the test\n", WEXITSTATUS(status));
    }
    if (leftovers > 0)
        printf("# %d process%s left running by the test (killed)\n", leftovers,
               leftovers == 1 ? "" : "es");
    fflush(stdout);
    close(out_fd);
    if (!getenv("TEST_KEEP_TMPDIR"))
        rm_tree(test_dir);
    else if (access(test_dir, F_OK) == 0)
        printf("# scratch dir kept: %s\n", test_dir);
    return res;
}

/* --- main ----------------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f, "usage: runner [--list] [--tap-only] [--tally FILE] [--prefix P] "
               "[--timeout-factor N] [PATTERN...]\n"
               "  PATTERN  a glob on a test's name, file, or module (\"frame\", \"frame_*\")\n"
               "  TEST_KEEP_TMPDIR=1 keeps each test's scratch dir\n");
}

static int find_build_dir(void)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    char *slash;

    if (n <= 0)
        return -1;
    exe[n] = '\0';
    /* The runner is BUILD/tests/runner: two components up is BUILD. */
    for (int i = 0; i < 2; i++) {
        slash = strrchr(exe, '/');
        if (!slash)
            return -1;
        *slash = '\0';
    }
    snprintf(build_dir, sizeof(build_dir), "%s", exe[0] ? exe : "/");
    return 0;
}

int main(int argc, char **argv)
{
    const char *tally = NULL, *tmp = getenv("TMPDIR");
    bool list = false, tap_only = false;
    int timeout_factor = 1, n_filters = 0, passed = 0, failed = 0, skipped = 0, number = 0;
    char **filters = calloc((size_t)argc, sizeof(*filters));
    sigset_t chld;

    if (!filters)
        return 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--list")) {
            list = true;
        } else if (!strcmp(a, "--tap-only")) {
            tap_only = true;
        } else if (!strcmp(a, "--tally") && i + 1 < argc) {
            tally = argv[++i];
        } else if (!strcmp(a, "--prefix") && i + 1 < argc) {
            name_prefix = argv[++i];
        } else if (!strcmp(a, "--timeout-factor") && i + 1 < argc) {
            timeout_factor = (int)strtol(argv[++i], NULL, 10);
            if (timeout_factor < 1 || timeout_factor > 100) {
                fprintf(stderr, "runner: --timeout-factor must be 1..100\n");
                return 2;
            }
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (a[0] == '-') {
            fprintf(stderr, "runner: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else {
            filters[n_filters++] = argv[i];
        }
    }

    qsort(tests, n_tests, sizeof(*tests), cmp_test);
    if (list) {
        for (size_t i = 0; i < n_tests; i++)
            if (selected(&tests[i], filters, n_filters))
                printf("%s%s\n", name_prefix, tests[i].name);
        free(filters);
        return 0;
    }

    if (find_build_dir() < 0) {
        fprintf(stderr, "runner: cannot find its own path in /proc/self/exe\n");
        return 2;
    }
    snprintf(base_dir, sizeof(base_dir), "%s/grt.XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (!mkdtemp(base_dir)) {
        fprintf(stderr, "runner: cannot create '%s': %s\n", base_dir, strerror(errno));
        return 2;
    }
    shared = mmap(NULL, sizeof(*shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) {
        fprintf(stderr, "runner: cannot map shared memory: %s\n", strerror(errno));
        return 2;
    }
    /* Orphans of a test come back to the runner, and SIGCHLD is taken with sigtimedwait. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    setvbuf(stdout, NULL, _IOLBF, 0);

    if (!tap_only) {
        int n = 0;
        for (size_t i = 0; i < n_tests; i++)
            n += selected(&tests[i], filters, n_filters);
        printf("1..%d\n", n);
    }
    for (size_t i = 0; i < n_tests; i++) {
        if (!selected(&tests[i], filters, n_filters))
            continue;
        switch (run_test(&tests[i], ++number, timeout_factor)) {
        case OUT_PASS:
            passed++;
            break;
        case OUT_SKIP:
            skipped++;
            break;
        default:
            failed++;
            break;
        }
    }
    rm_tree(base_dir);
    if (!tap_only)
        printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    if (tally) {
        FILE *f = fopen(tally, "a");
        if (!f || fprintf(f, "%d %d %d\n", passed, failed, skipped) < 0 || fclose(f) != 0) {
            fprintf(stderr, "runner: cannot append to '%s': %s\n", tally, strerror(errno));
            return 2;
        }
    }
    free(filters);
    return failed ? 1 : 0;
}
