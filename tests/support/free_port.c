/* SPDX-License-Identifier: MIT */
/*  free_port: ports for the launcher tests' daemons and worlds, as the
    kernel hands them out, so that tests running side by side never pick
    the same.

        free_port N PID    N distinct free TCP ports (ephemeral ones), one a
                           line, held until process PID (the test) exits
        free_port --job-id a Slurm job id J whose derived rendezvous ports,
                           10000 + J % 20000 and the next two jobs', are
                           free now

    A port found free and closed at once can be taken before the daemon or
    rank 0 binds it: by another test, or as the local end of any connection
    made meanwhile, the world's own included (a trainer connecting to
    127.0.0.1:P before rank 0 listens can be handed P itself and connect to
    itself). So a child process keeps the ports bound, with SO_REUSEADDR and
    never listening, until PID exits: the kernel gives them to no other bind
    and no outgoing connection, while a listener that sets SO_REUSEADDR too
    (ZeroMQ's, Slurm's) can still bind them.

    The second serves tests/slurm.sh, which tests the port zd_rpc_env_resolve
    derives from SLURM_JOB_ID (rpc/world/launch_env.c): those ports lie below the
    ephemeral range, where the kernel hands out nothing, so the only other
    takers are other runs of that test; starting the search at a place drawn
    from the clock and pid makes two runs at once unlikely to meet. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/pidfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/*  Binds a TCP socket to port (0: any) on every interface; the fd, or -1.
    reuse sets SO_REUSEADDR, so that a listener setting it too may bind the
    port while the fd is open. */
static int bind_port(int port, int reuse, int *bound)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof a;
    if (fd < 0)
        return -1;
    if ((reuse && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0) ||
        bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) < 0) {
        close(fd);
        return -1;
    }
    *bound = ntohs(a.sin_port);
    return fd;
}

/*  How many jobs in a row the test runs. */
#define JOBS 3

static int job_id(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned start = (unsigned)(ts.tv_nsec ^ getpid() * 2654435761u);
    for (unsigned k = 0; k < 20000; k++) {
        int id = 1 + (int)((start + k) % 19990), fds[JOBS], n = 0, port;
        while (n < JOBS && (fds[n] = bind_port(10000 + (id + n) % 20000, 0, &port)) >= 0)
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

/*  The longest a test may hold its ports: the launcher tests' ctest
    timeout. */
#define HOLD_MAX_MS (30 * 60 * 1000)

/*  Keeps fds open in a child until process pid exits; the parent returns at
    once, so that "$(free_port N $$)" ends. 0, or -1 with a message. */
static int hold(pid_t pid)
{
    int pfd = pidfd_open(pid, 0);
    if (pfd < 0) {
        perror("free_port: pidfd_open");
        return -1;
    }
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) {
        perror("free_port: fork");
        return -1;
    }
    if (child > 0)
        return 0;
    /* Off the caller's pipes, or the command substitution would wait for us. */
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) {
        dup2(null, 0), dup2(null, 1), dup2(null, 2);
        close(null);
    }
    struct pollfd p = {.fd = pfd, .events = POLLIN};
    while (poll(&p, 1, HOLD_MAX_MS) < 0 && errno == EINTR)
        ; /* interrupted: poll again; any other error ends the hold */
    _exit(0);
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--job-id"))
        return job_id();
    int n = argc == 3 ? atoi(argv[1]) : 0;
    pid_t pid = argc == 3 ? (pid_t)atoi(argv[2]) : 0;
    if (n < 1 || n > 16 || pid < 1) {
        fprintf(stderr, "usage: free_port N PID (N 1..16) | free_port --job-id\n");
        return 2;
    }
    int fds[16];
    for (int i = 0; i < n; i++) {
        int port;
        /* all open until the last is found, so they differ */
        if ((fds[i] = bind_port(0, 1, &port)) < 0) {
            perror("free_port");
            return 1;
        }
        printf("%d\n", port);
    }
    return hold(pid) < 0 ? 1 : 0;
}
