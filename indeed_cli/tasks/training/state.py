"""Resumable training state: weights, optimizer moments, step, time and random streams."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ...model import InDeed, ModelConfig, save_checkpoint, write_safetensors_atomically


def _shards(tensors: dict[str, torch.Tensor], shard_bytes: int) -> list[dict[str, torch.Tensor]]:
    """Tensors in insertion order, grouped into parts of at most ``shard_bytes`` (0 = one part)."""
    out, cur, size = [], {}, 0
    for k, v in tensors.items():
        n = v.numel() * v.element_size()
        if cur and shard_bytes and size + n > shard_bytes:
            out.append(cur)
            cur, size = {}, 0
        cur[k] = v
        size += n
    return out + [cur]


def save_state(
    folder: Path,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    step: int,
    gen: torch.Generator,
    extra: dict,
    elapsed: float = 0.0,
    shard_bytes: int = 0,
) -> None:
    """Resumable state: fp32 weights, Adam's second moments in bf16, step, elapsed training time
    and RNG states, as ``state-KK-of-NN.safetensors`` files of at most ``shard_bytes`` each
    (0 = one file; smaller parts suit transfers with a file-size limit).

    Adam's first moment is not kept: with beta1 = 0.9 it re-forms within ~10 steps, and leaving
    it out makes the state a third smaller.
    """
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
    for i, p in enumerate(model.parameters()):
        st = opt.state.get(p, {})
        if "exp_avg_sq" in st:
            tensors[f"optim.{i}.exp_avg_sq"] = st["exp_avg_sq"].detach().to("cpu", torch.bfloat16).contiguous()
    tensors["rng.sampler"] = gen.get_state().clone()
    tensors["rng.torch"] = torch.get_rng_state().clone()
    adam_step = max((float(s["step"]) for s in opt.state.values() if "step" in s), default=0.0)
    meta = {"step": str(step), "adam_step": str(adam_step), "elapsed": str(elapsed), "extra": json.dumps(extra)}
    shards = _shards(tensors, shard_bytes)
    for old in folder.glob("state-*.safetensors"):
        old.unlink()
    for j, part in enumerate(shards):
        name = f"state-{j:02d}-of-{len(shards):02d}.safetensors"
        write_safetensors_atomically(folder / name, part, meta)


def has_state(folder: Path) -> bool:
    return any(Path(folder).glob("state-*.safetensors"))


def load_state(
    folder: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator
) -> tuple[int, float]:
    """Restore what :func:`save_state` wrote; returns (step, training seconds so far)."""
    files = sorted(Path(folder).glob("state-*.safetensors"))
    n_expected = int(files[0].stem.split("-of-")[1])
    if len(files) != n_expected:
        raise ValueError(f"incomplete training state in {folder}: {len(files)} of {n_expected} shards")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    with safe_open(str(files[0]), "pt") as f:
        meta = f.metadata()
    model.load_state_dict({k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")})
    adam_step = float(meta["adam_step"])
    for i, p in enumerate(model.parameters()):
        key = f"optim.{i}.exp_avg_sq"
        if key in tensors:
            opt.state[p] = {
                "step": torch.tensor(adam_step),
                "exp_avg": torch.zeros_like(p),
                "exp_avg_sq": tensors[key].to(p.device, torch.float32),
            }
    gen.set_state(tensors["rng.sampler"])
    torch.set_rng_state(tensors["rng.torch"])
    return int(meta["step"]), float(meta.get("elapsed", 0.0))


def read_state_metadata(folder: Path) -> dict:
    """The step, training seconds and run facts (``extra``) a state folder holds, without its tensors."""
    files = sorted(Path(folder).glob("state-*.safetensors"))
    if not files:
        raise ValueError(f"no training state in {folder}")
    with safe_open(str(files[0]), "pt") as f:
        meta = f.metadata()
    return {"step": int(meta["step"]), "elapsed": float(meta.get("elapsed", 0.0)), "extra": json.loads(meta["extra"])}


def export_state(folder: Path, out: Path, model_cfg: ModelConfig | None = None, facts: dict | None = None) -> Path:
    """Write the checkpoint of a run's resumable state: for a run that was cut off before it exported
    one.  The model config comes from the state (runs since 0.2.0 record it) or ``model_cfg``;
    ``facts`` are added to the training facts the state recorded."""
    meta = read_state_metadata(folder)
    if model_cfg is None:
        if "model" not in meta["extra"]:
            raise ValueError(f"the state in {folder} does not record its model config; pass it")
        model_cfg = ModelConfig.from_dict(meta["extra"]["model"])
    model = InDeed(model_cfg)
    rng = torch.get_rng_state()
    try:
        step, elapsed = load_state(folder, model, torch.optim.Adam(model.parameters()), torch.Generator())
    finally:
        torch.set_rng_state(rng)
    training = {**meta["extra"].get("facts", {}), "steps": step, "train_seconds": round(elapsed), **(facts or {})}
    return save_checkpoint(out, model.eval(), training)
