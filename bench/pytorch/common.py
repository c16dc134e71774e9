# SPDX-License-Identifier: MIT
"""What the PyTorch sides of the benchmarks share: the tutorial Net, as
zdist's (no relu after conv2; dropout2 element-wise, where the tutorial's
Dropout2d on a 2-D input only draws a warning from PyTorch 1.13), and the
timing loop of the one-process figures."""
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    """The Net of PyTorch's parameter-server tutorial (bench_local's)."""

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
        x = self.dropout1(x).flatten(start_dim=1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def rates(step, per_step, rounds, seconds, warmup=3):
    """step() run warmup times, then for `rounds` rounds of `seconds`
    each: the rounds' rates in units per second (per_step units a step)."""
    for _ in range(warmup):
        step()
    out = []
    for _ in range(rounds):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            step()
            n += 1
        out.append(per_step * n / (time.perf_counter() - t0))
    return out


def report(name, unit, what, rs, csv):
    """Prints the median of the rates rs: `name,value,unit` with csv, else
    a line with PyTorch's version, its threads and the rounds' range."""
    med = statistics.median(rs)
    if csv:
        print(f"{name},{med:.1f},{unit}")
    else:
        print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads: "
              f"{med:.1f} {what} (rounds {min(rs):.1f}-{max(rs):.1f})")
