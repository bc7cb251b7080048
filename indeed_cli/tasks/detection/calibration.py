"""The detection threshold, learned from held-out normal images."""

from __future__ import annotations

import numpy as np

from ...inference import InferenceOptions, check_ensemble
from ...inference.decomposition import WHOLE_IMAGE_PIXELS
from ...model import Checkpoint
from .maps import DEFAULT_SCORE, SCORE_DEFINITIONS, detect, has_support, map_definition, readout_scales

# The share of held-out normal images at or below the threshold: at 0.99 about one normal image in
# a hundred is flagged.  A lower quantile flags more defects for more false alarms (on the
# magnetic-tile development set, bundled detector: 0.99 flagged 51 of 196 defective and 0 of 81
# normal images, 0.95 flagged 82 and 2; docs/guide/detect.md).
QUANTILE = 0.99


def calibrate(
    ckpt: Checkpoint,
    normal_images,
    opts: InferenceOptions | None = None,
    scales=None,
    quantile: float = QUANTILE,
    ensemble: int = 1,
) -> dict:
    """Threshold = the ``quantile`` (0.99: the 99th percentile) of the scores of held-out normal
    images (default score), read out as :func:`detect` with ``ensemble`` flips and rotations; the
    scales and the ensemble are stored with it, and :func:`detect` reads out with them."""
    if not 0 < quantile <= 1:
        raise ValueError(f"--quantile must be in (0, 1], got {quantile:g}")
    ensemble = check_ensemble(ensemble)
    scales = tuple(scales or readout_scales(ckpt))
    scores = [
        detect(ckpt, im, opts, scales=scales, score=DEFAULT_SCORE, ensemble=ensemble).score for im in normal_images
    ]
    facts = {}
    if has_support(ckpt):  # which read-out the threshold belongs to (`indeed detect --tiled`, ONNX: tiles)
        tiled = opts is not None and opts.whole_image is False
        facts["readout"] = "tiles" if tiled else f"whole image up to {WHOLE_IMAGE_PIXELS:,} pixels, mu_L by tiles"
    return {
        **facts,
        "threshold": float(np.quantile(scores, quantile)),
        "n_calibration": len(scores),
        "scales": list(scales),
        "ensemble": ensemble,
        "map": map_definition(ckpt),
        "score_kind": DEFAULT_SCORE,
        "score": SCORE_DEFINITIONS[DEFAULT_SCORE],
        "quantile": quantile,
        "normal_scores": {
            "min": float(np.min(scores)),
            "median": float(np.median(scores)),
            "max": float(np.max(scores)),
        },
    }
