/* Lists of ranks, "0,2-3" (ranklist.h). */
#include <errno.h>
#include <string.h>

#include "ranklist.h"
#include "banned.h"

/* Reads the decimal number at *p (digits only, at most max) and moves *p past it. Returns the
 * number, or -1 when there are no digits or it passes max. */
static long read_rank(const char **p, long max)
{
    long v = 0;

    if (**p < '0' || **p > '9')
        return -1;
    while (**p >= '0' && **p <= '9') {
        v = v * 10 + (**p - '0');
        if (v > max)
            return -1;
        (*p)++;
    }
    return v;
}

/* Reads the item at *p ("N" or "N-M", ending at ',' or the end) into [*lo, *hi] and moves *p
 * to its end. Returns 0, or -1 when it is neither (out of range included). */
static int read_item(const char **p, long max, long *lo, long *hi)
{
    *lo = read_rank(p, max);
    if (*lo < 0)
        return -1;
    *hi = *lo;
    if (**p == '-') {
        (*p)++;
        *hi = read_rank(p, max);
        if (*hi < 0)
            return -1;
    }
    return **p == ',' || **p == '\0' ? 0 : -1;
}

int ranklist_check(const char *s, int max, struct errmsg *err)
{
    const char *p = s;

    if (!*s)
        return errmsg_set(err, -EINVAL, "an empty list of ranks");
    for (;;) {
        const char *item = p;
        size_t len = strcspn(item, ",");
        long lo, hi;

        if (len == 0)
            return errmsg_set(err, -EINVAL, "'%s' has an empty item", s);
        if (read_item(&p, max, &lo, &hi) < 0)
            return errmsg_set(err, -EINVAL, "'%.*s' is not a rank 0..%d or a range of them (N-M)",
                              (int)len, item, max);
        if (lo > hi)
            return errmsg_set(err, -EINVAL, "'%.*s' is not a range: %ld is past %ld", (int)len,
                              item, lo, hi);
        if (*p == '\0')
            return 0;
        p++;
    }
}

bool ranklist_has(const char *s, int rank)
{
    const char *p = s;
    long lo, hi;

    while (*p) {
        if (read_item(&p, (long)1 << 40, &lo, &hi) < 0)
            return false;
        if (rank >= lo && rank <= hi)
            return true;
        if (*p == ',')
            p++;
    }
    return false;
}
