/* Tests of daemon/memlink over loopback: a node's copy reaches its holder whole and a spare
 * fetches it from there; a transfer cut halfway, a frame that fails its tag and a copy over
 * the holder's cap all leave the holder's older copy; a link without the job's key is
 * refused; a flood of saves is sent as the newest copies, not as a queue of each. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "../daemon/memckpt.h"
#include "../daemon/memlink.h"
#include "auth.h"
#include "frame.h"
#include "proto.h"
#include "test.h"
#include "banned.h"

static struct auth_key key_of(uint8_t fill)
{
    struct auth_key k;

    memset(k.k, fill, sizeof(k.k));
    return k;
}

static struct memckpt *store(const char *name, uint64_t cap)
{
    char dir[4096];
    struct memckpt *m;

    snprintf(dir, sizeof(dir), "%s/%s", test_tmpdir(), name);
    CHECK_EQ(memckpt_open(dir, cap, &m), 0);
    return m;
}

/* Saves n bytes (byte i is seed + i * 7) as rank's copy of name at step, as a rank does. */
static void save(struct memckpt *m, int rank, const char *name, int64_t step, size_t n,
                 uint8_t seed)
{
    char path[4200];
    struct errmsg err;
    uint8_t buf[65536];
    int fd;

    CHECK_EQ(memckpt_tmp_path(m, rank, name, path, sizeof(path)), 0);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    CHECK(fd >= 0);
    for (size_t done = 0; done < n;) {
        size_t k = n - done < sizeof(buf) ? n - done : sizeof(buf);
        for (size_t i = 0; i < k; i++)
            buf[i] = (uint8_t)(seed + (done + i) * 7);
        CHECK_EQ(write(fd, buf, k), (ssize_t)k);
        done += k;
    }
    close(fd);
    CHECK_EQ(memckpt_keep(m, rank, name, step, &err), 0);
}

/* Whether m's copy of rank's name is the one save() made of n bytes from seed at step. */
static bool holds(struct memckpt *m, int rank, const char *name, int64_t step, size_t n,
                  uint8_t seed)
{
    int64_t s;
    uint64_t size;
    uint8_t buf[65536];
    int fd = memckpt_open_copy(m, rank, name, &s, &size);
    bool same = fd >= 0 && s == step && size == n;

    for (size_t done = 0; same && done < n;) {
        ssize_t r = read(fd, buf, sizeof(buf));
        if (r <= 0)
            same = false;
        for (ssize_t i = 0; same && i < r; i++)
            same = buf[i] == (uint8_t)(seed + (done + (size_t)i) * 7);
        done += r > 0 ? (size_t)r : 0;
    }
    if (fd >= 0)
        close(fd);
    return same;
}

/* The next event of l, waiting up to 10 s for it. */
static struct memlink_event next_event(struct memlink *l)
{
    struct memlink_event e = {.kind = MEMLINK_REFUSED, .ret = -ETIMEDOUT};

    for (int i = 0; i < 2000; i++) {
        if (memlink_take(l, &e, 1) == 1)
            return e;
        usleep(5000);
    }
    snprintf(e.why, sizeof(e.why), "no event in 10 s");
    return e;
}

static struct memlink *start(struct memckpt *m, const struct auth_key *k)
{
    struct memlink *l;

    CHECK_EQ(memlink_start(m, k, "127.0.0.1", NULL, NULL, &l), 0);
    CHECK(memlink_port(l) > 0);
    return l;
}

TEST(memlink_replicates_to_the_holder_and_a_spare_fetches_from_it)
{
    struct auth_key k = key_of(7);
    struct memckpt *node = store("node", 64 << 20), *holder = store("holder", 64 << 20),
                   *spare = store("spare", 64 << 20);
    struct memlink *ln = start(node, &k), *lh = start(holder, &k), *ls = start(spare, &k);
    struct memlink_event e;
    uint64_t sent, received;
    /* Three chunks and a piece: the chunks must come in order and whole. */
    size_t n = 3 * MEMLINK_CHUNK + 12345;

    CHECK(memlink_set_holder(ln, "127.0.0.1", memlink_port(lh)));
    CHECK(!memlink_set_holder(ln, "127.0.0.1", memlink_port(lh)));
    save(node, 2, "state", 40, n, 3);
    memlink_push(ln, 2, "state");
    e = next_event(ln);
    CHECK_STR(e.why, "");
    CHECK_EQ(e.kind, MEMLINK_SENT);
    CHECK_EQ(e.ret, 0);
    CHECK_EQ(e.step, 40);
    CHECK_EQ(e.size, n);
    CHECK(holds(holder, 2, "state", 40, n, 3));
    e = next_event(lh);
    CHECK_EQ(e.kind, MEMLINK_RECEIVED);
    CHECK_EQ(e.rank, 2);
    memlink_bytes(ln, &sent, &received);
    CHECK_EQ(sent, n);
    /* A newer save replaces the holder's copy. */
    save(node, 2, "state", 50, 1000, 9);
    memlink_push(ln, 2, "state");
    e = next_event(ln);
    CHECK_EQ(e.kind, MEMLINK_SENT);
    CHECK(holds(holder, 2, "state", 50, 1000, 9));
    /* A spare in the lost node's place fetches from the same holder. */
    memlink_set_holder(ls, "127.0.0.1", memlink_port(lh));
    memlink_fetch(ls, 2, "state", 77);
    e = next_event(ls);
    CHECK_STR(e.why, "");
    CHECK_EQ(e.kind, MEMLINK_FETCHED);
    CHECK_EQ(e.ret, 0);
    CHECK_EQ(e.cookie, 77);
    CHECK_EQ(e.step, 50);
    CHECK(holds(spare, 2, "state", 50, 1000, 9));
    memlink_bytes(ls, &sent, &received);
    CHECK_EQ(received, 1000);
    /* What the holder has not: said, on the same link. */
    memlink_fetch(ls, 3, "state", 78);
    e = next_event(ls);
    CHECK_EQ(e.kind, MEMLINK_FETCHED);
    CHECK_EQ(e.ret, -ENOENT);
    CHECK_EQ(e.cookie, 78);
    /* Without a holder: at once. */
    memlink_set_holder(ls, NULL, 0);
    memlink_fetch(ls, 2, "state", 79);
    e = next_event(ls);
    CHECK_EQ(e.ret, -ENOENT);
    CHECK(strstr(e.why, "no node keeps"));
    memlink_stop(ln);
    memlink_stop(lh);
    memlink_stop(ls);
    memckpt_close(node);
    memckpt_close(holder);
    memckpt_close(spare);
}

TEST(memlink_refuses_a_link_without_the_job_key)
{
    struct auth_key k = key_of(7), other = key_of(8);
    struct memckpt *node = store("node", 1 << 20), *holder = store("holder", 1 << 20);
    struct memlink *ln = start(node, &other), *lh = start(holder, &k);
    struct memlink_event e;

    memlink_set_holder(ln, "127.0.0.1", memlink_port(lh));
    save(node, 0, "state", 1, 100, 1);
    memlink_push(ln, 0, "state");
    e = next_event(ln);
    CHECK_EQ(e.kind, MEMLINK_SEND_FAILED);
    CHECK(strstr(e.why, "did not authenticate"));
    CHECK(!holds(holder, 0, "state", 1, 100, 1));
    memlink_stop(ln);
    memlink_stop(lh);
    memckpt_close(node);
    memckpt_close(holder);
}

TEST(memlink_keeps_the_older_copy_when_the_new_one_does_not_fit)
{
    struct auth_key k = key_of(7);
    struct memckpt *node = store("node", 1 << 20), *holder = store("holder", 1000);
    struct memlink *ln = start(node, &k), *lh = start(holder, &k);
    struct memlink_event e;

    memlink_set_holder(ln, "127.0.0.1", memlink_port(lh));
    save(node, 1, "state", 5, 600, 1);
    memlink_push(ln, 1, "state");
    CHECK_EQ(next_event(ln).kind, MEMLINK_SENT);
    save(node, 1, "state", 6, 2000, 2);
    memlink_push(ln, 1, "state");
    e = next_event(ln);
    CHECK_EQ(e.kind, MEMLINK_SEND_FAILED);
    CHECK_EQ(e.ret, -ENOSPC);
    CHECK(strstr(e.why, "does not fit"));
    CHECK(holds(holder, 1, "state", 5, 600, 1));
    /* The link is still in step: the next copy that fits goes. */
    save(node, 1, "state", 7, 700, 3);
    memlink_push(ln, 1, "state");
    CHECK_EQ(next_event(ln).kind, MEMLINK_SENT);
    CHECK(holds(holder, 1, "state", 7, 700, 3));
    memlink_stop(ln);
    memlink_stop(lh);
    memckpt_close(node);
    memckpt_close(holder);
}

/* A client of the link by hand: connects and authenticates with k; returns the socket. */
static int raw_connect(int port, const struct auth_key *k, struct auth_session *s)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct auth_handshake hs;
    uint8_t hello[AUTH_HELLO_LEN], proof[AUTH_PROOF_LEN], hdr[FRAME_HDR_LEN], chal[AUTH_CHAL_LEN];
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    CHECK_EQ(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    CHECK_EQ(auth_client_hello(&hs, k, hello), 0);
    frame_put_header(hdr, sizeof(hello));
    CHECK_EQ(write(fd, hdr, sizeof(hdr)), (ssize_t)sizeof(hdr));
    CHECK_EQ(write(fd, hello, sizeof(hello)), (ssize_t)sizeof(hello));
    CHECK_EQ(recv(fd, hdr, sizeof(hdr), MSG_WAITALL), (ssize_t)sizeof(hdr));
    CHECK_EQ(recv(fd, chal, sizeof(chal), MSG_WAITALL), (ssize_t)sizeof(chal));
    CHECK_EQ(auth_client_proof(&hs, chal, sizeof(chal), proof, s), 0);
    frame_put_header(hdr, sizeof(proof));
    CHECK_EQ(write(fd, hdr, sizeof(hdr)), (ssize_t)sizeof(hdr));
    CHECK_EQ(write(fd, proof, sizeof(proof)), (ssize_t)sizeof(proof));
    return fd;
}

/* Sends n bytes sealed (a message's text or a chunk); with bad, one bit of the tag flipped. */
static void raw_send(int fd, struct auth_session *s, const void *data, size_t n, bool bad)
{
    static uint8_t buf[FRAME_HDR_LEN + AUTH_OVERHEAD + 65536];

    CHECK(n <= 65536);
    frame_put_header(buf, (uint32_t)(n + AUTH_OVERHEAD));
    memcpy(buf + FRAME_HDR_LEN + AUTH_SEQ_LEN, data, n);
    auth_seal(s, buf + FRAME_HDR_LEN, n);
    if (bad)
        buf[FRAME_HDR_LEN + AUTH_SEQ_LEN + n] ^= 1;
    CHECK_EQ(write(fd, buf, FRAME_HDR_LEN + n + AUTH_OVERHEAD),
             (ssize_t)(FRAME_HDR_LEN + n + AUTH_OVERHEAD));
}

/* Reads one sealed message and says whether it is an ok. */
static bool raw_ok(int fd, struct auth_session *s)
{
    uint8_t buf[4096];
    const uint8_t *msg;
    size_t n;
    uint32_t len;

    if (recv(fd, buf, FRAME_HDR_LEN, MSG_WAITALL) != FRAME_HDR_LEN)
        return false;
    len = (uint32_t)buf[0] << 24 | (uint32_t)buf[1] << 16 | (uint32_t)buf[2] << 8 | buf[3];
    if (len > sizeof(buf) || recv(fd, buf, len, MSG_WAITALL) != (ssize_t)len ||
        auth_open(s, buf, len, &msg, &n) < 0)
        return false;
    return n >= 11 && !memcmp(msg, "{\"type\":\"ok", 11);
}

/* A transfer that announces size bytes, sends 1000 of them (the last frame's tag broken
 * with bad) and closes. */
static void cut_transfer(int port, const struct auth_key *k, bool bad)
{
    struct auth_session s;
    char head[200];
    uint8_t chunk[1000];
    int fd = raw_connect(port, k, &s);
    int n = snprintf(head, sizeof(head),
                     "{\"type\":\"mem_put\",\"id\":1,\"rank\":1,\"name\":\"state\",\"step\":9,"
                     "\"size\":%d}",
                     bad ? 1000 : 5000);

    raw_send(fd, &s, head, (size_t)n, false);
    CHECK(raw_ok(fd, &s));
    memset(chunk, 'x', sizeof(chunk));
    raw_send(fd, &s, chunk, sizeof(chunk), bad);
    close(fd);
    auth_session_release(&s);
}

TEST(memlink_keeps_the_older_copy_when_a_transfer_is_cut)
{
    struct auth_key k = key_of(7);
    struct memckpt *node = store("node", 1 << 20), *holder = store("holder", 1 << 20);
    struct memlink *ln = start(node, &k), *lh = start(holder, &k);
    struct memlink_event e;
    char path[4200];

    memlink_set_holder(ln, "127.0.0.1", memlink_port(lh));
    save(node, 1, "state", 5, 3000, 1);
    memlink_push(ln, 1, "state");
    CHECK_EQ(next_event(ln).kind, MEMLINK_SENT);
    CHECK_EQ(next_event(lh).kind, MEMLINK_RECEIVED);
    /* 1000 of 5000 bytes, then the link closes. */
    cut_transfer(memlink_port(lh), &k, false);
    e = next_event(lh);
    CHECK_EQ(e.kind, MEMLINK_REFUSED);
    CHECK(strstr(e.why, "cut at byte 1000 of 5000"));
    CHECK(holds(holder, 1, "state", 5, 3000, 1));
    /* Every byte, but its frame fails its tag. */
    cut_transfer(memlink_port(lh), &k, true);
    e = next_event(lh);
    CHECK_EQ(e.kind, MEMLINK_REFUSED);
    CHECK(strstr(e.why, "failed its tag"));
    CHECK(holds(holder, 1, "state", 5, 3000, 1));
    /* Nothing of either is left beside the copy. */
    CHECK_EQ(memckpt_in_path(holder, 1, "state", path, sizeof(path)), 0);
    CHECK(access(path, F_OK) < 0);
    CHECK_EQ(memckpt_kept(holder), 3000);
    memlink_stop(ln);
    memlink_stop(lh);
    memckpt_close(node);
    memckpt_close(holder);
}

TEST(memlink_sends_a_flood_of_saves_as_the_newest_copies)
{
    struct auth_key k = key_of(7);
    struct memckpt *node = store("node", 64 << 20), *holder = store("holder", 64 << 20);
    struct memlink *ln = start(node, &k), *lh = start(holder, &k);
    struct memlink_event e;
    int sent = 0;

    memlink_set_holder(ln, "127.0.0.1", memlink_port(lh));
    /* 200 saves of 4 ranks, each pushed as it is kept: the queue holds one push of each
     * copy, and each push sends the copy as it is when its turn comes, so that the holder
     * ends with the newest of each, whatever the number of sends. */
    for (int step = 1; step <= 50; step++)
        for (int r = 0; r < 4; r++) {
            save(node, r, "state", step, 256 << 10, (uint8_t)(step + r));
            memlink_push(ln, r, "state");
        }
    for (;;) {
        e = next_event(ln);
        CHECK_EQ(e.kind, MEMLINK_SENT);
        sent++;
        bool all = true;
        for (int r = 0; r < 4; r++)
            all = all && holds(holder, r, "state", 50, 256 << 10, (uint8_t)(50 + r));
        if (all)
            break;
    }
    CHECK(sent >= 1 && sent <= 200);
    printf("# 200 saves of 4 ranks: %d sends\n", sent);
    memlink_stop(ln);
    memlink_stop(lh);
    memckpt_close(node);
    memckpt_close(holder);
}
