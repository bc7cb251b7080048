"""`indeed train`: train (or resume) a model; state and the exported checkpoint go to --out."""
from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer

from .common import CLIError, parse_scales


def train_cmd(
    data: Annotated[list[str], typer.Option("--data", help="Training images: folder(s) or .txt list(s) of paths.")],
    out: Annotated[Path, typer.Option("--out", help="Run folder: resumable state, log.jsonl, model.safetensors.")],
    task: Annotated[str, typer.Option("--task", help="denoise, or detect (train on normal images only).")] = "denoise",
    textures: Annotated[Optional[str], typer.Option("--textures", help="detect: texture images for synthetic anomalies (e.g. DTD).")] = None,
    anomalies: Annotated[str, typer.Option("--anomalies", help="detect: synthetic anomaly preset: strong, subtle "
                                           "(also faint, soft-edged ones) or surface (large texture regions); "
                                           "docs/detect.md.")] = "strong",
    scales: Annotated[Optional[str], typer.Option("--scales", help="Image pyramid to train on. detect: also the "
                                                  "read-out scales (maps averaged; large defects need it, "
                                                  "docs/detect.md), default 1,0.5,0.25. denoise: scale "
                                                  "augmentation (copies smaller than --patch are left out), "
                                                  "default 1.")] = None,
    channels: Annotated[int, typer.Option("--channels", help="1 = gray model, 3 = colour model.")] = 3,
    val: Annotated[Optional[str], typer.Option("--val", help="Held-out images for validation PSNR.")] = None,
    val_count: Annotated[int, typer.Option("--val-count", help="Without --val: hold out the last N training images.")] = 8,
    steps: Annotated[int, typer.Option("--steps", help="Planned total steps (LR schedule).")] = 20000,
    batch: Annotated[int, typer.Option("--batch")] = 32,
    patch: Annotated[int, typer.Option("--patch")] = 128,
    lr: Annotated[float, typer.Option("--lr")] = 4e-4,
    sigma_max: Annotated[Optional[float], typer.Option("--sigma-max", help="AWGN sigma ~ U(0, max] (8-bit units); default 75 for denoise, 5 for detect.")] = None,
    clip_prob: Annotated[float, typer.Option("--clip-prob", help="Share of patches clipped+quantised to 8 bits.")] = 0.5,
    rank: Annotated[int, typer.Option("--rank", help="r0, the maximal rank.")] = 64,
    sparse_width: Annotated[int, typer.Option("--sparse-width", help="f_thetaS U-Net width at its finest scale.")] = 64,
    sparse_blocks: Annotated[int, typer.Option("--sparse-blocks", help="Residual blocks per U-Net scale.")] = 2,
    sparse_levels: Annotated[int, typer.Option("--sparse-levels", help="U-Net scales (inputs padded to 2**levels).")] = 3,
    sparse_input: Annotated[Optional[str], typer.Option("--sparse-input", help="What f_thetaS sees: residual "
                                                        "(Y - AB^T, the paper) or residual+lowrank (also AB^T, "
                                                        "docs/model.md); default residual+lowrank for denoise, "
                                                        "residual for detect.")] = None,
    lowrank_width: Annotated[int, typer.Option("--lowrank-width")] = 32,
    sigma0: Annotated[float, typer.Option("--sigma0", help="Precision of the supervision likelihood.")] = 1e5,
    no_bayes: Annotated[bool, typer.Option("--no-bayes", help="Drop l_fid, l_rank, l_sparse (ablation #9).")] = False,
    sigma0_noise_ref: Annotated[float, typer.Option("--sigma0-noise-ref", help="denoise: scale each patch's sigma0 by "
                                                    "REF/max(sigma, REF/5) (8-bit units), weighting low noise more; "
                                                    "0 = constant sigma0 (the paper).")] = 0.0,
    time_limit: Annotated[float, typer.Option("--time-limit", help="Stop cleanly after this many seconds (0 = none).")] = 0,
    time_budget: Annotated[float, typer.Option("--time-budget", help="Total training seconds across resumes; the LR schedule follows it.")] = 0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    deterministic: Annotated[bool, typer.Option("--deterministic", help="Reproducible runs: deterministic kernels and "
                                                "no cuDNN autotuning (slower on a GPU); needs a step-based schedule "
                                                "(no --time-budget).")] = False,
    device: Annotated[str, typer.Option("--device")] = "auto",
    init: Annotated[Optional[str], typer.Option("--init", help="Start from this checkpoint's weights (fine-tuning; "
                                                "its model config is used). A bundled name, path or hf:// reference.")] = None,
    export: Annotated[Optional[Path], typer.Option("--export", help="Also copy the checkpoint here.")] = None,
    log_every: Annotated[int, typer.Option("--log-every")] = 100,
    val_every: Annotated[int, typer.Option("--val-every")] = 1000,
    ood_samples: Annotated[int, typer.Option("--ood-samples", help="denoise: noisy training crops for the OOD statistics (0 = skip).")] = 256,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
) -> None:
    """Train InDeed on clean images with the paper's loss (resumes from --out if state exists)."""
    from ..config import LossWeights, ModelConfig
    from ..training import TrainConfig, list_images, load_images, train
    if task not in ("denoise", "detect"):
        raise CLIError(f"--task must be denoise or detect, got {task!r}")
    if sparse_input is None:  # better for denoising; level for detection (docs/detect.md), so the paper's form there
        sparse_input = "residual+lowrank" if task == "denoise" else "residual"
    pyramid = parse_scales(scales or ("1,0.5,0.25" if task == "detect" else "1"))
    try:  # option conflicts (TrainConfig.check) before any data is listed or loaded
        TrainConfig(time_budget=time_budget, deterministic=deterministic).check()
    except ValueError as e:
        raise CLIError(str(e)) from None
    if sigma_max is None:
        sigma_max = 75.0 if task == "denoise" else 5.0
    try:
        paths = [p for spec in data for p in list_images(spec)]
        val_paths = list_images(val) if val else []
    except FileNotFoundError as e:
        raise CLIError(str(e)) from None
    if not val and val_count:
        paths, val_paths = paths[:-val_count], paths[-val_count:]
    if not paths:
        raise CLIError("no training images")
    if task == "detect" and not val_paths:
        raise CLIError("--task detect needs held-out normal images (--val DIR or --val-count N) to learn its threshold")
    try:
        cfg = ModelConfig(channels=channels, rank=rank, task=task, sparse_width=sparse_width, sparse_blocks=sparse_blocks,
                          sparse_levels=sparse_levels, sparse_input=sparse_input, lowrank_width=lowrank_width)
        cfg.validate()
    except ValueError as e:
        raise CLIError(str(e)) from None
    init_path = ""
    if init:
        from ..checkpoint import CheckpointError, read_metadata, resolve_weights
        try:
            init_path = str(resolve_weights(init, channels, task))
            cfg = ModelConfig.from_dict(read_metadata(init_path)["config"])
        except CheckpointError as e:
            raise CLIError(str(e), 3) from None
        if cfg.task != task or cfg.channels != channels:
            raise CLIError(f"--init {init} is a {cfg.channels}-channel {cfg.task} model; this run is a "
                           f"{channels}-channel {task} one", 3)
    tc = TrainConfig(task=task, steps=steps, batch=batch, patch=patch, lr=lr, sigma_max=sigma_max, clip_prob=clip_prob,
                     seed=seed, time_limit=time_limit, time_budget=time_budget, log_every=log_every, val_every=val_every,
                     losses=LossWeights(sigma0=sigma0, bayesian=not no_bayes, sigma0_noise_ref=sigma0_noise_ref), init=init_path,
                     deterministic=deterministic)
    typer.echo(f"training on {len(paths)} images, validating on {len(val_paths)}", err=True)
    facts = {"task": task, "data": [str(d) for d in data], "n_train": len(paths), "n_val": len(val_paths)}
    make_batch = None
    if task == "detect":
        from ..training import detect_batch_fn
        from ..anomaly import PRESETS
        if anomalies not in PRESETS:
            raise CLIError(f"--anomalies must be one of {sorted(PRESETS)}, got {anomalies!r}")
        tex = load_images(list_images(textures), channels) if textures else None
        make_batch = detect_batch_fn(tex, PRESETS[anomalies])
        facts["textures"] = textures
        facts["anomalies"] = {"preset": anomalies, **asdict(PRESETS[anomalies])}
        facts["scales"] = list(pyramid)
    val_images = load_images(val_paths, channels) if task == "denoise" else []
    train_images = load_images(paths, channels)
    if pyramid != (1.0,):
        from ..training import image_pyramid
        train_images = image_pyramid(train_images, pyramid)
        if task == "denoise":  # detection mirror-extends small images; denoising crops only whole patches
            train_images = [im for im in train_images if min(im.shape[1:]) >= patch]
            facts["augment_scales"] = list(pyramid)
    try:
        rec = train(cfg, tc, train_images, out, val_images or None, device=device, facts=facts,
                    make_batch=make_batch, progress=not quiet, log=lambda m: typer.echo(m, err=True))
    except ValueError as e:
        raise CLIError(str(e)) from None
    if rec.get("rank", 0) == 0 and (task == "detect" or ood_samples):
        from .calibrate import calibrate_checkpoint
        model_path = out / "model.safetensors"
        # detect: threshold from the held-out normal images; denoise: OOD statistics of the training data
        _, key, facts = calibrate_checkpoint(model_path, model_path, val_paths if task == "detect" else paths,
                                             device, ood_samples)
        typer.echo(f"{key} threshold {facts['threshold']:.4g} stored in {model_path}", err=True)
    if rec.get("rank", 0) != 0:  # other torchrun ranks: rank 0 reports and exports
        return
    typer.echo(f"step {rec.get('step')}: {out / 'model.safetensors'} " +
               " ".join(f"{k}={v:.2f}" for k, v in rec.items() if k.startswith("psnr")), err=True)
    if export:
        shutil.copyfile(out / "model.safetensors", export)

