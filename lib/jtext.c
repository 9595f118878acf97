/* JSON text by hand (jtext.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jtext.h"
#include "banned.h"

void jtext_init(struct jtext *t)
{
    *t = (struct jtext){.ok = true};
}

void jtext_release(struct jtext *t)
{
    free(t->p);
    *t = (struct jtext){0};
}

/* Room for n more bytes and a NUL. */
static bool reserve(struct jtext *t, size_t n)
{
    size_t c;
    char *b;

    if (!t->ok)
        return false;
    if (t->len + n + 1 <= t->cap)
        return true;
    /* Small first: most texts are one reply (an ok, a value), and a block this size comes
     * from malloc's per-thread cache, where 4 KiB went through its bins and their merging
     * for each of a large job's 100,000 replies. */
    c = t->cap ? t->cap : 256;
    while (c < t->len + n + 1)
        c *= 2;
    if (!(b = realloc(t->p, c))) {
        t->ok = false;
        return false;
    }
    t->p = b;
    t->cap = c;
    return true;
}

void jtext_raw(struct jtext *t, const char *s, size_t n)
{
    if (!reserve(t, n))
        return;
    memcpy(t->p + t->len, s, n);
    t->len += n;
    t->p[t->len] = '\0';
}

void jtext_lit(struct jtext *t, const char *s)
{
    jtext_raw(t, s, strlen(s));
}

void jtext_str(struct jtext *t, const char *s, size_t n)
{
    static const char hex[] = "0123456789ABCDEF";
    const unsigned char *u = (const unsigned char *)s;
    size_t i, run = 0;

    /* At most 6 bytes a byte (\u00XX) and the quotes. */
    if (!reserve(t, 6 * n + 2))
        return;
    t->p[t->len++] = '"';
    for (i = 0; i < n; i++) {
        unsigned char c = u[i];
        char *o;

        if (c >= 0x20 && c != '"' && c != '\\') {
            run++;
            continue;
        }
        memcpy(t->p + t->len, s + i - run, run);
        t->len += run;
        run = 0;
        o = t->p + t->len;
        o[0] = '\\';
        switch (c) {
        case '"':
            o[1] = '"';
            t->len += 2;
            break;
        case '\\':
            o[1] = '\\';
            t->len += 2;
            break;
        case '\b':
            o[1] = 'b';
            t->len += 2;
            break;
        case '\f':
            o[1] = 'f';
            t->len += 2;
            break;
        case '\n':
            o[1] = 'n';
            t->len += 2;
            break;
        case '\r':
            o[1] = 'r';
            t->len += 2;
            break;
        case '\t':
            o[1] = 't';
            t->len += 2;
            break;
        default:
            memcpy(o + 1, "u00", 3);
            o[4] = hex[c >> 4];
            o[5] = hex[c & 15];
            t->len += 6;
            break;
        }
    }
    memcpy(t->p + t->len, s + i - run, run);
    t->len += run;
    t->p[t->len++] = '"';
    t->p[t->len] = '\0';
}

void jtext_int(struct jtext *t, long long v)
{
    /* By hand, not snprintf: a summary of 100,000 ranks writes a million of them. The
     * magnitude as unsigned, so that the most negative value has one. */
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    char b[24], *e = b + sizeof(b), *q = e;

    do {
        *--q = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *--q = '-';
    jtext_raw(t, q, (size_t)(e - q));
}

void jtext_real(struct jtext *t, double v)
{
    char b[40], *e, *d;
    int n = snprintf(b, sizeof(b), "%.17g", v);

    /* As jansson's jsonp_dtostr: the C locale's point, an exponent without its '+' and its
     * leading zeros, and ".0" for a number that would read as an integer. */
    for (char *q = b; *q; q++)
        if (*q == ',')
            *q = '.';
    if ((e = strchr(b, 'e'))) {
        e++;
        if (*e == '-')
            e++;
        d = e;
        while (*d == '+' || (*d == '0' && d[1]))
            d++;
        memmove(e, d, strlen(d) + 1);
        n = (int)strlen(b);
    }
    if (!strpbrk(b, ".eE") && n + 2 < (int)sizeof(b)) {
        memcpy(b + n, ".0", 3);
        n += 2;
    }
    jtext_raw(t, b, (size_t)n);
}

void jtext_bool(struct jtext *t, bool v)
{
    jtext_lit(t, v ? "true" : "false");
}

void jtext_json(struct jtext *t, const json_t *v)
{
    size_t n = json_dumpb(v, NULL, 0, JSON_COMPACT | JSON_ENCODE_ANY);

    if (!n) {
        t->ok = false;
        return;
    }
    if (!reserve(t, n))
        return;
    t->len += json_dumpb(v, t->p + t->len, n, JSON_COMPACT | JSON_ENCODE_ANY);
    t->p[t->len] = '\0';
}

void jtext_key(struct jtext *t, const char *key, bool first)
{
    size_t k = strlen(key);

    if (!reserve(t, k + 4))
        return;
    if (!first)
        t->p[t->len++] = ',';
    t->p[t->len++] = '"';
    memcpy(t->p + t->len, key, k);
    t->len += k;
    t->p[t->len++] = '"';
    t->p[t->len++] = ':';
    t->p[t->len] = '\0';
}
