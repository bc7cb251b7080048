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

On a CPU a bank of QUANTISED_SEARCH_MIN entries or more is searched in integers first,
Eq. (quantised search): per feature channel c the bank on 256 levels, k_mc = round((m_c - lo_c) / t_c) - 128
with lo_c, t_c = (max - min) / 255 the channel's, the query w = phi * t on 255 levels of one step
alpha = max |w| / 127 for the image (each SEARCH_QUERIES of its patches), and

    score(x, m) = round(w(x) / alpha) . k_m - round(||m||^2 / (2 alpha)),

an int8 matrix product (the second term as extra columns of the bank) that is largest where
||phi(x) - m||^2 = ||phi||^2 + ||m||^2 - 2 phi.m is smallest, to the rounding. The bank is cut into
blocks of SEARCH_BLOCK consecutive entries; the entries of the SEARCH_BLOCKS blocks of highest
score are the candidates, among which k* is the nearest in float32, as in the exact search.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .cpu import INT8_DOT_FLAGS, has_any
from .features import FEATURE_CHANNELS, EfficientNetLite0Trunk

# queries compared with the memory at once: a (chunk, entries) matrix is held
QUERY_CHUNK = 512
# entries an image's patches are compared with at once in Eq. (normal feature distance): a
# (patches, chunk) matrix that stays in cache; on a 2-core AMD EPYC the search of 1,900 patches (a
# 400x300 image) in 57,344 random entries took 0.30-0.37 s so against 0.51 s in chunks of 512 patches
BANK_CHUNK = 4096
# Eq. (quantised search): banks of fewer entries, and searches off the CPU, are exact (a GPU's
# float32 product is fast, and a small bank's search is short)
QUANTISED_SEARCH_MIN = 8192
# set to False to time or check the exact search alone (benchmarks/speed.py --search); off on a CPU
# without int8 dot products in hardware (cpu.INT8_DOT_FLAGS: AVX2 alone), where it is the slower one
QUANTISED_SEARCH = has_any(INT8_DOT_FLAGS)
# patches searched at once: a large image's (a 4000x3000 one has 187,500) are searched this many at a
# time, so that the (patches, chunk) score matrices stay tens of MB (2 GB and more at once)
SEARCH_QUERIES = 4096
# its candidates: the entries of the SEARCH_BLOCKS blocks of SEARCH_BLOCK consecutive entries with
# the highest integer score. On the bundled detector's 57,344 entries and three 400x300 magnetic-tile
# images, 4 blocks of 8 found the exact search's nearest entry for every one of the 1,900 patches of
# each (the distances within 3e-6 of its, the float sums differing), 2 blocks of 32 missed 2-6 (within 3e-3)
SEARCH_BLOCK, SEARCH_BLOCKS = 8, 4
# entries scored at once in Eq. (quantised search) (a multiple of SEARCH_BLOCK; on the same CPU 2,048
# took 0.026 s for the product of 1,900 patches with 57,344 entries, 4,096 0.029 s, and their block
# maxima 0.045 s against 0.073 s)
SEARCH_CHUNK = 2048
# at most this many extra int8 columns hold ||m||^2 / (2 alpha) (127 * 127 each); a query of so small
# a step alpha that it needs more is searched exactly
SEARCH_EXTRA_COLUMNS = 64
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
        self._search = None  # what a search needs of the bank, made once per bank (:meth:`_search_tables`)

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
        d2, which = self.nearest(self.patch_features(Y))
        d = d2.clamp_min(0).sqrt() / self.density.float()[which]
        return d.view(-(-h // 8), -(-w // 8))

    @torch.no_grad()
    def nearest(self, q: Tensor) -> tuple[Tensor, Tensor]:
        """The squared distance of each row of ``q`` (patches, 152) to its nearest bank entry, and
        that entry's index: Eq. (quantised search) on a CPU for a bank of QUANTISED_SEARCH_MIN entries
        or more, else the exact search (:meth:`nearest_exact`); SEARCH_QUERIES rows at a time."""
        if len(q) > SEARCH_QUERIES:
            parts = [self.nearest(q[i : i + SEARCH_QUERIES]) for i in range(0, len(q), SEARCH_QUERIES)]
            return torch.cat([d for d, _ in parts]), torch.cat([k for _, k in parts])
        # a few patches (a tiny image) search exactly: their float32 product is short
        if QUANTISED_SEARCH and q.device.type == "cpu" and self.entries >= QUANTISED_SEARCH_MIN and len(q) > 16:
            found = self._nearest_quantised(q)
            if found is not None:
                return found
        return self.nearest_exact(q)

    def _search_tables(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """The bank in float32, its transpose, its squared norms, its channels' steps t and its
        codes k (entries, 152) int8 of Eq. (quantised search); made again when the bank changes."""
        key = (self.bank.data_ptr(), self.bank._version, self.bank.device)
        if self._search is None or self._search[0] != key:
            b = self.bank.float()
            lo, hi = b.amin(0), b.amax(0)
            step = ((hi - lo) / 255).clamp_min(1e-12)
            codes = ((b - lo) / step).round().clamp(0, 255).sub(128).to(torch.int8)
            self._search = (key, b, b.T.contiguous(), b.square().sum(1), step, codes)
        return self._search[1:]

    @torch.no_grad()
    def nearest_exact(self, q: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`nearest` by a float32 product with every entry."""
        _, bank_t, b2, _, _ = self._search_tables()
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
        return best + q.square().sum(1), which

    def quantised_factors(self, q: Tensor) -> tuple[Tensor, Tensor] | None:
        """The int8 factors of Eq. (quantised search) for the rows of ``q``: (patches, width) and the
        bank's (entries, width), whose product is score(x, m); None where the query's step needs more
        than SEARCH_EXTRA_COLUMNS columns for the norms (or is 0)."""
        _, _, b2, step, codes = self._search_tables()
        w = q * step
        alpha = float(w.abs().max()) / 127
        if not alpha > 0:
            return None
        # round(||m||^2 / (2 alpha)) = 127 * (e_1 + ... + e_J) + r, each e_j and r in 0..127: the
        # query holds -127 against the e columns and -1 against r
        norms = (b2 / (2 * alpha)).round()
        high = torch.div(norms, 127, rounding_mode="floor")
        columns = max(1, -(-int(high.max()) // 127))
        if columns > SEARCH_EXTRA_COLUMNS:
            return None
        e = (high[:, None] - 127 * torch.arange(columns, dtype=high.dtype)).clamp(0, 127)
        c, n = codes.shape[1], len(q)
        width = c + columns + 1 + (-(c + columns + 1) % 8)  # the integer product wants a multiple of 8
        # entries by rows: the product reads its second factor fastest by columns (on a 2-core AMD EPYC
        # 0.03 s for 1,900 patches and 57,344 entries, against 0.15 s from a row-major one); made per
        # call (0.5 ms), so that searches in several threads share nothing they write
        bank_x = torch.empty(len(codes), width, dtype=torch.int8)
        bank_x[:, :c] = codes
        bank_x[:, c : c + columns] = e.to(torch.int8)
        bank_x[:, c + columns] = (norms - 127 * high).to(torch.int8)
        bank_x[:, c + columns + 1 :] = 0
        q_x = torch.zeros(n, width, dtype=torch.int8)
        q_x[:, :c], q_x[:, c : c + columns], q_x[:, c + columns] = (w / alpha).round().to(torch.int8), -127, -1
        return q_x, bank_x

    def _nearest_quantised(self, q: Tensor) -> tuple[Tensor, Tensor] | None:
        """Eq. (quantised search); None where :meth:`quantised_factors` has none (the exact search runs)."""
        factors = self.quantised_factors(q)
        if factors is None:
            return None
        q_x, bank_x = factors
        bank, _, b2, _, _ = self._search_tables()
        n, m = len(q), self.entries
        blocks = m // SEARCH_BLOCK
        tops, score = [], torch.empty(n, SEARCH_CHUNK, dtype=torch.int32)  # one buffer: fresh ones page-fault
        for start in range(0, blocks * SEARCH_BLOCK, SEARCH_CHUNK):
            stop = min(start + SEARCH_CHUNK, blocks * SEARCH_BLOCK)
            out = score if stop - start == SEARCH_CHUNK else torch.empty(n, stop - start, dtype=torch.int32)
            part = torch._int_mm(q_x, bank_x[start:stop].T, out=out)
            tops.append(part.view(n, -1, SEARCH_BLOCK).amax(-1))
        top = torch.cat(tops, 1).topk(min(SEARCH_BLOCKS, blocks), dim=1).indices
        cand = (top[:, :, None] * SEARCH_BLOCK + torch.arange(SEARCH_BLOCK)).flatten(1)
        tail = torch.arange(blocks * SEARCH_BLOCK, m)  # the entries after the last whole block: every query's
        cand = torch.cat([cand, tail.expand(n, -1)], 1).sort(1).values  # in order: the first of equal ones wins
        v, j = torch.baddbmm(b2[cand][:, :, None], bank[cand], q[:, :, None], alpha=-2)[..., 0].min(1)
        return v + q.square().sum(1), cand.gather(1, j[:, None])[:, 0]
