/* Tests of lib/utf8: the validator against RFC 3629's edge cases, repair that replaces each
 * invalid byte and never cuts a character, and what jansson makes of the repaired text. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "utf8.h"
#include "banned.h"

#define R UTF8_REPLACEMENT

TEST(utf8_seq_len_edges)
{
    static const struct {
        const char *s;
        size_t len;
    } cases[] = {
        {"a", 1},
        {"\xc2\x80", 2},         /* U+0080 */
        {"\xc1\xbf", 0},         /* overlong U+007F */
        {"\xe0\xa0\x80", 3},     /* U+0800 */
        {"\xe0\x9f\xbf", 0},     /* overlong U+07FF */
        {"\xed\x9f\xbf", 3},     /* U+D7FF */
        {"\xed\xa0\x80", 0},     /* U+D800, a surrogate */
        {"\xe2\x94\x80", 3},     /* U+2500, a box-drawing line */
        {"\xf0\x90\x80\x80", 4}, /* U+10000 */
        {"\xf0\x8f\xbf\xbf", 0}, /* overlong U+FFFF */
        {"\xf4\x8f\xbf\xbf", 4}, /* U+10FFFF */
        {"\xf4\x90\x80\x80", 0}, /* past U+10FFFF */
        {"\xf5\x80\x80\x80", 0},
        {"\x80", 0},
        {"\xff", 0},
        {"\xe2\x94", 0}, /* cut */
        {"\xe2\x28\xa1", 0},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t n = strlen(cases[i].s);
        CHECK_EQ(utf8_seq_len((const unsigned char *)cases[i].s, n), cases[i].len);
        /* The validator and jansson agree on every case. */
        json_t *j = json_stringn(cases[i].s, n);
        CHECK_EQ(utf8_is_valid(cases[i].s, n), j != NULL && cases[i].len == n);
        json_decref(j);
    }
    CHECK(!utf8_is_valid("a\0b", 3));
    CHECK(utf8_is_valid("", 0));
}

TEST(utf8_sanitize_replaces_invalid_bytes)
{
    char out[64];

    CHECK_EQ(utf8_sanitize(out, sizeof(out), "ok\xffgo", 5), 2 + UTF8_REPLACEMENT_LEN + 2);
    CHECK_STR(out, "ok" R "go");
    /* A cut sequence is one invalid byte each, then the text goes on. */
    utf8_sanitize(out, sizeof(out), "\xe2\x94x", 3);
    CHECK_STR(out, R R "x");
    /* A NUL is replaced, not an end: the line after it is kept. */
    utf8_sanitize(out, sizeof(out), "a\0b", 3);
    CHECK_STR(out, "a" R "b");
    utf8_sanitize(out, sizeof(out), "\xe2\x94\x80\xe2\x94\x82", 6);
    CHECK_STR(out, "\xe2\x94\x80\xe2\x94\x82");
}

/* 80 box-drawing characters (240 bytes) into 240 bytes of room: 79 whole characters, never a
 * cut one, as the agent keeps a line of a rank's output (its TAIL_LINE_MAX). */
TEST(utf8_sanitize_cuts_at_a_character)
{
    char line[240], out[240];
    size_t n;

    for (int i = 0; i < 80; i++)
        memcpy(line + 3 * i, "\xe2\x94\x80", 3);
    n = utf8_sanitize(out, sizeof(out), line, sizeof(line));
    CHECK_EQ(n, (size_t)237);
    CHECK(utf8_is_valid(out, n));
    /* A replacement that does not fit is left out whole too. */
    n = utf8_sanitize(out, 5, "ab\xff", 3);
    CHECK_STR(out, "ab");
    CHECK_EQ(n, (size_t)2);
    n = utf8_sanitize(out, 1, "abc", 3);
    CHECK_EQ(n, (size_t)0);
    CHECK_STR(out, "");
}

/* Random bytes, as a rank printing binary output gives: the repaired text always makes a
 * JSON string, whatever the room. */
TEST(utf8_sanitize_random_bytes_make_json)
{
    char in[512], out[300];
    unsigned seed = 12345;

    for (int round = 0; round < 2000; round++) {
        size_t n = (size_t)(round % 512), cap = 1 + (size_t)(round % 299), w;
        for (size_t i = 0; i < n; i++) {
            seed = seed * 1103515245u + 12345u;
            in[i] = (char)(seed >> 16);
        }
        w = utf8_sanitize(out, cap, in, n);
        CHECK(w < cap);
        CHECK_EQ(strlen(out), w);
        CHECK(utf8_is_valid(out, w));
        json_t *j = json_string(out);
        CHECK(j != NULL);
        json_decref(j);
    }
}

/* A cut at a limit never splits a character: the one the next byte continues moves whole to
 * the next piece; ASCII, a whole character and bytes that are not UTF-8 are cut where they
 * stand. */
TEST(utf8_cut_len_keeps_characters_whole)
{
    const char *euro = "ab\xe2\x82\xac"; /* "ab€" */
    const char *smile = "\xf0\x9f\x98\x80";

    CHECK_EQ(utf8_cut_len("abc", 3, 'd'), (size_t)3);
    CHECK_EQ(utf8_cut_len(euro, 5, 'x'), (size_t)5);   /* € whole */
    CHECK_EQ(utf8_cut_len(euro, 4, 0xac), (size_t)2);  /* € cut after 2 of 3 bytes */
    CHECK_EQ(utf8_cut_len(euro, 3, 0x82), (size_t)2);  /* after its lead */
    CHECK_EQ(utf8_cut_len(smile, 3, 0x80), (size_t)0); /* a 4-byte one, 3 in */
    CHECK_EQ(utf8_cut_len(smile, 1, 0x9f), (size_t)0);
    CHECK_EQ(utf8_cut_len("a\x80\x80\x80", 4, 0x80), (size_t)4); /* no lead: not UTF-8 */
    CHECK_EQ(utf8_cut_len("a\xff", 2, 0x80), (size_t)2);         /* 0xff leads nothing */
    CHECK_EQ(utf8_cut_len("", 0, 0x80), (size_t)0);
}

TEST(utf8_prefix_len_backs_off_to_a_lead_byte)
{
    const char *s = "ab\xe2\x94\x80";

    CHECK_EQ(utf8_prefix_len(s, 10), (size_t)5);
    CHECK_EQ(utf8_prefix_len(s, 5), (size_t)5);
    CHECK_EQ(utf8_prefix_len(s, 4), (size_t)2);
    CHECK_EQ(utf8_prefix_len(s, 3), (size_t)2);
    CHECK_EQ(utf8_prefix_len(s, 2), (size_t)2);
    CHECK_EQ(utf8_prefix_len(s, 0), (size_t)0);
}

TEST(utf8_escape_controls_leaves_no_control_byte)
{
    static const struct {
        const char *in;
        size_t n;
        const char *out;
    } cases[] = {
        {"plain text\tand a tab", 20, "plain text\tand a tab"},
        {"\x1b[31mred\x1b[0m", 12, "\\x1b[31mred\\x1b[0m"},
        {"a\nb\rc", 5, "a\\x0ab\\x0dc"},
        {"nul\0del\x7f", 8, "nul\\x00del\\x7f"},
        {"\x01\x1f ", 3, "\\x01\\x1f "},
        {"csi\xc2\x9b\x32J", 7, "csi\\u009b2J"}, /* U+009B, a C1 CSI; \x32 is '2' */
        {"nbsp\xc2\xa0\xe2\x82\xac", 9, "nbsp\xc2\xa0\xe2\x82\xac"}, /* U+00A0, '€' stay */
        {"bad\xff\x9b", 5, "bad\\xff\\x9b"}, /* bytes that begin no character */
    };
    char out[128];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t n = utf8_escape_controls(out, sizeof(out), cases[i].in, cases[i].n);
        CHECK_STR(out, cases[i].out);
        CHECK_EQ(n, strlen(cases[i].out));
        CHECK(utf8_is_valid(out, n));
    }
}

TEST(utf8_escape_controls_cuts_at_a_whole_escape)
{
    char out[8];

    /* "ab" and the 4 bytes of "\x1b" fit in 7; the next escape does not, nor half of it. */
    CHECK_EQ(utf8_escape_controls(out, sizeof(out), "ab\x1b\x1b", 4), 6);
    CHECK_STR(out, "ab\\x1b");
    CHECK_EQ(utf8_escape_controls(out, 1, "abc", 3), 0);
    CHECK_STR(out, "");
}
