#!/usr/bin/env python3
"""Per defect class: how much of the defect shows in S and in L (shipped detector, scale 1).

    python benchmarks/explore/det_classes_S.py [MAGNETIC_TILE_DIR]    # this CPU, a few minutes

Decomposes every defect image with a non-empty mask of the magnetic-tile development folders
with the shipped detector at scale 1 only (``indeed_cli.inference.decompose``, posterior
means) and prints, per class, the mean |mu_S| inside and outside the mask and the pixel AUROC
of |mu_S| and of |L - median(L)| (a naive statistic of the low-rank part).  docs/detect.md
reads the table.
"""
import glob
import sys
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from indeed_cli.checkpoint import load_checkpoint  # noqa: E402
from indeed_cli.detection import auroc  # noqa: E402
from indeed_cli.imageio import read_image  # noqa: E402
from indeed_cli.inference import decompose  # noqa: E402

root = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/data/anomaly/magnetic-tile")
ck = load_checkpoint(Path(__file__).resolve().parents[2] / "weights/indeed-detect-magnetic-tile.safetensors")
print("| class | n | mean abs(S) inside / outside the mask | pixel AUROC of abs(S) | pixel AUROC of abs(L - median L) |")
print("|---|---|---|---|---|")
for c in ["MT_Blowhole", "MT_Break", "MT_Crack", "MT_Fray", "MT_Uneven"]:
    inside, outside, s_maps, l_maps, labels = [], [], [], [], []
    for f in sorted(glob.glob(str(root / c / "*.jpg"))):
        m = np.array(Image.open(f[:-4] + ".png").convert("L")) > 128
        if not m.any():
            continue
        dec = decompose(ck, read_image(f))
        S, L = np.abs(dec.maps["S"][0]), dec.maps["L"][0]
        inside.append(S[m].mean())
        outside.append(S[~m].mean())
        s_maps.append(S.ravel())
        l_maps.append(np.abs(L - np.median(L)).ravel())
        labels.append(m.ravel())
    y = np.concatenate(labels)
    print(f"| {c[3:]} | {len(inside)} | {np.mean(inside):.5f} / {np.mean(outside):.5f} | "
          f"{auroc(np.concatenate(s_maps), y):.3f} | {auroc(np.concatenate(l_maps), y):.3f} |", flush=True)
print("\nCommand: python " + " ".join(sys.argv))
