"""The detection threshold, learned from held-out normal images."""

from __future__ import annotations

import numpy as np

from ...inference import InferenceOptions
from ...inference.decomposition import WHOLE_IMAGE_PIXELS
from ...model import Checkpoint
from .maps import DEFAULT_SCORE, SCORE_DEFINITIONS, detect, has_support, map_definition, readout_scales

QUANTILE = 0.99


def calibrate(ckpt: Checkpoint, normal_images, opts: InferenceOptions | None = None, scales=None) -> dict:
    """Threshold = the 99th percentile of the scores of held-out normal images (default score)."""
    scales = tuple(scales or readout_scales(ckpt))
    scores = [detect(ckpt, im, opts, scales=scales, score=DEFAULT_SCORE).score for im in normal_images]
    facts = {}
    if has_support(ckpt):  # which read-out the threshold belongs to (`indeed detect --tiled`, ONNX: tiles)
        tiled = opts is not None and opts.whole_image is False
        facts["readout"] = "tiles" if tiled else f"whole image up to {WHOLE_IMAGE_PIXELS:,} pixels, mu_L by tiles"
    return {
        **facts,
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
