/* Tests of daemon/outbuf: lines pass whole and in order, a full queue drops and counts lines
 * and tells the count where they are missing once it drains, two writers on one pipe never
 * mix their lines, a reader that never reads holds the close for the linger time only, a
 * reader that quits ends the stream, bad lines are refused. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <uv.h>

#include "../daemon/outbuf.h"
#include "test.h"
#include "banned.h"

struct fixture {
    uv_loop_t loop;
    int rfd, wfd;
    bool closed;
    size_t unwritten; /* as the close callback said */
    uint64_t lines;   /* the same */
    char *got;        /* what was read from the pipe */
    size_t got_len, got_cap;
};

static void fixture_init(struct fixture *f, int pipe_size)
{
    int p[2];

    memset(f, 0, sizeof(*f));
    CHECK_EQ(uv_loop_init(&f->loop), 0);
    CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
    f->rfd = p[0];
    f->wfd = p[1];
    if (pipe_size)
        CHECK(fcntl(f->wfd, F_SETPIPE_SZ, pipe_size) >= pipe_size);
    CHECK_EQ(fcntl(f->rfd, F_SETFL, O_NONBLOCK), 0);
}

/* Reads what the pipe holds now into f->got. */
static void fixture_read(struct fixture *f)
{
    for (;;) {
        ssize_t n;

        if (f->got_cap - f->got_len < 65536) {
            f->got_cap = f->got_cap * 2 + 65536;
            f->got = realloc(f->got, f->got_cap + 1);
            CHECK(f->got);
        }
        n = read(f->rfd, f->got + f->got_len, f->got_cap - f->got_len);
        if (n <= 0)
            break;
        f->got_len += (size_t)n;
    }
    if (f->got)
        f->got[f->got_len] = '\0';
}

static void on_closed(void *arg, size_t unwritten, uint64_t lines)
{
    struct fixture *f = arg;

    f->closed = true;
    f->unwritten = unwritten;
    f->lines = lines;
}

static void on_closed_flag(void *arg, size_t unwritten, uint64_t lines)
{
    CHECK_EQ(unwritten, 0);
    CHECK_EQ(lines, 0);
    *(bool *)arg = true;
}

/* Runs the loop (reading the pipe when read is set) until f->closed, for at most ms. */
static void fixture_run_until_closed(struct fixture *f, bool read, int ms)
{
    uint64_t until = uv_hrtime() + (uint64_t)ms * 1000000;

    while (!f->closed && uv_hrtime() < until) {
        uv_run(&f->loop, UV_RUN_NOWAIT);
        if (read)
            fixture_read(f);
        usleep(1000);
    }
    if (!f->closed)
        test_fail(__FILE__, __LINE__, "the outbuf did not close in %d ms", ms);
}

static void fixture_release(struct fixture *f)
{
    uv_run(&f->loop, UV_RUN_NOWAIT);
    CHECK_EQ(uv_loop_close(&f->loop), 0);
    close(f->rfd);
    if (f->wfd >= 0)
        close(f->wfd);
    free(f->got);
}

static size_t test_notice(void *arg, int src, uint64_t lines, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "notice: src %d dropped %" PRIu64 "\n", src, lines);

    (void)arg;
    return (size_t)n;
}

/* Queues "s<src> <k>\n" padded with 'x' to len bytes; returns outbuf_line()'s result. */
static int put(struct outbuf *o, int src, int k, size_t len)
{
    char line[OUTBUF_LINE_MAX];
    int n = snprintf(line, sizeof(line), "s%d %d ", src, k);

    memset(line + n, 'x', len - (size_t)n - 1);
    line[len - 1] = '\n';
    return outbuf_line(o, src, line, len);
}

TEST(outbuf_lines_pass_in_order)
{
    struct fixture f;
    struct outbuf_config cfg = {.cap = 1 << 20, .nsrc = 2, .notice = test_notice};
    struct outbuf *o;
    struct outbuf_stats st;
    char want[64];
    const char *p;

    fixture_init(&f, 0);
    cfg.fd = f.wfd;
    CHECK_EQ(outbuf_start(&f.loop, &cfg, &o), 0);
    for (int k = 0; k < 20000; k++)
        CHECK_EQ(put(o, k % 2, k, 20), 0);
    outbuf_stats(o, &st);
    CHECK_EQ(st.dropped, 0);
    outbuf_close(o, 5000, on_closed, &f);
    fixture_run_until_closed(&f, true, 10000);
    fixture_read(&f);
    CHECK_EQ(f.got_len, 20000 * 20);
    p = f.got;
    for (int k = 0; k < 20000; k++, p += 20) {
        snprintf(want, sizeof(want), "s%d %d ", k % 2, k);
        if (strncmp(p, want, strlen(want)) || p[19] != '\n')
            test_fail(__FILE__, __LINE__, "line %d: expected \"%s...\", got \"%.19s\"", k, want, p);
    }
    fixture_release(&f);
}

/* A reader that does not read: the pipe (4 KiB) and the queue (8 KiB) fill, every line after
 * that is dropped (-ENOBUFS) until the queue drains, even when there is room again; the
 * notices then come before the first line taken after the drops, with the exact counts. */
TEST(outbuf_drops_counts_and_tells)
{
    struct fixture f;
    struct outbuf_config cfg = {.cap = 8192, .nsrc = 3, .notice = test_notice};
    struct outbuf *o;
    struct outbuf_stats st;
    int queued[3] = {0}, dropped[3] = {0}, k = 0, shown[3] = {0}, notice[3] = {0};
    char *line, *save = NULL;
    bool after = false;

    fixture_init(&f, 4096);
    cfg.fd = f.wfd;
    CHECK_EQ(outbuf_start(&f.loop, &cfg, &o), 0);
    /* 100-byte lines from sources 0 and 1 (2 never writes). */
    for (; k < 400; k++) {
        int r = put(o, k % 2, k, 100);

        CHECK(r == 0 || r == -ENOBUFS);
        (r == 0 ? queued : dropped)[k % 2]++;
        if (k == 300) {
            /* Let the writer fill the pipe: the queue holds 8 KiB after it, no more. */
            usleep(100000);
        }
    }
    outbuf_stats(o, &st);
    CHECK_EQ(st.dropped, dropped[0] + dropped[1]);
    CHECK(dropped[0] > 0 && dropped[1] > 0);
    /* At most the pipe, a batch blocked in write(2) and the queue. */
    CHECK(queued[0] + queued[1] <= (4096 + 4096 + 8192) / 100 + 1);
    /* Some room now (4 KiB read), but the queue has not drained: still dropped. */
    uv_run(&f.loop, UV_RUN_NOWAIT);
    fixture_read(&f);
    usleep(100000);
    outbuf_stats(o, &st);
    if (st.queued) {
        CHECK_EQ(put(o, 0, k, 100), -ENOBUFS);
        dropped[0]++;
    }
    /* The reader catches up: the queue drains, the notices are queued on the loop. */
    for (int i = 0; i < 1000; i++) {
        fixture_read(&f);
        uv_run(&f.loop, UV_RUN_NOWAIT);
        outbuf_stats(o, &st);
        if (!st.queued && strstr(f.got ? f.got : "", "notice: src 1"))
            break;
        usleep(2000);
    }
    CHECK_EQ(put(o, 0, 9999, 100), 0);
    outbuf_close(o, 5000, on_closed, &f);
    fixture_run_until_closed(&f, true, 10000);
    fixture_read(&f);
    for (line = strtok_r(f.got, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        int src, n;
        uint64_t count;

        if (sscanf(line, "notice: src %d dropped %" SCNu64, &src, &count) == 2) {
            CHECK(!after);
            CHECK(src >= 0 && src < 2);
            CHECK_EQ(count, dropped[src]);
            notice[src]++;
        } else if (sscanf(line, "s%d %d ", &src, &n) == 2 && strlen(line) == 99) {
            if (n == 9999)
                after = true;
            else
                shown[src]++;
        } else {
            test_fail(__FILE__, __LINE__, "not a whole line: \"%s\"", line);
        }
    }
    CHECK(after);
    CHECK_EQ(notice[0], 1);
    CHECK_EQ(notice[1], 1);
    CHECK_EQ(shown[0], queued[0]);
    CHECK_EQ(shown[1], queued[1]);
    fixture_release(&f);
}

/* Two writers on one pipe, as two daemons on gpurun's stdout: with a slow reader, every line
 * of 1,500 bytes still arrives whole. */
TEST(outbuf_two_writers_keep_lines_whole)
{
    struct fixture f;
    struct outbuf_config cfg = {.cap = 1 << 20, .nsrc = 1, .notice = test_notice};
    struct outbuf *o[2];
    bool closed2 = false;
    int lines = 0;
    char *line, *save = NULL;

    fixture_init(&f, 4096);
    cfg.fd = f.wfd;
    CHECK_EQ(outbuf_start(&f.loop, &cfg, &o[0]), 0);
    CHECK_EQ(outbuf_start(&f.loop, &cfg, &o[1]), 0);
    for (int k = 0; k < 300; k++) {
        char l[1500];

        memset(l, 'a' + k % 2, sizeof(l) - 1);
        l[sizeof(l) - 1] = '\n';
        CHECK_EQ(outbuf_line(o[k % 2], 0, l, sizeof(l)), 0);
    }
    outbuf_close(o[1], 5000, on_closed_flag, &closed2);
    outbuf_close(o[0], 5000, on_closed, &f);
    fixture_run_until_closed(&f, true, 10000);
    for (int i = 0; i < 5000 && !closed2; i++) {
        uv_run(&f.loop, UV_RUN_NOWAIT);
        fixture_read(&f);
        usleep(1000);
    }
    CHECK(closed2);
    fixture_read(&f);
    CHECK_EQ(f.got_len, 300 * 1500);
    for (line = strtok_r(f.got, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strlen(line) != 1499 || strspn(line, line[0] == 'a' ? "a" : "b") != 1499)
            test_fail(__FILE__, __LINE__, "line %d is not whole: \"%.40s...\"", lines, line);
        lines++;
    }
    CHECK_EQ(lines, 300);
    fixture_release(&f);
}

/* A reader that never reads: the close gives up after the linger time, not before, and the
 * loop ends with nothing left open. */
TEST(outbuf_close_gives_up_on_a_reader_that_never_reads)
{
    struct fixture f;
    struct outbuf_config cfg = {.cap = 65536, .nsrc = 1};
    struct outbuf *o;
    uint64_t t0;
    double ms;
    int in_pipe;

    fixture_init(&f, 4096);
    cfg.fd = f.wfd;
    CHECK_EQ(outbuf_start(&f.loop, &cfg, &o), 0);
    /* A first batch of 5 lines written before the rest is queued (the case of a writer thread
     * that ran while the lines came: a loaded machine's order); then the loop sleeps, so its
     * cached time is old when the close starts the linger. Every batch taken after the 200
     * lines are queued is 40 lines (4,000 bytes, the most whole lines of one atomic pipe
     * write), and none fits beside the first. A busy machine has kept the writer off the CPU
     * for over 2 s: up to 20 s. */
    for (int k = 0; k < 5; k++)
        CHECK_EQ(put(o, 0, k, 100), 0);
    for (int i = 0, queued = 0; queued < 500; i++) {
        CHECK_INT(i, <, 20000);
        CHECK_EQ(ioctl(f.rfd, FIONREAD, &queued), 0);
        if (queued < 500)
            usleep(1000);
    }
    for (int k = 5; k < 200; k++)
        CHECK_EQ(put(o, 0, k, 100), 0);
    usleep(100 * 1000);
    t0 = uv_hrtime();
    outbuf_close(o, 300, on_closed, &f);
    fixture_run_until_closed(&f, false, 5000);
    ms = (double)(uv_hrtime() - t0) / 1e6;
    if (ms < 290 || ms > 2000)
        test_fail(__FILE__, __LINE__, "closed after %.0f ms, expected about 300", ms);
    /* 20,000 bytes queued: the pipe (one page) took whole lines, the next batch waits in
     * write(2) for room, counted unwritten with the rest. */
    CHECK_EQ(ioctl(f.rfd, FIONREAD, &in_pipe), 0);
    CHECK_INT(in_pipe, >=, 500);
    CHECK_INT(in_pipe, <=, 4096);
    CHECK_EQ(in_pipe % 100, 0);
    CHECK_EQ(f.unwritten, 20000 - (size_t)in_pipe);
    CHECK_EQ(f.lines, 200 - in_pipe / 100);
    /* The writer thread is still blocked in write(2); the pipe stays open under it. */
    f.wfd = -1;
    fixture_release(&f);
}

/* The last word of a stream: written by a process of its own only once its caller has
 * exited, whole, and with none of the caller's other descriptors held open. */
TEST(outbuf_write_after_exit_waits_for_the_exit)
{
    int p[2], sp[2], st;
    char buf[64];
    struct pollfd pfd;
    pid_t pid;
    ssize_t n;

    CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        close(sp[0]);
        if (outbuf_write_after_exit(p[1], "the end\n", 8) < 0)
            _exit(2);
        usleep(300 * 1000);
        _exit(0);
    }
    close(p[1]);
    close(sp[1]);
    /* Nothing while the caller lives. */
    pfd = (struct pollfd){.fd = p[0], .events = POLLIN};
    CHECK_EQ(poll(&pfd, 1, 150), 0);
    CHECK_EQ(waitpid(pid, &st, 0), pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* Then the text, whole, and the end of the stream once it is written. */
    CHECK_EQ(poll(&pfd, 1, 5000), 1);
    n = read(p[0], buf, sizeof(buf));
    CHECK_EQ(n, 8);
    CHECK(!memcmp(buf, "the end\n", 8));
    CHECK_EQ(poll(&pfd, 1, 5000), 1);
    CHECK_EQ(read(p[0], buf, sizeof(buf)), 0);
    /* The caller's socket is closed: its peer sees the end, not a process holding it. */
    pfd = (struct pollfd){.fd = sp[0], .events = POLLIN};
    CHECK_EQ(poll(&pfd, 1, 1000), 1);
    CHECK_EQ(read(sp[0], buf, sizeof(buf)), 0);
    close(p[0]);
    close(sp[0]);
}

/* A reader that quits: the stream ends (-EPIPE), and the close does not wait. */
TEST(outbuf_reader_gone)
{
    struct fixture f;
    struct outbuf_config cfg = {.cap = 65536, .nsrc = 1};
    struct outbuf *o;
    struct outbuf_stats st = {0};
    int r = 0;

    fixture_init(&f, 0);
    cfg.fd = f.wfd;
    CHECK_EQ(outbuf_start(&f.loop, &cfg, &o), 0);
    close(f.rfd);
    f.rfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    for (int i = 0; i < 2000 && r != -EPIPE; i++) {
        r = put(o, 0, i, 50);
        usleep(1000);
    }
    CHECK_EQ(r, -EPIPE);
    outbuf_stats(o, &st);
    CHECK_EQ(st.error, -EPIPE);
    outbuf_close(o, 60000, on_closed, &f);
    fixture_run_until_closed(&f, false, 2000);
    fixture_release(&f);
}

TEST(outbuf_refuses_bad_lines)
{
    struct fixture f;
    struct outbuf_config cfg = {.cap = 65536, .nsrc = 2};
    struct outbuf *o;
    static char big[OUTBUF_LINE_MAX + 1];

    fixture_init(&f, 0);
    cfg.fd = f.wfd;
    CHECK_EQ(outbuf_start(&f.loop, &cfg, &o), 0);
    memset(big, 'x', sizeof(big));
    big[sizeof(big) - 1] = '\n';
    CHECK_EQ(outbuf_line(o, 0, "no newline", 10), -EINVAL);
    CHECK_EQ(outbuf_line(o, 0, "two\nlines\n", 10), -EINVAL);
    CHECK_EQ(outbuf_line(o, 0, "", 0), -EINVAL);
    CHECK_EQ(outbuf_line(o, 2, "src\n", 4), -EINVAL);
    CHECK_EQ(outbuf_line(o, -1, "src\n", 4), -EINVAL);
    CHECK_EQ(outbuf_line(o, 1, big, sizeof(big)), -EINVAL);
    CHECK_EQ(outbuf_line(o, 1, big + 1, sizeof(big) - 1), 0);
    outbuf_close(o, 5000, on_closed, &f);
    fixture_run_until_closed(&f, true, 5000);
    fixture_read(&f);
    CHECK_EQ(f.got_len, OUTBUF_LINE_MAX);
    fixture_release(&f);
}
