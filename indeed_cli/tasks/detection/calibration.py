"""The detection threshold, learned from held-out normal images."""

from __future__ import annotations

import numpy as np

from ...inference import InferenceOptions, as_image, check_ensemble
from ...inference.decomposition import WHOLE_IMAGE_PIXELS
from ...model import Checkpoint
from .maps import (
    DEFAULT_SCORE,
    SCORE_DEFINITIONS,
    has_support,
    image_score,
    map_definition,
    member_mean,
    readout_scales,
)
from .memory import distance_map, fuse, fusion_stats

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
    scales and the ensemble are stored with it, and :func:`detect` reads out with them.

    A detector with a memory of normal features (``ckpt.memory``) also gets the statistics of
    Eq. (memory fusion) from the same images' pixels (under "memory"); the threshold is learned on
    the fused maps."""
    if not 0 < quantile <= 1:
        raise ValueError(f"--quantile must be in (0, 1], got {quantile:g}")
    ensemble = check_ensemble(ensemble)
    scales = tuple(scales or readout_scales(ckpt))
    maps, distances = [], []
    for im in normal_images:
        data, _ = as_image(im)
        maps.append(member_mean(ckpt, data, opts, scales=scales, ensemble=ensemble))
        if ckpt.memory is not None:
            distances.append(distance_map(ckpt.memory, data, ckpt.config.channels))
    facts, definition = {}, map_definition(ckpt)
    if ckpt.memory is not None and maps:
        stats = fusion_stats(maps, distances, 1 + len(ckpt.members))
        # the threshold of the members' map alone, for read-outs without the memory (the ONNX graph)
        alone = float(np.quantile([image_score(a, DEFAULT_SCORE) for a in maps], quantile))
        maps = [fuse(a, d, stats) for a, d in zip(maps, distances)]
        facts["memory"] = {**stats.to_dict(), "entries": ckpt.memory.entries, "threshold_without": alone}
        definition += f", fused with the distance to {ckpt.memory.entries} normal patch features as one more member"
    scores = [image_score(a, DEFAULT_SCORE) for a in maps]
    if has_support(ckpt):  # which read-out the threshold belongs to (`indeed detect --tiled`, ONNX: tiles)
        tiled = opts is not None and opts.whole_image is False
        facts["readout"] = "tiles" if tiled else f"whole image up to {WHOLE_IMAGE_PIXELS:,} pixels, mu_L by tiles"
    return {
        **facts,
        "threshold": float(np.quantile(scores, quantile)),
        "n_calibration": len(scores),
        "scales": list(scales),
        "ensemble": ensemble,
        "map": definition,
        "score_kind": DEFAULT_SCORE,
        "score": SCORE_DEFINITIONS[DEFAULT_SCORE],
        "quantile": quantile,
        "normal_scores": {
            "min": float(np.min(scores)),
            "median": float(np.median(scores)),
            "max": float(np.max(scores)),
        },
    }
