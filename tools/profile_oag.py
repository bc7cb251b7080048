#!/usr/bin/env python3
"""Where InDeedOAG spends a GPU's time, and whether it fits beside other processes.

OAG on the clean images of --data (their top-left --crop, under the camera-noise model's --level, seeded per
image as benchmarks/adapt.py seeds them), in groups of --n as `indeed adapt --mode oag` runs them: adaptation
and the grouped read-out, timed per pass after a warm-up pass, with the mean PSNR against the clean crops.

--profile: one more pass under torch.profiler; prints the GPU's busy time against the pass's span and its idle
gaps, each credited to the indeed_cli frames of the last host operator begun before the gap ended (what the
host was doing while the GPU waited), largest first.  A profiled pass runs slower than a plain one.

--cap-gib G: this process may hold at most G GiB of the GPU's memory (torch.cuda.set_per_process_memory_fraction),
as when other processes share the GPU; the eigensolver's calls and the out-of-memory errors that
`recorrupted._eigh_in_runs` answered by solving in halves are counted.

    python tools/profile_oag.py --data DIR --crop 512 --level heavy --n 32 --device cuda --profile
    python tools/profile_oag.py --data DIR --crop 512 --n 32 --device cuda --cap-gib 22 --passes 2

Prepared 2026-12-07; its analysis was checked on a CPU (the convolutions standing in for the GPU's kernels,
--fake-device), not yet on a GPU.  --cap-gib ran on an NVIDIA H100 on 2026-12-08
(docs/reports/2026-12-08-oag-memory-cap-on-h100.md).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from indeed_cli.inference import InferenceOptions, denoise_each, load_model  # noqa: E402
from indeed_cli.io.images import read_image  # noqa: E402
from indeed_cli.metrics import image_seed, psnr  # noqa: E402
from indeed_cli.tasks.adaptation import AdaptConfig, adapt_each, oag_readout  # noqa: E402
from indeed_cli.tasks.camera_noise import camera_pair  # noqa: E402


def merged_intervals(intervals: list[tuple[float, float]]) -> list[list[float]]:
    """(start, end) intervals merged where they overlap or touch, in order."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def idle_gaps(busy: list[list[float]], least: float) -> list[tuple[float, float]]:
    """The gaps longer than ``least`` between consecutive merged busy intervals."""
    return [(a[1], b[0]) for a, b in zip(busy, busy[1:]) if b[0] - a[1] > least]


def credited_gaps(gaps: list[tuple[float, float]], host: list[tuple[float, str]]) -> collections.Counter:
    """Each gap's length credited to the label of the last host operation (start, label), sorted by start,
    begun before the gap ended: the launch the GPU waited for."""
    starts = [s for s, _ in host]
    credit: collections.Counter = collections.Counter()
    for a, b in gaps:
        j = bisect.bisect_right(starts, b) - 1
        credit[host[j][1] if j >= 0 else "(before the first host operation)"] += b - a
    return credit


def frames(event, depth: int = 3) -> str:
    """The innermost ``depth`` indeed_cli Python frames around a profiler event (the model's forward left
    out: it says which module, not which step of OAG)."""
    out, p = [], event
    while p is not None and len(out) < depth:
        if "indeed_cli/" in p.name and "model/network.py" not in p.name:
            out.append(p.name.split("indeed_cli/")[-1])
        p = p.cpu_parent
    return " < ".join(out) or event.name


def profile_report(prof, fake_device: bool = False, least_us: float = 5.0, top: int = 25) -> str:
    """The busy time, the gaps and their credits of one profiled pass, as text."""
    from torch.autograd import DeviceType

    events = prof.events()
    if fake_device:  # a CPU check of the analysis: the convolutions stand in for the GPU's kernels
        device = [(e.time_range.start, e.time_range.end) for e in events if e.name == "aten::convolution"]
    else:
        device = [(e.time_range.start, e.time_range.end) for e in events if e.device_type == DeviceType.CUDA]
    if not device:
        return "no device events were recorded"
    busy = merged_intervals(device)
    gaps = idle_gaps(busy, least_us)
    ops = sorted(
        (e for e in events if e.device_type == DeviceType.CPU and e.name.startswith("aten::")),
        key=lambda e: e.time_range.start,
    )
    credit = credited_gaps(gaps, [(e.time_range.start, frames(e)) for e in ops])
    lines = [
        f"GPU busy {sum(e - s for s, e in busy) / 1e6:.3f} s of a {(busy[-1][1] - busy[0][0]) / 1e6:.3f} s span; "
        f"{len(gaps)} gaps over {least_us:g} us, {sum(b - a for a, b in gaps) / 1e6:.3f} s idle",
        "",
        "| idle ms | host frames when the gap ended |",
        "|---|---|",
    ]
    lines += [f"| {v / 1e3:.1f} | {k} |" for k, v in credit.most_common(top)]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="folder of clean colour images")
    ap.add_argument("--crop", type=int, default=512)
    ap.add_argument("--level", default="heavy", help="camera-noise level: light, medium or heavy")
    ap.add_argument("--n", type=int, default=32, help="images, adapted as one group")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--fake-device", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cap-gib", type=float, default=None)
    a = ap.parse_args()
    if a.cap_gib:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, a.cap_gib * 2**30 / total))
    solver, count = torch.linalg.eigh, {"calls": 0, "oom": 0}

    def counted_eigh(x, *args, **kw):
        count["calls"] += 1
        try:
            return solver(x, *args, **kw)
        except torch.OutOfMemoryError:
            count["oom"] += 1
            raise

    torch.linalg.eigh = counted_eigh
    files = sorted(p for p in a.data.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".tif", ".bmp"))
    pairs = [
        camera_pair(read_image(p).data[:3, : a.crop, : a.crop], a.level, image_seed(p.name, 0)) for p in files[: a.n]
    ]
    ckpt = load_model("color", 3, a.device, job="adapt")
    device = next(ckpt.model.parameters()).device
    cfg = AdaptConfig(precision=a.precision)

    def one_pass() -> tuple[float, float]:
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sync()
        t = time.perf_counter()
        results = adapt_each(ckpt, [[y] for y, _ in pairs], cfg)
        outs = denoise_each(
            [r.checkpoint for r in results], [y for y, _ in pairs], oag_readout(InferenceOptions(), device)
        )
        sync()
        seconds = (time.perf_counter() - t) / len(pairs)
        return seconds, float(np.mean([psnr(o, c) for o, (_, c) in zip(outs, pairs)]))

    print(f"{len(pairs)} crops of {a.crop}, camera noise {a.level}, {a.precision}, {device}")
    print("| pass | s / image | PSNR | eigensolver calls | out-of-memory retries | peak reserved GiB |")
    print("|---|---|---|---|---|---|")
    for k in range(a.passes + 1):  # pass 0 warms up
        seconds, value = one_pass()
        peak = torch.cuda.max_memory_reserved() / 2**30 if device.type == "cuda" else 0.0
        label = "warm-up" if k == 0 else str(k)
        print(f"| {label} | {seconds:.4f} | {value:.2f} | {count['calls']} | {count['oom']} | {peak:.1f} |", flush=True)
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=acts, with_stack=True) as prof:
            seconds, _ = one_pass()
        print(f"\nprofiled pass: {seconds:.4f} s / image\n")
        print(profile_report(prof, fake_device=a.fake_device))
    print("\nCommand: python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
