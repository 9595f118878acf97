/* Tests of daemon/sockdiag: the kernel's answer on sockets this test makes on loopback, a
 * listener, both ends of a link and a port nothing holds, in IPv4 and IPv6. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../daemon/sockdiag.h"
#include "test.h"
#include "banned.h"

/* A TCP socket of family bound to loopback port 0; its port in *port. */
static int bound(int family, int *port)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);

    CHECK(fd >= 0);
    memset(&ss, 0, sizeof(ss));
    if (family == AF_INET) {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        len = sizeof(*a);
    } else {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_loopback;
        len = sizeof(*a);
    }
    CHECK_EQ(bind(fd, (struct sockaddr *)&ss, len), 0);
    len = sizeof(ss);
    CHECK_EQ(getsockname(fd, (struct sockaddr *)&ss, &len), 0);
    *port = ntohs(family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                    : ((struct sockaddr_in6 *)&ss)->sin6_port);
    return fd;
}

TEST(sockdiag_sees_a_listener_and_both_ends_of_a_link)
{
    int lport, cport, lfd = bound(AF_INET, &lport), cfd = bound(AF_INET, &cport), afd;
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)lport)};

    /* Bound alone (the leader's reservation of MASTER_PORT): not a socket on the port. */
    CHECK_EQ(sockdiag_port_seen(lport), 0);
    CHECK_EQ(listen(lfd, 4), 0);
    CHECK_EQ(sockdiag_port_seen(lport), 1);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(connect(cfd, (struct sockaddr *)&to, sizeof(to)), 0);
    afd = accept(lfd, NULL, NULL);
    CHECK(afd >= 0);
    /* The client's own port: its local port on one end, the remote port on the other. */
    CHECK_EQ(sockdiag_port_seen(cport), 1);
    close(afd);
    close(cfd);
    close(lfd);
}

TEST(sockdiag_sees_ipv6)
{
    int port, fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0)
        test_skip("no IPv6 here");
    close(fd);
    fd = bound(AF_INET6, &port);
    CHECK_EQ(listen(fd, 1), 0);
    CHECK_EQ(sockdiag_port_seen(port), 1);
    close(fd);
}

TEST(sockdiag_a_port_nothing_holds)
{
    int port, fd = bound(AF_INET, &port);

    /* Bound and closed without a connection: no socket is left on it (no TIME_WAIT). */
    close(fd);
    CHECK_EQ(sockdiag_port_seen(port), 0);
    CHECK_EQ(sockdiag_port_seen(0), -EINVAL);
    CHECK_EQ(sockdiag_port_seen(65536), -EINVAL);
}
