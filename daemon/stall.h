/* A periodic check's own stalls: how much later than its period it ran. Time in which a
 * process did not run its loop (a callback that blocked it, the process stopped, starved of
 * CPU or its machine paused) is time in which it read nothing, so a judge of another
 * process's silence must not count it against that process: the leader and the agent excuse
 * their peers for it (peer_excuse), the shim its agent. Owned by one thread. */
#ifndef GPURUN_STALL_H
#define GPURUN_STALL_H

#include <stdint.h>

struct stall {
    int64_t period_ms; /* how often stall_check() is meant to be called */
    int64_t last_ms;   /* when it last was */
};

/* Starts s at now_ms for a check every period_ms (> 0). */
void stall_init(struct stall *s, int64_t period_ms, int64_t now_ms);

/* To be called first thing in each periodic check, with a clock that never goes back.
 * Returns the stall since the previous call: the time beyond one period when the call came
 * a whole period late or more (a check missed), else 0, so that a timer's usual lateness of
 * a millisecond or two never counts. A call that comes early (a wake-up by a signal) is no
 * stall. */
int64_t stall_check(struct stall *s, int64_t now_ms);

#endif
