/* Tests of lib/frame: frames split across feeds, many frames in one feed, the length checks
 * that come before any allocation, and the bound on the reader's buffer. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "test.h"
#include "banned.h"

/* Appends one frame (header + payload) to out; returns the bytes written. */
static size_t put_frame(uint8_t *out, const void *payload, uint32_t len)
{
    frame_put_header(out, len);
    memcpy(out + FRAME_HDR_LEN, payload, len);
    return FRAME_HDR_LEN + len;
}

TEST(frame_header_is_big_endian)
{
    uint8_t hdr[FRAME_HDR_LEN];

    frame_put_header(hdr, 0x01020304u);
    CHECK_EQ(hdr[0], 1);
    CHECK_EQ(hdr[1], 2);
    CHECK_EQ(hdr[2], 3);
    CHECK_EQ(hdr[3], 4);
    frame_put_header(hdr, 0xfffffffeu);
    CHECK_EQ(hdr[0], 0xff);
    CHECK_EQ(hdr[3], 0xfe);
}

TEST(frame_fed_byte_by_byte)
{
    struct frame_reader r;
    uint8_t wire[64];
    const uint8_t *p;
    size_t len, n = put_frame(wire, "{\"type\":\"hb\"}", 13);

    frame_reader_init(&r, FRAME_MAX_DEFAULT);
    for (size_t i = 0; i < n; i++) {
        CHECK_EQ(frame_reader_next(&r, &p, &len), 0);
        CHECK_EQ(frame_reader_feed(&r, wire + i, 1), 0);
        CHECK_EQ(frame_reader_pending(&r), i + 1 < n ? i + 1 : n);
    }
    CHECK_EQ(frame_reader_next(&r, &p, &len), 1);
    CHECK_EQ(len, 13);
    CHECK(!memcmp(p, "{\"type\":\"hb\"}", 13));
    CHECK_EQ(frame_reader_pending(&r), 0);
    CHECK_EQ(frame_reader_next(&r, &p, &len), 0);
    frame_reader_release(&r);
}

/* Every split point of a two-frame stream: header cut, payload cut, the second frame's header
 * arriving with the end of the first. */
TEST(frame_every_split_point)
{
    uint8_t wire[128];
    size_t n = put_frame(wire, "first", 5);
    n += put_frame(wire + n, "second!", 7);

    for (size_t cut = 0; cut <= n; cut++) {
        struct frame_reader r;
        const uint8_t *p;
        size_t len;
        int got = 0, rc;

        frame_reader_init(&r, 64);
        CHECK_EQ(frame_reader_feed(&r, wire, cut), 0);
        while ((rc = frame_reader_next(&r, &p, &len)) == 1) {
            CHECK_EQ(len, got == 0 ? 5 : 7);
            CHECK(!memcmp(p, got == 0 ? "first" : "second!", len));
            got++;
        }
        CHECK_EQ(rc, 0);
        CHECK_EQ(frame_reader_feed(&r, wire + cut, n - cut), 0);
        while ((rc = frame_reader_next(&r, &p, &len)) == 1) {
            CHECK_EQ(len, got == 0 ? 5 : 7);
            CHECK(!memcmp(p, got == 0 ? "first" : "second!", len));
            got++;
        }
        CHECK_EQ(rc, 0);
        CHECK_EQ(got, 2);
        CHECK_EQ(frame_reader_pending(&r), 0);
        frame_reader_release(&r);
    }
}

TEST(frame_many_in_one_feed)
{
    enum { N = 1000 };
    struct frame_reader r;
    uint8_t *wire = malloc(N * (FRAME_HDR_LEN + 16));
    const uint8_t *p;
    size_t n = 0, len;
    char msg[16];

    CHECK(wire);
    for (int i = 0; i < N; i++) {
        int l = snprintf(msg, sizeof(msg), "m%d", i);
        n += put_frame(wire + n, msg, (uint32_t)l);
    }
    frame_reader_init(&r, 64);
    CHECK_EQ(frame_reader_feed(&r, wire, n), 0);
    for (int i = 0; i < N; i++) {
        int l = snprintf(msg, sizeof(msg), "m%d", i);
        CHECK_EQ(frame_reader_next(&r, &p, &len), 1);
        CHECK_EQ(len, l);
        CHECK(!memcmp(p, msg, len));
    }
    CHECK_EQ(frame_reader_next(&r, &p, &len), 0);
    CHECK_EQ(frame_reader_pending(&r), 0);
    frame_reader_release(&r);
    free(wire);
}

/* An announced length over max is refused from the 4 header bytes alone: the reader never
 * grows its buffer towards the announced size. */
TEST(frame_oversized_refused_before_allocation)
{
    struct frame_reader r;
    uint8_t hdr[FRAME_HDR_LEN];
    const uint8_t *p;
    size_t len;

    frame_reader_init(&r, FRAME_MAX_DEFAULT);
    frame_put_header(hdr, 0xffffffffu);
    CHECK_EQ(frame_reader_feed(&r, hdr, sizeof(hdr)), 0);
    CHECK_EQ(frame_reader_next(&r, &p, &len), -EMSGSIZE);
    CHECK_INT(r.cap, <=, 4096);
    frame_reader_release(&r);

    frame_reader_init(&r, 100);
    frame_put_header(hdr, 101);
    CHECK_EQ(frame_reader_feed(&r, hdr, sizeof(hdr)), 0);
    CHECK_EQ(frame_reader_next(&r, &p, &len), -EMSGSIZE);
    CHECK_INT(r.cap, <=, 4096);
    frame_reader_release(&r);
}

TEST(frame_exactly_max_accepted)
{
    enum { MAX = 10000 };
    struct frame_reader r;
    uint8_t *wire = malloc(FRAME_HDR_LEN + MAX);
    const uint8_t *p;
    size_t len;

    CHECK(wire);
    memset(wire + FRAME_HDR_LEN, 'x', MAX);
    frame_put_header(wire, MAX);
    frame_reader_init(&r, MAX);
    CHECK_EQ(frame_reader_feed(&r, wire, FRAME_HDR_LEN + MAX), 0);
    CHECK_EQ(frame_reader_next(&r, &p, &len), 1);
    CHECK_EQ(len, MAX);
    CHECK_EQ(p[MAX - 1], 'x');
    frame_reader_release(&r);
    free(wire);
}

TEST(frame_zero_length_refused)
{
    struct frame_reader r;
    uint8_t wire[16];
    const uint8_t *p;
    size_t len;

    frame_reader_init(&r, 64);
    frame_put_header(wire, 0);
    CHECK_EQ(frame_reader_feed(&r, wire, FRAME_HDR_LEN), 0);
    CHECK_EQ(frame_reader_next(&r, &p, &len), -EBADMSG);
    frame_reader_release(&r);
}

/* A zero-length frame after a good one is still refused, and the good one came through. */
TEST(frame_zero_length_after_good_frame)
{
    struct frame_reader r;
    uint8_t wire[32];
    const uint8_t *p;
    size_t len, n = put_frame(wire, "ok", 2);

    frame_put_header(wire + n, 0);
    n += FRAME_HDR_LEN;
    frame_reader_init(&r, 64);
    CHECK_EQ(frame_reader_feed(&r, wire, n), 0);
    CHECK_EQ(frame_reader_next(&r, &p, &len), 1);
    CHECK_EQ(len, 2);
    CHECK_EQ(frame_reader_next(&r, &p, &len), -EBADMSG);
    frame_reader_release(&r);
}

TEST(frame_truncated_is_pending)
{
    struct frame_reader r;
    uint8_t wire[64];
    const uint8_t *p;
    size_t len, n = put_frame(wire, "0123456789", 10);

    frame_reader_init(&r, 64);
    CHECK_EQ(frame_reader_pending(&r), 0);
    CHECK_EQ(frame_reader_feed(&r, wire, 2), 0);
    CHECK_EQ(frame_reader_next(&r, &p, &len), 0);
    CHECK_EQ(frame_reader_pending(&r), 2);
    CHECK_EQ(frame_reader_feed(&r, wire + 2, n - 5), 0);
    CHECK_EQ(frame_reader_next(&r, &p, &len), 0);
    CHECK_EQ(frame_reader_pending(&r), n - 3);
    CHECK_EQ(frame_reader_feed(&r, wire + n - 3, 3), 0);
    CHECK_EQ(frame_reader_next(&r, &p, &len), 1);
    CHECK_EQ(frame_reader_pending(&r), 0);
    frame_reader_release(&r);
}

/* A long stream fed in reads of 1000 bytes, drained after each feed: the buffer stays within
 * a small multiple of max plus one read, however much went through. */
TEST(frame_buffer_stays_bounded)
{
    enum { MAX = 4096, READ = 1000, FRAMES = 3000 };
    struct frame_reader r;
    uint8_t *wire = malloc((size_t)FRAMES * (FRAME_HDR_LEN + 700));
    uint8_t payload[700];
    const uint8_t *p;
    size_t n = 0, len, off = 0, total = 0;
    int got = 0, rc;

    CHECK(wire);
    for (int i = 0; i < FRAMES; i++) {
        uint32_t l = 1 + (uint32_t)(i * 37) % sizeof(payload);
        memset(payload, 'a' + i % 26, l);
        n += put_frame(wire + n, payload, l);
        total += l;
    }
    frame_reader_init(&r, MAX);
    while (off < n) {
        size_t chunk = n - off < READ ? n - off : READ;
        CHECK_EQ(frame_reader_feed(&r, wire + off, chunk), 0);
        off += chunk;
        while ((rc = frame_reader_next(&r, &p, &len)) == 1) {
            CHECK_EQ(p[0], 'a' + got % 26);
            CHECK_EQ(p[len - 1], 'a' + got % 26);
            total -= len;
            got++;
        }
        CHECK_EQ(rc, 0);
        CHECK_INT(r.cap, <=, 2 * (FRAME_HDR_LEN + MAX + READ));
    }
    CHECK_EQ(got, FRAMES);
    CHECK_EQ(total, 0);
    CHECK_EQ(frame_reader_pending(&r), 0);
    frame_reader_release(&r);
    free(wire);
}

TEST(frame_empty_reader_and_reuse)
{
    struct frame_reader r;
    uint8_t wire[16];
    const uint8_t *p;
    size_t len;

    frame_reader_init(&r, 64);
    CHECK_EQ(frame_reader_next(&r, &p, &len), 0);
    CHECK_EQ(frame_reader_feed(&r, wire, 0), 0);
    CHECK_EQ(frame_reader_next(&r, &p, &len), 0);
    CHECK_EQ(frame_reader_feed(&r, wire, put_frame(wire, "abc", 3)), 0);
    frame_reader_release(&r);
    /* Released: empty again, same limit. */
    CHECK_EQ(r.max, 64);
    CHECK_EQ(frame_reader_pending(&r), 0);
    CHECK_EQ(frame_reader_feed(&r, wire, put_frame(wire, "xyz", 3)), 0);
    CHECK_EQ(frame_reader_next(&r, &p, &len), 1);
    CHECK(!memcmp(p, "xyz", 3));
    frame_reader_release(&r);
}
