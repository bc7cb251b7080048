"""Gaussian blurs and resampling of images and maps, shared by synthesis, the pyramid and the read-out."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def _gauss_kernel(sigma: float, device) -> torch.Tensor:
    r = max(1, int(3 * sigma))
    k = torch.exp(-(torch.arange(-r, r + 1, dtype=torch.float32, device=device) ** 2) / (2 * sigma**2))
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


def resize(x: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(C, h, w) float array to ``size``: antialiased bilinear (downscaling images, upscaling maps)."""
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))[None]
    return F.interpolate(t, size=size, mode="bilinear", align_corners=False, antialias=True)[0].numpy()


def scaled_size(h: int, w: int, scale: float) -> tuple[int, int]:
    return max(8, round(h * scale)), max(8, round(w * scale))
