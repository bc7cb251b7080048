"""Per image, after InDeedAG: the adapted output or the plain one (docs/model.md, "Which images
keep InDeedAG's output").

One adaptation serves a whole folder, so it cannot stop for one image; what it can do is leave an
image's plain output in place.  The rule reads how much the adaptation changed the image against
how much the plain model removed from it: where the plain model missed the noise (it removed
little) and the adapted one removes much more, the adaptation found noise; where the plain model
already removed noise and the adaptation changes a little more, that change is as likely detail
as noise, and on development data it cost up to 6 dB on single images.  And, as OAG's stopping
rule does, the adapted output may remove no more than the noise the image carries (the
discrepancy principle): where a shared adaptation removed several times the image's noise level
it had smoothed the image (up to -1.3 dB on single PolyU crops).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ...inference import InferenceOptions, as_image, denoise_with_stats
from ...model import Checkpoint
from ..noise_presence import noise_found
from .config import AdaptResult
from .noise_level import block_noise_sigma


def _rms(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(np.asarray(a, np.float64) - b))))


def change_ratio(noisy: np.ndarray, plain: np.ndarray, adapted: np.ndarray) -> float:
    """Eq. (AG image choice), rho: RMS(adapted - plain) / RMS(noisy - plain) over the image; inf
    where the plain output equals the input."""
    moved, removed = _rms(adapted, plain), _rms(noisy, plain)
    return moved / removed if removed > 0 else float("inf")


@dataclass
class ImageChoice:
    adapted: bool  # the adapted output was kept
    ratio: float  # Eq. (AG image choice), rho; nan where not computed (both bounds 0)
    removed: float  # RMS(Y - adapted output) over the noise level sigma_hat(Y); nan where not computed
    output: np.ndarray  # the kept output L + S, (C, h, w), not clipped (denoise_with_stats)
    stats: dict[str, np.ndarray]  # its per-tile l_rank and l_sparse (denoise_with_stats)


def removed_over_noise(noisy: np.ndarray, adapted: np.ndarray) -> float:
    """Eq. (AG image choice), second condition: RMS(noisy - adapted) in 8-bit units over the noise
    level sigma_hat(noisy) of Eq. (noise level); inf where sigma_hat is 0."""
    removed = 255 * _rms(noisy, adapted)
    sigma = block_noise_sigma(noisy)
    return removed / sigma if sigma > 0 else float("inf")


def choose_output(
    base: Checkpoint,
    adapted: Checkpoint,
    image,
    min_ratio: float,
    noise_bound: float = 0.0,
    opts: InferenceOptions | None = None,
) -> ImageChoice:
    """The adapted model's output of ``image`` where its change ratio is at least ``min_ratio`` and
    it removed at most ``noise_bound`` times the image's noise level, else the plain model's (a
    bound of 0 is no condition; with both 0 the plain output is not computed); ``image``: an array
    (C, h, w) in [0, 1], a read image or anything :func:`~indeed_cli.inference.as_image` takes."""
    opts = opts or InferenceOptions()
    data, _ = as_image(image)  # once: a path is read once for both read-outs
    out, stats = denoise_with_stats(adapted, data, opts)
    if min_ratio <= 0 and noise_bound <= 0:
        return ImageChoice(True, float("nan"), float("nan"), out, stats)
    plain, plain_stats = denoise_with_stats(base, data, opts)
    ratio, removed = change_ratio(data, plain, out), removed_over_noise(data, out)
    if ratio >= min_ratio and (noise_bound <= 0 or removed <= noise_bound):
        return ImageChoice(True, ratio, removed, out, stats)
    return ImageChoice(False, ratio, removed, plain, plain_stats)


def ag_image_result(
    base: Checkpoint,
    shared: AdaptResult,
    image,
    used: bool,
    score: float | None,
    min_ratio: float,
    noise_bound: float = 0.0,
    opts: InferenceOptions | None = None,
    fallback_used: bool = False,
    noise_score: float | None = None,
) -> tuple[AdaptResult, ImageChoice | None]:
    """InDeedAG's result for one image of the folder ``shared`` was adapted on: whose weights give
    its output, and the per-image choice where one was made (its ``output`` is then that output).

    ``used``: the adaptation used the image (decide="ood", the recorrupted objective's gate);
    ``score``: its OOD score.  After the ELBO, :func:`choose_output` keeps the adapted output or the
    plain one; where the image keeps the starting weights (not used, the choice kept the plain
    output, or the ELBO kept its start) and ``shared.fallback`` (objective "auto") adapted on it
    (``fallback_used``: its gate admitted the image), the fallback's weights give its output.
    ``noise_score``: the image's noise-presence score where the check ran (``AdaptConfig.noise_check``), which
    the result carries; where it is not above 0 the image was not used, and its result says "no noise found"."""

    def carry(r: AdaptResult) -> AdaptResult:
        return r if noise_score is None else replace(r, noise_scores=[noise_score])

    if noise_score is not None and not noise_found(noise_score):  # Eq. (noise presence): AG did not use it
        return carry(AdaptResult(base, [], 0, "no noise found", [score], [False])), None
    left = "uncorrelated noise" if shared.objective == "recorrupted" else "in distribution"
    choice = None
    if not used:
        result = AdaptResult(base, [], 0, left, [score], [False])
    elif shared.best_step > 0 and shared.objective == "elbo":
        choice = choose_output(base, shared.checkpoint, image, min_ratio, noise_bound, opts)
        # not kept: the starting weights, as for an image AG did not adapt on
        result = shared if choice.adapted else AdaptResult(base, shared.history, 0, shared.stop, [score], [True])
    else:
        result = shared
    fallback = shared.fallback
    if result.best_step == 0 and fallback is not None and fallback.best_step > 0 and fallback_used:
        return carry(fallback), None
    return carry(result), choice
