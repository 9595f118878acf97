/* gpurun's unit-test API. A test is a function declared with TEST(name) in
 * tests/test_<module>.c; the runner (tests/runner.c) forks each into its own process group
 * with a timeout and prints one TAP line for it. Assertions print both values and end the
 * test's process at the first failure. */
#ifndef GPURUN_TEST_H
#define GPURUN_TEST_H

#include <stdint.h>
#include <string.h>

typedef void (*test_fn)(void);

/* Adds a test to the runner's table; TEST() calls it before main(). */
void test_register(const char *name, const char *file, test_fn fn, int timeout_s);

/* Ends the running test as a failure, after printing "# file:line: text" lines. */
void test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));

/* Ends the running test as skipped, with the reason on its TAP line. */
void test_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

/* A scratch directory private to the running test (created on first use, removed by the
 * runner afterwards). Borrowed: valid for the test's life. */
const char *test_tmpdir(void);

/* Path of a built program ("rendezvousd", "gpurun", "tests/gr_example") in the build the
 * runner belongs to. Borrowed static storage, overwritten by the next call. */
const char *test_build_path(const char *name);

#define TEST_TIMEOUT_DEFAULT 30

#define TEST_T(name, timeout_s)                                                                    \
    static void name(void);                                                                        \
    __attribute__((constructor)) static void register_##name(void)                                 \
    {                                                                                              \
        test_register(#name, __FILE__, name, timeout_s);                                           \
    }                                                                                              \
    static void name(void)

#define TEST(name) TEST_T(name, TEST_TIMEOUT_DEFAULT)

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            test_fail(__FILE__, __LINE__, "check failed: %s", #cond);                              \
    } while (0)

#define CHECK_INT(a, op, b)                                                                        \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        if (!(a_ op b_))                                                                           \
            test_fail(__FILE__, __LINE__, "%s %s %s: %lld vs %lld", #a, #op, #b, a_, b_);          \
    } while (0)

#define CHECK_EQ(a, b) CHECK_INT(a, ==, b)

#define CHECK_STR(a, b)                                                                            \
    do {                                                                                           \
        const char *a_ = (a), *b_ = (b);                                                           \
        if (!a_ || !b_ || strcmp(a_, b_))                                                          \
            test_fail(__FILE__, __LINE__, "%s == %s: \"%s\" vs \"%s\"", #a, #b,                    \
                      a_ ? a_ : "(null)", b_ ? b_ : "(null)");                                     \
    } while (0)

#define CHECK_CONTAINS(hay, needle)                                                                \
    do {                                                                                           \
        const char *h_ = (hay), *n_ = (needle);                                                    \
        if (!h_ || !strstr(h_, n_))                                                                \
            test_fail(__FILE__, __LINE__, "%s contains %s: \"%s\" lacks \"%s\"", #hay, #needle,    \
                      h_ ? h_ : "(null)", n_);                                                     \
    } while (0)

#endif
