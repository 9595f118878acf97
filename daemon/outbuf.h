/* The writer of the merged output stream: whole lines queued by the loop, up to a bound, and
 * written by a thread of its own, so that a slow, stopped or stalled reader of the stream (a
 * pager, Ctrl-S, a full pipe, a stalled file system) never blocks the loop. Past the bound,
 * lines are dropped and counted per source; once the queue drains, one notice per source
 * says how many, at the place where they are missing. */
#ifndef GPURUN_OUTBUF_H
#define GPURUN_OUTBUF_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

struct outbuf;

/* Formats the notice for `lines` lines of source src dropped since its last notice into buf
 * (cap bytes), one line ending in '\n'. Returns its length, at most cap; 0 for none. Called
 * on the loop's thread, from outbuf_line() or the loop, never from the writer thread. */
typedef size_t (*outbuf_notice_fn)(void *arg, int src, uint64_t lines, char *buf, size_t cap);

/* Called once, on the loop's thread, when a closed outbuf is done with the loop; unwritten:
 * the bytes it gave up on (a reader that read nothing for the linger time), else 0; lines:
 * the lines of the stream they and the drops not yet told of held, which never reached it. */
typedef void (*outbuf_closed_fn)(void *arg, size_t unwritten, uint64_t lines);

struct outbuf_config {
    int fd;                  /* borrowed: kept open by the caller for the process's life */
    size_t cap;              /* bytes queued at most; at least OUTBUF_LINE_MAX */
    int nsrc;                /* sources are 0..nsrc-1 */
    outbuf_notice_fn notice; /* NULL: drops are counted but never told */
    void *arg;               /* passed to notice */
};

/* The longest line: PIPE_BUF, so that one line is one write(2) that a pipe keeps whole. */
#define OUTBUF_LINE_MAX 4096

struct outbuf_stats {
    size_t queued;    /* bytes waiting for the writer thread */
    uint64_t written; /* bytes written to fd */
    uint64_t dropped; /* lines dropped, all sources, ever */
    int error;        /* the write error that stopped the stream (-EPIPE...), or 0 */
};

/* Starts the writer thread on cfg->fd. Writes are the blocking write(2)s of the fd as it is:
 * several whole lines at a time, at most PIPE_BUF bytes (64 KiB to a regular file), so that
 * lines of other processes writing the same pipe, tty or O_APPEND file never land inside
 * one of ours. Returns 0 with a new outbuf in *out (freed by outbuf_close()), or a negative
 * errno. Thread context: the loop's thread, as every function here. */
int outbuf_start(uv_loop_t *loop, const struct outbuf_config *cfg, struct outbuf **out);

/* Queues line[0..n) from source src; the line ends in '\n', or in '\r' for a redraw of the
 * terminal's line (a progress bar), and has neither before its end. Returns 0 when
 * queued; -ENOBUFS when dropped (counted for src's notice): the queue is full, or it filled
 * and has not drained yet; -EPIPE when the stream is gone (a write failed, or the outbuf is
 * closing); -EINVAL when n is 0 or over OUTBUF_LINE_MAX, src out of range, or no final
 * '\n' or '\r'. line is borrowed for the call. */
int outbuf_line(struct outbuf *o, int src, const char *line, size_t n);

/* Fills *st with the counters as they are now. */
void outbuf_stats(struct outbuf *o, struct outbuf_stats *st);

/* Stops taking lines and writes what is queued (with the notices still owed). Once all of it
 * is written, or the stream failed, or linger_ms pass with no byte written (a reader that
 * never reads must not hold the process), cb(arg, unwritten) is called from the loop. A
 * writer thread still blocked in write(2) then is left to the process's exit, and frees the
 * outbuf if its write ever returns; else the outbuf is freed before cb. o is invalid after
 * this call. */
void outbuf_close(struct outbuf *o, uint64_t linger_ms, outbuf_closed_fn cb, void *arg);

/* For the last word of a stream whose reader fell behind: forks a process that waits for this
 * one to exit (so that a write of ours still blocked then is over: done, or gone with us),
 * then writes text[0..n) (at most PIPE_BUF: one atomic write) to fd, blocking until the
 * reader takes it or goes away, and exits. It holds no other descriptor of ours, so no peer
 * sees a connection of ours outlive us. Returns 0, or a negative errno when it cannot start.
 * Thread context: any; call it last, as the process is about to exit. */
int outbuf_write_after_exit(int fd, const char *text, size_t n);

#endif
