/* libFuzzer harness for everything a peer's bytes reach before and after authentication:
 * the input is a byte stream fed to a frame_reader in chunks of varying size, and each frame's
 * payload goes to proto_decode (as on the rank's Unix socket) and to auth_open with a fixed
 * session, whose opened message goes to proto_decode too (as on a TCP link). Every decode is
 * done twice, with the fast path and through jansson alone, and the two must agree.
 *
 * Input layout: byte 0 chooses the chunk sizes and the reader's limit; the rest is the stream.
 * With FUZZ_FRAME_WRITE_SEEDS=DIR set, the harness writes a seed corpus to DIR (valid frames of
 * every message type, plain and sealed with the fixed session) and exits. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "frame.h"
#include "proto.h"
#include "banned.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The reader's limit for a small-limit input: below the largest seeds, so that both sides of
 * the length check are reached. */
#define FUZZ_SMALL_MAX 256

static void fixed_session(struct auth_session *s)
{
    memset(s, 0, sizeof(*s));
    for (int i = 0; i < AUTH_KEY_LEN; i++)
        s->tx_key[i] = s->rx_key[i] = (uint8_t)(0x5a ^ i);
}

static void decode(const uint8_t *p, size_t n)
{
    struct proto_error err, terr;
    struct msg m, t;
    int rc = proto_decode(p, n, &m, &err), trc = proto_decode_tree(p, n, &t, &terr);

    /* The fast path and jansson's must agree on every input: a divergence is a crash here. */
    if (rc != trc || (rc == 0 && !proto_msg_same(&m, &t)))
        abort();
    if (rc == 0) {
        proto_msg_release(&m);
        proto_msg_release(&t);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct frame_reader r;
    struct auth_session sess;
    uint32_t rng;
    size_t off = 1;
    int rc = 0;

    if (size < 1)
        return 0;
    rng = data[0] * 2654435761u + 1;
    fixed_session(&sess);
    frame_reader_init(&r, (data[0] & 1) ? FRAME_MAX_DEFAULT : FUZZ_SMALL_MAX);
    while (off < size && rc >= 0) {
        const uint8_t *payload, *msg;
        size_t len, n, chunk;

        /* xorshift32: chunks of 1..64 bytes, now and then everything left at once. */
        rng ^= rng << 13;
        rng ^= rng >> 17;
        rng ^= rng << 5;
        chunk = (rng & 0xff) == 0 ? size - off : 1 + rng % 64;
        if (chunk > size - off)
            chunk = size - off;
        if (frame_reader_feed(&r, data + off, chunk) < 0)
            break;
        off += chunk;
        while ((rc = frame_reader_next(&r, &payload, &len)) == 1) {
            decode(payload, len);
            if (auth_open(&sess, payload, len, &msg, &n) == 0)
                decode(msg, n);
        }
    }
    (void)frame_reader_pending(&r);
    frame_reader_release(&r);
    return 0;
}

/* --- seed corpus ----------------------------------------------------------------------------- */

static const char *const seed_msgs[] = {
    "{\"type\":\"hello\",\"rank\":3,\"token\":\"00ff\"}",
    "{\"type\":\"join\",\"node_rank\":1,\"hostname\":\"n1\",\"addr\":\"10.0.0.2\",\"nprocs\":4,"
    "\"gpus\":\"0,1\"}",
    "{\"type\":\"assign\",\"generation\":0,\"world_size\":8,\"rank_base\":4,\"nnodes\":2,"
    "\"master_addr\":\"10.0.0.1\",\"master_port\":29500}",
    "{\"type\":\"hb\"}",
    "{\"type\":\"kv_put\",\"id\":1,\"key\":\"k\",\"value\":\"dmFs\"}",
    "{\"type\":\"kv_get\",\"id\":2,\"key\":\"k\",\"timeout_ms\":100}",
    "{\"type\":\"kv_del\",\"id\":3,\"key\":\"k\"}",
    "{\"type\":\"barrier\",\"id\":4,\"name\":\"b\",\"count\":2}",
    "{\"type\":\"barrier_done\",\"name\":\"b\"}",
    "{\"type\":\"report\",\"step\":1,\"loss\":2.5,\"lr\":0.1,\"tokens_per_s\":1.5,"
    "\"grad_norm\":0.5}",
    "{\"type\":\"progress\",\"ranks\":[]}",
    "{\"type\":\"finalize\",\"id\":5}",
    "{\"type\":\"rank_exit\",\"rank\":1,\"code\":7,\"signal\":0,\"oom\":false,\"killed\":false,"
    "\"tail\":\"x\"}",
    "{\"type\":\"abort\",\"cause\":\"c\",\"status\":124}",
    "{\"type\":\"finish\",\"status\":0}",
    "{\"type\":\"status\",\"id\":6}",
    "{\"type\":\"status_reply\",\"id\":6,\"job\":{}}",
    "{\"type\":\"ok\",\"id\":7}",
    "{\"type\":\"kv_val\",\"id\":8,\"value\":\"dmFs\"}",
    "{\"type\":\"error\",\"id\":9,\"code\":\"timeout\",\"msg\":\"m\"}",
};
#define N_SEEDS (sizeof(seed_msgs) / sizeof(seed_msgs[0]))

static int write_seed(const char *dir, const char *name, size_t i, const uint8_t *buf, size_t n)
{
    char path[4096];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s-%02zu", dir, name, i);
    f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "fuzz_frame: cannot write '%s'\n", path);
        return -1;
    }
    return 0;
}

/* Whether msg decodes as it would arrive sealed: a seed the decoder refuses (the table
 * changed under it) would only test the refusal. */
static int seed_decodes(const char *msg)
{
    struct proto_error err;
    struct msg m;

    if (proto_decode((const uint8_t *)msg, strlen(msg), &m, &err) < 0) {
        fprintf(stderr,
                "fuzz_frame: seed refused by the decoder (%s): %s\n"
                "fuzz_frame: update seed_msgs in tests/fuzz_frame.c to the protocol's table\n",
                err.why.text, msg);
        return 0;
    }
    proto_msg_release(&m);
    return 1;
}

/* One plain frame per message, and the same message sealed twice in a row (seq 0 and 1) with
 * the fixed session; byte 0 alternates the reader's limit. */
static int write_seeds(const char *dir)
{
    static uint8_t buf[2 * (FRAME_HDR_LEN + AUTH_OVERHEAD + 512) + 1];

    for (size_t i = 0; i < N_SEEDS; i++) {
        struct auth_session s;
        size_t len = strlen(seed_msgs[i]), n = 1;

        if (!seed_decodes(seed_msgs[i]))
            return -1;
        buf[0] = (uint8_t)(i * 2 + 1);
        frame_put_header(buf + n, (uint32_t)len);
        memcpy(buf + n + FRAME_HDR_LEN, seed_msgs[i], len);
        if (write_seed(dir, "plain", i, buf, n + FRAME_HDR_LEN + len) < 0)
            return -1;
        fixed_session(&s);
        buf[0] = (uint8_t)(i * 2);
        for (int k = 0; k < 2; k++) {
            frame_put_header(buf + n, (uint32_t)(len + AUTH_OVERHEAD));
            memcpy(buf + n + FRAME_HDR_LEN + AUTH_SEQ_LEN, seed_msgs[i], len);
            auth_seal(&s, buf + n + FRAME_HDR_LEN, len);
            n += FRAME_HDR_LEN + len + AUTH_OVERHEAD;
        }
        if (write_seed(dir, "sealed", i, buf, n) < 0)
            return -1;
    }
    return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *dir = getenv("FUZZ_FRAME_WRITE_SEEDS");

    (void)argc;
    (void)argv;
    if (dir && dir[0])
        exit(write_seeds(dir) < 0 ? 1 : 0);
    return 0;
}
