/* SPDX-License-Identifier: MIT */
/*  rendezvous_msg.c: reading the rendezvous messages (rendezvous.h). Every
    frame is copied into a bounded buffer before it is looked at: nothing a
    peer sends is trusted to be terminated, short or printable. */
#include "rpc/rendezvous.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rpc/address.h"
#include "rpc/wire.h"

/* The frame as a string in buf; false when it does not fit or holds a NUL. */
static bool frame_text(zframe_t *f, char *buf, size_t size)
{
    if (!f)
        return false;
    size_t n = zframe_size(f);
    if (n >= size || (n && memchr(zframe_data(f), 0, n)))
        return false;
    if (n)
        memcpy(buf, zframe_data(f), n);
    buf[n] = '\0';
    return true;
}

static bool parse_int(const char *s, long lo, long hi, int *out)
{
    if (!*s || strlen(s) > 9)
        return false;
    long v = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9')
            return false;
        v = v * 10 + (*p - '0');
    }
    /* One spelling per number: "007" would let two frames name one rank. */
    if ((s[0] == '0' && s[1]) || v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

static int say(char *why, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int say(char *why, size_t size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, size, fmt, ap);
    va_end(ap);
    return -1;
}

/* Z85's alphabet (ZeroMQ's RFC 32). */
static bool key_syntax_ok(const char *k)
{
    static const char z85[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                              ".-:+=^!/*?&<>()[]{}@%$#";
    size_t n = strlen(k);
    return n == 0 || (n == RDV_KEY_LEN && strspn(k, z85) == n);
}

/* A name, an endpoint and a key from the next three frames of m. */
static int read_entry(zmsg_t *m, rdv_entry_t *e, char *why, size_t size)
{
    char ip[ZD_ADDR_MAX];
    int port;
    if (!frame_text(zmsg_next(m), e->name, sizeof e->name) ||
        !zd__rpc_wire_name_ok(e->name, ZD_RPC_MAX_NAME))
        return say(why, size, "a bad name (1 to %d printable characters)", ZD_RPC_MAX_NAME);
    if (!frame_text(zmsg_next(m), e->endpoint, sizeof e->endpoint) ||
        zd__addr_parse_endpoint(e->endpoint, ip, sizeof ip, &port) < 0)
        return say(why, size, "a bad endpoint for \"%s\" (not tcp://IP:PORT)", e->name);
    if (!frame_text(zmsg_next(m), e->key, sizeof e->key) || !key_syntax_ok(e->key))
        return say(why, size, "a bad key for \"%s\" (not empty nor %d Z85 characters)", e->name,
                   RDV_KEY_LEN);
    return 0;
}

int zd__rdv_parse_registration(zmsg_t *m, rdv_entry_t *out, char *why, size_t size)
{
    char tag[8], num[16];
    memset(out, 0, sizeof *out);
    if (zmsg_size(m) != 6)
        return say(why, size, "%zu frames instead of 6", zmsg_size(m));
    if (!frame_text(zmsg_first(m), tag, sizeof tag) || strcmp(tag, RDV_REG_TAG) != 0)
        return say(why, size, "not a registration");
    if (!frame_text(zmsg_next(m), num, sizeof num) ||
        !parse_int(num, 0, RPC_WIRE_MAX_RANK, &out->rank))
        return say(why, size, "a bad rank");
    if (!frame_text(zmsg_next(m), num, sizeof num) ||
        !parse_int(num, 1, RPC_WIRE_MAX_RANK + 1, &out->world))
        return say(why, size, "a bad world size");
    return read_entry(m, out, why, size);
}

static int by_name(const void *x, const void *y)
{
    return strcmp((*(const rdv_entry_t *const *)x)->name, (*(const rdv_entry_t *const *)y)->name);
}

int zd__rdv_parse_answer(zmsg_t *m, int world, int rank, const char *name, rdv_entry_t *out,
                         char *why, size_t size)
{
    char tag[8], num[16];
    if (!frame_text(zmsg_first(m), tag, sizeof tag))
        return say(why, size, "rendezvous: malformed answer from the master");
    if (!strcmp(tag, RDV_ERR_TAG)) {
        zframe_t *f = zmsg_next(m);
        if (zmsg_size(m) != 2 || !f || zframe_size(f) == 0)
            return say(why, size, "rendezvous: the master reported an error");
        size_t n = zframe_size(f) < RDV_MAX_TEXT ? zframe_size(f) : RDV_MAX_TEXT;
        n = n < size ? n : size - 1;
        const unsigned char *d = zframe_data(f);
        for (size_t i = 0; i < n; i++)
            why[i] = d[i] >= 32 && d[i] < 127 ? (char)d[i] : '?';
        why[n] = '\0';
        return -1;
    }
    if (strcmp(tag, RDV_TAB_TAG) != 0 || zmsg_size(m) != 2 + 3 * (size_t)world)
        return say(why, size, "rendezvous: malformed answer from the master");
    int w;
    if (!frame_text(zmsg_next(m), num, sizeof num) ||
        !parse_int(num, 1, RPC_WIRE_MAX_RANK + 1, &w) || w != world)
        return say(why, size, "rendezvous: the master's table is not for a world of %d", world);
    for (int i = 0; i < world; i++) {
        char what[160];
        out[i].rank = i;
        out[i].world = world;
        if (read_entry(m, &out[i], what, sizeof what) < 0)
            return say(why, size, "rendezvous: the master's entry for rank %d has %s", i, what);
    }
    /* Names are how users call peers: one rank each. */
    const rdv_entry_t **sorted = malloc((size_t)world * sizeof *sorted);
    if (!sorted)
        return say(why, size, "rendezvous: out of memory");
    for (int i = 0; i < world; i++)
        sorted[i] = &out[i];
    qsort(sorted, (size_t)world, sizeof *sorted, by_name);
    for (int i = 1; i < world; i++)
        if (!strcmp(sorted[i - 1]->name, sorted[i]->name)) {
            say(why, size, "rendezvous: the master's table names two ranks \"%s\"",
                sorted[i]->name);
            free(sorted);
            return -1;
        }
    free(sorted);
    if (strcmp(out[rank].name, name) != 0)
        return say(why, size, "rendezvous: the master's table gives rank %d to \"%s\"", rank,
                   out[rank].name);
    return 0;
}
