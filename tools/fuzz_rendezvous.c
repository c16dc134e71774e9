/* SPDX-License-Identifier: MIT */
/*  fuzz_rendezvous.c: libFuzzer target for the rendezvous messages
    (rpc/world/rendezvous.h): the registration rank 0 reads from whoever
    connects to its rendezvous port, and the answer (table or error) a
    joiner reads from rank 0, with the endpoint and address parsing under
    both (rpc/net/address.h).

    Input:
        byte 0      bit 0: an answer (else a registration); bits 1-3: the
                    world size of the joiner minus 1 (1-8); bits 4-6: its
                    rank (modulo the world size)
        frames      per frame: u8 length, then that many bytes (fewer when
                    the input runs out); at most 32 frames

    The joiner's name is "w<rank>".

    Checks, beyond "no crash, no sanitizer report": an accepted
    registration has a rank and a world size in the wire's bounds, a
    printable name, a tcp:// endpoint with a numeric address and a port
    and a key that is empty or a whole Z85 key;
    an accepted table has one such entry per rank, no name twice, and the
    joiner's own name at its rank; a refusal always says why, in printable
    text that fits. Every frame read as an endpoint that parses prints back
    (zd__addr_endpoint) to an endpoint that parses to the same address and
    port; an address that normalizes normalizes to itself again.

    Build and run with tools/fuzz.sh 60 fuzz_rendezvous. */
#include <arpa/inet.h>
#include <czmq.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "rpc/net/address.h"
#include "rpc/world/rendezvous.h"
#include "rpc/net/wire.h"

#define FUZZ_NAME "fuzz_rendezvous"
#include "tools/fuzz_check.h"

#define MAX_FRAMES 32

static void check_text(const char *why, size_t size)
{
    size_t n = strnlen(why, size);
    CHECK(n > 0 && n < size, "a refusal without a reason");
    for (size_t i = 0; i < n; i++)
        CHECK(why[i] >= 32 && why[i] < 127, "unprintable byte %d in \"%s\"", why[i], why);
}

static void check_key_ok(const char *key)
{
    size_t n = strlen(key);
    CHECK(n == 0 || n == RDV_KEY_LEN, "key of %zu characters accepted", n);
}

static void check_endpoint_ok(const char *ep)
{
    char ip[ZD_ADDR_MAX];
    int port;
    CHECK(zd__addr_parse_endpoint(ep, ip, sizeof ip, &port) == 0, "bad endpoint \"%s\" accepted",
          ep);
}

/*  The address helpers on one frame's text. */
static void fuzz_address(const uint8_t *d, size_t n)
{
    char s[300], ip[ZD_ADDR_MAX], again[ZD_ADDR_MAX], ep[ZD_RPC_MAX_ENDPOINT + 1];
    if (n >= sizeof s || memchr(d, 0, n))
        return;
    memcpy(s, d, n);
    s[n] = '\0';
    int port, port2;
    if (zd__addr_parse_endpoint(s, ip, sizeof ip, &port) == 0) {
        CHECK(port >= 1 && port <= 65535, "port %d from \"%s\"", port, s);
        char p[8];
        snprintf(p, sizeof p, "%d", port);
        zd__addr_endpoint(ip, p, ep, sizeof ep);
        CHECK(zd__addr_parse_endpoint(ep, again, sizeof again, &port2) == 0,
              "\"%s\" (from \"%s\") does not parse", ep, s);
        CHECK(!strcmp(ip, again) && port == port2, "\"%s\" -> %s %d -> %s %d", s, ip, port, again,
              port2);
        CHECK(zd__addr_same_host(s, s), "\"%s\" is not on its own host", s);
    }
    /* A text without "tcp://" or without a port is no endpoint's host. */
    if (strncmp(s, "tcp://", 6) != 0)
        CHECK(!zd__addr_same_host(s, s), "\"%s\" has a host", s);
    if (zd__addr_normalize(s, ip, sizeof ip) == 0) {
        CHECK(zd__addr_family(ip) != 0, "normalized \"%s\" to \"%s\", no address", s, ip);
        /* An IPv4 result is the text as given, not printed again: it must
           be what inet_ntop prints for it. */
        struct in_addr a4;
        char ref[INET_ADDRSTRLEN];
        if (inet_pton(AF_INET, ip, &a4) == 1)
            CHECK(inet_ntop(AF_INET, &a4, ref, sizeof ref) && !strcmp(ref, ip),
                  "\"%s\" normalizes to \"%s\", inet_ntop prints \"%s\"", s, ip, ref);
        CHECK(zd__addr_normalize(ip, again, sizeof again) == 0 && !strcmp(ip, again),
              "\"%s\" normalizes to \"%s\", then to \"%s\"", s, ip, again);
        (void)zd__addr_is_loopback(ip);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    bool answer = data[0] & 1;
    int world = ((data[0] >> 1) & 7) + 1, rank = ((data[0] >> 4) & 7) % world;
    size_t at = 1;
    zmsg_t *m = zmsg_new();
    CHECK(m, "zmsg_new");
    for (int f = 0; f < MAX_FRAMES && at < size; f++) {
        size_t n = data[at++];
        if (n > size - at)
            n = size - at;
        zmsg_addmem(m, data + at, n);
        fuzz_address(data + at, n);
        at += n;
    }
    char why[RDV_MAX_TEXT + 64];
    if (!answer) {
        rdv_entry_t r;
        char lost_list[RDV_MAX_TEXT];
        if (zd__rdv_parse_registration(m, &r, lost_list, why, sizeof why) == 0) {
            CHECK(r.rank >= 0 && r.rank <= RPC_WIRE_MAX_RANK, "rank %d", r.rank);
            CHECK(r.world >= 1 && r.world <= RPC_WIRE_MAX_RANK + 1, "world %d", r.world);
            CHECK(zd__rpc_wire_name_ok(r.name, ZD_RPC_MAX_NAME), "name \"%s\"", r.name);
            check_endpoint_ok(r.endpoint);
            check_key_ok(r.key);
            if (r.running) {
                bool lost[RPC_WIRE_MAX_RANK + 1] = {0};
                CHECK(zd__rdv_parse_ranks(lost_list, r.world, lost) == 0, "lost list \"%s\"",
                      lost_list);
            }
        } else {
            check_text(why, sizeof why);
        }
    } else {
        rdv_entry_t table[8];
        char name[16];
        snprintf(name, sizeof name, "w%d", rank);
        memset(table, 0, sizeof table);
        bool running;
        if (zd__rdv_parse_answer(m, world, rank, name, table, &running, why, sizeof why) == 0) {
            CHECK(!table[rank].lost, "rank %d is told it is lost", rank);
            for (int i = 0; i < world; i++) {
                CHECK(zd__rpc_wire_name_ok(table[i].name, ZD_RPC_MAX_NAME), "name of %d", i);
                check_endpoint_ok(table[i].endpoint);
                check_key_ok(table[i].key);
                for (int k = 0; k < i; k++)
                    CHECK(strcmp(table[k].name, table[i].name) != 0, "name \"%s\" twice",
                          table[i].name);
            }
            CHECK(!strcmp(table[rank].name, name), "rank %d is \"%s\"", rank, table[rank].name);
        } else {
            check_text(why, sizeof why);
        }
    }
    zmsg_destroy(&m);
    return 0;
}
