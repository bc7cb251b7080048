"""A detector's memory of normal image features: the nearest-normal-feature distance.

docs/model.md, "The normal feature memory" (beyond the paper). The memory holds M = {m_k}, the
features of patches of normal images under the frozen ImageNet trunk of :mod:`.features`
(EfficientNet-Lite0, stride-8 and stride-16 features, 152 channels), each averaged over its 3 x 3
neighbourhood as PatchCore does (Roth et al., CVPR 2022). For an image Y, Eq. (normal feature
distance):

    d(x) = min_k || phi_3x3(Y)(x) - m_k ||_2

on the stride-8 grid: how far the patch at x lies from every normal patch seen. It is not learned;
the memory is filled from normal images (:func:`indeed_cli.tasks.detection.memory.build_memory`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .features import FEATURE_CHANNELS, EfficientNetLite0Trunk

# queries compared with the memory at once: a (chunk, entries) matrix is held
QUERY_CHUNK = 512


class FeatureMemory(nn.Module):
    """The frozen trunk and the memory ``bank`` (entries, 152) of normal patch features."""

    def __init__(self, entries: int, name: str = "efficientnet-lite0"):
        super().__init__()
        if name != "efficientnet-lite0":
            raise ValueError(f"unknown feature trunk {name!r}: efficientnet-lite0 is the one there is")
        self.name = name
        self.trunk = EfficientNetLite0Trunk().requires_grad_(False)
        self.register_buffer("bank", torch.zeros(entries, FEATURE_CHANNELS))

    @property
    def entries(self) -> int:
        return self.bank.shape[0]

    @torch.no_grad()
    def patch_features(self, Y: Tensor) -> Tensor:
        """(1, C, h, w) image in [0, 1] -> (ceil(h/8) * ceil(w/8), 152): the 3 x 3 neighbourhood mean
        of the trunk's features at each stride-8 position, row by row (the image edge-padded to
        multiples of 16, as f_thetaM's features are)."""
        h, w = Y.shape[-2:]
        pad = (0, (-w) % 16, 0, (-h) % 16)
        f = self.trunk(F.pad(Y, pad, mode="replicate") if any(pad) else Y).float()
        f = f[..., : -(-h // 8), : -(-w // 8)]
        f = F.avg_pool2d(f, 3, stride=1, padding=1, count_include_pad=False)
        return f[0].flatten(1).T

    @torch.no_grad()
    def distance(self, Y: Tensor) -> Tensor:
        """Eq. (normal feature distance) on the stride-8 grid of Y: (ceil(h/8), ceil(w/8)), float32."""
        h, w = Y.shape[-2:]
        q = self.patch_features(Y)
        bank = self.bank.float()
        b2 = bank.square().sum(1)
        # ||q - m||^2 = ||q||^2 + (||m||^2 - 2 q.m): the bracket's smallest over m is one matrix
        # product and a minimum (addmm writes one (chunk, entries) matrix), ||q||^2 added after it
        nearest = [torch.addmm(b2, c, bank.T, alpha=-2).amin(1) for c in q.split(QUERY_CHUNK)]
        d2 = torch.cat(nearest) + q.square().sum(1)
        return d2.clamp_min(0).sqrt().view(-(-h // 8), -(-w // 8))
