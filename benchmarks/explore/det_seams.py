"""Do the tiler's mirror seams make normal hot spots at image borders?  (issue 4, seventh session)

The tiler extends an image by reflection (a margin of overlap/2 on every side, more at the far
ends), so tiles at the border hold a mirror seam, which training crops of images wider than a
tile never do.  Two measurements with a detector's maps (mean over its read-out scales):

``--part border``: on normal calibration images, the map of the image as it is, of the image
reflect-padded by 48 px (map cropped back: a seam at the image border, inside the tiles), and of
the image cropped by 48 px; for each, the 99.9% quantile of all map values and the share of those
hot pixels within 16 px of the region's border.

``--part edge``: the development set scored with the shipped tiler and with edge-aligned tiles
(the first tile starts at 0, the last ends at the image's end, and the blend window is 1 at the
image border), which never leave an image at least a tile wide: no seam.

    python benchmarks/explore/det_seams.py --data ../shared/data/anomaly/magnetic-tile --part border
    python benchmarks/explore/det_seams.py --data ../shared/data/anomaly/magnetic-tile --part edge
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from detect import DEFECTS  # noqa: E402
from mt_split import split  # noqa: E402
from indeed_cli.checkpoint import load_checkpoint  # noqa: E402
from indeed_cli.detection import (anomaly_map_from_sparse, detection_metrics, image_score, load_mask,  # noqa: E402
                                  readout_scales, resize, scale_maps, scaled_size)
from indeed_cli.imageio import read_image  # noqa: E402
from indeed_cli.inference import _tile_decompose  # noqa: E402
from indeed_cli.tiling import blend_window, reflect_index  # noqa: E402


def edge_starts(length: int, tile: int, stride: int) -> list[int]:
    return [0] if length <= tile else list(range(0, length - tile, stride)) + [length - tile]


def edge_ramp(tile: int, overlap: int, first: bool, last: bool) -> torch.Tensor:
    r = blend_window(tile, overlap)[tile // 2].clone()
    if first:
        r[:tile // 2] = 1
    if last:
        r[tile // 2:] = 1
    return r


def edge_sparse(ck, data: np.ndarray, tile: int = 128, overlap: int = 32, batch: int = 16) -> np.ndarray:
    """mu_S with edge-aligned tiles; sides shorter than a tile are mirror-extended at their far end,
    as training extends narrow images."""
    C, h, w = data.shape
    H, W = max(h, tile), max(w, tile)
    ext = torch.from_numpy(data)[:, reflect_index(np.arange(H), h)][:, :, reflect_index(np.arange(W), w)]
    fn = _tile_decompose(ck, C, "sparse")
    ys, xs = edge_starts(H, tile, tile - overlap), edge_starts(W, tile, tile - overlap)
    acc, wsum = torch.zeros(C, H, W), torch.zeros(H, W)
    pos = [(y, x) for y in ys for x in xs]
    with torch.inference_mode():
        for b in range(0, len(pos), batch):
            pp = pos[b:b + batch]
            S = fn(torch.stack([ext[:, y:y + tile, x:x + tile] for y, x in pp]))["S"]
            for (y, x), s in zip(pp, S):
                win = (edge_ramp(tile, overlap, y == ys[0], y == ys[-1])[:, None]
                       * edge_ramp(tile, overlap, x == xs[0], x == xs[-1])[None])
                acc[:, y:y + tile, x:x + tile] += s * win
                wsum[y:y + tile, x:x + tile] += win
    return (acc / wsum)[:, :h, :w].numpy()


def edge_map(ck, data: np.ndarray) -> np.ndarray:
    h, w = data.shape[1:]
    maps = []
    for s in readout_scales(ck):
        small = data if s == 1 else np.clip(resize(data, scaled_size(h, w, s)), 0, 1)
        a = anomaly_map_from_sparse(edge_sparse(ck, small))
        maps.append(a if s == 1 else resize(a[None], (h, w))[0])
    return np.mean(maps, 0)


def hot_at_border(maps: list[np.ndarray], q: float = 0.999, band: int = 16) -> tuple[float, float, float]:
    t = float(np.quantile(np.concatenate([m.ravel() for m in maps]), q))
    n_hot = n_band = 0
    for m in maps:
        h, w = m.shape
        yy, xx = np.mgrid[:h, :w]
        d = np.minimum(np.minimum(yy, h - 1 - yy), np.minimum(xx, w - 1 - xx))
        hot = m > t
        n_hot += int(hot.sum())
        n_band += int((hot & (d < band)).sum())
    top5 = float(np.mean([image_score(m, "top5") for m in maps]))
    return t, n_band / max(n_hot, 1), top5


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--weights", default="weights/indeed-detect-magnetic-tile.safetensors")
    ap.add_argument("--part", choices=("border", "edge"), required=True)
    ap.add_argument("--n-calib", type=int, default=30)
    a = ap.parse_args()
    root = Path(a.data)
    ck = load_checkpoint(a.weights)
    print(f"Command: `python {' '.join(sys.argv)}`\n")
    if a.part == "border":
        P = 48
        rows = {"inner region (48 px in) of the image's map": [], "image cropped by 48 px": [],
                "image reflect-padded by 48 px, cropped back": [], "whole image": [],
                "whole image, edge-aligned tiles": []}
        for p in split(root / "MT_Free")["calib"][:a.n_calib]:
            d = read_image(p).data
            whole = scale_maps(ck, d).mean(0)
            rows["whole image"].append(whole)
            rows["inner region (48 px in) of the image's map"].append(whole[P:-P, P:-P])
            rows["image cropped by 48 px"].append(scale_maps(ck, d[:, P:-P, P:-P]).mean(0))
            padded = np.pad(d, ((0, 0), (P, P), (P, P)), mode="reflect")
            rows["image reflect-padded by 48 px, cropped back"].append(scale_maps(ck, padded).mean(0)[P:-P, P:-P])
            rows["whole image, edge-aligned tiles"].append(edge_map(ck, d))
        print("| map of | 99.9% quantile | hot pixels within 16 px of the border | mean top-5% score |\n|---|---|---|---|")
        for name, maps in rows.items():
            t, f, top5 = hot_at_border(maps)
            print(f"| {name} | {t:.4f} | {f:.2f} | {top5:.4f} |")
        return
    items = [(c, p) for c in DEFECTS for p in sorted((root / c).glob("*.jpg"))]
    items += [("normal", p) for p in split(root / "MT_Free")["eval"]]
    shipped, edge, masks = [], [], []
    for _, p in items:
        d = read_image(p).data
        shipped.append(scale_maps(ck, d).mean(0))
        edge.append(edge_map(ck, d))
        masks.append(load_mask(p, d.shape[1:]))
    labels = [bool(m.any()) for m in masks]
    classes = [c for c, _ in items]
    print("| tiles | pixel AUROC | pixel AP | image AUROC | " + " | ".join(c[3:] for c in DEFECTS) + " |")
    print("|---|---|---|---|" + "---|" * len(DEFECTS))
    for name, maps in (("reflected margin (shipped)", shipped), ("edge-aligned", edge)):
        sc = [image_score(m, "top5") for m in maps]
        r = detection_metrics(maps, masks, sc, labels, list(range(len(items))))
        per = [detection_metrics(maps, masks, sc, labels, [i for i, k in enumerate(classes) if k in (c, "normal")])
               for c in DEFECTS]
        print(f"| {name} | {r['pixel_auroc']:.4f} | {r['pixel_ap']:.4f} | {r['image_auroc']:.4f} | "
              + " | ".join(f"{q['pixel_auroc']:.3f} / {q['image_auroc']:.3f}" for q in per) + " |")


if __name__ == "__main__":
    main()
