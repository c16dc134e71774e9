/* SPDX-License-Identifier: MIT */
/*  flags.h: command-line flags of the example programs, "--name=value" or
    "--name value", as the PyTorch tutorials' argparse accepts them. */
#ifndef ZDIST_EXAMPLES_FLAGS_H
#define ZDIST_EXAMPLES_FLAGS_H

#include <stdbool.h>
#include <stdint.h>

#include <zdist/rpc.h>

/*  FLAG_COUNT (at least 1), FLAG_INDEX (0 or more) and FLAG_PORT (1 to
    65535) are integers whose variable may hold a value outside that range
    to mean "not given" (the world flags: the launcher's then): a user who
    types such a value is refused, not silently given the default. */
typedef enum {
    FLAG_INT,
    FLAG_DOUBLE,
    FLAG_STRING,
    FLAG_BOOL,
    FLAG_COUNT,
    FLAG_INDEX,
    FLAG_PORT
} flag_type_t;

typedef struct {
    const char *name; /* without the leading "--" */
    flag_type_t type;
    void *ptr; /* int64_t * (every integer type), double *, const char **, bool * */
    const char *help;
} flag_t;

/*  Parses argv into the flags' variables (which hold the defaults). Prints
    usage and returns 1 for --help; prints a clear message naming the flag
    and returns -1 for an unknown flag, a missing value, a malformed
    number, a number that is not finite (nan, inf) or an integer outside
    its type's range; returns 0 otherwise. */
int flags_parse(int argc, char **argv, const flag_t *flags, int n, const char *summary);

/*  Prints the flags with their defaults/current values. */
void flags_usage(const char *prog, const flag_t *flags, int n, const char *summary);

/*  ---- the world flags of the distributed programs ----
    --rank, --world_size, --master_addr and --master_port. What the flags
    leave unset comes from the variables the launcher set (tools/launch,
    torchrun, srun/sbatch, mpirun: zd_rpc_env_resolve in <zdist/rpc.h>),
    then from the defaults. */

typedef struct {
    int64_t rank;            /* -1 (unset): the launcher's (required somewhere) */
    int64_t world_size;      /* 0 (unset): the launcher's, else the program's default */
    const char *master_addr; /* NULL: the launcher's, else "localhost" (rank 0: none, it
                                   listens on every interface) */
    int64_t master_port;     /* 0 (unset): the launcher's, else 29500 */
    const char *metrics;     /* NULL: $ZDIST_METRICS (a folder for the counters), or none */
    const char *listen_addr; /* NULL: $ZDIST_LISTEN_ADDR, else the address routing to rank 0 */
    const char *key_file;    /* NULL: $ZDIST_KEY_FILE, else the default world key if any */
    bool insecure;           /* run without a key off loopback too ($ZDIST_INSECURE=1) */
    int64_t rpc_timeout_s;   /* 0: $ZDIST_RPC_TIMEOUT_S, else the library's 60 s */
    zd_rpc_env_t env;        /* set by flags_world_resolve: where each came from */
} flags_world_t;

/*  The flag_t entries, to put in a program's flags array. Given, a rank
    is 0 or more, a world size 1 or more and a port in 1..65535 (issue 24
    point 9: --world_size=0 used to mean "unset"). */
#define FLAGS_WORLD(w)                                                                             \
    {"rank", FLAG_INDEX, &(w).rank, "this process's rank (unset: the launcher's, e.g. $RANK)"},    \
        {"world_size", FLAG_COUNT, &(w).world_size,                                                \
         "number of processes (unset: the launcher's, else what the program's layout needs)"},     \
        {"master_addr", FLAG_STRING, &(w).master_addr,                                             \
         "rank 0's address (unset: the launcher's, else localhost; rank 0 then listens on "        \
         "every interface)"},                                                                      \
        {"master_port", FLAG_PORT, &(w).master_port,                                               \
         "rank 0's rendezvous port (unset: the launcher's, else 29500)"},                          \
        {"metrics", FLAG_STRING, &(w).metrics,                                                     \
         "folder where each process writes its RPC counters as JSON lines ($ZDIST_METRICS)"},      \
        {"listen_addr", FLAG_STRING, &(w).listen_addr,                                             \
         "IP address (IPv4 or IPv6) this process listens on and advertises ($ZDIST_LISTEN_ADDR; "  \
         "unset: the one that routes to rank 0)"},                                                 \
        {"key_file", FLAG_STRING, &(w).key_file,                                                   \
         "world key made by zdist-keygen (tools/keygen in a build): every connection "             \
         "authenticated and encrypted "                                                            \
         "(unset: $ZDIST_KEY_FILE, else ~/.config/zdist/world.key if it exists)"},                 \
        {"insecure", FLAG_BOOL, &(w).insecure,                                                     \
         "run without a world key even off loopback: no authentication, no encryption"},           \
    {                                                                                              \
        "rpc_timeout_s", FLAG_INT, &(w).rpc_timeout_s,                                             \
            "default timeout of a call, in seconds, as PyTorch's rpc_timeout (0: "                 \
            "$ZDIST_RPC_TIMEOUT_S, else 60)"                                                       \
    }

/*  Everything unset. */
flags_world_t flags_world_default(void);

/*  Fills in what the flags left unset from the launcher's environment
    (zd_rpc_env_resolve), then the defaults (default_size for the world
    size), and checks the result. Returns 0, or -1 with a message on stderr
    starting with prog: no rank anywhere, a malformed variable, a rank
    outside the world, a port outside 1..65535, a timeout outside 0..604800. */
int flags_world_resolve(flags_world_t *w, int64_t default_size, const char *prog);

/*  zd_rpc_init with the resolved flags (what came from the environment is
    left for zd_rpc_init to read again, so that its start line names the
    variables), name for this process and init_timeout_ms (< 0: the RPC
    default). 0, or -1 with "prog: rank N:
    zd_rpc_init: why" on stderr. */
int flags_world_init(const flags_world_t *w, const char *name, int64_t init_timeout_ms,
                     const char *prog);

#endif
