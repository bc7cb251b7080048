"""The InDeed model: configuration, the modular network, the closed-form posteriors and ELBO terms
(one function per equation of the paper), and checkpoints.

Layer 1 of the package: it imports nothing from the rest of indeed_cli.
"""

from .checkpoint import (
    Checkpoint,
    CheckpointError,
    load_checkpoint,
    read_metadata,
    save_checkpoint,
    write_safetensors_atomically,
)
from .config import ModelConfig, Priors
from .network import Decomposition, InDeed
from .registry import list_checkpoints, resolve_weights, weights_dir

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "Decomposition",
    "InDeed",
    "ModelConfig",
    "Priors",
    "list_checkpoints",
    "load_checkpoint",
    "read_metadata",
    "resolve_weights",
    "save_checkpoint",
    "write_safetensors_atomically",
    "weights_dir",
]
