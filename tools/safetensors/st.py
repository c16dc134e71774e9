# SPDX-License-Identifier: MIT
"""st.py: safetensors files from PyTorch without the safetensors package
(Debian has none): save(path, tensors, metadata) and load(path).

    import st
    st.save("model.safetensors", model.state_dict(), {"step": "200"})
    tensors, metadata = st.load("model.safetensors")

The format (https://github.com/huggingface/safetensors, README "Format"):
8 bytes N, a little-endian u64; N bytes of UTF-8 JSON starting with '{',
which may be padded with spaces: {"__metadata__": {str: str}, NAME:
{"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...},
offsets counted from the first byte after the header; then the data,
little-endian, row-major, the tensors covering it without gap or overlap.
save() writes what safetensors.torch.save_file writes (prepare() in
safetensors/src/tensor.rs): tensors sorted by dtype, descending in the
order of its Dtype enum (RANK below: widest first), then by name; compact
JSON (no spaces, non-ASCII kept) with "__metadata__" first; the header
padded with spaces to a multiple of 8 bytes, so every tensor is aligned.
"""
import json
import struct
import sys

import torch

RANK = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16",
        "I32", "U32", "F32", "F64", "I64", "U64"]
DTYPES = {torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16",
          torch.float16: "F16", torch.bfloat16: "BF16", torch.int32: "I32",
          torch.float32: "F32", torch.float64: "F64", torch.int64: "I64"}
TORCH = {v: k for k, v in DTYPES.items()}
assert sys.byteorder == "little", "st.py writes the host's bytes: little-endian hosts only"


def save(path, tensors, metadata=None):
    items = sorted(tensors.items(), key=lambda kv: (-RANK.index(DTYPES[kv[1].dtype]), kv[0]))
    header, blobs, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in items:
        data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def load(path):
    """(tensors, metadata): dicts in the file's order; the tensors own their memory."""
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        data = bytearray(buf[8 + n + begin:8 + n + end])
        dtype = TORCH[info["dtype"]]
        flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(info["shape"])
    return tensors, metadata
