/* Tests of daemon/refusals on a clock of the test's own: the first refusal of a source is
 * logged at once, the rest summarised once a window with their count, quiet sources are
 * forgotten, sources past the table are counted together, and the owner's close flushes. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "../daemon/refusals.h"
#include "test.h"
#include "banned.h"

#define WINDOW 5000

/* The next summary due at now into line; "" when none is. */
static const char *next(struct refusals *r, int64_t now, bool flush)
{
    static char line[256];

    if (!refusals_next(r, now, flush, line, sizeof(line)))
        line[0] = '\0';
    return line;
}

TEST(refusals_first_at_once_rest_summarised)
{
    struct refusals r;

    refusals_init(&r, WINDOW);
    CHECK(refusals_note(&r, 1000, "127.0.0.1", "handshake failed"));
    for (int i = 1; i < 2000; i++)
        CHECK(!refusals_note(&r, 1000 + i / 2, "127.0.0.1", "handshake failed"));
    /* Another reason, or another address, is another source: its first is logged too. */
    CHECK(refusals_note(&r, 1200, "127.0.0.1", "handshake timed out"));
    CHECK(refusals_note(&r, 1300, "10.0.0.9", "handshake failed"));
    CHECK_STR(next(&r, 1000 + WINDOW - 1, false), "");
    CHECK_STR(next(&r, 1000 + WINDOW, false),
              "refused 2000 connections from '127.0.0.1' in 1.0 s: handshake failed");
    /* The other two had only their first, logged already: no summary, and forgotten. */
    CHECK_STR(next(&r, 1300 + WINDOW, false), "");
    CHECK(refusals_note(&r, 1300 + WINDOW, "10.0.0.9", "handshake failed"));
    /* The burst goes on: counted in the next window, nothing at once. */
    CHECK(!refusals_note(&r, 7000, "127.0.0.1", "handshake failed"));
    CHECK(!refusals_note(&r, 7500, "127.0.0.1", "handshake failed"));
    CHECK_STR(next(&r, 1000 + 2 * WINDOW, false),
              "refused 2 connections from '127.0.0.1' in 0.5 s: handshake failed");
    /* A whole quiet window: forgotten, the next one is logged at once again. */
    CHECK_STR(next(&r, 1000 + 3 * WINDOW, false), "");
    CHECK(refusals_note(&r, 1000 + 3 * WINDOW, "127.0.0.1", "handshake failed"));
}

TEST(refusals_table_full_counts_other_addresses)
{
    struct refusals r;
    char addr[32];
    int at_once = 0, lines = 0;
    const char *l;

    refusals_init(&r, WINDOW);
    for (int i = 0; i < 1000; i++) {
        snprintf(addr, sizeof(addr), "127.0.%d.%d", i / 250, i % 250 + 1);
        at_once += refusals_note(&r, 100, addr, i % 2 ? "connection closed" : "evicted");
    }
    /* Lines at once are bounded by the table, whatever the number of addresses. */
    CHECK_EQ(at_once, REFUSALS_SOURCES);
    CHECK_STR(next(&r, 100 + WINDOW, false),
              "refused 984 connections from other addresses in 0.0 s: evicted (and other "
              "reasons)");
    while (*(l = next(&r, 100 + WINDOW, false)))
        lines++;
    CHECK_EQ(lines, 0);
}

TEST(refusals_flush_at_close)
{
    struct refusals r;

    refusals_init(&r, WINDOW);
    CHECK(refusals_note(&r, 0, "::1", "frame larger than 68 bytes"));
    CHECK(!refusals_note(&r, 250, "::1", "frame larger than 68 bytes"));
    CHECK(!refusals_note(&r, 500, "::1", "frame larger than 68 bytes"));
    CHECK_STR(next(&r, 600, false), "");
    CHECK_STR(next(&r, 600, true),
              "refused 3 connections from '::1' in 0.5 s: frame larger than 68 bytes");
    CHECK_STR(next(&r, 600, true), "");
    /* An address the peer could not name. */
    CHECK(refusals_note(&r, 700, "", "connection closed"));
    CHECK(!refusals_note(&r, 800, "", "connection closed"));
    CHECK_STR(next(&r, 800, true), "refused 2 connections from '?' in 0.1 s: connection closed");
}
