/* SPDX-License-Identifier: MIT */
/*  A member that makes itself the holder of RRefs it was never given
    (issue 24 point 5), in a world of real processes.

    Rank 0 owns two RRefs held by rank 1 alone: one rank 1 created with
    remote() (its value 4242), one rank 0 made and sent it (5151). Rank 2,
    a member of the world, plays the intruder with a raw socket in its own
    name and sends the RREF_FORK_REQUEST a child would send, for a fork id
    it made up, then an RREF_FETCH:
      1. guessing the RRefs' ids, as ids that count up from 1 allowed
         (every id of ranks 0 and 1 up to GUESSES);
      2. knowing them (leaked), naming as the fork's maker itself, the
         owner, or nobody who holds the RRef.
    No fetch may return a value; each forged request is refused with an
    error (at once for an id the owner made and does not hold; those that
    wait for their parent to become a holder, once they have waited as
    long as a placeholder would), and the owner logs a line naming rank 2. Then rank 1 still reads its value, releases both RRefs,
    and the owner frees them: nothing the intruder did holds them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zdist/error.h>
#include <zdist/log.h>
#include <zdist/rpc.h>

#include "rpc/agent/rref.h"
#include "tests/support/handlers.h"
#include "tests/support/intruder.h"
#include "tests/support/world.h"
#include "rpc/value/args.h"

#define GUESSES 400 /* ids tried per creator rank */
#define WAIT_MS 300 /* the forged requests' timeout: how long they may wait */

/*  ---- rank 0: the owner ---- */

static zd_value_t *h_secret(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return zd_value_int(4242);
}

/*  An RRef owned here, sent to the caller (the owner forks it). */
static zd_value_t *h_make_rref(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    zd_value_t *v = zd_value_int(5151);
    zd_rref_t *r = zd_rref_new(v);
    zd_value_unref(v);
    zd_value_t *out = r ? zd_value_rref(r) : NULL;
    zd_rref_unref(r);
    return out;
}

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_text[256 * 1024];
static size_t log_len;

static void log_sink(zd_log_level_t level, const char *who, const char *line, void *arg)
{
    (void)level, (void)who, (void)arg;
    pthread_mutex_lock(&log_lock);
    int n = snprintf(log_text + log_len, sizeof log_text - log_len, "%s\n", line);
    if (n > 0 && log_len + (size_t)n < sizeof log_text)
        log_len += (size_t)n;
    pthread_mutex_unlock(&log_lock);
}

/*  "logged"(a, b): 1 when one of the owner's log lines holds both. */
static zd_value_t *h_logged(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)arg;
    const char *a, *b;
    if (zd_rpc_arg_string(args, 0, &a) < 0 || zd_rpc_arg_string(args, 1, &b) < 0)
        return NULL;
    bool found = false;
    pthread_mutex_lock(&log_lock);
    for (const char *p = log_text; p && *p && !found;) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)len, p);
        found = strstr(line, a) && strstr(line, b);
        p = end ? end + 1 : NULL;
    }
    pthread_mutex_unlock(&log_lock);
    return zd_value_int(found);
}

/*  ---- rank 1: the holder ---- */

static zd_rref_t *created, *given;

static int64_t int_value(zd_rref_t *r)
{
    zd_value_t *v = NULL;
    int64_t i = -1;
    if (zd_rref_to_here(r, -1, &v) == 0)
        zd_value_get_int(v, &i);
    zd_value_unref(v);
    return i;
}

/*  "prepare"() -> [created's id, given's id], both confirmed by the owner. */
static zd_value_t *h_prepare(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    zd_value_t *res = NULL;
    created = zd_rpc_remote(0, "secret", NULL, -1);
    if (!created || zd_rpc_sync(0, "make_rref", NULL, -1, &res) < 0 ||
        zd_value_get_rref(res, &given) < 0) {
        zd_value_unref(res);
        return NULL;
    }
    zd_rref_ref(given);
    zd_value_unref(res);
    if (int_value(created) != 4242 || int_value(given) != 5151)
        return NULL;
    return zd__rpc_args("ii", (int64_t)created->rref_id, (int64_t)given->rref_id);
}

/*  "finish"() -> 1 when the values are still there; releases both. */
static zd_value_t *h_finish(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    bool ok = int_value(created) == 4242 && int_value(given) == 5151;
    zd_rref_unref(created);
    zd_rref_unref(given);
    created = given = NULL;
    if (zd_rref_drain(world_scaled_ms(10000)) < 0)
        return NULL;
    return zd_value_int(ok);
}

static zd_value_t *h_drain(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    (void)call, (void)args, (void)arg;
    return zd_rref_drain(world_scaled_ms(10000)) < 0 ? NULL : zd_value_none();
}

static int setup(const world_t *w)
{
    if (w->rank == 0)
        zd_log_set_sink(log_sink, NULL);
    return zd_rpc_register("secret", h_secret, NULL) |
        zd_rpc_register("make_rref", h_make_rref, NULL) |
        zd_rpc_register("logged", h_logged, NULL) | zd_rpc_register("prepare", h_prepare, NULL) |
        zd_rpc_register("finish", h_finish, NULL) | zd_rpc_register("drain", h_drain, NULL) |
        zd_rpc_register_inline("owner_count", world_h_owner_count, NULL);
}

/*  ---- rank 2: the intruder ---- */

static uint64_t send_control(intruder_t *in, uint8_t type, uint64_t rref_id, uint64_t fork_id)
{
    rpc_wire_header_t h = {.type = type,
                           .src = in->rank,
                           .dst = 0,
                           .id = ++in->next_id,
                           .a = rref_id,
                           .b = fork_id,
                           .timeout_ms = WAIT_MS};
    return intruder_send(in, &h, 0, NULL, NULL) == 0 ? h.id : 0;
}

typedef struct {
    uint64_t id;
    const char *what; /* for the messages */
    bool fetch;
    int type; /* the answer's, -1 while none came */
    char text[512];
} sent_t;

/*  Waits for the answer of every request in s (at most n); 0 when all came
    and none of the fetches got a value. */
static int collect(intruder_t *in, sent_t *s, int n)
{
    int left = n, rc = 0;
    int64_t deadline = world_now_ms() + world_scaled_ms(30000);
    while (left > 0 && world_now_ms() < deadline) {
        intruder_answer_t ans;
        if (!intruder_answer(in, 500, &ans))
            continue;
        for (int i = 0; i < n; i++) {
            if (s[i].id != ans.id || s[i].type != -1)
                continue;
            s[i].type = ans.type;
            snprintf(s[i].text, sizeof s[i].text, "%s", ans.text);
            left--;
            int64_t v = 0;
            if (s[i].fetch && ans.type != RPC_MSG_ERROR) {
                zd_value_get_int(ans.value, &v);
                fprintf(stderr,
                        "rank 2: %s returned a value (%lld): the forged fork made rank "
                        "2 a holder\n",
                        s[i].what, (long long)v);
                rc = -1;
            }
            break;
        }
        intruder_answer_clear(&ans);
    }
    if (left > 0) {
        fprintf(stderr, "rank 2: %d of %d requests got no answer\n", left, n);
        return -1;
    }
    return rc;
}

/*  1: ids guessed. Forks in rank 2's name of every RRef id ranks 0 and 1
    would have made counting from 1, and a fetch of each. */
static int attack_guess(intruder_t *in)
{
    enum { N = 2 * GUESSES * 2 };
    sent_t *s = calloc(N, sizeof *s);
    WCHECK(s != NULL);
    int n = 0;
    for (uint64_t creator = 0; creator < 2; creator++)
        for (uint64_t k = 1; k <= GUESSES; k++) {
            uint64_t rref = creator << 48 | k;
            s[n] = (sent_t){send_control(in, RPC_MSG_RREF_FORK_REQUEST, rref,
                                         UINT64_C(2) << 48 | (0x7000 + k + creator * GUESSES)),
                            "a fork request", false, -1, ""};
            s[n + 1] =
                (sent_t){send_control(in, RPC_MSG_RREF_FETCH, rref, 0), "a fetch", true, -1, ""};
            WCHECK(s[n].id && s[n + 1].id);
            n += 2;
        }
    int rc = collect(in, s, n);
    free(s);
    return rc;
}

/*  2: ids known. */
static int attack_known(intruder_t *in, uint64_t created_id, uint64_t given_id)
{
    sent_t s[6] = {
        {send_control(in, RPC_MSG_RREF_FORK_REQUEST, created_id, UINT64_C(2) << 48 | 0xabc),
         "a fork of its own of the created RRef", false, -1, ""},
        {send_control(in, RPC_MSG_RREF_FETCH, created_id, 0), "a fetch of the created RRef", true,
         -1, ""},
        {send_control(in, RPC_MSG_RREF_FORK_REQUEST, created_id, UINT64_C(0) << 48 | 0xabd),
         "a fork in the owner's name", false, -1, ""},
        {send_control(in, RPC_MSG_RREF_FORK_REQUEST, given_id, UINT64_C(2) << 48 | 0xabe),
         "a fork of its own of the given RRef", false, -1, ""},
        {send_control(in, RPC_MSG_RREF_FETCH, given_id, 0), "a fetch of the given RRef", true, -1,
         ""},
        {send_control(in, RPC_MSG_RREF_FETCH, created_id, 0), "a second fetch", true, -1, ""},
    };
    for (int i = 0; i < 6; i++)
        WCHECK(s[i].id != 0);
    WCHECK(collect(in, s, 6) == 0);
    for (int i = 0; i < 6; i++)
        if (s[i].type != RPC_MSG_ERROR) {
            fprintf(stderr, "rank 2: %s was accepted\n", s[i].what);
            return -1;
        }
    WCHECK(strstr(s[0].text, "rank 2, which made the fork, holds no fork of that RRef"));
    WCHECK(strstr(s[2].text, "forks made by the owner (rank 0)"));
    WCHECK(strstr(s[3].text, "rank 2, which made the fork, holds no fork of that RRef"));
    return 0;
}

static int64_t call_ints(int to, const char *fn, zd_value_t *args, int64_t *second)
{
    zd_value_t *r = NULL;
    int64_t v = -1;
    if (zd_rpc_sync(to, fn, args, -1, &r) == 0 && zd_value_kind(r) == ZD_VALUE_LIST) {
        zd_rpc_arg_int(r, 0, &v);
        if (second)
            zd_rpc_arg_int(r, 1, second);
    } else if (r) {
        zd_value_get_int(r, &v);
    }
    zd_value_unref(r);
    zd_value_unref(args);
    return v;
}

static int intruder(const world_t *w)
{
    int64_t created_id = 0, given_id = 0;
    created_id = call_ints(1, "prepare", NULL, &given_id);
    WCHECK(created_id > 0 && given_id > 0);
    zd_rpc_worker_info_t info;
    WCHECK(zd_rpc_get_worker_info_by_rank(0, &info) == 0);
    intruder_t in;
    WCHECK(intruder_open_as(&in, info.endpoint, 2, 65534) == 0);
    int rc = attack_guess(&in);
    if (rc == 0)
        rc = attack_known(&in, (uint64_t)created_id, (uint64_t)given_id);
    intruder_close(&in);
    WCHECK(rc == 0);
    WCHECK(call_ints(0, "logged", zd__rpc_args("ss", "(rank 2)", "holds no fork of that RRef"),
                     NULL) == 1);
    WCHECK(call_ints(0, "logged", zd__rpc_args("ss", "(rank 2)", "forks made by the owner"),
                     NULL) == 1);
    /* The holder still has both values; once it lets go, the owner frees
       them: no forged fork keeps them. */
    WCHECK(call_ints(1, "finish", NULL, NULL) == 1);
    for (int r = 0; r < w->world_size; r++) {
        zd_value_t *res = NULL;
        WCHECK(zd_rpc_sync(r, "drain", NULL, -1, &res) == 0);
        zd_value_unref(res);
    }
    int64_t deadline = world_now_ms() + world_scaled_ms(10000), owned = -1;
    while ((owned = world_call_int(0, "owner_count")) != 0 && world_now_ms() < deadline) {
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    if (owned != 0)
        return world_fail(w,
                          "the owner still holds %lld value(s) after rank 1 released its "
                          "RRefs",
                          (long long)owned);
    return 0;
}

/*  Ranks 0 and 1 serve until rank 2 is done (the harness's graceful
    shutdown waits for it); rank 0's log sink stays for that time. */
static int run(const world_t *w)
{
    return w->rank == 2 ? intruder(w) : 0;
}

static void test_forged_fork_requests_make_no_holder(void **state)
{
    (void)state;
    world_options_t o = {.world_size = 3, .setup = setup, .fn = run, .timeout_s = 120};
    assert_int_equal(world_run(&o), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forged_fork_requests_make_no_holder),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
