/* SPDX-License-Identifier: MIT */
/*  launch: starts a whole local world of one program, like torchrun for the
    programs of this project, or this node's share of a world
    spread over several nodes, like torchrun's static rendezvous:

        launch --nproc=4 [--master_port=P] -- prog [prog flags]
        launch --nnodes=2 --node_rank=K --master_addr=H --master_port=P
               --nproc_per_node=4 -- prog [prog flags]

    The process with local index i gets the global rank R = K * M + i (M
    processes per node) and runs "prog [prog flags] --rank=R --world_size=N
    --master_addr=A --master_port=P" (the flags are left out with
    --no_rank_flags) with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
    LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK and GROUP_WORLD_SIZE set, and
    the compute threads of the node's cores shared out (OPENBLAS_NUM_THREADS,
    ZDIST_NUM_THREADS). Every line a process writes is relayed with a
    "[rank R] " prefix, stdout to stdout and stderr to stderr, or goes to
    its own file with --log_dir. When one process fails the others are
    stopped (SIGTERM, then SIGKILL after --grace_s) and launch exits with the
    first failure's status (128+signal for a signal). Each node's launch
    stops only its own processes: those of the other nodes learn of the
    failure from RPC (their calls to the lost peers fail). With
    --max_restarts=N a failed process is instead started again in place (same
    rank, flags and environment, plus --resume when the program was given
    --checkpoint), at most N times per rank.

    This file: flags, finding the program, starting the ranks. Each rank
    leads its own process group, so that stopping it also stops whatever it
    started, and gets PR_SET_PDEATHSIG(SIGKILL), so that killing launch with
    SIGKILL kills the ranks. launch_world.c runs the world. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "tools/launch.h"

extern char **environ;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: launch --nproc=N [flags] [--] program [program flags]\n"
            "       launch --nnodes=N --node_rank=K --master_addr=A --master_port=P\n"
            "              --nproc_per_node=M [flags] [--] program [program flags]\n"
            "Starts ranks 0..N-1 of program on this machine (or ranks K*M..K*M+M-1 of a\n"
            "world of N*M spread over N nodes), relays their output with a \"[rank R] \"\n"
            "prefix, and stops all of them when one fails (or restarts it, with\n"
            "--max_restarts).\n"
            "Each rank gets \"--rank=R --world_size=N --master_addr=A --master_port=P\" after\n"
            "its flags, and RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK,\n"
            "LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE and ZDIST_RESTART_COUNT (how\n"
            "many times it was restarted) in its environment, and\n"
            "OPENBLAS_NUM_THREADS and ZDIST_NUM_THREADS (unless set) such that the\n"
            "processes of this node share its cores.\n\n"
            "flags:\n"
            "  --nproc=N          number of processes on this node, 1..%d (required)\n"
            "  --nproc_per_node=N the same\n"
            "  --nnodes=N         number of nodes (default: 1)\n"
            "  --node_rank=K      this node's rank, 0..N-1 (default: 0)\n"
            "  --master_addr=A    rendezvous address: node 0's (default: 127.0.0.1; required\n"
            "                     with --nnodes > 1)\n"
            "  --master_port=P    rendezvous port (default: a free port, picked on node 0;\n"
            "                     required on the other nodes)\n"
            "  --log_dir=D        each rank's stdout and stderr go to D/rank_RR.log\n"
            "  --no_rank_flags    pass the rank only through the environment\n"
            "  --grace_s=S        time between SIGTERM and SIGKILL when stopping (default: 5)\n"
            "  --timeout_s=S      stop the world after S seconds; 0: never (default: 0)\n"
            "  --max_restarts=N   restart a process that fails (non-zero exit or a signal)\n"
            "                     in place, at most N times per rank (unlike torchrun,\n"
            "                     which counts restarts of the whole group): same rank,\n"
            "                     flags and environment, plus --resume if the program's\n"
            "                     flags have --checkpoint and no --resume; what the dead\n"
            "                     process started is killed first. The others keep\n"
            "                     running. Once a rank's N restarts are used, its next\n"
            "                     failure stops the world (default: 0: the first failure\n"
            "                     does). Sets ZDIST_MASTER_WAIT_S=%s unless set, so that\n"
            "                     the others wait for a restarted rank 0\n"
            "  --help             this text\n\n"
            "exit status: 0 when every process finally exits 0; else the status of the\n"
            "failure that stopped the world (128+signal for a process killed by a\n"
            "signal), 130/143 when launch is interrupted by SIGINT/SIGTERM, 124 on\n"
            "timeout, 2 for bad flags.\n",
            MAX_PROCS, MASTER_WAIT_S);
}

static int bad_flag(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "launch: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, " (launch --help lists the flags)\n");
    return -1;
}

static int parse_int(const char *name, const char *v, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "launch: --%s expects an integer in %ld..%ld, got \"%s\"\n", name, lo, hi,
                v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int parse_seconds(const char *name, const char *v, double *out)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno || !isfinite(x) || x < 0 || x > 1e7) {
        fprintf(stderr, "launch: --%s expects a number of seconds >= 0, got \"%s\"\n", name, v);
        return -1;
    }
    *out = x;
    return 0;
}

/*  Whether a restarted process should get --resume: its flags (as the
    examples parse them: "--name=value" or "--name value") name checkpoints
    and do not say --resume already, in either form. */
static bool wants_resume(char *const *argv)
{
    bool checkpoint = false;
    for (int i = 1; argv[i]; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--resume") || !strncmp(a, "--resume=", 9))
            return false;
        if ((!strncmp(a, "--checkpoint=", 13) && a[13]) ||
            (!strcmp(a, "--checkpoint") && argv[i + 1]))
            checkpoint = true;
    }
    return checkpoint;
}

/*  Flags come first, as "--name=value" or "--name value"; the program starts
    after "--" or at the first argument that is not a flag. Returns 0, 1 for
    --help, -1 on a bad flag (message printed). */
static int parse_flags(launch_t *L, int argc, char **argv)
{
    static const char *const valued[] = {"nproc",       "nproc_per_node", "nnodes",  "node_rank",
                                         "master_addr", "master_port",    "log_dir", "grace_s",
                                         "timeout_s",   "max_restarts"};
    int i = 1;
    while (i < argc) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (a[0] != '-')
            break;
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return 1;
        if (strncmp(a, "--", 2) != 0)
            return bad_flag("unknown flag %s%s", a, "");
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        char key[32];
        if (len >= sizeof key)
            return bad_flag("unknown flag %s%s", a, "");
        memcpy(key, name, len);
        key[len] = '\0';
        if (!strcmp(key, "no_rank_flags")) {
            if (eq)
                return bad_flag("--%s takes no value, got \"%s\"", key, eq + 1);
            L->rank_flags = false;
            i++;
            continue;
        }
        bool known = false;
        for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++)
            known = known || !strcmp(key, valued[k]);
        if (!known)
            return bad_flag("unknown flag --%s%s", key, "");
        const char *v = eq ? eq + 1 : NULL;
        if (!v) {
            if (i + 1 >= argc)
                return bad_flag("--%s needs a value%s", key, "");
            v = argv[++i];
        }
        i++;
        int rc = 0;
        if (!strcmp(key, "nproc") || !strcmp(key, "nproc_per_node"))
            rc = parse_int(key, v, 1, MAX_PROCS, &L->nproc);
        else if (!strcmp(key, "nnodes"))
            rc = parse_int(key, v, 1, MAX_NODES, &L->nnodes);
        else if (!strcmp(key, "node_rank"))
            rc = parse_int(key, v, 0, MAX_NODES - 1, &L->node_rank);
        else if (!strcmp(key, "master_port"))
            rc = parse_int(key, v, 1, 65535, &L->master_port);
        else if (!strcmp(key, "grace_s"))
            rc = parse_seconds(key, v, &L->grace_s);
        else if (!strcmp(key, "timeout_s"))
            rc = parse_seconds(key, v, &L->timeout_s);
        else if (!strcmp(key, "max_restarts"))
            rc = parse_int(key, v, 0, MAX_RESTARTS, &L->max_restarts);
        else if (!*v)
            rc = bad_flag("--%s needs a non-empty value%s", key, "");
        else if (!strcmp(key, "log_dir"))
            L->log_dir = v;
        else {
            L->master_addr = v;
            L->addr_given = true;
        }
        if (rc < 0)
            return -1;
    }
    if (L->nproc == 0)
        return bad_flag("--nproc=N is required%s%s", "", "");
    if (L->node_rank >= L->nnodes) {
        fprintf(stderr, "launch: --node_rank=%d but --nnodes=%d: node ranks are 0..%d\n",
                L->node_rank, L->nnodes, L->nnodes - 1);
        return -1;
    }
    if (L->nnodes > 1 && !L->addr_given)
        return bad_flag("--nnodes > 1 needs --master_addr: the address of node 0, which the "
                        "other nodes reach%s%s",
                        "", "");
    if (L->node_rank > 0 && L->master_port == 0) {
        fprintf(stderr,
                "launch: --node_rank=%d needs --master_port: only node 0 may pick a "
                "free port (it prints it), the other nodes must be told\n",
                L->node_rank);
        return -1;
    }
    L->rank_base = L->node_rank * L->nproc;
    if (i >= argc)
        return bad_flag("no program to run: launch --nproc=N [flags] -- program%s%s", "", "");
    L->prog_argv = argv + i;
    L->prog_argc = argc - i;
    L->add_resume = wants_resume(L->prog_argv);
    return 0;
}

static bool is_executable_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/*  Resolves the program as execvp would, so that a missing one is reported
    once, up front, instead of by every rank. */
static int find_program(launch_t *L)
{
    const char *name = L->prog_argv[0];
    if (strchr(name, '/')) {
        if (is_executable_file(name) && (L->prog_path = strdup(name)))
            return 0;
        fprintf(stderr, "launch: cannot run \"%s\": %s\n", name,
                access(name, F_OK) ? strerror(errno) : "not an executable file");
        return -1;
    }
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        size_t n = strcspn(path, ":");
        char *cand = NULL;
        if (asprintf(&cand, "%.*s/%s", (int)n, n ? path : ".", name) < 0)
            break;
        if (is_executable_file(cand)) {
            L->prog_path = cand;
            return 0;
        }
        free(cand);
        path += n + (path[n] == ':');
    }
    fprintf(stderr, "launch: cannot run \"%s\": not found in PATH\n", name);
    return -1;
}

/*  A free port for the rendezvous. A port closed as soon as it is found can
    be taken before rank 0 binds it (by another world, or as the local end of
    any connection made meanwhile: both draw from the kernel's ephemeral
    range). So launch keeps it bound, with SO_REUSEADDR and never listening,
    while the world runs: the kernel gives it to no other bind and no
    outgoing connection, and rank 0's listener (ZeroMQ sets SO_REUSEADDR
    too) can still bind it. The descriptor is close-on-exec and lives until
    launch exits. */
static int pick_port(const char *addr)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
        inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    socklen_t sl = sizeof sa;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    int port = -1;
    if (fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
        bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
        port = ntohs(sa.sin_port);
    else
        fprintf(stderr, "launch: cannot pick a free port on %s: %s\n", addr, strerror(errno));
    if (port < 0 && fd >= 0)
        close(fd);
    return port;
}

/*  ---- starting ---- */

static char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static char *str_printf(const char *fmt, ...)
{
    char *s;
    va_list ap;
    va_start(ap, fmt);
    int rc = vasprintf(&s, fmt, ap);
    va_end(ap);
    return rc < 0 ? NULL : s;
}

/*  The variables a rank gets; the inherited ones of the same names go. */
enum { NVARS = 9 };
static const char *const rank_vars[NVARS] = {
    "RANK",        "WORLD_SIZE",       "MASTER_ADDR",
    "MASTER_PORT", "LOCAL_RANK",       "LOCAL_WORLD_SIZE",
    "GROUP_RANK",  "GROUP_WORLD_SIZE", "ZDIST_RESTART_COUNT"};

static bool is_rank_var(const char *entry)
{
    for (int j = 0; j < NVARS; j++) {
        size_t n = strlen(rank_vars[j]);
        if (!strncmp(entry, rank_vars[j], n) && entry[n] == '=')
            return true;
    }
    return false;
}

/*  Returns the environment of a rank: inherited entries (not copied), then
    NVARS allocated ones, then NULL; NULL when out of memory. *nkept tells
    where the allocated ones start. */
static char **rank_env(launch_t *L, int i, size_t *nkept)
{
    size_t n = 0, k = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + NVARS + 1, sizeof *env);
    if (!env)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (!is_rank_var(environ[i]))
            env[k++] = environ[i];
    *nkept = k;
    const int values[NVARS] = {
        launch_rank(L, i), L->nnodes * L->nproc, 0,         L->master_port,      i,
        L->nproc,          L->node_rank,         L->nnodes, L->procs[i].restarts};
    bool ok = true;
    for (int j = 0; j < NVARS; j++) {
        env[k] = j == 2 ? str_printf("%s=%s", rank_vars[j], L->master_addr)
                        : str_printf("%s=%d", rank_vars[j], values[j]);
        ok = ok && env[k++];
    }
    if (!ok) {
        for (size_t i = *nkept; i < k; i++)
            free(env[i]);
        free(env);
        return NULL;
    }
    return env;
}

static void free_rank_env(char **env, size_t nkept)
{
    for (size_t i = nkept; i < nkept + NVARS; i++)
        free(env[i]);
    free(env);
}

/*  The program's argv with --resume (on a restart, when add_resume) and the
    rank flags appended (allocated: those strings and the array); NULL when
    out of memory. */
static char **rank_argv(launch_t *L, int i)
{
    char **argv = calloc(L->prog_argc + 6, sizeof *argv);
    if (!argv)
        return NULL;
    for (int i = 0; i < L->prog_argc; i++)
        argv[i] = L->prog_argv[i];
    char **a = argv + L->prog_argc;
    int n = 0;
    bool ok = true;
    if (L->procs[i].restarts > 0 && L->add_resume)
        ok = ok && (a[n++] = strdup("--resume"));
    if (L->rank_flags) {
        ok = ok && (a[n++] = str_printf("--rank=%d", launch_rank(L, i)));
        ok = ok && (a[n++] = str_printf("--world_size=%d", L->nnodes * L->nproc));
        ok = ok && (a[n++] = str_printf("--master_addr=%s", L->master_addr));
        ok = ok && (a[n++] = str_printf("--master_port=%d", L->master_port));
    }
    if (!ok) {
        for (int k = 0; k < n; k++)
            free(a[k]);
        free(argv);
        return NULL;
    }
    return argv;
}

static void free_rank_argv(launch_t *L, char **argv)
{
    for (int i = L->prog_argc; argv[i]; i++)
        free(argv[i]);
    free(argv);
}

/*  In the child between fork and exec: only async-signal-safe calls. */
static void exec_child(launch_t *L, pid_t parent, int out_w, int err_w, int devnull, char **argv,
                       char **env)
{
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) /* launch died before the line above */
        _exit(128 + SIGKILL);
    if (dup2(devnull, STDIN_FILENO) < 0 || dup2(out_w, STDOUT_FILENO) < 0 ||
        dup2(err_w, STDERR_FILENO) < 0)
        _exit(127);
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, &L->orig_mask, NULL);
    execve(L->prog_path, argv, env);
    const char *msg = "launch: exec failed: ";
    const char *why = strerror(errno);
    struct iovec iov[4] = {{(void *)msg, strlen(msg)},
                           {L->prog_path, strlen(L->prog_path)},
                           {": ", 2},
                           {(void *)why, strlen(why)}};
    if (writev(STDERR_FILENO, iov, 4) >= 0)
        (void)!write(STDERR_FILENO, "\n", 1);
    _exit(127);
}

/*  --log_dir: DIR/rank_RR.log, R the global rank, at least two digits
    and as many as the world's last rank has, so that the files sort. */
static char *log_path(launch_t *L, int i)
{
    int width = 2;
    for (int last = L->nnodes * L->nproc - 1; last >= 100; last /= 10)
        width++;
    return str_printf("%s/rank_%0*d.log", L->log_dir, width, launch_rank(L, i));
}

/*  A new, empty log for process i, open for writing (close-on-exec: the
    child gets it through dup2). Mode 0644 whatever the umask: anyone
    allowed into the folder may read the logs. A restarted process appends
    to the log of its earlier lives, after a line that says so. Returns the
    fd, or -1 with a message printed. */
static int open_log(launch_t *L, int i)
{
    proc_t *p = &L->procs[i];
    if (!p->log_path && !(p->log_path = log_path(L, i))) {
        fprintf(stderr, "launch: out of memory\n");
        return -1;
    }
    int mode = p->restarts > 0 ? O_APPEND : O_TRUNC;
    int fd = open(p->log_path, O_WRONLY | O_CREAT | mode | O_CLOEXEC, 0644);
    if (fd >= 0 && p->restarts > 0)
        dprintf(fd, "launch: rank %d restarted (restart %d of %d)\n", launch_rank(L, i),
                p->restarts, L->max_restarts);
    if (fd < 0 || fchmod(fd, 0644) < 0) {
        fprintf(stderr, "launch: cannot create %s: %s\n", p->log_path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/*  mkdir -p, mode 0755. */
static int make_dirs(const char *dir)
{
    char *path = strdup(dir);
    if (!path)
        return -1;
    int rc = 0;
    for (char *p = path + 1; rc == 0; p++) {
        if (*p != '/' && *p)
            continue;
        char c = *p;
        *p = '\0';
        if (mkdir(path, 0755) < 0 && errno != EEXIST)
            rc = -1;
        *p = c;
        if (!c)
            break;
    }
    struct stat st;
    if (rc == 0 && (stat(path, &st) < 0 || !S_ISDIR(st.st_mode))) {
        errno = ENOTDIR;
        rc = -1;
    }
    if (rc < 0)
        fprintf(stderr, "launch: cannot create the folder %s: %s\n", dir, strerror(errno));
    free(path);
    return rc;
}

int launch_start_rank(launch_t *L, int i)
{
    proc_t *p = &L->procs[i];
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    int logfd = L->log_dir ? open_log(L, i) : -1;
    if (L->log_dir && logfd < 0)
        return -1;
    size_t nkept = 0;
    char **argv = rank_argv(L, i), **env = rank_env(L, i, &nkept);
    pid_t pid = -1;
    if (argv && env && (logfd >= 0 || (pipe2(out, O_CLOEXEC) == 0 && pipe2(err, O_CLOEXEC) == 0))) {
        pid_t parent = getpid();
        pid = fork();
        if (pid == 0)
            exec_child(L, parent, logfd >= 0 ? logfd : out[1], logfd >= 0 ? logfd : err[1],
                       L->devnull, argv, env);
    }
    int saved = errno;
    if (argv)
        free_rank_argv(L, argv);
    if (env)
        free_rank_env(env, nkept);
    if (out[1] >= 0)
        close(out[1]);
    if (err[1] >= 0)
        close(err[1]);
    if (logfd >= 0)
        close(logfd);
    if (pid < 0) {
        fprintf(stderr, "launch: cannot start rank %d: %s\n", launch_rank(L, i), strerror(saved));
        if (out[0] >= 0)
            close(out[0]);
        if (err[0] >= 0)
            close(err[0]);
        return -1;
    }
    setpgid(pid, pid); /* also here: signals may be sent before the child runs */
    if (out[0] >= 0) {
        fcntl(out[0], F_SETFL, O_NONBLOCK);
        fcntl(err[0], F_SETFL, O_NONBLOCK);
    }
    if (p->pid == 0)
        L->started++;
    p->pid = pid;
    p->alive = true;
    p->streams[0] = (stream_t){.fd = out[0], .out = STDOUT_FILENO};
    p->streams[1] = (stream_t){.fd = err[0], .out = STDERR_FILENO};
    L->alive++;
    return 0;
}

/*  The compute threads of each process: the user's choice when the
    environment holds one (ZDIST_NUM_THREADS, else OPENBLAS_NUM_THREADS),
    else this node's cores (those launch may run on) shared out between its
    processes, so that they do not oversubscribe them. launch sets both
    variables for the ranks where they are unset: OpenBLAS reads the one,
    zd_nn_process_setup the other. */
static void share_cores(launch_t *L)
{
    cpu_set_t set;
    long cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                             : sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1)
        cores = 1;
    const char *zd = getenv("ZDIST_NUM_THREADS"), *ob = getenv("OPENBLAS_NUM_THREADS");
    const char *from = zd && *zd ? "ZDIST_NUM_THREADS" : ob && *ob ? "OPENBLAS_NUM_THREADS" : NULL;
    char n[32];
    if (from) {
        snprintf(n, sizeof n, "%s", getenv(from));
    } else {
        long t = cores / L->nproc;
        snprintf(n, sizeof n, "%ld", t < 1 ? 1 : t);
    }
    if (!(zd && *zd))
        setenv("ZDIST_NUM_THREADS", n, 1);
    if (!(ob && *ob))
        setenv("OPENBLAS_NUM_THREADS", n, 1);
    if (from)
        fprintf(stderr, "launch: %s compute threads per process (%s set)\n", n, from);
    else
        fprintf(stderr, "launch: %s compute %s per process (%ld %s, %d %s on this node)\n", n,
                strcmp(n, "1") ? "threads" : "thread", cores, cores == 1 ? "core" : "cores",
                L->nproc, launch_processes(L->nproc));
}

int main(int argc, char **argv)
{
    static launch_t launch = {.nnodes = 1,
                              .master_addr = "127.0.0.1",
                              .rank_flags = true,
                              .grace_s = 5,
                              .exit_code = -1,
                              .sigfd = -1};
    launch_t *L = &launch;
    int rc = parse_flags(L, argc, argv);
    if (rc == 1) {
        usage(stdout);
        return 0;
    }
    if (rc < 0 || find_program(L) < 0)
        return EXIT_USAGE;

    /* fds 0-2 must be taken, or a pipe could land there and be closed by
       the child's dup2 dance. */
    int devnull;
    while ((devnull = open("/dev/null", O_RDWR | O_CLOEXEC)) >= 0 && devnull <= 2)
        fcntl(devnull, F_SETFD, 0);
    L->devnull = devnull;
    if (devnull < 0) {
        fprintf(stderr, "launch: /dev/null: %s\n", strerror(errno));
        return 1;
    }
    if (L->master_port == 0) {
        if ((L->master_port = pick_port(L->master_addr)) < 0)
            return 1;
        if (L->nnodes > 1)
            fprintf(stderr,
                    "launch: picked master port %d: start the other nodes with "
                    "--master_port=%d\n",
                    L->master_port, L->master_port);
    }
    if (L->log_dir && make_dirs(L->log_dir) < 0)
        return 1;
    share_cores(L);
    /* A restarted rank 0 gets the running world back only from members that
       keep registering with the master port while it is lost (rpc/
       membership.c): with restarts on, they do for a while, unless the
       user chose how long. */
    const char *wait = getenv("ZDIST_MASTER_WAIT_S");
    if (L->max_restarts > 0 && !(wait && *wait))
        setenv("ZDIST_MASTER_WAIT_S", MASTER_WAIT_S, 1);
    if (launch_key_prepare(L) < 0)
        return 1;

    /* Signals arrive through the signalfd; SIGCHLD must not be ignored (that
       would reap children behind our back). */
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    signal(SIGCHLD, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGPIPE, SIG_IGN);
    sigprocmask(SIG_BLOCK, &mask, &L->orig_mask);
    L->sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (L->sigfd < 0 || prctl(PR_SET_CHILD_SUBREAPER, 1) < 0) {
        fprintf(stderr, "launch: signalfd/subreaper: %s\n", strerror(errno));
        return 1;
    }

    L->start = launch_now();
    for (int r = 0; r < L->nproc; r++) {
        if (launch_start_rank(L, r) < 0) {
            L->exit_code = 1;
            launch_stop(L, SIGTERM);
            break;
        }
    }
    if (L->started == L->nproc) {
        char pids[MAX_PROCS * 12] = "";
        size_t len = 0;
        for (int r = 0; r < L->started; r++)
            len += snprintf(pids + len, sizeof pids - len, " %d", (int)L->procs[r].pid);
        char ranks[96] = "";
        if (L->nnodes > 1)
            snprintf(ranks, sizeof ranks, " (ranks %d..%d of %d, node %d of %d)", launch_rank(L, 0),
                     launch_rank(L, L->nproc - 1), L->nnodes * L->nproc, L->node_rank, L->nnodes);
        fprintf(stderr, "launch: started %d %s%s of %s, master %s:%d, pids%s\n", L->nproc,
                launch_processes(L->nproc), ranks, L->prog_argv[0], L->master_addr, L->master_port,
                pids);
        if (L->log_dir)
            fprintf(stderr, "launch: output of rank %d in %s%s%s\n", launch_rank(L, 0),
                    L->procs[0].log_path, L->nproc > 1 ? " ... " : "",
                    L->nproc > 1 ? L->procs[L->nproc - 1].log_path : "");
    }
    launch_run(L);
    close(L->sigfd);
    close(L->devnull);
    free(L->prog_path);
    for (int r = 0; r < L->nproc; r++)
        free(L->procs[r].log_path);
    double took = launch_now() - L->start;
    int restarts = 0;
    for (int r = 0; r < L->nproc; r++)
        restarts += L->procs[r].restarts;
    char after[48] = "";
    if (restarts > 0)
        snprintf(after, sizeof after, " after %d %s", restarts,
                 restarts == 1 ? "restart" : "restarts");
    if (L->exit_code < 0) {
        fprintf(stderr, "launch: %d %s finished in %.1f s%s\n", L->nproc,
                launch_processes(L->nproc), took, after);
        return 0;
    }
    fprintf(stderr, "launch: stopped after %.1f s; exit status %d\n", took, L->exit_code);
    return L->exit_code;
}
