#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""gen_golden.py: makes the golden reference tensors again with PyTorch.

    /usr/bin/python3 tools/golden/gen_golden.py OUTDIR [options]

writes OUTDIR/golden/<case>/ and OUTDIR/golden-toolkit/<case>/: for each case
a manifest.txt and one IDX file per tensor, in the layout, with the folder
names, kinds, attributes, tensor names, file names, shapes and manifest line
order of tests/golden/README.md and tests/golden-toolkit/README.md.  Only
the values are new: every case draws them from its own fixed seed, in
float32, on one thread with PyTorch's deterministic algorithms, so two runs
write the same bytes.  tools/golden/regen.sh is the usual way to run it.

Needs Debian's python3-torch (PyTorch 1.13.1; nothing from pip) and, for the
images of the `net` and `convnet` cases, the Fashion-MNIST training set
(Debian's dataset-fashion-mnist, /usr/share/datasets/fashion-mnist; see
--fashion-mnist and --synthetic-images).

Existing case folders of the same names are emptied of their manifest and
.idx files and written anew; other files (README.md) are left alone.
--only CASE (repeatable) writes just those folders; --seed changes every
case's values at once.
"""

import argparse
import copy
import gzip
import os
import stat
import struct
import sys
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"

# Rows of the net's fc1.weight (128 x 9216) whose gradient and optimizer
# results are stored (README: "Row subsets").
FC1_ROWS = [0, 15, 117, 127]

# Hyper-parameters of the optimizer outputs, written as the models' attrs.
MODEL_ATTRS = [("batch", 4), ("sgd_lr", 0.03), ("momentum", 0.9), ("weight_decay", 0.0001),
               ("adam_lr", 0.001), ("adam_beta1", 0.9), ("adam_beta2", 0.999),
               ("adam_eps", 1e-08)]

MULTI_OUTPUT_COMMENT = "# several outputs: grads are of L = sum_k sum(output_k * dy.k)"


# ---- IDX files and manifests ----

def idx_bytes(t):
    """The IDX encoding of a float32 or uint8 tensor (README: big-endian
    header and float32 elements; a 0-d tensor is stored with dims [1])."""
    t = t.detach().cpu().contiguous()
    shape = list(t.shape) or [1]
    if not 1 <= len(shape) <= 4:
        raise ValueError("IDX here holds 1 to 4 dimensions, not %d" % len(shape))
    if t.dtype == torch.float32:
        code, data = 0x0D, t.numpy().astype(">f4").tobytes()
    elif t.dtype == torch.uint8:
        code, data = 0x08, t.numpy().tobytes()
    else:
        raise ValueError("IDX here holds float32 or uint8, not %s" % t.dtype)
    header = bytes([0, 0, code, len(shape)]) + struct.pack(">%dI" % len(shape), *shape)
    count = 1
    for d in shape:
        count *= d
    assert len(data) == count * (4 if code == 0x0D else 1)
    return header + data


def fmt_attr(v):
    """An attribute value as the manifests spell it: Python's str() of the
    number (0.0001, 1e-08), ints as they are."""
    if isinstance(v, bool):
        return str(int(v))
    return str(v)


class Case:
    """One case folder: a manifest (kind, attrs, optional comments, one line
    per tensor in the order added) and its IDX files."""

    def __init__(self, name, kind, attrs=(), comments=()):
        self.name, self.kind = name, kind
        self.attrs = list(attrs)
        self.comments = list(comments)
        self.entries = []   # (role, manifest name, file, bytes)

    def add(self, role, name, tensor, rows=None):
        assert role in ("input", "param", "output", "grad")
        t = tensor.detach()
        if rows is not None:
            t = t[list(rows)]
            mname = "%s[rows=%s]" % (name, ",".join(str(r) for r in rows))
            fname = "%s.%s.rows.idx" % (role, name)
        else:
            mname, fname = name, "%s.%s.idx" % (role, name)
        if t.dtype == torch.float32 and not torch.isfinite(t).all():
            raise ValueError("%s: %s %s is not finite" % (self.name, role, mname))
        if any(fname == e[2] for e in self.entries):
            raise ValueError("%s: two tensors in %s" % (self.name, fname))
        self.entries.append((role, mname, fname, idx_bytes(t)))

    def manifest(self):
        lines = ["# kind: %s" % self.kind,
                 "# attrs: " + " ".join("%s=%s" % (k, fmt_attr(v)) for k, v in self.attrs)]
        lines += self.comments
        lines += ["%s %s %s" % (role, name, fname) for role, name, fname, _ in self.entries]
        return "".join(line + "\n" for line in lines)

    def write(self, root):
        d = os.path.join(root, self.name)
        if os.path.isdir(d):
            # the committed folders may be read-only (copied from a read-only share)
            os.chmod(d, os.stat(d).st_mode | stat.S_IWUSR | stat.S_IXUSR)
            for f in sorted(os.listdir(d)):
                if f == "manifest.txt" or f.endswith(".idx"):
                    os.remove(os.path.join(d, f))
        else:
            os.makedirs(d)
        for _, _, fname, data in self.entries:
            with open(os.path.join(d, fname), "wb") as f:
                f.write(data)
        with open(os.path.join(d, "manifest.txt"), "w", encoding="ascii", newline="\n") as f:
            f.write(self.manifest())


# ---- random data ----

def case_seed(base, set_name, case_name):
    """Each case's own seed, so adding or reordering cases changes no other."""
    return (base * 1000003 + zlib.crc32(("%s/%s" % (set_name, case_name)).encode())) % (2 ** 31)


def randn(*shape, scale=1.0):
    return torch.randn(*shape, dtype=torch.float32) * scale


def uniform(lo, hi, *shape):
    return torch.rand(*shape, dtype=torch.float32) * (hi - lo) + lo


def away_from_zero(x, margin=1e-2):
    """x with every |element| < margin moved to +-0.5 (README: no relu input
    lies within 1e-3 of 0)."""
    small = x.abs() < margin
    return torch.where(small, torch.where(x < 0, torch.full_like(x, -0.5), torch.full_like(x, 0.5)),
                       x)


def pool_input(shape, k, min_gap=1e-3, tries=100):
    """randn(shape) whose every k x k pooling window has a unique maximum,
    at least min_gap above the window's runner-up (README: no ties)."""
    for _ in range(tries):
        x = randn(*shape)
        n, c, h, w = shape
        win = x[:, :, :h // k * k, :w // k * k].reshape(n, c, h // k, k, w // k, k)
        win = win.permute(0, 1, 2, 4, 3, 5).reshape(-1, k * k)
        top2 = win.topk(2, dim=1).values
        if (top2[:, 0] - top2[:, 1]).min() >= min_gap:
            return x
    raise RuntimeError("no tie-free pooling input in %d tries" % tries)


def weight_for(out_features, fan_in_shape):
    """A conv/linear weight of order 1/sqrt(fan_in), so outputs are of order 1."""
    fan_in = 1
    for d in fan_in_shape:
        fan_in *= d
    return randn(out_features, *fan_in_shape, scale=fan_in ** -0.5)


# ---- single-op and cell cases: L = sum_k sum(output_k * dy_k) ----

def op_case(case, inputs, params, fn, out_names=("y",)):
    """inputs, params: lists of (name, tensor); fn(*inputs, *params) returns
    one tensor or a tuple in out_names' order.  Writes the inputs, then the
    upstream gradients (dy, or dy.<output> for several outputs), the params,
    the outputs, and the grads of every float input and param, in that
    order, as the committed manifests have them."""
    leaves = []
    for _, t in inputs + params:
        t = t.detach().clone()
        if t.dtype == torch.float32:
            t.requires_grad_(True)
        leaves.append(t)
    outs = fn(*leaves)
    if not isinstance(outs, tuple):
        outs = (outs,)
    assert len(outs) == len(out_names)
    dys = [randn(*o.shape) if o.dim() else randn(1) for o in outs]
    torch.autograd.backward(list(outs), [d.reshape(o.shape) for d, o in zip(dys, outs)])
    if len(outs) > 1:
        case.comments.append(MULTI_OUTPUT_COMMENT)
    for (name, _), t in zip(inputs, leaves):
        case.add("input", name, t)
    for name, d in zip(out_names, dys):
        case.add("input", "dy" if len(outs) == 1 else "dy." + name, d)
    for (name, _), t in zip(params, leaves[len(inputs):]):
        case.add("param", name, t)
    for name, o in zip(out_names, outs):
        case.add("output", name, o.reshape(1) if o.dim() == 0 else o)
    for (name, _), t in zip(inputs + params, leaves):
        if t.requires_grad:
            case.add("grad", name, t.grad)
    return case


def conv2d_case(name, x_shape, out_ch, k, stride, padding):
    c_in = x_shape[1]
    case = Case(name, "conv2d", [("stride", stride), ("padding", padding), ("dilation", 1),
                                 ("groups", 1)])
    x = randn(*x_shape)
    w = weight_for(out_ch, (c_in, k, k))
    b = randn(out_ch, scale=0.1)
    return op_case(case, [("x", x)], [("weight", w), ("bias", b)],
                   lambda x, w, b: F.conv2d(x, w, b, stride=stride, padding=padding))


def max_pool2d_case(name, x_shape, k):
    case = Case(name, "max_pool2d", [("kernel_size", k), ("stride", k), ("padding", 0),
                                     ("ceil_mode", 0)])
    return op_case(case, [("x", pool_input(x_shape, k))], [],
                   lambda x: F.max_pool2d(x, k, stride=k, padding=0, ceil_mode=False))


def linear_case(name, n, fin, fout):
    case = Case(name, "linear")
    return op_case(case, [("x", randn(n, fin))],
                   [("weight", weight_for(fout, (fin,))), ("bias", randn(fout, scale=0.1))],
                   F.linear)


def relu_case(name, shape):
    return op_case(Case(name, "relu"), [("x", away_from_zero(randn(*shape)))], [], F.relu)


def log_softmax_case(name, n, c):
    return op_case(Case(name, "log_softmax", [("dim", 1)]), [("x", randn(n, c, scale=3.0))],
                   [], lambda x: F.log_softmax(x, dim=1))


def nll_loss_case(name, n, c):
    x = F.log_softmax(randn(n, c, scale=2.0), dim=1)
    target = torch.randint(0, c, (n,), dtype=torch.int64).to(torch.uint8)
    return op_case(Case(name, "nll_loss", [("reduction", "mean")]),
                   [("x", x), ("target", target)], [],
                   lambda x, t: F.nll_loss(x, t.long(), reduction="mean"))


# ---- the models ----

class Net(nn.Module):
    """The parameter-server tutorial CNN (README "net")."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x, acts=None):
        h = F.relu(self.conv1(x))
        h = self.conv2(h)                  # no ReLU here
        h = F.max_pool2d(h, 2)
        h = self.dropout1(h)               # identity in eval mode
        flat = torch.flatten(h, 1)
        f1 = self.fc1(flat)
        h = self.dropout2(F.relu(f1))
        f2 = self.fc2(h)
        if acts is not None:
            acts.update({"act.flatten": flat, "act.fc1": f1, "act.fc2": f2})
        return F.log_softmax(f2, dim=1)


class ConvNet(nn.Module):
    """The small CNN (README "convnet")."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 3, 3, 1)
        self.fc = nn.Linear(192, 10)

    def forward(self, x, acts=None):
        c = self.conv1(x)
        flat = torch.flatten(F.relu(F.max_pool2d(c, 3)), 1)
        logits = self.fc(flat)
        if acts is not None:
            acts.update({"act.conv1": c, "act.flatten": flat, "act.fc": logits})
        return F.log_softmax(logits, dim=1)


def read_idx_gz(path):
    with gzip.open(path, "rb") as f:
        b = f.read()
    if b[0:3] != b"\x00\x00\x08":
        raise ValueError("%s: not a uint8 IDX file" % path)
    nd = b[3]
    dims = struct.unpack(">%dI" % nd, b[4:4 + 4 * nd])
    t = torch.frombuffer(bytearray(b[4 + 4 * nd:]), dtype=torch.uint8)
    return t.reshape(dims)


class Images:
    """Where the models' input images come from: samples of the Fashion-MNIST
    training set (drawn with the case's seed), or synthetic ones."""

    def __init__(self, fashion_dir, synthetic):
        self.fashion_dir, self.synthetic = fashion_dir, synthetic
        self.images = self.labels = None

    def load(self):
        """Reads the training set once, when a model case first needs it."""
        if self.synthetic or self.images is not None:
            return
        ip = os.path.join(self.fashion_dir, "train-images-idx3-ubyte.gz")
        lp = os.path.join(self.fashion_dir, "train-labels-idx1-ubyte.gz")
        if not (os.path.exists(ip) and os.path.exists(lp)):
            sys.exit("gen_golden: no Fashion-MNIST training set in %s (install Debian's "
                     "dataset-fashion-mnist, pass --fashion-mnist DIR, or --synthetic-images)"
                     % self.fashion_dir)
        self.images, self.labels = read_idx_gz(ip), read_idx_gz(lp)
        assert self.images.shape[1:] == (28, 28) and len(self.labels) == len(self.images)

    def batch(self, n):
        self.load()
        if not self.synthetic:
            at = torch.randperm(len(self.images))[:n]
            return self.images[at].clone(), self.labels[at].clone()
        # synthetic: a dark background with a bright random patch, like a
        # garment centred on the frame
        img = torch.zeros(n, 28, 28, dtype=torch.uint8)
        for i in range(n):
            top, left = torch.randint(2, 7, (2,)).tolist()
            h, w = torch.randint(14, 20, (2,)).tolist()
            img[i, top:top + h, left:left + w] = torch.randint(0, 256, (h, w), dtype=torch.uint8)
        return img, torch.randint(0, 10, (n,), dtype=torch.uint8)


def normalise(images):
    """(images/255 - 0.1307) / 0.3081 in float32, as (N, 1, 28, 28)."""
    x = images.to(torch.float32).div(255.0).sub(0.1307).div(0.3081)
    return x.unsqueeze(1).contiguous()


def optimizer_steps(params0, grads, make_opt, steps):
    """Steps copies of params0 with the same gradients every step; returns
    the parameter values after each step."""
    ps = [p.detach().clone().requires_grad_(True) for p in params0]
    opt = make_opt(ps)
    after = []
    for _ in range(steps):
        for p, g in zip(ps, grads):
            p.grad = g.detach().clone()
        opt.step()
        after.append([p.detach().clone() for p in ps])
    return after


# Smallest margins a model case must keep (those of the committed sets were
# 1.3e-6 and 8.8e-7); draws that come closer are made again.
MIN_RELU_MARGIN = 1e-6
MIN_POOL_GAP = 5e-7
MAX_DRAWS = 100


def model_case(name, kind, model_cls, images):
    attrs = dict(MODEL_ATTRS)
    n = attrs["batch"]
    case = Case(name, kind, MODEL_ATTRS)
    seed = torch.initial_seed()
    for draw in range(MAX_DRAWS):
        torch.manual_seed(seed + draw)
        model = model_cls()      # PyTorch's default init, from the case's seed
        model.eval()             # dropout is the identity
        imgs, target = images.batch(n)
        x = normalise(imgs)
        near0, gap = margins(model, x)
        if near0 >= MIN_RELU_MARGIN and gap >= MIN_POOL_GAP:
            break
        print("%s: draw %d comes within %.2g of a ReLU's 0 and %.2g of a max-pool tie; "
              "drawing again" % (name, draw, near0, gap))
    else:
        sys.exit("gen_golden: %s: no draw in %d keeps its margins" % (name, MAX_DRAWS))
    case.add("input", "images", imgs)
    case.add("input", "x", x)
    case.add("input", "target", target)
    names = [k for k, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    for k, p in zip(names, params):
        case.add("param", k, p)

    acts = {}
    logprobs = model(x, acts)
    loss = F.nll_loss(logprobs, target.long(), reduction="mean")
    model.zero_grad()
    loss.backward()
    grads = [p.grad.detach().clone() for p in params]
    case.add("output", "logprobs", logprobs)
    case.add("output", "loss", loss.reshape(1))
    for k, v in acts.items():
        case.add("output", k, v)
    rows = {"fc1.weight": FC1_ROWS} if kind == "net" else {}
    for k, g in zip(names, grads):
        case.add("grad", k, g, rows=rows.get(k))

    sgd = optimizer_steps(params, grads, lambda ps: torch.optim.SGD(ps, lr=attrs["sgd_lr"]), 1)
    mom = optimizer_steps(params, grads, lambda ps: torch.optim.SGD(
        ps, lr=attrs["sgd_lr"], momentum=attrs["momentum"], dampening=0,
        weight_decay=attrs["weight_decay"], nesterov=False), 2)
    adam = optimizer_steps(params, grads, lambda ps: torch.optim.Adam(
        ps, lr=attrs["adam_lr"], betas=(attrs["adam_beta1"], attrs["adam_beta2"]),
        eps=attrs["adam_eps"], weight_decay=0, amsgrad=False), 2)
    for prefix, results in (("sgd", sgd), ("momentum", mom), ("adam", adam)):
        for s, values in enumerate(results, 1):
            for k, v in zip(names, values):
                case.add("output", "%s.step%d.%s" % (prefix, s, k), v, rows=rows.get(k))

    # loss.after_sgd: the same batch through the sgd.step1 parameters
    with torch.no_grad():
        for p, v in zip(params, sgd[0]):
            p.copy_(v)
        loss2 = F.nll_loss(model(x), target.long(), reduction="mean")
    case.add("output", "loss.after_sgd", loss2.reshape(1))
    return case


def margins(model, x):
    """(smallest |ReLU input|, smallest gap between a max-pool window's
    maximum and its runner-up) of the model on x, in float64.  Near 0 or
    near a tie, a float32 implementation that rounds differently from
    PyTorch may take the other branch, and then its gradients differ by far
    more than rounding.  Exact ties (in float64) are not counted: they come
    from the images' constant background, whose patches are equal, so
    whichever of them takes the gradient gives the same parameter gradients."""
    m = copy.deepcopy(model).double()
    x = x.double()
    with torch.no_grad():
        if isinstance(m, Net):
            c1 = m.conv1(x)
            h2 = m.conv2(F.relu(c1))
            f1 = m.fc1(torch.flatten(F.max_pool2d(h2, 2), 1))
            relu_in, pools = [c1, f1], [(h2, 2)]
        else:
            c1 = m.conv1(x)
            relu_in, pools = [F.max_pool2d(c1, 3)], [(c1, 3)]
        near0 = min(float(t.abs().min()) for t in relu_in)
        gap = float("inf")
        for t, k in pools:
            n, c, h, w = t.shape
            win = t[:, :, :h // k * k, :w // k * k].reshape(n, c, h // k, k, w // k, k)
            top2 = win.permute(0, 1, 2, 4, 3, 5).reshape(-1, k * k).topk(2, dim=1).values
            d = top2[:, 0] - top2[:, 1]
            d = d[d > 1e-12]
            if d.numel():
                gap = min(gap, float(d.min()))
    return near0, gap


# ---- the toolkit cases ----

def cell_case(name, kind, cell):
    """One step of an RNN cell (nn.LSTMCell / GRUCell / RNNCell, default
    init), parameters renamed w_ih, w_hh, b_ih, b_hh."""
    n = 3
    x = randn(n, cell.input_size)
    h = randn(n, cell.hidden_size, scale=0.5)
    params = [("w_ih", cell.weight_ih.detach()), ("w_hh", cell.weight_hh.detach()),
              ("b_ih", cell.bias_ih.detach()), ("b_hh", cell.bias_hh.detach())]
    case = Case(name, kind)
    if kind == "lstm_cell":
        c = randn(n, cell.hidden_size, scale=0.5)
        return op_case(case, [("x", x), ("h", h), ("c", c)], params,
                       lambda x, h, c, *p: torch.lstm_cell(x, (h, c), *p),
                       out_names=("h", "c"))
    fn = torch.gru_cell if kind == "gru_cell" else torch.rnn_tanh_cell
    return op_case(case, [("x", x), ("h", h)], params, lambda x, h, *p: fn(x, h, *p))


def lstm_case(name, t_len, n, i, hidden, layers):
    lstm = nn.LSTM(i, hidden, num_layers=layers, batch_first=False, dropout=0.0)
    x = randn(t_len, n, i)
    h0 = randn(layers, n, hidden, scale=0.5)
    c0 = randn(layers, n, hidden, scale=0.5)
    params = [(k, p.detach()) for k, p in lstm.named_parameters()]

    def run(x, h0, c0, *ps):
        # what nn.LSTM.forward calls, with the parameters as leaves of their own
        return torch.lstm(x, (h0, c0), list(ps), True, layers, 0.0, False, False, False)

    case = Case(name, "lstm", [("num_layers", layers), ("batch_first", 0), ("dropout", 0)])
    op_case(case, [("x", x), ("h0", h0), ("c0", c0)], params, run,
            out_names=("output", "h_n", "c_n"))
    return case


def toolkit_cases():
    """(folder, builder) in a fixed order; each builder runs under its own seed."""
    def elementwise(name, kind, x, fn, attrs=()):
        return lambda: op_case(Case(name, kind, attrs), [("x", x())], [], fn)

    def embedding(name, padding_idx):
        def build():
            attrs = [] if padding_idx is None else [("padding_idx", padding_idx)]
            idx = torch.randint(0, 10, (2, 5), dtype=torch.int64)
            idx[0, 0] = 0                  # the padding row is used ...
            idx[1, 4] = idx[0, 1]          # ... and an index repeats
            weight = randn(10, 4)
            return op_case(Case(name, "embedding", attrs), [("idx", idx.to(torch.uint8))],
                           [("weight", weight)],
                           lambda i, w: F.embedding(i.long(), w, padding_idx=padding_idx))
        return build

    return [
        ("tanh", elementwise("tanh", "tanh", lambda: randn(2, 3, 4, scale=1.5), torch.tanh)),
        ("sigmoid", elementwise("sigmoid", "sigmoid", lambda: randn(3, 5, scale=2.0),
                                torch.sigmoid)),
        ("exp", elementwise("exp", "exp", lambda: randn(4, 4), torch.exp)),
        ("log", elementwise("log", "log", lambda: uniform(0.2, 2.7, 3, 4), torch.log)),
        ("gelu", elementwise("gelu", "gelu", lambda: randn(3, 7, scale=2.0),
                             lambda x: F.gelu(x, approximate="none"),
                             [("approximate", "none")])),
        ("softmax_4x10", elementwise("softmax_4x10", "softmax", lambda: randn(4, 10, scale=3.0),
                                     lambda x: F.softmax(x, dim=1), [("dim", 1)])),
        ("layer_norm", lambda: op_case(
            Case("layer_norm", "layer_norm", [("eps", 1e-05)]),
            [("x", randn(4, 3, 8, scale=2.0) + 0.5)],
            [("weight", 1.0 + randn(8, scale=0.1)), ("bias", randn(8, scale=0.1))],
            lambda x, w, b: F.layer_norm(x, (8,), w, b, eps=1e-05))),
        ("mse_loss", lambda: op_case(
            Case("mse_loss", "mse_loss", [("reduction", "mean")]),
            [("x", randn(5, 3, scale=0.7)), ("target", randn(5, 3))], [],
            lambda x, t: F.mse_loss(x, t, reduction="mean"))),
        ("embedding", embedding("embedding", None)),
        ("embedding_padding", embedding("embedding_padding", 0)),
        ("lstm_cell", lambda: cell_case("lstm_cell", "lstm_cell", nn.LSTMCell(5, 6))),
        ("gru_cell", lambda: cell_case("gru_cell", "gru_cell", nn.GRUCell(5, 6))),
        ("rnn_tanh_cell", lambda: cell_case("rnn_tanh_cell", "rnn_tanh_cell",
                                            nn.RNNCell(5, 6, nonlinearity="tanh"))),
        ("lstm_2layer", lambda: lstm_case("lstm_2layer", 4, 3, 5, 6, 2)),
        ("permute", elementwise("permute", "permute", lambda: randn(2, 3, 4),
                                lambda x: x.permute(2, 0, 1), [("dims", "2,0,1")])),
        ("add_broadcast", lambda: op_case(
            Case("add_broadcast", "add_broadcast"),
            [("x", randn(3, 1, 4)), ("y", randn(1, 5, 4))], [], torch.add)),
        ("mul_broadcast", lambda: op_case(
            Case("mul_broadcast", "mul_broadcast"),
            [("x", randn(3, 1, 4)), ("y", randn(5, 4))], [], torch.mul)),
    ]


def golden_cases(images):
    return [
        ("net", lambda: model_case("net", "net", Net, images)),
        ("convnet", lambda: model_case("convnet", "convnet", ConvNet, images)),
        ("conv2d_k3_p0", lambda: conv2d_case("conv2d_k3_p0", (2, 1, 8, 8), 4, 3, 1, 0)),
        ("conv2d_k3_p1", lambda: conv2d_case("conv2d_k3_p1", (2, 3, 7, 9), 5, 3, 1, 1)),
        ("conv2d_k2_p0", lambda: conv2d_case("conv2d_k2_p0", (1, 4, 6, 5), 2, 2, 1, 0)),
        ("conv2d_k3_s2_p1", lambda: conv2d_case("conv2d_k3_s2_p1", (2, 2, 9, 9), 3, 3, 2, 1)),
        ("conv2d_k3_p0_wide", lambda: conv2d_case("conv2d_k3_p0_wide", (2, 32, 6, 6), 64, 3, 1,
                                                  0)),
        ("max_pool2d_k2", lambda: max_pool2d_case("max_pool2d_k2", (2, 3, 8, 7), 2)),
        ("max_pool2d_k3", lambda: max_pool2d_case("max_pool2d_k3", (1, 2, 10, 11), 3)),
        ("max_pool2d_k3_convnet", lambda: max_pool2d_case("max_pool2d_k3_convnet",
                                                          (2, 3, 26, 26), 3)),
        ("linear_small", lambda: linear_case("linear_small", 3, 7, 5)),
        ("linear_192x10", lambda: linear_case("linear_192x10", 4, 192, 10)),
        ("relu", lambda: relu_case("relu", (2, 3, 4, 5))),
        ("log_softmax_4x10", lambda: log_softmax_case("log_softmax_4x10", 4, 10)),
        ("log_softmax_3x7", lambda: log_softmax_case("log_softmax_3x7", 3, 7)),
        ("nll_loss_4x10", lambda: nll_loss_case("nll_loss_4x10", 4, 10)),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("outdir", help="writes OUTDIR/golden and OUTDIR/golden-toolkit")
    ap.add_argument("--seed", type=int, default=1,
                    help="base seed; each case's seed is derived from it and the case's name "
                         "(default 1)")
    ap.add_argument("--fashion-mnist", default=FASHION_MNIST_DIR, metavar="DIR",
                    help="folder with train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz "
                         "(default %s)" % FASHION_MNIST_DIR)
    ap.add_argument("--synthetic-images", action="store_true",
                    help="make up the models' images instead of sampling Fashion-MNIST")
    ap.add_argument("--only", action="append", metavar="CASE",
                    help="write only this case folder (repeatable)")
    args = ap.parse_args()

    if not torch.__version__.startswith("1.13"):
        print("gen_golden: warning: PyTorch %s, the committed sets were made with 1.13.1"
              % torch.__version__, file=sys.stderr)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)

    images = Images(args.fashion_mnist, args.synthetic_images)
    sets = [("golden", golden_cases(images)), ("golden-toolkit", toolkit_cases())]
    known = {name for _, cases in sets for name, _ in cases}
    unknown = sorted(set(args.only or []) - known)
    if unknown:
        sys.exit("gen_golden: no case %s (cases: %s)"
                 % (", ".join(unknown), " ".join(sorted(known))))
    for set_name, cases in sets:
        root = os.path.join(args.outdir, set_name)
        for name, build in cases:
            if args.only and name not in args.only:
                continue
            torch.manual_seed(case_seed(args.seed, set_name, name))
            case = build()
            assert case.name == name
            os.makedirs(root, exist_ok=True)
            case.write(root)
            print("%s/%s: %d tensors" % (set_name, name, len(case.entries)))


if __name__ == "__main__":
    main()
