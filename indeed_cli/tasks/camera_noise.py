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


def parse_noise(spec: str) -> tuple[str, bool, str]:
    """'camera:LEVEL[+mhc][+jpeg]' -> (level, jpeg?, demosaic): e.g. 'camera:heavy+mhc+jpeg' ->
    ('heavy', True, 'mhc'); without +mhc the demosaic is bilinear."""
    kind, _, rest = spec.partition(":")
    level, *extras = rest.split("+")
    if kind != "camera" or level not in LEVELS or len(set(extras)) < len(extras) or set(extras) - {"jpeg", "mhc"}:
        raise ValueError(f"noise must be camera:LEVEL[+mhc][+jpeg] with LEVEL one of {sorted(LEVELS)}, got {spec!r}")
    return level, "jpeg" in extras, "mhc" if "mhc" in extras else "bilinear"


def _uniform(gen: torch.Generator, lo: float, hi: float) -> float:
    return lo + (hi - lo) * float(torch.rand(1, generator=gen))


def random_pipeline(gen: torch.Generator, level: str) -> dict:
    """One camera: colour matrix, white-balance gains and noise levels, drawn from ``gen``."""
    w = torch.rand(len(XYZ2CAM), generator=gen, dtype=torch.float64)
    lo, hi = LEVELS[level]
    log_shot = _uniform(gen, math.log(lo), math.log(hi))
    log_read = 2.18 * log_shot + 1.20 + 0.26 * float(torch.randn(1, generator=gen))
    return {
        "cam2rgb": torch.linalg.inv(_rgb2cam(w[None])[0]),
        "red_gain": _uniform(gen, 1.9, 2.4),
        "blue_gain": _uniform(gen, 1.5, 1.9),
        "shot": math.exp(log_shot),
        "read": math.exp(log_read),
    }


def _rgb2cam(weights: torch.Tensor) -> torch.Tensor:
    """(B, 4) mixing weights of XYZ2CAM -> (B, 3, 3) sRGB-linear -> camera RGB matrices."""
    xyz2cam = (weights[:, :, None, None] * torch.tensor(XYZ2CAM, dtype=weights.dtype)).sum(1)
    xyz2cam = xyz2cam / weights.sum(1)[:, None, None]
    rgb2cam = xyz2cam @ torch.tensor(RGB2XYZ, dtype=weights.dtype)
    return rgb2cam / rgb2cam.sum(-1, keepdim=True)  # white stays white


def _smoothstep_inverse(y: torch.Tensor) -> torch.Tensor:
    y = y.clamp(0, 1)
    return 0.5 - torch.sin(torch.asin(1 - 2 * y) / 3)


def _bayer_masks(h: int, w: int, like: torch.Tensor) -> torch.Tensor:
    """(3, h, w) 0/1 masks of the R, G and B sites of an RGGB mosaic."""
    masks = torch.zeros(3, h, w, dtype=like.dtype, device=like.device)
    masks[0, 0::2, 0::2] = 1
    masks[1, 0::2, 1::2] = 1
    masks[1, 1::2, 0::2] = 1
    masks[2, 1::2, 1::2] = 1
    return masks


def _mosaic(rgb: torch.Tensor) -> torch.Tensor:
    """(..., 3, h, w) -> (..., h, w) RGGB Bayer plane."""
    raw = rgb[..., 1, :, :].clone()
    raw[..., 0::2, 0::2] = rgb[..., 0, 0::2, 0::2]
    raw[..., 1::2, 1::2] = rgb[..., 2, 1::2, 1::2]
    return raw


def _demosaic(raw: torch.Tensor) -> torch.Tensor:
    """Bilinear demosaic of RGGB planes (h, w) or (B, h, w) -> (3, h, w) or (B, 3, h, w)."""
    single = raw.dim() == 2
    planes = raw[None] if single else raw
    h, w = planes.shape[-2:]
    k_rb = torch.tensor([[0.25, 0.5, 0.25], [0.5, 1.0, 0.5], [0.25, 0.5, 0.25]], dtype=raw.dtype)
    k_g = torch.tensor([[0.0, 0.25, 0.0], [0.25, 1.0, 0.25], [0.0, 0.25, 0.0]], dtype=raw.dtype)
    kernels = torch.stack([k_rb, k_g, k_rb])[:, None].to(raw.device)
    sparse = _bayer_masks(h, w, raw) * planes[:, None]
    out = F.conv2d(F.pad(sparse, (1, 1, 1, 1), mode="reflect"), kernels, groups=3)
    return out[0] if single else out


# Malvar, He and Cutler, "High-quality linear interpolation for demosaicing of Bayer-patterned color
# images" (ICASSP 2004), in eighths: each missing value is the bilinear one plus a correction from the
# Laplacian of the channel that was sampled there, so the noise of one site reaches all three channels
# of its neighbours (positively correlated between channels, as in real sRGB noise; bilinear gives
# independent channels, which the colour matrix then anti-correlates)
_MHC_G_AT_RB = [[0, 0, -1, 0, 0], [0, 0, 2, 0, 0], [-1, 2, 4, 2, -1], [0, 0, 2, 0, 0], [0, 0, -1, 0, 0]]
_MHC_ROW = [[0, 0, 0.5, 0, 0], [0, -1, 0, -1, 0], [-1, 4, 5, 4, -1], [0, -1, 0, -1, 0], [0, 0, 0.5, 0, 0]]
_MHC_DIAGONAL = [[0, 0, -1.5, 0, 0], [0, 2, 0, 2, 0], [-1.5, 0, 6, 0, -1.5], [0, 2, 0, 2, 0], [0, 0, -1.5, 0, 0]]
DEMOSAICS = ("bilinear", "mhc")


def _demosaic_mhc(raw: torch.Tensor) -> torch.Tensor:
    """Malvar-He-Cutler demosaic of RGGB planes (h, w) or (B, h, w) -> (3, h, w) or (B, 3, h, w)."""
    single = raw.dim() == 2
    planes = (raw[None] if single else raw)[:, None]
    row = torch.tensor(_MHC_ROW, dtype=raw.dtype)
    kernels = torch.stack([torch.tensor(_MHC_G_AT_RB, dtype=raw.dtype), row, row.T,
                           torch.tensor(_MHC_DIAGONAL, dtype=raw.dtype)])[:, None].to(raw.device) / 8  # fmt: skip
    g_at_rb, along_row, along_col, diagonal = F.conv2d(F.pad(planes, (2,) * 4, mode="reflect"), kernels).unbind(1)
    p = planes[:, 0]
    r, g, b = p.clone(), p.clone(), p.clone()
    # RGGB: R at (even, even), G at (even, odd) and (odd, even), B at (odd, odd)
    g[:, 0::2, 0::2], g[:, 1::2, 1::2] = g_at_rb[:, 0::2, 0::2], g_at_rb[:, 1::2, 1::2]
    r[:, 0::2, 1::2], r[:, 1::2, 0::2], r[:, 1::2, 1::2] = (
        along_row[:, 0::2, 1::2], along_col[:, 1::2, 0::2], diagonal[:, 1::2, 1::2])  # fmt: skip
    b[:, 1::2, 0::2], b[:, 0::2, 1::2], b[:, 0::2, 0::2] = (
        along_row[:, 1::2, 0::2], along_col[:, 0::2, 1::2], diagonal[:, 0::2, 0::2])  # fmt: skip
    out = torch.stack([r, g, b], 1)
    return out[0] if single else out


def _unprocess(x: torch.Tensor, rgb2cam: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
    """sRGB (B, 3, h, w) -> linear camera RGB before white balance: tone curve, gamma and colour
    undone, white balance undone with the highlights kept below saturation (Brooks et al.)."""
    lin = _smoothstep_inverse(x).clamp_min(1e-8) ** 2.2
    camrgb = torch.einsum("bij,bjhw->bihw", rgb2cam, lin).clamp(0, 1)
    level = camrgb.mean(1, keepdim=True)
    inv_gains = 1 / gains
    mask = (torch.clamp(level - 0.9, min=0) / 0.1) ** 2  # near white: keep the highlight
    return (camrgb * torch.maximum(mask + (1 - mask) * inv_gains, inv_gains)).clamp(0, 1)


def _process(lin: torch.Tensor, cam2rgb: torch.Tensor, gains: torch.Tensor) -> torch.Tensor:
    """The camera's processing, (B, 3, h, w) -> sRGB in [0, 1]: white balance, colour matrix,
    gamma 1/2.2, smoothstep tone curve."""
    rgb = lin.clamp(0, 1) * gains
    rgb = torch.einsum("bij,bjhw->bihw", cam2rgb, rgb.clamp(0, 1)).clamp(0, 1)
    rgb = rgb.clamp_min(1e-8) ** (1 / 2.2)
    return (3 * rgb**2 - 2 * rgb**3).clamp(0, 1)


TRAINING_SHOT = (LEVELS["light"][0], LEVELS["heavy"][1])  # training draws shot noise over all levels


def camera_noise_batch(
    clean: torch.Tensor, gen: torch.Generator, shot: tuple[float, float] = TRAINING_SHOT
) -> tuple[torch.Tensor, torch.Tensor]:
    """Training pairs: each (3, h, w) patch of ``clean`` (B, 3, h, w, sRGB in [0, 1], h and w even)
    through its own random camera (colour matrix, white balance, shot noise log-uniform in ``shot``,
    read noise as Brooks et al. fit it), on the patches' device in float32, without 8-bit
    rounding.  Returns (noisy, reference): the reference is the same camera without noise, the
    target a denoiser is trained towards (it equals ``clean`` up to the cameras' gamut)."""
    b, dev = clean.shape[0], clean.device
    w = torch.rand(b, len(XYZ2CAM), generator=gen, dtype=torch.float64)
    rgb2cam = _rgb2cam(w)
    cam2rgb = torch.linalg.inv(rgb2cam)
    u = torch.rand(b, 4, generator=gen, dtype=torch.float64)
    red, blue = 1.9 + 0.5 * u[:, 0], 1.5 + 0.4 * u[:, 1]
    log_shot = math.log(shot[0]) + (math.log(shot[1]) - math.log(shot[0])) * u[:, 2]
    log_read = 2.18 * log_shot + 1.20 + 0.26 * torch.randn(b, generator=gen, dtype=torch.float64)
    gains = torch.stack([red, torch.ones(b, dtype=torch.float64), blue], 1)[:, :, None, None]
    f32 = {"dtype": torch.float32, "device": dev}
    rgb2cam, cam2rgb, gains = rgb2cam.to(**f32), cam2rgb.to(**f32), gains.to(**f32)
    lin = _unprocess(clean.float(), rgb2cam, gains)
    raw = _mosaic(lin)
    std = torch.sqrt(raw * log_shot.exp().to(**f32)[:, None, None] + log_read.exp().to(**f32)[:, None, None])
    seed = int(torch.randint(2**62, (1,), generator=gen))
    g = torch.Generator(device=dev).manual_seed(seed)
    noise = _demosaic(std * torch.randn(raw.shape, generator=g, **f32))
    return _process(lin + noise, cam2rgb, gains), _process(lin, cam2rgb, gains)


def camera_pair(
    clean: np.ndarray, level: str = "medium", seed: int = 0, jpeg: bool = False, demosaic: str = "bilinear"
) -> tuple[np.ndarray, np.ndarray]:
    """A (C, h, w) sRGB image in [0, 1] as a camera of the given noise level would have taken it, and
    the same camera's image without noise (the reference to score against, as the mean of many
    shots is for real noise pairs: the demosaic and the colour clipping are in both).

    Both are float32 (C, h, w) in [0, 1] quantised to 8 bits; the noisy one JPEG-compressed at
    quality 90 with ``jpeg``.  ``demosaic``: how the sensor noise is interpolated, "bilinear" (each
    channel alone) or "mhc" (Malvar-He-Cutler: across channels, which correlates the channels' noise
    positively, as in real sRGB noise); the same draws either way.  Gray images go through as three
    equal channels and come back gray."""
    if demosaic not in DEMOSAICS:
        raise ValueError(f"demosaic must be one of {DEMOSAICS}, got {demosaic!r}")
    gray = clean.shape[0] == 1
    x = torch.from_numpy(np.repeat(clean, 3, 0) if gray else clean).double()
    gen = torch.Generator().manual_seed(seed)
    cam = random_pipeline(gen, level)
    rgb2cam = torch.linalg.inv(cam["cam2rgb"].double())[None]
    gains = torch.tensor([cam["red_gain"], 1.0, cam["blue_gain"]], dtype=torch.float64)[None, :, None, None]
    lin = _unprocess(x[None], rgb2cam, gains)[0]
    raw = _mosaic(lin)
    std = torch.sqrt(raw * cam["shot"] + cam["read"])  # the sensor: shot and read noise at each raw pixel
    noise = (_demosaic_mhc if demosaic == "mhc" else _demosaic)(
        std * torch.randn(raw.shape, generator=gen, dtype=torch.float64)
    )

    def process(r: torch.Tensor) -> np.ndarray:
        rgb = _process(r[None], cam["cam2rgb"].double()[None], gains)[0]
        return np.round(rgb.numpy() * 255).astype(np.uint8)

    noisy, reference = process(lin + noise), process(lin)
    if jpeg:
        buf = io.BytesIO()
        Image.fromarray(noisy.transpose(1, 2, 0)).save(buf, format="JPEG", quality=90)
        noisy = np.asarray(Image.open(buf)).transpose(2, 0, 1)
    out = [a.astype(np.float32) / 255.0 for a in (noisy, reference)]
    return tuple(a.mean(0, keepdims=True) if gray else a for a in out)
