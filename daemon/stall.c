/* A periodic check's own stalls (stall.h). */
#include "stall.h"
#include "banned.h"

void stall_init(struct stall *s, int64_t period_ms, int64_t now_ms)
{
    s->period_ms = period_ms;
    s->last_ms = now_ms;
}

int64_t stall_check(struct stall *s, int64_t now_ms)
{
    int64_t gap = now_ms - s->last_ms;

    s->last_ms = now_ms;
    /* One period of the gap was the wait the check asked for; the rest is the stall. */
    return gap >= 2 * s->period_ms ? gap - s->period_ms : 0;
}
