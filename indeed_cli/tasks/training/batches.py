"""The batches a training step is computed on: (Y, targets) for each task's supervision term."""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from ...model.posteriors import energy_rank
from ..camera_noise import camera_noise_batch
from ..detection.synthesis import AnomalyConfig, synthesize
from .config import TrainConfig
from .data import PatchSampler
from .noise import add_noise

# one worker: the clean patches' SVD ranks for l_n (--rank-supervision) on the CPU, while the GPU trains
_RANKS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="indeed-rank")
# l_n is computed on this many patches of each batch (the first ones; patches are drawn at random): 16
# colour patches take about 30 ms on one CPU core, about an H200's training step of 64; all 64 four
# times that (and a GPU is slower still: it solves the 128x128 problems one at a time)
RANK_PATCHES = 16


# --saturation: the chroma of a chosen clean patch is scaled by a factor drawn log-uniformly in
# [1, SATURATION_MAX] (docs/model.md, Eq. (saturation)); 2.5 turns BSDS500's typical colourfulness
# (mean max-min over channels 0.17) into that of strongly coloured graphics (about 0.35)
SATURATION_MAX = 2.5
LUMA = (0.299, 0.587, 0.114)  # ITU-R BT.601, the weights a JPEG's Y channel uses


def saturate(
    clean: torch.Tensor, share: float, gen: torch.Generator, max_factor: float = SATURATION_MAX
) -> torch.Tensor:
    """Clean colour patches (N, 3, h, w) in [0, 1], a ``share`` of them (drawn per patch) more saturated
    and with their channels permuted: U' = P(Y + f (U - Y)) clipped to [0, 1], Y the patch's luma,
    f ~ logU[1, max_factor], P one of the 6 channel orders (docs/model.md, Eq. (saturation)).

    Training photographs are mostly of low colourfulness, and the model's gap to FFDNet on them grows
    with saturation (docs/reports/2026-11-28-saturated-colour.md); a permutation keeps a patch's
    structure and its white noise and changes which channel carries which colour."""
    n = clean.shape[0]
    pick = torch.rand(n, generator=gen) < share  # drawn on the CPU generator: no device sync per step
    factor = torch.exp(torch.rand(n, generator=gen) * math.log(max_factor))
    order = torch.argsort(torch.rand(n, 3, generator=gen), dim=1)
    if not bool(pick.any()):
        return clean
    dev = clean.device
    w = torch.tensor(LUMA, device=dev, dtype=clean.dtype).view(1, 3, 1, 1)
    luma = (clean * w).sum(1, keepdim=True)
    vivid = (luma + factor.to(dev, clean.dtype).view(-1, 1, 1, 1) * (clean - luma)).clamp(0.0, 1.0)
    vivid = torch.gather(vivid, 1, order.to(dev).view(n, 3, 1, 1).expand_as(vivid))
    return torch.where(pick.to(dev).view(-1, 1, 1, 1), vivid, clean)


def denoise_batch(sampler: PatchSampler, n: int, tc: TrainConfig, gen: torch.Generator):
    """Batches for denoising (paper §4.1): clean patches U and their noisy copies Y.

    With ``tc.saturation_share`` > 0 that share of the clean patches is made more colourful first
    (:func:`saturate`).  With ``tc.camera_share`` > 0 that share of the patches (drawn per patch) gets camera noise
    instead (:func:`~indeed_cli.tasks.camera_noise.camera_noise_batch`; 8-bit rounding with
    ``clip_prob`` like the others), and its target is the same camera's image without noise."""
    clean = sampler.sample(n)
    if tc.saturation_share > 0:
        clean = saturate(clean, tc.saturation_share, gen)
    noisy, sigma = add_noise(clean, tc.sigma_max, tc.clip_prob, gen, tc.sigma_power)
    if tc.camera_share > 0:
        on_cpu = torch.rand(n, generator=gen) < tc.camera_share  # counted here: no device sync per step
        k = int(on_cpu.sum())
        if k:
            cam = on_cpu.to(clean.device)
            cam_noisy, reference = camera_noise_batch(clean[cam], gen)
            rounded = (torch.rand(k, generator=gen) < tc.clip_prob).to(clean.device)
            cam_noisy = torch.where(rounded.view(-1, 1, 1, 1), torch.round(cam_noisy * 255) / 255, cam_noisy)
            noisy, clean = noisy.clone(), clean.clone()
            noisy[cam], clean[cam] = cam_noisy, reference
            # the noise level a camera patch is weighted by (noise_level_weights): its RMS noise
            sigma = sigma.to(clean.device).clone()
            sigma[cam] = (cam_noisy - reference).pow(2).mean((1, 2, 3)).sqrt()
    return noisy, {"clean": clean, "sigma": sigma}


def _rank_when_ready(clean: torch.Tensor, ready: torch.cuda.Event | None) -> torch.Tensor:
    if ready is not None:
        ready.synchronize()  # the copy from the GPU has landed
    return energy_rank(clean)


class RankedBatches:
    """``make_batch`` for rank supervision (``--rank-supervision``): the batches of ``make_batch`` drawn one
    step ahead, each with ``targets["rank"]``, a future of the SVD ranks of its first ``RANK_PATCHES`` clean
    patches (:func:`~indeed_cli.model.posteriors.energy_rank`), computed on the CPU while the GPU trains on
    the batch before (the loss needs them before its backward pass, so computing them for the same step
    stalled it: half the step rate on an H200).  The random streams run one batch ahead of the steps, so
    a resumed run skips the batch that was drawn ahead when it stopped."""

    def __init__(self, make_batch: Callable):
        self.make_batch = make_batch
        self.ahead: tuple | None = None

    def __call__(self, sampler: PatchSampler, n: int, tc: TrainConfig, gen: torch.Generator):
        if self.ahead is None:
            self.ahead = self._draw(sampler, n, tc, gen)
        batch, self.ahead = self.ahead, self._draw(sampler, n, tc, gen)
        return batch

    def _draw(self, sampler, n, tc, gen):
        noisy, targets = self.make_batch(sampler, n, tc, gen)
        clean = targets["clean"][:RANK_PATCHES].detach()
        if clean.is_cuda:  # an asynchronous copy: the main thread goes on queueing the step
            host = torch.empty(clean.shape, dtype=clean.dtype, pin_memory=True)
            host.copy_(clean, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record()
        else:
            host, ready = clean.clone(), None
        return noisy, {**targets, "rank": _RANKS.submit(_rank_when_ready, host, ready)}


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
