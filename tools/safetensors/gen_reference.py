# SPDX-License-Identifier: MIT
"""gen_reference.py: the reference files of tests/test_safetensors_models.c,
weights trained by PyTorch that zdist must load and compute with exactly.

    /usr/bin/python3 tools/safetensors/gen_reference.py [OUT_DIR]

writes into OUT_DIR (default: tests/safetensors/ of this repository), each
with tools/safetensors/st.py (the bytes safetensors.torch.save_file writes):

    net.safetensors      the parameter-server tutorial Net's state_dict()
                         after 5 SGD steps on fixed random data
    net_io.safetensors   "x" (8,1,28,28), and "logprobs" (8,10): the Net's
                         output for x in eval mode
    lstm.safetensors     a 2-layer nn.LSTM(6, 12)'s state_dict() after 5
                         Adam steps on fixed random data
    lstm_io.safetensors  "x" (5,3,6), "h0", "c0" (2,3,12), and its outputs
                         in eval mode: "out" (5,3,12), "h_n", "c_n" (2,3,12)

The files are committed (about 4.9 MB, the Net's weights nearly all of it)
and the test only reads them; run this again, and commit what it writes,
only when the models change. Seeds are fixed, but PyTorch's kernels differ
between versions and CPUs in their last bits: a regenerated file need not
be byte-identical, only as good. The Net is the one of zdist's nn/model_net.c
and of the PyTorch tutorial "Implementing a Parameter Server Using
Distributed RPC Framework": ReLU after conv1 only, max_pool2d(2) straight
on conv2's output.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import st  # noqa: E402


class Net(nn.Module):
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
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


META = {"generator": "tools/safetensors/gen_reference.py", "torch": torch.__version__}


def net(out_dir):
    torch.manual_seed(30)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model.train()
    for _ in range(5):
        x = torch.randn(16, 1, 28, 28)
        y = torch.randint(0, 10, (16,))
        opt.zero_grad()
        F.nll_loss(model(x), y).backward()
        opt.step()
    model.eval()
    x = torch.randn(8, 1, 28, 28)
    with torch.no_grad():
        logprobs = model(x)
    st.save(os.path.join(out_dir, "net.safetensors"), model.state_dict(), dict(META, steps="5"))
    st.save(os.path.join(out_dir, "net_io.safetensors"), {"x": x, "logprobs": logprobs}, META)


def lstm(out_dir):
    torch.manual_seed(31)
    model = nn.LSTM(6, 12, num_layers=2, dropout=0.2)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()
    for _ in range(5):
        x = torch.randn(5, 3, 6)
        target = torch.randn(5, 3, 12)
        opt.zero_grad()
        out, _ = model(x)
        F.mse_loss(out, target).backward()
        opt.step()
    model.eval()
    x = torch.randn(5, 3, 6)
    h0 = torch.randn(2, 3, 12)
    c0 = torch.randn(2, 3, 12)
    with torch.no_grad():
        out, (h_n, c_n) = model(x, (h0, c0))
    st.save(os.path.join(out_dir, "lstm.safetensors"), model.state_dict(), dict(META, steps="5"))
    st.save(os.path.join(out_dir, "lstm_io.safetensors"),
            {"x": x, "h0": h0, "c0": c0, "out": out, "h_n": h_n, "c_n": c_n}, META)


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "tests",
                                                                 "safetensors")
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(1)
    net(out_dir)
    lstm(out_dir)
    for name in sorted(os.listdir(out_dir)):
        if name.endswith(".safetensors"):
            print("%-22s %9d bytes" % (name, os.path.getsize(os.path.join(out_dir, name))))


if __name__ == "__main__":
    main()
