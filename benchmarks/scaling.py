#!/usr/bin/env python3
"""Sharded denoising on several GPUs: images per second of `indeed denoise FOLDER -o OUT` in one
process against `torchrun --nproc-per-node K` (each rank denoising every K-th image on its own GPU),
whole commands timed (start-up, reading and writing included), outputs compared byte for byte.

    python benchmarks/scaling.py --images 2000 --size 512 --procs 1,2,4 --precision bf16 [--numa-binding node]
    python benchmarks/scaling.py --images 500 --procs 1 --png-level 1,6 --repeat 3

``--png-level`` compares the zlib levels of the PNGs written (`indeed denoise --png-level`); outputs
are compared by their pixels, which do not depend on the level.

Without --data it makes the images: smooth random colour fields with AWGN of a random level,
written as PNG with numpy and Pillow.  Prints a Markdown table and the command that made it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
from PIL import Image


def make_image(args: tuple[Path, int, int]) -> None:
    path, size, seed = args
    rng = np.random.default_rng(seed)
    coarse = rng.random((size // 32 + 2, size // 32 + 2, 3)).astype(np.float32)
    smooth = np.asarray(
        Image.fromarray((coarse * 255).astype(np.uint8)).resize((size, size), Image.BICUBIC), np.float32
    )
    noisy = smooth + rng.normal(0, rng.uniform(5, 40), smooth.shape)
    Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(path)


def steady_rate(folder: Path) -> float:
    """Images a second while the run is under way: from the 10th to the 90th percentile of the
    outputs' write times, leaving out start-up (importing, loading the model) and the end."""
    times = np.sort([p.stat().st_mtime for p in folder.glob("*.png")])
    lo, hi = np.percentile(times, [10, 90])
    return float(((times >= lo) & (times <= hi)).sum() / max(hi - lo, 1e-9))


def digest(folder: Path) -> str:
    """A hash of the outputs' names and decoded pixels (the files' bytes depend on the PNG level)."""
    h = hashlib.sha256()
    for p in sorted(folder.glob("*.png")):
        h.update(p.name.encode())
        with Image.open(p) as im:
            h.update(np.asarray(im).tobytes())
    return h.hexdigest()


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.png"))


def run(procs: int, data: Path, out: Path, a, numa: str | None = None, level: int = 1) -> float:
    shutil.rmtree(out, ignore_errors=True)
    cmd = ["-m", "indeed_cli", "denoise", str(data), "-o", str(out), "-q", "--precision", a.precision,
           "--device", a.device, "--png-level", str(level)]  # fmt: skip
    if procs > 1:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        bind = ["--numa-binding", numa] if numa else []
        cmd = ["-m", "torch.distributed.run", "--nproc-per-node", str(procs), "--master-port", str(port), *bind, *cmd]
    t = time.perf_counter()
    subprocess.run([sys.executable, *cmd], check=True, env={**os.environ, "OMP_NUM_THREADS": str(a.threads)})
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=None, help="a folder of images (default: make --images of them)")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--procs", default="1,2,4", help="process counts to compare (one GPU each)")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=4, help="CPU threads per process (reading, writing)")
    ap.add_argument(
        "--numa-binding",
        default=None,
        metavar="MODE",
        help="also run each process count above 1 under torchrun's --numa-binding MODE (node, socket, ...)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="runs of each configuration (the table gives medians)")
    ap.add_argument("--png-level", default="1", help="zlib levels of the PNGs written, e.g. 1,6 (denoise --png-level)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = a.data
        if data is None:
            data = Path(tmp) / "in"
            data.mkdir()
            jobs = [(data / f"{i:05d}.png", a.size, i) for i in range(a.images)]
            with ProcessPoolExecutor() as pool:
                list(pool.map(make_image, jobs, chunksize=16))
        n = len(list(data.glob("*.png")))
        levels = [int(v) for v in a.png_level.split(",")]
        configs = [(p, None, lv) for lv in levels for p in map(int, a.procs.split(","))]
        if a.numa_binding:
            configs += [(p, a.numa_binding, lv) for p, _, lv in configs if p > 1]
        runs: dict[tuple, list] = {c: [] for c in configs}
        for _ in range(a.repeat):  # interleaved, so that a slow spell of the machine hits every configuration
            for procs, numa, level in configs:
                out = Path(tmp) / f"out{procs}{numa or ''}-{level}"
                seconds = run(procs, data, out, a, numa, level)
                runs[(procs, numa, level)].append((seconds, steady_rate(out), digest(out), folder_bytes(out)))
    rows = []
    for (procs, numa, level), rs in runs.items():
        label = f"{procs} (NUMA binding: {numa})" if numa else str(procs)
        seconds = float(np.median([r[0] for r in rs]))
        steadies = [r[1] for r in rs]
        mb = rs[-1][3] / 1e6
        rows.append((label, level, mb, seconds, n / seconds, float(np.median(steadies)), {r[2] for r in rs}, steadies))
    base = rows[0]
    print(f"| processes | PNG level | output MB | seconds | images / s (whole command) | speed-up |"
          f" images / s (under way) | speed-up | under way, each run |"
          f" pixels equal to {base[0]} process(es), level {base[1]} |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, level, mb, seconds, rate, steady, digests, steadies in rows:
        each = ", ".join(f"{v:.3g}" for v in steadies)
        print(f"| {label} | {level} | {mb:.1f} | {seconds:.1f} | {rate:.3g} | {rate / base[4]:.2f} | {steady:.3g} "
              f"| {steady / base[5]:.2f} | {each} | {'yes' if len(digests | base[6]) == 1 else 'NO'} |")  # fmt: skip
    if a.repeat > 1:
        print(f"\nMedians of {a.repeat} runs of each, interleaved.")
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    machine = f"{', '.join(gpus) or 'no GPU'}; {os.cpu_count()} CPU cores ({platform.machine()})"
    print(f"\nCommand: `python {' '.join(sys.argv)}`  \nImages: {n} of {a.size}x{a.size}; machine: {machine}; "
          f"torch {torch.__version__}")  # fmt: skip


if __name__ == "__main__":
    main()
