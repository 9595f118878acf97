/* The port question of sockdiag.h over NETLINK_SOCK_DIAG. */
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>

#include "sockdiag.h"
#include "banned.h"

/* The filter, in the kernel's bytecode as ss(8) compiles "sport = P or dport = P"
 * (inet_diag_bc_op: a jump of `yes` bytes where the test holds, of `no` bytes where not;
 * ending exactly at the end accepts, past it rejects; every op lies on the chain of `yes`
 * jumps from the first, which the kernel checks): a local port test, whose success reaches an
 * unconditional jump to the end and whose failure skips it to the remote port test. Each
 * port test is followed by an op whose `no` holds P. */
struct port_filter {
    struct inet_diag_bc_op sport, sport_val, jump, dport, dport_val;
};

struct diag_request {
    struct nlmsghdr nlh;
    struct inet_diag_req_v2 req;
    struct nlattr attr;
    struct port_filter bc;
};

/* 1, 0 or a negative errno for one family's TCP sockets. */
static int family_seen(int fd, int family, int port, uint32_t seq)
{
    struct diag_request rq;
    struct sockaddr_nl to = {.nl_family = AF_NETLINK};
    union {
        struct nlmsghdr h;
        char bytes[16384];
    } buf;
    const uint16_t len = sizeof(struct port_filter);

    memset(&rq, 0, sizeof(rq));
    rq.nlh.nlmsg_len = sizeof(rq);
    rq.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    rq.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    rq.nlh.nlmsg_seq = seq;
    rq.req.sdiag_family = (uint8_t)family;
    rq.req.sdiag_protocol = IPPROTO_TCP;
    /* The states /proc/net/tcp lists (ESTABLISHED to CLOSING, and requests): not CLOSE nor
     * the kernel's bound-only sockets, which it dumps since Linux 6.5 (a port held without a
     * connection, as the leader holds MASTER_PORT's reservation, is no meeting). */
    rq.req.idiag_states = ((1u << 13) - 2) & ~(1u << 7);
    rq.attr.nla_len = (uint16_t)(sizeof(rq.attr) + len);
    rq.attr.nla_type = INET_DIAG_REQ_BYTECODE;
    /* In ops of 4 bytes: sport at 0 (its value at 4), the jump at 8, dport at 12 (16), end 20. */
    rq.bc.sport = (struct inet_diag_bc_op){INET_DIAG_BC_S_EQ, 8, 12};
    rq.bc.sport_val = (struct inet_diag_bc_op){0, 0, (uint16_t)port};
    rq.bc.jump = (struct inet_diag_bc_op){INET_DIAG_BC_JMP, 4, 12};
    rq.bc.dport = (struct inet_diag_bc_op){INET_DIAG_BC_D_EQ, 8, 12};
    rq.bc.dport_val = (struct inet_diag_bc_op){0, 0, (uint16_t)port};
    _Static_assert(sizeof(struct port_filter) == 20, "the jumps above count 20 bytes");
    if (sendto(fd, &rq, sizeof(rq), 0, (struct sockaddr *)&to, sizeof(to)) < 0)
        return -errno;
    for (;;) {
        ssize_t n = recv(fd, &buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        for (struct nlmsghdr *h = &buf.h; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_seq != seq)
                continue;
            if (h->nlmsg_type == NLMSG_DONE)
                return 0;
            if (h->nlmsg_type == NLMSG_ERROR) {
                const struct nlmsgerr *e = NLMSG_DATA(h);
                return e->error < 0 ? e->error : -EPROTO;
            }
            if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY)
                return 1;
        }
        if (n == 0)
            return -EPROTO;
    }
}

int sockdiag_port_seen(int port)
{
    int fd, ret;

    if (port <= 0 || port > 65535)
        return -EINVAL;
    fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd < 0)
        return -errno;
    ret = family_seen(fd, AF_INET, port, 1);
    if (ret == 0)
        ret = family_seen(fd, AF_INET6, port, 2);
    close(fd);
    return ret;
}
