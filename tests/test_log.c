/* Tests of lib/log: the record grammar, the threshold (and that a filtered record costs no
 * formatting), long records, and errno left as it was. */
#include <errno.h>
#include <fcntl.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "test.h"
#include "banned.h"

/* A log sink in the test's scratch dir; returns its fd. */
static int open_sink(void)
{
    char path[4200];
    int fd;

    snprintf(path, sizeof(path), "%s/log", test_tmpdir());
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0);
    return fd;
}

/* Everything written to fd so far, NUL-terminated (static storage). */
static const char *sink_text(int fd)
{
    static char buf[16384];
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);

    CHECK(n >= 0);
    buf[n] = '\0';
    return buf;
}

static void check_matches(const char *text, const char *pattern)
{
    regex_t re;

    CHECK_EQ(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB), 0);
    if (regexec(&re, text, 0, NULL, 0) != 0)
        test_fail(__FILE__, __LINE__, "\"%s\" does not match /%s/", text, pattern);
    regfree(&re);
}

TEST(log_record_format)
{
    int fd = open_sink();
    char pattern[256];

    log_setup("rendezvousd", fd, LOG_INFO);
    log_info("listening on '%s:%d'", "127.0.0.1", 4000);
    /* "2024-05-01T12:00:00.123Z rendezvousd[42] info: text", one line. */
    snprintf(pattern, sizeof(pattern),
             "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z "
             "rendezvousd\\[%d\\] info: listening on '127\\.0\\.0\\.1:4000'\n$",
             (int)getpid());
    check_matches(sink_text(fd), pattern);
    close(fd);
}

TEST(log_level_names)
{
    int fd = open_sink();
    const char *text;

    log_setup("p", fd, LOG_DEBUG);
    log_error("e");
    log_warn("w");
    log_info("i");
    log_debug("d");
    text = sink_text(fd);
    check_matches(text, "^[^\n]* p\\[[0-9]+\\] error: e\n"
                        "[^\n]* p\\[[0-9]+\\] warn: w\n"
                        "[^\n]* p\\[[0-9]+\\] info: i\n"
                        "[^\n]* p\\[[0-9]+\\] debug: d\n$");
    close(fd);
}

static int evaluated;

static int side_effect(void)
{
    return ++evaluated;
}

TEST(log_threshold_filters)
{
    int fd = open_sink();
    const char *text;

    log_setup("p", fd, LOG_WARN);
    log_debug("debug %d", side_effect());
    log_info("info %d", side_effect());
    /* Filtered records are not even formatted: their arguments are not evaluated. */
    CHECK_EQ(evaluated, 0);
    CHECK_STR(sink_text(fd), "");
    log_warn("warn %d", side_effect());
    log_error("error %d", side_effect());
    CHECK_EQ(evaluated, 2);
    text = sink_text(fd);
    CHECK_CONTAINS(text, " warn: warn 1\n");
    CHECK_CONTAINS(text, " error: error 2\n");
    CHECK(!strstr(text, "info"));

    log_setup("p", fd, LOG_ERROR);
    log_warn("hidden");
    CHECK(!strstr(sink_text(fd), "hidden"));
    CHECK_EQ(log_threshold, LOG_ERROR);
    close(fd);
}

TEST(log_long_record_cut_to_one_line)
{
    int fd = open_sink();
    char *big = malloc(10000);
    const char *text;
    size_t len;

    CHECK(big);
    memset(big, 'x', 9999);
    big[9999] = '\0';
    log_setup("p", fd, LOG_INFO);
    log_info("%s", big);
    log_info("after");
    text = sink_text(fd);
    len = strcspn(text, "\n");
    CHECK_INT(len, <, 4096);
    CHECK_INT(len, >, 4000);
    CHECK_EQ(text[len], '\n');
    check_matches(text + len + 1, "^[^\n]* info: after\n$");
    free(big);
    close(fd);
}

/* What a record quotes (a rank's last lines) can drive no terminal and make no second line. */
TEST(log_escapes_control_bytes)
{
    int fd = open_sink();
    const char *text;

    log_setup("p", fd, LOG_INFO);
    log_error("  | %s", "\x1b[2J\x1b]0;title\x07red\nforged: line\x7f");
    text = sink_text(fd);
    check_matches(text, "^[^\n]* error:   \\| \\\\x1b\\[2J\\\\x1b\\]0;title\\\\x07red"
                        "\\\\x0aforged: line\\\\x7f\n$");
    for (const char *p = text; *p; p++)
        if ((unsigned char)*p < 0x20 && *p != '\n')
            test_fail(__FILE__, __LINE__, "control byte 0x%02x in \"%s\"", *p, text);
    close(fd);
}

TEST(log_keeps_errno)
{
    int fd = open_sink();

    log_setup("p", fd, LOG_INFO);
    errno = ECONNREFUSED;
    log_info("x");
    CHECK_EQ(errno, ECONNREFUSED);
    /* A sink that fails: the record is lost, errno is not. */
    log_setup("p", -1, LOG_INFO);
    errno = ETIMEDOUT;
    log_error("lost");
    CHECK_EQ(errno, ETIMEDOUT);
    close(fd);
}

TEST(log_level_parse_names)
{
    enum log_level l = LOG_ERROR;

    CHECK_EQ(log_level_parse("debug", &l), 0);
    CHECK_EQ(l, LOG_DEBUG);
    CHECK_EQ(log_level_parse("info", &l), 0);
    CHECK_EQ(l, LOG_INFO);
    CHECK_EQ(log_level_parse("warn", &l), 0);
    CHECK_EQ(l, LOG_WARN);
    CHECK_EQ(log_level_parse("error", &l), 0);
    CHECK_EQ(l, LOG_ERROR);
    CHECK_EQ(log_level_parse("ERROR", &l), -EINVAL);
    CHECK_EQ(log_level_parse("warning", &l), -EINVAL);
    CHECK_EQ(log_level_parse("", &l), -EINVAL);
    CHECK_EQ(l, LOG_ERROR);
}
