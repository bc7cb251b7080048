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

After InDeedOAG, the recorrupted objective's output is blended per pixel with the plain one by the second
noise-presence detector's map (Eq. noise-map blend): where the detector sees no noise (fine texture, say), the
plain output stays, and where it sees noise the adapted one is taken.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ...inference import Decomposed, InferenceOptions, as_image, decompose, denoise_with_stats
from ...model import Checkpoint
from ..noise_presence import noise_found, noise_weight_map
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


def noise_map_blend(plain: np.ndarray, adapted: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Eq. (noise-map blend): plain + w (adapted − plain), ``weights`` w (h, w) in [0, 1] for every channel
    of (..., h, w) maps."""
    return plain + weights * (adapted - plain)


def oag_blend_weights(result: AdaptResult, image) -> np.ndarray | None:
    """Eq. (noise-map blend)'s weights (h, w) for one InDeedOAG ``result`` of ``image`` (C, h, w): where its kept
    weights came from the recorrupted objective; None where they did not (the ELBO's gains on real noise are
    kept whole: blending cut them by 0.2 dB on PolyU100), for a gray image, or without the detector."""
    if result.best_step <= 0 or result.objective != "recorrupted":
        return None
    # on the device of the image's model: on a CPU the map of a 512 x 512 image took 0.13 s
    return noise_weight_map(image, device=next(result.checkpoint.model.parameters()).device)


def oag_output(
    base: Checkpoint, result: AdaptResult, image, opts: InferenceOptions | None = None
) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray | None]:
    """InDeedOAG's denoised output of ``image`` from its ``result`` (``base``: the starting checkpoint): the
    adapted read-out L + S, blended with the plain one by Eq. (noise-map blend) where that applies; with its
    per-tile statistics (the adapted model's) and the blend's weights (None: not blended)."""
    data, _ = as_image(image)
    opts = opts or InferenceOptions()
    out, stats = denoise_with_stats(result.checkpoint, data, opts)
    weights = oag_blend_weights(result, data)
    if weights is not None:
        out = noise_map_blend(denoise_with_stats(base, data, opts)[0], out, weights)
    return out, stats, weights


def oag_decomposition(
    base: Checkpoint, result: AdaptResult, image, opts: InferenceOptions | None = None
) -> tuple[Decomposed, np.ndarray | None]:
    """:func:`oag_output` as a decomposition: every posterior map blended with the plain model's by the same
    weights (L + S is then the blended output, and N = Y − L − S still holds); the per-tile statistics are the
    adapted model's."""
    data, _ = as_image(image)
    opts = opts or InferenceOptions()
    dec = decompose(result.checkpoint, data, opts)
    weights = oag_blend_weights(result, data)
    if weights is None:
        return dec, None
    plain = decompose(base, data, opts)
    maps = {k: noise_map_blend(plain.maps[k], v, weights) for k, v in dec.maps.items()}
    return Decomposed(dec.Y, maps, dec.tiles), weights
