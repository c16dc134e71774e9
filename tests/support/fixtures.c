/* SPDX-License-Identifier: MIT */
/*  fixtures.c: the cmocka fixtures of fixtures.h. */
#define _GNU_SOURCE /* nftw */
#include "tests/support/fixtures.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <zmq.h>
#include <unistd.h>

#include <zdist/dataset.h>
#include <zdist/error.h>

static char made[256]; /* the directory tmpdir_setup made */

int tmpdir_setup(const char *tag)
{
    if (snprintf(made, sizeof made, "/tmp/zd_%s_XXXXXX", tag) >= (int)sizeof made)
        return -1;
    return mkdtemp(made) ? 0 : -1;
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

int tmpdir_teardown(void)
{
    /* Depth first, links not followed: children go before their directory. */
    return nftw(made, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

const char *tmpdir(void)
{
    return made;
}

const char *path_in(const char *dir, const char *name)
{
    static char buf[8][600];
    static int next;
    char *b = buf[next++ % 8];
    if (snprintf(b, sizeof buf[0], "%s/%s", dir, name) >= (int)sizeof buf[0])
        fail_msg("path too long: %s/%s", dir, name);
    return b;
}

const char *tmp_path(const char *name)
{
    return path_in(made, name);
}

void need_data(void)
{
    char dir[1024];
    if (zd_dataset_find_dir(dir, sizeof dir) < 0) {
        fprintf(stderr, "no MNIST-format data: %s\n", zd_error_last());
        skip();
    }
}

char *read_text(const char *path)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    char *s = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&s, &len);
    char buf[4096];
    size_t n;
    while (m && (n = fread(buf, 1, sizeof buf, fp)) > 0)
        fwrite(buf, 1, n, m);
    if (m)
        fclose(m);
    fclose(fp);
    return s;
}

void assert_contains(const char *text, const char *needle)
{
    if (!text || !strstr(text, needle))
        fail_msg("expected \"%s\" in:\n%s", needle, text ? text : "(no file)");
}

const char *tests_dir(void)
{
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s", __FILE__); /* .../tests/support/fixtures.c */
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = 0;
    }
    return dir;
}

void torch_script(const char *script, const char *args, char *out, size_t size)
{
    char line[4096];
    if (snprintf(line, sizeof line, "timeout 300 /usr/bin/python3 %s/%s %s 2>&1", tests_dir(),
                 script, args) >= (int)sizeof line)
        fail_msg("torch_script: command too long");
    FILE *p = popen(line, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, size - 1, p);
    out[n] = 0;
    char rest[512]; /* past size: read to the end, so that the script is not left blocked */
    while (fread(rest, 1, sizeof rest, p) > 0) {
    }
    int st = pclose(p);
    printf("%s", out);
    if (WIFEXITED(st) && (WEXITSTATUS(st) == 77 || WEXITSTATUS(st) == 127))
        skip(); /* no torch; no /usr/bin/python3 */
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("PyTorch's side (%s) failed (status %d)", script, st);
}

void write_script(const char *path, const char *body)
{
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fprintf(fp, "#!/bin/sh\n%s", body);
    assert_int_equal(fclose(fp), 0);
    assert_int_equal(chmod(path, 0755), 0);
}

static int live_frames;

static void frame_free(void *data, void *arg)
{
    (void)arg;
    free(data);
    live_frames--;
}

rpc_frame_t frame_of(const void *data, size_t size)
{
    void *copy = malloc(size ? size : 1);
    if (!copy)
        fail_msg("out of memory");
    if (size)
        memcpy(copy, data, size);
    live_frames++;
    return (rpc_frame_t){.data = copy, .size = size, .release = frame_free};
}

int frames_live(void)
{
    return live_frames;
}

void *raw_rendezvous_dealer(void *ctx, int port)
{
    void *sock = ctx ? zmq_socket(ctx, ZMQ_DEALER) : NULL;
    char ep[64];
    int zero = 0;
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    if (sock &&
        (zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero) < 0 || zmq_connect(sock, ep) < 0)) {
        zmq_close(sock);
        sock = NULL;
    }
    return sock;
}

int raw_send_frames(void *sock, const char *const *frames, int n)
{
    for (int i = 0; i < n; i++)
        if (zmq_send(sock, frames[i], strlen(frames[i]), i + 1 < n ? ZMQ_SNDMORE : 0) < 0)
            return -1;
    return 0;
}

int raw_rendezvous_answer(void *sock, const char *tag, const char *want)
{
    char got[16] = "", text[1024] = "";
    zmq_pollitem_t item = {sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 10000) != 1) {
        fprintf(stderr, "rendezvous: no answer, expected %s \"%s\"\n", tag, want);
        return -1;
    }
    int n = zmq_recv(sock, got, sizeof got - 1, 0), more = 0;
    size_t len = sizeof more;
    zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &len);
    int t = more ? zmq_recv(sock, text, sizeof text - 1, 0) : -1;
    if (n < 0 || t < 0)
        return -1;
    got[n < (int)sizeof got ? n : (int)sizeof got - 1] = '\0';
    text[t < (int)sizeof text ? t : (int)sizeof text - 1] = '\0';
    if (strcmp(got, tag) != 0 || !strstr(text, want)) {
        fprintf(stderr, "rendezvous: answer %s \"%s\", expected %s \"%s\"\n", got, text, tag, want);
        return -1;
    }
    return 0;
}
