#!/usr/bin/env python3
"""Per-tile posterior statistics as anomaly maps: do they see what S misses (uneven surfaces)?

    python benchmarks/explore/det_tile_stats.py    # this CPU, about 5 minutes; needs .carry/mt, .carry/mteval

.carry/mt holds MT_Free and the split lists of benchmarks/mt_split.py (calib.txt: the 80
normal images that set the shipped threshold); .carry/mteval holds the development defect
folders and normal/ (the 79 held-out normal images).  For every tile of the shipped detector
(scale 1, tile 128, overlap 32) it takes l_rank, l_sparse, l_fid and the rank index, robustly
standardises them against the calibration images' tiles (median / MAD), paints each tile's
|z| or signed z over its area and prints the pixel AUROC per defect class (each class with the
normal images) and over all, next to the shipped S-based map.  docs/detect.md reads the table.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import glob
import numpy as np
from pathlib import Path
from PIL import Image
from indeed_cli.checkpoint import load_checkpoint
from indeed_cli.inference import decompose
from indeed_cli.detection import auroc, detect
from indeed_cli.imageio import read_image
from indeed_cli.tiling import TileGrid
ck = load_checkpoint('weights/indeed-detect-magnetic-tile.safetensors')
FEATS = ("l_rank", "l_sparse", "l_fid", "rank_index")

def feats(path):
    im = read_image(path)
    dec = decompose(ck, im)
    t = dec.tiles
    F = np.stack([t[k].reshape(t[k].shape[0], t[k].shape[1], -1).mean(-1) for k in FEATS], -1)  # (ty, tx, 4)
    return im, F

def paint(F_score, h, w):
    g = TileGrid(h, w, 128, 32)
    acc = np.zeros((g.ys[-1] + 128, g.xs[-1] + 128)); cnt = np.zeros_like(acc)
    for i, y in enumerate(g.ys):
        for j, x in enumerate(g.xs):
            acc[y:y + 128, x:x + 128] += F_score[i, j]; cnt[y:y + 128, x:x + 128] += 1
    m = g.margin
    return (acc / np.maximum(cnt, 1))[m:m + h, m:m + w]

calib = [l.strip() for l in open('.carry/mt/calib.txt')]
ref = np.concatenate([feats('.carry/mt/' + p)[1].reshape(-1, 4) for p in calib])
med = np.median(ref, 0); mad = np.median(np.abs(ref - med), 0) * 1.4826 + 1e-9
print("calib tiles", len(ref), "median", med.round(4), "mad", mad.round(4))
rows = {}
for c in ["MT_Blowhole", "MT_Break", "MT_Crack", "MT_Fray", "MT_Uneven", "normal"]:
    for f in sorted(glob.glob(f'.carry/mteval/{c}/*.jpg')):
        im, F = feats(f)
        z = (F - med) / mad
        h, w = im.size
        mp = Path(f[:-4] + '.png')
        m = (np.array(Image.open(mp).convert('L')) > 128) if mp.exists() else np.zeros((h, w), bool)
        maps = {"S map (shipped)": detect(ck, im).anomaly_map}
        for k, name in enumerate(FEATS):
            maps[f"|z| {name}"] = paint(np.abs(z[..., k]), h, w)
            maps[f"+z {name}"] = paint(z[..., k], h, w)
        maps["max |z|"] = paint(np.abs(z).max(-1), h, w)
        for k, v in maps.items():
            rows.setdefault(k, {}).setdefault(c, []).append((v.ravel(), m.ravel()))
print("| map | " + " | ".join(["Blowhole", "Break", "Crack", "Fray", "Uneven", "all"]) + " |")
for k, per in rows.items():
    out = []
    normal = per["normal"]
    for c in ["MT_Blowhole", "MT_Break", "MT_Crack", "MT_Fray", "MT_Uneven"]:
        s = np.concatenate([a for a, _ in per[c] + normal]); y = np.concatenate([b for _, b in per[c] + normal])
        out.append(auroc(s, y))
    s = np.concatenate([a for c in per for a, _ in per[c]]); y = np.concatenate([b for c in per for _, b in per[c]])
    out.append(auroc(s, y))
    print(f"| {k} | " + " | ".join(f"{v:.3f}" for v in out) + " |", flush=True)
