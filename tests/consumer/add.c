/* SPDX-License-Identifier: MIT */
/*  add.c: a program written outside zdist's tree, built against the
    installed library by tests/consumer/run.sh (with pkg-config and with
    CMake, shared and static). Two processes on loopback: rank 1 serves
    "add", rank 0 calls it and checks the sum; both check that the library
    they loaded is the version of the headers they were compiled with.
    Exits 0 when everything worked. */
#define _POSIX_C_SOURCE 200809L /* fork, alarm, sockets: this file is built with -std=c11 too */

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zdist/zdist.h>

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "add (rank %d): %s:%d: %s failed: %s\n", rank, __FILE__, __LINE__,     \
                    #cond, zd_error_last());                                                       \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/*  The handler: args (a, b) -> a + b. */
static zd_value_t *h_add(zd_rpc_call_t *call, zd_value_t *args, void *arg)
{
    int64_t a, b;
    (void)call;
    (void)arg;
    if (zd_list_len(args) != 2 || zd_value_get_int(zd_list_get(args, 0), &a) < 0 ||
        zd_value_get_int(zd_list_get(args, 1), &b) < 0) {
        zd_error_set("add takes two ints");
        return NULL;
    }
    return zd_value_int(a + b);
}

/*  A TCP port on loopback the OS picked. Its socket stays open, with
    SO_REUSEADDR and never listening, until the process exits: no outgoing
    connection (rank 1's own, made before rank 0 listens) can be handed the
    port, while ZeroMQ's listener, which sets SO_REUSEADDR too, can bind it. */
static int free_port(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1, one = 1;
    if (fd < 0)
        return -1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0 &&
        bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    if (port < 0)
        close(fd);
    return port;
}

static int run(int rank, int port)
{
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", ZD_VERSION_MAJOR, ZD_VERSION_MINOR, ZD_VERSION_PATCH);
    CHECK(strcmp(zd_version(), want) == 0);

    zd_rpc_options_t opts = zd_rpc_options_default();
    opts.master_addr = "127.0.0.1";
    opts.master_port = port;
    opts.init_timeout_ms = 20000;
    opts.rpc_timeout_ms = 20000;
    CHECK(zd_rpc_register("add", h_add, NULL) == 0);
    CHECK(zd_rpc_init(rank == 0 ? "caller" : "adder", rank, 2, &opts) == 0);
    CHECK(zd_rpc_world_size() == 2);

    if (rank == 0) {
        zd_value_t *args = zd_value_list(2), *r = NULL;
        int64_t sum = 0;
        CHECK(args != NULL);
        CHECK(zd_list_append(args, zd_value_int(2)) == 0);
        CHECK(zd_list_append(args, zd_value_int(40)) == 0);
        int rc = zd_rpc_sync(zd_rpc_worker("adder"), "add", args, -1, &r);
        zd_value_unref(args);
        CHECK(rc == 0);
        rc = zd_value_get_int(r, &sum);
        zd_value_unref(r);
        CHECK(rc == 0 && sum == 42);

        /* An error comes back as -1 and a message naming the function. */
        r = NULL;
        CHECK(zd_rpc_sync(1, "add", NULL, -1, &r) == -1 && r == NULL);
        CHECK(strstr(zd_error_last(), "add") != NULL);
        printf("add: rank 0 got 2 + 40 = %lld from rank 1 (zdist %s)\n", (long long)sum,
               zd_version());
    }
    CHECK(zd_rpc_shutdown(true, 20000) == 0);
    return 0;
}

int main(void)
{
    int port = free_port();
    if (port < 0) {
        perror("add: no free port");
        return 1;
    }
    /* Fork before any ZeroMQ context exists. */
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) {
        perror("add: fork");
        return 1;
    }
    /* The whole run takes well under a second; alarm() ends a hung process
       (the test then fails) instead of leaving it to CI's timeout. */
    alarm(60);
    if (child == 0)
        exit(run(1, port));
    int rc = run(0, port), st;
    if (waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "add: rank 1 failed\n");
        rc = 1;
    }
    if (rc == 0)
        printf("add: ok\n");
    return rc;
}
