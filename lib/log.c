/* The logger: formats a record into a stack buffer and writes it with one write(2). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "utf8.h"
#include "banned.h"

enum log_level log_threshold = LOG_WARN;
static const char *log_program = "gpurun";
static int log_fd = 2;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

static log_sink_fn log_sink;
static void *log_sink_arg;
static pthread_t log_sink_thread;

void log_set_sink(log_sink_fn sink, void *arg)
{
    log_sink = sink;
    log_sink_arg = arg;
    log_sink_thread = pthread_self();
}

void log_setup(const char *program, int fd, enum log_level threshold)
{
    log_program = program;
    log_fd = fd;
    log_threshold = threshold;
}

int log_level_parse(const char *s, enum log_level *out)
{
    for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
        if (!strcmp(s, level_names[i])) {
            *out = (enum log_level)i;
            return 0;
        }
    }
    return -EINVAL;
}

void log_write(enum log_level level, const char *fmt, ...)
{
    char line[LOG_LINE_MAX], text[LOG_LINE_MAX];
    struct timeval tv;
    struct tm tm;
    size_t n;
    int saved = errno;
    va_list ap;

    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
    n += (size_t)snprintf(line + n, sizeof(line) - n,
                          ".%03ldZ %s[%ld] %s: ", (long)(tv.tv_usec / 1000), log_program,
                          (long)getpid(), level_names[level]);
    if (n < sizeof(line) - 1) {
        /* What a record quotes (a rank's last lines, its exception, a path, a hostname) may
         * hold escape sequences and newlines: escaped, so that a record is one line and never
         * drives the terminal that shows it. */
        va_start(ap, fmt);
        int m = vsnprintf(text, sizeof(text), fmt, ap);
        va_end(ap);
        if (m > 0)
            n += utf8_escape_controls(line + n, sizeof(line) - n, text,
                                      (size_t)m < sizeof(text) ? (size_t)m : sizeof(text) - 1);
    }
    if (n > sizeof(line) - 2)
        n = sizeof(line) - 2;
    line[n++] = '\n';
    if (log_sink && pthread_equal(pthread_self(), log_sink_thread) &&
        log_sink(log_sink_arg, line, n) == 0) {
        errno = saved;
        return;
    }
    /* A short write to a log is not worth a retry loop: the record is advisory. */
    if (write(log_fd, line, n) < 0)
        errno = saved;
    errno = saved;
}
