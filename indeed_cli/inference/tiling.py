"""Overlapping-tile inference with reflect padding and tapered blending.

The image stays on the CPU; tiles are cut on the fly (no padded copy of the whole
image is made), sent to the device in batches, and blended back into CPU
accumulators with a raised-cosine window.  Memory is bounded by the accumulators
(one float32 plane per output channel plus one weight plane) and the tile batch,
never by a device copy of the image.

Tile geometry: the image is extended by a reflected margin of ``overlap // 2`` on
every side, so border pixels see context as interior ones do, then covered by a
regular grid of ``tile`` x ``tile`` windows with stride ``tile - overlap``.
Reflection is repeated as often as needed, so images smaller than a tile work.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

TileFn = Callable[[Tensor], dict[str, Tensor]]


def reflect_index(idx: np.ndarray, n: int) -> np.ndarray:
    """Map any integer index to [0, n) by repeated mirror reflection (no edge repeat)."""
    if n == 1:
        return np.zeros_like(idx)
    period = 2 * (n - 1)
    m = np.mod(idx, period)
    return np.where(m < n, m, period - m)


def tile_starts(length: int, tile: int, overlap: int) -> list[int]:
    """Start offsets, on a uniform stride, in the margin-extended frame; the grid covers
    [0, length + 2*margin) and may run past it (into more reflection), never short of it."""
    margin = overlap // 2
    total = length + 2 * margin
    stride = tile - overlap
    n = max(0, math.ceil((total - tile) / stride)) + 1
    return [i * stride for i in range(n)]


def blend_window(tile: int, overlap: int) -> Tensor:
    """Separable taper: 0 in a band of ``overlap // 4`` pixels at each tile edge (where the
    tile's own padding corrupts outputs), a raised cosine up to 1 over the rest of the
    overlap, 1 inside.  Every pixel keeps a positive total weight: where one tile is in its
    zero band, its neighbour is at full weight."""
    ramp = torch.ones(tile)
    if overlap > 0:
        k = overlap // 4
        n = overlap - 2 * k
        d = torch.arange(overlap, dtype=torch.float32)
        r = torch.where(d < k, torch.zeros(()), 0.5 - 0.5 * torch.cos(math.pi * ((d - k + 0.5) / n).clamp(0, 1)))
        r[overlap - k :] = 1.0
        ramp[:overlap] = r
        ramp[-overlap:] = torch.minimum(ramp[-overlap:], r.flip(0))
    return ramp[:, None] * ramp[None, :]


@functools.lru_cache(maxsize=8)
def _taper(tile: int, overlap: int) -> Tensor:
    """The 1-D taper of :func:`blend_window`, made once per size: a folder run builds a grid for
    every image (and to count its tiles)."""
    return blend_window(tile, overlap)[tile // 2]


class TileGrid:
    """Tile positions for an image of size (h, w) and the cutting of single tiles."""

    def __init__(self, h: int, w: int, tile: int = 128, overlap: int = 32):
        if tile <= 0:
            raise ValueError("tile must be positive")
        if not 0 <= overlap < tile:
            raise ValueError(f"overlap must be in [0, tile), got {overlap} for tile {tile}")
        self.h, self.w, self.tile, self.overlap = h, w, tile, overlap
        self.stride = tile - overlap
        self.margin = overlap // 2
        self.ys = tile_starts(h, tile, overlap)
        self.xs = tile_starts(w, tile, overlap)
        self.ramp = _taper(tile, overlap)  # the 1-D taper (read only); the window is its outer product

    def __len__(self) -> int:
        return len(self.ys) * len(self.xs)

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.ys), len(self.xs)

    @property
    def width_ext(self) -> int:
        return self.xs[-1] + self.tile

    def positions(self) -> Iterator[tuple[int, int]]:
        for y in self.ys:
            for x in self.xs:
                yield y, x

    def rows(self, y: int) -> np.ndarray:
        """Image rows (reflected) of the tile row starting at extended offset y."""
        return reflect_index(np.arange(y, y + self.tile) - self.margin, self.h)

    def cols_ext(self) -> np.ndarray:
        """Image columns (reflected) of the whole extended width."""
        return reflect_index(np.arange(self.width_ext) - self.margin, self.w)

    def cut(self, image: Tensor, y: int, x: int) -> Tensor:
        """The tile at (y, x) of a (C, h, w) image, reflected where it leaves the image: a view of
        the image where the tile lies inside it (most tiles; indexing copies), a copy elsewhere."""
        y0, x0, t = y - self.margin, x - self.margin, self.tile
        if 0 <= y0 and y0 + t <= self.h and 0 <= x0 and x0 + t <= self.w:
            return image[:, y0 : y0 + t, x0 : x0 + t]
        cols = reflect_index(np.arange(x, x + t) - self.margin, self.w)
        return image[:, torch.from_numpy(self.rows(y))][:, :, torch.from_numpy(cols)]

    def coverage(self, starts: list[int], length: int) -> Tensor:
        """Sum of the 1-D tapers of all tiles along one axis, over the image's pixels."""
        acc = torch.zeros(starts[-1] + self.tile)
        for s0 in starts:
            acc[s0 : s0 + self.tile] += self.ramp
        return acc[self.margin : self.margin + length]


def tile_means(plane: Tensor, grid: TileGrid) -> Tensor:
    """Mean of an (h, w) map over each tile window of ``grid``, the window cut as :meth:`TileGrid.cut`
    cuts it (reflected where it leaves the image): (tiles_y, tiles_x).  A whole-image read-out
    gives the per-tile statistics that a tiled one computes tile by tile.  Summed-area table in
    float64, so large images lose no precision, computed where ``plane`` is; the means come back
    on the CPU.  On a GPU only they travel: with the table made on the CPU, a 512x512 OAG read-out
    took 45-48 ms per image instead of 16-18 while eight threads wrote PNGs beside it (one NVIDIA
    H200 host, docs/reports/2026-12-07-oag-cli-time.md)."""
    h, w = plane.shape
    if (h, w) != (grid.h, grid.w):
        raise ValueError(f"plane is {h}x{w}, the grid is for {grid.h}x{grid.w}")
    device = plane.device
    rows = reflect_index(np.arange(grid.ys[-1] + grid.tile) - grid.margin, h)
    rows, cols = (host_to_device(torch.from_numpy(i), device) for i in (rows, grid.cols_ext()))
    ext = plane.detach().double()[rows][:, cols]
    table = F.pad(ext.cumsum(0).cumsum(1), (1, 0, 1, 0))
    t = grid.tile
    y0 = host_to_device(torch.tensor(grid.ys), device)[:, None]
    x0 = host_to_device(torch.tensor(grid.xs), device)[None, :]
    sums = table[y0 + t, x0 + t] - table[y0, x0 + t] - table[y0 + t, x0] + table[y0, x0]
    return (sums / t**2).float().cpu()


def host_to_device(t: Tensor, device: torch.device) -> Tensor:
    """Host -> ``device`` without waiting for the device.  A plain host-to-GPU copy synchronises the
    stream: the host waits until the GPU has run all it was given before it may queue more.  Through
    pinned memory the copy is queued like a kernel; the caching host allocator keeps the pinned block
    until the copy has run."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def _to_cpu(t: Tensor) -> Tensor:
    """Device -> host through pinned memory: a pageable copy of a large map ran at ~2 GB/s."""
    if t.device.type != "cuda":
        return t
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    out.copy_(t)
    return out


def tiled_apply(
    fn: TileFn,
    image: Tensor,
    tile: int = 128,
    overlap: int = 32,
    batch: int = 8,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: Callable[[int], None] | None = None,
    resident_bytes: int = 2**31,
    keep_on_device: bool = False,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Run ``fn`` on overlapping tiles of a (C, h, w) CPU image and stitch its outputs.

    ``fn`` takes a (B, C, tile, tile) batch on ``device`` and returns a dict of tensors.
    Outputs of shape (B, K, tile, tile) are blended into (K, h, w) maps; any other output
    (per-tile vectors such as mu_gamma) is collected into a (tiles_y, tiles_x, ...) grid.
    Both come back as float32 CPU tensors (maps stay where they were accumulated with
    ``keep_on_device``: on a GPU, the device, for a caller that goes on computing there).

    Work goes by rows of tiles (strips): a strip is cut on the CPU with reflected indices,
    moved to the device, split into tiles with ``unfold``, and the windowed outputs are
    summed back with ``fold`` on the device; only finished strips return to the CPU.
    On a GPU, an image of at most ``resident_bytes`` (float32) goes to the device once and
    the maps are accumulated there: cutting strips and adding them up on the CPU, and the
    many small pageable copies between, bounded GPU throughput (docs/reports/2026-11-26-measurements.md).
    Normalisation is the outer product of the 1-D tile coverages, because the window is
    separable and the grid regular.
    """
    if image.dim() != 3:
        raise ValueError("image must be (C, h, w)")
    C, h, w = image.shape
    g = TileGrid(h, w, tile, overlap)
    device = torch.device(device)
    win = (g.ramp[:, None] * g.ramp[None, :]).to(device)
    cols = torch.from_numpy(g.cols_ext())
    home = torch.device("cpu")  # where the image is cut and the maps are accumulated
    if device.type == "cuda" and image.numel() * 4 <= resident_bytes:
        home = device
        image, cols = host_to_device(image, device), cols.to(device)
    # the rows of every tile row, moved to where the image is once: a copy of a pageable CPU
    # index per strip would make the host wait for the GPU once per strip (43 times for a 4096² image)
    strip_rows = torch.from_numpy(np.stack([g.rows(y) for y in g.ys])).to(home)
    nx, W_ext = len(g.xs), g.width_ext
    maps: dict[str, Tensor] = {}
    vectors: dict[str, list[Tensor]] = {}
    # Several strips share one forward pass when a strip holds fewer tiles than a batch:
    # on a GPU, kernel launches, not arithmetic, bound small batches.
    per_group = max(1, batch // nx)
    for g0 in range(0, len(g.ys), per_group):
        ys = g.ys[g0 : g0 + per_group]
        tiles = torch.cat(
            [
                image[:, strip_rows[g0 + j]][:, :, cols]  # (C, tile, W_ext)
                .to(device=device, dtype=dtype, non_blocking=True)
                .unfold(2, tile, g.stride)
                .permute(2, 0, 1, 3)  # (nx, C, tile, tile)
                for j in range(len(ys))
            ]
        )
        outs: dict[str, list[Tensor]] = {}
        for b0 in range(0, len(tiles), batch):
            for k, v in fn(tiles[b0 : b0 + batch].contiguous()).items():
                outs.setdefault(k, []).append(v.detach().float())
        for k, parts in outs.items():
            v_all = torch.cat(parts)
            for j, y in enumerate(ys):
                v = v_all[j * nx : (j + 1) * nx]
                if v.dim() == 4 and v.shape[-2:] == (tile, tile):
                    r0 = y - g.margin  # image row of the strip's first row
                    ty0, ty1 = max(0, -r0), min(tile, h - r0)
                    K = v.shape[1]
                    v = (v * win).permute(1, 2, 3, 0).reshape(1, K * tile * tile, nx)
                    row = F.fold(v, (tile, W_ext), (tile, tile), stride=(tile, g.stride))[0]  # (K, tile, W_ext)
                    row = row[:, ty0:ty1, g.margin : g.margin + w].to(home)
                    if k not in maps:
                        maps[k] = torch.zeros(K, h, w, device=home)
                    maps[k][:, r0 + ty0 : r0 + ty1] += row
                else:
                    vectors.setdefault(k, []).append(v.cpu())
        if progress is not None:
            progress(nx * len(ys))
    # the outer product made where the maps are: made on the CPU and copied, it cost a 4096x4096 image
    # a 67 MB pageable copy and a pass on one core (8 and 5 ms of 160 on an H200)
    norm = g.coverage(g.ys, h).to(home)[:, None] * g.coverage(g.xs, w).to(home)[None, :]
    for k in maps:
        maps[k] = maps[k] / norm if keep_on_device else _to_cpu(maps[k] / norm)
    grids = {k: torch.cat(v).reshape(*g.shape, *v[0].shape[1:]) for k, v in vectors.items()}
    return maps, grids
