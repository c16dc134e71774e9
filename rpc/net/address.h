/* SPDX-License-Identifier: MIT */
/*  address.h: IP addresses and tcp:// endpoints (private to rpc/): which
    literal is which family, which is loopback, which local address routes
    to a peer, and the endpoint text ZeroMQ wants ("tcp://[::1]:5" for
    IPv6). No sockets kept, no agent: the rendezvous and its fuzzer use
    them alike. Addresses are numeric literals without brackets ("10.0.0.1",
    "fd00::1") unless said otherwise. */
#ifndef ZDIST_RPC_ADDRESS_H
#define ZDIST_RPC_ADDRESS_H

#include <stdbool.h>
#include <stddef.h>

#define ZD_ADDR_MAX 64 /* room for any numeric IPv4 or IPv6 literal */

/*  AF_INET or AF_INET6 for a numeric literal ("[fd00::1]" with brackets is
    accepted as IPv6), 0 for anything else (a host name, garbage). */
int zd__addr_family(const char *ip);

/*  Copies ip to out without brackets, and an IPv4-mapped IPv6 address
    ("::ffff:10.0.0.2", how a dual-stack socket names an IPv4 peer) as the
    IPv4 one. 0, or -1 when ip is no numeric literal or does not fit. */
int zd__addr_normalize(const char *ip, char *out, size_t size);

/*  True for 127.0.0.0/8, ::1, ::ffff:127.x and the unspecified 0.0.0.0 and
    ::, which all mean "this host only". */
bool zd__addr_is_loopback(const char *ip);

/*  True when ip is an address of one of this host's interfaces (it can be
    bound), loopback included. */
bool zd__addr_is_local(const char *ip);

/*  The local address the kernel would send from to reach ip (a UDP
    "connect", which sends nothing); loopback for a loopback ip. 0, or -1
    naming ip ("no route to ..."). */
int zd__addr_route_from(const char *ip, char *out, size_t size);

/*  Resolves host (a literal, or a name through getaddrinfo: its IPv4
    addresses first, then IPv6) into up to max numeric addresses. The
    number found (>= 1), or -1 naming host. */
int zd__addr_resolve(const char *host, char out[][ZD_ADDR_MAX], int max);

/*  "tcp://ip:port" or "tcp://[ip]:port"; port may be "*". */
void zd__addr_endpoint(const char *ip, const char *port, char *buf, size_t size);

/*  Splits "tcp://host:port" (host an IPv4 literal or a bracketed IPv6 one,
    port 1..65535) into ip (no brackets) and port. 0, or -1 for anything
    else: another scheme, a host name, a wildcard, a port out of range. */
int zd__addr_parse_endpoint(const char *ep, char *ip, size_t size, int *port);

/*  Whether endpoints a and b ("tcp://HOST:PORT") have the same HOST, as
    text: a loop over the world's table looks at a run of ranks on one
    host once, not once a rank. False when either has no port. */
bool zd__addr_same_host(const char *a, const char *b);

#endif
