/* SPDX-License-Identifier: MIT */
/*  stream.c: putting streamed messages together (format in wire.h, sizes
    in stream.h).

    A streamed message waits in a short list, keyed by its connection (the
    socket it came from, the sender's rank and routing id), until its last
    piece arrives; pieces of one connection arrive in order, since the
    sender queues the message and all its pieces at once, but pieces of
    different connections interleave on the ROUTER. The thread that reads
    a socket takes its entry out of the list while it copies a piece in,
    so the lock guards the list, not the copies, and the I/O thread's
    expiry (which frees entries of any socket) only meets idle entries.
    The buffers come from bufcache.h and become the tensors' storage (no
    second copy).

    What a peer can make us hold (stream.h): a stream reserves its declared
    size against a budget for all pending streams and a share per rank
    before anything is allocated, and at most RPC_STREAM_MAX_PENDING_PEER
    of a rank's streams wait at once. The key includes the routing id, so
    another identity can neither inject pieces into a stream nor replace
    it; only its own connection can (and authentication decides who that
    is). */
#include "rpc/net/stream.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/error.h>
#include "core/clock.h"
#include "core/log_private.h"
#include "rpc/net/bufcache.h"

typedef struct stream {
    void *sock; /* the connection: socket, rank, routing id */
    int src;
    uint8_t route[RPC_WIRE_SYNC_ID_LEN];
    size_t route_len;
    zmq_msg_t hm; /* the streamed message's header frame */
    uint8_t type;
    uint64_t id;
    rpc_frame_t *frames; /* its tensor frames, the table left out */
    int n;
    uint32_t chunk, count;
    rpc_wire_stream_t *entries;
    rpc_buf_t **bufs; /* one per entry */
    uint32_t entry;   /* being received: entry, bytes of it so far */
    uint64_t at;
    uint64_t seq;       /* number of the next piece */
    int64_t touched_ns; /* when the last piece (or the message) came */
    int64_t stalled_ns; /* when an expiry pass found it stalled; 0: not */
    uint64_t reserved;  /* bytes counted in the budget (budget_release) */
    bool counted;       /* counted in the pending limits */
    struct stream *next;
} stream_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static stream_t *streams;
static int n_streams;

/*  ---- the budget (under lock) ---- */

static uint64_t budget_total, budget_peer;
static pthread_once_t budget_once = PTHREAD_ONCE_INIT;
static uint64_t reserved_total;
static int live_total;          /* streams counted, in the list or being filled */
static uint64_t *peer_reserved; /* per rank, grown to the world's size */
static int *peer_live;
static int n_peer_slots;

/*  MiB from the environment, or fallback when unset or not a positive number. */
static uint64_t env_mib(const char *name, uint64_t fallback)
{
    const char *v = getenv(name);
    char *end;
    unsigned long long mib = v ? strtoull(v, &end, 10) : 0;
    if (!v || end == v || *end || mib == 0 || mib > ((uint64_t)1 << 40)) {
        if (v)
            zd__log(ZD_LOG_WARN, "rpc: %s=\"%s\" is not a size in MiB: using %llu MiB", name, v,
                    (unsigned long long)(fallback >> 20));
        return fallback;
    }
    return (uint64_t)mib << 20;
}

static void budget_init(void)
{
    uint64_t total = RPC_STREAM_BUDGET_DEFAULT;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && (uint64_t)pages * (uint64_t)page / 4 < total)
        total = (uint64_t)pages * (uint64_t)page / 4;
    budget_total = env_mib("ZDIST_STREAM_BUDGET_MB", total);
    budget_peer = env_mib("ZDIST_STREAM_PEER_MB", budget_total / 2);
    if (budget_peer > budget_total)
        budget_peer = budget_total;
}

/*  Counts s (bytes declared by rank src) in the limits, or fails naming
    which one it would pass. Under lock. */
static int budget_take(stream_t *s, int src, int world, uint64_t bytes)
{
    if (src >= world)
        world = src + 1; /* the receive loop checked src against the world */
    if (world > n_peer_slots) {
        uint64_t *r = realloc(peer_reserved, (size_t)world * sizeof *r);
        if (r)
            peer_reserved = r;
        int *l = r ? realloc(peer_live, (size_t)world * sizeof *l) : NULL;
        if (!r || !l)
            return zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory for the stream table");
        peer_live = l;
        for (int i = n_peer_slots; i < world; i++) {
            peer_reserved[i] = 0;
            peer_live[i] = 0;
        }
        n_peer_slots = world;
    }
    if (live_total >= RPC_STREAM_MAX_PENDING)
        return zd_error_set("more than %d streamed messages pending", RPC_STREAM_MAX_PENDING);
    if (peer_live[src] >= RPC_STREAM_MAX_PENDING_PEER)
        return zd_error_set("more than %d streamed messages pending from this rank",
                            RPC_STREAM_MAX_PENDING_PEER);
    if (bytes > budget_peer - peer_reserved[src])
        return zd_error_set("a streamed message of %llu MiB would pass this rank's share of "
                            "memory for streams (%llu of %llu MiB pending; "
                            "ZDIST_STREAM_PEER_MB raises it)",
                            (unsigned long long)(bytes >> 20),
                            (unsigned long long)(peer_reserved[src] >> 20),
                            (unsigned long long)(budget_peer >> 20));
    if (bytes > budget_total - reserved_total)
        return zd_error_set("a streamed message of %llu MiB would pass the memory budget for "
                            "streams (%llu of %llu MiB pending; ZDIST_STREAM_BUDGET_MB raises "
                            "it)",
                            (unsigned long long)(bytes >> 20),
                            (unsigned long long)(reserved_total >> 20),
                            (unsigned long long)(budget_total >> 20));
    live_total++;
    peer_live[src]++;
    reserved_total += bytes;
    peer_reserved[src] += bytes;
    s->reserved = bytes;
    s->counted = true;
    return 0;
}

static void budget_release(stream_t *s)
{
    if (!s->counted)
        return;
    pthread_mutex_lock(&lock);
    live_total--;
    reserved_total -= s->reserved;
    if (s->src >= 0 && s->src < n_peer_slots) {
        peer_live[s->src]--;
        peer_reserved[s->src] -= s->reserved;
    }
    pthread_mutex_unlock(&lock);
    s->counted = false;
}

static void release_frames(rpc_frame_t *frames, int n)
{
    for (int i = 0; i < n; i++)
        if (frames[i].release)
            frames[i].release(frames[i].data, frames[i].release_arg);
}

/*  Frees what m holds: after this, m holds nothing. */
static void drop_msg(inmsg_t *m)
{
    release_frames(m->frames, m->n);
    m->n = 0;
    zmq_msg_close(&m->hm);
}

static void stream_free(stream_t *s)
{
    if (!s)
        return;
    budget_release(s);
    release_frames(s->frames, s->n);
    for (uint32_t i = 0; s->bufs && i < s->count; i++)
        zd__rpc_bufcache_put(s->bufs[i]);
    zmq_msg_close(&s->hm);
    free(s->bufs);
    free(s->entries);
    free(s->frames);
    free(s);
}

static bool same_connection(const stream_t *s, void *sock, const inmsg_t *m)
{
    return s->sock == sock && s->src == m->src && s->route_len == m->route_len &&
        memcmp(s->route, m->route, m->route_len) == 0;
}

/*  Unlinks and returns the entry of m's connection, or NULL. */
static stream_t *take(void *sock, const inmsg_t *m)
{
    pthread_mutex_lock(&lock);
    stream_t **p = &streams;
    while (*p && !same_connection(*p, sock, m))
        p = &(*p)->next;
    stream_t *s = *p;
    if (s) {
        *p = s->next;
        n_streams--;
    }
    pthread_mutex_unlock(&lock);
    return s;
}

static const char *peer_name(zd__net_t *n, int rank)
{
    return n->peers && rank >= 0 && rank < n->world ? n->peers[rank].name : "?";
}

/*  Logs why a message of type/id from m's connection was dropped (zd_error_last),
    and asks the caller to answer it when it is a request on the ROUTER. */
static int refuse(zd__net_t *n, void *sock, inmsg_t *m, int type, uint64_t id)
{
    zd__log(ZD_LOG_WARN, "rpc: dropped a bad message from \"%s\" (rank %d): %s",
            peer_name(n, m->src), m->src, zd_error_last());
    if (sock == n->router && (type == RPC_MSG_CALL || type == RPC_MSG_REMOTE)) {
        snprintf(m->reject, sizeof m->reject, "bad message: %s", zd_error_last());
        m->reject_id = id;
    } else if (type == RPC_MSG_REPLY && id) {
        /* The answer to one of our calls: that call fails now, not at its
           timeout. */
        char text[sizeof m->reject];
        zd_error_code_t code =
            zd_error_code() == ZD_ERR_NO_MEMORY ? ZD_ERR_NO_MEMORY : ZD_ERR_OTHER;
        snprintf(text, sizeof text, "answer dropped: %s", zd_error_last());
        n->up.fail_answer(n->up.arg, id, m->src, text, code);
    }
    return -1;
}

/*  The streamed messages dropped last (connection and id): their pieces,
    which keep coming, are then dropped without a line each, since one line
    already said why (a stream bomb would otherwise fill the log's lines). */
#define REFUSED_KEEP 64
typedef struct {
    void *sock;
    int src;
    uint8_t route[RPC_WIRE_SYNC_ID_LEN];
    size_t route_len;
    uint64_t id;
} refused_t;
static refused_t refused[REFUSED_KEEP];
static unsigned n_refused;

static void remember_refused(void *sock, const inmsg_t *m, uint64_t id)
{
    pthread_mutex_lock(&lock);
    refused_t *r = &refused[n_refused++ % REFUSED_KEEP];
    *r = (refused_t){.sock = sock, .src = m->src, .route_len = m->route_len, .id = id};
    memcpy(r->route, m->route, m->route_len);
    pthread_mutex_unlock(&lock);
}

static bool was_refused(void *sock, const inmsg_t *m, uint64_t id)
{
    bool found = false;
    pthread_mutex_lock(&lock);
    for (unsigned i = 0; i < REFUSED_KEEP && i < n_refused && !found; i++) {
        const refused_t *r = &refused[i];
        found = r->sock == sock && r->id == id && r->src == m->src &&
            r->route_len == m->route_len && memcmp(r->route, m->route, m->route_len) == 0;
    }
    pthread_mutex_unlock(&lock);
    return found;
}

/*  A streamed message: checks its table and keeps it until its pieces are in. */
static int start(zd__net_t *n, void *sock, inmsg_t *m)
{
    const rpc_wire_header_t *h = &m->h;
    int type = h->type;
    uint64_t id = h->id;
    rpc_frame_t *table = &m->frames[m->n - 1];
    stream_t *s = calloc(1, sizeof *s);
    if (!s) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory for a streamed %s",
                          zd__rpc_wire_type_name(type));
        goto fail;
    }
    zmq_msg_init(&s->hm);
    if (zd__rpc_wire_stream_table_parse(table->data, table->size, (uint32_t)m->n, &s->count,
                                        &s->chunk, &s->entries) < 0)
        goto fail;
    for (uint32_t i = 0; i < s->count; i++)
        if (m->frames[s->entries[i].frame].size != 0) {
            zd_error_set("wire: stream table entry %u names frame %u, which holds %zu bytes", i,
                         s->entries[i].frame, m->frames[s->entries[i].frame].size);
            goto fail;
        }
    /* A message still pending on this connection lost its pieces (the
       peer went away and came back): its place is taken, and its share. */
    stream_t *old = take(sock, m);
    if (old) {
        zd_error_set("streamed %s %llx dropped after %llu pieces: its connection sent a new "
                     "message",
                     zd__rpc_wire_type_name(old->type), (unsigned long long)old->id,
                     (unsigned long long)old->seq);
        zd__log(ZD_LOG_WARN, "rpc: from \"%s\" (rank %d): %s", peer_name(n, m->src), m->src,
                zd_error_last());
        stream_free(old);
    }
    uint64_t declared = 0;
    for (uint32_t i = 0; i < s->count; i++)
        declared += s->entries[i].bytes; /* < 4096 * 2^34: no overflow */
    s->src = m->src;
    pthread_once(&budget_once, budget_init);
    pthread_mutex_lock(&lock);
    int rc = budget_take(s, m->src, n->world, declared);
    pthread_mutex_unlock(&lock);
    if (rc < 0)
        goto fail;
    s->bufs = calloc(s->count, sizeof *s->bufs);
    s->frames = malloc((size_t)(m->n - 1) * sizeof *s->frames);
    if (!s->bufs || !s->frames) {
        zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory for a streamed %s",
                          zd__rpc_wire_type_name(type));
        goto fail;
    }
    for (uint32_t i = 0; i < s->count; i++)
        if (!(s->bufs[i] = zd__rpc_bufcache_get((size_t)s->entries[i].bytes))) {
            zd_error_wrap("a streamed tensor of %llu bytes",
                          (unsigned long long)s->entries[i].bytes);
            goto fail;
        }
    s->sock = sock;
    s->touched_ns = zd__net_now_ns();
    s->src = m->src;
    s->route_len = m->route_len;
    memcpy(s->route, m->route, m->route_len);
    s->type = (uint8_t)type;
    s->id = id;
    zmq_msg_move(&s->hm, &m->hm);
    zmq_msg_close(&m->hm);
    table->release(table->data, table->release_arg);
    s->n = m->n - 1;
    memcpy(s->frames, m->frames, (size_t)s->n * sizeof *s->frames);
    m->n = 0;
    pthread_mutex_lock(&lock);
    s->next = streams;
    streams = s;
    n_streams++;
    pthread_mutex_unlock(&lock);
    return 0;
fail:
    stream_free(s);
    drop_msg(m);
    remember_refused(sock, m, id);
    return refuse(n, sock, m, type, id);
}

/*  Hands the complete message s over in m. */
static int finish(stream_t *s, inmsg_t *m)
{
    if (m->cap < s->n) {
        rpc_frame_t *f = realloc(m->frames, (size_t)s->n * sizeof *f);
        if (!f)
            return zd_error_set_code(ZD_ERR_NO_MEMORY,
                                     "out of memory for a streamed message of %d frames", s->n);
        m->frames = f;
        m->cap = s->n;
    }
    for (uint32_t i = 0; i < s->count; i++) {
        rpc_frame_t *f = &s->frames[s->entries[i].frame];
        f->release(f->data, f->release_arg); /* the empty placeholder */
        *f = (rpc_frame_t){.data = s->bufs[i]->data,
                           .size = (size_t)s->entries[i].bytes,
                           .release = zd__rpc_bufcache_release,
                           .release_arg = s->bufs[i]};
        s->bufs[i] = NULL;
    }
    memcpy(m->frames, s->frames, (size_t)s->n * sizeof *m->frames);
    m->n = s->n;
    s->n = 0;
    zmq_msg_init(&m->hm);
    zmq_msg_move(&m->hm, &s->hm);
    /* The header was valid when it came: parsing again only points m->h
       into the frame it now lives in. */
    zd__rpc_wire_parse(zmq_msg_data(&m->hm), zmq_msg_size(&m->hm), &m->h);
    m->h.flags &= (uint16_t)~RPC_WIRE_F_STREAMED;
    m->h.n_tensors = (uint32_t)m->n;
    stream_free(s);
    return 1;
}

/*  A piece: copied into its tensor's buffer, and freed at once. */
static int piece(zd__net_t *n, void *sock, inmsg_t *m)
{
    const rpc_wire_header_t *h = &m->h;
    stream_t *s = take(sock, m);
    if (!s) {
        bool known = was_refused(sock, m, h->id);
        zd_error_set("stream piece %llu of %llx, but no streamed message is pending on its "
                     "connection",
                     (unsigned long long)h->a, (unsigned long long)h->id);
        drop_msg(m);
        return known ? -1 : refuse(n, sock, m, 0, 0);
    }
    const rpc_wire_stream_t *e = &s->entries[s->entry];
    uint64_t want = e->bytes - s->at < s->chunk ? e->bytes - s->at : s->chunk;
    const rpc_frame_t *f = &m->frames[0];
    if (h->id != s->id || h->a != s->seq || f->size != want) {
        zd_error_set("stream piece %llu of %llx (%zu bytes) where piece %llu of %s %llx "
                     "(%llu bytes) was due",
                     (unsigned long long)h->a, (unsigned long long)h->id, f->size,
                     (unsigned long long)s->seq, zd__rpc_wire_type_name(s->type),
                     (unsigned long long)s->id, (unsigned long long)want);
        int type = s->type;
        uint64_t id = s->id;
        stream_free(s);
        drop_msg(m);
        remember_refused(sock, m, id);
        return refuse(n, sock, m, type, id);
    }
    memcpy((char *)s->bufs[s->entry]->data + s->at, f->data, f->size);
    drop_msg(m);
    s->seq++;
    s->at += want;
    if (s->at == e->bytes) {
        s->entry++;
        s->at = 0;
    }
    if (s->entry == s->count) {
        if (finish(s, m) == 1)
            return 1;
        int type = s->type;
        uint64_t id = s->id;
        stream_free(s);
        return refuse(n, sock, m, type, id);
    }
    s->touched_ns = zd__net_now_ns();
    s->stalled_ns = 0;
    pthread_mutex_lock(&lock);
    s->next = streams;
    streams = s;
    n_streams++;
    pthread_mutex_unlock(&lock);
    return 0;
}

int zd__transport_stream_filter(zd__net_t *n, void *sock, inmsg_t *m)
{
    if (!(m->h.flags & (RPC_WIRE_F_STREAMED | RPC_WIRE_F_CHUNK)))
        return 1;
    return m->h.flags & RPC_WIRE_F_CHUNK ? piece(n, sock, m) : start(n, sock, m);
}

void zd__transport_stream_clear(void)
{
    pthread_mutex_lock(&lock);
    stream_t *s = streams;
    streams = NULL;
    n_streams = 0;
    n_refused = 0; /* its sockets close: their addresses may come back */
    pthread_mutex_unlock(&lock);
    while (s) {
        stream_t *next = s->next;
        stream_free(s);
        s = next;
    }
}

int zd__transport_stream_pending(void)
{
    pthread_mutex_lock(&lock);
    int n = n_streams;
    pthread_mutex_unlock(&lock);
    return n;
}

int zd__transport_stream_expire(zd__net_t *n, int64_t now)
{
    stream_t *stale = NULL;
    pthread_mutex_lock(&lock);
    for (stream_t **p = &streams; *p;) {
        stream_t *s = *p;
        bool stalled = now - s->touched_ns > RPC_STREAM_STALL_NS;
        if (stalled && !s->stalled_ns)
            s->stalled_ns = now;
        if (stalled && now - s->stalled_ns >= RPC_STREAM_GRACE_NS) {
            *p = s->next;
            n_streams--;
            s->next = stale;
            stale = s;
        } else {
            p = &s->next;
        }
    }
    pthread_mutex_unlock(&lock);
    int dropped = 0;
    for (stream_t *s = stale, *next; s; s = next, dropped++) {
        next = s->next;
        char text[256];
        snprintf(text, sizeof text,
                 "streamed %s %llx dropped: no piece for %lld s after "
                 "%llu pieces",
                 zd__rpc_wire_type_name(s->type), (unsigned long long)s->id,
                 (long long)(RPC_STREAM_STALL_NS / ZD__NS_PER_S), (unsigned long long)s->seq);
        zd__log(ZD_LOG_WARN, "rpc: from \"%s\" (rank %d): %s", peer_name(n, s->src), s->src, text);
        if (s->sock == n->router && (s->type == RPC_MSG_CALL || s->type == RPC_MSG_REMOTE)) {
            inmsg_t m = {.src = s->src, .route_len = s->route_len};
            memcpy(m.route, s->route, s->route_len);
            zd__transport_answer_error(n, &m, s->id, text);
        } else if (s->type == RPC_MSG_REPLY) {
            n->up.fail_answer(n->up.arg, s->id, s->src, text, ZD_ERR_OTHER);
        }
        stream_free(s);
    }
    return dropped;
}
