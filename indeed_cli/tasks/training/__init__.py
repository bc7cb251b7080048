"""Training of f_theta with the paper's loss: data, noise, objective, state, recipes and the loop."""

from .batches import denoise_batch, detect_batch_fn
from .config import TrainConfig, lr_at
from .data import PatchSampler, image_pyramid, list_images, load_images, pad_to
from .loop import run_training
from .noise import add_noise, noise_levels
from .objective import LossWeights, noise_level_weights, patch_precision_weights, training_loss
from .recipes import RECIPES, Recipe, recipe
from .state import export_state, has_state, load_state, read_state_metadata, save_state
from .validation import validate

__all__ = [
    "RECIPES",
    "LossWeights",
    "PatchSampler",
    "Recipe",
    "TrainConfig",
    "add_noise",
    "noise_levels",
    "denoise_batch",
    "detect_batch_fn",
    "export_state",
    "has_state",
    "image_pyramid",
    "list_images",
    "load_images",
    "load_state",
    "lr_at",
    "noise_level_weights",
    "patch_precision_weights",
    "pad_to",
    "read_state_metadata",
    "recipe",
    "run_training",
    "save_state",
    "training_loss",
    "validate",
]
