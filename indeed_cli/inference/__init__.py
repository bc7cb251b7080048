"""Inference: an image in, its posterior maps out, on overlapping tiles of any image size.

Layer 2 of the package: imports :mod:`indeed_cli.model` and :mod:`indeed_cli.io`.
"""

from .channels import ChannelAdapter, as_model_channels, training_channels
from .decomposition import (
    DIHEDRAL,
    ENSEMBLES,
    MAX_PIXEL_SHUFFLE,
    Decomposed,
    ShuffledReadout,
    as_image,
    check_ensemble,
    check_pixel_shuffle,
    decompose,
    denoise,
    denoise_batch,
    denoise_each,
    denoise_with_stats,
    dihedral,
    ensemble_mean,
    n_tiles,
    pixel_shuffle_denoise,
    pixel_shuffle_fits,
    shuffled_residuals,
    sparse_mean,
    support_probability,
)
from .runtime import InferenceOptions, load_model, native_bf16, network_for, resolve_device, resolve_precision
from .tiling import TileGrid, reflect_index, tiled_apply

__all__ = [
    "DIHEDRAL",
    "ENSEMBLES",
    "MAX_PIXEL_SHUFFLE",
    "ChannelAdapter",
    "Decomposed",
    "InferenceOptions",
    "ShuffledReadout",
    "TileGrid",
    "as_image",
    "as_model_channels",
    "check_ensemble",
    "check_pixel_shuffle",
    "decompose",
    "denoise",
    "denoise_batch",
    "denoise_each",
    "denoise_with_stats",
    "dihedral",
    "ensemble_mean",
    "load_model",
    "n_tiles",
    "native_bf16",
    "network_for",
    "pixel_shuffle_denoise",
    "pixel_shuffle_fits",
    "shuffled_residuals",
    "reflect_index",
    "resolve_device",
    "resolve_precision",
    "sparse_mean",
    "support_probability",
    "tiled_apply",
    "training_channels",
]
