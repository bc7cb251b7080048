"""The training noise: AWGN with a random level per patch, some patches clipped like 8-bit files."""

from __future__ import annotations

import torch


def noise_levels(n: int, sigma_max: float, power: float, generator: torch.Generator) -> torch.Tensor:
    """Per-patch AWGN levels in [0, 1] units, docs/model.md Eq. (training noise levels):
    sigma = sigma_max * u^power / 255, u ~ U(0, 1].  power 1 is the paper's uniform level; a larger
    power puts more patches at low noise (P(sigma <= s) = (s / sigma_max)^(1 / power)) without
    changing the range the network serves."""
    u = 1.0 - torch.rand(n, generator=generator)  # (0, 1]
    return u.pow(power) * sigma_max / 255.0


def add_noise(
    clean: torch.Tensor, sigma_max: float, clip_prob: float, generator: torch.Generator, power: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """AWGN with sigma = sigma_max * u^power / 255 per patch (:func:`noise_levels`); some patches
    clipped+quantised like 8-bit files."""
    n = clean.shape[0]
    sigma = noise_levels(n, sigma_max, power, generator)
    clip = torch.rand(n, generator=generator) < clip_prob
    seed = int(torch.randint(2**62, (1,), generator=generator))
    g = torch.Generator(device=clean.device).manual_seed(seed)
    noise = torch.randn(clean.shape, generator=g, device=clean.device)
    noisy = clean + noise * sigma.to(clean.device).view(-1, 1, 1, 1)
    c = clip.to(clean.device).view(-1, 1, 1, 1)
    noisy = torch.where(c, torch.round(noisy.clamp(0, 1) * 255) / 255, noisy)
    return noisy, sigma
