#!/usr/bin/env python3
"""Anomaly detection on magnetic tiles: pixel AUROC, pixel AP and image AUROC, per defect class
and overall, for InDeed and two baselines side by side:

  rpca       classical robust PCA of each image (low-rank + sparse, inexact ALM), map = |S|
  nobayes    the same network trained without l_fid, l_rank, l_sparse (paper ablation #9)
  patchcore  an ImageNet-feature peer (benchmarks/patchcore.py: EfficientNet-Lite0, memory bank of
             the normal training images of benchmarks/mt_split.py, or ``--peer-normal``)

    python benchmarks/detect.py --data ../shared/data/anomaly/magnetic-tile \
        --weights weights/indeed-detect-magnetic-tile.safetensors --nobayes NOBAYES.safetensors

Normal evaluation images are the MT_Free images that benchmarks/mt_split.py puts in 'eval'
(never trained on, never used for the threshold), or those listed in ``--normal``.  Every map is
read out as the detector defines it (|mu_S| smoothed, or the support posterior q(z = 1) of f_thetaM)
and scored by its own image score (``--score`` sets one for all); network maps are read out at the
checkpoint's scales (``--scales`` overrides them).
Several detectors side by side: ``--weights NAME=PATH,NAME=PATH`` and ``--methods NAME,...``.
``--precision own,fp32`` reads every network out at each precision, a row each (own: the one its
threshold was learned at, ``indeed calibrate --precision``).
Rows "half A" / "half B" split every class (and the normal images) by the parity of the image's
index: choose on one half, check on the other.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mt_split import split  # noqa: E402

from indeed_cli.inference import InferenceOptions, check_ensemble, resolve_device  # noqa: E402
from indeed_cli.io import load_mask, read_image  # noqa: E402
from indeed_cli.metrics import detection_metrics  # noqa: E402
from indeed_cli.model import load_checkpoint  # noqa: E402
from indeed_cli.pipelines import parse_scales  # noqa: E402
from indeed_cli.tasks.detection import (  # noqa: E402
    DEFAULT_SCORE,
    JOINT_SCORE,
    SCORE_DEFINITIONS,
    anomaly_map_from_sparse,
    detect,
    image_score,
    readout_ensemble,
    readout_scales,
)
from indeed_cli.tasks.training import list_images  # noqa: E402

DEFECTS = ["MT_Blowhole", "MT_Break", "MT_Crack", "MT_Fray", "MT_Uneven"]
HALVES = {"half A": 0, "half B": 1}


def rpca_sparse(Y: np.ndarray, max_iter: int = 100, tol: float = 1e-6) -> np.ndarray:
    """Inexact augmented Lagrange multiplier RPCA (Lin, Chen, Ma 2010): Y = L + S."""
    h, w = Y.shape
    lam = 1.0 / np.sqrt(max(h, w))
    norm_two = np.linalg.norm(Y, 2)
    Yd = Y / max(norm_two, np.abs(Y).max() / lam)
    mu, rho = 1.25 / norm_two, 1.5
    L, S = np.zeros_like(Y), np.zeros_like(Y)
    fro = np.linalg.norm(Y)
    for _ in range(max_iter):
        T = Y - L + Yd / mu
        S = np.sign(T) * np.maximum(np.abs(T) - lam / mu, 0)
        U, sig, Vt = np.linalg.svd(Y - S + Yd / mu, full_matrices=False)
        sig = np.maximum(sig - 1 / mu, 0)
        r = int((sig > 0).sum())
        L = (U[:, :r] * sig[:r]) @ Vt[:r]
        Z = Y - L - S
        Yd = Yd + mu * Z
        mu = min(mu * rho, 1e7)
        if np.linalg.norm(Z) / fro < tol:
            break
    return S


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--weights", required=True, help="PATH (method 'indeed') or NAME=PATH,NAME=PATH,...")
    ap.add_argument("--nobayes", default=None)
    ap.add_argument("--methods", default="indeed,nobayes,rpca")
    ap.add_argument(
        "--normal",
        default=None,
        help="folder or .txt list of normal evaluation images (default: the 'eval' split of DATA/MT_Free)",
    )
    ap.add_argument(
        "--scales",
        default=None,
        help="read-out scales for every network, e.g. 1,0.5,0.25 (default: each checkpoint's own)",
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--score",
        default=None,
        choices=sorted(SCORE_DEFINITIONS),
        help="image score for every network (default: each checkpoint's own; rpca: top5, and for top5_joint)",
    )
    ap.add_argument(
        "--ensemble",
        default=None,
        help="maps averaged over N flips and rotations for every network (2, 4, 8; default: each checkpoint's own)",
    )
    ap.add_argument(
        "--precision",
        default="own",
        help="own (the precision each detector's threshold was learned at), fp32, bf16, auto or a list "
        "(own,fp32): the networks' read-out precision, each a row of its own",
    )
    ap.add_argument("--peer-scale", type=float, default=1.0, help="patchcore: input scale")
    ap.add_argument(
        "--peer-normal",
        default=None,
        help="patchcore: folder or .txt list of normal images for its memory bank (default: the "
        "'train' split of DATA/MT_Free, at most --peer-count of them)",
    )
    ap.add_argument("--peer-count", type=int, default=400)
    ap.add_argument("--limit", type=int, default=0, help="first N images per folder (0 = all)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    root = Path(a.data)
    items = [(c, p) for c in DEFECTS for p in sorted((root / c).glob("*.jpg"))[: a.limit or None]]
    normal = list_images(a.normal) if a.normal else split(root / "MT_Free")["eval"]
    items += [("normal", p) for p in normal[: a.limit or None]]
    half = [sum(c == cls for c, _ in items[:i]) % 2 for i, (cls, _) in enumerate(items)]  # index parity per class
    methods = a.methods.split(",")
    dev = resolve_device(a.device)
    named = dict(w.split("=", 1) if "=" in w else ("indeed", w) for w in a.weights.split(","))
    if a.nobayes:
        named["nobayes"] = a.nobayes
    models = {m: load_checkpoint(named[m], dev) for m in methods if m not in ("rpca", "patchcore")}
    peer = None
    if "patchcore" in methods:
        from patchcore import PatchCore

        bank = list_images(a.peer_normal) if a.peer_normal else split(root / "MT_Free")["train"]
        bank = bank[:: max(1, len(bank) // a.peer_count)][: a.peer_count]
        peer = PatchCore(str(dev), a.peer_scale)
        t0 = time.perf_counter()
        peer.fit([read_image(p).data for p in bank])
        print(f"patchcore: memory bank {tuple(peer.bank.shape)} from {len(bank)} images, "
              f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)  # fmt: skip
    scales = parse_scales(a.scales) if a.scales else None  # the CLI's rule: distinct, in (0, 1]
    ensemble = check_ensemble(a.ensemble) if a.ensemble else None
    for m, ck in models.items():
        used = f"scales {scales or readout_scales(ck)}, ensemble {ensemble or readout_ensemble(ck)}"
        print(f"{m}: {ck.source}, {used}", file=sys.stderr)
    precisions = a.precision.split(",")
    runs = [(m, p) for m in methods for p in (precisions if m in models else ["own"])]
    results = {}
    for m, precision in runs:
        label = f"{m} {precision}" if m in models and len(precisions) > 1 else m
        opts = InferenceOptions(precision=None if precision == "own" else precision)
        maps, masks, scores, labels, classes = [], [], [], [], []
        t0 = time.perf_counter()
        for cls, p in items:
            img = read_image(p)
            if m == "rpca":
                amap = anomaly_map_from_sparse(rpca_sparse(img.data.mean(0).astype(np.float64))[None])
                score = image_score(amap, a.score if a.score not in (None, JOINT_SCORE) else DEFAULT_SCORE)
            elif m == "patchcore":
                amap = peer.anomaly_map(img.data)
                score = float(amap.max())
            else:
                det = detect(models[m], img, opts, scales=scales, score=a.score, ensemble=ensemble)
                amap, score = det.anomaly_map, det.score
            mask = load_mask(p, amap.shape)
            maps.append(amap)
            masks.append(mask)
            scores.append(score)
            labels.append(bool(mask.any()))
            classes.append(cls)
        secs = (time.perf_counter() - t0) / len(items)
        row = {"seconds_per_image": secs}
        for cls in ["all"] + DEFECTS:
            sel = [i for i, c in enumerate(classes) if cls == "all" or c in (cls, "normal")]
            row[cls] = detection_metrics(maps, masks, scores, labels, sel)
        for name, parity in HALVES.items():
            row[name] = detection_metrics(
                maps, masks, scores, labels, [i for i in range(len(items)) if half[i] == parity]
            )
        results[label] = row
        print(json.dumps({label: row["all"], "s/img": round(secs, 3)}), file=sys.stderr, flush=True)
    print(
        f"Command: `python {' '.join(sys.argv)}`  \nNormal evaluation images: {sum(c == 'normal' for c, _ in items)}, "
        f"defective: {sum(c != 'normal' for c, _ in items)} "
        "(masks binarised at 128; an image is anomalous when its mask is non-empty)\n"
    )
    print("| method | subset | pixel AUROC | pixel AP | image AUROC |\n|---|---|---|---|---|")
    for m in results:
        for cls in ["all"] + DEFECTS + list(HALVES):
            r = results[m][cls]
            print(f"| {m} | {cls} (+ normal) | {r['pixel_auroc']:.4f} | {r['pixel_ap']:.4f} | {r['image_auroc']:.4f} |")
    print(f"\n| method | s / image ({a.device}) |\n|---|---|")
    for m in results:
        print(f"| {m} | {results[m]['seconds_per_image']:.2f} |")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
