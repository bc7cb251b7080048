#!/usr/bin/env python3
"""Run an exported InDeed detector with onnxruntime, numpy and Pillow only: the read-out of
`indeed detect` (tiles, blend, map, score, decision), for porting to other runtimes.  For a
detector with a support posterior this is `indeed detect --tiled`: by default `indeed detect`
runs that detector's f_thetaS and f_thetaM on the whole image, which the one-tile graph cannot
(maps differ slightly; calibrate a threshold with the read-out you deploy).

    indeed export -w magnetic-tile --onnx detector.onnx
    python examples/onnx_detect.py detector.onnx part.png [more.png ...]

The ONNX file holds the network of one tile; everything around it is here, in about 100 lines:
  1. the image in [0, 1], gray (a gray detector reads a colour image channel by channel);
  2. at each read-out scale s, the image resized by s (antialiased bilinear), cut into 128x128
     tiles on a stride of 96 (overlap 32) after a reflected margin of 16 pixels, run tile by tile;
  3. the tiles' output (S, or P = q(z = 1) for a detector with a support posterior) blended with
     a separable window (zero band of 8 pixels, raised cosine up to 1), normalised by the
     window's coverage;
  4. the map a = Gaussian(sigma 2 px, edges replicated) of mean_c |S|, or mean_c P as it is,
     resized back to the image; averaged over the scales;
  5. the score: the mean of the largest 5% of the map; anomalous when above the stored threshold.
A detector of several members (`indeed calibrate --member`, like the bundled one) outputs one P
channel per member; its map is the mean over members of each member's map at its own scales
(metadata `indeed.member_scales`).
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import onnxruntime as ort
from PIL import Image


def reflect_index(idx: np.ndarray, n: int) -> np.ndarray:
    if n == 1:
        return np.zeros_like(idx)
    period = 2 * (n - 1)
    m = np.mod(idx, period)
    return np.where(m < n, m, period - m)


def ramp(tile: int, overlap: int) -> np.ndarray:
    """The 1-D blend window: 0 for overlap // 4 pixels at each edge, a raised cosine, then 1."""
    r = np.ones(tile, np.float32)
    k = overlap // 4
    n = overlap - 2 * k
    d = np.arange(overlap, dtype=np.float32)
    rise = np.where(d < k, 0.0, 0.5 - 0.5 * np.cos(math.pi * np.clip((d - k + 0.5) / n, 0, 1))).astype(np.float32)
    rise[overlap - k :] = 1.0
    r[:overlap] = rise
    r[-overlap:] = np.minimum(r[-overlap:], rise[::-1])
    return r


def starts(length: int, tile: int, overlap: int) -> list[int]:
    total, stride = length + 2 * (overlap // 2), tile - overlap
    return [i * stride for i in range(max(0, math.ceil((total - tile) / stride)) + 1)]


def tiled(session: ort.InferenceSession, image: np.ndarray, tile: int, overlap: int, batch: int = 8) -> np.ndarray:
    """The network's output for a (C, h, w) image, tile by tile, blended back to (channels out, h, w)."""
    C, h, w = image.shape
    margin, win = overlap // 2, ramp(tile, overlap)
    ys, xs = starts(h, tile, overlap), starts(w, tile, overlap)
    spots = [(y, x) for y in ys for x in xs]
    acc = None  # as many channels as the graph outputs: C, or one per member of a detector
    for b0 in range(0, len(spots), batch):
        part = spots[b0 : b0 + batch]
        rows = [reflect_index(np.arange(y, y + tile) - margin, h) for y, _ in part]
        cols = [reflect_index(np.arange(x, x + tile) - margin, w) for _, x in part]
        tiles = np.stack([image[:, r][:, :, c] for r, c in zip(rows, cols)]).astype(np.float32)
        out = session.run(None, {"Y": tiles})[0]
        acc = np.zeros((out.shape[1], h, w), np.float32) if acc is None else acc
        for (y, x), t in zip(part, out):
            r0, c0 = y - margin, x - margin  # image coordinates of the tile's corner
            ty0, ty1, tx0, tx1 = max(0, -r0), min(tile, h - r0), max(0, -c0), min(tile, w - c0)
            acc[:, r0 + ty0 : r0 + ty1, c0 + tx0 : c0 + tx1] += (t * win[:, None] * win[None, :])[:, ty0:ty1, tx0:tx1]

    def coverage(first: list[int], length: int) -> np.ndarray:
        c = np.zeros(first[-1] + tile, np.float32)
        for s in first:
            c[s : s + tile] += win
        return c[margin : margin + length]

    return acc / (coverage(ys, h)[:, None] * coverage(xs, w)[None, :])


def gaussian_blur(x: np.ndarray, sigma: float) -> np.ndarray:
    r = max(1, int(3 * sigma))
    k = np.exp(-(np.arange(-r, r + 1, dtype=np.float32) ** 2) / (2 * sigma**2))
    k /= k.sum()
    pad = np.pad(x, ((0, 0), (r, r)), mode="edge")
    x = sum(k[i] * pad[:, i : i + x.shape[1]] for i in range(len(k)))
    pad = np.pad(x, ((r, r), (0, 0)), mode="edge")
    return sum(k[i] * pad[i : i + x.shape[0]] for i in range(len(k))).astype(np.float32)


def resize(plane: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(h, w) float32 to size (h, w): antialiased bilinear, as Pillow and PyTorch's antialias do it."""
    return np.asarray(Image.fromarray(plane.astype(np.float32), "F").resize(size[::-1], Image.BILINEAR))


def detect(session: ort.InferenceSession, image: np.ndarray) -> tuple[np.ndarray, float, bool]:
    """(map, score, anomalous) of a (C, h, w) image in [0, 1], with the read-out stored in the model."""
    meta = session.get_modelmeta().custom_metadata_map
    tile, overlap = int(meta["indeed.tile"]), int(meta["indeed.overlap"])
    support = meta["indeed.output"].startswith("P:")
    scales, threshold = json.loads(meta["indeed.scales"]), json.loads(meta["indeed.threshold"])
    if meta["indeed.score"] != "top5":
        raise SystemExit(f"this example computes the top5 score, the model stores {meta['indeed.score']}")
    if json.loads(meta["indeed.config"])["channels"] == 1:
        image = image.reshape(-1, 1, *image.shape[1:])  # each colour channel as a gray image
    else:
        image = image[None]
    h, w = image.shape[-2:]
    members = json.loads(meta.get("indeed.member_scales", "null")) or [scales]  # each member's scales
    maps = [[] for _ in members]
    for s in sorted({s for own in members for s in own}, reverse=True):
        size = (max(8, round(h * s)), max(8, round(w * s)))
        planes = [c[0] if s == 1 else np.clip(resize(c[0], size), 0, 1) for c in image]
        out = np.stack([tiled(session, c[None], tile, overlap) for c in planes])  # (planes, channels, h, w)
        # a support posterior (output P, one channel per member) is the map itself; S is read out as |S| smoothed
        per_member = out.mean(0) if support else gaussian_blur(np.abs(out).mean((0, 1)), 2.0)[None]
        for k, own in enumerate(members):
            if s in own:
                maps[k].append(per_member[k] if s == 1 else resize(per_member[k], (h, w)))
    amap = np.mean([np.mean(m, axis=0) for m in maps], axis=0)
    flat = np.sort(amap.ravel().astype(np.float64))
    score = float(flat[-max(1, round(0.05 * flat.size)) :].mean())
    return amap, score, threshold is not None and score > threshold


def read(path: str) -> np.ndarray:
    im = Image.open(path)
    a = np.asarray(im.convert("L" if im.mode in ("L", "I;16", "I") else "RGB"), dtype=np.float32) / 255.0
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)


if __name__ == "__main__":
    session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
    for path in sys.argv[2:]:
        amap, score, anomalous = detect(session, read(path))
        print(json.dumps({"image": path, "score": round(score, 6), "anomalous": anomalous}))
