/* SPDX-License-Identifier: MIT */
/*  keygen: writes a new world key, the file with which every process of a
    zdist world authenticates and encrypts its connections (CURVE).

        build/tools/keygen [--force] [PATH]

    PATH defaults to ${XDG_CONFIG_HOME:-$HOME/.config}/zdist/world.key, the
    file zd_rpc_init finds by itself. The file is made mode 0600 (its
    folder 0700 when missing); an existing one is kept unless --force,
    which writes a new file beside it and renames it over PATH: a hard or
    symbolic link at PATH is replaced, never written through.
    Every process of the world needs the same file: put it in a home
    folder the hosts share, or copy it to each host (mode 0600). */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <zdist/error.h>
#include "rpc/net/security.h"

int main(int argc, char **argv)
{
    bool force = false;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--force")) {
            force = true;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: %s [--force] [PATH]\n"
                   "writes a new zdist world key (mode 0600) to PATH, by default\n"
                   "${XDG_CONFIG_HOME:-$HOME/.config}/zdist/world.key; --force replaces one\n",
                   argv[0]);
            return 0;
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "%s: unexpected argument \"%s\" (--help)\n", argv[0], argv[i]);
            return 2;
        } else {
            path = argv[i];
        }
    }
    char def[4096];
    if (!path) {
        if (zd__security_default_path(def, sizeof def) < 0) {
            fprintf(stderr, "%s: %s\n", argv[0], zd_error_last());
            return 1;
        }
        path = def;
    }
    if (zd__security_keygen(path, force) < 0) {
        fprintf(stderr, "%s: %s\n", argv[0], zd_error_last());
        return 1;
    }
    printf("%s: wrote a new world key to %s\n"
           "give every process of the world this file (mode 0600): --key_file=%s or "
           "ZDIST_KEY_FILE=%s%s\n",
           argv[0], path, path, path, path == def ? " (or nothing: it is the default)" : "");
    return 0;
}
