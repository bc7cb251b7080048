#!/usr/bin/env python3
"""Gray (or, with --channels 3 --sets CBSD68,Kodak24, colour) denoisers side by side on Set12 / BSD68
(float AWGN, the benchmark's per-image seeds).  The version in commit c0df07a also scored models
with a noise-level input given the true sigma; such models exist only there.

    python benchmarks/explore/gray_variants_eval.py --data ../shared/data/denoise-test \
        --weights ship=gray --weights v1=runs/v1/model.safetensors [--device cuda]

Prints one markdown row per model with mean PSNR per set and sigma; docs/benchmarks.md reads the
tables.  A one-off for comparing fine-tuned variants, not a benchmark.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from indeed_cli import InferenceOptions, denoise, load_model  # noqa: E402
from indeed_cli.imageio import read_image  # noqa: E402
from indeed_cli.metrics import add_awgn, image_seed, psnr  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--data", default="../shared/data/denoise-test")
ap.add_argument("--sets", default="Set12,BSD68")
ap.add_argument("--sigmas", default="15,25,50")
ap.add_argument("--weights", action="append", required=True, help="NAME=WEIGHTS")
ap.add_argument("--device", default="auto")
ap.add_argument("--channels", type=int, default=1, help="1: gray models (Set12, BSD68); 3: colour (CBSD68, Kodak24)")
ap.add_argument("--overlaps", default="32", help="tile overlaps to score each model with, e.g. 32,16 (one row each)")
a = ap.parse_args()
sigmas = [float(s) for s in a.sigmas.split(",")]
sets = a.sets.split(",")
data = {}
for name in sets:
    files = sorted(p for p in (Path(a.data) / name).iterdir() if p.suffix.lower() in (".png", ".jpg", ".bmp", ".tif"))
    data[name] = [(p.name, read_image(p).data) for p in files]
cols = [f"{n} σ{s:g}" for n in sets for s in sigmas]
print("| model | " + " | ".join(cols) + " |")
print("|---|" + "---|" * len(cols))
for spec in a.weights:
    label, w = spec.split("=", 1)
    ck = load_model(w, a.channels, a.device)
    for ov in map(int, a.overlaps.split(",")):
        opts = InferenceOptions(overlap=ov)
        cells = []
        for name in sets:
            for s in sigmas:
                ps = [psnr(denoise(ck, add_awgn(x, s, image_seed(f, s)), opts), x) for f, x in data[name]]
                cells.append(f"{np.mean(ps):.3f}")
        tag = label if a.overlaps == "32" else f"{label}, overlap {ov}"
        print(f"| {tag} | " + " | ".join(cells) + " |", flush=True)
print("\nCommand: python " + " ".join(sys.argv))
