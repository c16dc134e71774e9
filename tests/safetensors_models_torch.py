# SPDX-License-Identifier: MIT
"""PyTorch's side of a Net trained by zdist (tests/test_safetensors_models.c
and the rpc_ps --save_model test of tests/test_rpc_ps_safetensors.c).

    safetensors_models_torch.py MODEL IO

loads MODEL, the weights zdist saved, into PyTorch's tutorial Net with
load_state_dict(strict=True) (so with exactly its names and shapes), runs
it in eval mode on IO's "x" and checks its log-probabilities against IO's
"logprobs", zdist's for the same x: within 1e-5 each, and the same argmax
for every image. With "y" in IO (labels), prints the accuracy to the image.
Exits 77 when torch cannot be imported, 1 on a mismatch.
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
from gen_reference import Net  # noqa: E402

TOL = 1e-5


def main():
    model_path, io_path = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    weights, meta = st.load(model_path)
    io, _ = st.load(io_path)
    model = Net()
    model.load_state_dict(weights, strict=True)
    model.eval()
    with torch.no_grad():
        ours = model(io["x"])
    theirs = io["logprobs"]
    diff = (ours - theirs).abs().max().item()
    same = bool((ours.argmax(1) == theirs.argmax(1)).all())
    n = ours.shape[0]
    print("PyTorch's Net on %d inputs: largest difference from zdist's log-probabilities %.3g, "
          "argmax %s; metadata %s" % (n, diff, "the same for each" if same else "DIFFERENT",
                                      dict(meta)))
    if "y" in io:
        correct = int((ours.argmax(1) == io["y"]).sum())
        print("PyTorch's accuracy: %d of %d images" % (correct, n))
    if diff > TOL or not same:
        print("MISMATCH: more than %g apart, or another argmax" % TOL)
        return 1
    print("PyTorch's outputs equal zdist's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
