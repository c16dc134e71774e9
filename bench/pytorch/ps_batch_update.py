#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""PyTorch's side of bench_examples' ps_batch_update_samples_per_s: the
batch-updating parameter server of PyTorch's tutorial "Implementing Batch
RPC Processing Using Asynchronous Executions" (BatchUpdateParameterServer
and Trainer, as written there: the server's update_and_fetch_model is an
@rpc.functions.async_execution function that answers every trainer when
all gradients of a round are in, after one SGD step with their sum
divided by the number of trainers), with the tutorial Net of
bench_examples instead of its ResNet-50, batch 32 of random data, 1 server
and 3 trainers on this host, each process with one thread. Each trainer
times its loop after a first get_model; the figure is the samples of the
three over the slowest trainer's time, as bench_examples computes it.
Run with Debian's /usr/bin/python3 (python3-torch).

    /usr/bin/python3 bench/pytorch/ps_batch_update.py [--batches N] [--csv]

Prints torch_ps_batch_update_samples_per_s (with --csv: name,value,unit)."""
import argparse
import os
import socket
import threading
import time

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import optim

from common import Net

TRAINERS = 3
BATCH = 32


class BatchUpdateParameterServer:
    def __init__(self, batch_update_size=TRAINERS):
        self.model = Net()
        self.lock = threading.Lock()
        self.future_model = torch.futures.Future()
        self.batch_update_size = batch_update_size
        self.curr_update_size = 0
        self.optimizer = optim.SGD(self.model.parameters(), lr=0.01)
        for p in self.model.parameters():
            p.grad = torch.zeros_like(p)

    def get_model(self):
        return self.model

    @staticmethod
    @rpc.functions.async_execution
    def update_and_fetch_model(ps_rref, grads):
        self = ps_rref.local_value()
        with self.lock:
            self.curr_update_size += 1
            for p, g in zip(self.model.parameters(), grads):
                p.grad += g
            fut = self.future_model
            if self.curr_update_size >= self.batch_update_size:
                for p in self.model.parameters():
                    p.grad /= self.batch_update_size
                self.curr_update_size = 0
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=False)
                fut.set_result(self.model)
                self.future_model = torch.futures.Future()
        return fut


def train(ps_rref, rank, batches):
    torch.manual_seed(rank)
    x = torch.randn(BATCH, 1, 28, 28)
    y = torch.randint(0, 10, (BATCH,))
    m = ps_rref.rpc_sync().get_model()
    t0 = time.perf_counter()
    for _ in range(batches):
        m.train()
        loss = F.nll_loss(m(x), y)
        loss.backward()
        m = rpc.rpc_sync(ps_rref.owner(), BatchUpdateParameterServer.update_and_fetch_model,
                         args=(ps_rref, [p.grad for p in m.cpu().parameters()]))
    return time.perf_counter() - t0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(rank, port, batches, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    opts = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=600)
    name = "ps" if rank == 0 else f"trainer{rank}"
    rpc.init_rpc(name, rank=rank, world_size=1 + TRAINERS, rpc_backend_options=opts)
    if rank == 0:
        ps_rref = rpc.RRef(BatchUpdateParameterServer())
        futs = [rpc.rpc_async(f"trainer{r}", train, args=(ps_rref, r, batches))
                for r in range(1, 1 + TRAINERS)]
        slowest = max(f.wait() for f in futs)
        out.put(TRAINERS * BATCH * batches / slowest)
    rpc.shutdown()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--csv", action="store_true")
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=run, args=(r, port, a.batches, out))
             for r in range(1 + TRAINERS)]
    for p in procs:
        p.start()
    value = out.get(timeout=1800)
    for p in procs:
        p.join()
    name = "torch_ps_batch_update_samples_per_s"
    if a.csv:
        print(f"{name},{value:.1f},samples/s")
    else:
        print(f"{name:<40} {value:12.1f}  samples/s")


if __name__ == "__main__":
    main()
