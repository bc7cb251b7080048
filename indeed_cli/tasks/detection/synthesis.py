"""Self-supervised synthetic anomalies for UAD training (paper §3.6: Y = U_N + U_A).

Generator (documented in docs/guide/detect.md):
  mask   thresholded Perlin noise (blobs of random scale), or a thin random scratch
  fill   one of: a texture crop (e.g. DTD), a cut-paste of the same image from elsewhere,
         an intensity change (brighter or darker), each mixed with opacity beta in [0.3, 1];
         the ``surface`` preset adds edge bands and single large blobs as masks, and as fills
         the surface of another image of the batch (brightness matched or not) and the patch's
         own texture smoothed, sharpened or smeared along one axis (a different surface finish)
  a share ``normal_prob`` of patches gets no anomaly, so that S learns to stay zero.
  ``feather`` softens the mask edges (Gaussian blur of random width: gradual defects such as
  uneven surfaces); presets: ``strong`` (the first recipe) and ``subtle`` (also faint and soft
  anomalies, since real defects are often low-contrast), ``surface`` (large, soft regions of a
  different surface texture: magnetic-tile "uneven" and "fray" defects are of this kind).
  ``defects`` (for detectors with a support posterior) adds four kinds that look like real defects:
  ``illumination`` (a large soft region, feathered 3-10 px, whose brightness and gamma change with
  opacity near 1: uneven surfaces), ``poisson`` (the surface of another patch Poisson-blended into
  a blob or band, after NSA, Schlueter et al. 2022: no seam, a different texture), ``crack`` (a
  thin dark curve) and ``break`` (a dark chip along one side of the patch). ``cracks`` is ``strong``
  with most of its scratches (12 of its 15%) drawn as cracks and breaks instead.

Everything runs on the patches' device and draws from one torch.Generator: a seed fixes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from .filters import blur, blur_batch


@dataclass(frozen=True)
class AnomalyConfig:
    normal_prob: float = 0.25
    perlin_scales: tuple[int, ...] = (2, 4, 8)  # lattice cells per patch side
    threshold: tuple[float, float] = (0.35, 0.6)  # of the normalised noise: larger = smaller blobs
    beta: tuple[float, float] = (0.3, 1.0)
    p_texture: float = 0.4
    p_cutpaste: float = 0.25
    p_intensity: float = 0.2  # the rest: scratches
    feather: tuple[float, float] = (0.0, 0.0)  # Gaussian blur sigma of the mask (px), drawn per anomaly
    scratch_delta: tuple[float, float] = (0.3, 0.8)  # brightness change of a scratch
    p_other: float = 0.0  # fill with another image of the batch (a different surface)
    p_filter: float = 0.0  # fill with the patch's own texture smoothed / sharpened / smeared
    p_band: float = 0.0  # share of region masks that are bands along one side of the patch
    p_illumination: float = 0.0  # large soft region, brightness and gamma changed (uneven surface)
    p_poisson: float = 0.0  # another surface Poisson-blended into a region (NSA)
    p_crack: float = 0.0  # thin dark curve
    p_break: float = 0.0  # dark chip along one side
    illumination_feather: tuple[float, float] = (3.0, 10.0)  # Gaussian sigma (px) of its soft edge


PRESETS = {
    "strong": AnomalyConfig(),
    "subtle": AnomalyConfig(beta=(0.1, 1.0), feather=(0.0, 4.0), scratch_delta=(0.1, 0.8)),
    "surface": AnomalyConfig(
        perlin_scales=(1, 2, 4, 8),
        beta=(0.2, 1.0),
        feather=(0.0, 4.0),
        scratch_delta=(0.1, 0.8),
        p_texture=0.2,
        p_cutpaste=0.1,
        p_intensity=0.1,
        p_other=0.25,
        p_filter=0.2,
        p_band=0.3,
    ),
    # ``strong`` with most of its scratches replaced by cracks and breaks (thin dark curves, dark
    # chips at a side): the defects that |mu_S| and f_thetaM missed most (docs/reports)
    "cracks": AnomalyConfig(p_crack=0.08, p_break=0.04),
    "defects": AnomalyConfig(
        normal_prob=0.3,
        perlin_scales=(1, 2, 4, 8),
        beta=(0.3, 1.0),
        feather=(0.0, 3.0),
        scratch_delta=(0.1, 0.8),
        p_texture=0.15,
        p_cutpaste=0.05,
        p_intensity=0.05,
        p_other=0.05,
        p_filter=0.1,
        p_band=0.3,
        p_illumination=0.2,
        p_poisson=0.15,
        p_crack=0.1,
        p_break=0.05,
    ),
}


def perlin(shape: tuple[int, int], res: int, gen: torch.Generator, device) -> Tensor:
    """2-D gradient (Perlin) noise in about [-1, 1], ``res`` lattice cells along each side."""
    h, w = shape
    angles = 2 * math.pi * torch.rand(res + 1, res + 1, generator=gen).to(device)
    grads = torch.stack([torch.cos(angles), torch.sin(angles)], -1)
    ys = torch.linspace(0, res, h + 1, device=device)[:-1]
    xs = torch.linspace(0, res, w + 1, device=device)[:-1]
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    y0, x0 = gy.floor().long().clamp(max=res - 1), gx.floor().long().clamp(max=res - 1)
    fy, fx = gy - y0, gx - x0

    def dot(dy, dx):
        g = grads[y0 + dy, x0 + dx]
        return g[..., 0] * (fy - dy) + g[..., 1] * (fx - dx)

    def fade(t):
        return 6 * t**5 - 15 * t**4 + 10 * t**3

    u, v = fade(fx), fade(fy)
    top = torch.lerp(dot(0, 0), dot(0, 1), u)
    bottom = torch.lerp(dot(1, 0), dot(1, 1), u)
    return math.sqrt(2) * torch.lerp(top, bottom, v)


def blob_mask(shape, cfg: AnomalyConfig, gen: torch.Generator, device) -> Tensor:
    res = cfg.perlin_scales[int(torch.randint(len(cfg.perlin_scales), (1,), generator=gen))]
    n = perlin(shape, res, gen, device)
    n = (n - n.min()) / (n.max() - n.min() + 1e-8)
    lo, hi = cfg.threshold
    t = lo + (hi - lo) * float(torch.rand(1, generator=gen))
    m = (n > 1 - (1 - t) * 0.5).float()  # upper tail of the noise: a few blobs
    return m


def band_mask(shape, gen: torch.Generator, device) -> Tensor:
    """A band along one side of the patch, 15-60% deep, with a wavy boundary (Perlin profile)."""
    h, w = shape
    depth = (0.15 + 0.45 * float(torch.rand(1, generator=gen))) * h
    res = int(torch.randint(1, 4, (1,), generator=gen))
    profile = perlin((2, w), res, gen, device)[0] * 0.15 * h  # boundary wobble, about +-15% of h
    rows = torch.arange(h, device=device, dtype=torch.float32)[:, None]
    m = (rows < depth + profile[None, :]).float()
    return torch.rot90(m, int(torch.randint(4, (1,), generator=gen)), (0, 1)) if h == w else m


def filtered(x: Tensor, gen: torch.Generator) -> Tensor:
    """The patch's own texture with a different finish: smoothed, sharpened, or smeared along one axis."""
    kind = int(torch.randint(3, (1,), generator=gen))
    s = 1.0 + 3.0 * float(torch.rand(1, generator=gen))
    if kind == 0:
        return blur_batch(x, s, s)
    if kind == 1:
        return (x + (1 + 2 * float(torch.rand(1, generator=gen))) * (x - blur_batch(x, s, s))).clamp(0, 1)
    return blur_batch(x, 2 * s, 0.0) if float(torch.rand(1, generator=gen)) < 0.5 else blur_batch(x, 0.0, 2 * s)


def scratch_mask(shape, gen: torch.Generator, device) -> Tensor:
    """A thin random curve (1-3 px) across part of the patch."""
    h, w = shape
    m = torch.zeros(h, w, device=device)
    y, x = float(torch.rand(1, generator=gen)) * h, float(torch.rand(1, generator=gen)) * w
    ang = float(torch.rand(1, generator=gen)) * 2 * math.pi
    width = int(torch.randint(1, 4, (1,), generator=gen))
    for _ in range(int(torch.randint(h // 4, h, (1,), generator=gen))):
        ang += float(torch.randn(1, generator=gen)) * 0.15
        y, x = y + math.sin(ang), x + math.cos(ang)
        iy, ix = int(y), int(x)
        if 0 <= iy < h and 0 <= ix < w:
            m[max(0, iy - width // 2) : iy + (width + 1) // 2, max(0, ix - width // 2) : ix + (width + 1) // 2] = 1
    return m


def illumination_change(x: Tensor, gen: torch.Generator) -> Tensor:
    """x with another brightness and contrast curve: gain * x ** gamma + offset, gain in [0.7, 1.3],
    gamma in [0.7, 1.4], offset in [-0.05, 0.05] (an uneven surface reflects light differently)."""
    gain = 0.7 + 0.6 * float(torch.rand(1, generator=gen))
    gamma = 0.7 + 0.7 * float(torch.rand(1, generator=gen))
    offset = 0.1 * (float(torch.rand(1, generator=gen)) - 0.5)
    return (gain * x.clamp(min=0).pow(gamma) + offset).clamp(0, 1)


def crack_mask(shape, gen: torch.Generator, device) -> Tensor:
    """A thin (1-2 px) crooked curve that may fork once, across a third to all of the patch."""
    h, w = shape
    m = torch.zeros(h, w, device=device)
    y, x = float(torch.rand(1, generator=gen)) * h, float(torch.rand(1, generator=gen)) * w
    ang = float(torch.rand(1, generator=gen)) * 2 * math.pi
    width = int(torch.randint(1, 3, (1,), generator=gen))
    length = int(torch.randint(h // 3, h, (1,), generator=gen))
    fork_at = int(torch.randint(length, (1,), generator=gen)) if float(torch.rand(1, generator=gen)) < 0.5 else -1
    branches = [(y, x, ang, length)]
    while branches:
        y, x, ang, n = branches.pop()
        for k in range(n):
            ang += float(torch.randn(1, generator=gen)) * 0.2  # a little more crooked than a scratch
            y, x = y + math.sin(ang), x + math.cos(ang)
            iy, ix = int(y), int(x)
            if 0 <= iy < h and 0 <= ix < w:
                m[iy : iy + width, ix : ix + width] = 1
            if k == fork_at:
                fork_at = -1
                branches.append((y, x, ang + (0.6 if float(torch.rand(1, generator=gen)) < 0.5 else -0.6), n - k))
    return m


def break_mask(shape, gen: torch.Generator, device) -> Tensor:
    """A chip along one side of the patch: 5-25% deep over a third to two thirds of the side,
    its boundary jagged (Perlin profile)."""
    h, w = shape
    depth = (0.05 + 0.2 * float(torch.rand(1, generator=gen))) * h
    span = (0.33 + 0.33 * float(torch.rand(1, generator=gen))) * w
    start = float(torch.rand(1, generator=gen)) * (w - span)
    cols = torch.arange(w, device=device, dtype=torch.float32)
    along = ((cols - start) / span).clamp(0, 1)
    profile = depth * torch.sin(math.pi * along) * (1 + 0.5 * perlin((2, w), 8, gen, device)[0])
    rows = torch.arange(h, device=device, dtype=torch.float32)[:, None]
    m = (rows < profile[None, :]).float()
    return torch.rot90(m, int(torch.randint(4, (1,), generator=gen)), (0, 1)) if h == w else m


def poisson_blend(target: Tensor, source: Tensor, mask: Tensor, iterations: tuple[int, ...] = (80, 60, 40)) -> Tensor:
    """Seamless cloning (Perez et al. 2003) of ``source`` into ``target`` inside a binary ``mask``:
    the result keeps the source's gradients inside and equals the target outside and on the mask's
    boundary.  With d = source - target it is target + mask * (d - c), c the harmonic function in
    the mask with c = d outside it: Jacobi iterations, coarse to fine (1/4, 1/2, full resolution).
    (P, C, h, w) images, (P, 1, h, w) mask; batched, deterministic."""
    d = source - target
    inside = mask > 0.5
    pyramid = [(d, inside)]
    for _ in range(len(iterations) - 1):
        dd, mm = pyramid[-1]
        if min(dd.shape[-2:]) < 8:
            break
        pyramid.append((F.avg_pool2d(dd, 2), F.avg_pool2d(mm.float(), 2) > 0.5))
    C = d.shape[1]
    cross = torch.tensor([[0, 0.25, 0], [0.25, 0, 0.25], [0, 0.25, 0]], device=d.device, dtype=d.dtype)
    cross = cross.expand(C, 1, 3, 3)
    c = None
    for level in reversed(range(len(pyramid))):
        dl, ml = pyramid[level]
        c = dl if c is None else F.interpolate(c, size=dl.shape[-2:], mode="bilinear", align_corners=False)
        c = torch.where(ml, c, dl)
        for _ in range(iterations[level]):
            c = torch.where(ml, F.conv2d(F.pad(c, (1, 1, 1, 1), mode="replicate"), cross, groups=C), dl)
    return target + mask * (d - c)


def synthesize(
    normal: Tensor, gen: torch.Generator, textures: list[Tensor] | None = None, cfg: AnomalyConfig = AnomalyConfig()
) -> tuple[Tensor, Tensor, Tensor]:
    """Add synthetic anomalies to a batch of normal patches (N, C, h, w) in [0, 1].

    Returns (Y, U_A, mask) with Y = normal + U_A, U_A zero outside the mask.
    """
    n, C, h, w = normal.shape
    dev = normal.device
    Y = normal.clone()
    masks = torch.zeros(n, 1, h, w, device=dev)
    blends: list[tuple[int, Tensor, Tensor]] = []  # Poisson blends, solved together after the loop
    for i in range(n):
        if float(torch.rand(1, generator=gen)) < cfg.normal_prob:
            continue
        kind = float(torch.rand(1, generator=gen))
        region = cfg.p_texture + cfg.p_cutpaste + cfg.p_intensity + cfg.p_other + cfg.p_filter
        realistic = region + cfg.p_illumination + cfg.p_poisson + cfg.p_crack + cfg.p_break
        if region <= kind < realistic:
            m = _realistic(i, kind - region, normal, cfg, gen, blends)
            if m is not None:  # illumination, crack, break: Y and the mask are written here
                Y[i], masks[i, 0] = m
            continue
        if kind >= region:
            m = scratch_mask((h, w), gen, dev)
            lo, hi = cfg.scratch_delta
            delta = lo + (hi - lo) * float(torch.rand(1, generator=gen))
            fill = (normal[i] + (delta if float(torch.rand(1, generator=gen)) < 0.5 else -delta)).clamp(0, 1)
        else:
            band = cfg.p_band > 0 and float(torch.rand(1, generator=gen)) < cfg.p_band
            m = band_mask((h, w), gen, dev) if band else blob_mask((h, w), cfg, gen, dev)
            if kind < cfg.p_texture and textures:
                fill = _texture_crop(textures, C, h, w, gen, dev)
            elif kind < cfg.p_texture + cfg.p_cutpaste:
                dy, dx = int(torch.randint(h, (1,), generator=gen)), int(torch.randint(w, (1,), generator=gen))
                fill = torch.roll(normal[i], (dy, dx), (1, 2)).flip(int(torch.randint(1, 3, (1,), generator=gen)))
            elif kind < cfg.p_texture + cfg.p_cutpaste + cfg.p_other and n > 1:
                j = (i + 1 + int(torch.randint(n - 1, (1,), generator=gen))) % n  # any other patch
                fill = normal[j]
                if float(torch.rand(1, generator=gen)) < 0.5:  # same brightness, different texture
                    fill = (fill - fill.mean() + normal[i].mean()).clamp(0, 1)
            elif kind < region - cfg.p_intensity:
                fill = filtered(normal[i : i + 1], gen)[0]
            else:
                gain = 0.5 + float(torch.rand(1, generator=gen))  # 0.5 .. 1.5
                fill = (normal[i] * gain + 0.2 * (float(torch.rand(1, generator=gen)) - 0.5)).clamp(0, 1)
        beta = cfg.beta[0] + (cfg.beta[1] - cfg.beta[0]) * float(torch.rand(1, generator=gen))
        if cfg.feather[1] > 0:
            s = cfg.feather[0] + (cfg.feather[1] - cfg.feather[0]) * float(torch.rand(1, generator=gen))
            if s > 0.3:  # a narrower Gaussian would barely change the mask: keep it binary
                m = blur(m, s).clamp(0, 1)
        Y[i] = normal[i] * (1 - beta * m) + fill * beta * m
        masks[i, 0] = m
    if blends:
        idx = [i for i, _, _ in blends]
        src = torch.stack([f for _, _, f in blends])
        mk = torch.stack([m for _, m, _ in blends])[:, None]
        Y[idx] = poisson_blend(normal[idx], src, mk).clamp(0, 1)
        masks[idx] = mk
    return Y, Y - normal, masks


def _realistic(i: int, u: float, normal: Tensor, cfg: AnomalyConfig, gen: torch.Generator, blends: list):
    """One anomaly of the ``defects`` kinds on patch i (``u`` in [0, their total probability)):
    (Y_i, mask) for illumination, crack and break; a Poisson blend is queued in ``blends`` (None)."""
    n, C, h, w = normal.shape
    dev, x = normal.device, normal[i]
    if u < cfg.p_illumination:
        band = float(torch.rand(1, generator=gen)) < 0.5
        m = band_mask((h, w), gen, dev) if band else blob_mask((h, w), replace(cfg, perlin_scales=(1, 2)), gen, dev)
        lo, hi = cfg.illumination_feather
        m = blur(m, lo + (hi - lo) * float(torch.rand(1, generator=gen))).clamp(0, 1)
        beta = 0.85 + 0.15 * float(torch.rand(1, generator=gen))
        return x * (1 - beta * m) + illumination_change(x, gen) * beta * m, m
    u -= cfg.p_illumination
    if u < cfg.p_poisson:
        band = float(torch.rand(1, generator=gen)) < cfg.p_band
        m = band_mask((h, w), gen, dev) if band else blob_mask((h, w), cfg, gen, dev)
        if n > 1 and float(torch.rand(1, generator=gen)) < 0.5:  # another patch's surface
            src = normal[(i + 1 + int(torch.randint(n - 1, (1,), generator=gen))) % n]
        else:  # this patch's surface from elsewhere, flipped
            dy, dx = int(torch.randint(h, (1,), generator=gen)), int(torch.randint(w, (1,), generator=gen))
            src = torch.roll(x, (dy, dx), (1, 2)).flip(int(torch.randint(1, 3, (1,), generator=gen)))
        blends.append((i, m, src))
        return None
    u -= cfg.p_poisson
    m = crack_mask((h, w), gen, dev) if u < cfg.p_crack else break_mask((h, w), gen, dev)
    dark = 0.15 + 0.45 * float(torch.rand(1, generator=gen))  # what is left of the brightness
    m = blur(m, 0.6).clamp(0, 1) if float(torch.rand(1, generator=gen)) < 0.5 else m  # anti-aliased edge
    return x * (1 - m) + x * dark * m, m


def _texture_crop(textures: list[Tensor], C: int, h: int, w: int, gen: torch.Generator, dev) -> Tensor:
    t = textures[int(torch.randint(len(textures), (1,), generator=gen))]
    if t.shape[1] < h or t.shape[2] < w:
        t = F.interpolate(t[None].float(), size=(max(h, t.shape[1]), max(w, t.shape[2])), mode="bilinear")[0]
    y = int(torch.randint(t.shape[1] - h + 1, (1,), generator=gen))
    x = int(torch.randint(t.shape[2] - w + 1, (1,), generator=gen))
    crop = t[:, y : y + h, x : x + w].to(dev).float()
    crop = crop / 255.0 if crop.max() > 1.5 else crop
    if crop.shape[0] != C:
        crop = crop.mean(0, keepdim=True).expand(C, -1, -1) if C == 1 or crop.shape[0] == 3 else crop.expand(C, -1, -1)
    return crop
