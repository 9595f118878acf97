/* Tests of lib/jtext: every piece byte for byte as jansson's compact dump writes it, for
 * every byte a string may hold, numbers at their edges, and a whole object. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "jtext.h"
#include "test.h"
#include "banned.h"

/* jansson's compact dump of v (stolen), which the caller frees. */
static char *dump(json_t *v)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);

    json_decref(v);
    return s;
}

static void check_str(const char *s, size_t n)
{
    struct jtext t;
    char *want = dump(json_stringn(s, n));

    jtext_init(&t);
    jtext_str(&t, s, n);
    CHECK(t.ok);
    CHECK(want != NULL);
    if (want)
        CHECK_STR(t.p, want);
    free(want);
    jtext_release(&t);
}

TEST(jtext_strings_as_jansson_writes_them)
{
    char s[8];

    /* Every ASCII byte alone and between others (control bytes, quotes, backslash, DEL). */
    for (int c = 1; c < 128; c++) {
        s[0] = (char)c;
        check_str(s, 1);
        memcpy(s, "ab", 2);
        s[2] = (char)c;
        memcpy(s + 3, "cd", 2);
        check_str(s, 5);
    }
    static const char *const texts[] = {"", "step 10/100 loss 2.5\r",
                                        "\xe2\x94\x80\xf0\x9f\x98\x80 \"quoted\" \\ tab\tend",
                                        "/path/with/slashes"};
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++)
        check_str(texts[i], strlen(texts[i]));
}

TEST(jtext_numbers_as_jansson_writes_them)
{
    static const double reals[] = {0.0,     -0.0,  1.0,     -1.0,    0.1,         1.5,
                                   3.0e20,  1e300, -2.5e-8, 1e-320,  123456789.0, 0.3,
                                   2.0 / 3, 1e16,  1e17,    4.9e-324};
    static const long long ints[] = {0,
                                     1,
                                     -1,
                                     9,
                                     10,
                                     -10,
                                     99,
                                     100,
                                     9007199254740993LL,
                                     9223372036854775807LL,
                                     -9223372036854775807LL - 1};
    struct jtext t;
    char *want;

    for (size_t i = 0; i < sizeof(reals) / sizeof(reals[0]); i++) {
        jtext_init(&t);
        jtext_real(&t, reals[i]);
        want = dump(json_real(reals[i]));
        CHECK_STR(t.p, want);
        free(want);
        jtext_release(&t);
    }
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        jtext_init(&t);
        jtext_int(&t, ints[i]);
        want = dump(json_integer(ints[i]));
        CHECK_STR(t.p, want);
        free(want);
        jtext_release(&t);
    }
}

TEST(jtext_an_object_and_a_large_text)
{
    json_t *o = json_object(), *inner = json_pack("{s:[i, s]}", "frames", 1, "x");
    struct jtext t;
    char *want;

    jtext_init(&t);
    jtext_raw(&t, "{", 1);
    jtext_key(&t, "rank", true);
    jtext_int(&t, 7);
    jtext_key(&t, "oom", false);
    jtext_bool(&t, false);
    jtext_key(&t, "loss", false);
    jtext_real(&t, 2.25);
    jtext_key(&t, "last_line", false);
    jtext_str(&t, "a\nb", 3);
    jtext_key(&t, "stack", false);
    jtext_json(&t, inner);
    jtext_raw(&t, "}", 1);
    json_object_set_new(o, "rank", json_integer(7));
    json_object_set_new(o, "oom", json_false());
    json_object_set_new(o, "loss", json_real(2.25));
    json_object_set_new(o, "last_line", json_string("a\nb"));
    json_object_set_new(o, "stack", inner);
    want = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    CHECK_STR(t.p, want);
    free(want);
    json_decref(o);
    /* Growth past the first buffer keeps every byte. */
    for (int i = 0; i < 20000; i++)
        jtext_lit(&t, "0123456789");
    CHECK(t.ok);
    CHECK_EQ(strlen(t.p), t.len);
    CHECK_EQ(t.len,
             200000 + strlen("{\"rank\":7,\"oom\":false,\"loss\":2.25,\"last_line\":\"a\\nb\","
                             "\"stack\":{\"frames\":[1,\"x\"]}}"));
    jtext_release(&t);
}
