"""How far is the S map from its ceiling?  Mean maps of several separately trained detectors
(issue 4, seventh session).

Seeds of one recipe differ by up to 0.024 pixel AUROC and 0.048 AP; if that spread hid a better
detector, averaging the maps of several would show it.  Scores each detector and the mean of the
first k maps (k = 2, 3, ...) on the full development set, each detector read out at scales
1, 0.5, 0.25, image score top 5%; maps cached per detector in --cache-dir.

    python benchmarks/explore/det_ensemble.py --data ../shared/data/anomaly/magnetic-tile \
        --weights d_pyr=D_PYR d_pyr2=D_PYR2 n_pyr=N_PYR d_pyrL=D_PYRL --cache-dir /tmp/det_ens
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
from indeed_cli.detection import detection_metrics, image_score, load_mask, scale_maps  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--weights", nargs="+", required=True, help="NAME=PATH ...")
    ap.add_argument("--cache-dir", default=None)
    a = ap.parse_args()
    root = Path(a.data)
    items = [(c, p) for c in DEFECTS for p in sorted((root / c).glob("*.jpg"))]
    items += [("normal", p) for p in split(root / "MT_Free")["eval"]]
    named = dict(w.split("=", 1) for w in a.weights)
    maps: dict[str, list[np.ndarray]] = {}
    for name, path in named.items():
        cache = Path(a.cache_dir) / f"maps_{name}.npz" if a.cache_dir else None
        if cache and cache.exists():
            z = np.load(cache)
            maps[name] = [z[f"m{i}"] for i in range(len(items))]
            continue
        ck = load_checkpoint(path)
        maps[name] = [scale_maps(ck, p, scales=(1.0, 0.5, 0.25)).mean(0).astype(np.float32) for _, p in items]
        if cache:
            cache.parent.mkdir(parents=True, exist_ok=True)
            np.savez_compressed(cache, **{f"m{i}": m for i, m in enumerate(maps[name])})
    first = next(iter(maps.values()))
    masks = [load_mask(p, first[i].shape) for i, (_, p) in enumerate(items)]
    labels = [bool(m.any()) for m in masks]
    classes = [c for c, _ in items]
    print(f"Command: `python {' '.join(sys.argv)}`\n")
    print("| maps | pixel AUROC | pixel AP | image AUROC | " + " | ".join(c[3:] for c in DEFECTS) + " |")
    print("|---|---|---|---|" + "---|" * len(DEFECTS))

    def row(name: str, mm: list[np.ndarray]) -> None:
        sc = [image_score(m, "top5") for m in mm]
        r = detection_metrics(mm, masks, sc, labels, list(range(len(items))))
        per = [detection_metrics(mm, masks, sc, labels, [i for i, k in enumerate(classes) if k in (c, "normal")])
               for c in DEFECTS]
        print(f"| {name} | {r['pixel_auroc']:.4f} | {r['pixel_ap']:.4f} | {r['image_auroc']:.4f} | "
              + " | ".join(f"{q['pixel_auroc']:.3f} / {q['image_auroc']:.3f}" for q in per) + " |", flush=True)

    names = list(maps)
    for n in names:
        row(n, maps[n])
    for k in range(2, len(names) + 1):
        row("mean of " + ", ".join(names[:k]), [np.mean([maps[n][i] for n in names[:k]], 0) for i in range(len(items))])


if __name__ == "__main__":
    main()
