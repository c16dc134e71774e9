# SPDX-License-Identifier: MIT
"""PyTorch's side of tests/test_safetensors.c, through tools/safetensors/st.py.

    safetensors_torch.py FROM_ZDIST TO_ZDIST

checks that FROM_ZDIST, the file zdist wrote (the dtypes zdist writes),
holds the reference tensors and metadata and is byte for byte the file
st.save (so safetensors' save_file) writes for them; then writes TO_ZDIST,
the reference tensors of every dtype zdist reads, for zdist to check. Exits
77 when torch cannot be imported. The C test builds the same tensors: keep
the two in step.
"""
import os
import sys

try:
    import torch
except ImportError:
    print("/usr/bin/python3 cannot import torch (Debian: python3-torch)")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools",
                                "safetensors"))
import st  # noqa: E402

META = {"format": "pt", "note": "\u00e9 \"q\" \\ \n\t\u65e5\u672c"}


def reference(every_dtype):
    t = {
        "layer.weight": torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) * 0.25 - 3,
        "steps": torch.tensor([-2**63, -1, 0, 2**63 - 1], dtype=torch.int64),
        "pixels": torch.arange(256, dtype=torch.int64).to(torch.uint8).reshape(16, 16),
        "scale": torch.tensor(7.5),
        "empty": torch.zeros(0, 5),
    }
    if every_dtype:
        t["f64"] = torch.tensor([1 / 3, -2.5, 1e300, 5e-324], dtype=torch.float64)
        t["f16"] = torch.tensor([0.0, -0.0, 1.0, -2.5, 65504.0, 2.0**-24, float("inf"),
                                 float("nan")], dtype=torch.float16)
        t["bf16"] = torch.tensor([1.0, -3.140625, 2.0**100, -(2.0**-100)], dtype=torch.bfloat16)
    return t


def check(path):
    tensors, meta = st.load(path)
    want = reference(False)
    if meta != META:
        print("metadata %r, expected %r" % (meta, META))
        return 1
    if list(tensors) != ["steps", "empty", "layer.weight", "scale", "pixels"]:
        print("tensors in the order %s" % list(tensors))
        return 1
    for name, t in want.items():
        if tensors[name].dtype != t.dtype or not torch.equal(tensors[name], t):
            print("%s: %r, expected %r" % (name, tensors[name], t))
            return 1
    st.save(path + ".torch", want, META)
    with open(path, "rb") as a, open(path + ".torch", "rb") as b:
        ours, theirs = a.read(), b.read()
    if ours != theirs:
        at = next(i for i in range(min(len(ours), len(theirs)) + 1)
                  if i == min(len(ours), len(theirs)) or ours[i] != theirs[i])
        print("zdist's file differs from PyTorch's at byte %d (%d and %d bytes):\n%r\n%r"
              % (at, len(ours), len(theirs), ours[:at + 40], theirs[:at + 40]))
        return 1
    print("ok: %d tensors, %d bytes, identical to PyTorch's" % (len(tensors), len(ours)))
    return 0


def main():
    if check(sys.argv[1]) != 0:
        return 1
    st.save(sys.argv[2], reference(True), META)
    return 0


sys.exit(main())
