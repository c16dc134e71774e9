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
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    """The tutorial's Net (rpc_parameter_server.py), as zdist's: no relu
    after conv2, and dropout2 element-wise (the tutorial's Dropout2d on a
    2-D input, which PyTorch 1.13 warns about)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout2d(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(self.conv2(x), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


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

    for _ in range(3):
        step()
    rates = []
    for _ in range(a.rounds):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < a.seconds:
            step()
            n += 1
        rates.append(a.batch * n / (time.perf_counter() - t0))
    med = statistics.median(rates)
    if a.csv:
        print(f"torch_local_net_samples_per_s,{med:.1f},samples/s")
    else:
        print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads: "
              f"{med:.1f} samples/s (rounds {min(rates):.1f}-{max(rates):.1f})")


if __name__ == "__main__":
    main()
