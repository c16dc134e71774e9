/* SPDX-License-Identifier: MIT */
/*  rendezvous_msg.c: reading the rendezvous messages (rendezvous.h). Every
    frame is copied into a bounded buffer before it is looked at: nothing a
    peer sends is trusted to be terminated, short or printable. */
#include "rpc/world/rendezvous.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rpc/net/address.h"
#include "rpc/net/wire.h"

/*  The frame as a string in buf; false when it does not fit or holds a NUL. */
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

/*  Z85's alphabet (ZeroMQ's RFC 32). */
static bool key_syntax_ok(const char *k)
{
    static const char z85[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                              ".-:+=^!/*?&<>()[]{}@%$#";
    size_t n = strlen(k);
    return n == 0 || (n == RDV_KEY_LEN && strspn(k, z85) == n);
}

/*  Whether e's name, endpoint and key are well formed (e holds them as
    read, terminated): 0, or -1 saying which is not. */
static int check_entry(const rdv_entry_t *e, char *why, size_t size)
{
    char ip[ZD_ADDR_MAX];
    int port;
    if (!zd__rpc_wire_name_ok(e->name, ZD_RPC_MAX_NAME))
        return say(why, size, "a bad name (1 to %d printable characters)", ZD_RPC_MAX_NAME);
    if (zd__addr_parse_endpoint(e->endpoint, ip, sizeof ip, &port) < 0)
        return say(why, size, "a bad endpoint for \"%s\" (not tcp://IP:PORT)", e->name);
    if (!key_syntax_ok(e->key))
        return say(why, size, "a bad key for \"%s\" (not empty nor %d Z85 characters)", e->name,
                   RDV_KEY_LEN);
    return 0;
}

/*  A name (from the frame first, or the next one of m when NULL), an
    endpoint and a key from the next frames of m. */
static int read_entry(zmsg_t *m, zframe_t *first, rdv_entry_t *e, char *why, size_t size)
{
    if (!frame_text(first ? first : zmsg_next(m), e->name, sizeof e->name) ||
        !zd__rpc_wire_name_ok(e->name, ZD_RPC_MAX_NAME)) /* before it is quoted */
        return say(why, size, "a bad name (1 to %d printable characters)", ZD_RPC_MAX_NAME);
    if (!frame_text(zmsg_next(m), e->endpoint, sizeof e->endpoint))
        return say(why, size, "a bad endpoint for \"%s\" (not tcp://IP:PORT)", e->name);
    if (!frame_text(zmsg_next(m), e->key, sizeof e->key))
        return say(why, size, "a bad key for \"%s\" (not empty nor %d Z85 characters)", e->name,
                   RDV_KEY_LEN);
    return check_entry(e, why, size);
}

/*  The next field of an entries frame, [*at, end), as a string in buf:
    false when it runs past the end, does not fit or holds a NUL. */
static bool take_field(const uint8_t **at, const uint8_t *end, char *buf, size_t size)
{
    if (*at >= end)
        return false;
    size_t n = **at;
    const uint8_t *d = *at + 1;
    if (n > (size_t)(end - d) || n >= size || (n && memchr(d, 0, n)))
        return false;
    memcpy(buf, d, n);
    buf[n] = '\0';
    *at = d + n;
    return true;
}

int zd__rdv_parse_ranks(const char *list, int world, bool *lost)
{
    while (*list) {
        char num[16];
        size_t n = strcspn(list, ",");
        int r;
        if (n == 0 || n >= sizeof num)
            return -1;
        memcpy(num, list, n);
        num[n] = '\0';
        if (!parse_int(num, 0, world - 1, &r))
            return -1;
        lost[r] = true;
        list += n;
        if (*list == ',' && !*++list)
            return -1; /* a trailing comma */
    }
    return 0;
}

void zd__rdv_status(const bool *lost, int world, char buf[RDV_MAX_TEXT])
{
    size_t n = (size_t)snprintf(buf, RDV_MAX_TEXT, "%s", RDV_RUNNING);
    char sep = ':';
    for (int i = 0; i < world; i++) {
        if (!lost[i])
            continue;
        char item[16];
        int k = snprintf(item, sizeof item, "%c%d", sep, i);
        if (n + (size_t)k >= RDV_MAX_TEXT)
            break;
        memcpy(buf + n, item, (size_t)k + 1);
        n += (size_t)k;
        sep = ',';
    }
}

/*  A status frame: "running", or "running:" and a list of ranks (checked
    against world, the sender's). */
static bool read_status(zframe_t *f, int world, char list[RDV_MAX_TEXT])
{
    char text[RDV_MAX_TEXT + 16];
    size_t len = strlen(RDV_RUNNING);
    if (!frame_text(f, text, sizeof text) || strncmp(text, RDV_RUNNING, len) != 0 ||
        (text[len] && text[len] != ':') || strlen(text + len) >= RDV_MAX_TEXT)
        return false;
    const char *from = text[len] ? text + len + 1 : "";
    memcpy(list, from, strlen(from) + 1); /* shorter than RDV_MAX_TEXT: checked above */
    bool *probe = calloc((size_t)world, sizeof *probe);
    bool ok = probe && zd__rdv_parse_ranks(list, world, probe) == 0;
    free(probe);
    return ok;
}

int zd__rdv_parse_registration(zmsg_t *m, rdv_entry_t *out, char lost_list[RDV_MAX_TEXT], char *why,
                               size_t size)
{
    lost_list[0] = '\0';
    char tag[8], num[16];
    memset(out, 0, sizeof *out);
    if (zmsg_size(m) != 6 && zmsg_size(m) != 7)
        return say(why, size, "%zu frames instead of 6 or 7", zmsg_size(m));
    if (!frame_text(zmsg_first(m), tag, sizeof tag) || strcmp(tag, RDV_REG_TAG) != 0)
        return say(why, size, "not a registration");
    if (!frame_text(zmsg_next(m), num, sizeof num) ||
        !parse_int(num, 0, RPC_WIRE_MAX_RANK, &out->rank))
        return say(why, size, "a bad rank");
    if (!frame_text(zmsg_next(m), num, sizeof num) ||
        !parse_int(num, 1, RPC_WIRE_MAX_RANK + 1, &out->world))
        return say(why, size, "a bad world size");
    if (read_entry(m, NULL, out, why, size) < 0)
        return -1;
    if (zmsg_size(m) == 7) {
        if (!read_status(zmsg_next(m), out->world, lost_list))
            return say(why, size,
                       "a bad status for \"%s\" (not \"running\" with ranks of "
                       "the world)",
                       out->name);
        out->running = true;
    }
    return 0;
}

static int by_name(const void *x, const void *y)
{
    return strcmp((*(const rdv_entry_t *const *)x)->name, (*(const rdv_entry_t *const *)y)->name);
}

int zd__rdv_parse_answer(zmsg_t *m, int world, int rank, const char *name, rdv_entry_t *out,
                         bool *running, char *why, size_t size)
{
    char tag[8], num[16];
    *running = false;
    if (!frame_text(zmsg_first(m), tag, sizeof tag))
        return say(why, size, "rendezvous: malformed answer from the master");
    bool busy = !strcmp(tag, RDV_BUSY_TAG);
    if (busy || !strcmp(tag, RDV_ERR_TAG)) {
        zframe_t *f = zmsg_next(m);
        if (zmsg_size(m) != 2 || !f || zframe_size(f) == 0)
            return say(why, size, "rendezvous: the master reported an error");
        size_t n = zframe_size(f) < RDV_MAX_TEXT ? zframe_size(f) : RDV_MAX_TEXT;
        n = n < size ? n : size - 1;
        const unsigned char *d = zframe_data(f);
        for (size_t i = 0; i < n; i++)
            why[i] = d[i] >= 32 && d[i] < 127 ? (char)d[i] : '?';
        why[n] = '\0';
        return busy ? -2 : -1;
    }
    size_t frames = 3;
    if (strcmp(tag, RDV_TAB_TAG) != 0 || (zmsg_size(m) != frames && zmsg_size(m) != frames + 1))
        return say(why, size, "rendezvous: malformed answer from the master");
    /* The status first (the last frame): a rank gone from a running
       world may be an empty entry, its name unknown to a restarted rank 0. */
    for (int i = 0; i < world; i++)
        out[i].lost = false;
    if (zmsg_size(m) == frames + 1) {
        char list[RDV_MAX_TEXT];
        bool *lost = calloc((size_t)world, sizeof *lost);
        bool ok = lost && read_status(zmsg_last(m), world, list) &&
            zd__rdv_parse_ranks(list, world, lost) == 0 && !lost[rank];
        for (int i = 0; ok && i < world; i++)
            out[i].lost = lost[i];
        free(lost);
        if (!ok)
            return say(why, size, "rendezvous: the master's table has a bad status");
        *running = true;
    }
    zmsg_first(m);
    int w;
    if (!frame_text(zmsg_next(m), num, sizeof num) ||
        !parse_int(num, 1, RPC_WIRE_MAX_RANK + 1, &w) || w != world)
        return say(why, size, "rendezvous: the master's table is not for a world of %d", world);
    zframe_t *entries = zmsg_next(m);
    const uint8_t *at = zframe_data(entries);
    const uint8_t *end = zframe_size(entries) ? at + zframe_size(entries) : at;
    int named = 0;
    for (int i = 0; i < world; i++) {
        char what[160];
        rdv_entry_t *e = &out[i];
        e->rank = i;
        e->world = world;
        if (!take_field(&at, end, e->name, sizeof e->name) ||
            !take_field(&at, end, e->endpoint, sizeof e->endpoint) ||
            !take_field(&at, end, e->key, sizeof e->key))
            return say(why, size, "rendezvous: the master's table is cut short at rank %d", i);
        if (e->lost && !e->name[0]) {
            if (e->endpoint[0] || e->key[0])
                return say(why, size,
                           "rendezvous: the master's entry for lost rank %d is not "
                           "empty",
                           i);
            continue;
        }
        if (check_entry(e, what, sizeof what) < 0)
            return say(why, size, "rendezvous: the master's entry for rank %d has %s", i, what);
        named++;
    }
    if (at != end)
        return say(why, size, "rendezvous: the master's table runs past its %d ranks", world);
    /* Names are how users call peers: one rank each. */
    const rdv_entry_t **sorted = malloc((size_t)world * sizeof *sorted);
    if (!sorted)
        return say(why, size, "rendezvous: out of memory");
    for (int i = 0, k = 0; i < world; i++)
        if (out[i].name[0])
            sorted[k++] = &out[i];
    qsort(sorted, (size_t)named, sizeof *sorted, by_name);
    for (int i = 1; i < named; i++)
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
