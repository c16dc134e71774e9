/* SPDX-License-Identifier: MIT */
/*  address.c: IP literals and tcp:// endpoints (address.h). */
#include "rpc/net/address.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <zdist/error.h>

/*  ip without its brackets into buf; false when it does not fit or the
    brackets do not pair. */
static bool strip_brackets(const char *ip, char *buf, size_t size)
{
    size_t n = strlen(ip);
    if (n >= 2 && ip[0] == '[' && ip[n - 1] == ']') {
        ip++;
        n -= 2;
    } else if (strchr(ip, '[') || strchr(ip, ']')) {
        return false;
    }
    if (n + 1 > size)
        return false;
    memcpy(buf, ip, n);
    buf[n] = '\0';
    return true;
}

/*  The address as a sockaddr (port 0); its length, or 0 for no literal. */
static socklen_t to_sockaddr(const char *ip, struct sockaddr_storage *ss)
{
    char bare[ZD_ADDR_MAX];
    memset(ss, 0, sizeof *ss);
    if (!ip || !strip_brackets(ip, bare, sizeof bare))
        return 0;
    struct sockaddr_in *v4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, bare, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        return sizeof *v4;
    }
    /* No zone ids ("fe80::1%eth0"): inet_pton refuses them, and an
       advertised endpoint would not carry one across hosts anyway. */
    if (inet_pton(AF_INET6, bare, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        return sizeof *v6;
    }
    return 0;
}

int zd__addr_family(const char *ip)
{
    struct sockaddr_storage ss;
    return to_sockaddr(ip, &ss) ? ss.ss_family : 0;
}

/*  The address of ss in its usual text into out (IPv4 for a v4-mapped
    IPv6 one); bare is what ss was read from, without brackets. 0, or -1
    when it does not fit. Every rank reads the whole world's table, so
    the common case stays off inet_ntop's printf: inet_pton takes IPv4
    only in its usual text (no leading zeros), which is bare itself. */
static int normal_text(const struct sockaddr_storage *ss, const char *bare, char *out, size_t size)
{
    char buf[INET6_ADDRSTRLEN];
    const char *text = bare;
    if (ss->ss_family == AF_INET6) {
        const struct in6_addr *a6 = &((const struct sockaddr_in6 *)ss)->sin6_addr;
        bool mapped = IN6_IS_ADDR_V4MAPPED(a6);
        if (!inet_ntop(mapped ? AF_INET : AF_INET6, mapped ? (const void *)&a6->s6_addr[12] : a6,
                       buf, sizeof buf))
            return -1;
        text = buf;
    }
    size_t n = strlen(text);
    if (n + 1 > size)
        return -1;
    memcpy(out, text, n + 1);
    return 0;
}

int zd__addr_normalize(const char *ip, char *out, size_t size)
{
    struct sockaddr_storage ss;
    char bare[ZD_ADDR_MAX];
    if (!to_sockaddr(ip, &ss) || !strip_brackets(ip, bare, sizeof bare))
        return -1;
    return normal_text(&ss, bare, out, size);
}

bool zd__addr_is_loopback(const char *ip)
{
    char n[ZD_ADDR_MAX];
    struct sockaddr_storage ss;
    if (zd__addr_normalize(ip, n, sizeof n) < 0 || !to_sockaddr(n, &ss))
        return false;
    if (ss.ss_family == AF_INET) {
        uint32_t a = ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr);
        return (a >> 24) == 127 || a == INADDR_ANY;
    }
    const struct in6_addr *a6 = &((struct sockaddr_in6 *)&ss)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(a6) || IN6_IS_ADDR_UNSPECIFIED(a6);
}

bool zd__addr_is_local(const char *ip)
{
    struct sockaddr_storage ss;
    char n[ZD_ADDR_MAX];
    socklen_t len;
    if (zd__addr_normalize(ip, n, sizeof n) < 0 || !(len = to_sockaddr(n, &ss)))
        return false;
    int fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    bool local = bind(fd, (struct sockaddr *)&ss, len) == 0;
    close(fd);
    return local;
}

int zd__addr_route_from(const char *ip, char *out, size_t size)
{
    char n[ZD_ADDR_MAX];
    struct sockaddr_storage to, me;
    socklen_t len;
    if (zd__addr_normalize(ip, n, sizeof n) < 0 || !(len = to_sockaddr(n, &to)))
        return zd_error_set_code(ZD_ERR_ARGUMENT, "\"%s\" is not an IP address", ip);
    if (zd__addr_is_loopback(n)) {
        snprintf(out, size, "%s", to.ss_family == AF_INET6 ? "::1" : "127.0.0.1");
        return 0;
    }
    /* Any port will do: a UDP connect only asks the routing table. */
    if (to.ss_family == AF_INET)
        ((struct sockaddr_in *)&to)->sin_port = htons(9);
    else
        ((struct sockaddr_in6 *)&to)->sin6_port = htons(9);
    int fd = socket(to.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    socklen_t mlen = sizeof me;
    if (fd < 0 || connect(fd, (struct sockaddr *)&to, len) < 0 ||
        getsockname(fd, (struct sockaddr *)&me, &mlen) < 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return zd_error_set_code(ZD_ERR_ARGUMENT, "no route to %s: %s", n, strerror(e));
    }
    close(fd);
    char buf[INET6_ADDRSTRLEN];
    const void *a = me.ss_family == AF_INET
        ? (const void *)&((struct sockaddr_in *)&me)->sin_addr
        : (const void *)&((struct sockaddr_in6 *)&me)->sin6_addr;
    if (!inet_ntop(me.ss_family, a, buf, sizeof buf) || strlen(buf) + 1 > size)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "no route to %s", n);
    memcpy(out, buf, strlen(buf) + 1);
    return 0;
}

int zd__addr_resolve(const char *host, char out[][ZD_ADDR_MAX], int max)
{
    if (zd__addr_family(host)) {
        if (max < 1 || zd__addr_normalize(host, out[0], ZD_ADDR_MAX) < 0)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "bad address \"%s\"", host);
        return 1;
    }
    int n = 0, last = 0;
    /* IPv4 first: what the address picks when a name has both, as the
       code before IPv6 did and as users of "localhost" expect. */
    static const int families[2] = {AF_INET, AF_INET6};
    for (int f = 0; f < 2; f++) {
        struct addrinfo hints = {.ai_family = families[f], .ai_socktype = SOCK_STREAM}, *res;
        int rc = getaddrinfo(host, NULL, &hints, &res);
        if (rc != 0) {
            last = rc;
            continue;
        }
        for (struct addrinfo *r = res; r && n < max; r = r->ai_next) {
            const void *a = r->ai_family == AF_INET
                ? (const void *)&((struct sockaddr_in *)r->ai_addr)->sin_addr
                : (const void *)&((struct sockaddr_in6 *)r->ai_addr)->sin6_addr;
            char buf[INET6_ADDRSTRLEN];
            if (!inet_ntop(r->ai_family, a, buf, sizeof buf))
                continue;
            bool seen = false;
            for (int k = 0; k < n; k++)
                seen = seen || !strcmp(out[k], buf);
            if (!seen)
                snprintf(out[n++], ZD_ADDR_MAX, "%s", buf);
        }
        freeaddrinfo(res);
    }
    if (n == 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "cannot resolve \"%s\": %s", host,
                                 last ? gai_strerror(last) : "no address");
    return n;
}

void zd__addr_endpoint(const char *ip, const char *port, char *buf, size_t size)
{
    bool v6 = strchr(ip, ':') != NULL && ip[0] != '[';
    snprintf(buf, size, v6 ? "tcp://[%s]:%s" : "tcp://%s:%s", ip, port);
}

int zd__addr_parse_endpoint(const char *ep, char *ip, size_t size, int *port)
{
    if (!ep || strncmp(ep, "tcp://", 6) != 0)
        return -1;
    const char *host = ep + 6, *colon = strrchr(host, ':');
    if (!colon || colon == host)
        return -1;
    size_t hlen = (size_t)(colon - host);
    char h[ZD_ADDR_MAX + 2];
    if (hlen >= sizeof h)
        return -1;
    memcpy(h, host, hlen);
    h[hlen] = '\0';
    /* IPv6 only in brackets: "tcp://::1:5" is ambiguous. */
    struct sockaddr_storage ss;
    if (!to_sockaddr(h, &ss) || (ss.ss_family == AF_INET6) != (h[0] == '['))
        return -1;
    const char *p = colon + 1;
    long v = 0;
    if (!*p || strlen(p) > 5)
        return -1;
    for (; *p; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        v = v * 10 + (*p - '0');
    }
    char bare[ZD_ADDR_MAX];
    if (v < 1 || v > 65535 || !strip_brackets(h, bare, sizeof bare) ||
        normal_text(&ss, bare, ip, size) < 0)
        return -1;
    /* A wildcard cannot be connected to from elsewhere. */
    if (!strcmp(ip, "0.0.0.0") || !strcmp(ip, "::"))
        return -1;
    *port = (int)v;
    return 0;
}

/*  The colon before ep's port: the last one, past "tcp://" and past a
    bracketed address's ']'; NULL when there is none. */
static const char *port_colon(const char *ep)
{
    if (strncmp(ep, "tcp://", 6) != 0)
        return NULL;
    const char *c = strrchr(ep + 6, ':'), *close = strrchr(ep + 6, ']');
    return c && (!close || c > close) ? c : NULL;
}

bool zd__addr_same_host(const char *a, const char *b)
{
    const char *ca = port_colon(a), *cb = port_colon(b);
    return ca && cb && ca - a == cb - b && !memcmp(a, b, (size_t)(ca - a));
}
