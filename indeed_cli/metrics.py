"""Evaluation conventions shared by `indeed evaluate` and benchmarks/ (shared/data/README.md):

- synthetic noise: x in [0,1], y = x + N(0, (sigma/255)^2), unclipped, fixed seed per image;
  the "clipped8" form clips y to [0,1] and quantises it to 8 bits, like a user's noisy file;
- PSNR on the output clipped to [0,1] and quantised to 8 bits, data range 255;
- SSIM: scikit-image structural_similarity, data_range 255 (channel_axis for colour), when
  scikit-image is installed (the `bench` extra); otherwise reported as None.
"""
from __future__ import annotations

import zlib

import numpy as np


def image_seed(name: str, sigma: float, base: int = 0) -> int:
    """A fixed seed per (image name, sigma): results don't depend on file order."""
    return (zlib.crc32(name.encode()) + 1000003 * int(round(sigma * 100)) + base) % (2 ** 32)


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
    return 10 * np.log10(255.0 ** 2 / max(mse, 1e-10))


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
