"""Paper Table 1: how good is the low-rank part alone? PSNR of L (posterior mean, stitched)
and of L + S against the clean image, and the median rank index n, for one or more
checkpoints side by side on the same noisy inputs (float AWGN, seed per image name and sigma).

Does n track the image (paper §4.6, Fig. 6)? n is set beside the SVD rank of the clean image
(the number of singular values holding 99.9% of a tile's energy, each channel) on the very tiles
that ``indeed decompose`` reads n on (128x128 tiles overlapping by its 64 pixels, over the whole
image, reflected at its borders): per image, the median of n over its tiles beside the median of the clean SVD rank
over the same tiles (Spearman over the images, and the range of each), and per tile and channel
(Spearman over all of them).  The last column keeps the first version's reference, the SVD rank
on the non-overlapping tiles from the top-left corner (on 481x321 images they leave a strip of
the image out, so it describes a different part of the image than n).

    python benchmarks/lowrank.py --data ../shared/data/denoise-test/CBSD68 --sigmas 25 \
        --weights weights/indeed-denoise-color.safetensors[,OTHER.safetensors]

``--readouts``: why does n not track the SVD rank?  On the non-overlapping 128x128 tiles (each
channel), set other read-outs of the same posterior beside the clean tile's SVD rank: n with other
thresholds t (a share of the largest E[1/gamma_i]), the energy rank of the posterior-mean components
(how many of the largest ||mu_a_i||^2 ||mu_b_i||^2 hold 99.9% of their sum) and the SVD rank of
mu_L = mu_A mu_B^T itself.  If a read-out tracks the SVD rank, n is a read-out problem; if mu_L's
own rank does not, the network's L does not adapt its rank.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from indeed_cli import InferenceOptions, decompose, load_model  # noqa: E402
from indeed_cli.inference.tiling import TileGrid  # noqa: E402
from indeed_cli.io import read_image  # noqa: E402
from indeed_cli.metrics import add_awgn, image_seed, psnr  # noqa: E402
from indeed_cli.model.posteriors import energy_rank  # noqa: E402
from indeed_cli.pipelines.decompose import DECOMPOSE_OVERLAP  # noqa: E402


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
    number of singular values that hold ``energy`` of the tile's squared Frobenius norm
    (:func:`~indeed_cli.model.posteriors.energy_rank`)."""
    tile = min(tile, *x.shape[1:])  # a small image is one tile
    tiles = [
        x[:, y : y + tile, x0 : x0 + tile]
        for y in range(0, x.shape[1] - tile + 1, tile)
        for x0 in range(0, x.shape[2] - tile + 1, tile)
    ]
    return float(np.median(energy_rank(torch.from_numpy(np.stack(tiles).astype(np.float64)), energy).numpy()))


def decompose_tile_ranks(x: np.ndarray, opts) -> np.ndarray:
    """The clean SVD rank (:func:`~indeed_cli.model.posteriors.energy_rank`, the count that training's
    rank supervision uses) of each tile and channel that ``indeed decompose`` reads the rank index n on:
    (tiles_y, tiles_x, C), in the layout of ``decompose(...).tiles["rank_index"]``."""
    image = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    grid = TileGrid(x.shape[1], x.shape[2], opts.tile, opts.overlap)
    tiles = torch.stack([grid.cut(image, y, x0) for y, x0 in grid.positions()])
    return energy_rank(tiles).numpy().reshape(*grid.shape, x.shape[0])


def energy_count(values: np.ndarray, energy: float = 0.999) -> int:
    """How many of the largest ``values`` (non-negative) hold ``energy`` of their sum."""
    v = np.sort(np.asarray(values, dtype=np.float64))[::-1]
    c = np.cumsum(v) / max(float(v.sum()), 1e-300)
    return int(np.searchsorted(c, energy)) + 1


READOUTS = ("n (t = 1%)", "n (t = 0.1%)", "n (t = 10%)", "energy rank of components", "SVD rank of mu_L")


def tile_readouts(ck, clean: np.ndarray, noisy: np.ndarray, tile: int = 128) -> list[dict]:
    """Per non-overlapping tile and channel: the clean SVD rank and each of READOUTS."""
    from indeed_cli.model import posteriors as P

    C, h, w = clean.shape
    rows = []
    boxes = [(y, x) for y in range(0, h - tile + 1, tile) for x in range(0, w - tile + 1, tile)]
    Y = torch.from_numpy(np.stack([noisy[:, y : y + tile, x : x + tile] for y, x in boxes]).astype(np.float32))
    with torch.inference_mode():
        d = ck.model(Y, sample=False).float()
        a, b = P.gamma_posterior(d.mu_A, d.sigma_A, d.mu_B, d.sigma_B, ck.config.priors)
        counts = {t: P.rank_components(a, b, rel_threshold=t).sum(-1).numpy() for t in (0.01, 0.001, 0.1)}
        comp = (d.mu_A.square().sum(-2) * d.mu_B.square().sum(-2)).numpy()  # (N, C, r)
        L = d.L_hat.numpy()
    for i, (y, x) in enumerate(boxes):
        for c in range(C):
            rows.append({
                "svd": svd_rank(clean[c : c + 1, y : y + tile, x : x + tile]),
                READOUTS[0]: counts[0.01][i, c],
                READOUTS[1]: counts[0.001][i, c],
                READOUTS[2]: counts[0.1][i, c],
                READOUTS[3]: energy_count(comp[i, c]),
                READOUTS[4]: svd_rank(L[i, c : c + 1]),
            })  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="folder of clean images")
    ap.add_argument("--weights", required=True, help="comma-separated checkpoints")
    ap.add_argument("--sigmas", default="25")
    ap.add_argument("--channels", type=int, default=3)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--readouts", action="store_true", help="also the read-outs table (see above)")
    a = ap.parse_args()
    files = sorted(p for p in Path(a.data).iterdir() if p.suffix.lower() in (".png", ".tif", ".bmp", ".jpg"))
    files = files[: a.limit] if a.limit else files
    cleans = [(f.name, read_image(f).data) for f in files]
    if a.channels == 1:
        cleans = [(n, x.mean(0, keepdims=True) if x.shape[0] == 3 else x) for n, x in cleans]
    opts = InferenceOptions(overlap=DECOMPOSE_OVERLAP)  # the tiles `indeed decompose` reads n on
    svd = [svd_rank(x) for _, x in cleans]  # the first version's reference: top-left non-overlapping tiles
    tile_svd = [decompose_tile_ranks(x, opts) for _, x in cleans]  # the tiles n is read on
    img_svd = [float(np.median(t)) for t in tile_svd]
    print(
        "| weights | σ | images | PSNR of L | PSNR of L + S | median rank index n | range of n "
        "| range of SVD rank | Spearman(n, SVD rank) per image | per tile | per image, top-left tiles |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for w in a.weights.split(","):
        ck = load_model(w, a.channels, a.device)
        for s in (float(v) for v in a.sigmas.split(",")):
            pl, pls, ranks, tile_n = [], [], [], []
            for name, x in cleans:
                d = decompose(ck, add_awgn(x, s, image_seed(name, s)), opts)
                L, S = d.maps["L"], d.maps["S"]
                pl.append(psnr(L, x))
                pls.append(psnr(L + S, x))
                ranks.append(d.stats()["rank_index"])
                tile_n.append(np.asarray(d.tiles["rank_index"]).ravel())
            many = len(cleans) > 2
            rho = spearman(ranks, img_svd) if many else float("nan")
            rho_tile = spearman(np.concatenate(tile_n), np.concatenate([t.ravel() for t in tile_svd]))
            rho_old = spearman(ranks, svd) if many else float("nan")
            print(
                f"| {Path(w).name} | {s:g} | {len(cleans)} | {np.mean(pl):.2f} | {np.mean(pls):.2f} "
                f"| {np.median(ranks):.0f} | {min(ranks):.0f}–{max(ranks):.0f} | {min(img_svd):.0f}–{max(img_svd):.0f} "
                f"| {rho:.2f} | {rho_tile:.2f} | {rho_old:.2f} |",
                flush=True,
            )
    if a.readouts:
        print("\n| weights | σ | read-out | Spearman per image (tile medians) | Spearman per tile | range | "
              "range of SVD rank |\n|---|---|---|---|---|---|---|")  # fmt: skip
        for w in a.weights.split(","):
            ck = load_model(w, a.channels, "cpu")
            for s in (float(v) for v in a.sigmas.split(",")):
                per_image = []
                tiles = []
                for name, x in cleans:
                    rows = tile_readouts(ck, x, add_awgn(x, s, image_seed(name, s)))
                    tiles += rows
                    per_image.append({k: float(np.median([r[k] for r in rows])) for k in rows[0]})
                for k in READOUTS:
                    img_rho = spearman([r[k] for r in per_image], [r["svd"] for r in per_image])
                    tile_rho = spearman([r[k] for r in tiles], [r["svd"] for r in tiles])
                    v, sv = [r[k] for r in per_image], [r["svd"] for r in per_image]
                    span, svd_span = f"{min(v):.0f}–{max(v):.0f}", f"{min(sv):.0f}–{max(sv):.0f}"
                    print(f"| {Path(w).name} | {s:g} | {k} | {img_rho:.2f} | {tile_rho:.2f} | {span} | {svd_span} |",
                          flush=True)  # fmt: skip
    print("\nCommand: python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
