#!/usr/bin/env python3
"""ONNX export of checkpoints: file size, and onnxruntime's CPU speed beside PyTorch's on the same
tiles (the tile network alone, batches of 8 tiles of 128x128, as `indeed denoise` runs on a CPU),
and for a detector the whole read-out of examples/onnx_detect.py beside `indeed detect`.

    python benchmarks/onnx_speed.py --weights color,magnetic-tile [--image part.png]

Prints a Markdown table and the command that made it.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from indeed_cli.inference import TileGrid, load_model  # noqa: E402
from indeed_cli.io import read_image  # noqa: E402
from indeed_cli.pipelines import export_onnx  # noqa: E402
from indeed_cli.pipelines.export import TileNetwork  # noqa: E402
from indeed_cli.tasks.detection import detect  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "onnx_detect.py"


def median_time(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def measure(spec: str, image: str | None, reps: int, tmp: str) -> dict:
    """One checkpoint: export it, then time its tile network in PyTorch and in onnxruntime."""
    ck = load_model(spec, device="cpu")  # a bundled name or a path: its config says the task
    out = Path(tmp) / f"{Path(spec).stem}.onnx"
    facts = export_onnx(ck, out)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    net = TileNetwork(ck).eval()
    tiles = torch.rand(8, ck.config.channels, 128, 128)
    with torch.no_grad():
        t_torch = median_time(lambda: net(tiles), reps)
    t_ort = median_time(lambda: session.run(None, {"Y": tiles.numpy()}), reps)
    per_image = len(TileGrid(512, 512)) / 8  # batches of 8 tiles in a 512x512 image
    row = {"checkpoint": spec, "task": ck.config.task, "MB": facts["bytes"] / 1e6, "torch": t_torch * per_image,
           "ort": t_ort * per_image, "diff": facts["max_difference"]}  # fmt: skip
    if ck.config.task == "detect" and image:
        spec_ = importlib.util.spec_from_file_location("onnx_detect", EXAMPLE)
        example = importlib.util.module_from_spec(spec_)
        spec_.loader.exec_module(example)
        img = read_image(image).data
        row["readout_torch"] = median_time(lambda: detect(ck, img), reps)
        row["readout_ort"] = median_time(lambda: example.detect(session, img), reps)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", default="color,magnetic-tile", help="comma-separated checkpoints")
    ap.add_argument("--image", default=None, help="an image for the detector's whole read-out")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(spec, a.image, a.reps, tmp) for spec in a.weights.split(",")]
    print("| checkpoint | task | ONNX MB | PyTorch s / 512x512 | onnxruntime s / 512x512 | max difference |"
          " detect read-out PyTorch / onnxruntime s |\n|---|---|---|---|---|---|---|")  # fmt: skip
    for r in rows:
        readout = f"{r['readout_torch']:.2f} / {r['readout_ort']:.2f}" if "readout_ort" in r else "-"
        print(f"| {r['checkpoint']} | {r['task']} | {r['MB']:.1f} | {r['torch']:.2f} | {r['ort']:.2f} | "
              f"{r['diff']:.1e} | {readout} |")  # fmt: skip
    print(f"\nCommand: `python {' '.join(sys.argv)}`  \nMachine: {platform.processor() or platform.machine()}, "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads), onnxruntime {ort.__version__}")  # fmt: skip


if __name__ == "__main__":
    main()
