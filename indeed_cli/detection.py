"""Anomaly maps from the posterior of S, threshold calibration, and detection metrics.

Map (docs/detect.md): a(x) = G_2 * mean_c |mu_S(x)|, the posterior-mean magnitude of the sparse
component averaged over channels and smoothed by a Gaussian of sigma 2 px; the image score is
max_x (G_4 * a)(x).  |mu_S| is used rather than P(s != 0) because sigma_S is driven very small
by training (about 3e-3), which makes such a probability saturate at 0 or 1 and lose ranking.
The threshold is learned from held-out normal images: the 99th percentile of their scores;
a pixel is marked when a(x) exceeds it, an image when its score does.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .checkpoint import Checkpoint
from .inference import InferenceOptions, sparse_mean

MAP_BLUR, SCORE_BLUR, QUANTILE = 2.0, 4.0, 0.99


def blur(t: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of a (h, w) tensor; edges replicated (works at any size)."""
    r = max(1, int(3 * sigma))
    k = torch.exp(-(torch.arange(-r, r + 1, dtype=torch.float32, device=t.device) ** 2) / (2 * sigma ** 2))
    k = k / k.sum()
    t = F.pad(t.float()[None, None], (r, r, r, r), mode="replicate")
    return F.conv2d(F.conv2d(t, k.view(1, 1, 1, -1)), k.view(1, 1, -1, 1))[0, 0]


def gaussian_blur(x: np.ndarray, sigma: float) -> np.ndarray:
    """:func:`blur` for numpy arrays."""
    return blur(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), sigma).numpy()


def anomaly_map_from_sparse(mu_S: np.ndarray) -> np.ndarray:
    return gaussian_blur(np.abs(mu_S).mean(0), MAP_BLUR)


def image_score(amap: np.ndarray) -> float:
    return float(gaussian_blur(amap, SCORE_BLUR).max())


@dataclass
class Detection:
    anomaly_map: np.ndarray  # (h, w) float32
    score: float


def detect(ckpt: Checkpoint, image, opts: InferenceOptions | None = None, progress=None) -> Detection:
    amap = anomaly_map_from_sparse(sparse_mean(ckpt, image, opts, progress))
    return Detection(amap.astype(np.float32), image_score(amap))


def calibrate(ckpt: Checkpoint, normal_images, opts: InferenceOptions | None = None) -> dict:
    """Threshold = the 99th percentile of the scores of held-out normal images."""
    scores = [detect(ckpt, im, opts).score for im in normal_images]
    return {"threshold": float(np.quantile(scores, QUANTILE)), "n_calibration": len(scores),
            "map": f"gaussian_blur(mean_c |mu_S|, {MAP_BLUR})", "score": f"max(gaussian_blur(map, {SCORE_BLUR}))",
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
