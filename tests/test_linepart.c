/* Tests of daemon/linepart: when a line without its end is shown, and which of its bytes each
 * showing and its end write, to a terminal (the whole line, drawn over) and to a file (each
 * byte once). */
#include <string.h>

#include "../daemon/linepart.h"
#include "test.h"
#include "banned.h"

TEST(linepart_waits_for_a_quiet)
{
    struct linepart p;

    CHECK(!linepart_due("step-1", 6, 0, LINEPART_TTY_MS - 1, true, &p));
    CHECK(linepart_due("step-1", 6, 0, LINEPART_TTY_MS, true, &p));
    /* A file keeps each showing: it waits longer than a terminal. */
    CHECK(!linepart_due("step-1", 6, 0, LINEPART_TTY_MS, false, &p));
    CHECK(!linepart_due("step-1", 6, 0, LINEPART_FILE_MS - 1, false, &p));
    CHECK(linepart_due("step-1", 6, 0, LINEPART_FILE_MS, false, &p));
    CHECK_INT(LINEPART_FILE_MS, <, 1000);
}

TEST(linepart_a_file_gets_each_byte_once)
{
    struct linepart p;

    CHECK(linepart_due("abc", 3, 0, LINEPART_FILE_MS, false, &p));
    CHECK_EQ(p.from, 0);
    CHECK_EQ(p.to, 3);
    /* Shown whole: nothing until the rank adds to it. */
    CHECK(!linepart_due("abc", 3, 3, 5000, false, &p));
    CHECK(linepart_due("abcdef", 6, 3, LINEPART_FILE_MS, false, &p));
    CHECK_EQ(p.from, 3);
    CHECK_EQ(p.to, 6);
    /* Its end writes what was not shown. */
    CHECK_EQ(linepart_rest(6, false), 6);
    CHECK_EQ(linepart_rest(0, false), 0);
}

TEST(linepart_a_terminal_gets_the_whole_line)
{
    struct linepart p;

    CHECK(linepart_due("abcdef", 6, 3, LINEPART_TTY_MS, true, &p));
    CHECK_EQ(p.from, 0);
    CHECK_EQ(p.to, 6);
    CHECK(!linepart_due("abcdef", 6, 6, 5000, true, &p));
    CHECK_EQ(linepart_rest(6, true), 0);
}

TEST(linepart_never_shows_half_a_character)
{
    struct linepart p;
    const char *s = "x\xe2\x82\xac"; /* "x€" */

    /* The first two bytes of '€': only "x" is due, and once it is shown nothing more. */
    CHECK(linepart_due(s, 3, 0, LINEPART_FILE_MS, false, &p));
    CHECK_EQ(p.to, 1);
    CHECK(!linepart_due(s, 3, 1, LINEPART_FILE_MS, false, &p));
    CHECK(linepart_due(s, 4, 1, LINEPART_FILE_MS, false, &p));
    CHECK_EQ(p.from, 1);
    CHECK_EQ(p.to, 4);
    /* A lone lead byte: nothing. */
    CHECK(!linepart_due("\xe2", 1, 0, LINEPART_TTY_MS, true, &p));
}
