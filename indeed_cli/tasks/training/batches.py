"""The batches a training step is computed on: (Y, targets) for each task's supervision term."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..detection.synthesis import AnomalyConfig, synthesize
from .config import TrainConfig
from .data import PatchSampler
from .noise import add_noise


def denoise_batch(sampler: PatchSampler, n: int, tc: TrainConfig, gen: torch.Generator):
    """Batches for denoising (paper §4.1): clean patches U and their noisy copies Y."""
    clean = sampler.sample(n)
    noisy, sigma = add_noise(clean, tc.sigma_max, tc.clip_prob, gen)
    return noisy, {"clean": clean, "sigma": sigma}


def detect_batch_fn(textures: list[torch.Tensor] | None = None, anomaly_cfg=None) -> Callable:
    """Batches for UAD (paper §3.6): normal patches U_N, synthetic anomalies U_A = Y - U_N,
    and mild sensor noise that belongs to N."""
    cache: dict = {}

    def make(sampler: PatchSampler, n: int, tc: TrainConfig, gen: torch.Generator):
        normal = sampler.sample(n)
        if "tex" not in cache:
            cache["tex"] = [t.to(normal.device) for t in (textures or [])]
        Y, U_A, mask = synthesize(normal, gen, cache["tex"], anomaly_cfg or AnomalyConfig())
        noisy, _ = add_noise(Y, tc.sigma_max, tc.clip_prob, gen)
        return noisy, {"normal": normal, "anomaly": U_A, "mask": mask}

    return make
