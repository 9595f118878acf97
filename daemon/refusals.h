/* Refused connections, counted rather than logged one by one: a flood of connections that
 * fail their handshake would otherwise write a line each into the job's output. Refusals are
 * kept per source address and reason; the first of a burst is logged at once, the rest are
 * summarised in one line per window ("refused 2000 connections from '10.0.0.9' in 1.3 s:
 * ..."). Single-threaded: the daemon's loop owns it. */
#ifndef GPURUN_REFUSALS_H
#define GPURUN_REFUSALS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Sources (address and reason) counted apart; the refusals of any further source in the
 * window are counted together as "other addresses", never logged at once. 16 lines a window
 * at most are then logged at once, whatever the number of sources. */
#define REFUSALS_SOURCES 16

struct refusal_source {
    bool used;
    char addr[64];
    char why[96];
    int64_t start_ms;          /* when the window began */
    int64_t first_ms, last_ms; /* the window's first and last refusal */
    uint64_t count;            /* refusals in the window, those logged at once included */
    uint64_t shown;            /* of count, logged at once (0 or 1) */
};

struct refusals {
    int64_t window_ms;
    struct refusal_source src[REFUSALS_SOURCES];
    struct refusal_source other; /* every source that found src full; why is its first */
    bool other_mixed;            /* other holds refusals of more than one reason */
};

/* Prepares r: a source's summary comes at most once every window_ms. */
void refusals_init(struct refusals *r, int64_t window_ms);

/* Counts one refusal at now (ms of any monotonic clock) of a connection from addr (borrowed,
 * "" when unknown) for why (borrowed). Returns true when it is the first of its source's
 * burst: the caller logs it in full now. */
bool refusals_note(struct refusals *r, int64_t now, const char *addr, const char *why);

/* Takes the next summary due at now: a source whose window ended with refusals not logged at
 * once (every source when flush, as the owner closes). Writes one line of text to line (cap
 * bytes) and returns true; false when none is due. A source quiet for a whole window is
 * forgotten, so its next refusal is logged at once again. Call until it returns false. */
bool refusals_next(struct refusals *r, int64_t now, bool flush, char *line, size_t cap);

#endif
