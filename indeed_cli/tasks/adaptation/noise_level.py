"""The noise level of an image, estimated without the model: the bound of the discrepancy rule.

Adaptation stops once the removed part N = Y - L - S is larger than the noise the image carries
(the discrepancy principle, docs/model.md "When adaptation stops: the noise level"): past that
point the objective keeps improving by moving image detail into N.  The noise level must come
from the image alone, because the model misreads the noise it was not trained on (it leaves
camera noise in L + S, so its own residual is far below the noise).

Estimator: the variance of the pixels in small blocks is the noise variance where the image is
flat, and more where it has structure.  So the estimate is a low quantile of the block variances
(each channel's blocks, their mean removed), which needs some flat area; blocks with clipped
pixels are left out (clipping removes noise, and JPEG flattens saturated areas to zero variance).
Unlike the wavelet (MAD) estimator it sees noise correlated across neighbouring pixels (real
camera noise after demosaicking and processing), which a high-frequency band misses.
"""

from __future__ import annotations

import numpy as np
import torch

BLOCK = 8
QUANTILE = 25.0  # percent
MIN_BLOCKS = 16  # fewer unclipped blocks than this: the clipped ones are used as well


def block_noise_sigma(image: np.ndarray, block: int = BLOCK, quantile: float = QUANTILE, device=None) -> float:
    """Eq. (noise level), sigma_hat(Y) in docs/model.md.

    Noise standard deviation of a (C, h, w) image in [0, 1], in 8-bit units: the square root of
    the ``quantile``-th percentile of the unbiased variances of its ``block`` x ``block`` blocks,
    per channel, averaged over the channels.  0 for an image smaller than one block.  Computed on
    ``device`` (default the CPU; float64 variances, numpy's linear percentile)."""
    x = torch.from_numpy(np.ascontiguousarray(image, dtype=np.float32)).to(device or "cpu")
    C, h, w = x.shape
    h, w = h // block * block, w // block * block
    if h == 0 or w == 0:
        return 0.0
    t = x[:, :h, :w].reshape(C, h // block, block, w // block, block).permute(1, 3, 0, 2, 4)
    t = t.reshape(-1, C, block * block)  # (blocks, C, pixels)
    clipped = ((t >= 254.5 / 255) | (t <= 0.5 / 255)).flatten(1).any(1)
    if int((~clipped).sum()) >= MIN_BLOCKS:
        t = t[~clipped]
    var = t.double().var(dim=-1, correction=1)  # (blocks, C)
    return float(255 * torch.quantile(var, quantile / 100, dim=0).mean().sqrt())


def pooled_noise_sigma(images: list[np.ndarray], device=None) -> float:
    """The noise level of several images adapted together (InDeedAG): the root mean square of
    their estimates, as the RMS of N over evaluation tiles drawn from all of them pools them."""
    return float(np.sqrt(np.mean([block_noise_sigma(im, device=device) ** 2 for im in images]))) if images else 0.0
