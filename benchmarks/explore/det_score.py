"""Image-score and scale-fusion variants for a multi-scale detector (issue 4), chosen on one half
of the development set and checked on the other.

Computes each image's per-scale maps once (cached in --cache), then scores, for each fusion of
the scales and each image score, pixel AUROC / AP / image AUROC on half A (even index within its
class) and half B (odd index), as benchmarks/detect.py does.

    python benchmarks/explore/det_score.py --data ../shared/data/anomaly/magnetic-tile \
        --weights weights/indeed-detect-magnetic-tile.safetensors --cache /tmp/det_maps.npz

``--calibrated`` (sixth session) adds fusions and scores that use the 80 normal calibration images
(the MT_Free `calib` split the threshold is learned on; maps cached in ``--calib-cache``): each
scale's map divided by a high quantile of its calibration pixels before fusing, and image scores
standardised against the calibration scores (median / MAD) and combined by their maximum, so that
small and large defects each count on the score that suits them; and the mean map divided by a
position template (the calibration maps' mean in coordinates relative to the image size, 48 x 48,
plus its median): the magnetic-tile images are aligned crops, and most normal hot spots sit at
the tile's ends, so such a template down-weights them (a PaDiM-like per-position normal model).
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
from indeed_cli.detection import detection_metrics, gaussian_blur, load_mask, readout_scales, resize, scale_maps  # noqa: E402


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
    ap.add_argument("--calibrated", action="store_true")
    ap.add_argument("--calib-cache", default=None)
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
    if a.calibrated:
        calibrated_variants(a, ck, scales, root, items, stacks)
        return
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


def cached_maps(ck, paths, scales, cache):
    if cache and Path(cache).exists():
        z = np.load(cache)
        return [z[f"m{i}"] for i in range(len(paths))]
    stacks = [scale_maps(ck, p, scales=scales) for p in paths]
    if cache:
        np.savez_compressed(cache, **{f"m{i}": s for i, s in enumerate(stacks)})
    return stacks


def calibrated_variants(a, ck, scales, root, items, stacks) -> None:
    calib = cached_maps(ck, split(root / "MT_Free")["calib"], scales, a.calib_cache)
    masks = [load_mask(p, s.shape[1:]) for (_, p), s in zip(items, stacks)]
    labels = [bool(m.any()) for m in masks]
    classes = [c for c, _ in items]
    rank_in_class, half = {}, []
    for c in classes:
        k = rank_in_class.get(c, 0)
        rank_in_class[c] = k + 1
        half.append("A" if k % 2 == 0 else "B")
    ns = len(scales)
    fusions = {"mean (shipped)": lambda st: st.mean(0)}
    for q in (0.99, 0.999):
        qs = np.array([np.quantile(np.concatenate([c[i].ravel() for c in calib]), q) for i in range(ns)])
        print(f"calibration pixel quantile {q}: per scale {np.round(qs, 5).tolist()}")
        fusions[f"mean of map/q{q}"] = (lambda qs: lambda st: (st / qs[:, None, None]).mean(0))(qs)
        fusions[f"max of map/q{q}"] = (lambda qs: lambda st: (st / qs[:, None, None]).max(0))(qs)
    template = np.mean([resize(c.mean(0)[None], (48, 48))[0] for c in calib], axis=0)
    fusions["mean / position template"] = lambda st: st.mean(0) / (resize(template[None], st.shape[1:])[0]
                                                                   + np.median(template))
    hot_border_share(calib)
    base = {"top5": SCORES["top 5% mean"], "top1": SCORES["top 1% mean"], "maxG4": SCORES["max G4 (shipped)"],
            "maxG8": SCORES["max G8"]}
    combos = [("top5",), ("top5", "maxG4"), ("top5", "maxG8"), ("top1", "maxG4"), ("top5", "top1", "maxG4")]
    print("| fusion | score | half | pixel AUROC | pixel AP | image AUROC | blowhole | break | crack | fray | uneven |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for fname, fuse in fusions.items():
        maps = [fuse(st) for st in stacks]
        cmaps = [fuse(st) for st in calib]
        raw = {k: np.array([f(m) for m in maps]) for k, f in base.items()}
        ref = {k: np.array([f(m) for m in cmaps]) for k, f in base.items()}
        z = {k: (raw[k] - np.median(ref[k])) / (np.median(np.abs(ref[k] - np.median(ref[k]))) * 1.4826 + 1e-12)
             for k in base}
        for combo in combos:
            scores = np.max([z[k] for k in combo], axis=0) if len(combo) > 1 else raw[combo[0]]
            name = "max z(" + ", ".join(combo) + ")" if len(combo) > 1 else combo[0]
            for h in "AB":
                sel = [i for i in range(len(items)) if half[i] == h]
                r = detection_metrics(maps, masks, scores, labels, sel)
                per = []
                for cls in DEFECTS:
                    sc = [i for i in sel if classes[i] in (cls, "normal")]
                    per.append(f"{auroc_only(scores, labels, sc):.3f}")
                print(f"| {fname} | {name} | {h} | {r['pixel_auroc']:.4f} | {r['pixel_ap']:.4f} | "
                      f"{r['image_auroc']:.4f} | " + " | ".join(per) + " |", flush=True)
    print("\n(per-class columns: image AUROC of that class against the normal images of the half)")
    print("Command: python " + " ".join(sys.argv))


def hot_border_share(calib) -> None:
    """Where the normal images' hottest pixels (top 0.1% of all their pixels) lie."""
    ms = [c.mean(0) for c in calib]
    q = np.quantile(np.concatenate([m.ravel() for m in ms]), 0.999)
    for b in (8, 16):
        hot = at_border = area = border = 0
        for m in ms:
            h, w = m.shape
            yy, xx = np.mgrid[:h, :w]
            near = np.minimum(np.minimum(yy, h - 1 - yy), np.minimum(xx, w - 1 - xx)) < b
            hot += (m > q).sum()
            at_border += ((m > q) & near).sum()
            border += near.sum()
            area += m.size
        print(f"normal hot pixels within {b} px of the border: {at_border / hot:.1%} (border share of the area "
              f"{border / area:.1%}); images with hot pixels: {sum(bool((m > q).any()) for m in ms)} of {len(ms)}")


def auroc_only(scores, labels, sel) -> float:
    from indeed_cli.detection import auroc
    return auroc(np.asarray(scores)[sel], np.asarray(labels)[sel])


if __name__ == "__main__":
    main()
