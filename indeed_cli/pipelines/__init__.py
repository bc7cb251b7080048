"""Folder-level work: what each command does, callable from Python.

Each function takes inputs (files, folders, globs) and an output place, plans every output before
any work (:mod:`.inputs`), runs the images one after another with writes overlapping the next
computation (:mod:`.runner`), and returns one :class:`Outcome` per input.

Layer 4 of the package: imports the tasks, inference, model and io layers; the CLI imports it.
"""

from .adapt import adapt_folder
from .calibrate import calibrate_checkpoint
from .decompose import decompose_folder, outputs_for, write_decomposition
from .denoise import denoise_folder
from .detect import detect_folder, map_files, write_maps
from .evaluate import evaluate_denoise, evaluate_detect, noisy_clean_pairs
from .export import export_onnx
from .inputs import (
    UsageError,
    check_targets,
    expand_inputs,
    input_names,
    parse_scales,
    parse_shard,
    plan_outputs,
    require_folder,
    shard_from_env,
    skip_done,
    stem,
    take_shard,
)
from .runner import ModelCache, OrderedWriter, Outcome, Product, Progress, run_ordered
from .train import train

__all__ = [
    "ModelCache",
    "OrderedWriter",
    "Outcome",
    "Product",
    "Progress",
    "UsageError",
    "adapt_folder",
    "calibrate_checkpoint",
    "check_targets",
    "decompose_folder",
    "denoise_folder",
    "detect_folder",
    "evaluate_denoise",
    "evaluate_detect",
    "export_onnx",
    "expand_inputs",
    "input_names",
    "map_files",
    "noisy_clean_pairs",
    "outputs_for",
    "parse_scales",
    "parse_shard",
    "shard_from_env",
    "take_shard",
    "plan_outputs",
    "require_folder",
    "run_ordered",
    "skip_done",
    "stem",
    "train",
    "write_decomposition",
    "write_maps",
]
