"""Evaluation conventions shared by `indeed evaluate` and benchmarks/ (shared/data/README.md):

- synthetic noise: x in [0,1], y = x + N(0, (sigma/255)^2), unclipped, fixed seed per image;
  the "clipped8" form clips y to [0,1] and quantises it to 8 bits, like a user's noisy file;
- PSNR on the output clipped to [0,1] and quantised to 8 bits, data range 255;
- SSIM: scikit-image structural_similarity, data_range 255 (channel_axis for colour), when
  scikit-image is installed (the `bench` extra); otherwise reported as None;
- anomaly detection: pixel AUROC and average precision over all pixels of the evaluated images,
  image AUROC over their scores (an image is anomalous when its mask is not empty).

Numpy only: the bottom layer of the package, beside :mod:`indeed_cli.io`.
"""

from __future__ import annotations

import zlib

import numpy as np


def image_seed(name: str, sigma: float, base: int = 0) -> int:
    """A fixed seed per (image name, sigma): results don't depend on file order."""
    return (zlib.crc32(name.encode()) + 1000003 * int(round(sigma * 100)) + base) % (2**32)


def add_awgn(clean: np.ndarray, sigma: float, seed: int, clipped8: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y = clean + rng.normal(0.0, sigma / 255.0, clean.shape).astype(np.float32)
    if clipped8:
        y = np.round(np.clip(y, 0, 1) * 255) / 255
    return y.astype(np.float32)


def quantise8(x: np.ndarray) -> np.ndarray:
    return np.round(np.clip(x, 0, 1) * 255)


def psnr(out: np.ndarray, ref: np.ndarray) -> float:
    mse = float(np.mean((quantise8(out) - quantise8(ref)) ** 2))
    return 10 * np.log10(255.0**2 / max(mse, 1e-10))


def ssim(out: np.ndarray, ref: np.ndarray) -> float | None:
    """(C, h, w) arrays in [0,1]; None when scikit-image is not installed."""
    try:
        from skimage.metrics import structural_similarity
    except ImportError:
        return None
    a, b = quantise8(out), quantise8(ref)
    if a.shape[0] == 1:
        return float(structural_similarity(a[0], b[0], data_range=255))
    return float(structural_similarity(a.transpose(1, 2, 0), b.transpose(1, 2, 0), data_range=255, channel_axis=-1))


# ------------------------------------------------------------------ anomaly detection
def detection_metrics(maps: list[np.ndarray], masks: list[np.ndarray], scores, labels, select) -> dict:
    """Pixel AUROC and AP over all pixels of the selected images, and image AUROC."""
    pix_s = np.concatenate([maps[i].ravel() for i in select])
    pix_y = np.concatenate([masks[i].ravel() for i in select])
    return {
        "pixel_auroc": auroc(pix_s, pix_y),
        "pixel_ap": average_precision(pix_s, pix_y),
        "image_auroc": auroc(np.asarray(scores)[select], np.asarray(labels)[select]),
        "n_images": len(select),
    }


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
