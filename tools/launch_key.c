/* SPDX-License-Identifier: MIT */
/*  launch_key.c: a fresh world key for each local world launch starts, so
    that the world is authenticated and encrypted (CURVE) without the user
    doing anything.

    The key lives in a folder of its own (mkdtemp: mode 0700) as a 0600
    file, reaches the processes through ZDIST_KEY_FILE (never argv, which
    every local user can read in /proc), and is removed when launch ends.
    Nothing is made when the user chose already: ZDIST_KEY_FILE or
    ZDIST_INSECURE set, or --key_file / --insecure among the program's
    flags. Nor for a launch on several nodes: each node's launch would
    make a different key, so those worlds use the key the user shares
    (tools/keygen). */
#include "tools/launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zdist/error.h>
#include "rpc/net/security.h"

static char g_dir[64];
static char g_path[128];

static void remove_key(void)
{
    if (g_path[0])
        unlink(g_path);
    if (g_dir[0])
        rmdir(g_dir);
    g_path[0] = g_dir[0] = 0;
}

static bool user_chose(char *const *argv)
{
    const char *k = getenv("ZDIST_KEY_FILE"), *i = getenv("ZDIST_INSECURE");
    if ((k && *k) || (i && *i))
        return true;
    for (int n = 1; argv[n]; n++)
        if (!strncmp(argv[n], "--key_file", 10) || !strncmp(argv[n], "--insecure", 10))
            return true;
    return false;
}

int launch_key_prepare(const launch_t *L)
{
    if (L->nnodes > 1 || user_chose(L->prog_argv))
        return 0;
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/zdist-key-XXXXXX",
             tmp && *tmp && strlen(tmp) < 32 ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) {
        g_dir[0] = 0;
        perror("launch: cannot make a folder for the world key");
        return -1;
    }
    atexit(remove_key);
    snprintf(g_path, sizeof g_path, "%s/world.key", g_dir);
    if (zd__security_keygen(g_path, false) < 0) {
        fprintf(stderr, "launch: %s\n", zd_error_last());
        return -1;
    }
    setenv("ZDIST_KEY_FILE", g_path, 1);
    return 0;
}
