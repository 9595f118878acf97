/* Refusal counting for the leader's listener (refusals.h). A fixed table: memory and the
 * number of lines per window are bounded whatever a flood does. */
#include <stdio.h>
#include <string.h>

#include "refusals.h"
#include "banned.h"

void refusals_init(struct refusals *r, int64_t window_ms)
{
    memset(r, 0, sizeof(*r));
    r->window_ms = window_ms;
}

static void count(struct refusal_source *s, int64_t now)
{
    if (s->count == 0)
        s->first_ms = now;
    s->count++;
    s->last_ms = now;
}

bool refusals_note(struct refusals *r, int64_t now, const char *addr, const char *why)
{
    struct refusal_source *free_src = NULL;

    addr = *addr ? addr : "?";
    for (int i = 0; i < REFUSALS_SOURCES; i++) {
        struct refusal_source *s = &r->src[i];
        if (!s->used) {
            free_src = free_src ? free_src : s;
        } else if (!strcmp(s->addr, addr) && !strncmp(s->why, why, sizeof(s->why) - 1)) {
            count(s, now);
            return false;
        }
    }
    if (!free_src) {
        if (r->other.count == 0) {
            r->other.start_ms = now;
            snprintf(r->other.why, sizeof(r->other.why), "%s", why);
        } else if (strncmp(r->other.why, why, sizeof(r->other.why) - 1)) {
            r->other_mixed = true;
        }
        r->other.used = true;
        count(&r->other, now);
        return false;
    }
    memset(free_src, 0, sizeof(*free_src));
    free_src->used = true;
    snprintf(free_src->addr, sizeof(free_src->addr), "%s", addr);
    snprintf(free_src->why, sizeof(free_src->why), "%s", why);
    free_src->start_ms = now;
    count(free_src, now);
    free_src->shown = 1;
    return true;
}

static void summarise(const struct refusal_source *s, const char *from, const char *extra,
                      char *line, size_t cap)
{
    snprintf(line, cap, "refused %llu connection%s from %s in %.1f s: %s%s",
             (unsigned long long)s->count, s->count == 1 ? "" : "s", from,
             (double)(s->last_ms - s->first_ms) / 1000, s->why, extra);
}

bool refusals_next(struct refusals *r, int64_t now, bool flush, char *line, size_t cap)
{
    char from[80];

    for (int i = 0; i < REFUSALS_SOURCES; i++) {
        struct refusal_source *s = &r->src[i];
        if (!s->used || (!flush && now - s->start_ms < r->window_ms))
            continue;
        if (s->count <= s->shown) {
            s->used = false;
            continue;
        }
        snprintf(from, sizeof(from), "'%s'", s->addr);
        summarise(s, from, "", line, cap);
        /* The burst may go on: the next window counts it, with no line at once. */
        s->start_ms = now;
        s->count = s->shown = 0;
        if (flush)
            s->used = false;
        return true;
    }
    if (r->other.used && (flush || now - r->other.start_ms >= r->window_ms)) {
        summarise(&r->other, "other addresses", r->other_mixed ? " (and other reasons)" : "", line,
                  cap);
        memset(&r->other, 0, sizeof(r->other));
        r->other_mixed = false;
        return true;
    }
    return false;
}
