"""Paper Table 1: how good is the low-rank part alone? PSNR of L (posterior mean, stitched)
and of L + S against the clean image, and the median rank index n, for one or more
checkpoints side by side on the same noisy inputs (float AWGN, seed per image name and sigma).

    python benchmarks/lowrank.py --data ../shared/data/denoise-test/CBSD68 --sigmas 25 \
        --weights weights/indeed-denoise-color.safetensors[,OTHER.safetensors]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from indeed_cli import InferenceOptions, decompose, load_model  # noqa: E402
from indeed_cli.io import read_image  # noqa: E402
from indeed_cli.metrics import add_awgn, image_seed, psnr  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="folder of clean images")
    ap.add_argument("--weights", required=True, help="comma-separated checkpoints")
    ap.add_argument("--sigmas", default="25")
    ap.add_argument("--channels", type=int, default=3)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    files = sorted(p for p in Path(a.data).iterdir() if p.suffix.lower() in (".png", ".tif", ".bmp", ".jpg"))
    files = files[: a.limit] if a.limit else files
    cleans = [(f.name, read_image(f).data) for f in files]
    if a.channels == 1:
        cleans = [(n, x.mean(0, keepdims=True) if x.shape[0] == 3 else x) for n, x in cleans]
    print("| weights | σ | n | PSNR of L | PSNR of L + S | median rank index n |")
    print("|---|---|---|---|---|---|")
    for w in a.weights.split(","):
        ck = load_model(w, a.channels, a.device)
        for s in (float(v) for v in a.sigmas.split(",")):
            pl, pls, ranks = [], [], []
            for name, x in cleans:
                d = decompose(ck, add_awgn(x, s, image_seed(name, s)), InferenceOptions())
                L, S = d.maps["L"], d.maps["S"]
                pl.append(psnr(L, x))
                pls.append(psnr(L + S, x))
                ranks.append(d.stats()["rank_index"])
            print(
                f"| {Path(w).name} | {s:g} | {len(cleans)} | {np.mean(pl):.2f} | {np.mean(pls):.2f} "
                f"| {np.median(ranks):.0f} |",
                flush=True,
            )
    print("\nCommand: python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
