/* Tests of lib/ranklist: which lists are accepted (ranks, ranges, commas) and what a refusal
 * names, and which ranks a list holds. */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "errmsg.h"
#include "ranklist.h"
#include "test.h"
#include "banned.h"

TEST(ranklist_accepts_ranks_and_ranges)
{
    static const char *const good[] = {"0", "7", "0,2-3", "4-7,12", "3-3", "0,0", "1023"};
    struct errmsg err = {{0}};

    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        if (ranklist_check(good[i], 1023, &err) != 0)
            test_fail(__FILE__, __LINE__, "'%s' refused: %s", good[i], err.text);
}

TEST(ranklist_refuses_with_the_item_named)
{
    static const struct {
        const char *s, *text;
    } bad[] = {
        {"", "an empty list of ranks"},
        {"1,,2", "'1,,2' has an empty item"},
        {"1,", "'1,' has an empty item"},
        {",1", "',1' has an empty item"},
        {"a", "'a' is not a rank 0..7 or a range of them (N-M)"},
        {"0,2-x", "'2-x' is not a rank 0..7 or a range of them (N-M)"},
        {"-1", "'-1' is not a rank 0..7 or a range of them (N-M)"},
        {"1 ", "'1 ' is not a rank 0..7 or a range of them (N-M)"},
        {"8", "'8' is not a rank 0..7 or a range of them (N-M)"},
        {"0-99999999999999999999", "'0-99999999999999999999' is not a rank 0..7"},
        {"3-1", "'3-1' is not a range: 3 is past 1"},
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct errmsg err = {{0}};
        CHECK_EQ(ranklist_check(bad[i].s, 7, &err), -EINVAL);
        CHECK_CONTAINS(err.text, bad[i].text);
    }
}

TEST(ranklist_has_the_ranks_it_names)
{
    const char *s = "0,2-3,9";
    bool want[] = {true, false, true, true, false, false, false, false, false, true, false};

    for (int r = 0; r < (int)(sizeof(want) / sizeof(want[0])); r++)
        if (ranklist_has(s, r) != want[r])
            test_fail(__FILE__, __LINE__, "rank %d: in '%s' is %d, expected %d", r, s,
                      ranklist_has(s, r), want[r]);
    CHECK(!ranklist_has("", 0));
    CHECK(!ranklist_has("x", 0));
}
