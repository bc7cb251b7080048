"""Train a model from folders of images with a named recipe, then calibrate it for deployment.

`indeed train` is this function with options; both build the same model from the same recipe
(:mod:`indeed_cli.tasks.training.recipes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path

from tqdm import tqdm

from ..model import CheckpointError, ModelConfig, read_metadata, resolve_weights
from ..model.checkpoint import read_feature_trunk
from ..model.config import fine_tune_config
from ..model.memory import check_bank_bits
from ..model.registry import resolve_feature_weights
from ..tasks.detection import PRESETS
from ..tasks.detection.memory import memory_sample
from ..tasks.training import (
    detect_batch_fn,
    has_state,
    image_pyramid,
    list_images,
    load_images,
    read_state_metadata,
    recipe,
    run_training,
)
from .calibrate import calibrate_checkpoint
from .inputs import UsageError


def train(
    data: Sequence[str | Path],
    out: str | Path,
    *,
    task: str = "denoise",
    channels: int = 3,
    val: str | Path | None = None,
    val_count: int | None = None,
    scales: Sequence[float] | None = None,
    textures: str | Path | None = None,
    anomalies: str | None = None,
    init: str | None = None,
    model: dict | None = None,
    ood_samples: int | None = None,
    memory_entries: int | None = None,
    memory_bits: int | None = None,
    device: str = "auto",
    progress: bool = True,
    log: Callable[[str], None] = print,
    **settings,
) -> dict:
    """Train (or resume) a ``task`` model on the images of ``data`` (folders or .txt lists) into the
    run folder ``out``, which ends with ``model.safetensors``, calibrated: a detector gets its
    threshold from the held-out normal images, a denoiser the OOD statistics of its training images.

    Held-out images: ``val`` (a folder or list), else the last ``val_count`` training images.
    ``model`` overrides fields of the recipe's :class:`~indeed_cli.model.ModelConfig`; ``settings``
    override fields of its :class:`~indeed_cli.tasks.training.TrainConfig` (steps, batch, lr,
    time_budget, losses, ...).  ``init``: a checkpoint whose weights start the run (its config is
    used).  ``memory_entries`` (detect): the most entries of the memory of normal features filled
    after training (default tasks.detection.MEMORY_ENTRIES); ``memory_bits`` (detect): the bits per
    value its bank is stored in, 8 (default) or 4 (half the bytes).  Returns the last log record, with ``model``
    (the checkpoint's path) on rank 0.
    """
    try:
        rc = recipe(task)
        tc = rc.train_config(**settings)
    except (TypeError, ValueError) as e:
        raise UsageError(str(e)) from None
    if memory_entries is not None and task != "detect":
        raise UsageError("--memory-entries is for detectors (--task detect): a denoiser has no memory")
    if memory_bits is not None and task != "detect":
        raise UsageError("--memory-bits is for detectors (--task detect): a denoiser has no memory")
    # refused before training, not after it
    if memory_entries is not None and memory_entries < 1:
        raise UsageError(f"--memory-entries must be at least 1, got {memory_entries}")
    if memory_bits is not None:
        try:
            check_bank_bits(memory_bits, "--memory-bits")
        except ValueError as e:
            raise UsageError(str(e)) from None
    out = Path(out)
    pyramid = tuple(scales or rc.scales)
    if val_count is None:
        val_count = rc.val_count
    try:
        paths = [p for spec in data for p in list_images(spec)]
        val_paths = list_images(val) if val else []
    except FileNotFoundError as e:
        raise UsageError(str(e)) from None
    if not val and val_count:
        paths, val_paths = paths[:-val_count], paths[-val_count:]
    if not paths:
        found = len(val_paths) if not val and val_count else 0
        why = f": the {found} image(s) found went to validation (--val-count {val_count})" if found else ""
        raise UsageError(f"no training images{why}")
    if task == "detect" and not val_paths:
        raise UsageError(
            "--task detect needs held-out normal images (--val DIR or --val-count N) to learn its threshold"
        )
    try:
        # with --init the checkpoint's config is the base (below): features may go to its f_thetaM
        cfg = rc.model_config(
            channels, **{k: v for k, v in (model or {}).items() if not (init and k == "support_features")}
        )
    except (TypeError, ValueError) as e:
        raise UsageError(str(e)) from None
    start = None  # the --init checkpoint's config
    if init:
        init = str(resolve_weights(init, channels, task))
        try:
            start = ModelConfig.from_dict(read_metadata(init)["config"])
            cfg = fine_tune_config(start, model or {})
        except ValueError as e:
            raise UsageError(str(e)) from None
        if cfg.task != task or cfg.channels != channels:
            raise CheckpointError(
                f"--init {init} is a {cfg.channels}-channel {cfg.task} model; this run is a "
                f"{channels}-channel {task} one"
            )
        tc = rc.train_config(**{**settings, "init": init})
    # the ImageNet trunk comes from the bundled copy or a file, unless the --init checkpoint carries it
    if cfg.support_features and not (start and start.support_features):
        trunk = resolve_feature_weights(tc.support_features_weights, cfg.support_features)
        read_feature_trunk(trunk, cfg.support_features)
        tc = replace(tc, support_features_weights=str(trunk))
    if tc.camera_share and cfg.channels != 3:
        raise UsageError("--camera-noise needs a colour model (--channels 3): camera noise is made in RGB")
    if tc.saturation_share and cfg.channels != 3:
        raise UsageError("--saturation needs a colour model (--channels 3)")
    model_path = out / "model.safetensors"
    done = _already_done(out, tc, model_path)
    if done is not None:
        log(done["message"])
        return done["record"]
    log(f"training on {len(paths)} images, validating on {len(val_paths)}")
    facts: dict = {"task": task, "data": [str(d) for d in data], "n_train": len(paths), "n_val": len(val_paths)}
    make_batch = None
    if task == "detect":
        preset = anomalies or rc.anomalies
        if preset not in PRESETS:
            raise UsageError(f"--anomalies must be one of {sorted(PRESETS)}, got {preset!r}")
        tex = load_images(list_images(textures), channels) if textures else None
        make_batch = detect_batch_fn(tex, PRESETS[preset])
        facts.update(
            textures=str(textures) if textures else None,
            anomalies={"preset": preset, **asdict(PRESETS[preset])},
            scales=list(pyramid),
        )
    val_images = load_images(val_paths, channels) if task == "denoise" else []
    train_images = load_images(paths, channels)
    if pyramid != (1.0,):
        train_images = image_pyramid(train_images, pyramid)
        if task == "denoise":  # detection mirror-extends small images; denoising crops only whole patches
            train_images = [im for im in train_images if min(im.shape[1:]) >= tc.patch]
            facts["augment_scales"] = list(pyramid)
    try:
        rec = run_training(
            cfg,
            tc,
            train_images,
            out,
            val_images or None,
            device=device,
            facts=facts,
            make_batch=make_batch,
            progress=progress,
            log=log,
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    if rec.get("rank", 0) != 0:  # other torchrun ranks: rank 0 calibrates and reports
        return rec
    samples = rc.ood_samples if ood_samples is None else ood_samples
    if task == "detect" or samples:
        # detect: threshold from the held-out normal images; denoise: OOD statistics of the training
        # data, in at most a tenth of a time budget (a CPU takes seconds per sample)
        seconds = max(CALIBRATION_MIN_SECONDS, 0.1 * tc.time_budget) if tc.time_budget else None
        with tqdm(total=samples, desc="OOD statistics", unit="crop", disable=None if progress else True,
                  leave=False) as bar:  # fmt: skip
            # a new detector's memory of normal features is filled from its training images (Eq. memory fusion)
            memory = memory_sample(paths) if task == "detect" else None
            # a new detector learns its threshold, and reads out, in bf16 where the hardware has it
            precision = DETECT_PRECISION if task == "detect" else None
            _, key, cal = calibrate_checkpoint(model_path, model_path, val_paths if task == "detect" else paths,
                                               device, samples, max_seconds=seconds, progress=bar.update,
                                               memory=memory, memory_entries=memory_entries,
                                               memory_bits=memory_bits, precision=precision)  # fmt: skip
        log(f"{key} threshold {cal['threshold']:.4g} stored in {model_path}")
    warning = barely_trained(task, rec)
    if warning:
        log(warning)
    return {**rec, "model": str(model_path)}


CALIBRATION_MIN_SECONDS = 15.0
# the read-out precision a new detector is calibrated at and stored with (tasks.detection.readout_precision):
# auto, bf16 where the device computes it natively. The bundled magnetic-tile detector read out so on
# a 2-core AMD EPYC (AVX512-BF16) in 0.61 s per development image against 0.73 s in fp32, at 0.855 /
# 0.492 / 0.903 pixel AUROC / AP / image AUROC against 0.856 / 0.493 / 0.903 (docs/results.md)
DETECT_PRECISION = "auto"
# a denoiser whose validation PSNR at sigma = 25 is not this far above its noisy input's has hardly learned
BARELY_GAIN_DB, NOISY_PSNR_S25 = 5.0, 20.17
BARELY_STEPS = 1000


def barely_trained(task: str, record: dict) -> str:
    """A warning when a run ended with a model that has hardly learned anything (empty otherwise)."""
    steps, psnr = record.get("step", 0), record.get("psnr_s25")
    if task == "denoise" and psnr is not None:
        if psnr >= NOISY_PSNR_S25 + BARELY_GAIN_DB:
            return ""
        why = f"validation PSNR {psnr:.1f} dB at sigma 25, where its noisy input has {NOISY_PSNR_S25:.1f} dB"
    elif steps < BARELY_STEPS:
        why = f"{steps} training steps"
    else:
        return ""
    return (f"warning: this model is barely trained ({why}); it was saved, but train longer "
            "(--time-budget) or on a GPU before using it")  # fmt: skip


def _already_done(out: Path, tc, model_path: Path) -> dict | None:
    """When the run in ``out`` has already used its steps or time budget and exported its model:
    what to say and return instead of validating and calibrating again for no new step."""
    if not has_state(out) or not model_path.exists():
        return None
    meta = read_state_metadata(out)
    if meta["step"] < tc.steps and not (tc.time_budget and meta["elapsed"] >= tc.time_budget):
        return None
    budget = f", {meta['elapsed']:.0f} s of a {tc.time_budget:g} s budget" if tc.time_budget else ""
    message = (f"nothing to do: {out} is trained ({meta['step']} steps{budget}); the model is {model_path} "
               "(a larger --time-budget or --steps continues it)")  # fmt: skip
    return {"message": message, "record": {"step": meta["step"], "stop": "done before", "model": str(model_path)}}
