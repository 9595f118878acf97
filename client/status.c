/* The status client: a blocking TCP link to the leader, one request and one reply. Each
 * socket call is bounded by SO_RCVTIMEO/SO_SNDTIMEO and the connect by poll(), so a leader
 * that hangs cannot hang gpurun. The printers are generic over the fields of the leader's
 * view, so a field added there shows up here without a change. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <uv.h>

#include "auth.h"
#include "frame.h"
#include "fsutil.h"
#include "proto.h"
#include "status.h"
#include "banned.h"

/* endpoint.json and summary.json are small; a larger file is not the leader's. */
#define JOB_FILE_MAX (4 * 1024 * 1024)

/* Frames the leader may send before the reply (heartbeats) that the client skips. */
#define SKIP_FRAMES_MAX 64

/* The status request's id: one request per link. */
#define STATUS_ID 1

/* Reads and parses DIR/NAME. Returns 0 with *root new, or a negative errno (-ENOENT for a
 * missing file, which the caller may expect) with err filled. */
static int load_json(const char *job_dir, const char *name, json_t **root, struct errmsg *err)
{
    char path[PATH_MAX];
    json_error_t je;
    char *text = NULL;
    size_t len;
    int ret;

    if (snprintf(path, sizeof(path), "%s/%s", job_dir, name) >= (int)sizeof(path))
        return errmsg_set(err, -ENAMETOOLONG, "job dir '%s': path too long", job_dir);
    ret = fs_read_all(path, JOB_FILE_MAX, &text, &len);
    if (ret < 0)
        return errmsg_set(err, ret, "cannot read '%s': %s", path, uv_strerror(ret));
    *root = json_loadb(text, len, 0, &je);
    free(text);
    if (!*root || !json_is_object(*root)) {
        json_decref(*root);
        *root = NULL;
        return errmsg_set(err, -EBADMSG, "'%s' is not a JSON object", path);
    }
    return 0;
}

static int connect_to(const char *host, int port, int timeout_ms, struct errmsg *err)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    char service[16];
    int fd = -1, ret, soerr = 0;
    socklen_t sl = sizeof(soerr);

    snprintf(service, sizeof(service), "%d", port);
    ret = getaddrinfo(host, service, &hints, &res);
    if (ret != 0)
        return errmsg_set(err, -EHOSTUNREACH, "cannot resolve '%s': %s", host, gai_strerror(ret));
    fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        ret = errmsg_set(err, -errno, "cannot create a socket: %s", uv_strerror(-errno));
        goto out;
    }
    if (connect(fd, res->ai_addr, res->ai_addrlen) < 0) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        if (errno != EINPROGRESS) {
            soerr = errno;
        } else {
            int n = poll(&pfd, 1, timeout_ms);
            if (n == 0)
                soerr = ETIMEDOUT;
            else if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
                soerr = errno;
        }
        if (soerr) {
            ret = errmsg_set(err, -soerr, "cannot connect to '%s:%d': %s", host, port,
                             uv_strerror(-soerr));
            goto out;
        }
    }
    if (fcntl(fd, F_SETFL, 0) < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0) {
        ret = errmsg_set(err, -errno, "cannot set up the socket to '%s:%d': %s", host, port,
                         uv_strerror(-errno));
        goto out;
    }
    ret = fd;
    fd = -1;
out:
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return ret;
}

static int send_frame(int fd, const uint8_t *payload, size_t len)
{
    uint8_t hdr[FRAME_HDR_LEN];
    struct iovec iov[2] = {{hdr, sizeof(hdr)}, {(void *)payload, len}};
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
    size_t left = sizeof(hdr) + len;

    frame_put_header(hdr, (uint32_t)len);
    while (left > 0) {
        ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno == EAGAIN ? -ETIMEDOUT : -errno;
        left -= (size_t)n;
        while (n > 0 && mh.msg_iovlen > 0) {
            if ((size_t)n >= mh.msg_iov[0].iov_len) {
                n -= (ssize_t)mh.msg_iov[0].iov_len;
                mh.msg_iov++;
                mh.msg_iovlen--;
            } else {
                mh.msg_iov[0].iov_base = (char *)mh.msg_iov[0].iov_base + n;
                mh.msg_iov[0].iov_len -= (size_t)n;
                n = 0;
            }
        }
    }
    return 0;
}

/* Receives the next frame into r; *payload is borrowed from r. */
static int recv_frame(int fd, struct frame_reader *r, const uint8_t **payload, size_t *len)
{
    uint8_t buf[4096];

    for (;;) {
        int got = frame_reader_next(r, payload, len);
        ssize_t n;

        if (got != 0)
            return got < 0 ? -EPROTO : 0;
        n = recv(fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno == EAGAIN ? -ETIMEDOUT : -errno;
        if (n == 0)
            return -ECONNRESET;
        if (frame_reader_feed(r, buf, (size_t)n) < 0)
            return -ENOMEM;
    }
}

static int send_sealed(int fd, struct auth_session *sess, json_t *msg)
{
    char *text = json_dumps(msg, JSON_COMPACT);
    uint8_t *buf = NULL;
    size_t n;
    int ret = -ENOMEM;

    if (!text)
        goto out;
    n = strlen(text);
    buf = malloc(n + AUTH_OVERHEAD);
    if (!buf)
        goto out;
    memcpy(buf + AUTH_SEQ_LEN, text, n);
    auth_seal(sess, buf, n);
    ret = send_frame(fd, buf, n + AUTH_OVERHEAD);
out:
    free(buf);
    free(text);
    return ret;
}

/* The handshake and the request; the link is fd, its peer named by where. */
static int query(int fd, const char *where, const struct auth_key *key, json_t **job,
                 struct errmsg *err)
{
    uint8_t hello[AUTH_HELLO_LEN], proof[AUTH_PROOF_LEN];
    struct auth_handshake hs;
    struct auth_session sess = {0};
    struct frame_reader r;
    const uint8_t *payload, *text;
    size_t len, n;
    json_t *req = NULL;
    struct msg m = {0};
    int ret;

    frame_reader_init(&r, FRAME_MAX_DEFAULT);
    ret = auth_client_hello(&hs, key, hello);
    if (ret == 0)
        ret = send_frame(fd, hello, sizeof(hello));
    if (ret == 0)
        ret = recv_frame(fd, &r, &payload, &len);
    if (ret < 0) {
        ret = errmsg_set(err, ret, "no handshake with the leader at '%s': %s", where,
                         uv_strerror(ret));
        goto out;
    }
    ret = auth_client_proof(&hs, payload, len, proof, &sess);
    if (ret == -EACCES) {
        ret = errmsg_set(err, ret, "the leader at '%s' does not hold this job's key", where);
        goto out;
    }
    if (ret == 0)
        ret = send_frame(fd, proof, sizeof(proof));
    if (ret < 0) {
        ret = errmsg_set(err, ret, "handshake with the leader at '%s' failed: %s", where,
                         uv_strerror(ret));
        goto out;
    }
    req = proto_pack("{s:s, s:I}", "type", "status", "id", (json_int_t)STATUS_ID);
    ret = req ? send_sealed(fd, &sess, req) : -ENOMEM;
    if (ret < 0) {
        ret =
            errmsg_set(err, ret, "cannot send to the leader at '%s': %s", where, uv_strerror(ret));
        goto out;
    }
    for (int skipped = 0;; skipped++) {
        struct proto_error perr;

        ret = recv_frame(fd, &r, &payload, &len);
        if (ret == -ECONNRESET)
            ret = errmsg_set(err, ret, "the leader at '%s' closed the link (wrong key?)", where);
        else if (ret < 0)
            ret = errmsg_set(err, ret, "no reply from the leader at '%s': %s", where,
                             uv_strerror(ret));
        else if (auth_open(&sess, payload, len, &text, &n) < 0)
            ret = errmsg_set(err, -EPROTO, "a reply from '%s' failed authentication", where);
        else if (proto_decode(text, n, &m, &perr) < 0)
            ret = errmsg_set(err, -EPROTO, "bad reply from '%s': %s", where, perr.why.text);
        if (ret < 0)
            goto out;
        if (m.type == MSG_HB && skipped < SKIP_FRAMES_MAX) {
            proto_msg_release(&m);
            continue;
        }
        break;
    }
    if (m.type == MSG_ERROR) {
        ret = errmsg_set(err, -EPROTO, "the leader at '%s' refused the query: %s: %s", where, m.key,
                         m.value);
        goto out;
    }
    if (m.type != MSG_STATUS_REPLY || m.id != STATUS_ID) {
        ret = errmsg_set(err, -EPROTO, "the leader at '%s' answered '%s', not a status_reply",
                         where, proto_type_name(m.type));
        goto out;
    }
    *job = json_incref(m.array);
    ret = 0;
out:
    proto_msg_release(&m);
    json_decref(req);
    frame_reader_release(&r);
    OPENSSL_cleanse(&hs, sizeof(hs));
    auth_session_release(&sess);
    return ret;
}

int status_query(const char *job_dir, int timeout_ms, json_t **job, struct errmsg *err)
{
    char key_path[PATH_MAX], where[300];
    struct auth_key key;
    json_t *ep = NULL;
    const char *host;
    int port, fd = -1, ret;

    ret = load_json(job_dir, "endpoint.json", &ep, err);
    if (ret < 0)
        goto out;
    host = json_string_value(json_object_get(ep, "host"));
    port = (int)json_integer_value(json_object_get(ep, "port"));
    if (!host || port <= 0 || port > 65535) {
        ret = errmsg_set(err, -EBADMSG, "'%s/endpoint.json' lacks a host and port", job_dir);
        goto out;
    }
    snprintf(where, sizeof(where), "%s:%d", host, port);
    if (snprintf(key_path, sizeof(key_path), "%s/key", job_dir) >= (int)sizeof(key_path)) {
        ret = errmsg_set(err, -ENAMETOOLONG, "job dir '%s': path too long", job_dir);
        goto out;
    }
    ret = auth_key_read(key_path, &key);
    if (ret < 0) {
        ret = errmsg_set(err, ret, "cannot read the job key '%s': %s", key_path, uv_strerror(ret));
        goto out;
    }
    fd = connect_to(host, port, timeout_ms, err);
    if (fd < 0) {
        ret = fd;
        goto out;
    }
    ret = query(fd, where, &key, job, err);
out:
    OPENSSL_cleanse(&key, sizeof(key));
    if (fd >= 0)
        close(fd);
    json_decref(ep);
    return ret;
}

int status_load_summary(const char *job_dir, json_t **summary, struct errmsg *err)
{
    return load_json(job_dir, "summary.json", summary, err);
}

bool status_alone(const char *job_dir, char *out, size_t n)
{
    json_t *summary = NULL;
    struct errmsg err;
    const char *alone;

    out[0] = '\0';
    if (status_load_summary(job_dir, &summary, &err) < 0)
        return false;
    alone = json_string_value(json_object_get(summary, "alone"));
    if (alone)
        snprintf(out, n, "%s", alone);
    json_decref(summary);
    return out[0] != '\0';
}
