/* HMAC-SHA256 handshake and per-frame tags on top of OpenSSL's libcrypto: its MACs and
 * RAND_bytes() are audited and constant-time where it matters, which hand-written code is
 * not. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pthread.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include "auth.h"
#include "banned.h"

enum { HS_START, HS_SENT_HELLO, HS_SENT_CHAL, HS_DONE };

/* OpenSSL 3's one-shot HMAC() looks the algorithm up by name on every call, which was 15% of
 * the leader's CPU at 512 agents; the MAC is fetched once per process instead. */
static EVP_MAC *hmac_alg;
static pthread_once_t hmac_once = PTHREAD_ONCE_INIT;

static void hmac_fetch(void)
{
    hmac_alg = EVP_MAC_fetch(NULL, "HMAC", NULL);
}

/* A context of this thread's for keys used once (the handshake's, and sessions without keyed
 * contexts): made once, keyed per call. Creating and freeing a context per frame was a fifth
 * of the leader's time at 12,500 agents. Never freed: one per thread that ever computes a
 * MAC, alive as long as the thread. */
static __thread EVP_MAC_CTX *thread_mac;

/* A new HMAC-SHA256 context keyed with key (NULL for none yet), or NULL. */
static EVP_MAC_CTX *mac_new(const uint8_t *key)
{
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
        OSSL_PARAM_construct_end(),
    };
    EVP_MAC_CTX *ctx;

    pthread_once(&hmac_once, hmac_fetch);
    if (!hmac_alg || !(ctx = EVP_MAC_CTX_new(hmac_alg)))
        return NULL;
    if (!EVP_MAC_CTX_set_params(ctx, params) ||
        (key && !EVP_MAC_init(ctx, key, AUTH_KEY_LEN, NULL))) {
        EVP_MAC_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

/* HMAC-SHA256 of n bytes of msg into out: with ctx, keyed already (its key's inner and outer
 * states are kept, so a frame costs only its own hashing), else with this thread's context
 * keyed with key. Returns 0 or -EIO. */
static int mac(EVP_MAC_CTX *ctx, const uint8_t *key, const uint8_t *msg, size_t n,
               uint8_t out[AUTH_TAG_LEN])
{
    size_t outlen = 0;

    if (!ctx) {
        if (!thread_mac && !(thread_mac = mac_new(NULL)))
            return -EIO;
        ctx = thread_mac;
    } else {
        key = NULL;
    }
    if (!EVP_MAC_init(ctx, key, key ? AUTH_KEY_LEN : 0, NULL) || !EVP_MAC_update(ctx, msg, n) ||
        !EVP_MAC_final(ctx, out, &outlen, AUTH_TAG_LEN) || outlen != AUTH_TAG_LEN)
        return -EIO;
    return 0;
}

/* HMAC-SHA256 of n bytes of msg under a 32-byte key into out. Returns 0 or -EIO. */
static int hmac(const uint8_t *key, const uint8_t *msg, size_t n, uint8_t out[AUTH_TAG_LEN])
{
    return mac(NULL, key, msg, n, out);
}

static const uint8_t magic_hello[4] = {'G', 'R', 'H', '1'};
static const uint8_t magic_chal[4] = {'G', 'R', 'C', '1'};
static const uint8_t magic_proof[4] = {'G', 'R', 'P', '1'};

/* HMAC(key, label || nonce_c || nonce_s): the one derivation every step uses. */
static void derive(const uint8_t *key, const char *label, const struct auth_handshake *hs,
                   uint8_t out[AUTH_TAG_LEN])
{
    uint8_t msg[16 + 2 * AUTH_NONCE_LEN];
    size_t l = strlen(label);

    memcpy(msg, label, l);
    memcpy(msg + l, hs->nonce_c, AUTH_NONCE_LEN);
    memcpy(msg + l + AUTH_NONCE_LEN, hs->nonce_s, AUTH_NONCE_LEN);
    if (hmac(key, msg, l + 2 * AUTH_NONCE_LEN, out) < 0)
        memset(out, 0, AUTH_TAG_LEN); /* a zero tag matches nothing the peer computes */
    OPENSSL_cleanse(msg, sizeof(msg));
}

static void session_keys(struct auth_handshake *hs, struct auth_session *sess, int client)
{
    uint8_t c2s[AUTH_KEY_LEN], s2c[AUTH_KEY_LEN];

    derive(hs->key.k, "gpurun c2s", hs, c2s);
    derive(hs->key.k, "gpurun s2c", hs, s2c);
    memcpy(sess->tx_key, client ? c2s : s2c, AUTH_KEY_LEN);
    memcpy(sess->rx_key, client ? s2c : c2s, AUTH_KEY_LEN);
    sess->tx_seq = sess->rx_seq = 0;
    /* Keyed once here; without them (out of memory) every frame keys its own. */
    sess->tx_mac = mac_new(sess->tx_key);
    sess->rx_mac = mac_new(sess->rx_key);
    OPENSSL_cleanse(c2s, sizeof(c2s));
    OPENSSL_cleanse(s2c, sizeof(s2c));
    OPENSSL_cleanse(&hs->key, sizeof(hs->key));
    hs->state = HS_DONE;
}

int auth_key_generate(struct auth_key *key)
{
    return RAND_bytes(key->k, AUTH_KEY_LEN) == 1 ? 0 : -EIO;
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

int auth_key_read(const char *path, struct auth_key *key)
{
    char buf[AUTH_KEYFILE_LEN + 2];
    struct stat st;
    ssize_t n;
    int ret = -1, fd;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) < 0) {
        ret = -errno;
        goto out;
    }
    if (st.st_mode & 077) {
        ret = -EPERM;
        goto out;
    }
    n = read(fd, buf, sizeof(buf));
    if (n < 0) {
        ret = -errno;
        goto out;
    }
    if (n == AUTH_KEYFILE_LEN + 1 && buf[AUTH_KEYFILE_LEN] == '\n')
        n--;
    if (n != AUTH_KEYFILE_LEN) {
        ret = -EINVAL;
        goto out;
    }
    buf[AUTH_KEYFILE_LEN] = '\0';
    ret = auth_unhex(buf, key->k, AUTH_KEY_LEN);
out:
    OPENSSL_cleanse(buf, sizeof(buf));
    close(fd);
    return ret;
}

int auth_client_hello(struct auth_handshake *hs, const struct auth_key *key,
                      uint8_t out[AUTH_HELLO_LEN])
{
    memset(hs, 0, sizeof(*hs));
    hs->key = *key;
    if (RAND_bytes(hs->nonce_c, AUTH_NONCE_LEN) != 1)
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
    if (RAND_bytes(hs->nonce_s, AUTH_NONCE_LEN) != 1)
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

void auth_session_release(struct auth_session *s)
{
    EVP_MAC_CTX_free(s->tx_mac);
    EVP_MAC_CTX_free(s->rx_mac);
    OPENSSL_cleanse(s, sizeof(*s));
}

void auth_seal(struct auth_session *s, uint8_t *buf, size_t n)
{
    put_be64(buf, s->tx_seq++);
    if (mac(s->tx_mac, s->tx_key, buf, AUTH_SEQ_LEN + n, buf + AUTH_SEQ_LEN + n) < 0)
        memset(buf + AUTH_SEQ_LEN + n, 0, AUTH_TAG_LEN); /* refused by the receiver */
}

int auth_open(struct auth_session *s, const uint8_t *payload, size_t len, const uint8_t **msg,
              size_t *n)
{
    uint8_t tag[AUTH_TAG_LEN];

    if (len < AUTH_OVERHEAD)
        return -EBADMSG;
    if (mac(s->rx_mac, s->rx_key, payload, len - AUTH_TAG_LEN, tag) < 0)
        return -EBADMSG;
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
