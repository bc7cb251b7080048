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

import numpy as np
import torch

SPECTRUM_BLOCK = 32  # pixels: the blocks the cross-spectrum is averaged over
SPECTRUM_LAG = 6  # pixels: the noise's autocovariance is kept (tapered) up to this lag
ALPHA = 0.5  # Pang et al.'s recorruption strength


def noise_spectrum(residual: np.ndarray, block: int = SPECTRUM_BLOCK) -> np.ndarray:
    """Eq. (noise spectrum): the cross-spectral density of a (C, h, w) noise estimate, (C, C, block,
    block) complex, the mean of the cross-periodograms of its ``block`` x ``block`` blocks (each
    block's mean removed).  An image smaller than one block is used whole."""
    r = np.asarray(residual, dtype=np.float64)
    C, h, w = r.shape
    b = min(block, h, w)
    hb, wb = h // b, w // b
    t = r[:, : hb * b, : wb * b].reshape(C, hb, b, wb, b).transpose(1, 3, 0, 2, 4).reshape(-1, C, b, b)
    t = t - t.mean(axis=(2, 3), keepdims=True)
    F = np.fft.fft2(t)
    return np.einsum("nixy,njxy->ijxy", F, F.conj()) / (len(t) * b * b)


def spectrum_root(spectrum: np.ndarray, size: int, lag: int = SPECTRUM_LAG) -> torch.Tensor:
    """The Hermitian square root of ``spectrum`` (from :func:`noise_spectrum`) on a ``size`` x
    ``size`` frequency grid, (size, size, C, C) complex64: the filter that turns white noise into
    noise of that covariance.  The autocovariance is kept up to ``lag`` pixels with a cosine taper
    (the block estimate is noisy at long lags) and negative eigenvalues are set to 0."""
    C, _, b, _ = spectrum.shape
    cov = np.fft.ifft2(spectrum).real  # (C, C, b, b): autocovariance at circular lags
    lags = np.fft.fftfreq(b, 1 / b).round().astype(int)
    lag = min(lag, (size - 1) // 2, (b - 1) // 2)
    grid = np.zeros((C, C, size, size))
    for iy, ky in enumerate(lags):
        for ix, kx in enumerate(lags):
            if abs(ky) <= lag and abs(kx) <= lag:
                taper = np.cos(np.pi * ky / (2 * (lag + 1))) * np.cos(np.pi * kx / (2 * (lag + 1)))
                grid[:, :, ky % size, kx % size] = cov[:, :, iy, ix] * taper
    S = np.fft.fft2(grid).transpose(2, 3, 0, 1)  # (size, size, C, C)
    S = 0.5 * (S + np.conj(S.transpose(0, 1, 3, 2)))
    lam, V = np.linalg.eigh(S)
    root = np.einsum("xyik,xyk,xyjk->xyij", V, np.sqrt(np.clip(lam, 0, None)), V.conj())
    return torch.from_numpy(root.astype(np.complex64))


def correlated_noise(roots: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
    """One noise field per root: (n, C, size, size) float32 on ``roots``'s device, from ``roots``
    (n, size, size, C, C) (:func:`spectrum_root`, one per tile).  The white noise is drawn on the
    CPU from ``gen`` so that a seed gives the same noise on every device."""
    n, size, _, C, _ = roots.shape
    white = torch.randn(n, C, size, size, generator=gen).to(roots.device)
    W = torch.fft.fft2(white)
    Z = torch.einsum("nxyij,njxy->nixy", roots, W)
    return torch.fft.ifft2(Z).real.float()


def recorrupted_pair(Y: torch.Tensor, z: torch.Tensor, alpha: float = ALPHA) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (recorrupted pair): (Y + alpha z, Y - z / alpha), whose noises are independent when z has
    the noise's covariance."""
    return Y + alpha * z, Y - z / alpha


def recorrupted_loss(model, Y: torch.Tensor, z: torch.Tensor, alpha: float = ALPHA, bf16: bool = False) -> torch.Tensor:
    """Eq. (recorrupted objective) per tile: the mean squared difference between the output L + S
    of the recorrupted input and the other recorrupted copy, (n,) float32."""
    noisier, target = recorrupted_pair(Y, z, alpha)
    with torch.autocast(Y.device.type, dtype=torch.bfloat16, enabled=bf16):
        d = model(noisier, sample=False, with_support=False)
    X = (d.L_hat + d.mu_S).float()
    return (X - target).square().flatten(1).mean(1)
