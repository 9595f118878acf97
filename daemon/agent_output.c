/* The agent's output path: each rank's stdout and stderr, read from their pipes, go whole to
 * logs/rank-N.log (with its time index, logs/rank-N.idx) and line by line, labelled "[R] ", to
 * the merged stream (outbuf.h); the last lines of each rank are kept for its failure message,
 * and what a hang's capture brings is kept as the rank's stack. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent_int.h"
#include "linepart.h"
#include "log.h"
#include "logidx.h"
#include "outbuf.h"
#include "utf8.h"
#include "banned.h"

/* The most a closing stream reads of what its rank left in the pipe (ostream_drain). */
#define OSTREAM_DRAIN_MAX (1 << 20)

/* Writes to a rank log this close together share one index record (arank_log_append): the
 * order of lines across ranks is then known to this precision. */
#define INDEX_COALESCE_MS 20

/* A line is kept as valid UTF-8, cut at a character: the tail goes on the wire in a JSON
 * string, and one invalid byte would make the rank's exit message unsendable. */
void arank_tail_add(struct arank *r, const char *s, size_t n)
{
    utf8_sanitize(r->tail[r->tail_next], TAIL_LINE_MAX, s, n);
    r->tail_next = (r->tail_next + 1) % TAIL_LINES;
    if (r->tail_count < TAIL_LINES)
        r->tail_count++;
}

void arank_tail_join(const struct arank *r, char *out, size_t cap)
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
void arank_stack_append(struct arank *r, const char *s, size_t n)
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
    arank_stack_append(r, s, n);
    arank_stack_append(r, "\n", 1);
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
/* v with thousands separated by commas ("12,345"), in out. */
static const char *group_digits(uint64_t v, char out[48])
{
    char num[32];
    int n = snprintf(num, sizeof(num), "%" PRIu64, v), k = 0;

    for (int i = 0; i < n; i++) {
        if (i && (n - i) % 3 == 0)
            out[k++] = ',';
        out[k++] = num[i];
    }
    out[k] = '\0';
    return out;
}

static size_t output_notice(void *arg, int src, uint64_t lines, char *buf, size_t cap)
{
    struct agent *a = arg;
    char grouped[48];
    int w;

    group_digits(lines, grouped);
    if (src == a->nranks) /* the daemon's own log (log_to_stream) */
        w = snprintf(buf, cap, "[gpurun] %s line%s of rendezvousd's log not shown\n", grouped,
                     lines == 1 ? "" : "s");
    else
        w = snprintf(buf, cap, "[gpurun] %s line%s not shown; complete in logs/rank-%d.log\n",
                     grouped, lines == 1 ? "" : "s", a->ranks[src].rank);
    return w < 0 || (size_t)w >= cap ? 0 : (size_t)w;
}

/* Whether fds a and b are the same file (2>&1, one terminal). */
static bool same_file(int a, int b)
{
    struct stat sa, sb;

    return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
           sa.st_ino == sb.st_ino;
}

/* The ranks' stdout goes to ours and their stderr to ours, as torchrun's do, each through a
 * writer of its own; where both of ours are one file, one writer takes both, so that the
 * lines of the two keep their order there. */
/* The daemon's log records, queued on the stream that holds our stderr (the ranks' stderr
 * writer, or stdout's where both are one file), as the daemon's own source: a record never
 * waits behind a reader the ranks' output filled, which would stop the loop and its
 * heartbeats. A record the queue cannot take is dropped and counted like a rank's line. */
static int log_to_stream(void *arg, const char *line, size_t n)
{
    struct agent *a = arg;
    struct outbuf *o = a->err_out ? a->err_out : a->out;
    int r = o ? outbuf_line(o, a->nranks, line, n) : -EPIPE;

    return r == 0 || r == -ENOBUFS ? 0 : -1;
}

int agent_output_start(struct agent *a)
{
    struct outbuf_config cfg = {
        .fd = STDOUT_FILENO,
        .cap = OUTPUT_QUEUE_MAX,
        .nsrc = (a->nranks > 0 ? a->nranks : 1) + 1, /* the ranks, and the daemon's log */
        .notice = output_notice,
        .arg = a,
    };
    int ret = outbuf_start(a->loop, &cfg, &a->out);

    a->out_tty = isatty(STDOUT_FILENO) == 1;
    a->err_tty = isatty(STDERR_FILENO) == 1;
    if (ret < 0)
        return ret;
    if (!same_file(STDOUT_FILENO, STDERR_FILENO)) {
        cfg.fd = STDERR_FILENO;
        /* Without a writer of its own, stderr's lines share stdout's. */
        if (outbuf_start(a->loop, &cfg, &a->err_out) < 0)
            a->err_out = NULL;
    }
    /* Only where our log is that stream: a log to a file of its own never waits on a reader. */
    if (a->err_out || same_file(STDOUT_FILENO, STDERR_FILENO))
        log_set_sink(log_to_stream, a);
    return 0;
}

/* The stream's last word when its reader fell behind at the end: how many lines it never
 * got, and where they are. Written by a process of its own once we have exited (outbuf.h), so
 * that a reader who comes back finds it at the end of what it reads. */
static void output_end_notice(struct agent *a, int fd, uint64_t lines)
{
    char grouped[48], text[256];
    int w, r;

    group_digits(lines, grouped);
    if (a->nranks > 1)
        w = snprintf(text, sizeof(text),
                     "[gpurun] %s line%s not shown (the reader fell behind as the job ended); "
                     "complete in logs/rank-%d.log to rank-%d.log\n",
                     grouped, lines == 1 ? "" : "s", a->rank_base, a->rank_base + a->nranks - 1);
    else
        w = snprintf(text, sizeof(text),
                     "[gpurun] %s line%s not shown (the reader fell behind as the job ended); "
                     "complete in logs/rank-%d.log\n",
                     grouped, lines == 1 ? "" : "s", a->rank_base);
    if (w <= 0 || (size_t)w >= sizeof(text))
        return;
    r = outbuf_write_after_exit(fd, text, (size_t)w);
    if (r < 0)
        log_warn("cannot leave the stream its last notice: %s", strerror(-r));
}

static void on_output_closed(void *arg, size_t unwritten, uint64_t lines)
{
    struct agent *a = arg;

    if (lines)
        output_end_notice(a, STDOUT_FILENO, lines);
    /* Not to a stderr that is the stream no one reads: the warning would block the loop. */
    if (unwritten && !same_file(STDOUT_FILENO, STDERR_FILENO))
        log_warn("cannot write the last %zu bytes of the ranks' output: its reader read nothing "
                 "for %d ms (each rank's output is complete in logs/)",
                 unwritten, OUTPUT_LINGER_MS);
    a->handles_open--;
    agent_maybe_free(a);
}

/* The same for the ranks' stderr, our stderr: no warning there, as that is what is stuck. */
static void on_err_output_closed(void *arg, size_t unwritten, uint64_t lines)
{
    struct agent *a = arg;

    (void)unwritten;
    if (lines)
        output_end_notice(a, STDERR_FILENO, lines);
    a->handles_open--;
    agent_maybe_free(a);
}

/* After the ranks' streams are closed (their last partial lines queued): the rest of the
 * queues is written, for OUTPUT_LINGER_MS of a reader reading nothing at most. */
void agent_output_close(struct agent *a)
{
    log_set_sink(NULL, NULL);
    if (a->err_out) {
        a->handles_open++;
        outbuf_close(a->err_out, OUTPUT_LINGER_MS, on_err_output_closed, a);
        a->err_out = NULL;
    }
    if (!a->out)
        return;
    a->handles_open++;
    outbuf_close(a->out, OUTPUT_LINGER_MS, on_output_closed, a);
    a->out = NULL;
}

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
int arank_log_append(struct arank *r, const void *data, size_t n)
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
    r->log_midline = ((const char *)data)[w - 1] != '\n';
    if (!r->idx_ms)
        r->idx_ms = t > 0 ? t : 1;
    return w == (ssize_t)n ? 0 : -1;
}

/* Opens the rank's log and its index (arank_log_append), unless open already (a restart keeps
 * them). Without an index the log is still written. In a requeued job the log goes on from
 * the last segment's, after a line that says so. */
void agent_open_log(struct agent *a, struct arank *r)
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
        (void)arank_log_append(r, line, (size_t)n);
    }
}

/* A line in the log of a rank the daemon ends (teardown), saying why: its own output may stop
 * mid-line, and a reader of its log alone learns what ended it. */
void agent_mark_ended(struct arank *r, const char *cause)
{
    char line[512], when[32];
    time_t t = time(NULL);
    struct tm tm;
    int n;

    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    n = snprintf(line, sizeof(line), "%s----- gpurun: %s: the rank is ended: %s -----\n",
                 r->log_midline ? "\n" : "", when, cause);
    if (n >= (int)sizeof(line)) {
        n = (int)sizeof(line) - 1;
        line[n - 1] = '\n';
    }
    (void)arank_log_append(r, line, (size_t)n);
}

/* A line in every rank log between two generations, so that a reader sees where the
 * restarted ranks' output begins. */
void agent_mark_restart(struct agent *a, int generation)
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
        (void)arank_log_append(&a->ranks[i], line, (size_t)n);
}

void agent_flush_index(struct agent *a)
{
    for (int i = 0; i < a->nranks; i++)
        if (a->ranks[i].idx_ms && wall_ms() - a->ranks[i].idx_ms >= INDEX_COALESCE_MS)
            index_flush(&a->ranks[i]);
}

void arank_close_log(struct arank *r)
{
    index_flush(r);
    if (r->logfd >= 0)
        close(r->logfd);
    if (r->idxfd >= 0)
        close(r->idxfd);
}

/* Whether o's rank output goes to a terminal: our stdout, or our stderr where the ranks'
 * stderr has a writer of its own. */
static bool ostream_tty(const struct ostream *o)
{
    struct agent *a = o->agent;

    return o->is_err && a->err_out ? a->err_tty : a->out_tty;
}

/* One stream line "[R] text" and its end, queued whole: the writer writes whole lines of at
 * most PIPE_BUF bytes, so lines of ranks and of other daemons sharing the terminal or pipe
 * never interleave inside a line. end is '\n', or '\r' for a redraw of the terminal's line
 * (a progress bar, or a line not yet ended shown as it stands). A file or a pipe gets a
 * redraw as a line of its own: there a '\r' would leave every rank's redraws on one line,
 * mixed, where a terminal draws each over the last. A rank left out by --output-ranks (muted)
 * has nothing on the stream; its log, last line and tail are kept as any rank's. */
_Static_assert(LINE_MAX_LEN + 32 <= OUTBUF_LINE_MAX, "a labelled line must fit one write");
static void stream_put(struct arank *r, const char *s, size_t n, bool is_err, char end)
{
    char buf[LINE_MAX_LEN + 32];
    int h = snprintf(buf, sizeof(buf), "[%d] ", r->rank);
    bool to_err = is_err && r->agent->err_out;
    struct outbuf *o = to_err ? r->agent->err_out : r->agent->out;
    size_t len;

    if (r->muted)
        return;
    if (end == '\r' && !(to_err ? r->agent->err_tty : r->agent->out_tty))
        end = '\n';
    if (n > sizeof(buf) - (size_t)h - 1)
        n = sizeof(buf) - (size_t)h - 1;
    memcpy(buf + h, s, n);
    len = (size_t)h + n;
    buf[len++] = end;
    /* A '\n' or '\r' inside the text cannot come from stream_take(); a dropped line is
     * counted. */
    if (o)
        outbuf_line(o, r->local, buf, len);
}

/* The last line is the rank's own: a hang's capture (gpurun's note, the stack dumps) leaves
 * it as it was. Control bytes (escape sequences) become '?', as the line is shown in a table
 * and a cause. */
static void last_line_set(struct arank *r, const char *s, size_t n)
{
    if (n && r->agent->state != AG_CAPTURE) {
        utf8_sanitize(r->last_line, sizeof(r->last_line), s, n);
        for (char *p = r->last_line; *p; p++)
            if ((unsigned char)*p < 0x20 || *p == 0x7f)
                *p = *p == '\t' ? ' ' : '?';
        r->output_dirty = true;
    }
}

void arank_emit_line(struct arank *r, const char *s, size_t n, bool is_err)
{
    stream_put(r, s, n, is_err, '\n');
    last_line_set(r, s, n);
    arank_tail_add(r, s, n);
}

/* The end of o's line line[0..n) (its newline, or the cut of a line too long): the stream gets
 * what it has not shown of it (linepart.h), the last line and the tail all of it. */
static void line_end(struct ostream *o, size_t n)
{
    struct arank *r = o->rank;
    size_t from = linepart_rest(o->shown, ostream_tty(o));

    if (from > n)
        from = n;
    /* An empty line is a line; one a file has whole already is not written again. */
    if (n > from || !o->shown)
        stream_put(r, o->line + from, n - from, o->is_err, '\n');
    last_line_set(r, o->line, n);
    arank_tail_add(r, o->line, n);
}

static int64_t mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A line that waited without its end is shown as it stands (linepart.h): a redraw on a
 * terminal, which its end or the next redraw overwrites; in a file, a labelled line that what
 * the rank adds to it later follows as another, so that a reader of a batch output file under
 * tail -f sees a progress bar's state while it is current, not one step late. */
static void partial_show(struct ostream *o, int64_t now)
{
    struct linepart p;

    if (!o || !o->rank ||
        !linepart_due(o->line, o->len, o->shown, now - o->last_ms, ostream_tty(o), &p))
        return;
    stream_put(o->rank, o->line + p.from, p.to - p.from, o->is_err, '\r');
    last_line_set(o->rank, o->line, p.to);
    o->shown = p.to;
}

int agent_output_columns(const struct agent *a)
{
    struct winsize ws;

    if (a->out_tty && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    if (a->err_out && a->err_tty && ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    /* A Slurm job's output goes to the batch output file, which gpurun --wait may show on a
     * terminal: its width, as gpurun read it at the submit. */
    return a->spec->term_cols;
}

void agent_output_tick(struct agent *a)
{
    int64_t now = mono_ms();

    for (int i = 0; i < a->nranks; i++) {
        partial_show(a->ranks[i].out, now);
        partial_show(a->ranks[i].err, now);
    }
}

/* The rank's log gets every byte, synchronously: it is a regular file in the job dir, where
 * the kernel's page cache takes a write without waiting for a reader; bounded and dropped it
 * would no longer be complete, and unbounded it would only move the wait into our memory. A
 * job dir on a stalled file system stalls the job's other files there too. */
/* A '\r' that is not the first half of "\r\n" ends a segment of a line that the terminal
 * draws over (tqdm's bars): it goes to the stream as a redraw, and not into the tail, whose
 * lines are those that ended. A '\r' at the end of a read waits for the next byte (cr). */
static void stream_take(struct ostream *o, const char *data, size_t n)
{
    struct arank *r = o->rank;

    if (arank_log_append(r, data, n) < 0)
        log_debug("cannot write rank %d's log: %s", r->rank, strerror(errno));
    o->last_ms = mono_ms();
    r->output_ms = (int64_t)uv_now(r->agent->loop);
    r->output_dirty = true;
    for (size_t i = 0; i < n; i++) {
        char c = data[i];
        if (o->cr) {
            o->cr = false;
            if (c == '\r') { /* "\r\r": one, whatever follows */
                o->cr = true;
                continue;
            }
            if (c != '\n' && o->len) {
                size_t from = linepart_rest(o->shown, ostream_tty(o));
                if (o->len > o->shown) /* else the tick showed it as it stands */
                    stream_put(r, o->line + from, o->len - from, o->is_err, '\r');
                last_line_set(r, o->line, o->len);
                o->len = 0;
                o->shown = 0;
            }
        }
        if (c == '\r') {
            o->cr = true;
            continue;
        }
        if (c == '\n' || o->len == sizeof(o->line)) {
            /* A line past LINE_MAX_LEN goes on in pieces, each cut between characters: a
             * character that c continues starts the next piece. */
            size_t cut = c == '\n' ? o->len : utf8_cut_len(o->line, o->len, (unsigned char)c);
            /* After SIGABRT, what a Python rank writes on stderr is faulthandler's dump. */
            if (o->is_err && r->cap == CAP_PYTHON)
                stack_add(r, o->line, cut);
            line_end(o, cut);
            memmove(o->line, o->line + cut, o->len - cut);
            o->len -= cut;
            o->shown = 0;
            if (c == '\n')
                continue;
        }
        o->line[o->len++] = c;
    }
}

static char out_chunk[64 * 1024];

void agent_on_out_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    *buf = uv_buf_init(out_chunk, sizeof(out_chunk));
}

static void on_stream_closed(uv_handle_t *h)
{
    struct ostream *o = h->data;
    struct agent *a = o->agent;

    free(o);
    a->handles_open--;
    agent_check_done(a);
    agent_maybe_free(a);
}

/* What the rank (or its shim) wrote before the close and was not read yet, taken at once:
 * the last words of a rank ended while its daemon did not run (the shim's why, written just
 * before the rank's end) must reach its log, whatever the loop handles first after it runs
 * again. At most OSTREAM_DRAIN_MAX bytes, for a rank still writing; never a blocking read. */
static void ostream_drain(struct ostream *o)
{
    char buf[16384];
    uv_os_fd_t fd;
    size_t total = 0;

    if (!o->rank || uv_fileno((const uv_handle_t *)&o->pipe, &fd) < 0)
        return;
    while (total < OSTREAM_DRAIN_MAX) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        ssize_t n;
        if (poll(&pfd, 1, 0) != 1 || !(pfd.revents & POLLIN))
            return;
        n = read(fd, buf, sizeof(buf));
        if (n <= 0)
            return;
        stream_take(o, buf, (size_t)n);
        total += (size_t)n;
    }
}

/* Takes what is left to read, flushes a partial last line, detaches the stream from its
 * rank and closes it. */
void ostream_close(struct ostream **slot)
{
    struct ostream *o = *slot;

    if (!o)
        return;
    *slot = NULL;
    ostream_drain(o);
    if (o->len) {
        line_end(o, o->len);
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
        ostream_close(r->out == o ? &r->out : &r->err);
}

struct ostream *ostream_new(struct agent *a, struct arank *r)
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

int ostream_read_start(struct ostream *o)
{
    return uv_read_start((uv_stream_t *)&o->pipe, agent_on_out_alloc, on_out_read);
}
