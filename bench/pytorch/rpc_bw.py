#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""PyTorch's side of bench_rpc's throughput figures: rpc_sync of one float32
tensor of 1, 16 and 64 MiB to a function on the other process of a world of
two on this host, which answers with a scalar; the best of N calls, as
bench_rpc's rpc_bw_*_GBps. Run with Debian's /usr/bin/python3
(python3-torch).

    /usr/bin/python3 bench/pytorch/rpc_bw.py [--reps N] [--csv]

Prints torch_rpc_bw_{1,16,64}MiB_GBps (with --csv: name,value,unit)."""
import argparse
import os
import socket
import time

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp

SIZES = [(1, "1MiB"), (16, "16MiB"), (64, "64MiB")]


def sink(t):
    return t.numel()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(rank, port, reps, csv, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=120)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, rpc_backend_options=opts)
    if rank == 0:
        for mib, name in SIZES:
            t = torch.ones(mib * (1 << 20) // 4)
            rpc.rpc_sync("w1", sink, args=(t,))   # warm
            best = 0.0
            for _ in range(reps):
                t0 = time.perf_counter()
                rpc.rpc_sync("w1", sink, args=(t,))
                dt = time.perf_counter() - t0
                best = max(best, mib * (1 << 20) / dt / 1e9)
            out.put((f"torch_rpc_bw_{name}_GBps", best))
        out.put(None)
    rpc.shutdown()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--csv", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    ps = [ctx.Process(target=run, args=(r, port, a.reps, a.csv, q)) for r in range(2)]
    for p in ps:
        p.start()
    rows = []
    while True:
        item = q.get(timeout=600)
        if item is None:
            break
        rows.append(item)
    for p in ps:
        p.join(timeout=120)
    for name, v in rows:
        print(f"{name},{v:.2f},GB/s" if a.csv else f"{name:<28}{v:8.2f} GB/s")


if __name__ == "__main__":
    main()
