"""indeed: interpretable deep image decomposition (the InDeed method).

Python API (docs/api.md):
    from indeed_cli import load_model, denoise, decompose, InferenceOptions
"""
from .checkpoint import Checkpoint, CheckpointError, load_checkpoint, resolve_weights, save_checkpoint
from .config import LossWeights, ModelConfig, Priors
from .imageio import ImageError, read_image, write_image
from .inference import Decomposed, InferenceOptions, decompose, denoise, load_model, resolve_device
from .networks import InDeed

__version__ = "0.1.0"
__all__ = ["Checkpoint", "CheckpointError", "Decomposed", "ImageError", "InDeed", "InferenceOptions", "LossWeights",
           "ModelConfig", "Priors", "decompose", "denoise", "load_checkpoint", "load_model", "read_image",
           "resolve_device", "resolve_weights", "save_checkpoint", "write_image"]
