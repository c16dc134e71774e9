#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""PyTorch's side of bench_local's lstm_seq_steps_per_s: a 2-layer
nn.LSTM (input and hidden 256), batch 32, 35 time steps, forward and
backward of sum(output * dy), as bench_local times zdist's; the median of
ROUNDS rounds of SECONDS each, in time steps per second (35 x iterations
per second). Run with Debian's /usr/bin/python3 (python3-torch).

    /usr/bin/python3 bench/pytorch/lstm.py [--rounds N] [--seconds S] [--threads N] [--csv]

Prints torch_lstm_seq_steps_per_s (with --csv: name,value,unit)."""
import argparse

import torch

from common import rates, report

T, B, D, H, LAYERS = 35, 32, 256, 256, 2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: default)")
    ap.add_argument("--csv", action="store_true")
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(D, H, num_layers=LAYERS)
    x = torch.randn(T, B, D, requires_grad=True)
    dy = torch.randn(T, B, H)

    def step():
        lstm.zero_grad(set_to_none=True)
        x.grad = None
        out, _ = lstm(x)
        (out * dy).sum().backward()

    report("torch_lstm_seq_steps_per_s", "steps/s", "time steps/s",
           rates(step, T, a.rounds, a.seconds), a.csv)


if __name__ == "__main__":
    main()
