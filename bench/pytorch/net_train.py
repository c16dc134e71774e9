#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""PyTorch's side of bench_local's local_net_samples_per_s: the Net of
PyTorch's parameter-server tutorial, one training step = forward (training
mode, dropout on) + nll_loss + backward + plain SGD on a batch of random
28x28 images, as bench_local times zdist's; the median of ROUNDS rounds of
SECONDS each, in samples per second. Run with Debian's /usr/bin/python3
(python3-torch).

    /usr/bin/python3 bench/pytorch/net_train.py [--rounds N] [--seconds S] [--batch N]
                                                [--threads N] [--csv]

Prints torch_local_net_samples_per_s (with --csv: name,value,unit)."""
import argparse

import torch
import torch.nn.functional as F

from common import Net, rates, report


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: default)")
    ap.add_argument("--csv", action="store_true")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = Net().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.rand(a.batch, 1, 28, 28)
    y = torch.randint(0, 10, (a.batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        F.nll_loss(model(x), y).backward()
        opt.step()

    report("torch_local_net_samples_per_s", "samples/s", "samples/s",
           rates(step, a.batch, a.rounds, a.seconds), a.csv)


if __name__ == "__main__":
    main()
