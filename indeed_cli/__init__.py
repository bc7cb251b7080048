"""indeed: interpretable deep image decomposition (the InDeed method).

Python API (docs/api.md):

    from indeed_cli import load_model, denoise, decompose, InferenceOptions
    ckpt = load_model()                          # bundled colour model
    clean = denoise(ckpt, "photo.png")           # float32 (C, h, w)
    denoise_folder(["shots/"], "out/")           # what `indeed denoise shots/ -o out/` does

The package goes in layers, each importing only those before it:
io, metrics <- model <- inference <- tasks <- pipelines <- cli.
"""

from .inference import (
    Decomposed,
    InferenceOptions,
    decompose,
    denoise,
    denoise_batch,
    denoise_each,
    load_model,
    resolve_device,
    sparse_mean,
    support_probability,
)
from .io import ImageError, LoadedImage, read_image, write_image
from .model import (
    Checkpoint,
    CheckpointError,
    InDeed,
    ModelConfig,
    Priors,
    load_checkpoint,
    resolve_weights,
    save_checkpoint,
)
from .pipelines import (
    Outcome,
    UsageError,
    adapt_folder,
    calibrate_checkpoint,
    decompose_folder,
    denoise_folder,
    detect_folder,
    evaluate_denoise,
    evaluate_detect,
    train,
)
from .tasks.adaptation import AdaptConfig, adapt, adapt_each
from .tasks.detection import detect, with_members
from .tasks.training import LossWeights, TrainConfig
from .version import __version__  # noqa: F401  (the package's version, not an API name)

__all__ = [
    "AdaptConfig",
    "Checkpoint",
    "CheckpointError",
    "Decomposed",
    "ImageError",
    "InDeed",
    "InferenceOptions",
    "LoadedImage",
    "LossWeights",
    "ModelConfig",
    "Outcome",
    "Priors",
    "TrainConfig",
    "UsageError",
    "adapt",
    "adapt_each",
    "adapt_folder",
    "calibrate_checkpoint",
    "decompose",
    "decompose_folder",
    "denoise",
    "denoise_batch",
    "denoise_each",
    "denoise_folder",
    "detect",
    "detect_folder",
    "evaluate_denoise",
    "evaluate_detect",
    "load_checkpoint",
    "load_model",
    "read_image",
    "resolve_device",
    "resolve_weights",
    "save_checkpoint",
    "sparse_mean",
    "support_probability",
    "train",
    "with_members",
    "write_image",
]
