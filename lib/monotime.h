/* The monotonic clock of timeouts, deadlines and durations: never set back, never jumps. */
#ifndef GPURUN_MONOTIME_H
#define GPURUN_MONOTIME_H

#include <stdint.h>

/* Milliseconds of CLOCK_MONOTONIC, for deadlines and timeouts. Thread context: any. */
int64_t monotime_ms(void);

/* Microseconds of CLOCK_MONOTONIC, for waits shorter than a millisecond. Thread context:
 * any. */
int64_t monotime_us(void);

/* Seconds of CLOCK_MONOTONIC to the nanosecond, for durations that are printed. Thread
 * context: any. */
double monotime_s(void);

/* Sleeps ms milliseconds of CLOCK_MONOTONIC (0 or less: not at all), going back to sleep for
 * what is left when a signal's handler interrupts it: it never returns early. Thread context:
 * any. */
void monotime_sleep_ms(int64_t ms);

#endif
