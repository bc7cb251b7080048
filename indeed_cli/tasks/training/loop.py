"""The training loop of f_theta: resumable, time-bounded, on one device or many.

``time_limit`` ends a call cleanly, and the state (:mod:`.state`) is written to the run
folder, from which the next call continues.  The exported checkpoint is the ordinary fp16
model file of :mod:`indeed_cli.model.checkpoint`.

Multi-GPU: run under ``torchrun --nproc_per_node=K``; each rank samples its own
patches (seeded by rank) and gradients are averaged by DistributedDataParallel.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.distributed as tdist
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from ...model import InDeed, ModelConfig, load_checkpoint, save_checkpoint
from ...model.checkpoint import load_support_features
from ...model.config import FINE_TUNE_FIELDS
from .batches import RankedBatches, denoise_batch
from .config import TrainConfig, lr_at
from .data import PatchSampler
from .objective import training_loss
from .state import has_state, load_state, save_state
from .validation import validate


def run_training(
    model_cfg: ModelConfig,
    tc: TrainConfig,
    train_images: list[torch.Tensor],
    out_dir: Path,
    val_images: list[torch.Tensor] | None = None,
    device: str = "auto",
    facts: dict | None = None,
    make_batch: Callable | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> dict:
    """Train (or resume) and export ``out_dir/model.safetensors``; returns the last log record.

    ``make_batch(sampler, n, tc, gen) -> (Y, targets)`` makes each batch; default: AWGN denoising.
    The backend settings (TF32, cuDNN autotuning, deterministic kernels) are restored afterwards.
    """
    tc.check()
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    # cuDNN autotuning picks the fastest kernels per shape, which may differ from run to run;
    # deterministic mode also asks PyTorch for deterministic kernels (a warning names any op
    # that has none) and cuBLAS for a fixed workspace
    torch.backends.cudnn.benchmark = not tc.deterministic
    torch.backends.cudnn.deterministic = tc.deterministic
    if tc.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        return _train(model_cfg, tc, train_images, out_dir, val_images, device, facts, make_batch, progress, log)
    finally:
        (
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            torch.backends.cudnn.benchmark,
            torch.backends.cudnn.deterministic,
        ) = saved[:4]
        torch.use_deterministic_algorithms(saved[4], warn_only=saved[5])


def _train(
    model_cfg: ModelConfig,
    tc: TrainConfig,
    train_images: list[torch.Tensor],
    out_dir: Path,
    val_images: list[torch.Tensor] | None,
    device: str,
    facts: dict | None,
    make_batch: Callable | None,
    progress: bool,
    log: Callable[[str], None],
) -> dict:
    """The training loop of :func:`run_training`, under its backend settings."""
    dist = int(os.environ.get("WORLD_SIZE", "1")) > 1
    rank = int(os.environ.get("RANK", "0"))
    if dist:
        # each rank on the GPU of its local rank, unless the CPU was asked for or there is no GPU;
        # NCCL only for GPU tensors (a CPU run on a machine with GPUs needs gloo)
        local = int(os.environ.get("LOCAL_RANK", "0"))
        on_gpu = device != "cpu" and torch.cuda.is_available()
        dev = torch.device(f"cuda:{local}" if on_gpu else "cpu")
        tdist.init_process_group("nccl" if on_gpu else "gloo")
        if on_gpu:
            torch.cuda.set_device(dev)
    else:
        dev = torch.device(
            "cuda" if device == "auto" and torch.cuda.is_available() else ("cpu" if device == "auto" else device)
        )
    out_dir = Path(out_dir)
    torch.manual_seed(tc.seed + rank)
    model = InDeed(model_cfg).to(dev)
    if dev.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=tc.lr)
    gen = torch.Generator().manual_seed(tc.seed * 1000 + rank)
    step, elapsed0 = 0, 0.0
    if has_state(out_dir):
        step, elapsed0 = load_state(out_dir, model, opt, gen)
        if dist:  # every rank continues with its own stream
            gen.manual_seed(tc.seed * 1000 + rank + 7919 * step)
        log(f"resumed from {out_dir} at step {step}")
    elif tc.init:  # fine-tune: start from a checkpoint's weights with a fresh optimizer and schedule
        start = load_checkpoint(tc.init, dev)
        if start.members:
            log(f"--init {tc.init}: a detector of {1 + len(start.members)} members; fine-tuning its first")
        switched = {f: getattr(model_cfg, f) for f in FINE_TUNE_FIELDS}
        if replace(start.config, **switched) != model_cfg:
            raise ValueError(f"--init checkpoint {tc.init} has another model config than this run")
        # what a fine-tune adds starts fresh (all of a new f_thetaM; the features' projection at zero,
        # so that f_thetaM starts as it was); everything else must load
        missing, unexpected = model.load_state_dict(start.model.state_dict(), strict=False)
        if unexpected or any(not k.startswith("support.") for k in missing):
            raise ValueError(f"--init checkpoint {tc.init} does not fit this run's network")
        adds_support = not start.config.support_width and model_cfg.support_width
        adds_features = not start.config.support_features and model_cfg.support_features
        log(
            f"initialised from {tc.init} ({start.training.get('steps', '?')} steps)"
            + ("; f_thetaM (support posterior) starts fresh" if adds_support else "")
            + ("; f_thetaM now also reads ImageNet features" if adds_features and not adds_support else "")
        )
        if adds_features:
            load_support_features(model, tc.support_features_weights)
    elif model_cfg.support_features:
        load_support_features(model, tc.support_features_weights)
    if tc.train_only:  # after loading, so that a resumed run freezes the same weights
        n_trained, n_all = freeze_except(model, tc.train_only), sum(p.numel() for p in model.parameters())
        log(f"training {n_trained:,} of {n_all:,} weights ({', '.join(tc.train_only)})")
    net = model
    if dist:
        net = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    sampler = PatchSampler(train_images, tc.patch, dev, gen, pad_small=tc.task == "detect")
    use_bf16 = tc.precision == "bf16" or (tc.precision == "auto" and dev.type == "cuda")
    make_batch = make_batch or denoise_batch
    if tc.losses.rank_sup > 0:
        make_batch = RankedBatches(make_batch)
    device_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    run_facts = {
        **(facts or {}),
        "init": tc.init or None,
        "device": device_name,
        "batch": tc.batch,
        "patch": tc.patch,
        "sigma_max": tc.sigma_max,
        "sigma_power": tc.sigma_power,
        "clip_prob": tc.clip_prob,
        "camera_share": tc.camera_share,
        "saturation_share": tc.saturation_share,
        "lr": tc.lr,
        "losses": asdict(tc.losses),
        "deterministic": tc.deterministic,
        **({"train_only": list(tc.train_only)} if tc.train_only else {}),
    }
    # what a state holds besides tensors: enough to export a checkpoint from it (state.export_state)
    state_extra = {"train": _jsonable(tc), "model": json.loads(model_cfg.to_json()), "facts": run_facts}
    shard_bytes = int(tc.state_shard_mb * 1e6)
    t0 = time.time()
    running: dict[str, float] = {}
    record: dict = {"step": step}
    bar = None
    if progress and rank == 0:
        bar = _progress_bar(tc, step, elapsed0)
    model.train()
    stop_reason = "steps"
    while step < tc.steps:
        elapsed = elapsed0 + time.time() - t0
        reason = (
            "time limit"
            if tc.time_limit and time.time() - t0 > tc.time_limit
            else "time budget"
            if tc.time_budget and elapsed > tc.time_budget
            else ""
        )
        if dist:  # every rank must stop at the same step, or the others wait in DDP's all-reduce for ever
            reason = STOP_REASONS[_max_over_ranks(STOP_REASONS.index(reason), dev)]
        if reason:
            stop_reason = reason
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, tc, elapsed)
        Y, targets = make_batch(sampler, tc.batch, tc, gen)
        if dev.type == "cuda":
            Y = Y.contiguous(memory_format=torch.channels_last)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_bf16):
            total, parts = training_loss(net, Y, targets, tc.task, tc.losses, model_cfg.priors)
        skip = not torch.isfinite(total)
        if dist:  # likewise for skipping a batch: a rank that skips its backward would stall the others
            skip = bool(_max_over_ranks(int(skip), dev))
        if skip:
            log(f"step {step}: non-finite loss, batch skipped")
            opt.zero_grad(set_to_none=True)
            step += 1
            continue
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e4)
        opt.step()
        step += 1
        for k, v in parts.items():
            running[k] = running.get(k, 0.0) + v
        running["n"] = running.get("n", 0) + 1
        if bar is not None:
            bar.update(1 if bar.unit == "step" else round(elapsed0 + time.time() - t0 - bar.n, 1))
            if bar.unit == "s":
                bar.set_description(f"train, step {step}", refresh=False)
        if rank == 0 and step % tc.log_every == 0:
            n = running.pop("n")
            record = {
                "step": step,
                "lr": lr_at(step, tc, elapsed),
                "time_s": round(elapsed0 + time.time() - t0, 1),
                **{k: round(v / n, 5) for k, v in running.items()},
            }
            running = {}
            if val_images and step % tc.val_every == 0:
                record.update(validate(model, val_images, dev))
            _append_log(out_dir, record)
            if bar is not None:
                bar.set_postfix({k: record[k] for k in record if k in BAR_TERMS})
        if rank == 0 and step % tc.save_every == 0:
            save_state(out_dir, model, opt, step, gen, state_extra, elapsed0 + time.time() - t0, shard_bytes)
    if bar is not None:
        bar.close()
    if rank == 0:
        save_state(out_dir, model, opt, step, gen, state_extra, elapsed0 + time.time() - t0, shard_bytes)
        final = validate(model, val_images, dev) if val_images else {}
        record = {"step": step, "stop": stop_reason, "time_s": round(elapsed0 + time.time() - t0, 1), **final}
        _append_log(out_dir, record)
        training_facts = {
            **run_facts,
            "steps": step,
            "train_seconds": round(elapsed0 + time.time() - t0),
            "validation": final,
        }
        save_checkpoint(out_dir / "model.safetensors", model, training_facts)
    if dist:
        tdist.destroy_process_group()
    return {**record, "step": step, "rank": rank}  # every rank reports the step it stopped at


STOP_REASONS = ("", "time limit", "time budget")
BAR_TERMS = ("sup", "fid", "rank", "sparse", "support", "psnr_s25")


def freeze_except(model: torch.nn.Module, prefixes: tuple[str, ...]) -> int:
    """Freeze every weight of ``model`` whose name starts with none of ``prefixes`` (requires_grad
    False: Adam skips weights without a gradient, so they keep their starting values); returns how
    many weights stay trainable.  ValueError where a prefix names no weight (a typo would otherwise
    freeze the whole network silently)."""
    params = dict(model.named_parameters())
    for prefix in prefixes:
        if not any(n.startswith(prefix) for n in params):
            raise ValueError(f"--train-only {prefix!r} names no weight of this network (e.g. {next(iter(params))!r})")
    for n, p in params.items():
        p.requires_grad_(n.startswith(prefixes))
    return sum(p.numel() for p in params.values() if p.requires_grad)


def _progress_bar(tc: TrainConfig, step: int, elapsed0: float) -> tqdm:
    """A bar over the steps, or over the seconds when a time budget or limit will end the run first:
    its ETA then follows the clock, not a step count the run will never reach."""
    ends = [tc.time_budget] if tc.time_budget else []
    if tc.time_limit:
        ends.append(elapsed0 + tc.time_limit)
    if ends:
        fmt = "{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}{postfix}]"
        return tqdm(total=round(min(ends), 1), initial=round(elapsed0, 1), desc="train", unit="s", bar_format=fmt)
    return tqdm(total=tc.steps, initial=step, desc="train", unit="step", dynamic_ncols=True)


def _max_over_ranks(code: int, dev: torch.device) -> int:
    """The largest ``code`` over all DDP ranks: per-rank decisions (stop, skip a batch) agreed."""
    t = torch.tensor([code], device=dev)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return int(t.item())


def _jsonable(tc: TrainConfig) -> dict:
    return json.loads(json.dumps(asdict(tc)))


def _append_log(out_dir: Path, record: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "log.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
