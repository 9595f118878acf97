/* Tests of lib/monotime's sleep: it lasts at least as long as it was asked to, also when a
 * signal's handler interrupts it. Only lower bounds: how much longer it takes is the
 * machine's. */
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/time.h>

#include "monotime.h"
#include "test.h"
#include "banned.h"

static volatile sig_atomic_t alarms;

static void on_alarm(int sig)
{
    (void)sig;
    alarms++;
}

TEST(monotime_sleep_lasts_its_time)
{
    int64_t t0 = monotime_us();

    monotime_sleep_ms(30);
    CHECK(monotime_us() - t0 >= 30000);
    /* Nothing to sleep: returns (a hang would be the test's timeout). */
    monotime_sleep_ms(0);
    monotime_sleep_ms(-5);
}

/* A handler installed without SA_RESTART interrupts the sleep every 10 ms; it sleeps on. */
TEST(monotime_sleep_goes_on_after_a_signal)
{
    struct sigaction sa;
    struct itimerval every = {.it_interval = {0, 10000}, .it_value = {0, 10000}}, off = {0};
    int64_t t0;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    CHECK_EQ(sigaction(SIGALRM, &sa, NULL), 0);
    alarms = 0;
    t0 = monotime_ms();
    CHECK_EQ(setitimer(ITIMER_REAL, &every, NULL), 0);
    monotime_sleep_ms(120);
    CHECK_EQ(setitimer(ITIMER_REAL, &off, NULL), 0);
    CHECK(monotime_ms() - t0 >= 120);
    CHECK(alarms >= 1);
}
