#!/usr/bin/env python3
"""Independent safetensors reader (Python json + struct + torch), used by the C++ tests as the
reference: prints a JSON summary of every tensor of each FILE given on the command line.

For each tensor: dtype, shape, data_offsets, the float64 sum of its values, values at a few
positions, and for F32 tensors the sums after torch's own conversion to bf16 / f16 (so the tests can
check titan's converting writer bit for bit against torch)."""
import json
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "F64": torch.float64, "BF16": torch.bfloat16, "F16": torch.float16,
          "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8}


def summarize(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        dt = DTYPES[e["dtype"]]
        numel = 1
        for d in e["shape"]:
            numel *= d
        if numel:
            x = torch.frombuffer(bytearray(blob[base + begin:base + end]), dtype=dt)
        else:
            x = torch.zeros(0, dtype=dt)
        assert x.numel() == numel, name
        xd = x.double()
        positions = sorted({0, numel // 2, numel - 1}) if numel else []
        s = {"dtype": e["dtype"], "shape": e["shape"], "data_offsets": [begin, end],
             "sum": float(xd.sum()), "positions": positions, "values": [float(xd[i]) for i in positions]}
        if dt == torch.float32:
            s["bf16_sum"] = float(x.bfloat16().double().sum())
            s["f16_sum"] = float(x.half().double().sum())
        out[name] = s
    return {"metadata": meta, "header_bytes": n, "file_bytes": len(blob), "tensors": out}


if __name__ == "__main__":
    print(json.dumps({p: summarize(p) for p in sys.argv[1:]}))
