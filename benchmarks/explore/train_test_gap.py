"""Is the gray denoiser limited by its 824 training images?  (issue 3, seventh session)

Mean PSNR of the shipped gray model and of FFDNet (true sigma) on 68 images the gray model was
trained on (BSDS images of CBSD432_list.txt, a fixed random draw, converted to gray with the
training's luma weights) and on BSD68 (the BSDS test images the model never saw), float AWGN
with the benchmark's seeds.  Both sets come from the same photographs' distribution, so a
model that had memorised its training images would gain on the first set relative to FFDNet.

    python benchmarks/explore/train_test_gap.py --bsds ../shared/data/denoise-train/BSDS500 \
        --bsd68 ../shared/data/denoise-test/BSD68
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common import ffdnet_method, indeed_method  # noqa: E402
from indeed_cli.imageio import read_image  # noqa: E402
from indeed_cli.metrics import add_awgn, image_seed, psnr  # noqa: E402
from indeed_cli.training import load_images  # noqa: E402


def training_draw(bsds: Path, n: int, seed: int = 0) -> list[tuple[str, np.ndarray]]:
    names = [ln.strip() for ln in (bsds / "CBSD432_list.txt").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    pick = sorted(np.random.default_rng(seed).choice(len(names), n, replace=False))
    grays = load_images([bsds / names[i] for i in pick], channels=1)  # exactly as training makes them
    return [(Path(names[i]).stem, g.numpy().astype(np.float32) / 255) for i, g in zip(pick, grays)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bsds", required=True)
    ap.add_argument("--bsd68", required=True)
    ap.add_argument("--sigmas", default="15,25")
    ap.add_argument("--n", type=int, default=68)
    ap.add_argument("--weights", default=None)
    a = ap.parse_args()
    sets = {"trained on (BSDS, gray)": training_draw(Path(a.bsds), a.n),
            "BSD68 (never seen)": [(p.name, read_image(p).data) for p in sorted(Path(a.bsd68).glob("*.png"))]}
    methods = {"indeed": indeed_method(a.weights, 1), "ffdnet": ffdnet_method(1)}
    print("| images | σ | indeed | ffdnet | indeed − ffdnet |\n|---|---|---|---|---|")
    for set_name, cleans in sets.items():
        for s in (float(v) for v in a.sigmas.split(",")):
            res = {}
            for m, fn in methods.items():
                res[m] = np.mean([psnr(fn(add_awgn(x, s, image_seed(n, s)), s), x) for n, x in cleans])
            print(f"| {set_name} ({len(cleans)}) | {s:g} | {res['indeed']:.3f} | {res['ffdnet']:.3f} | "
                  f"{res['indeed'] - res['ffdnet']:+.3f} |", flush=True)
    print(f"\nCommand: `python {' '.join(sys.argv)}`")


if __name__ == "__main__":
    main()
