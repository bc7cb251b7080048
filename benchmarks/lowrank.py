"""Paper Table 1: how good is the low-rank part alone? PSNR of L (posterior mean, stitched)
and of L + S against the clean image, and the median rank index n, for one or more
checkpoints side by side on the same noisy inputs (float AWGN, seed per image name and sigma).

Does n track the image (paper §4.6, Fig. 6)? Per image, n is set beside the SVD rank of the
clean image: the median over its non-overlapping 128x128 tiles (each channel) of the number of
singular values holding 99.9% of the energy; the table gives their Spearman correlation over
the images and the range of each.

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


def spearman(a, b) -> float:
    """Spearman's rank correlation (ties get their average rank)."""

    def ranks(v):
        v = np.asarray(v, dtype=np.float64)
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v))
        for value in np.unique(v):  # average the ranks of ties
            r[v == value] = r[v == value].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def svd_rank(x: np.ndarray, tile: int = 128, energy: float = 0.999) -> float:
    """Median over the non-overlapping tile x tile tiles of each channel of ``x`` (C, h, w) of the
    number of singular values that hold ``energy`` of the tile's squared Frobenius norm."""
    ranks = []
    tile = min(tile, *x.shape[1:])  # a small image is one tile
    for ch in x:
        for y in range(0, ch.shape[0] - tile + 1, tile):
            for x0 in range(0, ch.shape[1] - tile + 1, tile):
                sv = np.linalg.svd(ch[y : y + tile, x0 : x0 + tile].astype(np.float64), compute_uv=False)
                e = np.cumsum(sv**2) / max(float((sv**2).sum()), 1e-12)
                ranks.append(int(np.searchsorted(e, energy)) + 1)
    return float(np.median(ranks))


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
    svd = [svd_rank(x) for _, x in cleans]
    print(
        "| weights | σ | images | PSNR of L | PSNR of L + S | median rank index n | range of n "
        "| range of SVD rank | Spearman(n, SVD rank) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
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
            rho = spearman(ranks, svd) if len(cleans) > 2 else float("nan")
            print(
                f"| {Path(w).name} | {s:g} | {len(cleans)} | {np.mean(pl):.2f} | {np.mean(pls):.2f} "
                f"| {np.median(ranks):.0f} | {min(ranks):.0f}–{max(ranks):.0f} | {min(svd):.0f}–{max(svd):.0f} "
                f"| {rho:.2f} |",
                flush=True,
            )
    print("\nCommand: python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
