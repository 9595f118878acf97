/* A rank's time per step for the stragglers rule (steptime.h): a moving average of its
 * reported own step times, or of the time between its reports. */
#include <math.h>

#include "steptime.h"
#include "banned.h"

void steptime_add(struct steptime *s, int64_t ms, int64_t step, double own)
{
    int64_t n = step - s->prev_step;
    double sample = NAN, w;

    if (s->prev_ms && n > 0) {
        sample = isfinite(own) && own > 0 ? own : (double)(ms - s->prev_ms) / 1000.0 / (double)n;
    } else if (!s->prev_ms && isfinite(own) && own > 0) {
        sample = own;
        n = 1;
    }
    if (!s->prev_ms || step != s->prev_step) {
        s->prev_ms = ms;
        s->prev_step = step;
    }
    if (!isfinite(sample) || sample < 0 || n <= 0)
        return;
    /* Each of the n steps the sample stands for weighs as one of the last WINDOW steps. */
    s->steps += n;
    w = (double)n / (double)(s->steps < STEPTIME_WINDOW ? s->steps : STEPTIME_WINDOW);
    if (w > 1)
        w = 1;
    s->avg += (sample - s->avg) * w;
}
