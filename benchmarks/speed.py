#!/usr/bin/env python3
"""Inference throughput of `indeed denoise` (tiled, posterior means) in megapixels per second.

    python benchmarks/speed.py --device cpu --size 512
    python benchmarks/speed.py --device cuda --size 4096 --batch 64,256 --precision fp32,bf16

Counts image pixels (not tile pixels) over wall time, after one warm-up run; the image
stays on the CPU and tiles travel to the device, as in the CLI.  Also reports peak RSS.
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from indeed_cli import InferenceOptions, denoise, load_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="auto")
    ap.add_argument("--weights", default=None)
    ap.add_argument("--channels", type=int, default=3)
    ap.add_argument("--size", type=int, nargs="+", default=[512])
    ap.add_argument("--batch", default="8")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--overlap", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    ck = load_model(a.weights, a.channels, a.device)
    dev = next(ck.model.parameters()).device
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"Command: `python {' '.join(sys.argv)}`  \nDevice: {name}, torch {torch.__version__}\n")
    print("| size | batch | precision | s / image | MP/s |\n|---|---|---|---|---|")
    for size in a.size:
        y = np.random.default_rng(0).random((a.channels, size, size), dtype=np.float32)
        for b in map(int, a.batch.split(",")):
            for p in a.precision.split(","):
                o = InferenceOptions(overlap=a.overlap, batch=b, precision=p)
                denoise(ck, y, o)
                ts = []
                for _ in range(a.reps):
                    if dev.type == "cuda":
                        torch.cuda.synchronize()
                    t = time.perf_counter()
                    denoise(ck, y, o)
                    if dev.type == "cuda":
                        torch.cuda.synchronize()
                    ts.append(time.perf_counter() - t)
                s = float(np.median(ts))
                print(f"| {size}x{size} | {b} | {p} | {s:.3f} | {size * size / s / 1e6:.2f} |", flush=True)
    print(f"\npeak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
