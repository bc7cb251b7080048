"""Active generalization (paper §3.5): InDeedAG and InDeedOAG fine-tune one module of the network
on out-of-distribution images with the unsupervised part of the ELBO, and, for correlated camera
noise the ELBO leaves in place, with a recorrupted-to-recorrupted objective (:mod:`.recorrupted`;
``AdaptConfig.objective``)."""

from .choice import (
    ImageChoice,
    ag_image_result,
    change_ratio,
    choose_output,
    noise_map_blend,
    oag_blend_weights,
    oag_decomposition,
    oag_output,
    removed_over_noise,
)
from .config import (
    AG_DECIDE,
    AG_IMAGE_NOISE_BOUND,
    AG_LR,
    AG_MIN_CHANGE_RATIO,
    AG_STEPS,
    OAG_DECIDE,
    OAG_LR,
    OAG_STEPS,
    AdaptConfig,
    AdaptResult,
    default_group,
    default_precision,
    oag_readout,
)
from .objective import adaptation_objective, lowrank_factors
from .runner import adapt, adapt_each, adapt_images, tiles_of
from .stopping import EarlyStopping

__all__ = [
    "AG_DECIDE",
    "AG_IMAGE_NOISE_BOUND",
    "AG_MIN_CHANGE_RATIO",
    "AG_LR",
    "AG_STEPS",
    "OAG_DECIDE",
    "OAG_LR",
    "OAG_STEPS",
    "AdaptConfig",
    "AdaptResult",
    "EarlyStopping",
    "ImageChoice",
    "adapt",
    "adapt_each",
    "adapt_images",
    "adaptation_objective",
    "ag_image_result",
    "change_ratio",
    "choose_output",
    "noise_map_blend",
    "oag_blend_weights",
    "oag_decomposition",
    "oag_output",
    "default_group",
    "default_precision",
    "lowrank_factors",
    "oag_readout",
    "removed_over_noise",
    "tiles_of",
]
