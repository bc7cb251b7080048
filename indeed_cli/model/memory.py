"""A detector's memory of normal image features: the nearest-normal-feature distance.

docs/model.md, "The normal feature memory" (beyond the paper). The memory holds M = {m_k}, the
features of patches of normal images under the frozen ImageNet trunk of :mod:`.features`
(EfficientNet-Lite0, stride-8 and stride-16 features, 152 channels), each averaged over its 3 x 3
neighbourhood as PatchCore does (Roth et al., CVPR 2022). Each entry has a density radius,
Eq. (memory density):

    rho_k = mean of the DENSITY_NEIGHBOURS smallest || m_k - m_j ||_2 over j != k

and for an image Y, Eq. (normal feature distance):

    k*(x) = argmin_k || phi_3x3(Y)(x) - m_k ||_2,   d(x) = || phi_3x3(Y)(x) - m_k* ||_2 / rho_k*

on the stride-8 grid: how far the patch at x lies from the normal patches seen, in units of how
far apart the normal patches around its nearest one lie (sparse kinds of normal patch, such as the
image border, are far apart, so a new one of them is not taken for a defect). It is not learned;
the memory is filled from normal images (:func:`indeed_cli.tasks.detection.memory.build_memory`).
A memory whose radii are all 1 gives the plain nearest distance (files made before the radii).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .features import FEATURE_CHANNELS, EfficientNetLite0Trunk

# queries compared with the memory at once: a (chunk, entries) matrix is held
QUERY_CHUNK = 512
# entries an image's patches are compared with at once in Eq. (normal feature distance): a
# (patches, chunk) matrix that stays in cache; on a 2-core AMD EPYC the search of 1,900 patches (a
# 400x300 image) in 57,344 random entries took 0.30-0.37 s so against 0.51 s in chunks of 512 patches
BANK_CHUNK = 4096
# Eq. (memory density): the radius of an entry is its mean distance to this many nearest others.
# On the magnetic-tile development set (the bundled pair's memory) 1, 3 and 9 gave image AUROC
# 0.843, 0.846 and 0.849 fused, against 0.818 with the plain distance (docs/reports/2026-12-01-feature-memory.md)
DENSITY_NEIGHBOURS = 3
# the precisions a checkpoint may store the bank in, bits per value (indeed_cli.model.checkpoint):
# 8 (int8, one scale per feature channel) or 4 (16 levels between each channel's minimum and
# maximum, two values a byte), which holds twice the entries in the same bytes
BANK_BITS = (8, 4)


def check_bank_bits(bits: int, what: str = "a memory bank's bits per value") -> int:
    """``bits`` if a checkpoint can store a bank in it (:data:`BANK_BITS`); ValueError naming ``what``."""
    if bits not in BANK_BITS:
        raise ValueError(f"{what} must be {' or '.join(map(str, BANK_BITS))}, got {bits}")
    return bits


@torch.no_grad()
def bank_density(bank: Tensor, neighbours: int = DENSITY_NEIGHBOURS) -> Tensor:
    """Eq. (memory density) of every entry of ``bank`` (entries, C): (entries,) float32, the mean of
    its ``neighbours`` smallest distances to the other entries (as many as there are where fewer).
    Radii are floored at 1e-3 of their mean (duplicate entries would give 0); a bank of one entry,
    or of equal entries, has radii 1 (the plain distance)."""
    n = bank.shape[0]
    k = min(neighbours, n - 1)
    if k < 1:
        return torch.ones(n, device=bank.device)
    b = bank.float()
    b2 = b.square().sum(1)
    radii = []
    for start in range(0, n, QUERY_CHUNK):
        c = b[start : start + QUERY_CHUNK]
        d2 = torch.addmm(b2, c, b.T, alpha=-2).add_(c.square().sum(1, keepdim=True))
        d2[torch.arange(len(c)), torch.arange(start, start + len(c))] = float("inf")  # not itself
        # the product form chooses the neighbours; their distances are taken directly, since its
        # cancellation leaves about 1e-3 where two entries are equal
        idx = d2.topk(k, dim=1, largest=False).indices
        radii.append((c[:, None, :] - b[idx]).norm(dim=-1).mean(1))
    rho = torch.cat(radii)
    mean = float(rho.mean())
    return rho.clamp_min(1e-3 * mean) if mean > 0 else torch.ones(n, device=bank.device)


class FeatureMemory(nn.Module):
    """The frozen trunk and the memory ``bank`` (entries, 152) of normal patch features; ``bits``:
    the precision a checkpoint stores the bank in (:data:`BANK_BITS`), which the bank is already
    rounded to where :func:`~indeed_cli.tasks.detection.memory.build_memory` filled it."""

    def __init__(self, entries: int, name: str = "efficientnet-lite0", bits: int = 8):
        super().__init__()
        if name != "efficientnet-lite0":
            raise ValueError(f"unknown feature trunk {name!r}: efficientnet-lite0 is the one there is")
        self.name = name
        self.bits = check_bank_bits(bits)
        self.trunk = EfficientNetLite0Trunk().requires_grad_(False)
        self.register_buffer("bank", torch.zeros(entries, FEATURE_CHANNELS))
        # Eq. (memory density) of each entry; ones: the plain nearest distance
        self.register_buffer("density", torch.ones(entries))

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
        bank_t = self.bank.float().T.contiguous()
        b2 = bank_t.square().sum(0)
        # ||q - m||^2 = ||q||^2 + (||m||^2 - 2 q.m): the bracket's smallest over m is a matrix
        # product and a minimum per chunk of entries (the first of equal ones kept, as one minimum
        # over all would), ||q||^2 added after it
        best = torch.full((q.shape[0],), float("inf"), device=q.device)
        which = torch.zeros(q.shape[0], dtype=torch.long, device=q.device)
        for start in range(0, bank_t.shape[1], BANK_CHUNK):
            part = slice(start, start + BANK_CHUNK)
            v, i = torch.addmm(b2[part], q, bank_t[:, part], alpha=-2).min(1)
            closer = v < best
            best, which = torch.where(closer, v, best), torch.where(closer, i + start, which)
        d2 = best + q.square().sum(1)
        d = d2.clamp_min(0).sqrt() / self.density.float()[which]
        return d.view(-(-h // 8), -(-w // 8))
