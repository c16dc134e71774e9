/* SPDX-License-Identifier: MIT */
/*  shm.c: large tensors through shared memory between two processes of one
    host (design, handshake and table format in shm.h).

    Sending: a peer's segments sit behind its own lock, held only to pick a
    segment (or make one); the copy into it happens outside. The busy flag
    in the segment's header is the only thing both processes write: the
    sender sets it when it takes the segment, the receiver clears it once
    it has copied the tensor out (when the message is decoded, or dropped),
    so a segment is never rewritten before the receiver has its copy.
    Receiving: the segments seen from each peer are kept mapped in a table
    under one lock; a frame in a segment holds a reference to its mapping
    until it is copied out. */
#define _GNU_SOURCE
#include "rpc/net/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zdist/error.h>
#include "core/clock.h"
#include "core/log_private.h"
#include "rpc/value/copy.h"

#define SHM_HEADER      4096
#define SHM_NAME        "zdist-shm"
#define SHM_OFFER_MAGIC "ZDSHMOF1"
#define SHM_SEG_MAGIC   "ZDSHMSG1"

/*  The first bytes of every segment (and of the probe). */
typedef struct {
    char magic[8];
    uint64_t token;
    uint64_t cap;
    uint32_t src, dst;
    _Atomic uint32_t busy;
} seg_header_t;

/*  What an OFFER carries (its extra bytes). Only ever compared with the
    same struct of a process of the same host, so raw bytes will do. */
typedef struct {
    char magic[8];
    char boot_id[40];
    uint64_t net_dev, net_ino, mnt_dev, mnt_ino, pid_dev, pid_ino;
    uint32_t uid, pid;
    uint32_t probe_fd, reserved;
    uint64_t probe_token;
} identity_t;

typedef struct {
    int fd;
    uint8_t *map; /* header page, then cap bytes */
    size_t cap;
    uint64_t token;
    atomic_int mapped; /* the peer's answer: 1 mapped, 0 none yet, -1 refused */
} tx_seg_t;

typedef struct {
    pthread_mutex_t lock;
    atomic_int state; /* 0: no answer yet, 1: accepted, -1: refused */
    tx_seg_t segs[RPC_SHM_MAX_SEGS];
    int n_segs;
    size_t bytes;
} tx_peer_t;

typedef struct {
    atomic_int refs;
    uint8_t *map;
    size_t len;
    uint64_t token, cap;
} rx_seg_t;

typedef struct {
    uint32_t pid; /* of the accepted offer; 0: none */
    rx_seg_t *segs[RPC_SHM_MAX_SEGS];
} rx_peer_t;

static atomic_bool enabled;
static atomic_int senders; /* threads between prepare and done */
static zd__net_t *net;     /* to announce segments from a sender's thread */
static int my_rank, world;
static identity_t me;
static int probe_fd = -1;
static uint8_t *probe_map;
static tx_peer_t *tx;
static size_t tx_bytes; /* under tx_total_lock */
static pthread_mutex_t tx_total_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t rx_lock = PTHREAD_MUTEX_INITIALIZER;
static rx_peer_t *rx;
/*  An offer may come before this process's own connections are up (its I/O
    thread runs while it still connects): the answer waits until they are. */
static pthread_mutex_t answer_lock = PTHREAD_MUTEX_INITIALIZER;
static bool connected;
static signed char *pending; /* per rank: 1 accept, -1 refuse, 0 none */
static atomic_long n_sent, n_received, n_fallbacks, n_made, n_refused;
/*  A descriptor held in reserve: opening a peer's segment when the process
    has run out of them (a stranger holding connections) closes it, opens
    the segment, and takes it again. Under rx_lock. */
static int reserve_fd = -1;

/*  ---- identity and segments ---- */

static uint64_t random_token(void)
{
    uint64_t t = 0;
    while (t == 0)
        if (getrandom(&t, sizeof t, 0) != (ssize_t)sizeof t)
            t = (uint64_t)zd__net_now_ns() ^ ((uint64_t)getpid() << 32);
    return t;
}

static int ns_of(const char *path, uint64_t *dev, uint64_t *ino)
{
    struct stat st;
    if (stat(path, &st) < 0)
        return -1;
    *dev = (uint64_t)st.st_dev;
    *ino = (uint64_t)st.st_ino;
    return 0;
}

static int read_identity(identity_t *id)
{
    memset(id, 0, sizeof *id);
    memcpy(id->magic, SHM_OFFER_MAGIC, 8);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f)
        return -1;
    bool ok = fgets(id->boot_id, sizeof id->boot_id, f) != NULL;
    fclose(f);
    if (!ok || strlen(id->boot_id) < 32)
        return -1;
    if (ns_of("/proc/self/ns/net", &id->net_dev, &id->net_ino) < 0 ||
        ns_of("/proc/self/ns/mnt", &id->mnt_dev, &id->mnt_ino) < 0 ||
        ns_of("/proc/self/ns/pid", &id->pid_dev, &id->pid_ino) < 0)
        return -1;
    id->uid = (uint32_t)geteuid();
    id->pid = (uint32_t)getpid();
    return 0;
}

/*  The seals every segment carries: its size can never change again, so
    that a receiver reading it cannot be killed by SIGBUS (a sender that
    shrinks the file under the receiver's mapping), and no seal can be added
    or taken away. Its bytes stay writable for the sender: the receiver
    copies a tensor out before it looks at it (codec.c, peer_writable). */
#define SHM_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

/*  A new memfd of a header page and cap bytes, sealed to that size, mapped
    and pre-faulted. */
static int make_memfd(size_t cap, uint64_t token, int src, int dst, int *fd_out, uint8_t **map_out)
{
    int fd = memfd_create(SHM_NAME, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -1;
    size_t len = SHM_HEADER + cap;
    uint8_t *map = MAP_FAILED;
    if (ftruncate(fd, (off_t)len) == 0 && fcntl(fd, F_ADD_SEALS, SHM_SEALS) == 0)
        map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (map == MAP_FAILED) {
        close(fd);
        return -1;
    }
    seg_header_t *h = (seg_header_t *)map;
    memcpy(h->magic, SHM_SEG_MAGIC, 8);
    h->token = token;
    h->cap = cap;
    h->src = (uint32_t)src;
    h->dst = (uint32_t)dst;
    atomic_store(&h->busy, 0);
    *fd_out = fd;
    *map_out = map;
    return 0;
}

/*  Opens and maps memfd number fd of process pid (of our uid), checking it
    is one of ours: a memfd by its name, a regular file of our uid, sealed
    against any change of size (seals cannot be removed: a mapping checked
    once stays safe to read), of exactly header + cap bytes, with the header
    the sender announced. Returns the mapping, or NULL with the error set. */
static uint8_t *open_remote(uint32_t pid, uint32_t fd, uint64_t token, uint64_t cap, int src,
                            int dst)
{
    char path[64], target[64];
    snprintf(path, sizeof path, "/proc/%u/fd/%u", pid, fd);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n < 0) {
        zd_error_set("cannot look at %s: %s", path, strerror(errno));
        return NULL;
    }
    target[n] = 0;
    if (strncmp(target, "/memfd:" SHM_NAME, strlen("/memfd:" SHM_NAME)) != 0) {
        zd_error_set("%s is not a segment (%s)", path, target);
        return NULL;
    }
    int f = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (f < 0 && (errno == EMFILE || errno == ENFILE) && reserve_fd >= 0) {
        close(reserve_fd);
        f = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
        reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    }
    if (f < 0) {
        zd_error_set("cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    size_t len = SHM_HEADER + cap;
    uint8_t *map = MAP_FAILED;
    int seals = fcntl(f, F_GET_SEALS);
    if (seals < 0 || (seals & SHM_SEALS) != SHM_SEALS)
        zd_error_set("%s is not sealed against resizing (seals %#x)", path, seals < 0 ? 0 : seals);
    else if (fstat(f, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
             (uint64_t)st.st_size != (uint64_t)len)
        zd_error_set("%s is not the segment announced (owner, type or size)", path);
    else if ((map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0)) == MAP_FAILED)
        zd_error_set("cannot map %s: %s", path, strerror(errno));
    close(f);
    if (map == MAP_FAILED)
        return NULL;
    const seg_header_t *h = (const seg_header_t *)map;
    if (memcmp(h->magic, SHM_SEG_MAGIC, 8) != 0 || h->token != token || h->cap != cap ||
        h->src != (uint32_t)src || h->dst != (uint32_t)dst) {
        munmap(map, len);
        zd_error_set("%s holds another segment than the one announced", path);
        return NULL;
    }
    return map;
}

void zd__shm_start(zd__net_t *n)
{
    const char *env = getenv("ZDIST_SHM");
    bool on = !(env && strcmp(env, "0") == 0);
    net = n;
    my_rank = n->rank;
    world = n->world;
    tx = calloc((size_t)world, sizeof *tx);
    rx = calloc((size_t)world, sizeof *rx);
    pthread_mutex_lock(&answer_lock);
    connected = false;
    pending = calloc((size_t)world, sizeof *pending);
    pthread_mutex_unlock(&answer_lock);
    if (!tx || !rx || !pending) {
        on = false;
    } else {
        for (int i = 0; i < world; i++)
            pthread_mutex_init(&tx[i].lock, NULL);
    }
    if (on && reserve_fd < 0)
        reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (on && read_identity(&me) < 0) {
        zd__log(ZD_LOG_DEBUG, "rpc: shared memory off: cannot read this process's identity");
        on = false;
    }
    if (on) {
        me.probe_token = random_token();
        if (make_memfd(0, me.probe_token, my_rank, -1, &probe_fd, &probe_map) < 0) {
            zd__log(ZD_LOG_DEBUG, "rpc: shared memory off: cannot make a memfd: %s",
                    strerror(errno));
            on = false;
        }
        me.probe_fd = (uint32_t)probe_fd;
    }
    atomic_store(&enabled, on);
}

static void answer_offer(zd__net_t *n, int src, bool yes);

void zd__shm_offer_all(zd__net_t *n)
{
    pthread_mutex_lock(&answer_lock);
    connected = true;
    pthread_mutex_unlock(&answer_lock);
    for (int i = 0; pending && i < n->world; i++)
        if (pending[i]) {
            answer_offer(n, i, pending[i] > 0);
            pending[i] = 0;
        }
    /* A world connected on first use: to those reached at init; the others
       get theirs when first reached (zd__transport_reach). */
    for (int i = 0; i < n->world; i++)
        if (!atomic_load(&n->peers[i].lost_at_ns) && zd__transport_reached(n, i))
            zd__shm_offer(n, i);
}

void zd__shm_offer(zd__net_t *n, int peer)
{
    if (peer == n->rank || !atomic_load(&enabled))
        return;
    rpc_wire_header_t h = {.type = RPC_MSG_SHM_OFFER,
                           .flags = RPC_WIRE_F_INTERNAL,
                           .id = zd__net_new_id(n),
                           .extra = (const uint8_t *)&me,
                           .extra_len = sizeof me};
    if (zd__transport_send(n, peer, &h, NULL, 0) < 0)
        zd__log(ZD_LOG_DEBUG, "rpc: cannot offer shared memory to rank %d: %s", peer,
                zd_error_last());
}

/*  The process behind peer is gone: its tensors (which kept segments busy)
    died with it, and a new one under that rank has mapped none of ours.
    New sends go over ZeroMQ from now; the segments go once no sender can
    be inside one (a sender copies outside the lock); if that takes too
    long they stay until shutdown. */
void zd__shm_peer_reset(int peer)
{
    if (!tx || peer < 0 || peer >= world)
        return;
    tx_peer_t *p = &tx[peer];
    atomic_store(&p->state, 0);
    int64_t until = zd__net_now_ns() + ZD__NS_PER_S;
    while (atomic_load(&senders) > 0 && zd__net_now_ns() < until)
        sched_yield();
    if (atomic_load(&senders) > 0)
        return;
    pthread_mutex_lock(&p->lock);
    pthread_mutex_lock(&tx_total_lock);
    for (int k = 0; k < p->n_segs; k++) {
        munmap(p->segs[k].map, SHM_HEADER + p->segs[k].cap);
        close(p->segs[k].fd);
        tx_bytes -= p->segs[k].cap;
    }
    pthread_mutex_unlock(&tx_total_lock);
    p->n_segs = 0;
    p->bytes = 0;
    pthread_mutex_unlock(&p->lock);
}

static void rx_unref(rx_seg_t *s)
{
    if (s && atomic_fetch_sub(&s->refs, 1) == 1) {
        munmap(s->map, s->len);
        free(s);
    }
}

void zd__shm_stop(void)
{
    atomic_store(&enabled, false);
    while (atomic_load(&senders) > 0)
        sched_yield();
    for (int i = 0; tx && i < world; i++) {
        for (int k = 0; k < tx[i].n_segs; k++) {
            munmap(tx[i].segs[k].map, SHM_HEADER + tx[i].segs[k].cap);
            close(tx[i].segs[k].fd);
        }
        pthread_mutex_destroy(&tx[i].lock);
    }
    free(tx);
    tx = NULL;
    tx_bytes = 0;
    pthread_mutex_lock(&rx_lock);
    for (int i = 0; rx && i < world; i++)
        for (int k = 0; k < RPC_SHM_MAX_SEGS; k++)
            rx_unref(rx[i].segs[k]);
    free(rx);
    rx = NULL;
    pthread_mutex_unlock(&rx_lock);
    pthread_mutex_lock(&answer_lock);
    free(pending);
    pending = NULL;
    connected = false;
    pthread_mutex_unlock(&answer_lock);
    if (probe_fd >= 0) {
        munmap(probe_map, SHM_HEADER);
        close(probe_fd);
    }
    if (reserve_fd >= 0)
        close(reserve_fd);
    reserve_fd = -1;
    probe_fd = -1;
    probe_map = NULL;
}

/*  ---- sending ---- */

/*  Data bytes of a new segment for a tensor of nb bytes: rounded up to an
    eighth of the next power of two, so that sizes a little apart share. */
static size_t segment_cap(size_t nb)
{
    size_t p = 1;
    while (p < nb)
        p <<= 1;
    size_t step = p / 8 > ((size_t)64 << 10) ? p / 8 : (size_t)64 << 10;
    return (nb + step - 1) / step * step;
}

static seg_header_t *seg_head(const tx_seg_t *s)
{
    return (seg_header_t *)s->map;
}

/*  Makes segment k of peer p (replacing a free one there, if any) for cap
    bytes, within the budgets. Under p->lock. */
static int make_segment(tx_peer_t *p, int peer, int k, size_t cap)
{
    size_t old = k < p->n_segs ? p->segs[k].cap : 0;
    pthread_mutex_lock(&tx_total_lock);
    bool fits =
        p->bytes - old + cap <= RPC_SHM_PEER_BYTES && tx_bytes - old + cap <= RPC_SHM_MAX_BYTES;
    if (fits)
        tx_bytes = tx_bytes - old + cap;
    pthread_mutex_unlock(&tx_total_lock);
    if (!fits)
        return -1;
    tx_seg_t s = {.cap = cap, .token = random_token()};
    atomic_init(&s.mapped, 0);
    if (make_memfd(cap, s.token, my_rank, peer, &s.fd, &s.map) < 0) {
        pthread_mutex_lock(&tx_total_lock);
        tx_bytes = tx_bytes + old - cap;
        pthread_mutex_unlock(&tx_total_lock);
        return -1;
    }
    if (k < p->n_segs) {
        /* The receiver maps the new one when it sees its token; its
           mapping of the old one lives until the receiver lets it go. */
        munmap(p->segs[k].map, SHM_HEADER + p->segs[k].cap);
        close(p->segs[k].fd);
    } else {
        p->n_segs++;
    }
    p->segs[k] = s;
    p->bytes = p->bytes - old + cap;
    atomic_fetch_add(&n_made, 1);
    return 0;
}

/*  A receiver lets a segment go once it decoded the message (for an
    answer, when its future's value is first read): a sender calling again
    at once may find that segment still busy. Making another large one costs more than
    waiting this long for it (page faults: ~0.1 s for 16 MiB on a VM). */
#define SHM_WAIT_OVER ((size_t)4 << 20)
#define SHM_WAIT_NS   300000

/*  Whether a busy segment of p could take nb bytes. */
static bool busy_fits(const tx_peer_t *p, size_t nb)
{
    for (int k = 0; k < p->n_segs; k++)
        if (p->segs[k].cap >= nb && atomic_load(&seg_head(&p->segs[k])->busy))
            return true;
    return false;
}

/*  A segment made for a message, to be announced once p->lock is let go. */
typedef struct {
    int slot, fd;
    uint64_t token, cap;
} announce_t;

/*  Takes a segment of at least nb bytes that the peer has mapped: the
    smallest free one that fits. Returns its slot, or -1 when there is none
    for now: then, unless one that fits is already on its way, a new one is
    made (or a free one remade larger) and described in *made, to be
    announced (made->slot >= 0); the peer maps it when the announcement
    arrives, and this message goes the ZeroMQ way. */
static int claim(tx_peer_t *p, int peer, size_t nb, announce_t *made)
{
    int best = -1, small = -1;
    bool coming = false;
    int64_t wait_until = 0;
    made->slot = -1;
again:
    best = -1;
    small = -1;
    for (int k = 0; k < p->n_segs; k++) {
        uint32_t busy = atomic_load_explicit(&seg_head(&p->segs[k])->busy, memory_order_acquire);
        if (busy)
            continue;
        int mapped = atomic_load(&p->segs[k].mapped);
        if (mapped == 0 && p->segs[k].cap >= nb)
            coming = true;
        if (mapped == 1 && p->segs[k].cap >= nb) {
            if (best < 0 || p->segs[k].cap < p->segs[best].cap)
                best = k;
        } else if (p->segs[k].cap < nb && small < 0) {
            small = k;
        }
    }
    if (best < 0 && nb >= SHM_WAIT_OVER && busy_fits(p, nb)) {
        int64_t now = zd__net_now_ns();
        if (!wait_until)
            wait_until = now + SHM_WAIT_NS;
        if (now < wait_until) {
            sched_yield();
            goto again;
        }
    }
    if (best < 0) {
        int k = -1;
        if (coming)
            return -1;
        if (p->n_segs < RPC_SHM_MAX_SEGS && make_segment(p, peer, p->n_segs, segment_cap(nb)) == 0)
            k = p->n_segs - 1;
        else if (small >= 0 && make_segment(p, peer, small, segment_cap(nb)) == 0)
            k = small;
        if (k >= 0)
            *made = (announce_t){
                .slot = k, .fd = p->segs[k].fd, .token = p->segs[k].token, .cap = p->segs[k].cap};
        return -1;
    }
    uint32_t zero = 0;
    /* Only this process sets busy, under p->lock: the exchange cannot fail
       on a segment found free. */
    if (!atomic_compare_exchange_strong_explicit(&seg_head(&p->segs[best])->busy, &zero, 1,
                                                 memory_order_acquire, memory_order_relaxed))
        return -1;
    return best;
}

static void put(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void unclaim(tx_peer_t *p, const rpc_shm_out_t *out)
{
    for (int i = 0; i < out->count; i++)
        atomic_store_explicit(&seg_head(&p->segs[out->slots[i]])->busy, 0, memory_order_release);
}

/*  Tells peer of a new segment (SHM_SEGMENT): it maps it, checked, and
    answers SHM_MAPPED. No lock held: this is a send like any other. */
static void announce(int peer, const announce_t *s)
{
    uint8_t extra[16];
    put(extra, (uint64_t)s->fd, 4);
    put(extra + 4, 0, 4);
    put(extra + 8, s->cap, 8);
    rpc_wire_header_t h = {.type = RPC_MSG_SHM_SEGMENT,
                           .flags = RPC_WIRE_F_INTERNAL,
                           .id = zd__net_new_id(net),
                           .a = (uint64_t)s->slot,
                           .b = s->token,
                           .extra = extra,
                           .extra_len = sizeof extra};
    if (zd__transport_send(net, peer, &h, NULL, 0) < 0)
        zd__log(ZD_LOG_DEBUG, "rpc: cannot announce a shared segment to rank %d: %s", peer,
                zd_error_last());
}

int zd__shm_send_prepare(const rpc_wire_header_t *h, zd_tensor_t *const *tensors, int n_tensors,
                         rpc_shm_out_t *out)
{
    memset(out, 0, sizeof *out);
    int big = 0;
    for (int i = 0; i < n_tensors; i++)
        big += zd_tensor_nbytes(tensors[i]) > RPC_SHM_OVER;
    if (big == 0)
        return 0;
    atomic_fetch_add(&senders, 1);
    int dst = h->dst;
    if (!atomic_load(&enabled) || dst < 0 || dst >= world || dst == my_rank ||
        atomic_load(&tx[dst].state) != 1) {
        atomic_fetch_sub(&senders, 1);
        return 0;
    }
    tx_peer_t *p = &tx[dst];
    out->peer = dst;
    bool ok = big <= RPC_SHM_MAX_SEGS;
    announce_t made = {.slot = -1};
    pthread_mutex_lock(&p->lock);
    for (int i = 0; ok && i < n_tensors; i++) {
        size_t nb = zd_tensor_nbytes(tensors[i]);
        if (nb <= RPC_SHM_OVER)
            continue;
        int k = claim(p, dst, nb, &made);
        if (k < 0)
            ok = false;
        else {
            out->frames[out->count] = i;
            out->slots[out->count++] = k;
        }
    }
    if (!ok)
        unclaim(p, out);
    pthread_mutex_unlock(&p->lock);
    if (made.slot >= 0)
        announce(dst, &made);
    if (ok) {
        out->table_len = 8 + (size_t)RPC_SHM_ENTRY * (size_t)out->count;
        out->table = calloc(1, out->table_len);
        ok = out->table != NULL;
        if (!ok)
            unclaim(p, out);
    }
    if (!ok) {
        atomic_fetch_add(&n_fallbacks, 1);
        atomic_fetch_sub(&senders, 1);
        out->count = 0;
        return 0;
    }
    /* The segments are ours until the receiver has copied the tensors out:
       no lock. */
    put(out->table, (uint64_t)out->count, 4);
    for (int j = 0; j < out->count; j++) {
        const tx_seg_t *s = &p->segs[out->slots[j]];
        zd_tensor_t *t = tensors[out->frames[j]];
        size_t nb = zd_tensor_nbytes(t);
        zd__rpc_copy(s->map + SHM_HEADER, zd_tensor_raw(t), nb);
        uint8_t *e = out->table + 8 + (size_t)RPC_SHM_ENTRY * (size_t)j;
        put(e, (uint64_t)out->frames[j], 4);
        put(e + 4, (uint64_t)out->slots[j], 4);
        put(e + 8, (uint64_t)s->fd, 4);
        put(e + 16, s->token, 8);
        put(e + 24, s->cap, 8);
        put(e + 32, nb, 8);
    }
    atomic_thread_fence(memory_order_release);
    return 1;
}

bool zd__shm_in_segment(const rpc_shm_out_t *out, int i)
{
    for (int j = 0; j < out->count; j++)
        if (out->frames[j] == i)
            return true;
    return false;
}

void zd__shm_send_done(rpc_shm_out_t *out, bool sent)
{
    if (!out->table)
        return;
    if (sent)
        atomic_fetch_add(&n_sent, 1);
    else
        unclaim(&tx[out->peer], out);
    free(out->table);
    out->table = NULL;
    atomic_fetch_sub(&senders, 1);
}

/*  ---- receiving ---- */

static void segment_release(void *data, void *arg)
{
    (void)data;
    rx_seg_t *s = arg;
    atomic_store_explicit(&((seg_header_t *)s->map)->busy, 0, memory_order_release);
    rx_unref(s);
}

/*  The mapping of src's segment described by entry e (a reference for the
    caller), or NULL with the error set: only a segment src announced and
    this process mapped is taken. Under rx_lock. */
static rx_seg_t *rx_segment(int src, const uint8_t *e)
{
    uint32_t slot = (uint32_t)get(e + 4, 4);
    uint64_t token = get(e + 16, 8), cap = get(e + 24, 8);
    rx_seg_t *s = slot < RPC_SHM_MAX_SEGS ? rx[src].segs[slot] : NULL;
    if (!s || s->token != token || s->cap != cap) {
        zd_error_set("shared-memory table names segment %u of %llu bytes, which rank %d did "
                     "not announce",
                     slot, (unsigned long long)cap, src);
        return NULL;
    }
    atomic_fetch_add(&s->refs, 1);
    return s;
}

/*  Maps the segment src announced in slot (under rx_lock), replacing the one
    that was there. 0, or -1 with the error set. */
static int rx_map(int src, uint32_t slot, uint32_t fd, uint64_t token, uint64_t cap)
{
    if (!rx || rx[src].pid == 0)
        return zd_error_set("its offer was not accepted");
    if (slot >= RPC_SHM_MAX_SEGS || cap == 0 || cap > RPC_SHM_PEER_BYTES)
        return zd_error_set("segment %u of %llu bytes", slot, (unsigned long long)cap);
    uint8_t *map = open_remote(rx[src].pid, fd, token, cap, src, my_rank);
    if (!map)
        return -1;
    rx_seg_t *s = malloc(sizeof *s);
    if (!s) {
        munmap(map, SHM_HEADER + cap);
        return zd_error_set_code(ZD_ERR_NO_MEMORY, "out of memory for a segment");
    }
    *s = (rx_seg_t){.map = map, .len = SHM_HEADER + cap, .token = token, .cap = cap};
    atomic_init(&s->refs, 1);
    rx_unref(rx[src].segs[slot]);
    rx[src].segs[slot] = s;
    return 0;
}

static void release_frames(rpc_frame_t *frames, int n)
{
    for (int i = 0; i < n; i++)
        if (frames[i].release)
            frames[i].release(frames[i].data, frames[i].release_arg);
}

/*  Checks m's table and maps its segments into segs[]. Returns the count,
    or -1 (error set; the segments it found are let go). */
static int map_table(zd__net_t *n, inmsg_t *m, rx_seg_t **segs, const uint8_t **entries)
{
    const rpc_frame_t *t = &m->frames[m->n - 1];
    const uint8_t *p = t->data;
    if (t->size < 8)
        return zd_error_set("wire: shared-memory table of %zu bytes", t->size);
    uint32_t count = (uint32_t)get(p, 4);
    if (count < 1 || count > RPC_SHM_MAX_SEGS || count > (uint32_t)(m->n - 1) ||
        t->size != 8 + (size_t)RPC_SHM_ENTRY * count || get(p + 4, 4) != 0)
        return zd_error_set("wire: shared-memory table of %zu bytes for %u tensors", t->size,
                            count);
    int64_t last = -1;
    for (uint32_t i = 0; i < count; i++) {
        const uint8_t *e = p + 8 + (size_t)RPC_SHM_ENTRY * i;
        uint64_t frame = get(e, 4), bytes = get(e + 32, 8), cap = get(e + 24, 8);
        if ((int64_t)frame <= last || frame >= (uint64_t)(m->n - 1) || m->frames[frame].size != 0 ||
            bytes == 0 || bytes > cap || get(e + 12, 4) != 0)
            return zd_error_set("wire: shared-memory table entry %u (frame %llu, %llu bytes) "
                                "is not valid",
                                i, (unsigned long long)frame, (unsigned long long)bytes);
        last = (int64_t)frame;
        entries[i] = e;
    }
    int got = 0;
    pthread_mutex_lock(&rx_lock);
    if (!rx || m->src < 0 || m->src >= world || rx[m->src].pid == 0) {
        zd_error_set("a tensor in shared memory from a peer whose offer was not accepted");
    } else {
        for (; got < (int)count; got++)
            if (!(segs[got] = rx_segment(m->src, entries[got])))
                break;
    }
    pthread_mutex_unlock(&rx_lock);
    if (got == (int)count)
        return got;
    for (int i = 0; i < got; i++)
        segment_release(NULL, segs[i]);
    (void)n;
    return -1;
}

int zd__shm_filter(zd__net_t *n, void *sock, inmsg_t *m)
{
    if (!(m->h.flags & RPC_WIRE_F_SHM))
        return 1;
    rx_seg_t *segs[RPC_SHM_MAX_SEGS];
    const uint8_t *entries[RPC_SHM_MAX_SEGS];
    int count = map_table(n, m, segs, entries);
    if (count < 0) {
        int type = m->h.type;
        uint64_t id = m->h.id;
        zd__log(ZD_LOG_WARN, "rpc: dropped a bad message from rank %d: %s", m->src,
                zd_error_last());
        release_frames(m->frames, m->n);
        m->n = 0;
        zmq_msg_close(&m->hm);
        if (sock == n->router && (type == RPC_MSG_CALL || type == RPC_MSG_REMOTE)) {
            snprintf(m->reject, sizeof m->reject, "bad message: %s", zd_error_last());
            m->reject_id = id;
        } else if (type == RPC_MSG_REPLY) {
            n->up.fail_answer(n->up.arg, id, m->src, zd_error_last(),
                              zd_error_code() == ZD_ERR_NO_MEMORY ? ZD_ERR_NO_MEMORY
                                                                  : ZD_ERR_OTHER);
        }
        return -1;
    }
    atomic_thread_fence(memory_order_acquire);
    for (int i = 0; i < count; i++) {
        rpc_frame_t *f = &m->frames[get(entries[i], 4)];
        if (f->release)
            f->release(f->data, f->release_arg); /* the empty placeholder */
        *f = (rpc_frame_t){.data = segs[i]->map + SHM_HEADER,
                           .size = (size_t)get(entries[i] + 32, 8),
                           .release = segment_release,
                           .release_arg = segs[i],
                           .peer_writable = true};
    }
    uint64_t bytes = 0;
    for (int i = 0; i < count; i++)
        bytes += get(entries[i] + 32, 8);
    atomic_fetch_add_explicit(&n->peers[m->src].m.bytes_received, (int64_t)bytes,
                              memory_order_relaxed);
    rpc_frame_t *table = &m->frames[m->n - 1];
    table->release(table->data, table->release_arg);
    m->n--;
    m->h.n_tensors = (uint32_t)m->n;
    m->h.flags &= (uint16_t)~RPC_WIRE_F_SHM;
    atomic_fetch_add(&n_received, 1);
    return 1;
}

/*  ---- the handshake ---- */

static void answer_offer(zd__net_t *n, int src, bool yes)
{
    rpc_wire_header_t h = {.type = RPC_MSG_SHM_ACCEPT,
                           .flags = RPC_WIRE_F_INTERNAL,
                           .id = zd__net_new_id(n),
                           .a = yes};
    if (zd__transport_send(n, src, &h, NULL, 0) < 0)
        zd__log(ZD_LOG_DEBUG, "rpc: cannot answer rank %d's shared-memory offer: %s", src,
                zd_error_last());
}

static void queue_answer(zd__net_t *n, int src, bool yes)
{
    pthread_mutex_lock(&answer_lock);
    bool now = connected;
    if (!now && pending)
        pending[src] = yes ? 1 : -1;
    pthread_mutex_unlock(&answer_lock);
    if (now)
        answer_offer(n, src, yes);
}

/*  Why the offer of another process cannot be taken, or NULL. */
static const char *offer_mismatch(const identity_t *o)
{
    if (memcmp(o->magic, SHM_OFFER_MAGIC, 8) != 0)
        return "a malformed offer";
    if (memcmp(o->boot_id, me.boot_id, sizeof me.boot_id) != 0)
        return "another host";
    if (o->net_dev != me.net_dev || o->net_ino != me.net_ino)
        return "another network namespace";
    if (o->mnt_dev != me.mnt_dev || o->mnt_ino != me.mnt_ino)
        return "another mount namespace";
    if (o->pid_dev != me.pid_dev || o->pid_ino != me.pid_ino)
        return "another pid namespace";
    if (o->uid != me.uid)
        return "another user";
    return NULL;
}

static void handle_offer(zd__net_t *n, inmsg_t *m)
{
    int src = m->src;
    const char *why = NULL;
    identity_t o;
    if (!atomic_load(&enabled))
        why = "shared memory is off here (ZDIST_SHM=0 or no memfd)";
    else if (m->h.extra_len != sizeof o)
        why = "a malformed offer";
    if (!why) {
        memcpy(&o, m->h.extra, sizeof o);
        why = offer_mismatch(&o);
    }
    if (!why) {
        uint8_t *probe = open_remote(o.pid, o.probe_fd, o.probe_token, 0, src, -1);
        if (probe)
            munmap(probe, SHM_HEADER);
        else
            why = zd_error_last();
    }
    if (why) {
        zd__log(ZD_LOG_INFO,
                "rpc: tensors from \"%s\" (rank %d) come over ZeroMQ, not shared "
                "memory: %s",
                n->peers[src].name, src, why);
        queue_answer(n, src, false);
        return;
    }
    pthread_mutex_lock(&rx_lock);
    if (rx) {
        /* A new process under that rank: what the old one sent is gone. */
        for (int k = 0; k < RPC_SHM_MAX_SEGS; k++) {
            rx_unref(rx[src].segs[k]);
            rx[src].segs[k] = NULL;
        }
        rx[src].pid = o.pid;
    }
    pthread_mutex_unlock(&rx_lock);
    zd__log(ZD_LOG_DEBUG, "rpc: tensors from \"%s\" (rank %d) may come through shared memory",
            n->peers[src].name, src);
    queue_answer(n, src, true);
}

/*  A peer announced a segment: map it now, checked, and say whether, so
    that its messages name only segments mapped here. A failure (a segment
    that is not what it says, or no descriptor left to open it) costs
    nothing but the shared memory: the peer sends the ZeroMQ way. */
static void handle_segment(zd__net_t *n, inmsg_t *m)
{
    int src = m->src;
    const char *why = NULL;
    if (!atomic_load(&enabled))
        why = "shared memory is off here";
    else if (m->h.extra_len != 16 || get(m->h.extra + 4, 4) != 0)
        why = "a malformed announcement";
    if (!why) {
        pthread_mutex_lock(&rx_lock);
        if (rx_map(src, (uint32_t)m->h.a, (uint32_t)get(m->h.extra, 4), m->h.b,
                   get(m->h.extra + 8, 8)) < 0)
            why = zd_error_last();
        pthread_mutex_unlock(&rx_lock);
    }
    char answer[1 + 200];
    answer[0] = why == NULL;
    size_t len = 1;
    if (why) {
        len += (size_t)snprintf(answer + 1, sizeof answer - 1, "%s", why);
        len = len < sizeof answer ? len : sizeof answer - 1;
        zd__log(ZD_LOG_WARN,
                "rpc: tensors from \"%s\" (rank %d) come over ZeroMQ, not shared "
                "memory: its segment %llu: %s",
                n->peers[src].name, src, (unsigned long long)m->h.a, why);
        /* Counted after the line: whoever sees the count sees the line
           (test_hostile_shm read an empty one in between). */
        atomic_fetch_add(&n_refused, 1);
    }
    rpc_wire_header_t h = {.type = RPC_MSG_SHM_MAPPED,
                           .flags = RPC_WIRE_F_INTERNAL,
                           .id = zd__net_new_id(n),
                           .a = m->h.a,
                           .b = m->h.b,
                           .extra = (const uint8_t *)answer,
                           .extra_len = len};
    if (zd__transport_send(n, src, &h, NULL, 0) < 0)
        zd__log(ZD_LOG_DEBUG, "rpc: cannot answer rank %d's segment: %s", src, zd_error_last());
}

/*  The answer to an announcement: the segment serves once mapped; a peer
    that could not map it gets the ZeroMQ way from now on. */
static void handle_mapped(zd__net_t *n, inmsg_t *m)
{
    int src = m->src;
    bool ok = m->h.extra_len >= 1 && m->h.extra[0] == 1;
    tx_peer_t *p = &tx[src];
    bool ours = false;
    pthread_mutex_lock(&p->lock);
    for (int k = 0; k < p->n_segs; k++)
        if ((uint64_t)k == m->h.a && p->segs[k].token == m->h.b) {
            atomic_store(&p->segs[k].mapped, ok ? 1 : -1);
            ours = true;
        }
    pthread_mutex_unlock(&p->lock);
    if (ours && !ok) {
        atomic_store(&p->state, -1);
        zd__log(ZD_LOG_WARN,
                "rpc: tensors to \"%s\" (rank %d) go over ZeroMQ: it could not "
                "map a shared segment (%.*s)",
                n->peers[src].name, src, (int)(m->h.extra_len > 1 ? m->h.extra_len - 1 : 0),
                m->h.extra_len > 1 ? (const char *)m->h.extra + 1 : "");
    }
}

void zd__shm_handle(zd__net_t *n, inmsg_t *m)
{
    release_frames(m->frames, m->n);
    m->n = 0;
    int src = m->src;
    if (src < 0 || src >= world || src == my_rank || !tx)
        return;
    if (m->h.type == RPC_MSG_SHM_SEGMENT) {
        handle_segment(n, m);
    } else if (m->h.type == RPC_MSG_SHM_MAPPED) {
        handle_mapped(n, m);
    } else if (m->h.type == RPC_MSG_SHM_OFFER) {
        handle_offer(n, m);
    } else if (m->h.type == RPC_MSG_SHM_ACCEPT && atomic_load(&enabled)) {
        atomic_store(&tx[src].state, m->h.a == 1 ? 1 : -1);
        zd__log(ZD_LOG_DEBUG, "rpc: rank %d %s shared memory", src,
                m->h.a == 1 ? "accepted" : "refused");
    }
}

int zd__shm_peer_state(int peer)
{
    if (!atomic_load(&enabled) || !tx || peer < 0 || peer >= world)
        return 0;
    return atomic_load(&tx[peer].state);
}

void zd__shm_stats(long *sent, long *received, long *fallbacks, long *made, long *refused)
{
    if (refused)
        *refused = atomic_load(&n_refused);
    if (sent)
        *sent = atomic_load(&n_sent);
    if (received)
        *received = atomic_load(&n_received);
    if (fallbacks)
        *fallbacks = atomic_load(&n_fallbacks);
    if (made)
        *made = atomic_load(&n_made);
}
