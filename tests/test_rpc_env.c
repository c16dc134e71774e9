/* SPDX-License-Identifier: MIT */
/*  Where a process learns its rank, world size and rendezvous:
    zd_rpc_env_resolve under every launcher's variables (generic, torchrun,
    Slurm, Open MPI, PMIx), their precedence when several sets are present
    (mpirun inside an allocation, torchrun inside Slurm), Slurm's host lists,
    malformed values naming their variable; and zd_rpc_init, which takes
    them, fails on bad ones and logs the result once at info level. Each
    case starts from an environment with none of the variables set. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zdist/error.h>
#include <zdist/log.h>
#include <zdist/rpc.h>
#include "tests/support/world.h"

static const char *const VARS[] = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "ZDIST_MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "GROUP_RANK",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "OMPI_MCA_ess_base_jobid",
    "PMIX_RANK",
    "PMIX_NAMESPACE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_JOB_ID",
};

static int clear_env(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof VARS / sizeof VARS[0]; i++)
        unsetenv(VARS[i]);
    return 0;
}

/*  Sets "NAME=value" pairs, NULL-terminated. */
static void set(const char *first, ...)
{
    va_list ap;
    va_start(ap, first);
    for (const char *kv = first; kv; kv = va_arg(ap, const char *)) {
        char name[64];
        const char *eq = strchr(kv, '=');
        assert_non_null(eq);
        snprintf(name, sizeof name, "%.*s", (int)(eq - kv), kv);
        assert_int_equal(setenv(name, eq + 1, 1), 0);
    }
    va_end(ap);
}

static zd_rpc_env_t resolve_env(void)
{
    zd_rpc_env_t e;
    if (zd_rpc_env_resolve(-1, 0, NULL, 0, &e, sizeof e) < 0)
        fail_msg("zd_rpc_env_resolve: %s", zd_error_last());
    return e;
}

/*  resolve fails, with an error mentioning each of the NULL-terminated texts. */
static void resolve_fails(const char *text, ...)
{
    zd_rpc_env_t e;
    assert_int_equal(zd_rpc_env_resolve(-1, 0, NULL, 0, &e, sizeof e), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    va_list ap;
    va_start(ap, text);
    for (const char *t = text; t; t = va_arg(ap, const char *))
        if (!strstr(zd_error_last(), t))
            fail_msg("error \"%s\" does not mention \"%s\"", zd_error_last(), t);
    va_end(ap);
}

static void assert_from(const char *from, const char *expected)
{
    if (!expected)
        assert_null(from);
    else {
        assert_non_null(from);
        assert_string_equal(from, expected);
    }
}

static void test_nothing_set(void **state)
{
    (void)state;
    zd_rpc_env_t e = resolve_env();
    assert_int_equal(e.rank, -1);
    assert_int_equal(e.world_size, 0);
    assert_int_equal(e.local_rank, -1);
    assert_string_equal(e.master_addr, "");
    assert_int_equal(e.master_port, 0);
    assert_null(e.launcher);
    assert_null(e.rank_from);
    assert_null(e.master_port_from);
    assert_non_null(strstr(e.summary, "rank ? from nothing"));
}

static void test_arguments_beat_everything(void **state)
{
    (void)state;
    set("RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=a", "MASTER_PORT=2000", "ZDIST_MASTER_PORT=2001",
        "SLURM_PROCID=3", "SLURM_NTASKS=8", "SLURM_JOB_ID=5", "SLURM_JOB_NODELIST=n[1-8]", NULL);
    zd_rpc_env_t e;
    assert_int_equal(zd_rpc_env_resolve(5, 6, "host", 3000, &e, sizeof e), 0);
    assert_int_equal(e.rank, 5);
    assert_int_equal(e.world_size, 6);
    assert_string_equal(e.master_addr, "host");
    assert_int_equal(e.master_port, 3000);
    assert_from(e.rank_from, "the arguments");
    assert_from(e.world_size_from, "the arguments");
    assert_from(e.master_addr_from, "the arguments");
    assert_from(e.master_port_from, "the arguments");
    assert_string_equal(e.summary,
                        "rank 5 of 6 from the arguments, master host:3000 from the "
                        "arguments [env]");
    /* an argument's rank checked against the environment's world */
    assert_int_equal(zd_rpc_env_resolve(2, 0, NULL, 0, &e, sizeof e), -1);
    assert_non_null(strstr(zd_error_last(),
                           "rank 2 is outside the world of size 2 (rank from "
                           "the arguments, world size from WORLD_SIZE)"));
    assert_int_equal(zd_rpc_env_resolve(-1, 0, NULL, 70000, &e, sizeof e), -1);
}

/*  The env is written no further than the size passed (docs/conventions.md):
    a size below the 1.0 struct's is refused naming the struct, leaving the
    caller's memory alone; a newer caller's larger struct gets this
    library's fields and zeros after them. */
static void test_env_size(void **state)
{
    (void)state;
    set("RANK=1", "WORLD_SIZE=2", NULL);
    struct {
        zd_rpc_env_t e;
        unsigned char newer[16];
    } big;
    memset(&big, 0xA5, sizeof big);
    assert_int_equal(zd_rpc_env_resolve(-1, 0, NULL, 0, &big.e, 0), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_non_null(strstr(zd_error_last(), "zd_rpc_env_t"));
    assert_int_equal(zd_rpc_env_resolve(-1, 0, NULL, 0, &big.e, sizeof big.e - 1), -1);
    assert_non_null(strstr(zd_error_last(), "zd_rpc_env_t"));
    assert_int_equal(zd_rpc_env_resolve(-1, 0, NULL, 0, NULL, sizeof big.e), -1);
    assert_int_equal(zd_error_code(), ZD_ERR_ARGUMENT);
    assert_int_equal(((unsigned char *)&big)[0], 0xA5);
    assert_int_equal(zd_rpc_env_resolve(-1, 0, NULL, 0, &big.e, sizeof big.e), 0);
    assert_int_equal(big.e.rank, 1);
    assert_int_equal(big.newer[0], 0xA5); /* no further than the size */
    assert_int_equal(zd_rpc_env_resolve(-1, 0, NULL, 0, &big.e, sizeof big), 0);
    assert_int_equal(big.e.world_size, 2);
    assert_int_equal(big.newer[0], 0); /* fields this library does not know: zero */
}

static void test_generic(void **state)
{
    (void)state;
    set("RANK=2", "WORLD_SIZE=4", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=10.0.0.1",
        "MASTER_PORT=29500", NULL);
    zd_rpc_env_t e = resolve_env();
    assert_int_equal(e.rank, 2);
    assert_int_equal(e.world_size, 4);
    assert_int_equal(e.local_rank, 0);
    assert_int_equal(e.local_world_size, 2);
    assert_string_equal(e.master_addr, "10.0.0.1");
    assert_int_equal(e.master_port, 29500);
    assert_string_equal(e.launcher, "env");
    assert_string_equal(e.summary,
                        "rank 2 of 4 from RANK, world size from WORLD_SIZE, local rank "
                        "0 from LOCAL_RANK, master 10.0.0.1:29500 from "
                        "MASTER_ADDR/MASTER_PORT [env]");
    /* ZDIST_MASTER_PORT beats MASTER_PORT under any launcher */
    set("ZDIST_MASTER_PORT=29600", NULL);
    e = resolve_env();
    assert_int_equal(e.master_port, 29600);
    assert_from(e.master_port_from, "ZDIST_MASTER_PORT");
}

static void test_torchrun(void **state)
{
    (void)state;
    set("TORCHELASTIC_RUN_ID=none", "TORCHELASTIC_RESTART_COUNT=0", "GROUP_RANK=0", "RANK=3",
        "WORLD_SIZE=4", "LOCAL_RANK=3", "LOCAL_WORLD_SIZE=4", "MASTER_ADDR=127.0.0.1",
        "MASTER_PORT=29500", NULL);
    zd_rpc_env_t e = resolve_env();
    assert_string_equal(e.launcher, "torchrun");
    assert_int_equal(e.rank, 3);
    assert_int_equal(e.world_size, 4);
    assert_int_equal(e.local_rank, 3);
    /* torchrun's agent holds its store on MASTER_PORT */
    assert_int_equal(e.master_port, 29501);
    assert_from(e.master_port_from, "MASTER_PORT+1");
    assert_non_null(strstr(e.summary,
                           "master 127.0.0.1:29501 from MASTER_ADDR/MASTER_PORT+1 "
                           "(torchrun's agent holds MASTER_PORT"));
    set("ZDIST_MASTER_PORT=31000", NULL);
    e = resolve_env();
    assert_int_equal(e.master_port, 31000);
    assert_null(strstr(e.summary, "agent holds"));
    unsetenv("ZDIST_MASTER_PORT");
    set("MASTER_PORT=65535", NULL);
    resolve_fails("MASTER_PORT=\"65535\"", NULL);
}

static void test_slurm(void **state)
{
    (void)state;
    set("SLURM_PROCID=5", "SLURM_NTASKS=8", "SLURM_LOCALID=1", "SLURM_JOB_ID=123456",
        "SLURM_JOB_NODELIST=node[01-04,07],gpu3", NULL);
    zd_rpc_env_t e = resolve_env();
    assert_string_equal(e.launcher, "slurm");
    assert_int_equal(e.rank, 5);
    assert_int_equal(e.world_size, 8);
    assert_int_equal(e.local_rank, 1);
    assert_int_equal(e.local_world_size, 0);
    assert_string_equal(e.master_addr, "node01");
    /* 10000 + SLURM_JOB_ID % 20000 */
    assert_int_equal(e.master_port, 10000 + 123456 % 20000);
    assert_string_equal(e.summary,
                        "rank 5 of 8 from SLURM_PROCID, world size from SLURM_NTASKS, "
                        "local rank 1 from SLURM_LOCALID, master node01:13456 from "
                        "SLURM_JOB_NODELIST/SLURM_JOB_ID [slurm]");
    /* the step's nodes rather than the job's */
    set("SLURM_STEP_NODELIST=node[03-04]", NULL);
    e = resolve_env();
    assert_string_equal(e.master_addr, "node03");
    assert_from(e.master_addr_from, "SLURM_STEP_NODELIST");
    /* MASTER_ADDR and MASTER_PORT beat them */
    set("MASTER_ADDR=10.1.1.1", "MASTER_PORT=4000", NULL);
    e = resolve_env();
    assert_string_equal(e.master_addr, "10.1.1.1");
    assert_int_equal(e.master_port, 4000);
    /* the port follows the job */
    unsetenv("MASTER_PORT");
    set("SLURM_JOB_ID=123457", NULL);
    assert_int_equal(resolve_env().master_port, 13457);
}

static void test_slurm_host_lists(void **state)
{
    (void)state;
    static const char *const good[][2] = {
        {"node[01-04,07],gpu3", "node01"},      {"a-[1-2]b", "a-1b"}, {"gpu3,node[1-2]", "gpu3"},
        {"rack[1-2]-n[007-010]", "rack1-n007"}, {"n[10,2-3]", "n10"}, {"single", "single"},
        {"node-7.cluster", "node-7.cluster"},
    };
    set("SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_JOB_ID=1", NULL);
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        set("SLURM_JOB_NODELIST=x", NULL);
        assert_int_equal(setenv("SLURM_JOB_NODELIST", good[i][0], 1), 0);
        zd_rpc_env_t e = resolve_env();
        if (strcmp(e.master_addr, good[i][1]))
            fail_msg("%s gave %s, not %s", good[i][0], e.master_addr, good[i][1]);
    }
    static const char *const bad[] = {"node[01-04", "node[]", "node[a-b]", "node]1",
                                      "node[1[2]]", "node 1", "[-1]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(setenv("SLURM_JOB_NODELIST", bad[i], 1), 0);
        zd_rpc_env_t e;
        if (zd_rpc_env_resolve(-1, 0, NULL, 0, &e, sizeof e) == 0)
            fail_msg("%s gave %s", bad[i], e.master_addr);
        assert_non_null(strstr(zd_error_last(), "SLURM_JOB_NODELIST"));
        assert_non_null(strstr(zd_error_last(), bad[i]));
    }
}

static void test_openmpi(void **state)
{
    (void)state;
    set("OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=1",
        "OMPI_COMM_WORLD_LOCAL_SIZE=4", "OMPI_MCA_ess_base_jobid=1320550401", NULL);
    zd_rpc_env_t e = resolve_env();
    assert_string_equal(e.launcher, "openmpi");
    assert_int_equal(e.rank, 1);
    assert_int_equal(e.world_size, 4);
    assert_int_equal(e.local_rank, 1);
    assert_int_equal(e.local_world_size, 4);
    /* all on this host */
    assert_string_equal(e.master_addr, "127.0.0.1");
    /* from the job family, the upper 16 bits of the job id: 1320550401 >> 16
       is 20150 */
    assert_int_equal(e.master_port, 10000 + 20150 % 20000);
    assert_from(e.master_port_from, "OMPI_MCA_ess_base_jobid");
    set("MASTER_PORT=5000", NULL);
    assert_int_equal(resolve_env().master_port, 5000);
    /* across hosts nothing says where rank 0 runs */
    set("OMPI_COMM_WORLD_LOCAL_SIZE=2", NULL);
    resolve_fails("across hosts", "MASTER_ADDR", "OMPI_COMM_WORLD_LOCAL_SIZE=2", NULL);
    set("MASTER_ADDR=h0", NULL);
    assert_string_equal(resolve_env().master_addr, "h0");
    /* no derived port without the job id */
    unsetenv("MASTER_PORT");
    unsetenv("OMPI_MCA_ess_base_jobid");
    e = resolve_env();
    assert_int_equal(e.master_port, 0);
    assert_null(e.master_port_from);
}

static void test_pmix(void **state)
{
    (void)state;
    set("PMIX_RANK=2", "PMIX_NAMESPACE=prterun-h-1234@1", NULL);
    resolve_fails("PMIX_RANK=2", "WORLD_SIZE", NULL);
    set("WORLD_SIZE=3", NULL);
    zd_rpc_env_t e = resolve_env();
    assert_string_equal(e.launcher, "pmix");
    assert_int_equal(e.rank, 2);
    assert_int_equal(e.world_size, 3);
    assert_from(e.rank_from, "PMIX_RANK");
    assert_string_equal(e.master_addr, "");
    /* Slurm's PMIx (srun --mpi=pmix): the Slurm variables describe the step */
    unsetenv("WORLD_SIZE");
    set("PMIX_NAMESPACE=slurm.pmix.77.0", "SLURM_PROCID=2", "SLURM_NTASKS=4",
        "SLURM_STEP_NODELIST=c[5-6]", "SLURM_JOB_ID=77", NULL);
    e = resolve_env();
    assert_int_equal(e.rank, 2);
    assert_from(e.rank_from, "PMIX_RANK");
    assert_int_equal(e.world_size, 4);
    assert_from(e.world_size_from, "SLURM_NTASKS");
    assert_string_equal(e.master_addr, "c5");
    assert_int_equal(e.master_port, 10077);
}

static void test_precedence(void **state)
{
    (void)state;
    /* mpirun inside a batch script: every rank inherits the batch step's
       SLURM_PROCID=0; Open MPI's variables are the process's own. */
    set("SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_JOB_ID=9", "SLURM_JOB_NODELIST=n1",
        "OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_SIZE=4",
        "PMIX_RANK=3", "PMIX_NAMESPACE=1320550401", NULL);
    zd_rpc_env_t e = resolve_env();
    assert_string_equal(e.launcher, "openmpi");
    assert_int_equal(e.rank, 3);
    assert_from(e.rank_from, "OMPI_COMM_WORLD_RANK");
    assert_from(e.world_size_from, "OMPI_COMM_WORLD_SIZE");
    assert_string_equal(e.master_addr, "127.0.0.1");
    /* PMIx beats Slurm */
    unsetenv("OMPI_COMM_WORLD_RANK");
    unsetenv("OMPI_COMM_WORLD_SIZE");
    unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    set("WORLD_SIZE=4", NULL);
    e = resolve_env();
    assert_string_equal(e.launcher, "pmix");
    assert_int_equal(e.rank, 3);
    /* torchrun inside Slurm: torchrun's RANK and port */
    set("TORCHELASTIC_RUN_ID=j9", "RANK=1", "MASTER_ADDR=n1", "MASTER_PORT=29500", NULL);
    e = resolve_env();
    assert_string_equal(e.launcher, "torchrun");
    assert_int_equal(e.rank, 1);
    assert_from(e.rank_from, "RANK");
    assert_int_equal(e.master_port, 29501);
    /* a variable only read when used: a malformed Slurm one under torchrun */
    set("SLURM_NTASKS=lots", NULL);
    assert_int_equal(resolve_env().rank, 1);
}

static void test_malformed(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        {"RANK", "abc"},         {"RANK", "-1"},       {"RANK", "70000"},
        {"WORLD_SIZE", "0"},     {"WORLD_SIZE", "4x"}, {"MASTER_PORT", "70000"},
        {"MASTER_PORT", "port"}, {"LOCAL_RANK", "z"},  {"ZDIST_MASTER_PORT", "0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        clear_env(NULL);
        set("RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=1000", NULL);
        assert_int_equal(setenv(cases[i][0], cases[i][1], 1), 0);
        char want[64];
        snprintf(want, sizeof want, "%s=\"%s\"", cases[i][0], cases[i][1]);
        resolve_fails(want, "not an integer", NULL);
    }
    clear_env(NULL);
    set("SLURM_PROCID=x", "SLURM_NTASKS=2", NULL);
    resolve_fails("SLURM_PROCID=\"x\"", NULL);
    set("SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_JOB_ID=-5", "SLURM_JOB_NODELIST=n", NULL);
    resolve_fails("SLURM_JOB_ID=\"-5\"", NULL);
    set("SLURM_PROCID=2", "SLURM_JOB_ID=5", NULL);
    resolve_fails("rank 2 is outside the world of size 2 (rank from SLURM_PROCID, world size "
                  "from SLURM_NTASKS)",
                  NULL);
    clear_env(NULL);
    set("OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=four", NULL);
    resolve_fails("OMPI_COMM_WORLD_SIZE=\"four\"", NULL);
}

/*  ---- zd_rpc_init takes them and says so, once ---- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_lines[16][600];
static int g_n_lines;

static void record(zd_log_level_t level, const char *who, const char *line, void *arg)
{
    (void)level, (void)who, (void)arg;
    pthread_mutex_lock(&g_lock);
    if (g_n_lines < 16)
        snprintf(g_lines[g_n_lines++], sizeof g_lines[0], "%s", line);
    pthread_mutex_unlock(&g_lock);
}

static int count_lines(const char *text)
{
    int n = 0;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_n_lines; i++)
        n += strstr(g_lines[i], text) != NULL;
    pthread_mutex_unlock(&g_lock);
    return n;
}

static void test_rpc_init_uses_them(void **state)
{
    (void)state;
    /* a bad variable fails zd_rpc_init, naming it */
    set("RANK=zero", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=1000", NULL);
    assert_int_equal(zd_rpc_init(NULL, -1, 0, NULL), -1);
    assert_non_null(strstr(zd_error_last(), "RANK=\"zero\""));
    clear_env(NULL);
    set("OMPI_COMM_WORLD_RANK=0", NULL);
    assert_int_equal(zd_rpc_init(NULL, -1, 0, NULL), -1);
    assert_non_null(strstr(zd_error_last(), "no world size"));

    /* a world of one from Slurm's variables, except the port (a free one) */
    clear_env(NULL);
    int port = world_free_port();
    assert_true(port > 0);
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    set("SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_LOCALID=0", "SLURM_JOB_ID=42",
        "SLURM_STEP_NODELIST=localhost", NULL);
    assert_int_equal(setenv("MASTER_PORT", port_s, 1), 0);
    zd_log_set_level(ZD_LOG_INFO);
    zd_log_set_sink(record, NULL);
    int rc = zd_rpc_init(NULL, -1, 0, NULL);
    if (rc < 0)
        fail_msg("zd_rpc_init: %s", zd_error_last());
    assert_int_equal(zd_rpc_rank(), 0);
    assert_int_equal(zd_rpc_shutdown(true, 10000), 0);
    zd_log_set_sink(NULL, NULL);
    char want[200];
    snprintf(want, sizeof want,
             "rpc: rank 0 of 1 from SLURM_PROCID, world size from SLURM_NTASKS, "
             "local rank 0 from SLURM_LOCALID, master localhost:%d from "
             "SLURM_STEP_NODELIST/MASTER_PORT [slurm]",
             port);
    if (count_lines(want) != 1) {
        for (int i = 0; i < g_n_lines; i++)
            print_message("logged: %s\n", g_lines[i]);
        fail_msg("the start line \"%s\" is not there once", want);
    }
    assert_int_equal(count_lines("from SLURM_PROCID"), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_nothing_set, clear_env),
        cmocka_unit_test_setup(test_arguments_beat_everything, clear_env),
        cmocka_unit_test_setup(test_env_size, clear_env),
        cmocka_unit_test_setup(test_generic, clear_env),
        cmocka_unit_test_setup(test_torchrun, clear_env),
        cmocka_unit_test_setup(test_slurm, clear_env),
        cmocka_unit_test_setup(test_slurm_host_lists, clear_env),
        cmocka_unit_test_setup(test_openmpi, clear_env),
        cmocka_unit_test_setup(test_pmix, clear_env),
        cmocka_unit_test_setup(test_precedence, clear_env),
        cmocka_unit_test_setup(test_malformed, clear_env),
        cmocka_unit_test_setup(test_rpc_init_uses_them, clear_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
