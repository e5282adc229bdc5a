#!/usr/bin/env python3
"""ggml's own dequantization (the `gguf` package's `gguf.quants`, pinned 0.19.0) as the reference
for Ballast's GGUF reader and quantized kernels.

Three modes:

    dequantize.py blocks TYPE IN OUT
        IN holds whole blocks of ggml type TYPE (e.g. Q4_K); OUT receives their values as
        little-endian f32. Ballast's test `dequantization_matches_gguf_py_on_random_blocks`
        writes random blocks and calls this with the Python that `BALLAST_GGUF_PYTHON` names.

    dequantize.py fixture FILE.gguf [FILE.gguf ...] > engine/tests/fixtures/kquant_blocks.json
        Real blocks: for every quantized type in the files, blocks from tensors spread over the
        layers (the first, a middle and the last block of each), with their bytes and gguf-py's
        values, and each file's sha256. The test `real_blocks_dequantize_as_gguf_py_does`
        reads the fixture, so it runs without Python.

    dequantize.py sums FILE.gguf
        Per tensor: type and the float64 sum and absolute sum of gguf-py's values, as JSON.
        `whole_files_dequantize_as_gguf_py_does` compares every tensor of a cached K-quant
        file with these.

    python3 -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf==0.19.0
"""
import hashlib
import json
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf import quants

try:
    from importlib.metadata import version as _version

    GGUF_VERSION = _version("gguf")
except Exception:  # pragma: no cover
    GGUF_VERSION = "unknown"

# Blocks taken per tensor, and tensors per (file, type): enough to see every layer kind.
TENSORS_PER_TYPE = 4


def dequantize_bytes(qtype, raw):
    return quants.dequantize(np.frombuffer(raw, dtype=np.uint8), qtype).astype(np.float32).ravel()


def cmd_blocks(type_name, src, dst):
    qtype = GGMLQuantizationType[type_name]
    with open(src, "rb") as f:
        raw = f.read()
    values = dequantize_bytes(qtype, raw)
    with open(dst, "wb") as f:
        f.write(values.astype("<f4").tobytes())


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def quantized(t):
    return t.tensor_type not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16,
                                 GGMLQuantizationType.BF16)


def cmd_fixture(paths):
    files, blocks = [], []
    for path in paths:
        reader = GGUFReader(path)
        files.append({"name": path.rsplit("/", 1)[-1], "sha256": sha256(path)})
        by_type = {}
        for t in reader.tensors:
            if quantized(t):
                by_type.setdefault(t.tensor_type, []).append(t)
        for qtype, tensors in sorted(by_type.items(), key=lambda kv: kv[0].value):
            step = max(1, len(tensors) // TENSORS_PER_TYPE)
            for t in tensors[::step][:TENSORS_PER_TYPE]:
                block_elems, block_bytes = quants.GGML_QUANT_SIZES[qtype]
                raw = np.asarray(t.data).view(np.uint8).ravel()
                count = raw.size // block_bytes
                for b in sorted({0, count // 2, count - 1}):
                    one = raw[b * block_bytes:(b + 1) * block_bytes].tobytes()
                    values = dequantize_bytes(qtype, one)
                    blocks.append({
                        "file": files[-1]["name"],
                        "tensor": t.name,
                        "type": qtype.name,
                        "block": b,
                        "bytes": one.hex(),
                        "values_f32le": values.astype("<f4").tobytes().hex(),
                    })
    json.dump({
        "generator": f"gguf {GGUF_VERSION} (gguf.quants.dequantize), "
                     "scripts/reference/dequantize.py fixture",
        "files": files,
        "blocks": blocks,
    }, sys.stdout, indent=1)
    print()


def cmd_sums(path):
    reader = GGUFReader(path)
    out = {}
    for t in reader.tensors:
        raw = np.asarray(t.data).view(np.uint8).ravel()
        if t.tensor_type == GGMLQuantizationType.F32:
            values = raw.view("<f4")
        else:
            values = dequantize_bytes(t.tensor_type, raw.tobytes())
        v = values.astype(np.float64)
        out[t.name] = {"type": t.tensor_type.name, "sum": float(v.sum()),
                       "abs_sum": float(np.abs(v).sum()), "n": int(v.size)}
    json.dump({"generator": f"gguf {GGUF_VERSION}", "sha256": sha256(path), "tensors": out},
              sys.stdout)
    print()


def main(argv):
    if len(argv) >= 5 and argv[1] == "blocks":
        cmd_blocks(argv[2], argv[3], argv[4])
    elif len(argv) >= 3 and argv[1] == "fixture":
        cmd_fixture(argv[2:])
    elif len(argv) == 3 and argv[1] == "sums":
        cmd_sums(argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
