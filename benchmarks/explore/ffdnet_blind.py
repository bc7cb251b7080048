#!/usr/bin/env python3
"""Is FFDNet's edge over the gray model on Set12/BSD68 its knowledge of the true sigma?

    python benchmarks/explore/ffdnet_blind.py [--sets Set12,BSD68] [--sigmas 15,25] [--per-image]   # this CPU

Float AWGN with the benchmark's per-image seeds (indeed_cli.metrics); prints mean PSNR of the
bundled gray model (blind), FFDNet given the true sigma (as benchmarks/denoise.py runs it) and
FFDNet given sigma estimated from the noisy image by scikit-image's wavelet estimator (as
benchmarks/adapt.py does for real noise).  docs/benchmarks.md reads the table.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from adapt import estimate_sigma255  # noqa: E402
from common import ffdnet_method  # noqa: E402
from indeed_cli import denoise, load_model  # noqa: E402
from indeed_cli.imageio import read_image  # noqa: E402
from indeed_cli.metrics import add_awgn, image_seed, psnr  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--data", default="../shared/data/denoise-test")
ap.add_argument("--sets", default="Set12,BSD68")
ap.add_argument("--sigmas", default="15,25")
ap.add_argument("--per-image", action="store_true", help="also one line per image: PSNR of InDeed and FFDNet (true σ)")
a = ap.parse_args()
gray = load_model("gray", 1, "cpu")
ffd = ffdnet_method(1, "cpu")
print("| set | σ | n | indeed (blind) | FFDNet, true σ | FFDNet, estimated σ | mean estimated σ |")
print("|---|---|---|---|---|---|---|")
for name in a.sets.split(","):
    files = sorted(p for p in (Path(a.data) / name).iterdir() if p.suffix.lower() in (".png", ".jpg", ".bmp", ".tif"))
    for s in map(float, a.sigmas.split(",")):
        r = {"indeed": [], "true": [], "est": [], "sig": []}
        for p in files:
            x = read_image(p).data
            y = add_awgn(x, s, image_seed(p.name, s))
            e = estimate_sigma255(y)
            r["indeed"].append(psnr(denoise(gray, y), x))
            r["true"].append(psnr(ffd(y, s), x))
            r["est"].append(psnr(ffd(y, e), x))
            r["sig"].append(e)
            if a.per_image:
                print(f"  {name} σ{s:g} {p.name}: indeed {r['indeed'][-1]:.2f}, FFDNet {r['true'][-1]:.2f}, "
                      f"difference {r['indeed'][-1] - r['true'][-1]:+.2f}", flush=True)
        print(f"| {name} | {s:g} | {len(files)} | {np.mean(r['indeed']):.2f} | {np.mean(r['true']):.2f} | "
              f"{np.mean(r['est']):.2f} | {np.mean(r['sig']):.2f} |", flush=True)
print("\nCommand: python " + " ".join(sys.argv))
