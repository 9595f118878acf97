/* Tests of lib/auth: the handshake with the same key and with wrong keys on either side,
 * sealed frames refused when replayed, reordered, tampered with or taken from another link,
 * the key file's mode and format checks, and the one-frame hello with its replay memory. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "auth.h"
#include "test.h"
#include "banned.h"

static struct auth_key key_of(uint8_t fill)
{
    struct auth_key k;
    for (int i = 0; i < AUTH_KEY_LEN; i++)
        k.k[i] = (uint8_t)(fill + i);
    return k;
}

/* Runs a whole handshake between a client holding ck and a server holding sk. Returns 0 with
 * both sessions filled, or the first step's error; *side says which step failed (1: client's
 * proof, 2: server's finish). */
static int handshake(const struct auth_key *ck, const struct auth_key *sk, struct auth_session *cs,
                     struct auth_session *ss, int *side)
{
    struct auth_handshake chs, shs;
    uint8_t hello[AUTH_HELLO_LEN], chal[AUTH_CHAL_LEN], proof[AUTH_PROOF_LEN];
    int rc;

    *side = 0;
    CHECK_EQ(auth_client_hello(&chs, ck, hello), 0);
    CHECK_EQ(auth_server_challenge(&shs, sk, hello, sizeof(hello), chal), 0);
    rc = auth_client_proof(&chs, chal, sizeof(chal), proof, cs);
    if (rc < 0) {
        *side = 1;
        return rc;
    }
    rc = auth_server_finish(&shs, proof, sizeof(proof), ss);
    if (rc < 0)
        *side = 2;
    return rc;
}

/* Seals msg with s into buf (sized by the caller); returns the payload length. */
static size_t seal(struct auth_session *s, uint8_t *buf, const char *msg)
{
    size_t n = strlen(msg);
    memcpy(buf + AUTH_SEQ_LEN, msg, n);
    auth_seal(s, buf, n);
    return n + AUTH_OVERHEAD;
}

static void check_open(struct auth_session *s, const uint8_t *buf, size_t len, const char *want)
{
    const uint8_t *msg = NULL;
    size_t n = 0;

    CHECK_EQ(auth_open(s, buf, len, &msg, &n), 0);
    CHECK_EQ(n, strlen(want));
    CHECK(!memcmp(msg, want, n));
}

TEST(auth_handshake_same_key)
{
    struct auth_key k = key_of(7);
    struct auth_session cs = {0}, ss = {0};
    uint8_t buf[256];
    size_t len;
    int side;

    CHECK_EQ(handshake(&k, &k, &cs, &ss, &side), 0);
    CHECK(!memcmp(cs.tx_key, ss.rx_key, AUTH_KEY_LEN));
    CHECK(!memcmp(cs.rx_key, ss.tx_key, AUTH_KEY_LEN));
    CHECK(memcmp(cs.tx_key, cs.rx_key, AUTH_KEY_LEN));
    CHECK(memcmp(cs.tx_key, k.k, AUTH_KEY_LEN));
    CHECK_EQ(cs.tx_seq, 0);
    CHECK_EQ(ss.rx_seq, 0);

    /* Both directions carry frames, each with its own sequence. */
    for (int i = 0; i < 3; i++) {
        len = seal(&cs, buf, "{\"type\":\"hb\"}");
        check_open(&ss, buf, len, "{\"type\":\"hb\"}");
    }
    len = seal(&ss, buf, "{\"type\":\"ok\",\"id\":1}");
    check_open(&cs, buf, len, "{\"type\":\"ok\",\"id\":1}");
    CHECK_EQ(cs.tx_seq, 3);
    CHECK_EQ(ss.rx_seq, 3);
    CHECK_EQ(ss.tx_seq, 1);
    CHECK_EQ(cs.rx_seq, 1);
    auth_session_release(&cs);
    auth_session_release(&ss);
}

TEST(auth_two_handshakes_get_different_keys)
{
    struct auth_key k = key_of(1);
    struct auth_session c1 = {0}, s1 = {0}, c2 = {0}, s2 = {0};
    int side;

    CHECK_EQ(handshake(&k, &k, &c1, &s1, &side), 0);
    CHECK_EQ(handshake(&k, &k, &c2, &s2, &side), 0);
    CHECK(memcmp(c1.tx_key, c2.tx_key, AUTH_KEY_LEN));
    CHECK(memcmp(c1.rx_key, c2.rx_key, AUTH_KEY_LEN));
    auth_session_release(&c1);
    auth_session_release(&s1);
    auth_session_release(&c2);
    auth_session_release(&s2);
}

/* A server with another key: the client refuses the challenge. */
TEST(auth_wrong_key_client_side)
{
    struct auth_key ck = key_of(1), sk = key_of(2);
    struct auth_session cs = {0}, ss = {0};
    int side;

    CHECK_EQ(handshake(&ck, &sk, &cs, &ss, &side), -EACCES);
    CHECK_EQ(side, 1);
    auth_session_release(&cs);
    auth_session_release(&ss);
}

/* A client with another key that answers the challenge anyway (it cannot check the server's
 * tag, so it just computes its proof with the key it has): the server refuses it. */
TEST(auth_wrong_key_server_side)
{
    struct auth_key ck = key_of(1), sk = key_of(2);
    struct auth_handshake chs, shs;
    struct auth_session ss = {0};
    uint8_t hello[AUTH_HELLO_LEN], chal[AUTH_CHAL_LEN], proof[AUTH_PROOF_LEN];
    uint8_t msg[10 + 2 * AUTH_NONCE_LEN];
    unsigned int outlen = AUTH_TAG_LEN;

    CHECK_EQ(auth_client_hello(&chs, &ck, hello), 0);
    CHECK_EQ(auth_server_challenge(&shs, &sk, hello, sizeof(hello), chal), 0);
    memcpy(msg, "gpurun cli", 10);
    memcpy(msg + 10, hello + 4, AUTH_NONCE_LEN);
    memcpy(msg + 10 + AUTH_NONCE_LEN, chal + 4, AUTH_NONCE_LEN);
    memcpy(proof, "GRP1", 4);
    CHECK(HMAC(EVP_sha256(), ck.k, AUTH_KEY_LEN, msg, 10 + 2 * AUTH_NONCE_LEN, proof + 4, &outlen));
    CHECK_EQ(auth_server_finish(&shs, proof, sizeof(proof), &ss), -EACCES);
    auth_session_release(&ss);
}

/* The same computation with the right key is accepted: the forged proof above failed for its
 * key, not for its layout. */
TEST(auth_hand_made_proof_with_right_key)
{
    struct auth_key k = key_of(3);
    struct auth_handshake chs, shs;
    struct auth_session ss = {0};
    uint8_t hello[AUTH_HELLO_LEN], chal[AUTH_CHAL_LEN], proof[AUTH_PROOF_LEN];
    uint8_t msg[10 + 2 * AUTH_NONCE_LEN];
    unsigned int outlen = AUTH_TAG_LEN;

    CHECK_EQ(auth_client_hello(&chs, &k, hello), 0);
    CHECK_EQ(auth_server_challenge(&shs, &k, hello, sizeof(hello), chal), 0);
    memcpy(msg, "gpurun cli", 10);
    memcpy(msg + 10, hello + 4, AUTH_NONCE_LEN);
    memcpy(msg + 10 + AUTH_NONCE_LEN, chal + 4, AUTH_NONCE_LEN);
    memcpy(proof, "GRP1", 4);
    CHECK(HMAC(EVP_sha256(), k.k, AUTH_KEY_LEN, msg, 10 + 2 * AUTH_NONCE_LEN, proof + 4, &outlen));
    CHECK_EQ(auth_server_finish(&shs, proof, sizeof(proof), &ss), 0);
    auth_session_release(&ss);
}

/* A proof recorded from an earlier handshake does not open a new one. */
TEST(auth_replayed_proof_refused)
{
    struct auth_key k = key_of(9);
    struct auth_handshake chs, shs;
    struct auth_session cs = {0}, ss = {0};
    uint8_t hello[AUTH_HELLO_LEN], chal[AUTH_CHAL_LEN], proof[AUTH_PROOF_LEN];

    CHECK_EQ(auth_client_hello(&chs, &k, hello), 0);
    CHECK_EQ(auth_server_challenge(&shs, &k, hello, sizeof(hello), chal), 0);
    CHECK_EQ(auth_client_proof(&chs, chal, sizeof(chal), proof, &cs), 0);
    CHECK_EQ(auth_server_finish(&shs, proof, sizeof(proof), &ss), 0);
    /* The attacker replays hello and proof; the server picks a fresh nonce. */
    CHECK_EQ(auth_server_challenge(&shs, &k, hello, sizeof(hello), chal), 0);
    CHECK_EQ(auth_server_finish(&shs, proof, sizeof(proof), &ss), -EACCES);
    auth_session_release(&cs);
    auth_session_release(&ss);
}

TEST(auth_handshake_frames_of_wrong_shape)
{
    struct auth_key k = key_of(4);
    struct auth_handshake chs, shs;
    struct auth_session cs = {0}, ss = {0};
    uint8_t hello[AUTH_HELLO_LEN], chal[AUTH_CHAL_LEN], proof[AUTH_PROOF_LEN];
    uint8_t bad[AUTH_CHAL_LEN + 1];

    CHECK_EQ(auth_client_hello(&chs, &k, hello), 0);
    CHECK_EQ(auth_server_challenge(&shs, &k, hello, sizeof(hello) - 1, chal), -EBADMSG);
    memcpy(bad, hello, sizeof(hello));
    bad[0] = 'X';
    CHECK_EQ(auth_server_challenge(&shs, &k, bad, sizeof(hello), chal), -EBADMSG);
    /* A proof before any challenge. */
    memset(proof, 0, sizeof(proof));
    memcpy(proof, "GRP1", 4);
    CHECK_EQ(auth_server_finish(&shs, proof, sizeof(proof), &ss), -EBADMSG);

    CHECK_EQ(auth_server_challenge(&shs, &k, hello, sizeof(hello), chal), 0);
    CHECK_EQ(auth_client_proof(&chs, chal, sizeof(chal) - 1, proof, &cs), -EBADMSG);
    memcpy(bad, chal, sizeof(chal));
    memcpy(bad, "GRH1", 4);
    CHECK_EQ(auth_client_proof(&chs, bad, sizeof(chal), proof, &cs), -EBADMSG);
    CHECK_EQ(auth_client_proof(&chs, chal, sizeof(chal), proof, &cs), 0);
    /* The handshake is over: a second challenge is refused. */
    CHECK_EQ(auth_client_proof(&chs, chal, sizeof(chal), proof, &cs), -EBADMSG);
    CHECK_EQ(auth_server_finish(&shs, proof, sizeof(proof) + 1, &ss), -EBADMSG);
    CHECK_EQ(auth_server_finish(&shs, proof, sizeof(proof), &ss), 0);
    CHECK_EQ(auth_server_finish(&shs, proof, sizeof(proof), &ss), -EBADMSG);
    auth_session_release(&cs);
    auth_session_release(&ss);
}

TEST(auth_replayed_frame_refused)
{
    struct auth_key k = key_of(5);
    struct auth_session cs = {0}, ss = {0};
    uint8_t f0[128], f1[128];
    size_t l0, l1;
    int side;

    CHECK_EQ(handshake(&k, &k, &cs, &ss, &side), 0);
    l0 = seal(&cs, f0, "{\"type\":\"hb\"}");
    l1 = seal(&cs, f1, "{\"type\":\"status\",\"id\":2}");
    check_open(&ss, f0, l0, "{\"type\":\"hb\"}");
    CHECK_EQ(auth_open(&ss, f0, l0, &(const uint8_t *){0}, &(size_t){0}), -EPROTO);
    check_open(&ss, f1, l1, "{\"type\":\"status\",\"id\":2}");
    CHECK_EQ(auth_open(&ss, f1, l1, &(const uint8_t *){0}, &(size_t){0}), -EPROTO);
    CHECK_EQ(ss.rx_seq, 2);
    auth_session_release(&cs);
    auth_session_release(&ss);
}

TEST(auth_reordered_frame_refused)
{
    struct auth_key k = key_of(6);
    struct auth_session cs = {0}, ss = {0};
    uint8_t f0[128], f1[128];
    size_t l1;
    int side;

    CHECK_EQ(handshake(&k, &k, &cs, &ss, &side), 0);
    seal(&cs, f0, "{\"type\":\"hb\"}");
    l1 = seal(&cs, f1, "{\"type\":\"hb\"}");
    CHECK_EQ(auth_open(&ss, f1, l1, &(const uint8_t *){0}, &(size_t){0}), -EPROTO);
    CHECK_EQ(ss.rx_seq, 0);
    auth_session_release(&cs);
    auth_session_release(&ss);
}

/* Every single flipped bit, in seq, message or tag, fails the tag. */
TEST(auth_tampered_frame_refused)
{
    struct auth_key k = key_of(8);
    struct auth_session cs = {0}, ss = {0};
    uint8_t f[128];
    size_t len;
    int side;

    CHECK_EQ(handshake(&k, &k, &cs, &ss, &side), 0);
    len = seal(&cs, f, "{\"type\":\"kv_put\",\"id\":1,\"key\":\"a\",\"value\":\"b\"}");
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit++) {
            f[i] ^= (uint8_t)(1 << bit);
            CHECK_EQ(auth_open(&ss, f, len, &(const uint8_t *){0}, &(size_t){0}), -EBADMSG);
            f[i] ^= (uint8_t)(1 << bit);
        }
    }
    /* Cut short, or with a byte more. */
    CHECK_EQ(auth_open(&ss, f, len - 1, &(const uint8_t *){0}, &(size_t){0}), -EBADMSG);
    CHECK_EQ(auth_open(&ss, f, AUTH_OVERHEAD - 1, &(const uint8_t *){0}, &(size_t){0}), -EBADMSG);
    CHECK_EQ(ss.rx_seq, 0);
    check_open(&ss, f, len, "{\"type\":\"kv_put\",\"id\":1,\"key\":\"a\",\"value\":\"b\"}");
    auth_session_release(&cs);
    auth_session_release(&ss);
}

/* A frame of another link of the same job, of another job, or sent back to its sender. */
TEST(auth_frame_from_elsewhere_refused)
{
    struct auth_key k = key_of(10), other = key_of(11);
    struct auth_session c1 = {0}, s1 = {0}, c2 = {0}, s2 = {0}, c3 = {0}, s3 = {0};
    uint8_t f[128];
    size_t len;
    int side;

    CHECK_EQ(handshake(&k, &k, &c1, &s1, &side), 0);
    CHECK_EQ(handshake(&k, &k, &c2, &s2, &side), 0);
    CHECK_EQ(handshake(&other, &other, &c3, &s3, &side), 0);
    len = seal(&c1, f, "{\"type\":\"hb\"}");
    CHECK_EQ(auth_open(&s2, f, len, &(const uint8_t *){0}, &(size_t){0}), -EBADMSG);
    CHECK_EQ(auth_open(&s3, f, len, &(const uint8_t *){0}, &(size_t){0}), -EBADMSG);
    /* Reflected to the client that sealed it. */
    CHECK_EQ(auth_open(&c1, f, len, &(const uint8_t *){0}, &(size_t){0}), -EBADMSG);
    check_open(&s1, f, len, "{\"type\":\"hb\"}");
    auth_session_release(&c1);
    auth_session_release(&s1);
    auth_session_release(&c2);
    auth_session_release(&s2);
    auth_session_release(&c3);
    auth_session_release(&s3);
}

TEST(auth_empty_message_round_trip)
{
    struct auth_key k = key_of(12);
    struct auth_session cs = {0}, ss = {0};
    uint8_t f[AUTH_OVERHEAD];
    const uint8_t *msg;
    size_t n = 99;
    int side;

    CHECK_EQ(handshake(&k, &k, &cs, &ss, &side), 0);
    auth_seal(&cs, f, 0);
    CHECK_EQ(auth_open(&ss, f, sizeof(f), &msg, &n), 0);
    CHECK_EQ(n, 0);
    auth_session_release(&cs);
    auth_session_release(&ss);
}

TEST(auth_key_file_round_trip)
{
    char path[4200];
    struct auth_key k, back;
    struct stat st;

    snprintf(path, sizeof(path), "%s/key", test_tmpdir());
    CHECK_EQ(auth_key_generate(&k), 0);
    umask(0);
    CHECK_EQ(auth_key_write(path, &k), 0);
    CHECK_EQ(stat(path, &st), 0);
    CHECK_EQ(st.st_mode & 07777, 0600);
    CHECK_EQ(st.st_size, AUTH_KEYFILE_LEN + 1);
    CHECK_EQ(auth_key_read(path, &back), 0);
    CHECK(!memcmp(k.k, back.k, AUTH_KEY_LEN));
    /* An existing key is never overwritten. */
    CHECK_EQ(auth_key_write(path, &k), -EEXIST);
    CHECK_EQ(auth_key_read(path, &back), 0);
}

TEST(auth_key_file_refused_when_others_can_read)
{
    char path[4200];
    struct auth_key k = key_of(13), back;

    snprintf(path, sizeof(path), "%s/key", test_tmpdir());
    CHECK_EQ(auth_key_write(path, &k), 0);
    CHECK_EQ(chmod(path, 0644), 0);
    CHECK_EQ(auth_key_read(path, &back), -EPERM);
    CHECK_EQ(chmod(path, 0640), 0);
    CHECK_EQ(auth_key_read(path, &back), -EPERM);
    CHECK_EQ(chmod(path, 0602), 0);
    CHECK_EQ(auth_key_read(path, &back), -EPERM);
    CHECK_EQ(chmod(path, 0400), 0);
    CHECK_EQ(auth_key_read(path, &back), 0);
}

static int read_key_text(const char *text, size_t len)
{
    char path[4200];
    struct auth_key k;
    int fd;

    snprintf(path, sizeof(path), "%s/key-%zu", test_tmpdir(), len);
    unlink(path);
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    CHECK(fd >= 0);
    CHECK_EQ(write(fd, text, len), (ssize_t)len);
    close(fd);
    return auth_key_read(path, &k);
}

TEST(auth_key_file_malformed)
{
    const char *hex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
    char buf[200];

    CHECK_EQ(strlen(hex), AUTH_KEYFILE_LEN);
    CHECK_EQ(read_key_text(hex, 64), 0);
    snprintf(buf, sizeof(buf), "%s\n", hex);
    CHECK_EQ(read_key_text(buf, 65), 0);
    CHECK_EQ(read_key_text("", 0), -EINVAL);
    CHECK_EQ(read_key_text(hex, 63), -EINVAL);
    snprintf(buf, sizeof(buf), "%s0", hex);
    CHECK_EQ(read_key_text(buf, 65), -EINVAL);
    snprintf(buf, sizeof(buf), "%s\n\n", hex);
    CHECK_EQ(read_key_text(buf, 66), -EINVAL);
    snprintf(buf, sizeof(buf), "%s\nmore text", hex);
    CHECK_EQ(read_key_text(buf, strlen(buf)), -EINVAL);
    snprintf(buf, sizeof(buf), "%s", hex);
    buf[10] = 'g';
    CHECK_EQ(read_key_text(buf, 64), -EINVAL);
    buf[10] = '\0';
    CHECK_EQ(read_key_text(buf, 64), -EINVAL);
}

TEST(auth_key_file_is_a_directory)
{
    char path[4200];
    struct auth_key k;

    snprintf(path, sizeof(path), "%s/key-dir", test_tmpdir());
    CHECK_EQ(mkdir(path, 0700), 0);
    CHECK_EQ(auth_key_read(path, &k), -EISDIR);
    CHECK_EQ(chmod(path, 0755), 0);
    CHECK_EQ(auth_key_read(path, &k), -EPERM);
}

TEST(auth_key_file_missing)
{
    char path[4200];
    struct auth_key k;

    snprintf(path, sizeof(path), "%s/none", test_tmpdir());
    CHECK_EQ(auth_key_read(path, &k), -ENOENT);
    snprintf(path, sizeof(path), "%s/no/such/dir/key", test_tmpdir());
    CHECK_EQ(auth_key_write(path, &k), -ENOENT);
}

TEST(auth_hex_round_trip)
{
    uint8_t in[4] = {0x00, 0x7f, 0xa5, 0xff}, out[4];
    char hex[9];

    auth_hex(in, 4, hex);
    CHECK_STR(hex, "007fa5ff");
    CHECK_EQ(auth_unhex(hex, out, 4), 0);
    CHECK(!memcmp(in, out, 4));
    CHECK_EQ(auth_unhex("007FA5FF", out, 4), 0);
    CHECK(!memcmp(in, out, 4));
    CHECK_EQ(auth_unhex("007fa5f", out, 4), -EINVAL);
    CHECK_EQ(auth_unhex("007fa5ff0", out, 4), -EINVAL);
    CHECK_EQ(auth_unhex("007fa5fx", out, 4), -EINVAL);
}

/* A frame's tag is HMAC-SHA256 under the session's key of its seq and message, as OpenSSL's
 * own HMAC computes it; and a session keyed again from its keys (auth_session_key) seals
 * what the handshake's opens, the same bytes. */
TEST(auth_keyed_contexts_match_unkeyed)
{
    struct auth_key k = key_of(9);
    struct auth_session cs = {0}, ss = {0}, plain;
    uint8_t a[128], b[128], want[EVP_MAX_MD_SIZE];
    unsigned wlen = 0;
    size_t la, lb;
    int side;

    CHECK_EQ(handshake(&k, &k, &cs, &ss, &side), 0);
    la = seal(&cs, a, "{\"type\":\"hb\"}");
    CHECK(HMAC(EVP_sha256(), cs.tx_key, AUTH_KEY_LEN, a, la - AUTH_TAG_LEN, want, &wlen) != NULL);
    CHECK_EQ(wlen, AUTH_TAG_LEN);
    CHECK(!memcmp(a + la - AUTH_TAG_LEN, want, AUTH_TAG_LEN));
    plain = cs;
    memset(&plain.tx_mac, 0, sizeof(plain.tx_mac));
    memset(&plain.rx_mac, 0, sizeof(plain.rx_mac));
    auth_session_key(&plain);
    plain.tx_seq = 0;
    lb = seal(&plain, b, "{\"type\":\"hb\"}");
    /* The same seq (0) and message: the same frame. */
    CHECK_EQ(la, lb);
    CHECK(!memcmp(a, b, la));
    check_open(&ss, b, lb, "{\"type\":\"hb\"}");
    plain.tx_seq = 1;
    lb = seal(&plain, b, "{\"type\":\"ok\",\"id\":1}");
    check_open(&ss, b, lb, "{\"type\":\"ok\",\"id\":1}");
    auth_session_release(&cs);
    auth_session_release(&ss);
    /* Released: keys and states wiped. */
    for (size_t i = 0; i < sizeof(cs); i++)
        CHECK(((const uint8_t *)&cs)[i] == 0);
}

/* The nonces' and tokens' source fills every byte, small and large, with fresh bytes. */
TEST(auth_random_fills_fresh_bytes)
{
    static uint8_t a[100000], b[100000];
    size_t zeros = 0;

    CHECK_EQ(auth_random(a, 0), 0);
    CHECK_EQ(auth_random(a, sizeof(a)), 0);
    CHECK_EQ(auth_random(b, sizeof(b)), 0);
    CHECK(memcmp(a, b, sizeof(a)) != 0);
    for (size_t i = 0; i < sizeof(a); i++)
        zeros += a[i] == 0;
    /* About 391 of 100,000 uniform bytes are 0. */
    CHECK_INT(zeros, <, 1000);
    CHECK_EQ(auth_random(a, 32), 0);
    CHECK(memcmp(a, b, 32) != 0);
}

/* --- the one-frame hello ------------------------------------------------------------------ */

/* The hello opens a session both ways at once: the client seals its join before any answer,
 * the server's frame proves the server; the tag and the keys are HMACs under the job key with
 * labels of their own (computed here with OpenSSL's HMAC from the frame's bytes). */
TEST(auth_early_hello_opens_both_directions)
{
    struct auth_key k = key_of(21);
    struct auth_handshake chs, shs;
    struct auth_session cs = {0}, ss = {0};
    uint8_t hello[AUTH_EARLY_LEN], msg[12 + 2 * AUTH_NONCE_LEN] = {0}, want[EVP_MAX_MD_SIZE];
    uint8_t a[128];
    unsigned wlen = 0;
    size_t la;

    CHECK_EQ(auth_early_hello(&chs, &k, hello, &cs), 0);
    CHECK(auth_is_early_hello(hello, sizeof(hello)));
    CHECK(!memcmp(hello, "GRJ1", 4));
    memcpy(msg, "gpurun early", 12);
    memcpy(msg + 12, hello + 4, AUTH_NONCE_LEN);
    CHECK(HMAC(EVP_sha256(), k.k, AUTH_KEY_LEN, msg, sizeof(msg), want, &wlen) != NULL);
    CHECK(!memcmp(hello + 4 + AUTH_NONCE_LEN, want, AUTH_TAG_LEN));
    /* The join leaves before the server said anything. */
    la = seal(&cs, a, "{\"type\":\"join\"}");
    CHECK_EQ(auth_early_accept(&shs, &k, hello, sizeof(hello), &ss), 0);
    CHECK(!memcmp(shs.nonce_c, hello + 4, AUTH_NONCE_LEN));
    check_open(&ss, a, la, "{\"type\":\"join\"}");
    la = seal(&ss, a, "{\"type\":\"assign\"}");
    check_open(&cs, a, la, "{\"type\":\"assign\"}");
    /* The directions' keys differ: a frame of the client's does not open as the server's. */
    la = seal(&cs, a, "{\"type\":\"hb\"}");
    CHECK_EQ(auth_open(&cs, a, la, &(const uint8_t *){0}, &(size_t){0}), -EBADMSG);
    auth_session_release(&cs);
    auth_session_release(&ss);
}

/* A wrong key is refused at the hello; a hello of the wrong shape, or with the all-zero nonce
 * (the replay memory's empty slot), is malformed; a three-frame hello is not a one-frame one. */
TEST(auth_early_hello_refused_for_key_and_shape)
{
    struct auth_key k = key_of(21), other = key_of(22);
    struct auth_handshake chs, shs;
    struct auth_session cs = {0}, ss = {0};
    uint8_t hello[AUTH_EARLY_LEN], bad[AUTH_EARLY_LEN], hello3[AUTH_HELLO_LEN];

    CHECK_EQ(auth_early_hello(&chs, &k, hello, &cs), 0);
    CHECK_EQ(auth_early_accept(&shs, &other, hello, sizeof(hello), &ss), -EACCES);
    memcpy(bad, hello, sizeof(bad));
    bad[sizeof(bad) - 1] ^= 1;
    CHECK_EQ(auth_early_accept(&shs, &k, bad, sizeof(bad), &ss), -EACCES);
    CHECK_EQ(auth_early_accept(&shs, &k, hello, sizeof(hello) - 1, &ss), -EBADMSG);
    memcpy(bad, hello, sizeof(bad));
    memset(bad + 4, 0, AUTH_NONCE_LEN);
    CHECK_EQ(auth_early_accept(&shs, &k, bad, sizeof(bad), &ss), -EBADMSG);
    CHECK_EQ(auth_client_hello(&chs, &k, hello3), 0);
    CHECK(!auth_is_early_hello(hello3, sizeof(hello3)));
    CHECK_EQ(auth_early_accept(&shs, &k, hello3, sizeof(hello3), &ss), -EBADMSG);
    auth_session_release(&cs);
}

/* The replay memory: each nonce once, through the table's growth; a recorded hello's nonce is
 * refused however many came after it; and its bound. */
TEST(auth_seen_refuses_a_nonce_twice)
{
    enum { N = 5000 };
    struct auth_seen seen = {0};
    uint8_t nonce[AUTH_NONCE_LEN], first[AUTH_NONCE_LEN] = {0}, zero[AUTH_NONCE_LEN] = {0};

    for (int i = 0; i < N; i++) {
        CHECK_EQ(auth_random(nonce, sizeof(nonce)), 0);
        if (i == 0)
            memcpy(first, nonce, sizeof(first));
        CHECK_EQ(auth_seen_add(&seen, nonce), 0);
        CHECK_EQ(auth_seen_add(&seen, nonce), -EEXIST);
    }
    CHECK_EQ(seen.n, N);
    CHECK_EQ(auth_seen_add(&seen, first), -EEXIST);
    /* Nonces alike in their first 8 bytes (the hash) are still told apart. */
    memset(nonce, 7, sizeof(nonce));
    CHECK_EQ(auth_seen_add(&seen, nonce), 0);
    nonce[31] = 8;
    CHECK_EQ(auth_seen_add(&seen, nonce), 0);
    CHECK_EQ(auth_seen_add(&seen, nonce), -EEXIST);
    CHECK_EQ(auth_seen_add(&seen, zero), -EINVAL);
    auth_seen_release(&seen);
    CHECK(seen.slots == NULL && seen.n == 0);
    /* Bounded: past max a new nonce is refused, a seen one is still named a replay. */
    seen.max = 3;
    for (int i = 0; i < 3; i++) {
        memset(nonce, i + 1, sizeof(nonce));
        CHECK_EQ(auth_seen_add(&seen, nonce), 0);
    }
    memset(nonce, 9, sizeof(nonce));
    CHECK_EQ(auth_seen_add(&seen, nonce), -ENOSPC);
    memset(nonce, 2, sizeof(nonce));
    CHECK_EQ(auth_seen_add(&seen, nonce), -EEXIST);
    auth_seen_release(&seen);
    CHECK_EQ(seen.max, 3);
}
