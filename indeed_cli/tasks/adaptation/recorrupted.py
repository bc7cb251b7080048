"""InDeedOAG for correlated noise: the recorrupted-to-recorrupted objective (beyond the paper).

The paper's adaptation objective (Eq. active generalization loss) models the noise N as
independent from pixel to pixel.  Camera noise after demosaicking is not: the shipped models
leave much of it in L + S, and adapting them with the ELBO either changes nothing or smooths the
image away (docs/reports/2026-11-27-adaptation-heavy-noise.md).  Recorrupted-to-recorrupted
(Pang et al., "Recorrupted-to-Recorrupted: Unsupervised Deep Learning for Image Denoising",
CVPR 2021) needs only the noise's covariance: with z drawn from the noise's distribution,

    Y_hat = Y + alpha z,   Y_tilde = Y - z / alpha,

have independent noises (for Gaussian noise), so E ||X(Y_hat) - Y_tilde||^2 is the squared error
against the clean image plus a constant: a self-supervised denoising loss on the image itself.

The noise's covariance is taken from the image: the cross-spectrum of the residual of the
pixel-shuffled read-out (``inference.pixel_shuffle_denoise``), which sees correlated noise the
plain read-out leaves in place (on development crops under synthetic camera noise its RMS was
0.97-1.11 times the true noise's at the heavy level; docs/reports/2026-11-28-recorrupted-adaptation.md).
The noise is modelled as stationary: one cross-spectral density for the whole image (Eq. noise
spectrum in docs/model.md), from which z is drawn on each tile by filtering white noise.
"""

from __future__ import annotations

import torch

from .config import (
    FLAT_BLOCK,
    FLAT_MAX_ACTIVITY,
    FLAT_MIN_RATIO,
    FLAT_NOISE_LIKE,
    FLAT_SHARE,
    GRAY_LUMINANCE_MIN_LAG3,
    QUIET_BLOCK,
    QUIET_DRAW_BLOCKS,
    QUIET_DRAW_TILE,
    QUIET_MAX_CLIPPED,
    QUIET_MIN_BLOCKS,
    QUIET_MIN_USABLE,
    QUIET_QUANTILE,
)

SPECTRUM_BLOCK = 32  # pixels: the blocks the cross-spectrum is averaged over
SPECTRUM_LAG = 6  # pixels: the noise's autocovariance is kept (tapered) up to this lag
# the recorruption strength: Pang et al. train with 0.5; adapting to one image, alpha = 1 (the
# symmetric pair Y +- z) gained on every camera-noise level of the development crops and cost
# photographs without noise a little more (docs/reports/2026-11-28-recorrupted-adaptation.md, 15)
ALPHA = 1.0
GAIN_BINS = 16  # intensity bins of the noise's level per channel (Eq. signal-dependent noise)


def noise_spectrum(residual, block: int = SPECTRUM_BLOCK, device: torch.device | str | None = None) -> torch.Tensor:
    """Eq. (noise spectrum): the cross-spectral density of a (C, h, w) noise estimate (array or
    tensor), (C, C, block, block) complex128 on ``device`` (default: the tensor's, or the CPU), the
    mean of the cross-periodograms of its ``block`` x ``block`` blocks (each block's mean removed).
    An image smaller than one block is used whole."""
    r = torch.as_tensor(residual).to(device=device, dtype=torch.float64)
    C, h, w = r.shape
    b = min(block, h, w)
    hb, wb = h // b, w // b
    t = r[:, : hb * b, : wb * b].reshape(C, hb, b, wb, b).permute(1, 3, 0, 2, 4).reshape(-1, C, b, b)
    t = t - t.mean(dim=(2, 3), keepdim=True)
    F = torch.fft.fft2(t)
    return torch.einsum("nixy,njxy->ijxy", F, F.conj()) / (len(t) * b * b)


def spectrum_root(spectrum: torch.Tensor, size: int, lag: int = SPECTRUM_LAG) -> torch.Tensor:
    """The Hermitian square root of ``spectrum`` (from :func:`noise_spectrum`) on a ``size`` x
    ``size`` frequency grid, (size, size, C, C) complex64 on the spectrum's device: the filter that
    turns white noise into noise of that covariance.  The autocovariance is kept up to ``lag`` pixels
    with a cosine taper (the block estimate is noisy at long lags) and negative eigenvalues are set
    to 0.  A stack of spectra (n, C, C, b, b) gives a stack of roots (n, size, size, C, C)."""
    b = spectrum.shape[-1]
    cov = torch.fft.ifft2(spectrum).real  # (..., C, C, b, b): autocovariance at circular lags
    lag = min(lag, (size - 1) // 2, (b - 1) // 2)
    k = torch.arange(-lag, lag + 1, device=spectrum.device)
    taper = torch.cos(torch.pi * k / (2 * (lag + 1))).to(cov.dtype)
    grid = cov.new_zeros(*cov.shape[:-2], size, size)
    grid[..., (k % size)[:, None], (k % size)[None, :]] = cov[..., (k % b)[:, None], (k % b)[None, :]] * (
        taper[:, None] * taper[None, :]
    )
    S = torch.fft.fft2(grid).movedim((-4, -3), (-2, -1))  # (..., size, size, C, C)
    S = 0.5 * (S + S.conj().transpose(-1, -2))
    C = S.shape[-1]
    # the C x C eigenproblems EIGH_AT_ONCE at a time: a GPU's batched solver asked for 464 GiB of
    # workspace for the 32 x 128 x 128 problems of one OAG group at once (NVIDIA H100, 2026-12-07)
    parts = _eigh_in_runs(S.reshape(-1, C, C), EIGH_AT_ONCE)
    lam = torch.cat([w for w, _ in parts]).reshape(S.shape[:-1])
    V = torch.cat([v for _, v in parts]).reshape(S.shape)
    root = (V * lam.clamp(min=0).sqrt().to(V.dtype)[..., None, :]) @ V.conj().transpose(-1, -2)
    return root.to(torch.complex64)


def _eigh_in_runs(problems: torch.Tensor, run: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``torch.linalg.eigh`` of (n, C, C) Hermitian ``problems``, ``run`` at a time; where the device runs out of
    memory, the run that failed and those after it in runs half as long (down to 1).  Even runs of 128 x 128
    problems asked a GPU for 16.57 GiB of workspace, which three processes sharing one NVIDIA H100 did not
    have (2026-12-07, docs/reports/2026-12-07-noise-presence.md, section 5); alone they fit.  On an H100 capped
    at 22 GiB the first run of a pass ran out and the rest went in halves, with the same mean PSNR over 32
    images (to 0.01 dB) as a pass without a retry (docs/reports/2026-12-08-oag-memory-cap-on-h100.md)."""
    parts, start = [], 0
    while start < len(problems):
        try:
            parts.append(torch.linalg.eigh(problems[start : start + run]))
        except torch.OutOfMemoryError:
            if run == 1:
                raise
            run = max(1, run // 2)
            continue
        start += len(parts[-1][0])
    return parts


# C x C eigenproblems solved in one call: those of one 128 x 128 filter, as each image's filter was made
# on its own until 2026-12-06 (the GPU runs of docs/results.md); the whole group's at once ran out of memory
# (and where a shared GPU has not room for these, _eigh_in_runs halves them)
EIGH_AT_ONCE = 128 * 128
# noise filters made together: their spectra and filters in batched calls, their eigenproblems as above
ROOTS_AT_ONCE = 64


def spectrum_roots(residuals: list, size: int, device: torch.device | str | None = None) -> list[torch.Tensor]:
    """:func:`spectrum_root` of each residual's :func:`noise_spectrum` (Eq. noise spectrum), the spectra
    of one shape up to ROOTS_AT_ONCE in one call (their eigenproblems EIGH_AT_ONCE at a time).  The same
    filters as one by one, up to the rounding of batched eigensolvers."""
    spectra = [noise_spectrum(r, device=device) for r in residuals]
    out: list = [None] * len(spectra)
    by_shape: dict[tuple, list[int]] = {}
    for i, sp in enumerate(spectra):
        by_shape.setdefault(tuple(sp.shape), []).append(i)
    for members in by_shape.values():
        for c in range(0, len(members), ROOTS_AT_ONCE):
            part = members[c : c + ROOTS_AT_ONCE]
            for i, root in zip(part, spectrum_root(torch.stack([spectra[i] for i in part]), size)):
                out[i] = root
    return out


def correlated_noise(roots: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
    """One noise field per root: (n, C, size, size) float32 on ``roots``'s device, from ``roots``
    (n, size, size, C, C) (:func:`spectrum_root`, one per tile).  The white noise is drawn from
    ``gen`` on its device (a seed gives the same noise on the same kind of device)."""
    n, size, _, C, _ = roots.shape
    device = gen.device if gen is not None else roots.device
    return coloured(roots, torch.randn(n, C, size, size, generator=gen, device=device))


def coloured(roots: torch.Tensor, white: torch.Tensor) -> torch.Tensor:
    """White noise ``white`` (n, C, size, size) filtered by ``roots`` (n, size, size, C, C): the
    noise of :func:`correlated_noise` for white noise drawn elsewhere (several generators at once)."""
    W = torch.fft.fft2(white.to(roots.device))
    Z = torch.einsum("nxyij,njxy->nixy", roots, W)
    return torch.fft.ifft2(Z).real.float()


def noise_gain(level_of, residual, bins: int = GAIN_BINS, device: torch.device | str | None = None) -> torch.Tensor:
    """Eq. (signal-dependent noise): the noise's standard deviation at each pixel relative to its
    RMS over the image, per channel, as a function of the intensity ``level_of`` (..., h, w; array
    or tensor: the pixel-shuffled read-out X_ps2 of one image (C, h, w) or of several of one size).
    The pixels of a channel are sorted by intensity into ``bins`` bins of equal count (fewer for
    images under 64 pixels a bin); the noise's level in a bin is a robust scale of ``residual``
    there (the median of |R| over 0.6745: detail in R moves it less than the RMS), placed at the
    bin's median intensity and interpolated linearly between bins (constant beyond the first and
    the last).  Medians are the lower ones (torch.median's).  The shape of ``level_of``, float32
    on ``device``, mean square 1 per channel."""
    x = torch.as_tensor(level_of).to(device=device, dtype=torch.float32)
    r = torch.as_tensor(residual).to(device=x.device, dtype=torch.float32).abs()
    shape = x.shape
    x, r = x.reshape(-1, shape[-2] * shape[-1]), r.reshape(-1, shape[-2] * shape[-1])
    n = x.shape[1]
    nb = max(1, min(bins, n // 64))
    values, order = torch.sort(x, dim=1)
    # the bins as torch.tensor_split cuts n sorted pixels: the first n % nb hold one more
    sizes = torch.full((nb,), n // nb, device=x.device)
    sizes[: n % nb] += 1
    ends = sizes.cumsum(0)
    mid = ends - sizes + (sizes - 1) // 2  # the lower median's position in each bin
    bin_of = torch.searchsorted(ends, torch.arange(n, device=x.device), right=True)
    # |R| sorted within each bin at once: the bin index plus |R| scaled into [0, 0.5] as one key
    rs = r.gather(1, order).double()
    top = rs.amax(1, keepdim=True).clamp(min=1e-30)
    key = torch.sort(bin_of.double() + 0.5 * rs / top, dim=1).values
    centre = values[:, mid]
    scale = ((key[:, mid] - torch.arange(nb, device=x.device)) * 2 * top).float().clamp(min=1e-6) / 0.6745
    if nb == 1:
        sd = scale.expand(-1, n)
    else:
        hi = torch.searchsorted(centre.contiguous(), x.contiguous()).clamp(1, nb - 1)
        x0, x1 = centre.gather(1, hi - 1), centre.gather(1, hi)
        t = ((x - x0) / (x1 - x0).clamp(min=1e-12)).clamp(0, 1)
        s0, s1 = scale.gather(1, hi - 1), scale.gather(1, hi)
        sd = s0 + t * (s1 - s0)
    return (sd / sd.square().mean(1, keepdim=True).sqrt()).reshape(shape)


def _median(v: torch.Tensor) -> torch.Tensor:
    """numpy's median of a 1-D tensor (the mean of the two middle values of an even count), by
    kthvalue, which has no input size limit (torch.quantile refuses more than 2**24 values)."""
    n = len(v)
    lo = torch.kthvalue(v, (n + 1) // 2).values
    return lo if n % 2 else (lo + torch.kthvalue(v, n // 2 + 1).values) / 2


def robust_noise_level(level_of, residual, bins: int = GAIN_BINS) -> float:
    """Eq. (robust noise level): the noise's RMS read robustly off a (C, h, w) ``residual`` R (array or
    tensor) whose pixels are sorted by the intensity ``level_of`` (the read-out X_ps2): per channel, the
    pixels in ``bins`` bins of equal count (numpy's array_split of the sorted order), in each bin the
    median of |R| over 0.6745 (a Gaussian's standard deviation from its median absolute value), and
    the count-weighted mean square of those; the square root of its mean over the channels.  Noise
    alone gives about R's RMS; detail in R has heavier tails than noise and moves the medians less than
    the RMS, so where R holds lost detail it is below the RMS (not down to the noise: on textured
    development crops it removed a fifth to a quarter of the excess,
    docs/reports/2026-12-04-recorruption-noise-level.md)."""
    x = torch.as_tensor(level_of).detach().double().reshape(len(level_of), -1)
    r = torch.as_tensor(residual).detach().to(x.device).double().abs().reshape(len(x), -1)
    squares = []
    for xc, rc in zip(x, r):
        parts = torch.tensor_split(torch.argsort(xc, stable=True), min(bins, len(xc)))
        med = torch.stack([_median(rc[p]) / 0.6745 for p in parts])
        count = torch.tensor([len(p) for p in parts], dtype=torch.float64, device=x.device)
        squares.append(float((med.square() * count).sum() / count.sum()))
    return float(sum(squares) / len(squares)) ** 0.5


def robust_level_scale(noisy, residual, bins: int = GAIN_BINS) -> float:
    """Eq. (robust noise level)'s factor on R: min(1, robust level / RMS of R), with the intensities
    of the read-out X_ps2 = Y - R (``noisy`` Y, (C, h, w))."""
    r = torch.as_tensor(residual).detach().double()
    rms = float(r.square().mean().sqrt())
    if rms <= 0:
        return 1.0
    level_of = torch.as_tensor(noisy).detach().to(r.device).double() - r
    return min(1.0, robust_noise_level(level_of, r, bins) / rms)


def image_blocks(a: torch.Tensor, block: int) -> torch.Tensor:
    """A (C, h, w) tensor's whole ``block`` x ``block`` blocks as a view (h // block, w // block, C, block,
    block), row by row: no copy of a large image."""
    hb, wb = a.shape[-2] // block, a.shape[-1] // block
    a = a[:, : hb * block, : wb * block]
    return a.unflatten(1, (hb, block)).unflatten(3, (wb, block)).permute(1, 3, 0, 2, 4)


def clipped_share(blocks: torch.Tensor, edge: float = 0.0) -> torch.Tensor:
    """Per block of :func:`image_blocks` (…, C, block, block): the share of its values within ``edge`` of 0
    or 1, where clipping removed the noise."""
    return ((blocks <= edge) | (blocks >= 1 - edge)).flatten(-3).float().mean(-1)


def quiet_level_scale(
    noisy,
    residual,
    quantile: float = QUIET_QUANTILE,
    block: int = QUIET_BLOCK,
    max_clipped: float = QUIET_MAX_CLIPPED,
    min_blocks: int = QUIET_MIN_BLOCKS,
    min_usable: float = QUIET_MIN_USABLE,
    seed: int = 0,
) -> float:
    """Eq. (quiet-block noise level)'s factor on a (C, h, w) residual R of ``noisy`` Y (arrays or tensors):
    over the ``block`` x ``block`` blocks k with at most ``max_clipped`` of Y's values at 0 or 1,

        v_k(a) = var_k(a) / mean_k(g^2),   q(a) = Q_quantile(v(a)) / mean(a^2),
        s = min(1, (q(R) / q(z))^(1/2)),

    g the level map of Eq. (signal-dependent noise) (intensities Y - R), var_k over the block's pixels and
    channels, z = g x noise of R's cross-spectrum (Eq. noise spectrum), one draw from ``seed``: the noise
    the recorrupted objective would draw, and so noise alone.  The noise is in every block at the level g
    gives it; detail that the pixel-shuffled read-out lost, which R also holds, sits in some blocks and
    raises their v, so the quieter blocks read the noise.  Noise alone reads a quantile under its mean
    too (the spread of the blocks' variances, larger the more the noise is correlated); q(z) is that
    quantile for noise of R's own covariance and level map, so that noise alone gives about 1.  Clipped
    blocks hold no noise and are left out.  1 where fewer than ``min_blocks`` blocks, or under
    ``min_usable`` of them, are usable (a few partly clipped blocks of a mostly clipped image read low),
    or where R is 0.  An image of more than QUIET_DRAW_BLOCKS blocks draws z for that many of its usable
    blocks (:func:`_sampled_noise_quantile`), not on its whole shape."""
    r = torch.as_tensor(residual).detach().double()
    y = torch.as_tensor(noisy).detach().to(r.device).float()  # float32: what noise_gain reads anyway
    hb, wb = r.shape[-2] // block, r.shape[-1] // block
    rms2 = float(r.square().mean())
    if hb * wb < min_blocks or rms2 <= 0:
        return 1.0
    g = noise_gain(y - r.float(), r, device=r.device)

    def blocks(a: torch.Tensor) -> torch.Tensor:  # (blocks, C * block * block)
        return image_blocks(a, block).flatten(-3).flatten(0, 1)

    expected = blocks(g).square().mean(1).double()
    usable = (clipped_share(image_blocks(y, block)).flatten() <= max_clipped) & (expected > 0)
    if int(usable.sum()) < max(min_blocks, min_usable * hb * wb):
        return 1.0
    v = blocks(r).var(1)[usable] / expected[usable]
    q_r = float(torch.quantile(v, quantile)) / rms2
    if hb * wb <= QUIET_DRAW_BLOCKS:  # the draw on the image's own shape
        z = g.double() * _noise_like(r, QUIET_DRAW_TILE, seed)
        v = blocks(z).var(1)[usable] / expected[usable]
        q_z = float(torch.quantile(v, quantile)) / float(z.square().mean())
    else:  # a large image: QUIET_DRAW_BLOCKS usable blocks drawn at random, each with its own noise block
        q_z = _sampled_noise_quantile(r, blocks(g)[usable], expected[usable], block, quantile, seed)
    return min(1.0, q_r / q_z) ** 0.5


def _noise_like(residual: torch.Tensor, tile: int, seed: int) -> torch.Tensor:
    """One draw of noise with the cross-spectrum of ``residual`` (C, h, w) (Eq. noise spectrum), on its
    shape and device, float64: independent ``tile`` x ``tile`` tiles of :func:`correlated_noise`."""
    C, h, w = residual.shape
    tile = min(tile, h, w)
    nh, nw = -(-h // tile), -(-w // tile)
    z = _noise_tiles(residual, tile, nh * nw, torch.Generator(residual.device).manual_seed(seed))
    return z.reshape(nh, nw, C, tile, tile).permute(2, 0, 3, 1, 4).reshape(C, nh * tile, nw * tile)[:, :h, :w]


def _noise_tiles(residual: torch.Tensor, tile: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` independent ``tile`` x ``tile`` tiles of noise with the cross-spectrum of ``residual`` (C, h, w)
    (Eq. noise spectrum; :func:`correlated_noise` from ``gen``), (n, C, tile, tile) float64."""
    root = spectrum_root(noise_spectrum(residual, device=residual.device), tile)
    return correlated_noise(root[None].expand(n, -1, -1, -1, -1), gen).double()


def _sampled_noise_quantile(
    residual: torch.Tensor, gains: torch.Tensor, expected: torch.Tensor, block: int, quantile: float, seed: int
) -> float:
    """q(z) of Eq. (quiet-block noise level) on QUIET_DRAW_BLOCKS of the usable blocks (``gains``: their
    level maps, (n, C * block * block); ``expected``: their mean g^2) drawn at random from ``seed``, each
    paired with a block of its own from one draw of noise of ``residual``'s cross-spectrum (the noise is
    stationary, so which block is which does not matter); its mean square is the noise's (g has mean
    square 1 per channel).  The full-image draw of a large image took gigabytes."""
    C = residual.shape[0]
    gen = torch.Generator(residual.device).manual_seed(seed)
    pick = torch.randperm(len(gains), generator=gen, device=residual.device)[:QUIET_DRAW_BLOCKS]
    per_tile = (QUIET_DRAW_TILE // block) ** 2
    tiles = -(-len(pick) // per_tile)
    w = _noise_tiles(residual, QUIET_DRAW_TILE, tiles, gen)  # (tiles, C, T, T)
    k = QUIET_DRAW_TILE // block
    w = w.reshape(tiles, C, k, block, k, block).permute(0, 2, 4, 1, 3, 5).reshape(tiles * per_tile, -1)
    w = w[: len(pick)]
    v = (gains[pick].double() * w).var(1) / expected[pick]
    return float(torch.quantile(v, quantile)) / float(w.square().mean())


def flat_blocks(
    noisy: torch.Tensor, residual: torch.Tensor, block: int, share: float, unclipped: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The ``share`` of a (C, h, w) image Y's ``block`` x ``block`` blocks where the read-out X = Y - R
    (R the gate's residual; tensors on one device) varies least: Y, R and X there, each (n, C, block,
    block) in float64.  ``unclipped``: of the blocks where under a tenth of Y's values are at 0 or 1
    (within half an 8-bit level; clipping removes the noise there, as in a saturated sky).  None for an
    image smaller than one block, or without such blocks."""
    C, h, w = noisy.shape
    hb, wb = h // block, w // block
    if hb * wb == 0:
        return None

    Yv, Xv = image_blocks(noisy, block), image_blocks(noisy - residual, block)
    # the blocks are ranked in the images' precision and only the chosen ones copied, in float64
    activity = Xv.var((-2, -1), unbiased=False).sum(-1).flatten()
    count = len(activity)
    if unclipped:
        clipped = clipped_share(Yv, edge=0.5 / 255).flatten() >= 0.1
        if bool(clipped.all()):
            return None
        activity = activity.masked_fill(clipped, float("inf"))  # ranked last, and not counted in the share
        count = int((~clipped).sum())
    chosen = torch.argsort(activity, stable=True)[: max(1, int(share * count))]
    rows, cols = chosen // wb, chosen % wb
    Yb, Rb, Xb = (b[rows, cols].double() for b in (Yv, image_blocks(residual, block), Xv))
    return Yb, Rb, Xb


def _lag_correlation_in_blocks(V: torch.Tensor, lag: int) -> torch.Tensor:
    """The correlation of (n, C, b, b) blocks, each about its own mean, with themselves ``lag`` pixels
    along rows and columns, pooled."""
    V = V - V.mean((-2, -1), keepdim=True)
    right, down = (V[..., lag:], V[..., :-lag]), (V[..., lag:, :], V[..., :-lag, :])
    return sum((a * b).sum() for a, b in (right, down)) / sum((a * a).sum() for a, _ in (right, down)).clamp_min(1e-300)


def flat_block_covariances(
    noisy: torch.Tensor, residual: torch.Tensor, block: int, share: float
) -> tuple[torch.Tensor, torch.Tensor, float, float] | None:
    """Eq. (flat-block channel covariance) of a (C, h, w) image Y and the gate's residual R (tensors on
    one device): in the ``share`` of its ``block`` x ``block`` blocks where the read-out X = Y - R
    varies least (:func:`flat_blocks`), the (C, C) covariance of Y about each block's mean, that of R,
    the read-out's mean variance there over the first's trace (how flat those blocks are), and the lag-2
    correlation of the read-out's variation there (along rows and columns pooled: about 0 for noise
    the read-out kept, high for smooth detail; float64).  None for an image smaller than one block."""
    found = flat_blocks(noisy, residual, block, share)
    if found is None:
        return None
    Yb, Rb, Xb = (b.flatten(-2) for b in found)
    D, E = (b - b.mean(-1, keepdim=True) for b in (Yb, Rb))
    count = D.shape[0] * D.shape[2]
    C_y, C_r = (torch.einsum("nip,njp->ij", a, a) / count for a in (D, E))
    lag2 = _lag_correlation_in_blocks(found[2], 2)
    kept = Xb.var(-1, unbiased=False).sum(-1).mean()
    return C_y, C_r, float(kept / C_y.trace().clamp_min(1e-300)), float(lag2)


def flat_block_correlation(
    noisy: torch.Tensor, residual: torch.Tensor, block: int = FLAT_BLOCK, share: float = FLAT_SHARE
) -> float | None:
    """Eq. (recorruption gate)'s second condition: the lag-1 correlation of the gate's residual R in the
    ``share`` of the blocks where the read-out varies least (:func:`flat_blocks`), each block about its
    mean, rows and columns pooled, among the blocks with under a tenth of their values clipped (a
    saturated sky is the flattest part of a photograph and holds no noise).  There R is noise, not lost
    detail: demosaicked camera noise keeps its correlation, white noise has none
    (config.R2R_MIN_FLAT_CORRELATION).  None for an image smaller than one block or clipped in every
    block."""
    found = flat_blocks(noisy, residual, block, share, unclipped=True)
    return None if found is None else float(_lag_correlation_in_blocks(found[1], 1))


def flat_block_recolour(
    noisy: torch.Tensor,
    residual: torch.Tensor,
    block: int = FLAT_BLOCK,
    share: float = FLAT_SHARE,
    max_activity: float = FLAT_MAX_ACTIVITY,
    min_ratio: float = FLAT_MIN_RATIO,
    noise_like: tuple[float, float] | None = FLAT_NOISE_LIKE,
) -> tuple[torch.Tensor, bool]:
    """Eq. (flat-block recolouring): the residual R (C, h, w) mapped by W = chol(C_y) chol(C_r)^-1, so
    that its channel covariance in the flattest blocks becomes Y's there (W C_r W^T = C_y), where those
    blocks are flat (activity at most ``max_activity``; or, with ``noise_like`` (a, c), at most a where
    the read-out's variation there has a lag-2 correlation of at most c: it is kept noise, not detail)
    and C_y's trace is at least ``min_ratio`` times C_r's; else R unchanged.  The defaults are the
    gate's (config.FLAT_*).  Colour images only (a gray image's R is returned as it is).  Returns
    (R', recoloured?)."""
    if noisy.shape[0] != 3:
        return residual, False
    stats = flat_block_covariances(noisy, residual, block, share)
    if stats is None:
        return residual, False
    C_y, C_r, activity, lag2 = stats
    flat = activity <= max_activity or (noise_like is not None and activity <= noise_like[0] and lag2 <= noise_like[1])
    if not (flat and float(C_y.trace()) >= min_ratio * float(C_r.trace()) > 0):
        return residual, False
    return recoloured(residual, C_r, C_y), True


def recoloured(residual: torch.Tensor, current: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The residual R (C, h, w) mapped by W = chol(target) chol(current)⁻¹, so that a channel
    covariance ``current`` becomes ``target`` (W current Wᵀ = target) and R's spatial structure stays."""
    eye = 1e-12 * torch.eye(current.shape[0], dtype=current.dtype, device=current.device)
    W = torch.linalg.cholesky(target + eye) @ torch.linalg.inv(torch.linalg.cholesky(current + eye))
    return (W.to(residual.dtype) @ residual.reshape(residual.shape[0], -1)).reshape(residual.shape)


def lag_correlation(image: torch.Tensor, lag: int) -> float:
    """The correlation of a (C, h, w) image about its mean with itself ``lag`` pixels along rows and
    columns, pooled (float64)."""
    a = image.double() - image.double().mean()
    pairs = (a[..., lag:] * a[..., :-lag]).sum() + (a[..., lag:, :] * a[..., :-lag, :]).sum()
    return float(pairs / (2 * a.square().sum()).clamp_min(1e-300))


def gray_luminance_recolour(
    residual: torch.Tensor, luminance_residual: torch.Tensor, min_lag3: float = GRAY_LUMINANCE_MIN_LAG3
) -> tuple[torch.Tensor, bool]:
    """Eq. (gray-luminance recolouring): the gate's residual R (3, h, w) given the luminance variance
    that the gray model's pixel-shuffled read-out of the image's luminance (the channels' mean) left
    in its residual r (1, h, w), σ_g², where that is more than R's own luminance variance
    σ_ℓ² = 1ᵀ C_R 1 / 9 and r's lag-3 correlation is at least ``min_lag3`` (lower: r alternates with
    the stride-3 sub-images, detail the read-out lost, not noise): R ← chol(C) chol(C_R)⁻¹ R with
    C = C_R + (σ_g² − σ_ℓ²) 1 1ᵀ, which adds the missing variance along the grey direction and keeps
    R's spatial structure.  Returns (R', recoloured?)."""
    if residual.shape[0] != 3:
        return residual, False
    r = luminance_residual.double()
    sigma_g2 = float((r - r.mean()).square().mean())
    R = residual.reshape(3, -1).double()
    R = R - R.mean(1, keepdim=True)
    C_r = R @ R.T / R.shape[1]
    one = torch.ones(3, dtype=C_r.dtype, device=C_r.device)
    sigma_l2 = float(one @ C_r @ one) / 9
    if sigma_g2 <= sigma_l2 or lag_correlation(r, 3) < min_lag3:
        return residual, False
    return recoloured(residual, C_r, C_r + (sigma_g2 - sigma_l2) * torch.outer(one, one)), True


def recorrupted_pair(Y: torch.Tensor, z: torch.Tensor, alpha: float = ALPHA) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (recorrupted pair): (Y + alpha z, Y - z / alpha), whose noises are independent when z has
    the noise's covariance."""
    return Y + alpha * z, Y - z / alpha


def recorrupted_objective(X: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Eq. (recorrupted objective) per tile: the mean squared difference between the output L + S
    ``X`` of the recorrupted input Y + alpha z and the other recorrupted copy ``target`` = Y - z / alpha
    (:func:`recorrupted_pair`), one value per leading index (..., C, h, w) -> (...,), float32."""
    return (X.float() - target).square().flatten(-3).mean(-1)
