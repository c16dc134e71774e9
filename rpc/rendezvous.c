/* SPDX-License-Identifier: MIT */
/*  rendezvous.c: every process learns every other's name and endpoint.

    Rank 0 binds a ROUTER at master_addr:master_port. Every other process
    sends, from a DEALER:
        "ZDREG1" rank world_size name endpoint key
    and waits for either
        "ZDTAB1" world_size (name endpoint key) * world_size     ranks in order
        "ZDERR1" text
    Rank 0 answers all at once when the world is complete. On a conflict (a
    rank or a name twice, a rank outside the world, world sizes that differ)
    it sends the error to every process that registered, including the
    offender, and fails itself: every process involved fails with the same
    text. A process whose master never answers fails at its init timeout.
    Messages are czmq zmsg_t's of string frames. key is the process's
    CURVE public key in Z85, or empty in a world without a key; with a key
    both sockets are CURVE with the world keypair, so that only holders of
    the world key can register (security.h). */
#include "rpc/agent.h"

#include <arpa/inet.h>
#include <czmq.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include "rpc/security.h"

#define REG_TAG "ZDREG1"
#define TAB_TAG "ZDTAB1"
#define ERR_TAG "ZDERR1"

typedef struct {
    bool present;
    zframe_t *identity;     /* NULL for rank 0 itself */
    char name[ZD_RPC_MAX_NAME + 1];
    char endpoint[ZD_RPC_MAX_ENDPOINT + 1];
    char key[SECURITY_KEY_TXT];
} slot_t;

static int remaining_ms(int64_t deadline)
{
    if (deadline == INT64_MAX)
        return -1;
    int64_t left = (deadline - zd__agent_now_ns()) / 1000000;
    return left < 0 ? 0 : (int)(left > 1000000 ? 1000000 : left);
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    if (!s || !*s)
        return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static void send_to(void *sock, zframe_t *identity, zmsg_t *body)
{
    zmsg_t *m = zmsg_dup(body);
    if (!m)
        return;
    zmsg_pushmem(m, zframe_data(identity), zframe_size(identity));
    zmsg_send(&m, sock);
}

static void broadcast_error(void *sock, slot_t *slots, int world, zframe_t *offender,
                            const char *text)
{
    zmsg_t *body = zmsg_new();
    zmsg_addstr(body, ERR_TAG);
    zmsg_addstr(body, text);
    for (int i = 0; i < world; i++)
        if (slots[i].present && slots[i].identity)
            send_to(sock, slots[i].identity, body);
    if (offender)
        send_to(sock, offender, body);
    zmsg_destroy(&body);
}

/* Checks one registration; 0 and the rank, or -1 with the text of the
   conflict (fatal to the whole rendezvous). A malformed message is just
   dropped (*rank = -1, returns 0). */
static int check_registration(agent_t *a, slot_t *slots, zmsg_t *m, zframe_t *id, int *rank)
{
    *rank = -1;
    if (zmsg_size(m) != 6) {
        zd__log(ZD_LOG_WARN, "rpc: rendezvous: dropped a malformed registration (%zu frames)",
                zmsg_size(m));
        return 0;
    }
    char *tag = zmsg_popstr(m), *rs = zmsg_popstr(m), *ws = zmsg_popstr(m);
    char *name = zmsg_popstr(m), *ep = zmsg_popstr(m), *key = zmsg_popstr(m);
    long r, w;
    int rc = 0;
    if (!tag || strcmp(tag, REG_TAG) != 0 || parse_int(rs, 0, RPC_WIRE_MAX_RANK, &r) < 0 ||
        parse_int(ws, 1, RPC_WIRE_MAX_RANK + 1, &w) < 0 ||
        !zd__rpc_wire_name_ok(name, ZD_RPC_MAX_NAME) ||
        !zd__rpc_wire_name_ok(ep, ZD_RPC_MAX_ENDPOINT)) {
        zd__log(ZD_LOG_WARN, "rpc: rendezvous: dropped a malformed registration");
        goto done;
    }
    if (!zd__security_key_ok(a, key)) {
        zd__log(ZD_LOG_WARN, "rpc: rendezvous: dropped the registration of \"%s\" (rank %ld): "
                "%s", name, r, zd__security_curve(a) ? "no valid public key"
                                                     : "it has a key and this world has none");
        goto done;
    }
    if (w != a->world) {
        rc = zd_error_set("rendezvous: world size mismatch: \"%s\" (rank %ld) says %ld, "
                       "rank 0 (\"%s\") says %d", name, r, w, a->name, a->world);
        goto done;
    }
    if (r >= a->world) {
        rc = zd_error_set("rendezvous: \"%s\" has rank %ld, outside the world of size %d",
                       name, r, a->world);
        goto done;
    }
    slot_t *s = &slots[r];
    bool same_sender = s->present && s->identity && zframe_eq(s->identity, id);
    if (s->present && !same_sender) {
        rc = zd_error_set("rendezvous: rank %ld claimed twice, by \"%s\" (%s) and by \"%s\" (%s)",
                       r, s->name, s->endpoint, name, ep);
        goto done;
    }
    for (int i = 0; i < a->world; i++)
        if (i != r && slots[i].present && strcmp(slots[i].name, name) == 0) {
            rc = zd_error_set("rendezvous: name \"%s\" used twice, by ranks %d and %ld", name, i,
                           r);
            goto done;
        }
    if (!same_sender) {
        s->present = true;
        s->identity = zframe_dup(id);
        snprintf(s->name, sizeof s->name, "%s", name);
        snprintf(s->endpoint, sizeof s->endpoint, "%s", ep);
        snprintf(s->key, sizeof s->key, "%s", key);
    }
    *rank = (int)r;
done:
    free(key);
    free(tag);
    free(rs);
    free(ws);
    free(name);
    free(ep);
    return rc;
}

static void missing_ranks(slot_t *slots, int world, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < world && n + 16 < size; i++)
        if (!slots[i].present)
            n += (size_t)snprintf(buf + n, size - n, "%s%d", n ? ", " : "", i);
}

static int host_rendezvous(agent_t *a, const char *addr, int port, int64_t deadline)
{
    slot_t *slots = calloc((size_t)a->world, sizeof *slots);
    void *sock = zmq_socket(a->ctx, ZMQ_ROUTER);
    if (!slots || !sock) {
        free(slots);
        if (sock)
            zmq_close(sock);
        return zd_error_set("rendezvous: cannot create the master socket");
    }
    int linger = 2000;   /* lets the table reach everyone after we return */
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    if (zd__security_start(a) < 0 || zd__security_rendezvous_server(a, sock) < 0) {
        free(slots);
        zmq_close(sock);
        return -1;
    }
    char ep[300];
    struct in_addr ignored;
    bool numeric = inet_pton(AF_INET, addr, &ignored) == 1;
    snprintf(ep, sizeof ep, "tcp://%s:%d", numeric ? addr : "*", port);
    int rc = -1;
    zd__security_watch(a, sock, "the rendezvous");   /* before the first connection */
    if (zmq_bind(sock, ep) < 0) {
        zd_error_set("rendezvous: rank 0 cannot listen at %s: %s", ep, zmq_strerror(errno));
        goto out;
    }
    slots[0].present = true;
    snprintf(slots[0].name, sizeof slots[0].name, "%s", a->name);
    snprintf(slots[0].endpoint, sizeof slots[0].endpoint, "%s", a->peers[0].endpoint);
    snprintf(slots[0].key, sizeof slots[0].key, "%s", zd__security_public_key(a));
    int count = 1;
    while (count < a->world) {
        zmq_pollitem_t item = {sock, 0, ZMQ_POLLIN, 0};
        int n = zmq_poll(&item, 1, remaining_ms(deadline));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            char miss[256];
            missing_ranks(slots, a->world, miss, sizeof miss);
            zd_error_set("rendezvous: timed out with %d of %d workers registered (missing "
                      "ranks %s)", count, a->world, miss);
            broadcast_error(sock, slots, a->world, NULL, zd_error_last());
            goto out;
        }
        zmsg_t *m = zmsg_recv(sock);
        if (!m)
            continue;
        zframe_t *id = zmsg_pop(m);
        int r = -1;
        bool conflict = id && check_registration(a, slots, m, id, &r) < 0;
        if (conflict)
            broadcast_error(sock, slots, a->world, id, zd_error_last());
        zframe_destroy(&id);
        zmsg_destroy(&m);
        if (conflict)
            goto out;
        if (r >= 0) {
            count = 0;
            for (int i = 0; i < a->world; i++)
                count += slots[i].present;
        }
    }
    zmsg_t *table = zmsg_new();
    zmsg_addstr(table, TAB_TAG);
    zmsg_addstrf(table, "%d", a->world);
    for (int i = 0; i < a->world; i++) {
        zmsg_addstr(table, slots[i].name);
        zmsg_addstr(table, slots[i].endpoint);
        zmsg_addstr(table, slots[i].key);
        snprintf(a->peers[i].key, sizeof a->peers[i].key, "%s", slots[i].key);
        snprintf(a->peers[i].name, sizeof a->peers[i].name, "%s", slots[i].name);
        snprintf(a->peers[i].endpoint, sizeof a->peers[i].endpoint, "%s", slots[i].endpoint);
    }
    for (int i = 1; i < a->world; i++)
        send_to(sock, slots[i].identity, table);
    zmsg_destroy(&table);
    rc = 0;
out:
    for (int i = 0; i < a->world; i++)
        zframe_destroy(&slots[i].identity);
    free(slots);
    zmq_close(sock);
    return rc;
}

static int read_table(agent_t *a, zmsg_t *m)
{
    char *tag = zmsg_popstr(m);
    if (tag && strcmp(tag, ERR_TAG) == 0) {
        free(tag);
        char *text = zmsg_popstr(m);
        zd_error_set("%s", text ? text : "rendezvous: the master reported an error");
        free(text);
        return -1;
    }
    char *ws = zmsg_popstr(m);
    long w;
    int rc = 0;
    if (!tag || strcmp(tag, TAB_TAG) != 0 || parse_int(ws, 1, RPC_WIRE_MAX_RANK + 1, &w) < 0 ||
        w != a->world || zmsg_size(m) != (size_t)(3 * w)) {
        rc = zd_error_set("rendezvous: malformed answer from the master");
        goto out;
    }
    for (int i = 0; i < a->world && rc == 0; i++) {
        char *name = zmsg_popstr(m), *ep = zmsg_popstr(m), *key = zmsg_popstr(m);
        if (!zd__rpc_wire_name_ok(name, ZD_RPC_MAX_NAME) ||
            !zd__rpc_wire_name_ok(ep, ZD_RPC_MAX_ENDPOINT) || strncmp(ep, "tcp://", 6) != 0 ||
            !zd__security_key_ok(a, key))
            rc = zd_error_set("rendezvous: malformed entry for rank %d from the master", i);
        else {
            snprintf(a->peers[i].name, sizeof a->peers[i].name, "%s", name);
            snprintf(a->peers[i].endpoint, sizeof a->peers[i].endpoint, "%s", ep);
            snprintf(a->peers[i].key, sizeof a->peers[i].key, "%s", key);
        }
        free(key);
        free(name);
        free(ep);
    }
    if (rc == 0 && strcmp(a->peers[a->rank].name, a->name) != 0)
        rc = zd_error_set("rendezvous: the master's table gives rank %d to \"%s\"", a->rank,
                       a->peers[a->rank].name);
out:
    free(tag);
    free(ws);
    return rc;
}

static int join_rendezvous(agent_t *a, const char *addr, int port, int64_t deadline)
{
    void *sock = zmq_socket(a->ctx, ZMQ_DEALER);
    if (!sock)
        return zd_error_set("rendezvous: cannot create a socket");
    int linger = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    char ep[300];
    snprintf(ep, sizeof ep, "tcp://%s:%d", addr, port);
    int rc = -1;
    if (zd__security_rendezvous_client(a, sock) < 0)
        goto out;
    if (zmq_connect(sock, ep) < 0) {
        zd_error_set("rendezvous: cannot connect to the master at %s: %s", ep,
                  zmq_strerror(errno));
        goto out;
    }
    zmsg_t *reg = zmsg_new();
    zmsg_addstr(reg, REG_TAG);
    zmsg_addstrf(reg, "%d", a->rank);
    zmsg_addstrf(reg, "%d", a->world);
    zmsg_addstr(reg, a->name);
    zmsg_addstr(reg, a->peers[a->rank].endpoint);
    zmsg_addstr(reg, zd__security_public_key(a));
    if (zmsg_send(&reg, sock) < 0) {
        zmsg_destroy(&reg);
        zd_error_set("rendezvous: cannot send to the master at %s", ep);
        goto out;
    }
    for (;;) {
        zmq_pollitem_t item = {sock, 0, ZMQ_POLLIN, 0};
        int n = zmq_poll(&item, 1, remaining_ms(deadline));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            zd_error_set("rendezvous: no answer from the master at %s in time (is rank 0 "
                      "running there, and are all %d workers started?%s)", ep, a->world,
                      zd__security_curve(a)
                          ? " Every process needs the same world key file"
                          : " If the world uses a key, this process needs it too");
            goto out;
        }
        zmsg_t *m = zmsg_recv(sock);
        if (!m)
            continue;
        rc = read_table(a, m);
        zmsg_destroy(&m);
        break;
    }
out:
    zmq_close(sock);
    return rc;
}

int zd__rendezvous_run(agent_t *a, const char *addr, int port, int64_t timeout_ms)
{
    int64_t deadline = timeout_ms ? zd__agent_now_ns() + timeout_ms * 1000000 : INT64_MAX;
    snprintf(a->peers[a->rank].key, sizeof a->peers[a->rank].key, "%s",
             zd__security_public_key(a));
    int rc = a->rank == 0 ? host_rendezvous(a, addr, port, deadline)
                          : join_rendezvous(a, addr, port, deadline);
    /* The keys of the table are who may connect from now on. */
    return rc < 0 ? rc : zd__security_table_ready(a);
}
