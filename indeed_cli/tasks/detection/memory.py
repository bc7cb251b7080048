"""A detector's memory of normal features: filling it, its distance map, and the fused map.

docs/model.md, "The normal feature memory". The memory (:class:`~indeed_cli.model.memory.FeatureMemory`)
is filled from normal images (the training images of ``indeed train --task detect``, or
``indeed calibrate --memory``). Its distance map d (Eq. normal feature distance) joins the map a
of the detector's members as one more member, Eq. (memory fusion):

    d~(x)   = mu_a + sigma_a (d(x) - mu_d) / sigma_d
    a_M(x)  = (K a(x) + d~(x)) / (K + 1)

with K the detector's members (a is already their mean) and mu, sigma the mean and standard
deviation of a and of d over the pixels of the held-out normal images the threshold is learned
on: d is brought to the scale that a has on normal surface, then weighted as one member. The
pixel threshold is computed from a_M.

The image score joins the two the same way one level up, Eq. (score fusion): with t(.) the top5
score (mean of the largest 5% of a map) and m, s the mean and standard deviation of t(a_M) and of
t(d) over the same normal images,

    t~(d)   = m_a + s_a (t(d) - m_d) / s_d
    score   = (t(a_M) + t~(d)) / 2

the fused map's score (where the defect is) and the memory's (how far the image's patches are
from normal, PatchCore's image score) as two votes of equal weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...inference import as_image, training_channels
from ...model import Checkpoint
from ...model.checkpoint import read_feature_trunk, stored_bank
from ...model.memory import FeatureMemory, bank_density, check_bank_bits
from ...model.registry import resolve_feature_weights
from .filters import gaussian_blur, resize

# A tenth of each normal image's patches are candidates, and at most MEMORY_ENTRIES of them are kept
# by PatchCore's greedy coreset on a CORESET_DIMS-dimensional random projection.  On the magnetic-tile
# development set (the bundled pair's map fused with memories of its 400 memory images' 67,167 candidates,
# docs/reports/2026-12-01-feature-memory.md) 28,672 entries scored above 14,336 in pixel AUROC, pixel AP
# and image AUROC on both halves, and above all 67,167 candidates kept (no coreset) in pixel AUROC; a
# random draw of 14,336 scored 0.012 image AUROC below the coreset.  Three detectors trained from
# scratch, each with a memory of all 635 training images (docs/reports/2026-12-02-joint-image-score.md),
# scored higher with 57,344 entries than with 28,672 on all three figures and both halves of every seed
# (image AUROC +0.013 to +0.014), for more search time and twice the bank's bytes.
# The bundled detector holds 28,672 in 4 bits (`--memory-entries`, `--memory-bits`; 2.2 MB, as 14,336 take
# in int8), which holds its file under the 16 MB a bundled file may take.
MEMORY_SHARE, MEMORY_ENTRIES, CORESET_DIMS = 0.1, 57344, 128
# a new detector's memory is filled from at most this many of its training images, evenly spaced.
# The PatchCore peer of the issue used 400; on the magnetic-tile development set a memory of all 635
# training images scored above one of 400 of them on all three pooled figures and both halves (image
# AUROC 0.862 against 0.850, docs/reports/2026-12-01-feature-memory.md): more normal images, more of
# normal surface covered. The bound keeps the trunk's pass over them to minutes on a CPU.
MEMORY_IMAGES = 2000
# at most this many candidates in all go to the coreset, whose time grows with them (108,517 of the
# 635 images took 177 s on a 2-core CPU for 28,672 entries): each image gives a tenth of its patches,
# or its share of this bound where that is fewer (large images, many of them)
MEMORY_CANDIDATES = 200_000
# the distance map is brought to the image's size and smoothed by a Gaussian of this sigma (px)
DISTANCE_BLUR = 4.0


@dataclass
class FusionStats:
    """What Eq. (memory fusion) needs, from the held-out normal images' pixels."""

    map_mean: float
    map_std: float
    distance_mean: float
    distance_std: float
    members: int  # K: the members whose mean map a is

    def to_dict(self) -> dict:
        return {k: float(v) if k != "members" else int(v) for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, d: dict) -> FusionStats:
        """From the facts stored under extra["detect"]["memory"] (which also hold others)."""
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


def build_memory(
    trunk_state: dict[str, torch.Tensor],
    normal_images,
    channels: int,
    entries: int = MEMORY_ENTRIES,
    share: float = MEMORY_SHARE,
    seed: int = 0,
    device: str | torch.device = "cpu",
    progress=None,
    bits: int = 8,
    candidates: int = MEMORY_CANDIDATES,
) -> FeatureMemory:
    """A memory of the patch features of ``normal_images`` (paths, arrays or images, as a detector of
    ``channels`` channels sees them: luma for a gray one): ``share`` of each image's drawn at random
    with ``seed`` (fewer where ``candidates`` shared out among the images is fewer), then at most
    ``entries`` of them chosen by :func:`greedy_coreset`, rounded as a checkpoint stores them in
    ``bits`` per value (8 or 4; :data:`~indeed_cli.model.memory.BANK_BITS`)."""
    check_bank_bits(bits)  # before the trunk's pass over the images, not after it
    if not 0 < share <= 1:
        raise ValueError(f"memory share must be in (0, 1], got {share:g}")
    if candidates < 1:
        raise ValueError(f"memory candidates must be at least 1, got {candidates}")
    if entries < 1:
        raise ValueError(f"memory entries must be at least 1, got {entries}")
    normal_images = list(normal_images)
    quota = max(1, -(-candidates // max(1, len(normal_images))))  # each image's part of the bound
    gen = torch.Generator().manual_seed(seed)
    probe = FeatureMemory(0).to(device)
    probe.trunk.load_state_dict({k: v.float() for k, v in trunk_state.items()})
    parts = []
    for image in normal_images:
        f = probe.patch_features(_tensor(image, channels, device)).cpu()
        parts.append(f[torch.randperm(len(f), generator=gen)[: min(quota, max(1, int(share * len(f))))]])
        if progress:
            progress(1)
    if not parts:
        raise ValueError("a feature memory needs at least one normal image")
    bank = greedy_coreset(torch.cat(parts).to(device), entries, gen).cpu()
    memory = FeatureMemory(len(bank), bits=bits)
    memory.trunk.load_state_dict(probe.trunk.state_dict())
    memory.bank.copy_(stored_bank(bank, bits))  # as a checkpoint will hold it, so its statistics hold there
    memory.density.copy_(bank_density(memory.bank.to(device)).cpu())
    return memory.to(device).eval()


def rebanked(memory: FeatureMemory, bits: int) -> FeatureMemory:
    """The same memory with its bank stored in ``bits`` per value: the bank rounded so
    (:func:`~indeed_cli.model.checkpoint.stored_bank`) and its radii computed again on it, as
    :func:`build_memory` would have made it; ``memory`` itself where it is stored so already."""
    if bits == memory.bits:
        return memory
    out = FeatureMemory(memory.entries, memory.name, bits).to(memory.bank.device)
    out.trunk.load_state_dict(memory.trunk.state_dict())
    out.bank.copy_(stored_bank(memory.bank, bits))
    out.density.copy_(bank_density(out.bank))
    return out.eval()


def memory_trunk(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    """The trunk weights a detector's memory reads features with: those of the first of its networks
    whose f_thetaM reads EfficientNet-Lite0 features (the file then stores them once), else the
    bundled trunk (weights/features/)."""
    for net in (ckpt.model, *(m.model for m in ckpt.members)):
        if net.cfg.support_features == "efficientnet-lite0":
            return {k: v.detach().cpu() for k, v in net.support.features.state_dict().items()}
    return read_feature_trunk(resolve_feature_weights(None, "efficientnet-lite0"), "efficientnet-lite0")


def greedy_coreset(features: torch.Tensor, n: int, gen: torch.Generator, dims: int = CORESET_DIMS) -> torch.Tensor:
    """PatchCore's coreset (Roth et al. 2022, approximate greedy k-centre): ``n`` of the rows of
    ``features``, each next one the row farthest from those chosen, distances measured after a
    random projection to ``dims`` dimensions (seeded by ``gen``); all rows where there are no more
    than ``n``.  It covers the normal patches, rare ones included, where a random draw keeps the
    common ones."""
    if len(features) <= n:
        return features
    proj = (torch.randn(features.shape[1], dims, generator=gen) / dims**0.5).to(features.device)
    Z = features.float() @ proj
    z2 = Z.square().sum(1)
    chosen = [int(torch.randint(len(Z), (1,), generator=gen))]
    # squared distance to the nearest chosen row, ||z||^2 - 2 z.c + ||c||^2: one product per step,
    # in place (fresh temporaries per step made a 2-core CPU spend most of its time allocating)
    nearest = z2 - 2 * Z @ Z[chosen[0]] + z2[chosen[0]]
    step = torch.empty_like(nearest)
    for _ in range(n - 1):
        j = int(nearest.argmax())
        chosen.append(j)
        torch.mv(Z, Z[j], out=step)
        step.mul_(-2).add_(z2).add_(z2[j])
        torch.minimum(nearest, step, out=nearest)
    return features[torch.tensor(chosen, device=features.device)]


def memory_sample(paths: list, count: int = MEMORY_IMAGES) -> list:
    """At most ``count`` of ``paths``, evenly spaced, in order."""
    return list(paths[:: max(1, len(paths) // count)][:count])


def _tensor(image, channels: int, device) -> torch.Tensor:
    """(1, channels, h, w) on ``device``: the image with the detector's channels (luma for gray)."""
    data = training_channels(as_image(image)[0], channels)
    return torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32))[None].to(device)


def distance_map(memory: FeatureMemory, image, channels: int) -> np.ndarray:
    """Eq. (normal feature distance) of the image as a detector of ``channels`` channels sees it, at
    the image's size: the stride-8 distances resized (bilinear) and smoothed by a Gaussian of
    DISTANCE_BLUR px, (h, w) float32."""
    data, _ = as_image(image)
    d = memory.distance(_tensor(data, channels, memory.bank.device)).cpu().numpy()[None]
    return gaussian_blur(resize(d, data.shape[1:])[0], DISTANCE_BLUR).astype(np.float32)


def fusion_stats(maps: list[np.ndarray], distances: list[np.ndarray], members: int) -> FusionStats:
    """The pixel means and standard deviations of the members' mean maps and of the distance maps of
    held-out normal images (Eq. memory fusion)."""
    a = _mean_std(np.concatenate([m.ravel() for m in maps]))
    d = _mean_std(np.concatenate([m.ravel() for m in distances]))
    return FusionStats(*a, *d, members)


def _mean_std(values) -> tuple[float, float]:
    """Mean and standard deviation (float64; the deviation at least 1e-12, which a scale divides by)."""
    x = np.asarray(values, np.float64)
    return float(x.mean()), max(float(x.std()), 1e-12)


def fuse(amap: np.ndarray, dmap: np.ndarray, stats: FusionStats) -> np.ndarray:
    """Eq. (memory fusion): the distance map on the members' normal scale, averaged with them as
    one more member."""
    scaled = stats.map_mean + stats.map_std * (dmap - stats.distance_mean) / stats.distance_std
    k = stats.members
    return ((k * amap + scaled) / (k + 1)).astype(np.float32)


@dataclass
class ScoreStats:
    """What Eq. (score fusion) needs, from the held-out normal images' scores."""

    score_mean: float  # m_a, s_a: of t(a_M), the top5 scores of the fused maps
    score_std: float
    distance_score_mean: float  # m_d, s_d: of t(d), the top5 scores of the distance maps
    distance_score_std: float

    def to_dict(self) -> dict:
        return {k: float(v) for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, d: dict) -> ScoreStats:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


def score_stats(map_scores, distance_scores) -> ScoreStats:
    """The means and standard deviations of the held-out normal images' top5 scores of their fused
    maps and of their distance maps (Eq. score fusion)."""
    return ScoreStats(*_mean_std(map_scores), *_mean_std(distance_scores))


def fuse_scores(map_score: float, distance_score: float, stats: ScoreStats) -> float:
    """Eq. (score fusion): the distance map's score on the fused map's normal scale, averaged with
    the fused map's score."""
    z = (distance_score - stats.distance_score_mean) / stats.distance_score_std
    scaled = stats.score_mean + stats.score_std * z
    return float((map_score + scaled) / 2)


def stored_score_fusion(ckpt: Checkpoint) -> ScoreStats | None:
    """The statistics of Eq. (score fusion) stored with the threshold; None where the detector was
    calibrated without them (its image score is the fused map's alone)."""
    facts = ((ckpt.extra.get("detect") or {}).get("memory") or {}).get("scores")
    return ScoreStats.from_dict(facts) if ckpt.memory is not None and facts else None


def stored_fusion(ckpt: Checkpoint) -> FusionStats | None:
    """The fusion statistics stored with the threshold, None where the detector fuses no memory."""
    facts = (ckpt.extra.get("detect") or {}).get("memory")
    return FusionStats.from_dict(facts) if ckpt.memory is not None and facts else None
