/* SPDX-License-Identifier: MIT */
/*  free_port: ports for the launcher tests' daemons and worlds, as the
    kernel hands them out, so that tests running side by side never pick
    the same.

        free_port N        N distinct free TCP ports (ephemeral ones), one a line
        free_port --job-id a Slurm job id J whose derived rendezvous ports,
                           10000 + J % 20000 and the next two jobs', are
                           free now

    The second serves tests/slurm.sh, which tests the port zd_rpc_env_resolve
    derives from SLURM_JOB_ID (rpc/launch_env.c): those ports lie below the
    ephemeral range, where the kernel hands out nothing, so the only other
    takers are other runs of that test; starting the search at a place drawn
    from the clock and pid makes two runs at once unlikely to meet. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Binds a loopback TCP socket to port (0: any); the fd, or -1. */
static int bind_port(int port, int *bound)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof a;
    if (fd < 0)
        return -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) < 0) {
        close(fd);
        return -1;
    }
    *bound = ntohs(a.sin_port);
    return fd;
}

/* How many jobs in a row the test runs. */
#define JOBS 3

static int job_id(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned start = (unsigned)(ts.tv_nsec ^ getpid() * 2654435761u);
    for (unsigned k = 0; k < 20000; k++) {
        int id = 1 + (int)((start + k) % 19990), fds[JOBS], n = 0, port;
        while (n < JOBS && (fds[n] = bind_port(10000 + (id + n) % 20000, &port)) >= 0)
            n++;
        for (int i = 0; i < n; i++)
            close(fds[i]);
        if (n == JOBS) {
            printf("%d\n", id);
            return 0;
        }
    }
    fprintf(stderr, "free_port: no job id with free ports\n");
    return 1;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--job-id"))
        return job_id();
    int n = argc == 2 ? atoi(argv[1]) : 0;
    if (n < 1 || n > 16) {
        fprintf(stderr, "usage: free_port N (1..16) | free_port --job-id\n");
        return 2;
    }
    int fds[16];
    for (int i = 0; i < n; i++) {
        int port;
        /* all held until the last is found, so they differ */
        if ((fds[i] = bind_port(0, &port)) < 0) {
            perror("free_port");
            return 1;
        }
        printf("%d\n", port);
    }
    for (int i = 0; i < n; i++)
        close(fds[i]);
    return 0;
}
