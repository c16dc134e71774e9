/* SPDX-License-Identifier: MIT */
/*  fixtures.h: cmocka fixtures several tests share: a scratch directory
    and the check for MNIST-format data. For the parent process only (they
    use cmocka's skip and fail_msg). */
#ifndef ZDIST_TESTS_FIXTURES_H
#define ZDIST_TESTS_FIXTURES_H

#include <stddef.h>

#include "rpc/value/codec.h"

/*  Makes a fresh directory /tmp/zd_<tag>_XXXXXX for the tests that follow:
    0, or -1 (as a cmocka group setup returns). */
int tmpdir_setup(const char *tag);

/*  Removes that directory and everything under it: 0, or -1. */
int tmpdir_teardown(void);

/*  The directory tmpdir_setup made. */
const char *tmpdir(void);

/*  dir/name in one of eight rotating buffers, so that one call may take
    several; fails the test when too long. */
const char *path_in(const char *dir, const char *name);

/*  name inside the tmpdir_setup directory, as path_in. */
const char *tmp_path(const char *name);

/*  Skips the running test when no MNIST-format data is found (saying why). */
void need_data(void);

/*  A received frame for the decoders: a copy of size bytes of data (NULL
    and 0: an empty frame) whose release frees it; fails the test when out
    of memory. */
rpc_frame_t frame_of(const void *data, size_t size);

/*  Frames frame_of made that were not released yet (0 when the code under
    test released each exactly once). */
int frames_live(void);

/*  The whole file as a string (to free), or NULL when it cannot be read. */
char *read_text(const char *path);

/*  A raw DEALER in ctx connected to the rendezvous at 127.0.0.1:port (no
    linger), playing a stranger there; NULL on failure. */
void *raw_rendezvous_dealer(void *ctx, int port);

/*  Sends frames[0..n-1] as one message on a raw ZeroMQ socket: 0, or -1. */
int raw_send_frames(void *sock, const char *const *frames, int n);

/*  Reads a rendezvous answer of two frames from sock (10 s at most): 0 when
    its tag is tag and its text holds want, else -1 (printed). */
int raw_rendezvous_answer(void *sock, const char *tag, const char *want);

/*  Fails the test, showing text, unless it holds needle (NULL text: "(no file)"). */
void assert_contains(const char *text, const char *needle);

/*  Writes a /bin/sh script with that body at path, executable. */
void write_script(const char *path, const char *body);
/*  The tests/ folder of the source tree (where the Python scripts are). */
const char *tests_dir(void);
/*  Runs tests/SCRIPT ARGS with /usr/bin/python3 (300 s at most) and puts
    what it printed (cut to size) in out, showing it; skips the test when
    python3 or torch is missing (status 127, or 77 from the script), fails
    it on any other status but 0. */
void torch_script(const char *script, const char *args, char *out, size_t size);

#endif
