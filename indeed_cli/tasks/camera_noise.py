"""Realistic camera noise: a clean sRGB image through a camera pipeline run backwards and forwards,
after Brooks et al., "Unprocessing images for learned raw denoising" (CVPR 2019).

    sRGB -> undo the tone curve (smoothstep) -> undo gamma 2.2 -> camera RGB (inverse colour matrix)
         -> undo white balance -> shot and read noise at the pixels of a Bayer mosaic (RGGB):
            variance = shot * x + read -> the noise demosaiced (bilinear) and added
         -> white balance -> colour matrix -> gamma -> tone curve -> [JPEG]

The noise is then signal dependent, spatially correlated by the demosaic and coloured by the
colour matrix, like a photograph's, unlike additive Gaussian noise.  Only the noise goes through
the mosaic: a bilinear demosaic of the image itself would add colour zippering at every edge,
which the reference would carry and a denoiser would be scored down for removing (measured:
a noiseless reference made so came back from the bundled denoiser at 25.8 dB).  Levels (shot noise ranges,
read noise tied to shot noise as Brooks et al. fit it) go from light (close to PolyU's, input
PSNR about 35-38 dB) through medium (about 30 dB) to heavy (about 20-25 dB, a smartphone in dim
light); tests/unit/test_camera_noise.py measures them.  Every draw comes from
one torch.Generator: a seed fixes the image's noise.
"""

from __future__ import annotations

import io
import math

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

# shot-noise ranges per level (log-uniform); read noise follows as log r = 2.18 log s + 1.2 + N(0, 0.26)
LEVELS = {"light": (1.2e-4, 4e-4), "medium": (6e-4, 2e-3), "heavy": (4e-3, 1.2e-2)}
# XYZ -> camera-RGB matrices of real cameras (Brooks et al.'s list), mixed at random per image
XYZ2CAM = [
    [[1.0234, -0.2969, -0.2266], [-0.5625, 1.6328, -0.0469], [-0.0703, 0.2188, 0.6406]],
    [[0.4913, -0.0541, -0.0202], [-0.6130, 1.3513, 0.2906], [-0.1564, 0.2151, 0.7183]],
    [[0.8380, -0.2630, -0.0639], [-0.2887, 1.0725, 0.2496], [-0.0627, 0.1427, 0.5438]],
    [[0.6596, -0.2079, -0.0562], [-0.4782, 1.3016, 0.1933], [-0.0970, 0.1581, 0.5181]],
]
RGB2XYZ = [[0.4124564, 0.3575761, 0.1804375], [0.2126729, 0.7151522, 0.0721750], [0.0193339, 0.1191920, 0.9503041]]


def parse_noise(spec: str) -> tuple[str, bool]:
    """'camera:heavy' or 'camera:heavy+jpeg' -> ('heavy', jpeg?)."""
    kind, _, level = spec.partition(":")
    level, _, extra = level.partition("+")
    if kind != "camera" or level not in LEVELS or extra not in ("", "jpeg"):
        raise ValueError(f"noise must be camera:LEVEL[+jpeg] with LEVEL one of {sorted(LEVELS)}, got {spec!r}")
    return level, extra == "jpeg"


def _uniform(gen: torch.Generator, lo: float, hi: float) -> float:
    return lo + (hi - lo) * float(torch.rand(1, generator=gen))


def random_pipeline(gen: torch.Generator, level: str) -> dict:
    """One camera: colour matrix, white-balance gains and noise levels, drawn from ``gen``."""
    w = torch.rand(len(XYZ2CAM), generator=gen, dtype=torch.float64)
    xyz2cam = (w[:, None, None] * torch.tensor(XYZ2CAM, dtype=torch.float64)).sum(0) / w.sum()
    rgb2cam = xyz2cam @ torch.tensor(RGB2XYZ, dtype=torch.float64)
    rgb2cam = rgb2cam / rgb2cam.sum(-1, keepdim=True)  # white stays white
    cam2rgb = torch.linalg.inv(rgb2cam)
    lo, hi = LEVELS[level]
    log_shot = _uniform(gen, math.log(lo), math.log(hi))
    log_read = 2.18 * log_shot + 1.20 + 0.26 * float(torch.randn(1, generator=gen))
    return {
        "cam2rgb": cam2rgb,
        "red_gain": _uniform(gen, 1.9, 2.4),
        "blue_gain": _uniform(gen, 1.5, 1.9),
        "shot": math.exp(log_shot),
        "read": math.exp(log_read),
    }


def _smoothstep_inverse(y: torch.Tensor) -> torch.Tensor:
    y = y.clamp(0, 1)
    return 0.5 - torch.sin(torch.asin(1 - 2 * y) / 3)


def _mosaic(rgb: torch.Tensor) -> torch.Tensor:
    """(3, h, w) -> (h, w) RGGB Bayer plane."""
    raw = rgb[1].clone()
    raw[0::2, 0::2] = rgb[0, 0::2, 0::2]
    raw[1::2, 1::2] = rgb[2, 1::2, 1::2]
    return raw


def _demosaic(raw: torch.Tensor) -> torch.Tensor:
    """Bilinear demosaic of an RGGB plane (h, w) -> (3, h, w)."""
    h, w = raw.shape
    masks = torch.zeros(3, h, w, dtype=raw.dtype)
    masks[0, 0::2, 0::2] = 1
    masks[1, 0::2, 1::2] = 1
    masks[1, 1::2, 0::2] = 1
    masks[2, 1::2, 1::2] = 1
    k_rb = torch.tensor([[0.25, 0.5, 0.25], [0.5, 1.0, 0.5], [0.25, 0.5, 0.25]], dtype=raw.dtype)
    k_g = torch.tensor([[0.0, 0.25, 0.0], [0.25, 1.0, 0.25], [0.0, 0.25, 0.0]], dtype=raw.dtype)
    kernels = torch.stack([k_rb, k_g, k_rb])[:, None]
    sparse = (masks * raw)[None]
    return F.conv2d(F.pad(sparse, (1, 1, 1, 1), mode="reflect"), kernels, groups=3)[0]


def camera_pair(
    clean: np.ndarray, level: str = "medium", seed: int = 0, jpeg: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """A (C, h, w) sRGB image in [0, 1] as a camera of the given noise level would have taken it, and
    the same camera's image without noise (the reference to score against, as the mean of many
    shots is for real noise pairs: the demosaic and the colour clipping are in both).

    Both are float32 (C, h, w) in [0, 1] quantised to 8 bits; the noisy one JPEG-compressed at
    quality 90 with ``jpeg``.  Gray images go through as three equal channels and come back gray."""
    gray = clean.shape[0] == 1
    x = torch.from_numpy(np.repeat(clean, 3, 0) if gray else clean).double()
    gen = torch.Generator().manual_seed(seed)
    cam = random_pipeline(gen, level)
    rgb2cam = torch.linalg.inv(cam["cam2rgb"].double())
    gains = torch.tensor([cam["red_gain"], 1.0, cam["blue_gain"]], dtype=torch.float64)[:, None, None]
    # unprocess: tone, gamma, colour, white balance (highlights kept below saturation, as Brooks et al.)
    lin = _smoothstep_inverse(x).clamp_min(1e-8) ** 2.2
    camrgb = torch.einsum("ij,jhw->ihw", rgb2cam, lin).clamp(0, 1)
    level_ = camrgb.mean(0, keepdim=True)
    inv_gains = 1 / gains
    mask = (torch.clamp(level_ - 0.9, min=0) / 0.1) ** 2  # near white: keep the highlight
    lin = (camrgb * torch.maximum(mask + (1 - mask) * inv_gains, inv_gains)).clamp(0, 1)
    raw = _mosaic(lin)
    std = torch.sqrt(raw * cam["shot"] + cam["read"])  # the sensor: shot and read noise at each raw pixel
    noise = _demosaic(std * torch.randn(raw.shape, generator=gen, dtype=torch.float64))

    def process(r: torch.Tensor) -> np.ndarray:
        rgb = r.clamp(0, 1) * gains
        rgb = torch.einsum("ij,jhw->ihw", cam["cam2rgb"].double(), rgb.clamp(0, 1)).clamp(0, 1)
        rgb = rgb.clamp_min(1e-8) ** (1 / 2.2)
        return np.round((3 * rgb**2 - 2 * rgb**3).clamp(0, 1).numpy() * 255).astype(np.uint8)

    noisy, reference = process(lin + noise), process(lin)
    if jpeg:
        buf = io.BytesIO()
        Image.fromarray(noisy.transpose(1, 2, 0)).save(buf, format="JPEG", quality=90)
        noisy = np.asarray(Image.open(buf)).transpose(2, 0, 1)
    out = [a.astype(np.float32) / 255.0 for a in (noisy, reference)]
    return tuple(a.mean(0, keepdims=True) if gray else a for a in out)
