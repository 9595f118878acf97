/* Tests of daemon/peer's judging of silence: a peer is judged only on the time its owner was
 * running. The owner's stalls are excused, never more than the silence or the age has lasted
 * (a frame read after the stall leaves nothing to excuse), and a frame read ends the excuse
 * of the silence: pure arithmetic on the peer's clock fields, no loop, no socket. And an
 * accepted link's socket options. */
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../daemon/peer.h"
#include "test.h"
#include "banned.h"

/* A peer opened at opened_ms whose last frame was read at rx_ms. */
static void peer_at(struct peer *p, int64_t opened_ms, int64_t rx_ms)
{
    memset(p, 0, sizeof(*p));
    p->opened_ms = opened_ms;
    p->last_rx_ms = rx_ms;
}

TEST(peer_silence_without_stall_is_the_time_since_the_last_frame)
{
    struct peer p;

    peer_at(&p, 1000, 5000);
    CHECK_EQ(peer_silence_ms(&p, 15001), 10001);
    CHECK_EQ(peer_age_ms(&p, 15001), 14001);
}

TEST(peer_owner_stall_is_excused)
{
    struct peer p;

    /* The last heartbeat 900 ms before the owner's loop stopped for 12 s. */
    peer_at(&p, 1000, 5000);
    peer_excuse(&p, 12000, 5000 + 900 + 12000 + 50);
    CHECK_EQ(peer_silence_ms(&p, 5000 + 900 + 12000 + 50), 950);
    CHECK_EQ(peer_age_ms(&p, 5000 + 900 + 12000 + 50), 4950);
    /* Then the peer stays silent over the owner's own time: judged on that. */
    CHECK_EQ(peer_silence_ms(&p, 5000 + 900 + 12000 + 50 + 9050), 10000);
}

TEST(peer_excuse_never_exceeds_the_silence)
{
    struct peer p;

    /* The owner was stopped inside its poll: on waking it read the peer's frames first
     * (rx 20 ms ago), then its tick found the stall. Nothing is left to excuse. */
    peer_at(&p, 0, 30000);
    peer_excuse(&p, 12000, 30020);
    CHECK_EQ(peer_silence_ms(&p, 30020), 0);
    CHECK_EQ(peer_silence_ms(&p, 40021), 10001);
    /* Stalls add up, to the silence at most. */
    peer_at(&p, 0, 1000);
    peer_excuse(&p, 300, 2000);
    peer_excuse(&p, 400, 3000);
    CHECK_EQ(peer_silence_ms(&p, 3000), 1300);
    peer_excuse(&p, 5000, 4000);
    CHECK_EQ(peer_silence_ms(&p, 4000), 0);
}

TEST(peer_frame_read_ends_the_excuse_of_silence_not_of_age)
{
    struct peer p;

    peer_at(&p, 0, 1000);
    peer_excuse(&p, 3000, 5000);
    CHECK_EQ(peer_silence_ms(&p, 5000), 1000);
    /* What on_read does with a frame. */
    p.last_rx_ms = 5100;
    p.rx_excused_ms = 0;
    CHECK_EQ(peer_silence_ms(&p, 6100), 1000);
    CHECK_EQ(peer_age_ms(&p, 6100), 3100);
}

/* --- an accepted link --------------------------------------------------------------------- */

struct accept_case {
    uv_tcp_t server;
    struct peer p;
    bool accepted, closed;
    int nodelay;
};

static void on_case_closed(struct peer *p, const char *why)
{
    struct accept_case *c = p->owner;

    (void)why;
    peer_release(p);
    c->closed = true;
}

static const struct peer_ops case_ops = {.on_closed = on_case_closed};

static void on_case_connection(uv_stream_t *server, int status)
{
    struct accept_case *c = server->data;
    uv_os_fd_t fd;
    socklen_t len = sizeof(c->nodelay);

    CHECK_EQ(status, 0);
    CHECK_EQ(peer_init(&c->p, server->loop, PEER_TCP_SERVER, NULL, 4096, &case_ops, c), 0);
    CHECK_EQ(peer_accept(&c->p, server), 0);
    CHECK_EQ(uv_fileno(&c->p.h.handle, &fd), 0);
    CHECK_EQ(getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &c->nodelay, &len), 0);
    c->accepted = true;
    peer_close(&c->p, "done");
}

/* A link accepted by a server with TCP_NODELAY has it too, without a setsockopt of its own
 * (peer_accept): its small frames never wait for Nagle's algorithm. */
TEST(peer_accepted_link_has_the_listeners_nodelay)
{
    struct accept_case c = {0};
    struct sockaddr_in sa;
    int len = sizeof(sa), fd;
    uv_loop_t loop;

    CHECK_EQ(uv_loop_init(&loop), 0);
    CHECK_EQ(uv_tcp_init(&loop, &c.server), 0);
    c.server.data = &c;
    CHECK_EQ(uv_ip4_addr("127.0.0.1", 0, &sa), 0);
    CHECK_EQ(uv_tcp_bind(&c.server, (struct sockaddr *)&sa, 0), 0);
    CHECK_EQ(uv_tcp_nodelay(&c.server, 1), 0);
    CHECK_EQ(uv_listen((uv_stream_t *)&c.server, 1, on_case_connection), 0);
    CHECK_EQ(uv_tcp_getsockname(&c.server, (struct sockaddr *)&sa, &len), 0);
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(fd >= 0);
    CHECK_EQ(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    while (!c.closed)
        uv_run(&loop, UV_RUN_ONCE);
    CHECK(c.accepted);
    CHECK_EQ(c.nodelay, 1);
    close(fd);
    uv_close((uv_handle_t *)&c.server, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK_EQ(uv_loop_close(&loop), 0);
}
