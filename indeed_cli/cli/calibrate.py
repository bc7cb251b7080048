"""`indeed calibrate`: store deployment statistics in a checkpoint's metadata.

denoise checkpoints: the OOD statistics of :mod:`indeed_cli.ood` from clean training images
under the checkpoint's training noise; detect checkpoints: the anomaly threshold from
held-out normal images.  `indeed train` calls :func:`calibrate_checkpoint` at the end of a run.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import CLIError, Device, Force, Json, Weights, emit_json


def calibrate_checkpoint(src: Path, output: Path, paths: list[Path], device: str, samples: int = 256,
                         seed: int = 0, note: dict | None = None) -> tuple[str, str, dict]:
    """Load ``src``, measure on ``paths``, write ``output`` with ``extra[key] = facts``.

    Returns (task, key, facts): key "detect" (threshold from normal images) or "ood"
    (statistics from ``samples`` noisy training images).  ``note`` is merged into the facts.
    """
    from ..checkpoint import load_checkpoint, save_checkpoint
    from ..inference import resolve_device
    ck = load_checkpoint(src, resolve_device(device))
    if ck.config.task == "detect":
        from ..detection import calibrate
        key, facts = "detect", calibrate(ck, paths)
    else:
        from ..ood import calibrate_ood
        from ..training import load_images
        key, facts = "ood", calibrate_ood(ck, load_images(paths, ck.config.channels), samples, seed)
    facts = {**facts, **(note or {})}
    save_checkpoint(output, ck.model, ck.training, {**ck.extra, key: facts})
    return ck.config.task, key, facts


def calibrate_cmd(
    data: Annotated[list[str], typer.Option("--data", help="denoise: clean training images; detect: normal images "
                                            "not used in training. Folder(s) or .txt list(s).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the calibrated checkpoint.")],
    weights: Weights = None,
    channels: Annotated[int, typer.Option("--channels", help="Without --weights: the bundled colour (3) or gray (1) model.")] = 3,
    samples: Annotated[int, typer.Option("--samples", min=8, help="denoise: noisy training images to measure.")] = 256,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    device: Device = "auto", json_out: Json = False, force: Force = False,
) -> None:
    """Add OOD statistics (denoise) or a detection threshold (detect) to a checkpoint's metadata."""
    from ..checkpoint import resolve_weights
    from ..training import list_images
    if output.exists() and not force:
        raise CLIError(f"{output} exists (use --force to overwrite)")
    try:
        paths = [p for spec in data for p in list_images(spec)]
    except FileNotFoundError as e:
        raise CLIError(str(e)) from None
    if not paths:
        raise CLIError("no calibration images")
    src = resolve_weights(weights, channels)
    task, key, facts = calibrate_checkpoint(src, output, paths, device, samples, seed,
                                            {"data": [str(d) for d in data]})
    summary = {"weights": str(src), "output": str(output), "task": task,
               "threshold": facts["threshold"], "n": facts.get("n", facts.get("n_calibration"))}
    if json_out:
        emit_json({**summary, key: {k: v for k, v in facts.items() if k != "points"}})
    else:
        typer.echo(f"{key} threshold {facts['threshold']:.4g} from {summary['n']} images: {output}", err=True)
