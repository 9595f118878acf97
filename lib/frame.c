/* The frame reader: an append buffer that is compacted lazily, so that a burst of small
 * frames in one read costs one memmove at most. */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "banned.h"

/* A fresh reader's buffer: a page holds a burst of small frames. */
#define FRAME_BUF_FIRST 4096

/* The first buffer of r: a page, or one whole frame when that is smaller (a link before its
 * handshake then costs a few dozen bytes, not a page). */
static size_t first_cap(const struct frame_reader *r)
{
    size_t one = (size_t)r->max + FRAME_HDR_LEN;

    return one < FRAME_BUF_FIRST ? one : FRAME_BUF_FIRST;
}

void frame_reader_init(struct frame_reader *r, uint32_t max)
{
    memset(r, 0, sizeof(*r));
    r->max = max;
}

void frame_reader_release(struct frame_reader *r)
{
    free(r->buf);
    frame_reader_init(r, r->max);
}

/* The payload length the frame in progress announces, read from the buffered bytes followed
 * by the n bytes of data; false while fewer than FRAME_HDR_LEN bytes are at hand. */
static bool announced(const struct frame_reader *r, const uint8_t *data, size_t n, uint32_t *len)
{
    size_t have = r->len - r->off;
    uint8_t hdr[FRAME_HDR_LEN];

    if (have + n < FRAME_HDR_LEN)
        return false;
    for (size_t i = 0; i < FRAME_HDR_LEN; i++)
        hdr[i] = i < have ? r->buf[r->off + i] : data[i - have];
    *len = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
    return true;
}

int frame_reader_check(const struct frame_reader *r, const void *data, size_t n)
{
    uint32_t len;

    if (!announced(r, data, n, &len))
        return 0;
    return len == 0 ? -EBADMSG : len > r->max ? -EMSGSIZE : 0;
}

int frame_reader_feed(struct frame_reader *r, const void *data, size_t n)
{
    /* Nothing to add: also keeps a fresh reader's NULL buffer out of pointer arithmetic. */
    if (n == 0)
        return 0;
    if (r->off > 0 && r->off == r->len) {
        r->off = r->len = 0;
    } else if (r->off > 0 && r->len + n > r->cap) {
        memmove(r->buf, r->buf + r->off, r->len - r->off);
        r->len -= r->off;
        r->off = 0;
    }
    if (r->len + n > r->cap) {
        size_t cap = r->cap ? r->cap : first_cap(r);
        while (cap < r->len + n)
            cap *= 2;
        uint8_t *nb = realloc(r->buf, cap);
        if (!nb)
            return -ENOMEM;
        r->buf = nb;
        r->cap = cap;
    }
    memcpy(r->buf + r->len, data, n);
    r->len += n;
    return 0;
}

int frame_reader_next(struct frame_reader *r, const uint8_t **payload, size_t *len)
{
    size_t avail = r->len - r->off;
    const uint8_t *p;
    uint32_t n;

    if (avail < FRAME_HDR_LEN)
        return 0;
    p = r->buf + r->off;
    n = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
    if (n == 0)
        return -EBADMSG;
    if (n > r->max)
        return -EMSGSIZE;
    if (avail - FRAME_HDR_LEN < n)
        return 0;
    *payload = p + FRAME_HDR_LEN;
    *len = n;
    r->off += FRAME_HDR_LEN + n;
    return 1;
}

size_t frame_reader_want(const struct frame_reader *r)
{
    size_t have = r->len - r->off;
    uint32_t len;

    if (!announced(r, NULL, 0, &len))
        return FRAME_HDR_LEN - have;
    if (len == 0 || len > r->max || have >= FRAME_HDR_LEN + (size_t)len)
        return 0;
    return FRAME_HDR_LEN + (size_t)len - have;
}

size_t frame_reader_pending(const struct frame_reader *r)
{
    return r->len - r->off;
}

void frame_put_header(uint8_t hdr[FRAME_HDR_LEN], uint32_t len)
{
    hdr[0] = (uint8_t)(len >> 24);
    hdr[1] = (uint8_t)(len >> 16);
    hdr[2] = (uint8_t)(len >> 8);
    hdr[3] = (uint8_t)len;
}
