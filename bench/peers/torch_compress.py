"""PyTorch's side of examples/compress: the same trained weights (a file `compress --save-weights` or
`train_fmnist --save` wrote), compressed with PyTorch's own tools, printing the same JSON lines:
    python3 bench/peers/torch_compress.py --model mlp --weights mlp.safetensors
Rows: f32; torch.nn.utils.prune.l1_unstructured at 80% on every Linear (and Conv2d), before and after
prune.remove; torch.ao.quantization.quantize_dynamic to int8 (Linear). No fine-tuning: the rows compare bytes
and time on the same weights. model_bytes counts what the module holds: parameters and buffers (the pruned
model's weight_orig and its f32 weight_mask both), and for the quantised Linears their packed int8 weights and
scales, which are not parameters (torch.save's size of the packed state, the closest measure PyTorch offers).
Run it through bench/compare_compress.sh, which runs frugal's side on the same weights."""
import argparse
import copy
import gzip
import io
import json
import os
import statistics
import struct
import tempfile
import time
import warnings

import torch
import torch.nn as nn
import torch.nn.utils.prune
from safetensors import safe_open
from safetensors.torch import load_file, save_file

ROOT = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    data = gzip.open(path).read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return torch.frombuffer(bytearray(data[4 + 4 * ndim:]), dtype=torch.uint8).reshape(dims)


def make(model):
    if model == "cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def tensor_bytes(m):
    return sum(t.numel() * t.element_size() for t in list(m.parameters()) + list(m.buffers()))


def packed_bytes(m):
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    return buf.getbuffer().nbytes


def file_bytes(m):
    state = {k: v.contiguous() for k, v in m.state_dict().items() if isinstance(v, torch.Tensor)}
    with tempfile.NamedTemporaryFile(suffix=".safetensors") as f:
        save_file(state, f.name)
        return os.path.getsize(f.name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    ap.add_argument("--weights", required=True)
    ap.add_argument("--repeats", type=int, default=21)
    args = ap.parse_args()
    with safe_open(args.weights, "pt") as f:
        meta = f.metadata()
    mean, std = float(meta["input_mean"]), float(meta["input_std"])
    x = (read_idx(f"{ROOT}/t10k-images-idx3-ubyte.gz").float().div_(255).sub_(mean).div_(std)).unsqueeze(1)
    y = read_idx(f"{ROOT}/t10k-labels-idx1-ubyte.gz").long()
    base = make(args.model)
    base.load_state_dict(load_file(args.weights))
    base.eval()

    def row(technique, m, model_bytes, file_size):
        with torch.inference_mode():
            correct = sum(int((m(x[i:i + 250]).argmax(1) == y[i:i + 250]).sum()) for i in range(0, 10000, 250))
            batch = x[:256]
            for _ in range(3):
                m(batch)
            ms = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                m(batch)
                ms.append((time.perf_counter() - t0) * 1e3)
        print(json.dumps({"peer": "pytorch", "technique": technique, "model_bytes": model_bytes,
                          "file_bytes": file_size, "test_accuracy": round(correct / 10000, 4),
                          "infer_ms": round(statistics.median(ms), 4)}), flush=True)

    row("f32", base, tensor_bytes(base), file_bytes(base))
    pruned = copy.deepcopy(base)
    layers = [m for m in pruned.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    for m in layers:
        torch.nn.utils.prune.l1_unstructured(m, "weight", amount=0.8)
    row("l1 unstructured 80% (mask kept)", pruned, tensor_bytes(pruned), file_bytes(pruned))
    for m in layers:
        torch.nn.utils.prune.remove(m, "weight")
    row("l1 unstructured 80% (removed)", pruned, tensor_bytes(pruned), file_bytes(pruned))
    q = torch.ao.quantization.quantize_dynamic(copy.deepcopy(base), {nn.Linear}, dtype=torch.qint8)
    row("int8 dynamic", q, packed_bytes(q), packed_bytes(q))


if __name__ == "__main__":
    warnings.filterwarnings("ignore")  # quantize_dynamic's notice that torchao replaces it
    torch.set_num_threads(os.cpu_count())
    main()
