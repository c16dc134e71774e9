/* SPDX-License-Identifier: MIT */
/*  launch_env.c: a process's rank, world size and rendezvous from the
    variables its launcher set (zd_rpc_env_resolve), so that a program runs
    unchanged under tools/launch, torchrun, srun/sbatch, mpirun or by hand.

    Order (docs/launch.md): an argument; then the generic variables
    (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, which torchrun
    and tools/launch set and a user may set over any launcher); then the
    innermost launcher's own. Slurm comes last because its variables are
    inherited by everything started inside an allocation: an mpirun in a
    batch script hands every rank SLURM_PROCID=0, while OMPI_COMM_WORLD_RANK
    is set only by the mpirun that started the process. */
#include "rpc/world/options.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include "core/sized.h"
#include "rpc/net/wire.h"

/*  Ports derived from a job id fall in [10000, 30000): below Linux's
    ephemeral range (32768 and up), so they never meet the ports the kernel
    hands out, and consecutive jobs sharing a host get different ones. */
#define DERIVED_PORT_BASE 10000
#define DERIVED_PORT_SPAN 20000

/*  One launcher's variables; NULL where it has none. */
typedef struct {
    const char *name;
    const char *rank, *size, *local_rank, *local_size;
} launcher_t;

static const launcher_t TORCHRUN = {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                    "LOCAL_WORLD_SIZE"};
static const launcher_t GENERIC = {"env", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
static const launcher_t OPENMPI = {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                   "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};
static const launcher_t PMIX = {"pmix", "PMIX_RANK", NULL, NULL, NULL};
static const launcher_t SLURM = {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL};

static const char *env_str(const char *var)
{
    const char *s = var ? getenv(var) : NULL;
    return s && *s ? s : NULL;
}

int zd__rpc_env_long(const char *var, long lo, long hi, long *out)
{
    const char *s = env_str(var);
    if (!s)
        return 0;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s=\"%s\" is not an integer in [%ld, %ld]", var,
                                 s, lo, hi);
    *out = v;
    return 1;
}

/*  Fills *value from the first of the variables set, when it is still unset
    (*from NULL), and names it in *from. 0, or -1 for a malformed one. */
static int take_int(const char *var, long lo, long hi, int *value, const char **from)
{
    long v;
    int rc;
    if (*from || !var || (rc = zd__rpc_env_long(var, lo, hi, &v)) == 0)
        return 0;
    if (rc < 0)
        return -1;
    *value = (int)v;
    *from = var;
    return 0;
}

/*  The first host of a Slurm host list, with the bracket ranges expanded:
    "node[01-04,07],gpu3" gives "node01", "a-[1-2]b" gives "a-1b" (the low
    end as written, so zero padding stays). 0, or -1 naming var. */
static int slurm_first_host(const char *var, const char *list, char *out, size_t size)
{
    size_t n = 0;
    bool in_brackets = false, past_first = false, digits = false;
    const char *p;
    for (p = list; *p && (in_brackets || *p != ','); p++) {
        char c = *p;
        if (c == '[') {
            if (in_brackets)
                break;
            in_brackets = true;
            past_first = digits = false;
        } else if (c == ']') {
            if (!in_brackets || !digits)
                break;
            in_brackets = false;
        } else if (in_brackets) {
            if (c == ',' || c == '-')
                past_first = true;
            else if (c < '0' || c > '9')
                break;
            else if (!past_first) {
                digits = true;
                if (n + 1 < size)
                    out[n++] = c;
            }
        } else if (c <= ' ' || c == ']') {
            break;
        } else if (n + 1 < size) {
            out[n++] = c;
        }
    }
    out[n < size ? n : 0] = '\0';
    if ((*p && *p != ',') || in_brackets || n == 0)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "%s=\"%s\" is not a Slurm host list (like node[01-04,07],gpu3)",
                                 var, list);
    if (n + 1 >= size)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "%s: first host name too long", var);
    return 0;
}

/*  A port in [DERIVED_PORT_BASE, +SPAN) from a job id variable (divided by
    div first). 1 when derived, 0 when the variable is unset, -1 malformed. */
static int derived_port(const char *var, long div, int *port)
{
    long id;
    int rc = zd__rpc_env_long(var, 0, 4294967295L, &id);
    if (rc == 1)
        *port = DERIVED_PORT_BASE + (int)((id / div) % DERIVED_PORT_SPAN);
    return rc;
}

/*  The launcher that started this process: the innermost one whose
    variables are present. */
static const launcher_t *detect(void)
{
    if (env_str("TORCHELASTIC_RUN_ID"))
        return &TORCHRUN;
    if (env_str("RANK"))
        return &GENERIC;
    if (env_str("OMPI_COMM_WORLD_RANK"))
        return &OPENMPI;
    if (env_str("PMIX_RANK"))
        return &PMIX;
    if (env_str("SLURM_PROCID"))
        return &SLURM;
    return NULL;
}

/*  Slurm's PMIx plugin names its namespaces "slurm.pmix.<job>.<step>": then
    the Slurm variables describe the same step as PMIX_RANK. */
static bool pmix_under_slurm(void)
{
    const char *ns = env_str("PMIX_NAMESPACE");
    return ns && !strncmp(ns, "slurm.pmix.", 11);
}

static int master_addr(const launcher_t *L, const char *arg, zd_rpc_env_t *e)
{
    if (arg && *arg) {
        if (strlen(arg) >= sizeof e->master_addr)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "master address too long");
        snprintf(e->master_addr, sizeof e->master_addr, "%s", arg);
        e->master_addr_from = "the arguments";
        return 0;
    }
    const char *s = env_str("MASTER_ADDR");
    if (s) {
        if (strlen(s) >= sizeof e->master_addr)
            return zd_error_set_code(ZD_ERR_ARGUMENT, "MASTER_ADDR is too long");
        snprintf(e->master_addr, sizeof e->master_addr, "%s", s);
        e->master_addr_from = "MASTER_ADDR";
        return 0;
    }
    if (L == &SLURM) {
        const char *var =
            env_str("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
        if (!(s = env_str(var)))
            return 0;
        if (slurm_first_host(var, s, e->master_addr, sizeof e->master_addr) < 0)
            return -1;
        e->master_addr_from = var;
    } else if (L == &OPENMPI && e->world_size > 0 && e->local_world_size > 0) {
        /* The whole world on this host; across hosts, which one runs rank
           0 is known to mpirun's runtime only. */
        if (e->local_world_size < e->world_size)
            return zd_error_set_code(ZD_ERR_ARGUMENT,
                                     "Open MPI runs this world across hosts (%s=%d of %s=%d) and "
                                     "MASTER_ADDR is not set: set it to rank 0's host "
                                     "(mpirun -x MASTER_ADDR=host ...)",
                                     e->local_world_size_from, e->local_world_size,
                                     e->world_size_from, e->world_size);
        snprintf(e->master_addr, sizeof e->master_addr, "127.0.0.1");
        e->master_addr_from = e->local_world_size_from;
    }
    return 0;
}

static int master_port(const launcher_t *L, int arg, zd_rpc_env_t *e)
{
    long v;
    int rc;
    if (arg != 0) {
        e->master_port = arg;
        e->master_port_from = "the arguments";
        return 0;
    }
    if ((rc = take_int("ZDIST_MASTER_PORT", 1, 65535, &e->master_port, &e->master_port_from)) < 0 ||
        e->master_port_from)
        return rc;
    if (L == &TORCHRUN) {
        /* torchrun's agent on the first node hosts its TCP store on
           MASTER_PORT and keeps it open while the workers run. */
        if ((rc = zd__rpc_env_long("MASTER_PORT", 1, 65534, &v)) <= 0)
            return rc;
        e->master_port = (int)v + 1;
        e->master_port_from = "MASTER_PORT+1";
        return 0;
    }
    if ((rc = take_int("MASTER_PORT", 1, 65535, &e->master_port, &e->master_port_from)) < 0 ||
        e->master_port_from)
        return rc;
    if (L == &SLURM) {
        if ((rc = derived_port("SLURM_JOB_ID", 1, &e->master_port)) == 1)
            e->master_port_from = "SLURM_JOB_ID";
    } else if (L == &OPENMPI) {
        /* The upper 16 bits of Open MPI's job id hash mpirun's host and
           pid: every rank of one mpirun sees the same, another mpirun on the
           host most likely not. */
        if ((rc = derived_port("OMPI_MCA_ess_base_jobid", 65536, &e->master_port)) == 1)
            e->master_port_from = "OMPI_MCA_ess_base_jobid";
    }
    return rc < 0 ? -1 : 0;
}

/*  Appends printf-style text to e->summary. */
static void say(zd_rpc_env_t *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(zd_rpc_env_t *e, const char *fmt, ...)
{
    size_t n = strlen(e->summary);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->summary + n, sizeof e->summary - n, fmt, ap);
    va_end(ap);
}

static const char *or_nothing(const char *from)
{
    return from ? from : "nothing";
}

static bool same(const char *a, const char *b)
{
    return !strcmp(or_nothing(a), or_nothing(b));
}

static void summarize(zd_rpc_env_t *e)
{
    e->summary[0] = '\0';
    if (e->rank >= 0)
        say(e, "rank %d", e->rank);
    else
        say(e, "rank ?");
    if (e->world_size > 0)
        say(e, " of %d", e->world_size);
    say(e, " from %s", or_nothing(e->rank_from));
    if (!same(e->world_size_from, e->rank_from))
        say(e, ", world size from %s", or_nothing(e->world_size_from));
    if (e->local_rank >= 0)
        say(e, ", local rank %d from %s", e->local_rank, e->local_rank_from);
    /* Rank 0 without one listens on every interface (rendezvous.c). */
    say(e, ", master %s:", e->master_addr[0] ? e->master_addr : e->rank == 0 ? "*" : "?");
    if (e->master_port > 0)
        say(e, "%d", e->master_port);
    else
        say(e, "?");
    if (same(e->master_addr_from, e->master_port_from))
        say(e, " from %s", or_nothing(e->master_addr_from));
    else
        say(e, " from %s/%s", or_nothing(e->master_addr_from), or_nothing(e->master_port_from));
    if (same(e->master_port_from, "MASTER_PORT+1"))
        say(e, " (torchrun's agent holds MASTER_PORT; ZDIST_MASTER_PORT picks another)");
    if (e->launcher)
        say(e, " [%s]", e->launcher);
}

static int resolve(int rank, int world_size, const char *addr, int port, zd_rpc_env_t *e)
{
    *e = (zd_rpc_env_t){.rank = -1, .local_rank = -1};
    if (port < 0 || port > 65535)
        return zd_error_set_code(ZD_ERR_ARGUMENT, "master port %d is not in [1, 65535]", port);
    const launcher_t *L = detect();
    /* Slurm's PMIx describes the srun step, whose Slurm variables say the
       rest; other PMIx servers say nothing more through the environment. */
    const launcher_t *rest = L == &PMIX && pmix_under_slurm() ? &SLURM : L;
    e->launcher = L ? L->name : NULL;
    if (rank >= 0) {
        e->rank = rank;
        e->rank_from = "the arguments";
    }
    if (world_size > 0) {
        e->world_size = world_size;
        e->world_size_from = "the arguments";
    }
    const long max_rank = RPC_WIRE_MAX_RANK;
    if (take_int("RANK", 0, max_rank, &e->rank, &e->rank_from) < 0 ||
        take_int(L ? L->rank : NULL, 0, max_rank, &e->rank, &e->rank_from) < 0 ||
        take_int("WORLD_SIZE", 1, max_rank + 1, &e->world_size, &e->world_size_from) < 0 ||
        take_int(rest ? rest->size : NULL, 1, max_rank + 1, &e->world_size, &e->world_size_from) <
            0 ||
        take_int("LOCAL_RANK", 0, max_rank, &e->local_rank, &e->local_rank_from) < 0 ||
        take_int(rest ? rest->local_rank : NULL, 0, max_rank, &e->local_rank, &e->local_rank_from) <
            0 ||
        take_int("LOCAL_WORLD_SIZE", 1, max_rank + 1, &e->local_world_size,
                 &e->local_world_size_from) < 0 ||
        take_int(rest ? rest->local_size : NULL, 1, max_rank + 1, &e->local_world_size,
                 &e->local_world_size_from) < 0)
        return -1;
    if (!e->world_size_from && L == &PMIX && rest == &PMIX)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "PMIX_RANK=%s is set but nothing gives the world size (PMIx keeps "
                                 "it in its server): set WORLD_SIZE",
                                 env_str("PMIX_RANK"));
    if (e->rank_from && e->world_size_from && e->rank >= e->world_size)
        return zd_error_set_code(ZD_ERR_ARGUMENT,
                                 "rank %d is outside the world of size %d (rank from %s, world "
                                 "size from %s)",
                                 e->rank, e->world_size, e->rank_from, e->world_size_from);
    if (master_addr(rest, addr, e) < 0 || master_port(rest, port, e) < 0)
        return -1;
    summarize(e);
    return 0;
}

int zd_rpc_env_resolve(int rank, int world_size, const char *addr, int port, zd_rpc_env_t *env,
                       size_t size)
{
    const size_t min = ZD__SIZE_THROUGH(zd_rpc_env_t, summary);
    zd_rpc_env_t e;
    if (!env || size < min) /* refused before anything is read */
        return zd__sized_write(env, size, &e, sizeof e, min, "zd_rpc_env_resolve: zd_rpc_env_t");
    if (resolve(rank, world_size, addr, port, &e) < 0)
        return -1;
    return zd__sized_write(env, size, &e, sizeof e, min, "zd_rpc_env_resolve: zd_rpc_env_t");
}
