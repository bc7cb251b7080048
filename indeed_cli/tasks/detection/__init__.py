"""Anomaly detection (paper §3.6): synthetic anomalies for training, maps and scores from the
posterior of S, and the threshold learned from normal images."""

from .calibration import QUANTILE, calibrate
from .filters import blur, blur_batch, gaussian_blur, resize, scaled_size
from .maps import (
    DEFAULT_SCORE,
    SCORE_DEFINITIONS,
    Detection,
    anomaly_map_from_sparse,
    detect,
    detect_tiles,
    has_support,
    image_score,
    readout_ensemble,
    readout_scales,
    scale_maps,
    score_kind,
    stored_threshold,
)
from .members import with_members
from .memory import (
    MEMORY_ENTRIES,
    FusionStats,
    build_memory,
    distance_map,
    fuse,
    greedy_coreset,
    memory_trunk,
    rebanked,
    stored_fusion,
)
from .synthesis import PRESETS, AnomalyConfig, synthesize

__all__ = [
    "DEFAULT_SCORE",
    "MEMORY_ENTRIES",
    "PRESETS",
    "QUANTILE",
    "SCORE_DEFINITIONS",
    "AnomalyConfig",
    "FusionStats",
    "Detection",
    "anomaly_map_from_sparse",
    "blur",
    "blur_batch",
    "build_memory",
    "calibrate",
    "detect",
    "detect_tiles",
    "distance_map",
    "fuse",
    "gaussian_blur",
    "greedy_coreset",
    "has_support",
    "image_score",
    "memory_trunk",
    "readout_ensemble",
    "rebanked",
    "readout_scales",
    "resize",
    "scale_maps",
    "scaled_size",
    "score_kind",
    "stored_fusion",
    "stored_threshold",
    "synthesize",
    "with_members",
]
