"""The detection threshold, learned from held-out normal images."""

from __future__ import annotations

import numpy as np

from ...inference import InferenceOptions, as_image, check_ensemble
from ...inference.decomposition import WHOLE_IMAGE_PIXELS
from ...model import Checkpoint
from .maps import (
    DEFAULT_SCORE,
    JOINT_SCORE,
    SCORE_DEFINITIONS,
    has_support,
    image_score,
    map_definition,
    member_mean,
    readout_options,
    readout_scales,
)
from .memory import distance_map, fuse, fuse_scores, fusion_stats, score_stats

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
    Eq. (memory fusion) from the same images' pixels and those of Eq. (score fusion) from their
    scores (under "memory"); its image score is then ``top5_joint``, the threshold is learned on it,
    and ``pixel_threshold``, the same quantile of the fused maps' top5, marks the maps' pixels.

    The maps are read out at ``opts.precision`` (None: the detector's :func:`readout_precision`,
    fp32 for one never calibrated), which is stored with the threshold as ``precision`` (as asked:
    ``auto`` stays ``auto``), and :func:`detect` reads out at it."""
    if not 0 < quantile <= 1:
        raise ValueError(f"--quantile must be in (0, 1], got {quantile:g}")
    ensemble = check_ensemble(ensemble)
    scales = tuple(scales or readout_scales(ckpt))
    opts = readout_options(ckpt, opts)  # the precision asked for, else the one the detector has
    maps, distances = [], []
    for im in normal_images:
        data, _ = as_image(im)
        maps.append(member_mean(ckpt, data, opts, scales=scales, ensemble=ensemble))
        if ckpt.memory is not None:
            distances.append(distance_map(ckpt.memory, data, ckpt.config.channels))
    facts, definition, kind = {}, map_definition(ckpt), DEFAULT_SCORE
    scores = [image_score(a, DEFAULT_SCORE) for a in maps]
    if ckpt.memory is not None and maps:
        stats = fusion_stats(maps, distances, 1 + len(ckpt.members))
        # the threshold of the members' map alone, for read-outs without the memory (the ONNX graph)
        alone = float(np.quantile(scores, quantile))
        maps = [fuse(a, d, stats) for a, d in zip(maps, distances)]
        fused = [image_score(a, DEFAULT_SCORE) for a in maps]
        far = [image_score(d, DEFAULT_SCORE) for d in distances]
        votes = score_stats(fused, far)
        scores = [fuse_scores(f, d, votes) for f, d in zip(fused, far)]
        facts["memory"] = {
            **stats.to_dict(),
            "entries": ckpt.memory.entries,
            "threshold_without": alone,
            "scores": votes.to_dict(),
        }
        facts["pixel_threshold"] = float(np.quantile(fused, quantile))
        definition += f", fused with the distance to {ckpt.memory.entries} normal patch features as one more member"
        kind = JOINT_SCORE
    if has_support(ckpt):  # which read-out the threshold belongs to (`indeed detect --tiled`, ONNX: tiles)
        tiled = opts is not None and opts.whole_image is False
        facts["readout"] = "tiles" if tiled else f"whole image up to {WHOLE_IMAGE_PIXELS:,} pixels, mu_L by tiles"
    return {
        **facts,
        "threshold": float(np.quantile(scores, quantile)),
        "n_calibration": len(scores),
        "scales": list(scales),
        "ensemble": ensemble,
        "precision": opts.precision,
        "map": definition,
        "score_kind": kind,
        "score": SCORE_DEFINITIONS[kind],
        "quantile": quantile,
        "normal_scores": {
            "min": float(np.min(scores)),
            "median": float(np.median(scores)),
            "max": float(np.max(scores)),
        },
    }
