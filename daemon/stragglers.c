/* The stragglers rule (stragglers.h): a pure function of the ranks' times per step. */
#include "stragglers.h"

#include <errno.h>
#include <stdlib.h>

#include "banned.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

int stragglers_judge(const struct straggler_rank *k, int n, double pct, int64_t min_steps,
                     double *slower, double *median)
{
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(*v)), m;
    int nv = 0;

    if (!v)
        return -ENOMEM;
    for (int r = 0; r < n; r++) {
        if (!k[r].running || !k[r].reported)
            continue;
        if (k[r].steps < min_steps) {
            nv = 0;
            break;
        }
        v[nv++] = k[r].avg;
    }
    if (nv < 2) {
        free(v);
        return 0;
    }
    qsort(v, (size_t)nv, sizeof(*v), cmp_double);
    m = nv % 2 ? v[nv / 2] : (v[nv / 2 - 1] + v[nv / 2]) / 2;
    free(v);
    if (!(m > 0))
        return 0;
    for (int r = 0; r < n; r++) {
        double s = k[r].avg / m - 1;
        if (!k[r].running)
            continue;
        slower[r] = k[r].steps >= min_steps && s * 100 >= pct ? s : 0;
    }
    *median = m;
    return 1;
}
