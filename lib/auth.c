/* HMAC-SHA256 handshake and per-frame tags on top of OpenSSL's libcrypto: its hashes are
 * audited and constant-time where it matters, which hand-written code is not. The random
 * bytes come from the kernel (getrandom(2), what OpenSSL's own generator is seeded from):
 * OpenSSL's RAND_bytes would first read openssl.cnf and set up its generator, a millisecond
 * on the path of every daemon's first handshake and first rank. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

/* SHA256_Init/Update/Final are deprecated in OpenSSL 3 in favour of EVP, and kept. They are
 * what HMAC needs at speed: the key's inner and outer states computed once per session and
 * copied per frame as plain structs. EVP's HMAC copies a digest context per frame through the
 * provider (an allocation each), and at 12,500 agents its 25,000 keyed contexts (1.8 KiB
 * apiece) left the cache: a tenth of the leader's time went to MACs. The hashing itself is
 * the same code (SHA-NI or AVX2) either way. */
#define OPENSSL_API_COMPAT 0x10101000L
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "auth.h"
#include "fsutil.h"
#include "banned.h"

enum { HS_START, HS_SENT_HELLO, HS_SENT_CHAL, HS_DONE };

_Static_assert(sizeof(SHA256_CTX) <= sizeof(((struct auth_hmac *)0)->inner),
               "struct auth_hmac cannot hold a SHA256_CTX");
_Static_assert(SHA256_DIGEST_LENGTH == AUTH_TAG_LEN, "a tag is one SHA-256 digest");

/* HMAC's two states after the key block (RFC 2104): the key, zero-padded to SHA-256's block,
 * XOR ipad and XOR opad, each hashed once. n <= SHA256_CBLOCK. */
static void hmac_key(struct auth_hmac *h, const uint8_t *key, size_t n)
{
    uint8_t pad[SHA256_CBLOCK];

    memset(pad, 0x36, sizeof(pad));
    for (size_t i = 0; i < n; i++)
        pad[i] ^= key[i];
    SHA256_Init((SHA256_CTX *)h->inner);
    SHA256_Update((SHA256_CTX *)h->inner, pad, sizeof(pad));
    memset(pad, 0x5c, sizeof(pad));
    for (size_t i = 0; i < n; i++)
        pad[i] ^= key[i];
    SHA256_Init((SHA256_CTX *)h->outer);
    SHA256_Update((SHA256_CTX *)h->outer, pad, sizeof(pad));
    OPENSSL_cleanse(pad, sizeof(pad));
}

/* HMAC-SHA256 of n bytes of msg under the key h was made from. */
static void hmac_run(const struct auth_hmac *h, const uint8_t *msg, size_t n,
                     uint8_t out[AUTH_TAG_LEN])
{
    SHA256_CTX c;
    uint8_t inner[SHA256_DIGEST_LENGTH];

    memcpy(&c, h->inner, sizeof(c));
    SHA256_Update(&c, msg, n);
    SHA256_Final(inner, &c);
    memcpy(&c, h->outer, sizeof(c));
    SHA256_Update(&c, inner, sizeof(inner));
    SHA256_Final(out, &c);
    OPENSSL_cleanse(&c, sizeof(c));
}

/* HMAC-SHA256 of n bytes of msg under a 32-byte key into out. */
static void hmac(const uint8_t *key, const uint8_t *msg, size_t n, uint8_t out[AUTH_TAG_LEN])
{
    struct auth_hmac h;

    hmac_key(&h, key, AUTH_KEY_LEN);
    hmac_run(&h, msg, n, out);
    OPENSSL_cleanse(&h, sizeof(h));
}

static const uint8_t magic_hello[4] = {'G', 'R', 'H', '1'};
static const uint8_t magic_chal[4] = {'G', 'R', 'C', '1'};
static const uint8_t magic_proof[4] = {'G', 'R', 'P', '1'};
static const uint8_t magic_early[4] = {'G', 'R', 'J', '1'};

/* HMAC(key, label || nonce_c || nonce_s): the one derivation every step uses. */
static void derive(const uint8_t *key, const char *label, const struct auth_handshake *hs,
                   uint8_t out[AUTH_TAG_LEN])
{
    uint8_t msg[16 + 2 * AUTH_NONCE_LEN];
    size_t l = strlen(label);

    memcpy(msg, label, l);
    memcpy(msg + l, hs->nonce_c, AUTH_NONCE_LEN);
    memcpy(msg + l + AUTH_NONCE_LEN, hs->nonce_s, AUTH_NONCE_LEN);
    hmac(key, msg, l + 2 * AUTH_NONCE_LEN, out);
    OPENSSL_cleanse(msg, sizeof(msg));
}

/* Each direction's key, from labels of their own for each handshake: the one-frame hello's
 * ("gpurun ec2s", nonce_s all zero) never equal the three-frame one's. */
static void session_keys_of(struct auth_handshake *hs, struct auth_session *sess, int client,
                            const char *c2s_label, const char *s2c_label)
{
    uint8_t c2s[AUTH_KEY_LEN], s2c[AUTH_KEY_LEN];

    derive(hs->key.k, c2s_label, hs, c2s);
    derive(hs->key.k, s2c_label, hs, s2c);
    memcpy(sess->tx_key, client ? c2s : s2c, AUTH_KEY_LEN);
    memcpy(sess->rx_key, client ? s2c : c2s, AUTH_KEY_LEN);
    sess->tx_seq = sess->rx_seq = 0;
    auth_session_key(sess);
    OPENSSL_cleanse(c2s, sizeof(c2s));
    OPENSSL_cleanse(s2c, sizeof(s2c));
    OPENSSL_cleanse(&hs->key, sizeof(hs->key));
    hs->state = HS_DONE;
}

static void session_keys(struct auth_handshake *hs, struct auth_session *sess, int client)
{
    session_keys_of(hs, sess, client, "gpurun c2s", "gpurun s2c");
}

void auth_key_derive(const struct auth_key *key, const char *label, uint8_t out[AUTH_TAG_LEN])
{
    hmac(key->k, (const uint8_t *)label, strlen(label), out);
}

int auth_random(void *buf, size_t n)
{
    uint8_t *p = buf;

    while (n > 0) {
        ssize_t got = getrandom(p, n, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return -EIO;
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

int auth_key_generate(struct auth_key *key)
{
    return auth_random(key->k, AUTH_KEY_LEN);
}

int auth_key_write(const char *path, const struct auth_key *key)
{
    char hex[AUTH_KEYFILE_LEN + 2];
    int ret = -1, fd;

    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    auth_hex(key->k, AUTH_KEY_LEN, hex);
    hex[AUTH_KEYFILE_LEN] = '\n';
    if (write(fd, hex, AUTH_KEYFILE_LEN + 1) != AUTH_KEYFILE_LEN + 1) {
        ret = errno ? -errno : -EIO;
        goto out;
    }
    if (fsync(fd) < 0) {
        ret = -errno;
        goto out;
    }
    ret = 0;
out:
    OPENSSL_cleanse(hex, sizeof(hex));
    close(fd);
    if (ret < 0)
        unlink(path);
    return ret;
}

/* The mode is checked on the file that is read (fstat of the open file, then fs_read_fd), not
 * on whatever the path names at another moment. */
int auth_key_read(const char *path, struct auth_key *key)
{
    char *text = NULL;
    size_t len = 0, n;
    struct stat st;
    int ret, fd;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) < 0)
        ret = -errno;
    else if (st.st_mode & 077)
        ret = -EPERM;
    else if (S_ISDIR(st.st_mode))
        ret = -EISDIR;
    else
        ret = fs_read_fd(fd, AUTH_KEYFILE_LEN + 1, &text, &len);
    close(fd);
    /* A longer file is no key either. */
    if (ret == -EFBIG)
        ret = -EINVAL;
    if (ret < 0)
        return ret;
    n = len;
    if (n == AUTH_KEYFILE_LEN + 1 && text[AUTH_KEYFILE_LEN] == '\n')
        n--;
    if (n != AUTH_KEYFILE_LEN) {
        ret = -EINVAL;
    } else {
        text[AUTH_KEYFILE_LEN] = '\0';
        ret = auth_unhex(text, key->k, AUTH_KEY_LEN);
    }
    OPENSSL_cleanse(text, len);
    free(text);
    return ret;
}

int auth_client_hello(struct auth_handshake *hs, const struct auth_key *key,
                      uint8_t out[AUTH_HELLO_LEN])
{
    memset(hs, 0, sizeof(*hs));
    hs->key = *key;
    if (auth_random(hs->nonce_c, AUTH_NONCE_LEN) < 0)
        return -EIO;
    memcpy(out, magic_hello, 4);
    memcpy(out + 4, hs->nonce_c, AUTH_NONCE_LEN);
    hs->state = HS_SENT_HELLO;
    return 0;
}

int auth_client_proof(struct auth_handshake *hs, const uint8_t *in, size_t len,
                      uint8_t out[AUTH_PROOF_LEN], struct auth_session *sess)
{
    uint8_t want[AUTH_TAG_LEN];

    if (hs->state != HS_SENT_HELLO || len != AUTH_CHAL_LEN || memcmp(in, magic_chal, 4))
        return -EBADMSG;
    memcpy(hs->nonce_s, in + 4, AUTH_NONCE_LEN);
    derive(hs->key.k, "gpurun srv", hs, want);
    if (CRYPTO_memcmp(want, in + 4 + AUTH_NONCE_LEN, AUTH_TAG_LEN))
        return -EACCES;
    memcpy(out, magic_proof, 4);
    derive(hs->key.k, "gpurun cli", hs, out + 4);
    session_keys(hs, sess, 1);
    return 0;
}

int auth_server_challenge(struct auth_handshake *hs, const struct auth_key *key, const uint8_t *in,
                          size_t len, uint8_t out[AUTH_CHAL_LEN])
{
    memset(hs, 0, sizeof(*hs));
    if (len != AUTH_HELLO_LEN || memcmp(in, magic_hello, 4))
        return -EBADMSG;
    hs->key = *key;
    memcpy(hs->nonce_c, in + 4, AUTH_NONCE_LEN);
    if (auth_random(hs->nonce_s, AUTH_NONCE_LEN) < 0)
        return -EIO;
    memcpy(out, magic_chal, 4);
    memcpy(out + 4, hs->nonce_s, AUTH_NONCE_LEN);
    derive(hs->key.k, "gpurun srv", hs, out + 4 + AUTH_NONCE_LEN);
    hs->state = HS_SENT_CHAL;
    return 0;
}

int auth_server_finish(struct auth_handshake *hs, const uint8_t *in, size_t len,
                       struct auth_session *sess)
{
    uint8_t want[AUTH_TAG_LEN];

    if (hs->state != HS_SENT_CHAL || len != AUTH_PROOF_LEN || memcmp(in, magic_proof, 4))
        return -EBADMSG;
    derive(hs->key.k, "gpurun cli", hs, want);
    if (CRYPTO_memcmp(want, in + 4, AUTH_TAG_LEN))
        return -EACCES;
    session_keys(hs, sess, 0);
    return 0;
}

static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}

static uint64_t get_be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

/* --- the one-frame hello ------------------------------------------------------------------ */

int auth_early_hello(struct auth_handshake *hs, const struct auth_key *key,
                     uint8_t out[AUTH_EARLY_LEN], struct auth_session *sess)
{
    memset(hs, 0, sizeof(*hs));
    hs->key = *key;
    if (auth_random(hs->nonce_c, AUTH_NONCE_LEN) < 0) {
        OPENSSL_cleanse(&hs->key, sizeof(hs->key));
        return -EIO;
    }
    memcpy(out, magic_early, 4);
    memcpy(out + 4, hs->nonce_c, AUTH_NONCE_LEN);
    derive(hs->key.k, "gpurun early", hs, out + 4 + AUTH_NONCE_LEN);
    session_keys_of(hs, sess, 1, "gpurun ec2s", "gpurun es2c");
    return 0;
}

bool auth_is_early_hello(const uint8_t *in, size_t len)
{
    return len >= 4 && !memcmp(in, magic_early, 4);
}

int auth_early_accept(struct auth_handshake *hs, const struct auth_key *key, const uint8_t *in,
                      size_t len, struct auth_session *sess)
{
    static const uint8_t zero[AUTH_NONCE_LEN];
    uint8_t want[AUTH_TAG_LEN];

    memset(hs, 0, sizeof(*hs));
    if (len != AUTH_EARLY_LEN || memcmp(in, magic_early, 4) ||
        !memcmp(in + 4, zero, AUTH_NONCE_LEN))
        return -EBADMSG;
    hs->key = *key;
    memcpy(hs->nonce_c, in + 4, AUTH_NONCE_LEN);
    derive(hs->key.k, "gpurun early", hs, want);
    if (CRYPTO_memcmp(want, in + 4 + AUTH_NONCE_LEN, AUTH_TAG_LEN)) {
        OPENSSL_cleanse(&hs->key, sizeof(hs->key));
        return -EACCES;
    }
    session_keys_of(hs, sess, 0, "gpurun ec2s", "gpurun es2c");
    return 0;
}

/* An open-addressing set of 32-byte nonces, the all-zero one marking an empty slot (a hello
 * with it is malformed). Nonces are random: their first 8 bytes are the hash. */
int auth_seen_add(struct auth_seen *s, const uint8_t nonce[AUTH_NONCE_LEN])
{
    static const uint8_t zero[AUTH_NONCE_LEN];
    size_t i;

    if (!memcmp(nonce, zero, AUTH_NONCE_LEN))
        return -EINVAL;
    for (i = get_be64(nonce) & (s->cap - 1); s->cap && memcmp(s->slots[i], zero, AUTH_NONCE_LEN);
         i = (i + 1) & (s->cap - 1))
        if (!memcmp(s->slots[i], nonce, AUTH_NONCE_LEN))
            return -EEXIST;
    if (s->max && s->n >= s->max)
        return -ENOSPC;
    if (2 * (s->n + 1) > s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 1024;
        uint8_t(*slots)[AUTH_NONCE_LEN] = calloc(cap, AUTH_NONCE_LEN);
        if (!slots)
            return -ENOMEM;
        for (size_t k = 0; k < s->cap; k++) {
            if (!memcmp(s->slots[k], zero, AUTH_NONCE_LEN))
                continue;
            size_t j = get_be64(s->slots[k]) & (cap - 1);
            while (memcmp(slots[j], zero, AUTH_NONCE_LEN))
                j = (j + 1) & (cap - 1);
            memcpy(slots[j], s->slots[k], AUTH_NONCE_LEN);
        }
        free(s->slots);
        s->slots = slots;
        s->cap = cap;
        for (i = get_be64(nonce) & (cap - 1); memcmp(slots[i], zero, AUTH_NONCE_LEN);
             i = (i + 1) & (cap - 1))
            ;
    }
    memcpy(s->slots[i], nonce, AUTH_NONCE_LEN);
    s->n++;
    return 0;
}

void auth_seen_release(struct auth_seen *s)
{
    free(s->slots);
    *s = (struct auth_seen){.max = s->max};
}

void auth_session_key(struct auth_session *s)
{
    hmac_key(&s->tx_mac, s->tx_key, AUTH_KEY_LEN);
    hmac_key(&s->rx_mac, s->rx_key, AUTH_KEY_LEN);
}

void auth_session_release(struct auth_session *s)
{
    OPENSSL_cleanse(s, sizeof(*s));
}

void auth_seal(struct auth_session *s, uint8_t *buf, size_t n)
{
    put_be64(buf, s->tx_seq++);
    hmac_run(&s->tx_mac, buf, AUTH_SEQ_LEN + n, buf + AUTH_SEQ_LEN + n);
}

int auth_open(struct auth_session *s, const uint8_t *payload, size_t len, const uint8_t **msg,
              size_t *n)
{
    uint8_t tag[AUTH_TAG_LEN];

    if (len < AUTH_OVERHEAD)
        return -EBADMSG;
    hmac_run(&s->rx_mac, payload, len - AUTH_TAG_LEN, tag);
    if (CRYPTO_memcmp(tag, payload + len - AUTH_TAG_LEN, AUTH_TAG_LEN))
        return -EBADMSG;
    if (get_be64(payload) != s->rx_seq)
        return -EPROTO;
    s->rx_seq++;
    *msg = payload + AUTH_SEQ_LEN;
    *n = len - AUTH_OVERHEAD;
    return 0;
}

void auth_hex(const uint8_t *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";

    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int auth_unhex(const char *in, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(in[2 * i]), lo = hi < 0 ? -1 : hexval(in[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -EINVAL;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return in[2 * n] == '\0' ? 0 : -EINVAL;
}
