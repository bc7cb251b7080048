"""Image-score and scale-fusion variants for a multi-scale detector (issue 4), chosen on one half
of the development set and checked on the other.

Computes each image's per-scale maps once (cached in --cache), then scores, for each fusion of
the scales and each image score, pixel AUROC / AP / image AUROC on half A (even index within its
class) and half B (odd index), as benchmarks/detect.py does.

    python benchmarks/explore/det_score.py --data ../shared/data/anomaly/magnetic-tile \
        --weights weights/indeed-detect-magnetic-tile.safetensors --cache /tmp/det_maps.npz
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from detect import DEFECTS  # noqa: E402
from mt_split import split  # noqa: E402
from indeed_cli.checkpoint import load_checkpoint  # noqa: E402
from indeed_cli.detection import detection_metrics, gaussian_blur, load_mask, readout_scales, scale_maps  # noqa: E402


SCORES = {
    "max G4 (shipped)": lambda m: float(gaussian_blur(m, 4).max()),
    "max G8": lambda m: float(gaussian_blur(m, 8).max()),
    "max G16": lambda m: float(gaussian_blur(m, 16).max()),
    "top 1% mean": lambda m: float(np.sort(m.ravel())[-max(1, m.size // 100):].mean()),
    "top 5% mean": lambda m: float(np.sort(m.ravel())[-max(1, m.size // 20):].mean()),
    "mean": lambda m: float(m.mean()),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--weights", default="weights/indeed-detect-magnetic-tile.safetensors")
    ap.add_argument("--cache", default=None)
    a = ap.parse_args()
    root = Path(a.data)
    items = [(c, p) for c in DEFECTS for p in sorted((root / c).glob("*.jpg"))]
    items += [("normal", p) for p in split(root / "MT_Free")["eval"]]
    ck = load_checkpoint(a.weights)
    scales = readout_scales(ck)
    if a.cache and Path(a.cache).exists():
        z = np.load(a.cache)
        stacks = [z[f"m{i}"] for i in range(len(items))]
    else:
        stacks = [scale_maps(ck, p, scales=scales) for _, p in items]
        if a.cache:
            np.savez_compressed(a.cache, **{f"m{i}": s for i, s in enumerate(stacks)})
    masks = [load_mask(p, s.shape[1:]) for (_, p), s in zip(items, stacks)]
    labels = [bool(m.any()) for m in masks]
    classes = [c for c, _ in items]
    rank_in_class = {}
    half = []
    for c in classes:
        k = rank_in_class.get(c, 0)
        rank_in_class[c] = k + 1
        half.append("A" if k % 2 == 0 else "B")
    fusions = {"mean": lambda st: st.mean(0), "max": lambda st: st.max(0),
               "geo mean": lambda st: np.exp(np.log(st + 1e-4).mean(0))}
    for i, s in enumerate(scales):
        fusions[f"scale {s:g}"] = (lambda i: lambda st: st[i])(i)
    print(f"scales {scales}; half A {half.count('A')} images, half B {half.count('B')}")
    print("| fusion | score | half | pixel AUROC | pixel AP | image AUROC | image AUROC uneven | crack |\n|---|---|---|---|---|---|---|---|")
    for fname, fuse in fusions.items():
        maps = [fuse(st) for st in stacks]
        for sname, score in SCORES.items():
            scores = [score(m) for m in maps]
            for h in "AB":
                sel = [i for i in range(len(items)) if half[i] == h]
                r = detection_metrics(maps, masks, scores, labels, sel)
                per = {}
                for cls in ("MT_Uneven", "MT_Crack"):
                    sc = [i for i in sel if classes[i] in (cls, "normal")]
                    per[cls] = detection_metrics(maps, masks, scores, labels, sc)["image_auroc"]
                print(f"| {fname} | {sname} | {h} | {r['pixel_auroc']:.4f} | {r['pixel_ap']:.4f} | "
                      f"{r['image_auroc']:.4f} | {per['MT_Uneven']:.4f} | {per['MT_Crack']:.4f} |", flush=True)
    print("\nCommand: python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
