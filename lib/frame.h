/* Length-prefixed framing shared by every gpurun link: a 4-byte big-endian payload length,
 * then the payload. The reader checks the announced length against its limit before it
 * waits for the payload, and frame_reader_check() lets a caller refuse it before it buffers
 * a byte of the frame, so an oversized frame costs no allocation. */
#ifndef GPURUN_FRAME_H
#define GPURUN_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define FRAME_HDR_LEN     4
/* Default largest payload: 1 MiB holds any store value (FRAME_VALUE_MAX) with room to spare,
 * and bounds what one peer can make the daemon buffer. */
#define FRAME_MAX_DEFAULT (1u << 20)

struct frame_reader {
    uint8_t *buf; /* bytes received and not yet consumed, from buf[off] to buf[len] */
    size_t off;
    size_t len;
    size_t cap;
    uint32_t max; /* largest payload accepted */
};

/* Prepares an empty reader that accepts payloads of 1..max bytes. Its buffer starts at the
 * smaller of 4 KiB and one whole frame of max, and grows by doubling. */
void frame_reader_init(struct frame_reader *r, uint32_t max);

/* Frees the reader's buffer; the reader may be initialised again. */
void frame_reader_release(struct frame_reader *r);

/* Appends n received bytes. Returns 0 or -ENOMEM. Call frame_reader_next() until it returns
 * 0 after every feed: that is what keeps the buffer bounded by max plus one read. */
int frame_reader_feed(struct frame_reader *r, const void *data, size_t n);

/* What frame_reader_next() would say of the frame in progress once the n bytes of data are
 * fed, without feeding them: -EMSGSIZE when its header (completed by data) announces more
 * than max, -EBADMSG when it announces zero, else 0. A caller that checks before it feeds
 * closes a link that announces an oversized frame without buffering a byte of it. */
int frame_reader_check(const struct frame_reader *r, const void *data, size_t n);

/* Bytes still missing from the frame in progress: the rest of its header, or of its payload
 * once the header is in (0 when a whole frame is buffered, or its header is invalid). A
 * caller that feeds at most this much buffers one frame at a time, so that it may change max
 * between frames (a link whose handshake is done accepts larger frames). */
size_t frame_reader_want(const struct frame_reader *r);

/* Takes the next complete frame. Returns 1 and sets *payload (borrowed: valid until the next
 * feed, next or release) and *len; 0 when no complete frame is buffered; -EMSGSIZE when the
 * announced length is above max, -EBADMSG when it is zero. After an error the reader is
 * unusable: close the connection. */
int frame_reader_next(struct frame_reader *r, const uint8_t **payload, size_t *len);

/* Bytes buffered that are not yet a whole frame: non-zero at end of stream means the peer
 * sent a truncated frame. */
size_t frame_reader_pending(const struct frame_reader *r);

/* Writes the 4-byte header for a payload of len bytes into hdr. */
void frame_put_header(uint8_t hdr[FRAME_HDR_LEN], uint32_t len);

#endif
