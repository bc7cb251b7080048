"""The detection threshold, learned from held-out normal images."""

from __future__ import annotations

import numpy as np

from ...inference import InferenceOptions
from ...model import Checkpoint
from .maps import DEFAULT_SCORE, SCORE_DEFINITIONS, detect, map_definition, readout_scales

QUANTILE = 0.99


def calibrate(ckpt: Checkpoint, normal_images, opts: InferenceOptions | None = None, scales=None) -> dict:
    """Threshold = the 99th percentile of the scores of held-out normal images (default score)."""
    scales = tuple(scales or readout_scales(ckpt))
    scores = [detect(ckpt, im, opts, scales=scales, score=DEFAULT_SCORE).score for im in normal_images]
    return {
        "threshold": float(np.quantile(scores, QUANTILE)),
        "n_calibration": len(scores),
        "scales": list(scales),
        "map": map_definition(ckpt),
        "score_kind": DEFAULT_SCORE,
        "score": SCORE_DEFINITIONS[DEFAULT_SCORE],
        "quantile": QUANTILE,
        "normal_scores": {
            "min": float(np.min(scores)),
            "median": float(np.median(scores)),
            "max": float(np.max(scores)),
        },
    }
