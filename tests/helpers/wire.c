/* The tests' blocking client of the daemon's TCP protocol (wire.h). The handshake math for
 * the forged variants is written out here from auth.h's description rather than taken from
 * lib/auth.c, so that the daemon is checked against the documented transcript. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "wire.h"
#include "banned.h"

/* Larger than the daemon's own frame limit, so that whatever it sends is read. */
#define WIRE_FRAME_MAX (16u << 20)

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int wire_connect(struct wire *w, const char *host, int port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int one = 1, ret;

    memset(w, 0, sizeof(*w));
    w->fd = -1;
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return -EINVAL;
    w->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (w->fd < 0)
        return -errno;
    if (connect(w->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        ret = -errno;
        close(w->fd);
        w->fd = -1;
        return ret;
    }
    setsockopt(w->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    frame_reader_init(&w->rd, WIRE_FRAME_MAX);
    return 0;
}

int wire_local_port(const struct wire *w)
{
    struct sockaddr_in sa;
    socklen_t len = sizeof(sa);

    if (getsockname(w->fd, (struct sockaddr *)&sa, &len) < 0)
        return -1;
    return ntohs(sa.sin_port);
}

int wire_send_raw(struct wire *w, const void *data, size_t n)
{
    const uint8_t *p = data;

    while (n > 0) {
        ssize_t k = send(w->fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -errno;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

int wire_send_frame(struct wire *w, const void *payload, size_t n)
{
    uint8_t hdr[FRAME_HDR_LEN];
    int ret;

    frame_put_header(hdr, (uint32_t)n);
    ret = wire_send_raw(w, hdr, sizeof(hdr));
    return ret < 0 ? ret : wire_send_raw(w, payload, n);
}

int wire_recv_frame(struct wire *w, int timeout_ms, const uint8_t **payload, size_t *len)
{
    int64_t deadline = mono_ms() + timeout_ms;
    uint8_t buf[64 * 1024];
    const uint8_t *p;
    size_t n;
    int ret;

    for (;;) {
        ret = frame_reader_next(&w->rd, &p, &n);
        if (ret < 0)
            return ret;
        if (ret == 1) {
            uint8_t *copy = malloc(n);
            if (!copy)
                return -ENOMEM;
            memcpy(copy, p, n);
            free(w->frame);
            w->frame = copy;
            w->frame_len = n;
            *payload = copy;
            *len = n;
            return 0;
        }
        int left = (int)(deadline - mono_ms());
        if (left <= 0)
            return -ETIMEDOUT;
        struct pollfd pfd = {.fd = w->fd, .events = POLLIN};
        ret = poll(&pfd, 1, left);
        if (ret < 0 && errno == EINTR)
            continue;
        if (ret < 0)
            return -errno;
        if (ret == 0)
            return -ETIMEDOUT;
        ssize_t k = recv(w->fd, buf, sizeof(buf), 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k == 0 || (k < 0 && errno == ECONNRESET))
            return -ECONNRESET;
        if (k < 0)
            return -errno;
        if (frame_reader_feed(&w->rd, buf, (size_t)k) < 0)
            return -ENOMEM;
    }
}

int wire_handshake(struct wire *w, const struct auth_key *key, int timeout_ms)
{
    struct auth_handshake hs;
    uint8_t hello[AUTH_HELLO_LEN], proof[AUTH_PROOF_LEN];
    const uint8_t *chal;
    size_t len;
    int ret;

    ret = auth_client_hello(&hs, key, hello);
    if (ret == 0)
        ret = wire_send_frame(w, hello, sizeof(hello));
    if (ret == 0)
        ret = wire_recv_frame(w, timeout_ms, &chal, &len);
    if (ret == 0)
        ret = auth_client_proof(&hs, chal, len, proof, &w->sess);
    if (ret == 0) {
        memcpy(w->nonce_c, hs.nonce_c, AUTH_NONCE_LEN);
        memcpy(w->nonce_s, hs.nonce_s, AUTH_NONCE_LEN);
        ret = wire_send_frame(w, proof, sizeof(proof));
    }
    memset(&hs, 0, sizeof(hs));
    return ret;
}

int wire_early_hello(struct wire *w, const struct auth_key *key, uint8_t *hello)
{
    struct auth_handshake hs;
    uint8_t early[AUTH_EARLY_LEN];
    int ret = auth_early_hello(&hs, key, early, &w->sess);

    if (ret == 0)
        ret = wire_send_frame(w, early, sizeof(early));
    if (ret == 0 && hello)
        memcpy(hello, early, sizeof(early));
    memset(&hs, 0, sizeof(hs));
    return ret;
}

/* HMAC(key, label || nonce_c || nonce_s), as auth.h describes every derivation. */
static void derive(const struct auth_key *key, const char *label, const uint8_t *nonce_c,
                   const uint8_t *nonce_s, uint8_t out[AUTH_TAG_LEN])
{
    uint8_t msg[16 + 2 * AUTH_NONCE_LEN];
    size_t l = strlen(label);
    unsigned int outlen = AUTH_TAG_LEN;

    memcpy(msg, label, l);
    memcpy(msg + l, nonce_c, AUTH_NONCE_LEN);
    memcpy(msg + l + AUTH_NONCE_LEN, nonce_s, AUTH_NONCE_LEN);
    HMAC(EVP_sha256(), key->k, AUTH_KEY_LEN, msg, l + 2 * AUTH_NONCE_LEN, out, &outlen);
}

int wire_handshake_forged(struct wire *w, const struct auth_key *key, int timeout_ms)
{
    uint8_t hello[AUTH_HELLO_LEN], proof[AUTH_PROOF_LEN];
    struct auth_handshake hs;
    const uint8_t *chal;
    size_t len;
    int ret;

    /* The hello is a magic and a fresh nonce: the key does not enter it. */
    ret = auth_client_hello(&hs, key, hello);
    memset(&hs, 0, sizeof(hs));
    if (ret < 0)
        return ret;
    memcpy(w->nonce_c, hello + 4, AUTH_NONCE_LEN);
    ret = wire_send_frame(w, hello, sizeof(hello));
    if (ret == 0)
        ret = wire_recv_frame(w, timeout_ms, &chal, &len);
    if (ret < 0)
        return ret;
    if (len != AUTH_CHAL_LEN)
        return -EBADMSG;
    memcpy(w->nonce_s, chal + 4, AUTH_NONCE_LEN);
    memcpy(proof, "GRP1", 4);
    derive(key, "gpurun cli", w->nonce_c, w->nonce_s, proof + 4);
    wire_session_for_key(w, key, &w->sess);
    w->sess.tx_seq = w->sess.rx_seq = 0;
    return wire_send_frame(w, proof, sizeof(proof));
}

void wire_session_for_key(const struct wire *w, const struct auth_key *key,
                          struct auth_session *out)
{
    struct auth_session s = w->sess;

    derive(key, "gpurun c2s", w->nonce_c, w->nonce_s, s.tx_key);
    derive(key, "gpurun s2c", w->nonce_c, w->nonce_s, s.rx_key);
    auth_session_key(&s);
    *out = s;
}

int wire_seal(struct wire *w, struct auth_session *sess, const char *json, size_t n, uint8_t **out,
              size_t *out_len)
{
    size_t total = FRAME_HDR_LEN + n + AUTH_OVERHEAD;
    uint8_t *buf = malloc(total);

    if (!buf)
        return -ENOMEM;
    frame_put_header(buf, (uint32_t)(n + AUTH_OVERHEAD));
    memcpy(buf + FRAME_HDR_LEN + AUTH_SEQ_LEN, json, n);
    auth_seal(sess ? sess : &w->sess, buf + FRAME_HDR_LEN, n);
    *out = buf;
    *out_len = total;
    return 0;
}

int wire_send_json(struct wire *w, const char *json)
{
    uint8_t *buf;
    size_t len;
    int ret = wire_seal(w, NULL, json, strlen(json), &buf, &len);

    if (ret < 0)
        return ret;
    ret = wire_send_raw(w, buf, len);
    free(buf);
    return ret;
}

int wire_recv_json(struct wire *w, int timeout_ms, json_t **msg)
{
    int64_t deadline = mono_ms() + timeout_ms;

    for (;;) {
        const uint8_t *payload, *json;
        size_t len, n;
        json_t *root;
        int left = (int)(deadline - mono_ms());
        int ret = wire_recv_frame(w, left > 0 ? left : 0, &payload, &len);

        if (ret < 0)
            return ret;
        if (auth_open(&w->sess, payload, len, &json, &n) < 0)
            return -EPROTO;
        root = json_loadb((const char *)json, n, 0, NULL);
        if (!json_is_object(root)) {
            json_decref(root);
            return -EBADMSG;
        }
        if (json_is_string(json_object_get(root, "type")) &&
            !strcmp(json_string_value(json_object_get(root, "type")), "hb")) {
            json_decref(root);
            continue;
        }
        *msg = root;
        return 0;
    }
}

int wire_wait_closed(struct wire *w, int timeout_ms)
{
    int64_t deadline = mono_ms() + timeout_ms;

    for (;;) {
        const uint8_t *payload;
        size_t len;
        int left = (int)(deadline - mono_ms());
        int ret = wire_recv_frame(w, left > 0 ? left : 0, &payload, &len);

        if (ret == -ECONNRESET)
            return 0;
        if (ret == -ETIMEDOUT)
            return -ETIMEDOUT;
        if (ret < 0) {
            /* A frame we cannot read: drop what is buffered and keep reading the socket. */
            frame_reader_release(&w->rd);
            frame_reader_init(&w->rd, WIRE_FRAME_MAX);
        }
    }
}

void wire_close(struct wire *w)
{
    if (w->fd >= 0)
        close(w->fd);
    w->fd = -1;
    frame_reader_release(&w->rd);
    free(w->frame);
    w->frame = NULL;
    auth_session_release(&w->sess);
}
