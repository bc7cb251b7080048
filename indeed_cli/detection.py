"""Anomaly maps from the posterior of S, threshold calibration, and detection metrics.

Map (docs/detect.md): a(x) = G_2 * mean_c |mu_S(x)|, the posterior-mean magnitude of the sparse
component averaged over channels and smoothed by a Gaussian of sigma 2 px; the image score is
the mean of the largest 5% of a(x) ("top5"; chosen on half of the magnetic-tile development set,
docs/detect.md).  Detectors calibrated before it keep their score, max_x (G_4 * a)(x) ("max_g4"),
because their threshold was learned on it.  |mu_S| is used rather than P(s != 0) because sigma_S
is driven very small by training (about 3e-3), which makes such a probability saturate at 0 or 1
and lose ranking.
The threshold is learned from held-out normal images: the 99th percentile of their scores;
a pixel is marked when a(x) exceeds it, an image when its score does.

Multi-scale read-out: a detector trained on an image pyramid (``indeed train --scales``) is run
on the image resized by each of its scales; the maps are brought back to the input size and
averaged (large defects need more context than one tile; docs/detect.md).  The scales are
stored with the threshold, which is calibrated on the same averaged map.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .checkpoint import Checkpoint
from .inference import InferenceOptions, _as_image, n_tiles, sparse_mean

MAP_BLUR, SCORE_BLUR, TOP_SHARE, QUANTILE = 2.0, 4.0, 0.05, 0.99
SCORE_DEFINITIONS = {"top5": f"mean of the largest {TOP_SHARE:.0%} of the map",
                     "max_g4": f"max(gaussian_blur(map, {SCORE_BLUR}))"}
DEFAULT_SCORE = "top5"


def _gauss_kernel(sigma: float, device) -> torch.Tensor:
    r = max(1, int(3 * sigma))
    k = torch.exp(-(torch.arange(-r, r + 1, dtype=torch.float32, device=device) ** 2) / (2 * sigma ** 2))
    return k / k.sum()


def blur_batch(x: torch.Tensor, sigma_y: float, sigma_x: float) -> torch.Tensor:
    """Separable Gaussian blur of (N, C, h, w) with its own sigma per axis (0 = that axis untouched);
    edges replicated."""
    n, c, h, w = x.shape
    t = x.float().reshape(n * c, 1, h, w)
    if sigma_x > 0:
        k = _gauss_kernel(sigma_x, x.device)
        r = len(k) // 2
        t = F.conv2d(F.pad(t, (r, r, 0, 0), mode="replicate"), k.view(1, 1, 1, -1))
    if sigma_y > 0:
        k = _gauss_kernel(sigma_y, x.device)
        r = len(k) // 2
        t = F.conv2d(F.pad(t, (0, 0, r, r), mode="replicate"), k.view(1, 1, -1, 1))
    return t.reshape(n, c, h, w)


def blur(t: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of a (h, w) tensor; edges replicated (works at any size)."""
    return blur_batch(t[None, None], sigma, sigma)[0, 0]


def gaussian_blur(x: np.ndarray, sigma: float) -> np.ndarray:
    """:func:`blur` for numpy arrays."""
    return blur(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), sigma).numpy()


def anomaly_map_from_sparse(mu_S: np.ndarray) -> np.ndarray:
    return gaussian_blur(np.abs(mu_S).mean(0), MAP_BLUR)


def image_score(amap: np.ndarray, kind: str = DEFAULT_SCORE) -> float:
    """One number per image from its map: ``top5`` (mean of the largest 5% of the pixels) or
    ``max_g4`` (maximum after a Gaussian of sigma 4 px; the first detectors' score)."""
    if kind == "max_g4":
        return float(gaussian_blur(amap, SCORE_BLUR).max())
    if kind != "top5":
        raise ValueError(f"unknown image score {kind!r}; known: {sorted(SCORE_DEFINITIONS)}")
    flat = np.asarray(amap, dtype=np.float64).ravel()
    k = max(1, int(round(TOP_SHARE * flat.size)))
    return float(np.partition(flat, flat.size - k)[-k:].mean())


def score_kind(ckpt: Checkpoint) -> str:
    """The image score a detector's threshold was learned on: its stored ``score_kind``; a detector
    calibrated before scores had names used ``max_g4``; an uncalibrated one gets the default."""
    facts = ckpt.extra.get("detect")
    return facts.get("score_kind", "max_g4") if facts else DEFAULT_SCORE


def resize(x: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(C, h, w) float array to ``size``: antialiased bilinear (downscaling images, upscaling maps)."""
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))[None]
    return F.interpolate(t, size=size, mode="bilinear", align_corners=False, antialias=True)[0].numpy()


def scaled_size(h: int, w: int, scale: float) -> tuple[int, int]:
    return max(8, round(h * scale)), max(8, round(w * scale))


def stored_threshold(ckpt: Checkpoint) -> float | None:
    """The threshold learned at calibration (``extra.detect.threshold``); None if never calibrated."""
    return (ckpt.extra.get("detect") or {}).get("threshold")


def readout_scales(ckpt: Checkpoint) -> tuple[float, ...]:
    """The scales a detector reads out at: those it was calibrated (or trained) with; 1 for older ones."""
    scales = (ckpt.extra.get("detect") or {}).get("scales") or ckpt.training.get("scales") or [1.0]
    return tuple(float(v) for v in scales)


def detect_tiles(ckpt: Checkpoint, h: int, w: int, opts: InferenceOptions, scales=None) -> int:
    """Tiles a multi-scale read-out runs (for progress bars)."""
    return sum(n_tiles(*scaled_size(h, w, s), opts) for s in (scales or readout_scales(ckpt)))


@dataclass
class Detection:
    anomaly_map: np.ndarray  # (h, w) float32
    score: float


def scale_maps(ckpt: Checkpoint, image, opts: InferenceOptions | None = None, progress=None,
               scales: tuple[float, ...] | None = None) -> np.ndarray:
    """(n_scales, h, w): G_2 * mean_c |mu_S| of the image resized by each scale, back at input size."""
    data, _ = _as_image(image)
    h, w = data.shape[1:]
    maps = []
    for s in scales or readout_scales(ckpt):
        small = data if s == 1 else np.clip(resize(data, scaled_size(h, w, s)), 0, 1)
        a = anomaly_map_from_sparse(sparse_mean(ckpt, small, opts, progress))
        maps.append(a if s == 1 else resize(a[None], (h, w))[0])
    return np.stack(maps)


def detect(ckpt: Checkpoint, image, opts: InferenceOptions | None = None, progress=None,
           scales: tuple[float, ...] | None = None, score: str | None = None) -> Detection:
    """Anomaly map (mean over the read-out scales) and image score (the checkpoint's, unless
    ``score`` names another) of one image."""
    amap = scale_maps(ckpt, image, opts, progress, scales).mean(0)
    return Detection(amap.astype(np.float32), image_score(amap, score or score_kind(ckpt)))


def calibrate(ckpt: Checkpoint, normal_images, opts: InferenceOptions | None = None, scales=None) -> dict:
    """Threshold = the 99th percentile of the scores of held-out normal images (default score)."""
    scales = tuple(scales or readout_scales(ckpt))
    scores = [detect(ckpt, im, opts, scales=scales, score=DEFAULT_SCORE).score for im in normal_images]
    return {"threshold": float(np.quantile(scores, QUANTILE)), "n_calibration": len(scores), "scales": list(scales),
            "map": f"gaussian_blur(mean_c |mu_S|, {MAP_BLUR}), mean over scales",
            "score_kind": DEFAULT_SCORE, "score": SCORE_DEFINITIONS[DEFAULT_SCORE],
            "quantile": QUANTILE, "normal_scores": {"min": float(np.min(scores)), "median": float(np.median(scores)),
                                                     "max": float(np.max(scores))}}


# ------------------------------------------------------------------ metrics
def load_mask(image_path, shape: tuple[int, int], suffix: str = ".png") -> np.ndarray:
    """Ground-truth mask of an image: ``X<suffix>`` beside ``X.jpg``, binarised at 128;
    all-normal when there is none.  Raises ValueError when its size differs from ``shape``."""
    from pathlib import Path
    from PIL import Image
    mpath = Path(image_path).with_suffix(suffix)
    if not mpath.exists() or mpath == Path(image_path):
        return np.zeros(shape, bool)
    mask = np.asarray(Image.open(mpath).convert("L")) >= 128
    if mask.shape != tuple(shape):
        raise ValueError(f"{mpath}: mask size {mask.shape} differs from the image {tuple(shape)}")
    return mask


def detection_metrics(maps: list[np.ndarray], masks: list[np.ndarray], scores, labels, select) -> dict:
    """Pixel AUROC and AP over all pixels of the selected images, and image AUROC."""
    pix_s = np.concatenate([maps[i].ravel() for i in select])
    pix_y = np.concatenate([masks[i].ravel() for i in select])
    return {"pixel_auroc": auroc(pix_s, pix_y), "pixel_ap": average_precision(pix_s, pix_y),
            "image_auroc": auroc(np.asarray(scores)[select], np.asarray(labels)[select]), "n_images": len(select)}


def auroc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties)."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).ravel().astype(bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s), dtype=np.float64)
    sorted_s = s[order]
    # average ranks over ties
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_s)) + 1]
    ends = np.r_[starts[1:], len(s)]
    avg = (starts + ends - 1) / 2.0 + 1
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
    """AP = sum over thresholds of (R_k - R_{k-1}) P_k, as scikit-learn defines it (ties grouped)."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).ravel().astype(bool)
    n_pos = int(y.sum())
    if n_pos == 0:
        return float("nan")
    order = np.argsort(-s, kind="mergesort")
    s, y = s[order], y[order]
    last = np.r_[np.flatnonzero(np.diff(s)), len(s) - 1]  # last index of each distinct score
    tp = np.cumsum(y)[last]
    fp = (last + 1) - tp
    precision = tp / (tp + fp)
    recall = tp / n_pos
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))
