"""Does the bundled detector see large defects better on downscaled images? (issue 4 planning)

Runs the detector on each image resized by each scale, brings the anomaly map back to the
input size, and prints pixel AUROC / pixel AP / image AUROC overall and per class, as
benchmarks/detect.py does (same images, masks and score).

    python benchmarks/explore/det_scale.py --data ../shared/data/anomaly/magnetic-tile --scales 1,0.5,0.25 \
        --fuse 1+0.5,1+0.5+0.25

``--fuse`` also scores the pixel-wise mean and maximum of the maps of several scales.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from detect import DEFECTS  # noqa: E402
from mt_split import split  # noqa: E402
from indeed_cli.checkpoint import load_checkpoint  # noqa: E402
from indeed_cli.detection import anomaly_map_from_sparse, detection_metrics, image_score, load_mask  # noqa: E402
from indeed_cli.imageio import read_image  # noqa: E402
from indeed_cli.inference import sparse_mean  # noqa: E402


def resize(x: np.ndarray, size: tuple[int, int], mode: str) -> np.ndarray:
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))[None]
    kw = {"antialias": True} if mode == "bicubic" else {}
    return F.interpolate(t, size=size, mode=mode, align_corners=False, **kw)[0].numpy()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--weights", default="weights/indeed-detect-magnetic-tile.safetensors")
    ap.add_argument("--scales", default="1,0.5")
    ap.add_argument("--fuse", default="", help="comma-separated groups of scales joined by +")
    a = ap.parse_args()
    root = Path(a.data)
    items = [(c, p) for c in DEFECTS for p in sorted((root / c).glob("*.jpg"))]
    items += [("normal", p) for p in split(root / "MT_Free")["eval"]]
    ck = load_checkpoint(a.weights)
    scales = [float(v) for v in a.scales.split(",")]
    per_scale: dict[float, list[np.ndarray]] = {s: [] for s in scales}
    masks, labels, classes = [], [], []
    for cls, p in items:
        x = read_image(p).data
        h, w = x.shape[1:]
        for scale in scales:
            small = x if scale == 1 else resize(x, (max(8, round(h * scale)), max(8, round(w * scale))), "bicubic")
            amap = anomaly_map_from_sparse(sparse_mean(ck, small))
            per_scale[scale].append(amap if scale == 1 else resize(amap[None], (h, w), "bilinear")[0])
        mask = load_mask(p, (h, w))
        masks.append(mask)
        labels.append(bool(mask.any()))
        classes.append(cls)
    variants = {f"{s:g}": per_scale[s] for s in scales}
    for group in filter(None, a.fuse.split(",")):
        members = [per_scale[float(v)] for v in group.split("+")]
        variants[f"mean {group}"] = [np.mean(m, 0) for m in zip(*members)]
        variants[f"max {group}"] = [np.max(m, 0) for m in zip(*members)]
    print("| maps | subset | pixel AUROC | pixel AP | image AUROC |\n|---|---|---|---|---|")
    for name, maps in variants.items():
        scores = [image_score(m) for m in maps]
        for cls in ["all"] + DEFECTS:
            sel = [i for i, c in enumerate(classes) if cls == "all" or c in (cls, "normal")]
            r = detection_metrics(maps, masks, scores, labels, sel)
            print(f"| {name} | {cls} | {r['pixel_auroc']:.4f} | {r['pixel_ap']:.4f} | {r['image_auroc']:.4f} |", flush=True)
    print("\nCommand: python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
