/* Whether this network namespace has a TCP socket on a port, asked of the kernel's socket
 * diagnostics (NETLINK_SOCK_DIAG, what ss(8) uses) with the port as a filter the kernel runs:
 * only matching sockets come back. Reading /proc/net/tcp instead costs the whole table: on a
 * node holding tens of thousands of sockets (a leader's agents, TIME_WAIT after a large
 * rendezvous) a read took 200 ms, at each rank's exit. */
#ifndef GPURUN_SOCKDIAG_H
#define GPURUN_SOCKDIAG_H

/* 1 when an IPv4 or IPv6 TCP socket has port as its local or remote port, 0 when none has (a
 * socket listening, connected, half-open or in TIME_WAIT counts: what /proc/net/tcp lists;
 * one bound to the port alone does not), or a negative errno when the kernel could not be
 * asked (no sock_diag, a kernel older than 4.17 without its port equality test): the caller
 * reads /proc then. */
int sockdiag_port_seen(int port);

#endif
