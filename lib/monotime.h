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

#endif
