/* SPDX-License-Identifier: MIT */
/*  copy.h: large copies shared with a helper thread (private to rpc/).

    One core's memcpy does not reach the memory's bandwidth: on a 2-core
    machine two threads copy 64 MiB nearly twice as fast as one. A sender
    copying a tensor into a shared segment (shm.h) is the whole cost of a
    same-host transfer, and the receiving process is idle meanwhile, so
    the copy is cut into chunks that the caller and one helper thread take
    in turn from a shared counter. The caller never waits for the helper to
    wake: when it has not started by the time the caller ran out of chunks,
    the caller has done them all; at most it waits for the one chunk the
    helper is copying. One copy at a time uses the helper; a second caller
    meanwhile copies alone.

    The helper starts at the first large copy after zd__rpc_copy_enable(true)
    and is joined by zd__rpc_copy_enable(false) (the agent's start and
    close). A child forked meanwhile has no helper and copies alone until
    it enables one. */
#ifndef ZDIST_RPC_COPY_H
#define ZDIST_RPC_COPY_H

#include <stdbool.h>
#include <stddef.h>

/*  Copies of fewer bytes are not shared: waking a thread costs more. */
#define RPC_COPY_SHARED_MIN ((size_t)4 << 20)
#define RPC_COPY_CHUNK      ((size_t)1 << 20)

/*  memcpy(dst, src, n), with the helper's help when n is large and the
    helper is free. The buffers must not overlap. */
void zd__rpc_copy(void *dst, const void *src, size_t n);

/*  Allows the helper (true), or stops and joins it (false). */
void zd__rpc_copy_enable(bool on);

/*  Chunks the helper has copied since the process started (tests). */
long zd__rpc_copy_helped(void);

#endif
