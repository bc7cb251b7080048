"""Anomaly-map read-outs on the 72-image magnetic-tile subset (docs/detect.md), first set.

One-off exploration kept so that the numbers quoted in docs/ can be re-run; run from the
repository root with the data under $INDEED_DATA (default ../shared/data):

    python benchmarks/explore/det_variants.py 12

It ran against commit ae23071; later API changes may need small edits.
"""
import os
DATA = os.environ.get('INDEED_DATA', '../shared/data')
import sys, json, numpy as np, time
from pathlib import Path
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[2])); sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[1]))
from mt_split import split
from indeed_cli.checkpoint import load_checkpoint
from indeed_cli.detection import gaussian_blur, detection_metrics, image_score, load_mask
from indeed_cli.imageio import read_image
from indeed_cli.inference import decompose
root = Path('' + DATA + '/anomaly/magnetic-tile')
DEF = ["MT_Blowhole", "MT_Break", "MT_Crack", "MT_Fray", "MT_Uneven"]
lim = int(sys.argv[1])
items = [(c, p) for c in DEF for p in sorted((root / c).glob("*.jpg"))[:lim]] + [("normal", p) for p in split(root / "MT_Free")["eval"][:lim]]
ck = load_checkpoint(sys.argv[2] if len(sys.argv) > 2 else 'weights/indeed-detect-magnetic-tile.safetensors')
cache = []
for c, p in items:
    img = read_image(p); d = decompose(ck, img)
    cache.append((c, p, img.data.mean(0), d.maps['L'].mean(0), d.maps['S'].mean(0), d.maps['sigma_S'].mean(0)))
def mad_norm(a):
    m = np.median(a); s = np.median(np.abs(a - m)) + 1e-6
    return (a - m) / s
variants = {
  'absS_b2': lambda Y, L, S, sS: gaussian_blur(np.abs(S), 2),
  'absS_b4': lambda Y, L, S, sS: gaussian_blur(np.abs(S), 4),
  'zS_b2': lambda Y, L, S, sS: gaussian_blur(np.abs(S) / (sS + 1e-6), 2),
  'absS_madnorm': lambda Y, L, S, sS: mad_norm(gaussian_blur(np.abs(S), 2)),
  'absYL_b2': lambda Y, L, S, sS: gaussian_blur(np.abs(Y - L), 2),
  'absYL_madnorm': lambda Y, L, S, sS: mad_norm(gaussian_blur(np.abs(Y - L), 2)),
  'absS_rel': lambda Y, L, S, sS: gaussian_blur(np.abs(S) / (gaussian_blur(np.abs(S), 16) + 0.01), 2),
}
for name, f in variants.items():
    maps, masks, scores, labels = [], [], [], []
    for c, p, Y, L, S, sS in cache:
        a = f(Y, L, S, sS); m = load_mask(p, a.shape)
        maps.append(a); masks.append(m); scores.append(image_score(a)); labels.append(bool(m.any()))
    r = detection_metrics(maps, masks, scores, labels, list(range(len(cache))))
    print(name, {k: round(v, 4) for k, v in r.items() if isinstance(v, float)}, flush=True)
