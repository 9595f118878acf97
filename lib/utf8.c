/* UTF-8 validation and repair (utf8.h): the decoder of RFC 3629's table 1 and its ranges,
 * byte by byte, with no state across calls. */
#include <string.h>

#include "utf8.h"
#include "banned.h"

size_t utf8_seq_len(const unsigned char *s, size_t n)
{
    unsigned char c;
    size_t len;
    unsigned char lo = 0x80, hi = 0xbf; /* the second byte's range */

    if (n == 0)
        return 0;
    c = s[0];
    if (c < 0x80)
        return 1;
    if (c < 0xc2) /* a continuation byte, or the start of an overlong 2-byte form */
        return 0;
    if (c < 0xe0) {
        len = 2;
    } else if (c < 0xf0) {
        len = 3;
        if (c == 0xe0)
            lo = 0xa0; /* overlong below U+0800 */
        else if (c == 0xed)
            hi = 0x9f; /* the surrogates U+D800..U+DFFF */
    } else if (c < 0xf5) {
        len = 4;
        if (c == 0xf0)
            lo = 0x90; /* overlong below U+10000 */
        else if (c == 0xf4)
            hi = 0x8f; /* past U+10FFFF */
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return len;
}

bool utf8_is_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;

    for (size_t i = 0, k; i < n; i += k)
        if (!(k = utf8_seq_len(p + i, n - i)) || p[i] == '\0')
            return false;
    return true;
}

size_t utf8_sanitize(char *dst, size_t cap, const char *src, size_t n)
{
    const unsigned char *p = (const unsigned char *)src;
    size_t out = 0;

    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq_len(p + i, n - i);
        const char *from = src + i;
        size_t w = k;

        if (k == 0 || p[i] == '\0') {
            from = UTF8_REPLACEMENT;
            w = UTF8_REPLACEMENT_LEN;
            k = 1;
        }
        if (out + w > cap - 1)
            break;
        memcpy(dst + out, from, w);
        out += w;
        i += k;
    }
    dst[out] = '\0';
    return out;
}

size_t utf8_escape_controls(char *dst, size_t cap, const char *src, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)src;
    size_t out = 0;

    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq_len(p + i, n - i);
        char esc[UTF8_ESCAPE_MAX];
        const char *from = src + i;
        size_t w = k;

        if (k == 0 || (k == 1 && ((p[i] < 0x20 && p[i] != '\t') || p[i] == 0x7f))) {
            /* A control byte, or one that begins no character. */
            esc[0] = '\\';
            esc[1] = 'x';
            esc[2] = hex[p[i] >> 4];
            esc[3] = hex[p[i] & 0xf];
            from = esc;
            w = 4;
            k = 1;
        } else if (k == 2 && p[i] == 0xc2 && p[i + 1] < 0xa0) {
            /* U+0080..U+009F: C2 80..C2 9F. */
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[p[i + 1] >> 4];
            esc[5] = hex[p[i + 1] & 0xf];
            from = esc;
            w = 6;
        }
        if (out + w > cap - 1)
            break;
        memcpy(dst + out, from, w);
        out += w;
        i += k;
    }
    dst[out] = '\0';
    return out;
}

size_t utf8_cut_len(const char *s, size_t n, unsigned char next)
{
    if ((next & 0xc0) != 0x80)
        return n;
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xc0) == 0x80)
            continue;
        /* A lead byte whose character would run past what s holds: cut before it. */
        size_t need = c >= 0xf0 && c < 0xf8 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
        return need > back && c >= 0xc0 && c < 0xf8 ? n - back : n;
    }
    return n;
}

size_t utf8_prefix_len(const char *s, size_t max)
{
    size_t n = strnlen(s, max + 1);

    if (n <= max)
        return n;
    n = max;
    /* Back off over the continuation bytes of the character cut at max, then over its lead. */
    while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80)
        n--;
    return n;
}
