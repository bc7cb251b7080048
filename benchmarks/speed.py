#!/usr/bin/env python3
"""Inference throughput of `indeed denoise` (or `--task detect`) in megapixels per second.

    python benchmarks/speed.py --device cpu --size 512 --readout whole,tiles
    python benchmarks/speed.py --device cuda --size 4096 --batch 64,256 --precision fp32,bf16
    python benchmarks/speed.py --device cuda --size 4096 --batch 256 --precision bf16 --fused on,off

Counts image pixels (not tile pixels) over wall time, after one warm-up run; the image
stays on the CPU and tiles travel to the device, as in the CLI.  Also reports peak RSS.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import cpu_name  # noqa: E402  (benchmarks/ is on the path: the script's own folder)

from indeed_cli import InferenceOptions, denoise, detect, load_model  # noqa: E402
from indeed_cli.model import memory, network  # noqa: E402
from indeed_cli.model.cpu import cpu_flags  # noqa: E402  (the flags line of /proc/cpuinfo)

SEARCH_DEFAULT = memory.QUANTISED_SEARCH  # this CPU's default, before --search sets it


def cpu_description() -> str:
    """The CPU, its thread count and the vector units oneDNN may use: the same network took half as
    long again with AVX2 alone as with AVX-512 and AMX (docs/results.md, "Speed and memory")."""
    flags = set(cpu_flags().partition(":")[2].split())
    units = [u for u in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if u in flags] or ["not read"]
    capped = os.environ.get("ONEDNN_MAX_CPU_ISA")
    return f"CPU {cpu_name()}, {torch.get_num_threads()} threads, {'/'.join(units)}" + (
        f", oneDNN capped at {capped}" if capped else ""
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="auto")
    ap.add_argument("--weights", default=None)
    ap.add_argument("--channels", type=int, default=3)
    ap.add_argument("--size", nargs="+", default=["512"], help="N for NxN, or HxW (e.g. 300x400)")
    ap.add_argument("--task", default="denoise", choices=["denoise", "detect"])
    ap.add_argument("--batch", default="8")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--overlap", default="32", help="tile overlap(s), e.g. 32,16")
    ap.add_argument(
        "--readout", default="default", help="default, whole, tiles or a list: f_thetaS on the whole image or by tiles"
    )
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="torch.compile the network first (compile time not counted)")
    ap.add_argument(
        "--cudnn-benchmark", action="store_true", help="let cuDNN time its algorithms per shape (warm-up pays it)"
    )
    ap.add_argument(
        "--fused",
        default="on",
        help="on, off or on,off: residual blocks as fused cuDNN (GPU) or oneDNN (CPU) calls (network.FUSED_BLOCKS)",
    )
    ap.add_argument(
        "--search",
        default="default",
        help="default (this CPU's: quantised where it has int8 dot products), quantised, exact, or several: "
        "a detector memory's search on a CPU (model.memory.QUANTISED_SEARCH)",
    )
    ap.add_argument("--profile", action="store_true", help="also print torch.profiler's top operations (last setting)")
    a = ap.parse_args()
    if a.task == "detect":
        ck = load_model(a.weights, a.channels, a.device, task="detect")
        run = detect
    else:
        ck = load_model(a.weights, a.channels, a.device)
        run = denoise
    dev = next(ck.model.parameters()).device
    torch.backends.cudnn.benchmark = a.cudnn_benchmark
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_description()
    print(f"Command: `python {' '.join(sys.argv)}`  \nDevice: {name}, torch {torch.__version__}\n")
    print("| size | read-out | overlap | batch | precision | fused | search | s / image | MP/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    readouts = {"default": None, "whole": True, "tiles": False}
    for size in a.size:
        h, w = (int(v) for v in size.split("x")) if "x" in size else (int(size), int(size))
        y = np.random.default_rng(0).random((a.channels, h, w), dtype=np.float32)
        settings = [
            (r, ov, b, p, f, sr)
            for r in a.readout.split(",")
            for ov in map(int, a.overlap.split(","))
            for b in map(int, a.batch.split(","))
            for p in a.precision.split(",")
            for f in a.fused.split(",")
            for sr in a.search.split(",")
        ]
        for r, ov, b, p, f, sr in settings:
            if f not in ("on", "off"):
                raise SystemExit(f"--fused takes on and/or off, got {f!r}")
            if sr not in ("default", "quantised", "exact"):
                raise SystemExit(f"--search takes default, quantised and/or exact, got {sr!r}")
            network.FUSED_BLOCKS = f == "on"
            memory.QUANTISED_SEARCH = SEARCH_DEFAULT if sr == "default" else sr == "quantised"
            sr = "quantised" if memory.QUANTISED_SEARCH else "exact"  # the row says which ran
            # warm-up pays compiling
            o = InferenceOptions(overlap=ov, batch=b, precision=p, compile=a.compile, whole_image=readouts[r])
            run(ck, y, o)
            ts = []
            for _ in range(a.reps):
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t = time.perf_counter()
                run(ck, y, o)
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                ts.append(time.perf_counter() - t)
            s = float(np.median(ts))
            print(f"| {h}x{w} | {r} | {ov} | {b} | {p} | {f} | {sr} | {s:.3f} | {h * w / s / 1e6:.2f} |", flush=True)
    print(f"\npeak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    if a.profile:  # where one run's time goes: CPU-side work vs device kernels and copies
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with profile(activities=acts) as prof:
            run(ck, y, o)
            if dev.type == "cuda":
                torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=20))


if __name__ == "__main__":
    main()
