/* SPDX-License-Identifier: MIT */
/*  register.c: the registration client (register.h). A process at init and
    a member waiting for a restarted rank 0 speak the same protocol to rank
    0's rendezvous socket: register from a DEALER, say it again while
    unanswered, and read the answer (a table, an error, or "not yet").

    The socket never blocks a send: a connection that failed its handshake
    (no key, another key) is not made again, and a DEALER without one would
    hold a send for ever. Only the first send must go. A monitor tells
    whether the master was reached at all, for the timeout's message. */
#include "rpc/world/register.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <zmq.h>

#include <zdist/error.h>
#include "core/clock.h"
#include "core/log_private.h"
#include "rpc/net/address.h"

int zd__reg_master_endpoint(const char *addr, int port, char *ep, size_t size)
{
    char ip[1][ZD_ADDR_MAX], p[8];
    if (zd__addr_resolve(addr, ip, 1) < 0)
        return zd_error_wrap("rendezvous: master address");
    snprintf(p, sizeof p, "%d", port);
    zd__addr_endpoint(ip[0], p, ep, size);
    return 0;
}

/*  The socket, options set, not connected yet; NULL with the error set. */
static void *make_socket(const reg_client_t *c)
{
    void *sock = zmq_socket(c->ctx, ZMQ_DEALER);
    if (!sock) {
        zd_error_set("rendezvous: cannot create a socket");
        return NULL;
    }
    int zero = 0, one = 1;
    /* an int64_t option: an int is refused; the table's entries frame is
       the longest one */
    int64_t max = (int64_t)c->world * RDV_ENTRY_MAX;
    if (max < RDV_MAX_FRAME)
        max = RDV_MAX_FRAME;
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_SNDTIMEO, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_MAXMSGSIZE, &max, sizeof max);
    if (strncmp(c->endpoint, "tcp://[", 7) == 0)
        zmq_setsockopt(sock, ZMQ_IPV6, &one, sizeof one);
    return sock;
}

/*  A PAIR that hears sock's successful handshakes, or NULL (then nobody
    says whether the master was reached). */
static void *watch_handshakes(const reg_client_t *c, void *sock)
{
    static atomic_uint n_watch;
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://zd-register-%u", atomic_fetch_add(&n_watch, 1));
    if (zmq_socket_monitor(sock, ep, ZMQ_EVENT_HANDSHAKE_SUCCEEDED) < 0)
        return NULL;
    void *mon = zmq_socket(c->ctx, ZMQ_PAIR);
    if (mon && zmq_connect(mon, ep) < 0) {
        zmq_close(mon);
        mon = NULL;
    }
    return mon;
}

/*  How long the next poll may wait, in ms: until the deadline, the next
    send, and the next look at the stop flag. */
static int poll_ms(const reg_client_t *c, int64_t resend_at)
{
    int64_t now = zd__now_ns();
    int64_t wait = zd__ms_left(now, resend_at), left = zd__ms_left(now, c->deadline);
    if (left >= 0 && left < wait)
        wait = left;
    if (c->stop && wait > REG_STOP_POLL_MS)
        wait = REG_STOP_POLL_MS;
    return (int)wait;
}

static void timed_out(const reg_client_t *c, bool reached)
{
    const char *advice = c->curve ? " Every process needs the same world key file"
                                  : " If the world uses a key, this process needs it too";
    if (reached)
        zd_error_set("rendezvous: no answer from the master at %s in time (is rank 0 "
                     "running there, and are all %d workers started?%s)",
                     c->endpoint, c->world, advice);
    else
        zd_error_set("rendezvous: could not reach the master at %s in time (no "
                     "connection: is rank 0 running there and listening on that "
                     "address, and does a firewall let the port through?%s)",
                     c->endpoint, advice);
}

int zd__reg_run(const reg_client_t *c, rdv_entry_t *table, bool *running)
{
    void *sock = make_socket(c);
    if (!sock)
        return -1;
    void *mon = watch_handshakes(c, sock);
    bool reached = false, said = false, busy_said = false, refused_said = false;
    int64_t resend_at = 0; /* now */
    int rc = -1;
    if (c->secure && c->secure(c->arg, sock) < 0)
        goto out;
    if (zmq_connect(sock, c->endpoint) < 0) {
        zd_error_set("rendezvous: cannot connect to the master at %s: %s", c->endpoint,
                     zmq_strerror(errno));
        goto out;
    }
    for (;;) {
        if (c->stop && atomic_load(c->stop)) {
            zd_error_set_code(ZD_ERR_SHUTDOWN, "rendezvous: stopped");
            goto out;
        }
        int64_t now = zd__now_ns();
        if (said && now >= c->deadline) {
            /* Without a monitor, nobody knows: the milder text. */
            timed_out(c, reached || !mon);
            goto out;
        }
        if (now >= resend_at) {
            zmsg_t *reg = c->registration(c->arg);
            if (!reg || zmsg_send(&reg, sock) < 0) {
                zmsg_destroy(&reg);
                if (!said) {
                    zd_error_set("rendezvous: cannot send to the master at %s", c->endpoint);
                    goto out;
                }
            }
            said = true;
            resend_at = zd__deadline_after(now, REG_RESEND_MS);
        }
        zmq_pollitem_t items[2] = {{sock, 0, ZMQ_POLLIN, 0}, {mon, 0, ZMQ_POLLIN, 0}};
        int n = zmq_poll(items, mon ? 2 : 1, poll_ms(c, resend_at));
        if (n < 0 && errno != EINTR) {
            zd_error_set("rendezvous: cannot wait for the master at %s: %s", c->endpoint,
                         zmq_strerror(errno));
            goto out;
        }
        if (n <= 0)
            continue;
        if (mon && (items[1].revents & ZMQ_POLLIN)) {
            zmsg_t *ev = zmsg_recv(mon);
            zmsg_destroy(&ev);
            reached = true;
            continue;
        }
        zmsg_t *m = zmsg_recv(sock);
        if (!m)
            continue;
        char why[RDV_MAX_TEXT + 64];
        int r =
            zd__rdv_parse_answer(m, c->world, c->rank, c->name, table, running, why, sizeof why);
        zmsg_destroy(&m);
        if (r == 0) {
            rc = 0;
            break;
        }
        if (r == -2) {
            /* The process this one replaces is not gone yet at rank 0. */
            if (!busy_said)
                zd__log(ZD_LOG_INFO, "rpc: rendezvous: %s; asking again", why);
            busy_said = true;
            resend_at = zd__deadline_after(zd__now_ns(), REG_BUSY_RESEND_MS);
            zd_error_set("%s", why);
            continue;
        }
        if (!c->patient) {
            zd_error_set("%s", why);
            goto out;
        }
        if (!refused_said)
            zd__log(ZD_LOG_WARN, "rpc: waiting for rank 0: %s", why);
        refused_said = true;
    }
out:
    zmq_socket_monitor(sock, NULL, 0);
    if (mon)
        zmq_close(mon);
    zmq_close(sock);
    return rc;
}
