"""Validation PSNR on held-out images during training."""

from __future__ import annotations

import numpy as np
import torch

from ...metrics import psnr
from ...model import InDeed


@torch.no_grad()
def validate(
    model: InDeed,
    images: list[torch.Tensor],
    device: torch.device,
    sigmas=(15, 25, 50),
    size: int = 256,
    seed: int = 1234,
) -> dict[str, float]:
    """Mean PSNR of L+S (and of L alone) on centre crops with fixed-seed AWGN (float, unclipped);
    PSNR as :func:`indeed_cli.metrics.psnr` computes it."""
    model.eval()
    out = {}
    g = torch.Generator().manual_seed(seed)
    for s in sigmas:
        ps, pl = [], []
        for im in images:
            h, w = im.shape[1:]
            c = min(size, h - h % 8, w - w % 8)
            y0, x0 = (h - c) // 2, (w - c) // 2
            clean = im[:, y0 : y0 + c, x0 : x0 + c].float().div(255).unsqueeze(0)
            noisy = clean + torch.randn(clean.shape, generator=g) * s / 255
            d = model(noisy.to(device), sample=False)
            ref = clean[0].numpy()
            ps.append(psnr((d.L_hat + d.mu_S)[0].float().cpu().numpy(), ref))
            pl.append(psnr(d.L_hat[0].float().cpu().numpy(), ref))
        out[f"psnr_s{s}"] = float(np.mean(ps))
        out[f"psnr_L_s{s}"] = float(np.mean(pl))
    model.train()
    return out
