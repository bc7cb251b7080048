"""Image-level decomposition and denoising: the Python API behind the CLI.

    from indeed_cli import load_model, decompose, denoise
    ckpt = load_model()                       # bundled default, CPU or GPU
    out = denoise(ckpt, "noisy.png")          # float32 (C, h, w) in [0, 1]
    parts = decompose(ckpt, "noisy.png")      # Decomposed: L, S, N, mu_omega, ...

Inference uses the posterior means (A = mu_A, B = mu_B, S = mu_S).  The low-rank module
factorises overlapping tiles (:mod:`.tiling`), blended into mu_L; f_thetaS then runs on the
whole image (up to :data:`WHOLE_IMAGE_PIXELS`, :func:`reads_whole`) or per tile; the leaf
posteriors are recomputed in closed form.  Colour/gray mismatches between image and model:
:mod:`.channels`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ..io import LoadedImage, image_from_pil, read_image
from ..model import Checkpoint
from ..model import posteriors as P
from .channels import ChannelAdapter
from .runtime import InferenceOptions, network_for, resolve_precision
from .tiling import TileGrid, tile_means, tiled_apply

DECOMPOSE_MAPS = ("L", "S", "sigma_L", "sigma_S", "mu_omega", "mu_lambda")


@dataclass
class Decomposed:
    """Stitched posterior maps in [0, 1] scale plus per-tile statistics."""

    Y: np.ndarray
    maps: dict[str, np.ndarray]
    tiles: dict[str, np.ndarray] = field(default_factory=dict)

    def in_scale(self, scale: float) -> dict[str, np.ndarray]:
        """The npz arrays in input scale; N is defined so that L + S + N == Y."""
        Y = self.Y * scale
        L, S = self.maps["L"] * scale, self.maps["S"] * scale
        out = {
            "Y": Y,
            "L": L,
            "S": S,
            "N": Y - L - S,
            "sigma_L": self.maps["sigma_L"] * scale,
            "sigma_S": self.maps["sigma_S"] * scale,
            # precisions scale with 1/scale^2, Omega likewise
            "mu_omega": self.maps["mu_omega"] / scale**2,
            "mu_lambda": self.maps["mu_lambda"] / scale**2,
            "mu_gamma": self.tiles["mu_gamma"],
        }
        return {k: np.asarray(v, dtype=np.float32) for k, v in out.items()}

    def stats(self) -> dict:
        t = self.tiles
        n = t["rank_index"]
        return {
            "rank_index": float(np.median(n)),
            "rank_index_per_tile": n.reshape(n.shape[0], n.shape[1], -1).mean(-1).round(2).tolist(),
            "l_rank": float(t["l_rank"].mean()),
            "l_sparse": float(t["l_sparse"].mean()),
            "l_fid": float(t["l_fid"].mean()),
            "tiles": [int(n.shape[0]), int(n.shape[1])],
        }


def _lowrank_statistics(factors, priors, per_px: float, tiles: int, from_model, full: bool) -> dict[str, torch.Tensor]:
    """Per tile, from the posterior factors (mu_A, sigma_A, mu_B, sigma_B) of a batch of ``tiles``
    tiles: l_rank per element (a gray model's planes of a colour tile averaged) and, with ``full``,
    mu_L, sigma_L, mu_gamma, the rank index n and the components it counts.  Shared by the tiled
    and the whole-image read-outs, whose low-rank part is the same per-tile computation."""
    a_g, b_g = P.gamma_posterior(*factors, priors)
    mu_gamma = P.gamma_mean(a_g, b_g)
    out = {"l_rank": (P.rank_loss(*factors, mu_gamma) / per_px).reshape(tiles, -1).mean(1)}
    if full:
        mu_L, sigma_L = P.low_rank_moments(*factors)
        out.update(
            L=from_model(mu_L),
            sigma_L=from_model(sigma_L),
            mu_gamma=mu_gamma.reshape(tiles, -1, mu_gamma.shape[-1]),
            rank_index=P.rank_index(a_g, b_g).reshape(tiles, -1).float(),
            counted=P.rank_components(a_g, b_g).reshape(tiles, -1, mu_gamma.shape[-1]).float(),
        )
    return out


def tile_function(ckpt: Checkpoint, image_c: int, outputs: str, opts: InferenceOptions) -> Callable:
    """Per-tile function; ``outputs`` is "denoise" (L + S), "denoise+stats" (L + S and the per-tile
    l_rank, l_sparse that the OOD score reads), "sparse" (mu_S), "support" (q(z = 1) of f_thetaM)
    or "full" (all maps).
    Tiles stay fp32 at any precision: the network casts them where its weights are bf16."""
    model, priors = network_for(ckpt, opts.precision, opts.compile), ckpt.config.priors
    adapter = ChannelAdapter(ckpt.config.channels, image_c)
    to_model, from_model = adapter.to_model, adapter.from_model

    def fn(tiles: torch.Tensor) -> dict[str, torch.Tensor]:
        Y = to_model(tiles)
        d = model(Y, sample=False, with_support=outputs == "support").float()
        if outputs == "sparse":
            return {"S": from_model(d.mu_S)}
        if outputs == "support":
            if d.support_logit is None:
                raise ValueError("this model has no support posterior (f_thetaM)")
            # one probability per pixel: a gray model's per-channel ones on a colour image are averaged
            return {"P": from_model(torch.sigmoid(d.support_logit)).mean(1, keepdim=True)}
        X = d.L_hat + d.mu_S
        if outputs == "denoise":
            return {"X": from_model(X)}
        per_px = float(Y[0].numel())
        B = tiles.shape[0]
        full = outputs == "full"
        factors = (d.mu_A, d.sigma_A, d.mu_B, d.sigma_B)
        out = _lowrank_statistics(factors, priors, per_px, B, from_model, full)

        def per_tile(loss: torch.Tensor) -> torch.Tensor:  # gray-per-channel -> per tile
            return (loss / per_px).reshape(B, -1).mean(1)

        mu_omega = P.gamma_mean(*P.omega_posterior(d.mu_S, d.sigma_S, priors))
        out["l_sparse"] = per_tile(P.sparse_loss(d.mu_S, d.sigma_S, mu_omega))
        if not full:
            return {"X": from_model(X), **out}
        mu_lambda = P.gamma_mean(*P.lambda_posterior(Y - X, priors))
        out["l_fid"] = per_tile(P.fidelity_loss(Y, d.L_hat, d.mu_S, mu_lambda))
        return {
            **out,
            "S": from_model(d.mu_S),
            "sigma_S": from_model(d.sigma_S),
            "mu_omega": from_model(mu_omega),
            "mu_lambda": from_model(mu_lambda),
        }

    return fn


def as_image(image) -> tuple[np.ndarray, LoadedImage | None]:
    """An image as float32 (C, h, w) in [0, 1], and the LoadedImage it came from (None for arrays).

    Takes a path, a :class:`LoadedImage`, a PIL image, or an array: (h, w), (C, h, w) or (h, w, C)
    with C = 1, 3 or 4 (an alpha channel is left out), of floats in [0, 1] or of uint8 / uint16
    code values (divided by 255 / 65535).  (h, w, C) is recognised by C being last and small.
    """
    if isinstance(image, (str, Path)):
        loaded = read_image(image)
        return loaded.data, loaded
    if isinstance(image, LoadedImage):
        return image.data, image
    if isinstance(image, Image.Image):
        loaded = image_from_pil(image)
        return loaded.data, loaded
    arr = np.asarray(image)
    if arr.dtype == np.uint8 or arr.dtype == np.uint16:
        arr = arr.astype(np.float32) / (255.0 if arr.dtype == np.uint8 else 65535.0)
    elif arr.dtype.kind != "f":
        raise ValueError(f"image array must hold floats in [0, 1] or uint8 / uint16 values, not {arr.dtype}")
    arr = arr.astype(np.float32, copy=False)
    if arr.ndim == 2:
        arr = arr[None]
    elif arr.ndim == 3 and arr.shape[-1] in (1, 3, 4) and arr.shape[0] not in (1, 3):
        arr = np.ascontiguousarray(arr.transpose(2, 0, 1))
    if arr.ndim == 3 and arr.shape[0] in (2, 4):  # gray+alpha or RGBA: the alpha is not denoised
        arr = arr[:-1]
    if arr.ndim != 3 or arr.shape[0] not in (1, 3):
        raise ValueError(f"image array must be (h, w), (C, h, w) or (h, w, C) with C = 1, 3 or 4; got {arr.shape}")
    return arr, None


WHOLE_IMAGE_PIXELS = 1024 * 1024  # pixels (times the planes a gray model makes of colour) read out whole:
# a 2000x2000 gray image so peaked at 2.1 GB against 0.76 GB by tiles, for 45 s against 51 s (2-core CPU)


def reads_whole(ckpt: Checkpoint, data: np.ndarray, outputs: str, opts: InferenceOptions) -> bool:
    """Whether :func:`tile_function`'s ``outputs`` of ``data`` are read out with f_thetaS (and
    f_thetaM) on the whole image, mu_L still by tiles (docs/model.md, "Reading out a whole image").

    ``opts.whole_image`` decides when set.  By default: images of at most
    :data:`WHOLE_IMAGE_PIXELS`, except mu_S alone (the |mu_S| maps of detectors without f_thetaM,
    whose thresholds were learned by tiles) and compiled denoising (``opts.compile`` compiles the
    fixed-shape tile network)."""
    if opts.whole_image is not None:
        return opts.whole_image
    if outputs == "sparse" or (opts.compile and outputs != "support"):
        return False
    planes = data.shape[0] if ckpt.config.channels == 1 else 1
    return data.shape[1] * data.shape[2] * planes <= WHOLE_IMAGE_PIXELS


def _run(
    ckpt: Checkpoint,
    data: np.ndarray,
    outputs: str,
    opts: InferenceOptions,
    progress: Callable[[int], None] | None = None,
):
    device = next(ckpt.model.parameters()).device
    opts.check(ckpt.config.multiple)
    if reads_whole(ckpt, data, outputs, opts):
        return _run_whole(ckpt, data, outputs, opts, device, progress)
    fn = tile_function(ckpt, data.shape[0], outputs, opts)
    with torch.inference_mode():
        return tiled_apply(
            fn,
            torch.from_numpy(data),
            opts.tile,
            opts.overlap,
            opts.batch_for(device),
            device=device,
            progress=progress,
        )


def _pad_to_multiple(x: torch.Tensor, m: int) -> torch.Tensor:
    """(N, C, h, w) padded at the bottom and right to multiples of ``m``: reflected, or replicated
    where the padding is not shorter than the image."""
    h, w = x.shape[-2:]
    pad = (0, (-w) % m, 0, (-h) % m)
    return F.pad(x, pad, mode="reflect" if pad[1] < w and pad[3] < h else "replicate")


def _run_whole(
    ckpt: Checkpoint,
    data: np.ndarray,
    outputs: str,
    opts: InferenceOptions,
    device: torch.device,
    progress: Callable[[int], None] | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """:func:`_run` with f_thetaS (and f_thetaM) on the whole image, reflect-padded to the model's
    size multiple; the low-rank module still factorises each tile (mu_L, sigma_L and the per-tile
    gamma statistics stitched or gridded as by tiles).  f_thetaS and f_thetaM are U-Nets without
    normalisation, so the whole image is the same operator without tile seams and at a third of
    the work of overlapping tiles.  Per-tile ELBO terms of S and N are the means of their
    per-element summands over each tile's window (:func:`tile_means`): the same windows as by tiles."""
    if outputs not in ("denoise", "denoise+stats", "full", "support", "sparse"):
        raise ValueError(f"unknown outputs {outputs!r}")
    if outputs == "denoise":  # L + S alone: the batched read-out, of one image
        return {"X": _denoise_whole_batch(ckpt, data[None], opts, device, progress)[0]}, {}
    net, priors = network_for(ckpt, opts.precision), ckpt.config.priors
    if outputs == "support" and net.support is None:
        raise ValueError("this model has no support posterior (f_thetaM)")
    adapter = ChannelAdapter(ckpt.config.channels, data.shape[0])
    to_model, from_model = adapter.to_model, adapter.from_model
    stats, full = outputs in ("denoise+stats", "full"), outputs == "full"

    def lowrank_tiles(tiles: torch.Tensor) -> dict[str, torch.Tensor]:
        Y = to_model(tiles)
        factors = tuple(t.float() for t in net.lowrank(Y))
        if not stats:
            return {"L": from_model(P.low_rank(factors[0], factors[2]))}
        out = _lowrank_statistics(factors, priors, float(Y[0].numel()), tiles.shape[0], from_model, full)
        return out if full else {"L": from_model(P.low_rank(factors[0], factors[2])), **out}

    with torch.inference_mode():
        image = torch.from_numpy(data)
        batch = opts.batch_for(device)
        tiled, grids = tiled_apply(
            lowrank_tiles, image, opts.tile, opts.overlap, batch, device, progress=progress, keep_on_device=True
        )
        h, w = data.shape[1:]
        Y = _pad_to_multiple(to_model(image[None].to(device)), ckpt.config.multiple)
        L = _pad_to_multiple(to_model(tiled["L"][None].to(device)), ckpt.config.multiple)
        mu_S, sigma_S = net.sparse(Y - L, L)
        if outputs == "support":
            p = torch.sigmoid(net.support(Y, L, mu_S)).float()
            return {"P": from_model(p).mean(1)[:, :h, :w].cpu()}, {}
        Y, L, mu_S, sigma_S = (t[..., :h, :w].float() for t in (Y, L, mu_S, sigma_S))
        if outputs == "sparse":
            return {"S": from_model(mu_S)[0].cpu()}, {}
        X = L + mu_S
        maps = {"X": from_model(X)[0].cpu()}
        grid = TileGrid(h, w, opts.tile, opts.overlap)

        def per_tile(terms: torch.Tensor) -> torch.Tensor:  # (planes, C, h, w) summands -> per tile
            return tile_means(terms.mean((0, 1)), grid)

        mu_omega = P.gamma_mean(*P.omega_posterior(mu_S, sigma_S, priors))
        grids["l_sparse"] = per_tile(P.sparse_loss(mu_S, sigma_S, mu_omega, per_element=True))
        if not full:
            return maps, grids
        mu_lambda = P.gamma_mean(*P.lambda_posterior(Y - X, priors))
        grids["l_fid"] = per_tile(P.fidelity_loss(Y, L, mu_S, mu_lambda, per_element=True))
        maps = {
            "L": tiled["L"].cpu(),
            "S": from_model(mu_S)[0].cpu(),
            "sigma_L": tiled["sigma_L"].cpu(),
            "sigma_S": from_model(sigma_S)[0].cpu(),
            "mu_omega": from_model(mu_omega)[0].cpu(),
            "mu_lambda": from_model(mu_lambda)[0].cpu(),
        }
        return maps, grids


def _denoise_whole_batch(
    ckpt: Checkpoint,
    stack: np.ndarray,
    opts: InferenceOptions,
    device: torch.device,
    progress=None,
    on_device: bool = False,
) -> torch.Tensor:
    """L + S of B images of one size, (B, C, h, w) float32 -> (B, C, h, w) float32 CPU tensor (on
    ``device`` with ``on_device``): the
    whole-image "denoise" read-out (:func:`_run_whole` calls it with B = 1), each network call made
    once for all B images.  The images are stacked along the channel axis, so one tile grid cuts the
    same tile of every image and the low-rank module factorises them in one batch (it works per
    tile: the result is each image's own); f_thetaS then runs on the B whole images as one batch.
    On a GPU a read-out of a small image costs kernel launches more than arithmetic, so B images
    cost about what one does."""
    net = network_for(ckpt, opts.precision)
    adapter = ChannelAdapter(ckpt.config.channels, stack.shape[1])
    with torch.inference_mode():
        Y, L = _whole_lowrank(ckpt, net, adapter, stack, opts, device, progress)
        mu_S, _ = net.sparse(Y - L, L)
        return _whole_output(adapter, L, mu_S, stack.shape[-2:], on_device)


def _whole_lowrank(
    ckpt: Checkpoint, net, adapter: ChannelAdapter, stack: np.ndarray, opts: InferenceOptions, device, progress=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's inputs Y and mu_L of B images of one size ((B, C, h, w) float32), on ``device``,
    padded to the model's size multiple: the low-rank module of ``net`` on every tile of every image
    in one tiled run (the images stacked along the channel axis, as :func:`_denoise_whole_batch` says)."""
    B, C, h, w = stack.shape

    def lowrank_tiles(tiles: torch.Tensor) -> dict[str, torch.Tensor]:  # (n, B*C, t, t)
        n, t = tiles.shape[0], tiles.shape[-1]
        factors = net.lowrank(adapter.to_model(tiles.reshape(n * B, C, t, t)))
        L = adapter.from_model(P.low_rank(factors[0].float(), factors[2].float()))
        return {"L": L.reshape(n, B * C, t, t)}

    counted = (lambda k: progress(k * B)) if progress is not None else None
    batch = max(1, opts.batch_for(device) // B)  # tiles of every image: the network's batch stays as large
    tiled, _ = tiled_apply(
        lowrank_tiles,
        torch.from_numpy(stack.reshape(B * C, h, w)),
        opts.tile,
        opts.overlap,
        batch,
        device,
        progress=counted,
        keep_on_device=True,
    )
    Y = _pad_to_multiple(adapter.to_model(torch.from_numpy(stack).to(device)), ckpt.config.multiple)
    L = _pad_to_multiple(adapter.to_model(tiled["L"].reshape(B, C, h, w).to(device)), ckpt.config.multiple)
    return Y, L


def _whole_output(
    adapter: ChannelAdapter, L: torch.Tensor, mu_S: torch.Tensor, size, on_device: bool = False
) -> torch.Tensor:
    """X = mu_L + mu_S cropped to ``size`` (h, w), in the image's channels, float32 on the CPU (where
    it was computed with ``on_device``)."""
    h, w = size
    X = adapter.from_model(L[..., :h, :w].float() + mu_S[..., :h, :w].float())
    return X if on_device else X.cpu()


# Pixels of the images one grouped read-out (denoise_each) holds at once: 32 of 512 x 512, whose K
# copies of f_thetaS's activations take a few GB of a GPU's memory in fp32.
GROUPED_READOUT_PIXELS = 2**23


def denoise_each(
    ckpts: list[Checkpoint], images, opts: InferenceOptions | None = None, clip: bool = True
) -> list[np.ndarray]:
    """:func:`denoise` of each image with its own checkpoint (the plain read-out): the same numbers,
    up to the rounding of batched and grouped convolutions.

    InDeedOAG returns one checkpoint per image whose networks differ in f_thetaS alone
    (:meth:`~indeed_cli.model.InDeed.with_parameters` shares the low-rank module).  On a GPU in fp32,
    images of one size whose checkpoints share one low-rank module are read out together: the
    low-rank module once on all their tiles, and the K copies of f_thetaS as one network of grouped
    convolutions (:meth:`~indeed_cli.model.network.SparseModule.grouped`), up to
    GROUPED_READOUT_PIXELS pixels a call.  One by one, a 512 x 512 read-out cost about 10 ms of
    kernel launches and copies on a GPU (docs/reports/2026-11-28-oag-readout.md).  Other images
    (another device or precision, whole-image read-out off, other modules adapted) are read out one
    by one, as :func:`denoise` does."""
    opts = opts or InferenceOptions()
    data = [as_image(im)[0] for im in images]
    if len(ckpts) != len(data):
        raise ValueError(f"{len(ckpts)} checkpoints for {len(data)} images")
    out: list = [None] * len(data)
    together: dict[tuple, list[int]] = {}
    for i, (ck, d) in enumerate(zip(ckpts, data)):
        if _groups_readout(ck, d, opts):
            key = (id(ck.model.lowrank), id(ck.config), d.shape)
            together.setdefault(key, []).append(i)
        else:
            out[i] = _plain_batch(ck, [d], opts)[0]
    for members in together.values():
        h, w = data[members[0]].shape[1:]
        chunk = max(1, GROUPED_READOUT_PIXELS // (h * w))
        for c in range(0, len(members), chunk):
            part = members[c : c + chunk]
            X = _denoise_grouped([ckpts[i] for i in part], np.stack([data[i] for i in part]), opts).numpy()
            for i, x in zip(part, X):
                out[i] = x
    return [clip_in_place(x) if clip else x for x in out]


def _groups_readout(ckpt: Checkpoint, data: np.ndarray, opts: InferenceOptions) -> bool:
    """Whether :func:`denoise_each` may read ``data`` out with others in one grouped call."""
    device = next(ckpt.model.parameters()).device
    return (
        device.type == "cuda"
        and resolve_precision(opts.precision, device) == "fp32"
        and not opts.compile
        and data.shape[0] == ckpt.config.channels
        and reads_whole(ckpt, data, "denoise", opts)
        and ckpt.model.sparse.groupable()
    )


def _denoise_grouped(ckpts: list[Checkpoint], stack: np.ndarray, opts: InferenceOptions) -> torch.Tensor:
    """L + S of B images of one size, each with its own f_thetaS (the checkpoints share the low-rank
    module): (B, C, h, w) float32 -> (B, C, h, w) float32 CPU tensor."""
    first = ckpts[0]
    opts.check(first.config.multiple)
    device = next(first.model.parameters()).device
    adapter = ChannelAdapter(first.config.channels, stack.shape[1])
    modules = [ck.model.sparse for ck in ckpts]
    with torch.inference_mode():
        Y, L = _whole_lowrank(first, first.model, adapter, stack, opts, device)
        if all(m is modules[0] for m in modules):  # one network: a plain batch
            mu_S, _ = modules[0](Y - L, L)
        else:
            own = [dict(m.named_parameters()) for m in modules]
            weights = {n: torch.stack([p[n] for p in own]) for n in own[0]}
            mu_S, _ = modules[0].grouped((Y - L)[:, None], L[:, None], weights)
            mu_S = mu_S[:, 0]
        return _whole_output(adapter, L, mu_S, stack.shape[-2:])


def _plain_batch(
    ckpt: Checkpoint, data: list[np.ndarray], opts: InferenceOptions, progress=None, on_device: bool = False
) -> list[np.ndarray] | list[torch.Tensor]:
    """L + S (not clipped) of (C, h, w) images: those of one size read out together
    (:func:`_denoise_whole_batch`) where :func:`reads_whole` holds for them, at most
    :data:`WHOLE_IMAGE_PIXELS` pixels per call (a whole image's memory); the others one by one.
    Arrays, or with ``on_device`` tensors left on the model's device (for work that continues there)."""
    opts.check(ckpt.config.multiple)
    device = next(ckpt.model.parameters()).device
    out: list = [None] * len(data)
    by_size: dict[tuple, list[int]] = {}
    for i, d in enumerate(data):
        if reads_whole(ckpt, d, "denoise", opts):
            by_size.setdefault(d.shape, []).append(i)
        else:
            X = _run(ckpt, d, "denoise", opts, progress)[0]["X"]
            out[i] = X.to(device) if on_device else X.numpy()
    for (C, h, w), members in by_size.items():
        planes = C if ckpt.config.channels == 1 else 1
        chunk = max(1, WHOLE_IMAGE_PIXELS // (h * w * planes))
        for c in range(0, len(members), chunk):
            part = members[c : c + chunk]
            X = _denoise_whole_batch(ckpt, np.stack([data[i] for i in part]), opts, device, progress, on_device)
            for i, x in zip(part, X if on_device else X.numpy()):
                out[i] = x
    return out


def n_tiles(h: int, w: int, opts: InferenceOptions, pixel_shuffle: int | str = 1, ensemble: int = 1) -> int:
    """Tiles one inference of an h x w image runs (for progress bars); with a pixel shuffle (s > 1
    or "auto", counted as 2), those of the plain read-out and of the s x s sub-images; with an
    ensemble, those of each flipped or turned image (a quarter turn reads out a w x h image)."""
    if ensemble > 1:
        return sum(
            n_tiles(*((h, w) if DIHEDRAL[k][1] % 2 == 0 else (w, h)), opts, pixel_shuffle) for k in range(ensemble)
        )
    s = 2 if pixel_shuffle == "auto" else int(pixel_shuffle)
    whole = len(TileGrid(h, w, opts.tile, opts.overlap))
    if s == 1:
        return whole
    sizes = [(-(-(h - i) // s), -(-(w - j) // s)) for i in range(s) for j in range(s)]  # ceil((h - i) / s)
    return whole + sum(len(TileGrid(a, b, opts.tile, opts.overlap)) for a, b in sizes)


MAX_PIXEL_SHUFFLE = 4
# The pixel-shuffle read-out keeps the plain one where the two disagree by more than GUARD_FACTOR times
# their median local disagreement (mean squared difference over GUARD_WINDOW x GUARD_WINDOW pixels):
# there the sub-images have aliased fine structure.  Chosen on development crops (window 9 or 17,
# factor 2, 4 or 8); held out: light camera noise +0.25 dB over the unguarded read-out, clean images
# +1.5, heavy -0.01 (docs/reports/2026-11-27-pixel-shuffle.md, section 6).
GUARD_WINDOW = 9
GUARD_FACTOR = 4.0
# "auto": the pixel shuffle (s = 2) runs where the noise the plain read-out removed has a lag-1
# correlation above this: Gaussian noise gave -0.06 to 0.00, heavy camera noise 0.13 to 0.38 (same report)
AUTO_CORRELATION = 0.15


@dataclass
class ShuffledReadout:
    """What :func:`pixel_shuffle_denoise` returns: L + S (not clipped), the stride it used (1: the
    plain read-out, kept by "auto"), and the lag-1 correlation of the noise the plain read-out removed
    (computed for "auto", else None)."""

    image: np.ndarray
    stride: int
    noise_correlation: float | None = None


def check_pixel_shuffle(value) -> int | str:
    """``value`` as a pixel-shuffle setting (1 to MAX_PIXEL_SHUFFLE, or "auto"); ValueError otherwise."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        stride = int(value)
    except (TypeError, ValueError):
        stride = 0
    if not 1 <= stride <= MAX_PIXEL_SHUFFLE or str(value).strip() not in (str(stride), f"{stride}.0"):
        raise ValueError(f"pixel shuffle must be 1 to {MAX_PIXEL_SHUFFLE} or auto, got {value!r}")
    return stride


def _batch_of_one(a: np.ndarray, dtype=None) -> torch.Tensor:
    """A (C, h, w) array as a (1, C, h, w) CPU tensor (copied where it is not contiguous or writable)."""
    a = np.ascontiguousarray(a, dtype=dtype)
    return torch.from_numpy(a if a.flags.writeable else a.copy())[None]


def removed_noise_correlation(noisy: np.ndarray, plain: np.ndarray) -> float:
    """Lag-1 correlation coefficient of Y - (L + S), along rows and columns pooled: about 0 for
    Gaussian noise, positive for demosaiced camera noise (and for image structure a read-out removes).
    One (C, h, w) image; :func:`removed_noise_correlations` computes it."""
    return float(removed_noise_correlations(_batch_of_one(noisy), _batch_of_one(plain))[0])


def removed_noise_correlations(noisy: torch.Tensor, plain: torch.Tensor) -> torch.Tensor:
    """:func:`removed_noise_correlation` of each of B images, (B, C, h, w) tensors on any device (the
    same device as ``noisy``, float64 sums) -> (B,) float64: so the recorrupted adaptation's gate is
    computed where its read-outs were made."""
    n = noisy.double() - plain.double()
    n = n - n.mean(dim=(2, 3), keepdim=True)

    def dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * b).sum(dim=(1, 2, 3))

    right, left, down, up = n[..., 1:], n[..., :-1], n[..., 1:, :], n[..., :-1, :]
    num = dot(right, left) + dot(down, up)
    den = (dot(right, right) * dot(left, left)).sqrt() + (dot(down, down) * dot(up, up)).sqrt()
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.zeros_like(num))


def _local_mean(x: torch.Tensor, window: int) -> torch.Tensor:
    """Mean over window x window neighbourhoods of each (h, w) plane of a (B, h, w) tensor,
    reflect-padded (replicated where the image is smaller than the window), as two one-dimensional
    means (a ninth of the 2-D window's additions for 9 x 9: 4 instead of 8 ms per 512 x 512 plane on
    a 2-core CPU)."""
    pad = window // 2
    mode = "reflect" if min(x.shape[-2:]) > pad else "replicate"
    t = F.pad(x[:, None], (pad,) * 4, mode=mode)
    return F.avg_pool2d(F.avg_pool2d(t, (window, 1), 1), (1, window), 1)[:, 0]


def _median(x: torch.Tensor) -> torch.Tensor:
    """The median of each row of a (B, n) tensor, the mean of the two middle values for even n (as
    numpy's)."""
    n = x.shape[-1]
    upper = x.kthvalue(n // 2 + 1, -1).values
    return upper if n % 2 else (x.kthvalue(n // 2, -1).values + upper) / 2


def pixel_shuffle_guard(plain: np.ndarray, shuffled: np.ndarray) -> np.ndarray:
    """The shuffled read-out where it agrees with the plain one, the plain one where they disagree by
    more than GUARD_FACTOR x the image's median local disagreement, blended over GUARD_WINDOW pixels.
    One (C, h, w) image; :func:`pixel_shuffle_guards` computes it."""
    return pixel_shuffle_guards(_batch_of_one(plain, np.float32), _batch_of_one(shuffled, np.float32))[0].numpy()


def pixel_shuffle_guards(plain: torch.Tensor, shuffled: torch.Tensor) -> torch.Tensor:
    """:func:`pixel_shuffle_guard` of each of B images, (B, C, h, w) float32 tensors on any device."""
    disagreement = _local_mean((plain - shuffled).square().mean(1), GUARD_WINDOW)
    threshold = GUARD_FACTOR * _median(disagreement.flatten(1))
    keep = (disagreement <= threshold[:, None, None]).float()
    weight = _local_mean(keep, GUARD_WINDOW)[:, None]
    return weight * shuffled + (1.0 - weight) * plain


GUARD_PIXELS = 2**24  # pixels of the images guarded in one call on the model's device (16 of 1024 x 1024)


def _stacked(items: list, device: torch.device) -> torch.Tensor:
    """Arrays or tensors of one shape as one tensor on ``device``."""
    if all(torch.is_tensor(x) for x in items):
        return torch.stack([x.to(device) for x in items])
    return torch.from_numpy(np.stack([np.asarray(x) for x in items])).to(device)


def guarded_readouts(
    device: torch.device, plain: list[np.ndarray], shuffled: list[np.ndarray], images: list[np.ndarray] | None = None
):
    """:func:`pixel_shuffle_guards` of each pair of (C, h, w) read-outs, computed on ``device`` (the
    model's: on a GPU the guard of a 512 x 512 image costs a fraction of a millisecond, on a 2-core host
    25 ms, more than the GPU's read-outs of the image) for the images of one size together, at most
    GUARD_PIXELS pixels at a time.  Yields (indices, X) per such run, X the guarded read-outs (B, C, h, w),
    not clipped, on ``device``; with ``images`` (the noisy inputs), (indices, X, Y), Y their stack there."""
    by_size: dict[tuple, list[int]] = {}
    for i, p in enumerate(plain):
        by_size.setdefault(p.shape, []).append(i)
    for (_, h, w), members in by_size.items():
        step = max(1, GUARD_PIXELS // (h * w))
        for c in range(0, len(members), step):
            part = members[c : c + step]
            P, S = (_stacked([a[i] for i in part], device) for a in (plain, shuffled))
            X = pixel_shuffle_guards(P, S)
            if images is None:
                yield part, X
            else:
                yield part, X, torch.from_numpy(np.stack([images[i] for i in part])).to(device)


def pixel_shuffle_fits(height: int, width: int, stride: int | str) -> bool:
    """Whether an image of that size has sub-images of at least 2 x 2 pixels at ``stride`` ("auto"
    and 1 always fit: auto keeps the plain read-out where stride 2 does not)."""
    return stride in (1, "auto") or min(height, width) >= 2 * int(stride)


def _check_fits(data: np.ndarray, stride: int | str) -> None:
    """ValueError where a (C, h, w) image is too small for the pixel shuffle ("auto" always fits:
    it keeps the plain read-out where stride 2 does not)."""
    if not pixel_shuffle_fits(*data.shape[1:], stride):
        raise ValueError(f"an image of {data.shape[1]}x{data.shape[2]} is too small for a pixel shuffle of {stride}")


def _auto_stride(data: np.ndarray, plain: np.ndarray, opts: InferenceOptions, progress=None) -> tuple[int, float]:
    """The stride "auto" reads ``data`` out with, and the correlation it was decided by: 2 where the
    noise the plain read-out removed is correlated (above AUTO_CORRELATION) and stride 2 fits, else
    1 (then the sub-images' share of a progress bar is counted as done)."""
    correlation = removed_noise_correlation(data, plain)
    stride = 2 if correlation > AUTO_CORRELATION and pixel_shuffle_fits(*data.shape[1:], 2) else 1
    if stride == 1:
        _skip_sub_images(data, opts, progress)
    return stride, correlation


def _skip_sub_images(data: np.ndarray, opts: InferenceOptions, progress=None) -> None:
    """Count the sub-images' share of a progress bar as done for a (C, h, w) image that "auto" reads
    out plain (:func:`n_tiles` counts "auto" as stride 2)."""
    if progress is not None:
        progress(n_tiles(*data.shape[1:], opts, 2) - n_tiles(*data.shape[1:], opts))


def shuffled_readouts(
    ckpt: Checkpoint,
    images: list[np.ndarray],
    stride: int,
    opts: InferenceOptions,
    progress=None,
    on_device: bool = False,
) -> list[np.ndarray] | list[torch.Tensor]:
    """The stride x stride sub-images of each (C, h, w) image, each denoised on its own and put back
    in place, not clipped, before :func:`pixel_shuffle_guard`; the sub-images of all the images
    are read out together where they have one size (:func:`denoise_batch`).  Arrays, or with
    ``on_device`` tensors put together on the model's device (:func:`_plain_batch`)."""
    k2 = stride * stride
    subs = [np.ascontiguousarray(d[:, k // stride :: stride, k % stride :: stride]) for d in images for k in range(k2)]
    read = _plain_batch(ckpt, subs, opts, progress, on_device)
    device = next(ckpt.model.parameters()).device
    outs = []
    for n, d in enumerate(images):
        out = torch.empty(d.shape, device=device) if on_device else np.empty_like(d)
        for k in range(k2):
            out[:, k // stride :: stride, k % stride :: stride] = read[n * k2 + k]
        outs.append(out)
    return outs


def pixel_shuffle_denoise(
    ckpt: Checkpoint,
    image,
    stride: int | str = 2,
    opts: InferenceOptions | None = None,
    progress=None,
    plain: np.ndarray | None = None,
) -> ShuffledReadout:
    """L + S read out on the stride x stride pixel-shuffled sub-images of ``image``, each denoised on its
    own and put back in place, then guarded by the plain read-out (:func:`pixel_shuffle_guard`);
    docs/model.md, "Pixel-shuffle read-out".  ``stride`` "auto": 2 where the noise the plain read-out
    removed is correlated (above AUTO_CORRELATION), else the plain read-out.  ``plain``: the plain
    read-out of ``image`` if already computed (not clipped).

    Real camera noise is correlated between neighbouring pixels (demosaicing spreads each sensor
    pixel's noise over its neighbours), which the model's white noise N does not describe, so it
    reads much of that noise as signal; in a sub-image of every second pixel (one Bayer phase) the
    noise is close to white again.  The price is fine detail: structure near the pixel pitch aliases
    in the sub-images, which the guard gives back to the plain read-out."""
    stride = check_pixel_shuffle(stride)
    data, _ = as_image(image)
    opts = opts or InferenceOptions()
    _check_fits(data, stride)
    if plain is None:
        plain = _run(ckpt, data, "denoise", opts, progress)[0]["X"].numpy()
    correlation = None
    if stride == "auto":
        stride, correlation = _auto_stride(data, plain, opts, progress)
    if stride == 1:
        return ShuffledReadout(plain, 1, correlation)
    out = shuffled_readouts(ckpt, [data], stride, opts, progress)[0]
    device = next(ckpt.model.parameters()).device
    ((_, X),) = guarded_readouts(device, [plain], [out])
    return ShuffledReadout(X[0].cpu().numpy(), stride, correlation)


def denoise(
    ckpt: Checkpoint,
    image,
    opts: InferenceOptions | None = None,
    progress=None,
    clip: bool = True,
    pixel_shuffle: int | str = 1,
    ensemble: int = 1,
) -> np.ndarray:
    """Denoised image L + S (posterior means), float32 (C, h, w), clipped to [0, 1] unless ``clip``
    is False (a posterior mean may leave [0, 1] slightly near black and white).

    ``pixel_shuffle`` s > 1 or "auto": the read-out of :func:`pixel_shuffle_denoise`, for real camera
    noise; s > 1 costs detail on other images.  ``ensemble`` 2, 4 or 8: the mean of the read-outs of
    that many flips and rotations of the image (:func:`ensemble_mean`), at that many times the cost."""
    ensemble = check_ensemble(ensemble)
    data, _ = as_image(image)
    first = pixel_shuffle_denoise(ckpt, data, pixel_shuffle, opts, progress)  # 1: the plain read-out
    out = ensemble_mean(ckpt, data, first, ensemble, opts, progress)
    return clip_in_place(out) if clip else out


def clip_in_place(x: np.ndarray) -> np.ndarray:
    """``x`` clipped to [0, 1] in place, on torch's threads (np.clip runs on one core: 14 ms for a
    4096x4096 colour image on a 2-core Xeon)."""
    torch.from_numpy(x).clamp_(0.0, 1.0)
    return x


# The eight flips and rotations of an image, (mirror left-right first, then quarter turns), ordered so
# that the first two and the first four are groups: identity, transpose, half turn, anti-transpose, then
# the mirror images of those.  A transpose exchanges the roles of A and B in L = A B^T, the half turn
# reverses both, so each transform of a rank-r image is rank r and the model sees a new set of tiles.
DIHEDRAL = ((False, 0), (True, 1), (False, 2), (True, 3), (True, 0), (False, 1), (True, 2), (False, 3))
ENSEMBLES = (1, 2, 4, 8)


def check_ensemble(value) -> int:
    """``value`` as an ensemble size (1, 2, 4 or 8); ValueError otherwise."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n not in ENSEMBLES or str(value).strip() != str(n):
        raise ValueError(f"ensemble must be 1, 2, 4 or 8, got {value!r}")
    return n


def dihedral(x: np.ndarray, k: int, inverse: bool = False) -> np.ndarray:
    """The k-th transform of DIHEDRAL applied to a (C, h, w) array, or its inverse."""
    mirror, turns = DIHEDRAL[k]
    if inverse:
        x = np.rot90(x, -turns, axes=(1, 2))
        return np.ascontiguousarray(x[:, :, ::-1] if mirror else x)
    return np.ascontiguousarray(np.rot90(x[:, :, ::-1] if mirror else x, turns, axes=(1, 2)))


def ensemble_mean(
    ckpt: Checkpoint,
    data: np.ndarray,
    first: ShuffledReadout,
    ensemble: int,
    opts: InferenceOptions | None = None,
    progress=None,
) -> np.ndarray:
    """The mean of the read-outs (L + S, not clipped) of the first ``ensemble`` transforms of DIHEDRAL
    of ``data``, each turned back; ``first`` is the read-out of ``data`` itself
    (:func:`pixel_shuffle_denoise`), whose stride the others use.  docs/model.md, Eq. (self-ensemble):
    a test-time mean over the symmetries of the image, not a change of the posterior; it averages out
    the part of the estimation error that depends on the orientation (tile grid, learned filters)."""
    if ensemble == 1:
        return first.image
    auto_plain = first.stride == 1 and first.noise_correlation is not None  # "auto" chose the plain read-out
    total = first.image.astype(np.float32, copy=True)
    for k in range(1, ensemble):
        moved = dihedral(data, k)
        if auto_plain:
            _skip_sub_images(moved, opts or InferenceOptions(), progress)
        total += dihedral(pixel_shuffle_denoise(ckpt, moved, first.stride, opts, progress).image, k, inverse=True)
    return total / np.float32(ensemble)


def denoise_batch(
    ckpt: Checkpoint,
    images,
    opts: InferenceOptions | None = None,
    clip: bool = True,
    pixel_shuffle: int | str = 1,
    progress=None,
    ensemble: int = 1,
) -> list[np.ndarray]:
    """:func:`denoise` of several images, a list of float32 (C, h, w) arrays: the same numbers
    (up to the rounding of batched convolutions), with the network called once for all images of
    one size (and, with ``pixel_shuffle``, once for all their sub-images).  On a GPU the read-out
    of a small image costs kernel launches more than arithmetic, so this is what to call with many
    small images.  ``pixel_shuffle`` as for :func:`denoise` ("auto" decides per image, on the image
    itself), ``ensemble`` too (each transform of all images read out together)."""
    stride = check_pixel_shuffle(pixel_shuffle)
    ensemble = check_ensemble(ensemble)
    opts = opts or InferenceOptions()
    data = [as_image(im)[0] for im in images]
    for d in data:  # before any read-out
        _check_fits(d, stride)
    plain = _plain_batch(ckpt, data, opts, progress)
    use: list[int] = []  # the images read out on their sub-images
    if stride != 1:
        use = [k for k, d in enumerate(data) if stride != "auto" or _auto_stride(d, plain[k], opts, progress)[0] == 2]
    s = 2 if stride == "auto" else stride
    device = next(ckpt.model.parameters()).device

    def readout(images: list[np.ndarray], plain: list[np.ndarray]) -> list[np.ndarray]:
        out = list(plain)
        if use:
            shuffled = shuffled_readouts(ckpt, [images[k] for k in use], s, opts, progress)
            for part, X in guarded_readouts(device, [plain[k] for k in use], shuffled):
                for i, x in zip(part, X.cpu().numpy()):
                    out[use[i]] = x
        return out

    out = readout(data, plain)
    for t in range(1, ensemble):  # ensemble_mean's sum, one transform of all images at a time
        moved = [dihedral(d, t) for d in data]
        if stride == "auto":
            for k in set(range(len(data))) - set(use):
                _skip_sub_images(moved[k], opts, progress)
        out = [
            a + dihedral(b, t, inverse=True)
            for a, b in zip(out, readout(moved, _plain_batch(ckpt, moved, opts, progress)))
        ]
    if ensemble > 1:
        out = [x / np.float32(ensemble) for x in out]
    return [clip_in_place(x) if clip else x for x in out]


def shuffled_residuals(
    ckpt: Checkpoint,
    images: list[np.ndarray],
    stride: int,
    opts: InferenceOptions | None = None,
    keep_on_device: bool = False,
) -> list[tuple[np.ndarray | torch.Tensor, float]]:
    """Per (C, h, w) image Y: the residual R = Y - X_ps of its pixel-shuffled read-out (X_ps what
    ``denoise_batch(ckpt, images, opts, pixel_shuffle=stride)`` gives, clipped) and R's lag-1
    correlation (:func:`removed_noise_correlation`).  The read-outs are made as denoise_batch makes
    them; the guard (:func:`guarded_readouts`), the residual and the correlation of the images of one
    size are computed on the model's device, together: the recorrupted adaptation's gate and noise
    estimate.
    ``keep_on_device``: each R a float32 tensor on the model's device instead of an array."""
    opts = opts or InferenceOptions()
    data = [as_image(im)[0] for im in images]
    for d in data:
        _check_fits(d, stride)
    # the read-outs stay on the model's device: through the host and back they had taken most of the
    # gate's time on a GPU (docs/reports/2026-12-06-oag-readouts-on-the-device.md)
    plain = _plain_batch(ckpt, data, opts, progress=None, on_device=True)
    shuffled = shuffled_readouts(ckpt, data, stride, opts, progress=None, on_device=True)
    device = next(ckpt.model.parameters()).device
    out: list = [None] * len(data)
    for members, X, Y in guarded_readouts(device, plain, shuffled, data):
        X = X.clamp_(0.0, 1.0)
        R = Y - X
        corr = removed_noise_correlations(Y, X).tolist()
        for i, r, c in zip(members, R if keep_on_device else R.cpu().numpy(), corr):
            out[i] = (r, c)
    return out


def denoise_with_stats(
    ckpt: Checkpoint, image, opts: InferenceOptions | None = None, progress=None
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """L + S (not clipped) and the per-tile ELBO terms ``l_rank`` and ``l_sparse`` (tiles_y, tiles_x),
    the features of the OOD score, for little more than :func:`denoise` costs."""
    data, _ = as_image(image)
    maps, grids = _run(ckpt, data, "denoise+stats", opts or InferenceOptions(), progress)
    return maps["X"].numpy(), {k: v.numpy() for k, v in grids.items()}


def sparse_mean(ckpt: Checkpoint, image, opts: InferenceOptions | None = None, progress=None) -> np.ndarray:
    """Posterior mean of S only, float32 (C, h, w): the input of anomaly maps."""
    data, _ = as_image(image)
    maps, _ = _run(ckpt, data, "sparse", opts or InferenceOptions(), progress)
    return maps["S"].numpy()


def support_probability(ckpt: Checkpoint, image, opts: InferenceOptions | None = None, progress=None) -> np.ndarray:
    """q(z = 1), the posterior probability that each pixel is in the support of S (f_thetaM of a
    detector that has one), float32 (h, w) in [0, 1]; a gray detector on a colour image reads each
    channel as a gray image and averages their probabilities.

    mu_L is computed by tiles (the low-rank module factorises each tile); f_thetaS and f_thetaM,
    local operators without normalisation, run on the whole image at once
    (``opts.whole_image``, by default for images of at most :data:`WHOLE_IMAGE_PIXELS`): a third
    of the work of overlapping tiles on a small image, and no tile seams (docs/model.md)."""
    data, _ = as_image(image)
    maps, _ = _run(ckpt, data, "support", opts or InferenceOptions(), progress)
    return maps["P"].numpy()[0]


def decompose(ckpt: Checkpoint, image, opts: InferenceOptions | None = None, progress=None) -> Decomposed:
    """Posterior maps of L, S, N and the leaf variables, stitched over tiles."""
    data, _ = as_image(image)
    maps, grids = _run(ckpt, data, "full", opts or InferenceOptions(), progress)
    return Decomposed(data, {k: v.numpy() for k, v in maps.items()}, {k: v.numpy() for k, v in grids.items()})
