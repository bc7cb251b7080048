"""`indeed calibrate`: store deployment statistics in a checkpoint's metadata.

denoise checkpoints: the OOD statistics of :mod:`indeed_cli.ood` from clean training images
under the checkpoint's training noise; detect checkpoints: the anomaly threshold from
held-out normal images (what `indeed train --task detect` does at the end of training).
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .common import CLIError, Device, Force, Json, Weights, emit_json


def calibrate_cmd(
    data: Annotated[list[str], typer.Option("--data", help="denoise: clean training images; detect: normal images "
                                            "not used in training. Folder(s) or .txt list(s).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the calibrated checkpoint.")],
    weights: Weights = None,
    channels: Annotated[int, typer.Option("--channels", help="Without --weights: the bundled colour (3) or gray (1) model.")] = 3,
    samples: Annotated[int, typer.Option("--samples", min=8, help="denoise: noisy training crops to measure.")] = 256,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    device: Device = "auto", json_out: Json = False, force: Force = False,
) -> None:
    """Add OOD statistics (denoise) or a detection threshold (detect) to a checkpoint's metadata."""
    from ..checkpoint import load_checkpoint, resolve_weights, save_checkpoint
    from ..inference import resolve_device
    from ..training import list_images, load_images
    if output.exists() and not force:
        raise CLIError(f"{output} exists (use --force to overwrite)")
    try:
        paths = [p for spec in data for p in list_images(spec)]
    except FileNotFoundError as e:
        raise CLIError(str(e)) from None
    if not paths:
        raise CLIError("no calibration images")
    src = resolve_weights(weights, channels)
    ck = load_checkpoint(src, resolve_device(device))
    if ck.config.task == "detect":
        from ..detection import calibrate
        facts = calibrate(ck, paths)
        extra, key = {**ck.extra, "detect": facts}, "detect"
    else:
        from ..ood import calibrate_ood
        facts = {**calibrate_ood(ck, load_images(paths, ck.config.channels), samples, seed),
                 "data": [str(d) for d in data]}
        extra, key = {**ck.extra, "ood": facts}, "ood"
    save_checkpoint(output, ck.model, ck.training, extra)
    summary = {"weights": str(src), "output": str(output), "task": ck.config.task,
               "threshold": facts["threshold"], "n": facts.get("n", facts.get("n_calibration"))}
    if json_out:
        emit_json({**summary, key: {k: v for k, v in facts.items() if k != "points"}})
    else:
        typer.echo(f"{key} threshold {facts['threshold']:.4g} from {summary['n']} samples: {output}", err=True)
