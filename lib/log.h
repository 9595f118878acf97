/* The one logger of gpurun's programs: one line per record, "time program[pid] level: text".
 * The program chooses the sink and level; the macros check the level before formatting. */
#ifndef GPURUN_LOG_H
#define GPURUN_LOG_H

#include <stdarg.h>

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

/* The level at or below which records are written; LOG_WARN unless log_setup() says. */
extern enum log_level log_threshold;

/* Sets the program name (borrowed: must outlive the logger), the file descriptor records go
 * to and the threshold. Called once from main(); thread context: before any thread starts. */
void log_setup(const char *program, int fd, enum log_level threshold);

/* Where records go instead of the descriptor while set: sink(arg, line, n) takes each whole
 * record (one line ending in '\n', n <= LOG_LINE_MAX) written on the thread that set the sink;
 * a record of another thread, or one the sink refuses (returns < 0), goes to the descriptor as
 * before. NULL restores the descriptor. For a daemon whose log shares a stream with what its
 * ranks print, through a queue: a record must never wait behind that stream's reader. */
typedef int (*log_sink_fn)(void *arg, const char *line, size_t n);
void log_set_sink(log_sink_fn sink, void *arg);

/* The longest record; a longer one is cut. */
#define LOG_LINE_MAX 4096

/* Parses "error", "warn", "info" or "debug"; returns 0, or -EINVAL for anything else. */
int log_level_parse(const char *s, enum log_level *out);

/* Writes one record in a single write(2) so that lines of concurrent processes never mix.
 * Use the macros below, which skip the formatting when the level is filtered out. */
void log_write(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_at(LOG_ERROR, __VA_ARGS__)
#define log_warn(...)  log_at(LOG_WARN, __VA_ARGS__)
#define log_info(...)  log_at(LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_at(LOG_DEBUG, __VA_ARGS__)
#define log_at(level, ...)                                                                         \
    do {                                                                                           \
        if ((level) <= log_threshold)                                                              \
            log_write((level), __VA_ARGS__);                                                       \
    } while (0)

#endif
