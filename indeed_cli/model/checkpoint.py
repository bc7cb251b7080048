"""Checkpoint I/O: safetensors only, never pickle.

A model checkpoint is one ``.safetensors`` file whose metadata holds:
  format          "indeed"
  format_version  "1"
  config          JSON of :class:`indeed_cli.config.ModelConfig`
  training        JSON of training facts (task, data, steps, noise range, ...)
  extra           JSON of deployment facts (e.g. OOD statistics, thresholds)
Weights are stored in float16 to keep shipped files small and loaded as float32.

Where a ``--weights`` value points (bundled names, paths, the Hub): :mod:`.registry`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError as SafetensorsError
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .config import FORMAT_VERSION, ModelConfig
from .network import InDeed


class CheckpointError(Exception):
    """A checkpoint could not be found, read or used; the message is one line."""


@dataclass
class Checkpoint:
    model: InDeed
    config: ModelConfig
    training: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    source: str = ""
    # networks derived for inference (a bf16 copy, compiled wrappers), keyed and filled by
    # indeed_cli.inference.runtime; never saved
    runtime: dict = field(default_factory=dict, repr=False, compare=False)


def save_checkpoint(
    path: str | Path,
    model: InDeed,
    training: dict | None = None,
    extra: dict | None = None,
    dtype: torch.dtype = torch.float16,
) -> Path:
    """Write model weights and metadata atomically (temp file + rename)."""
    path = Path(path)
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    meta = {
        "format": "indeed",
        "format_version": str(FORMAT_VERSION),
        "config": model.cfg.to_json(),
        "training": json.dumps(training or {}, sort_keys=True),
        "extra": json.dumps(extra or {}, sort_keys=True),
    }
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        save_file(tensors, str(tmp), metadata=meta)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_metadata(path: str | Path) -> dict:
    """Metadata of a checkpoint without loading its tensors; raises CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except (SafetensorsError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(
            f"not a readable safetensors checkpoint: {path} ({str(e).splitlines()[0][:120]})"
        ) from None
    if meta.get("format") != "indeed":
        raise CheckpointError(f"not an indeed checkpoint (no 'format: indeed' metadata): {path}")
    if meta.get("format_version") != str(FORMAT_VERSION):
        raise CheckpointError(
            f"checkpoint format version {meta.get('format_version')!r} is not supported "
            f"(this indeed reads {FORMAT_VERSION}): {path}"
        )
    try:
        return {
            "config": json.loads(meta["config"]),
            "training": json.loads(meta.get("training", "{}")),
            "extra": json.loads(meta.get("extra", "{}")),
        }
    except (KeyError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint metadata is damaged ({e}): {path}") from None


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> Checkpoint:
    """Rebuild the model from the metadata config and load its weights (float32, eval mode)."""
    meta = read_metadata(path)
    try:
        cfg = ModelConfig.from_dict(meta["config"])
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint config is invalid ({e}): {path}") from None
    try:
        state = load_file(str(path))
    except (SafetensorsError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint tensors are unreadable: {path} ({str(e).splitlines()[0][:120]})") from None
    model = InDeed(cfg)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint does not match its config: {len(missing)} missing, "
            f"{len(unexpected)} unexpected tensors (e.g. {(missing + unexpected)[0]}): {path}"
        )
    for k, v in state.items():
        if v.shape != expected[k].shape:
            raise CheckpointError(
                f"checkpoint tensor {k} has shape {tuple(v.shape)}, config needs {tuple(expected[k].shape)}: {path}"
            )
        if not torch.isfinite(v).all():
            raise CheckpointError(f"checkpoint tensor {k} holds NaN or Inf: {path}")
    model.load_state_dict({k: v.float() for k, v in state.items()})
    model.to(device).eval()
    # channels-last weights: cuDNN's fast layout, and oneDNN's on a CPU (a 512x512 colour image took
    # 2.32 s in NCHW, 1.80-1.85 s so on a 2-core AVX2 CPU; outputs differ by < 1e-6; docs/results.md)
    model.to(memory_format=torch.channels_last)
    return Checkpoint(model, cfg, meta["training"], meta["extra"], str(path))
