"""The training noise: AWGN with a random level per patch, some patches clipped like 8-bit files."""

from __future__ import annotations

import torch


def add_noise(
    clean: torch.Tensor, sigma_max: float, clip_prob: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """AWGN with sigma ~ U(0, sigma_max]/255 per patch; some patches clipped+quantised like 8-bit files."""
    n = clean.shape[0]
    sigma = (1.0 - torch.rand(n, generator=generator)) * sigma_max / 255.0  # (0, max]
    clip = torch.rand(n, generator=generator) < clip_prob
    seed = int(torch.randint(2**62, (1,), generator=generator))
    g = torch.Generator(device=clean.device).manual_seed(seed)
    noise = torch.randn(clean.shape, generator=g, device=clean.device)
    noisy = clean + noise * sigma.to(clean.device).view(-1, 1, 1, 1)
    c = clip.to(clean.device).view(-1, 1, 1, 1)
    noisy = torch.where(c, torch.round(noisy.clamp(0, 1) * 255) / 255, noisy)
    return noisy, sigma
