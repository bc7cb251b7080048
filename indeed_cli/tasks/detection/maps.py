"""Anomaly maps from the posterior of S, the image score, and what a detector was calibrated with.

Map (docs/guide/detect.md): a(x) = G_2 * mean_c |mu_S(x)|, the posterior-mean magnitude of the sparse
component averaged over channels and smoothed by a Gaussian of sigma 2 px; the image score is
the mean of the largest 5% of a(x) ("top5"; chosen on half of the magnetic-tile development set,
docs/reports/2026-11-26-detection.md).  Detectors calibrated before it keep their score, max_x (G_4 * a)(x) ("max_g4"),
because their threshold was learned on it.  |mu_S| is used rather than P(s != 0) because sigma_S
is driven very small by training (about 3e-3), which makes such a probability saturate at 0 or 1
and lose ranking.
The threshold is learned from held-out normal images (:mod:`.calibration`); a pixel is marked
when a(x) exceeds it, an image when its score does.

Multi-scale read-out: a detector trained on an image pyramid (``indeed train --scales``) is run
on the image resized by each of its scales; the maps are brought back to the input size and
averaged (large defects need more context than one tile).  The scales are
stored with the threshold, which is calibrated on the same averaged map.

Detectors with f_thetaM (``config.support_width > 0``, docs/model.md "The support posterior") map
a(x) = q(z_x = 1), the posterior probability that pixel x is in the support of S, averaged over the
read-out scales like the |mu_S| map, and scored like it (``top5``: on the magnetic-tile development
set it beat DRAEM's ``pool21``, the maximum of the map averaged over 21 x 21 windows, on both
halves; docs/reports/2026-11-27-support-posterior.md).

A detector with members (``Checkpoint.members``, made by ``indeed calibrate --member``) maps the mean
of its members' maps, each read out at its own scales (docs/model.md, Eq. (member mean)); the
threshold and the image score belong to that mean.

A detector with a memory of normal features (``Checkpoint.memory``; :mod:`.memory`) fuses that mean
with its nearest-normal-feature distance map as one more member (Eq. (memory fusion)), with the
normal statistics stored beside the threshold.  Calibrated so since 2026-12-02, its image score is
``top5_joint``, Eq. (score fusion): the fused map's top5 averaged with the distance map's, brought to
its scale on normal images; its threshold is learned on that score, and the map's pixels are marked
at a pixel threshold learned on the fused map's top5 as before (:func:`stored_pixel_threshold`).

The precision of the read-out is stored with the threshold as well (``indeed calibrate --precision``,
:func:`readout_precision`): a detector reads out at it unless asked for another.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

from ...inference import (
    InferenceOptions,
    as_image,
    check_ensemble,
    dihedral,
    n_tiles,
    sparse_mean,
    support_probability,
)
from ...model import Checkpoint
from .filters import gaussian_blur, resize, scaled_size
from .memory import distance_map, fuse, fuse_scores, stored_fusion, stored_score_fusion

MAP_BLUR, SCORE_BLUR, TOP_SHARE, POOL = 2.0, 4.0, 0.05, 21
JOINT_SCORE = "top5_joint"
SCORE_DEFINITIONS = {
    "top5": f"mean of the largest {TOP_SHARE:.0%} of the map",
    "max_g4": f"max(gaussian_blur(map, {SCORE_BLUR}))",
    "pool21": f"max of the map averaged over {POOL}x{POOL} windows",
    JOINT_SCORE: f"mean of the largest {TOP_SHARE:.0%} of the map, averaged with the same of the memory's distance "
    "map brought to its scale on the calibration normals (Eq. (score fusion))",
}
DEFAULT_SCORE = "top5"
MAP_DEFINITIONS = {
    "sparse": f"gaussian_blur(mean_c |mu_S|, {MAP_BLUR}), mean over scales",
    "support": "q(z = 1) from f_thetaM, mean over scales",
}


def has_support(ckpt: Checkpoint) -> bool:
    """Whether the detector has f_thetaM, the support posterior (its map is q(z = 1))."""
    return bool(ckpt.config.support_width)


def map_definition(ckpt: Checkpoint) -> str:
    own = MAP_DEFINITIONS["support" if has_support(ckpt) else "sparse"]
    return f"{own}, mean over {1 + len(ckpt.members)} members" if ckpt.members else own


def anomaly_map_from_sparse(mu_S: np.ndarray) -> np.ndarray:
    """a(x) = G_2 * mean_c |mu_S(x)| of one (C, h, w) posterior mean of S."""
    return gaussian_blur(np.abs(mu_S).mean(0), MAP_BLUR)


def image_score(amap: np.ndarray, kind: str = DEFAULT_SCORE) -> float:
    """One number per image from its map: ``top5`` (mean of the largest 5% of the pixels),
    ``max_g4`` (maximum after a Gaussian of sigma 4 px; the first detectors' score) or ``pool21``
    (maximum of the 21 x 21 window means, DRAEM's score).  ``top5_joint`` needs the memory's distance
    map as well: :func:`detection_score`."""
    if kind == JOINT_SCORE:
        raise ValueError(f"the image score {JOINT_SCORE!r} needs the memory's distance map: see detection_score()")
    if kind == "max_g4":
        return float(gaussian_blur(amap, SCORE_BLUR).max())
    if kind == "pool21":
        t = torch.from_numpy(np.ascontiguousarray(amap, dtype=np.float32))[None, None]
        return float(F.avg_pool2d(t, POOL, stride=1, padding=POOL // 2, count_include_pad=False).max())
    if kind != "top5":
        raise ValueError(f"unknown image score {kind!r}; known: {sorted(SCORE_DEFINITIONS)}")
    flat = np.asarray(amap, dtype=np.float64).ravel()
    k = max(1, int(round(TOP_SHARE * flat.size)))
    return float(np.partition(flat, flat.size - k)[-k:].mean())


def score_kind(ckpt: Checkpoint) -> str:
    """The image score a detector's threshold was learned on: its stored ``score_kind``; a detector
    calibrated before scores had names used ``max_g4``; an uncalibrated one gets the default."""
    facts = ckpt.extra.get("detect") or {}
    return facts.get("score_kind", "max_g4") if "threshold" in facts else DEFAULT_SCORE


def stored_threshold(ckpt: Checkpoint) -> float | None:
    """The image threshold learned at calibration (``extra.detect.threshold``): an image whose score
    is above it is flagged; None if never calibrated."""
    return (ckpt.extra.get("detect") or {}).get("threshold")


def stored_pixel_threshold(ckpt: Checkpoint) -> float | None:
    """The threshold a map's pixels are marked at: ``extra.detect.pixel_threshold`` where the image
    score is not the map's own (``top5_joint``), else the image threshold."""
    facts = ckpt.extra.get("detect") or {}
    return facts.get("pixel_threshold", facts.get("threshold"))


def detection_score(ckpt: Checkpoint, amap: np.ndarray, dmap: np.ndarray | None, kind: str) -> float:
    """The image score ``kind`` of a detector's map ``amap`` (fused, where it has a memory) and its
    memory's distance map ``dmap`` (None without one): Eq. (score fusion) for ``top5_joint``, else
    :func:`image_score` of the map."""
    if kind != JOINT_SCORE:
        return image_score(amap, kind)
    if dmap is None:
        raise ValueError(f"the image score {JOINT_SCORE!r} needs the memory's distance map")
    return fuse_scores(image_score(amap, "top5"), image_score(dmap, "top5"), _joint_stats(ckpt))


def _joint_stats(ckpt: Checkpoint):
    stats = stored_score_fusion(ckpt)  # stored under the memory's fusion facts: None without them
    if stats is None:
        raise ValueError(
            f"the image score {JOINT_SCORE!r} needs a detector calibrated with a memory of normal features "
            f"(`indeed calibrate`); {ckpt.source} is not"
        )
    return stats


def readout_scales(ckpt: Checkpoint) -> tuple[float, ...]:
    """The scales a detector reads out at: those it was calibrated (or trained) with; 1 for older ones."""
    scales = (ckpt.extra.get("detect") or {}).get("scales") or ckpt.training.get("scales") or [1.0]
    return tuple(float(v) for v in scales)


def readout_ensemble(ckpt: Checkpoint) -> int:
    """How many flips and rotations of an image a detector's map averages (:func:`detect`): as many
    as its threshold was calibrated with; 1 for detectors calibrated without."""
    return int((ckpt.extra.get("detect") or {}).get("ensemble", 1))


def readout_precision(ckpt: Checkpoint) -> str:
    """The precision a detector reads out at unless asked for another: the one its threshold was
    learned at (``indeed calibrate --precision``: fp32, bf16, or auto, bf16 where the device computes
    it natively); fp32 for detectors calibrated before it was stored."""
    return str((ckpt.extra.get("detect") or {}).get("precision", "fp32"))


def readout_options(ckpt: Checkpoint, opts: InferenceOptions | None) -> InferenceOptions:
    """``opts`` with the detector's :func:`readout_precision` where they ask for none (None, or
    ``precision=None``); its members read out at it too."""
    opts = opts or InferenceOptions(precision=None)
    return opts if opts.precision is not None else replace(opts, precision=readout_precision(ckpt))


def detect_tiles(ckpt: Checkpoint, h: int, w: int, opts: InferenceOptions, scales=None, ensemble: int = 1) -> int:
    """Tiles a multi-scale read-out of ``ensemble`` transforms of the image runs, every member's (for
    progress bars; a turned image has as many tiles as the image)."""
    per_member = [scales or readout_scales(ckpt), *(readout_scales(m) for m in ckpt.members)]
    return ensemble * sum(n_tiles(*scaled_size(h, w, s), opts) for ss in per_member for s in ss)


@dataclass
class Detection:
    anomaly_map: np.ndarray  # (h, w) float32
    score: float


def scale_maps(
    ckpt: Checkpoint,
    image,
    opts: InferenceOptions | None = None,
    progress=None,
    scales: tuple[float, ...] | None = None,
) -> np.ndarray:
    """(n_scales, h, w): the map of the image resized by each scale, back at input size: q(z = 1) of a
    detector with f_thetaM, else G_2 * mean_c |mu_S|."""
    data, _ = as_image(image)
    h, w = data.shape[1:]
    maps = []
    for s in scales or readout_scales(ckpt):
        small = data if s == 1 else np.clip(resize(data, scaled_size(h, w, s)), 0, 1)
        if has_support(ckpt):
            a = support_probability(ckpt, small, opts, progress)
        else:
            a = anomaly_map_from_sparse(sparse_mean(ckpt, small, opts, progress))
        maps.append(a if s == 1 else resize(a[None], (h, w))[0])
    return np.stack(maps)


def detect(
    ckpt: Checkpoint,
    image,
    opts: InferenceOptions | None = None,
    progress=None,
    scales: tuple[float, ...] | None = None,
    score: str | None = None,
    ensemble: int | None = None,
) -> Detection:
    """Anomaly map (mean over the read-out scales) and image score (the checkpoint's, unless
    ``score`` names another) of one image.

    A detector with members maps the mean of its members' maps, docs/model.md Eq. (member mean):

        a(x) = (1/K) sum_k (1/|S_k|) sum_{s in S_k} a_k,s(x)

    each member k read out at its own scales S_k; ``scales`` replaces the first member's (the
    detector's own, stored with its threshold).

    ``ensemble`` N = 2, 4 or 8: the map is the mean of the maps of the first N flips and rotations of
    the image (the order of ``indeed denoise --ensemble``), each turned back, docs/model.md
    Eq. (self-ensemble); None: as many as the detector's threshold was calibrated with
    (:func:`readout_ensemble`).  N read-outs, N times the time.

    ``opts`` None, or of ``precision=None``: the networks read out at the detector's
    :func:`readout_precision`, the one its threshold was learned at.

    A detector with a memory of normal features and its fusion statistics (:mod:`.memory`) maps
    Eq. (memory fusion) of that mean and its distance map (of the image itself, once), and scores
    the image by Eq. (score fusion) where it was calibrated so (``top5_joint``)."""
    data, _ = as_image(image)
    opts = readout_options(ckpt, opts)
    kind = score or score_kind(ckpt)
    if kind == JOINT_SCORE:
        _joint_stats(ckpt)  # before the read-out, not after it
    elif kind not in SCORE_DEFINITIONS:
        raise ValueError(f"unknown image score {kind!r}; known: {sorted(SCORE_DEFINITIONS)}")
    amap = member_mean(ckpt, data, opts, progress, scales, ensemble)
    fusion, dmap = stored_fusion(ckpt), None
    if fusion is not None:
        dmap = distance_map(ckpt.memory, data, ckpt.config.channels)
        amap = fuse(amap, dmap, fusion)
    return Detection(amap.astype(np.float32), detection_score(ckpt, amap, dmap, kind))


def member_mean(
    ckpt: Checkpoint,
    image,
    opts: InferenceOptions | None = None,
    progress=None,
    scales: tuple[float, ...] | None = None,
    ensemble: int | None = None,
) -> np.ndarray:
    """The map of :func:`detect` before a memory is fused in: Eq. (member mean), averaged over
    ``ensemble`` flips and rotations; (h, w) float32."""
    n = check_ensemble(readout_ensemble(ckpt) if ensemble is None else ensemble)
    opts = readout_options(ckpt, opts)
    data, _ = as_image(image)
    amap = np.zeros(data.shape[1:], np.float32)
    for k in range(n):  # transform 0 is the image itself
        image_k = dihedral(data, k)
        own = [scale_maps(ckpt, image_k, opts, progress, scales).mean(0)]
        turned = np.mean(own + [scale_maps(m, image_k, opts, progress).mean(0) for m in ckpt.members], 0)
        amap += dihedral(turned[None], k, inverse=True)[0]
    return amap / n
