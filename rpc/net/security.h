/* SPDX-License-Identifier: MIT */
/*  security.h: who may talk to this process (private to rpc/).

    With a world key (a CURVE keypair in a file every process of the world
    reads, tools/keygen), every connection is ZeroMQ CURVE: authenticated
    and encrypted.
      * The rendezvous: rank 0's socket is a CURVE server with the world
        keypair, and joiners are CURVE clients with the world keypair too,
        so only holders of the world secret can register.
      * Each process makes an ephemeral keypair at init and registers its
        public key; the table gives every rank's (name, endpoint, key).
      * Every agent ROUTER is a CURVE server with its process's key; every
        DEALER is a CURVE client with that key too and pins the server key
        of the peer it connects to (mutual authentication, no man in the
        middle).
      * A ZAP handler in the agent's ZeroMQ context accepts only the table's
        keys and names the connection's rank (User-Id); io.c drops a message
        whose routing id claims another rank.
    Without a key, a world on loopback runs unauthenticated (said once at
    info level); any other world refuses to start unless it is marked
    insecure. docs/security.md tells the why. */
#ifndef ZDIST_RPC_SECURITY_H
#define ZDIST_RPC_SECURITY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <zmq.h>

#include "rpc/net/net.h"

/*  Decides how this process secures its connections: loads the world key
    (o->key_file, else $ZDIST_KEY_FILE, else the default file if it
    exists), or accepts running without one (insecure, or master and
    listen_ip both loopback), and makes the process's ephemeral keypair.
    Sets n->sec. 0, or -1 naming the file or the remedies. */
int zd__security_new(zd__net_t *n, const zd_rpc_options_t *o, const char *master,
                     const char *listen_ip);

/*  Once n->ctx exists: binds the ZAP handler and starts its thread. 0, or -1. */
int zd__security_start(zd__net_t *n);

/*  Stops the ZAP handler's thread and closes its sockets (before the
    context ends), then frees n->sec. Harmless when nothing was made. */
void zd__security_free(zd__net_t *n);

/*  Whether this world runs CURVE. */
bool zd__security_curve(const zd__net_t *n);

/*  This process's public key (Z85), "" without CURVE: what it registers. */
const char *zd__security_public_key(const zd__net_t *n);

/*  Socket options: the agent's ROUTER (a CURVE server), a DEALER to rank
    peer (a CURVE client pinning n->peers[peer].key), rank 0's rendezvous
    socket and a joiner's. Nothing without CURVE. 0, or -1. */
int zd__security_server(zd__net_t *n, void *sock);
int zd__security_client(zd__net_t *n, void *sock, int peer);
int zd__security_rendezvous_server(zd__net_t *n, void *sock);
int zd__security_rendezvous_client(zd__net_t *n, void *sock);

/*  Logs the handshakes sock refuses (no CURVE, wrong server key), as what
    ("the RPC socket", "the rendezvous"). */
void zd__security_watch(zd__net_t *n, void *sock, const char *what);

/*  A registered key: "" (no CURVE) or a Z85 key; true when it fits this
    world (a key under CURVE, none without). */
bool zd__security_key_ok(const zd__net_t *n, const char *key);

/*  A world without a key and not insecure: it runs on loopback only, so its
    rendezvous listens on loopback only and takes registrations only from
    there. */
bool zd__security_loopback_only(const zd__net_t *n);

/*  Why a registration (at init or a rejoin) from address peer, advertising
    endpoint, breaks this world's policy (a loopback-only world and either
    off loopback), or NULL when it does not. */
const char *zd__security_registration_refused(const zd__net_t *n, const char *peer,
                                              const char *endpoint);

/*  After the rendezvous (n->peers[*].key and endpoints set): hands the
    table's keys to the ZAP handler, which then answers the connections it
    held back; without a key, fails when an endpoint is not loopback (unless
    insecure). 0, or -1. */
int zd__security_table_ready(zd__net_t *n);

/*  Rank's key changed (a restarted process rejoined; n->peers[rank].key
    holds the new one): connections with the old key are refused from now
    on. 0, or -1 when the key is invalid or another rank's. */
int zd__security_renew_key(zd__net_t *n, int rank);

/*  Whether a message that arrived on the ROUTER with routing id of rank
    src really comes from rank src (its connection's User-Id); logs the
    mismatch (rate limited) otherwise. Always true without CURVE. */
bool zd__security_sender_ok(zd__net_t *n, zmq_msg_t *msg, int src);

/*  How many messages zd__security_sender_ok dropped (for tests). */
int64_t zd__security_spoofs_dropped(const zd__net_t *n);

/*  ---- keys on disk (tools/keygen, tools/launch, tests) ---- */

/*  The default key file: ${XDG_CONFIG_HOME:-$HOME/.config}/zdist/world.key.
    0, or -1 (no HOME). */
int zd__security_default_path(char *path, size_t size);

/*  Writes a new world key file at path (mode 0600, its folder made 0700
    if missing); refuses to replace an existing file unless force. 0, or -1. */
int zd__security_keygen(const char *path, bool force);

/*  Reads a world key file: refuses one readable by group or others, or
    without a valid secret key. 0 and the Z85 keys, or -1. */
int zd__security_key_load(const char *path, char pub[SECURITY_KEY_TXT], char sec[SECURITY_KEY_TXT]);

#endif
