"""`indeed calibrate`: store deployment statistics in a checkpoint's metadata."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..model import resolve_weights
from ..pipelines import calibrate_checkpoint, parse_scales
from ..tasks.training import list_images
from .options import Device, Force, Json, MemoryBits, MemoryEntries, Weights
from .runner import CLIError, emit_json


def calibrate_cmd(
    data: Annotated[
        list[str],
        typer.Option(
            "--data",
            metavar="DIR|LIST",
            help="denoise: clean training images; detect: normal images "
            "not used in training. Folder(s) or .txt list(s).",
        ),
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", metavar="PATH", help="Where to write the calibrated checkpoint.")
    ],
    weights: Weights = None,
    channels: Annotated[
        int,
        typer.Option("--channels", metavar="1|3", help="Without --weights: the bundled colour (3) or gray (1) model."),
    ] = 3,
    samples: Annotated[
        int, typer.Option("--samples", metavar="N", min=8, help="denoise: noisy training images to measure.")
    ] = 256,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="Seed of the noisy crops that are measured.")] = 0,
    scales: Annotated[
        str | None,
        typer.Option(
            "--scales",
            metavar="LIST",
            help="detect: read-out scales to learn the threshold for and store, e.g. 1,0.5,0.25 "
            "(default: the checkpoint's own).",
        ),
    ] = None,
    quantile: Annotated[
        float | None,
        typer.Option(
            "--quantile",
            metavar="Q",
            help="detect: the share of the normal images whose score stays at or below the threshold "
            "(default 0.99; 0.95 flags more defects and about one normal image in twenty).",
        ),
    ] = None,
    ensemble: Annotated[
        str | None,
        typer.Option(
            "--ensemble",
            metavar="N",
            help="detect: learn the threshold for maps averaged over N flips and rotations of each image "
            "(2, 4 or 8; stored, and `indeed detect` then reads out so; N times the time).",
        ),
    ] = None,
    member: Annotated[
        list[str] | None,
        typer.Option(
            "--member",
            metavar="CHECKPOINT",
            help="detect: add another trained detector as a member; the map becomes the mean of the "
            "members' maps, each at its own read-out scales (repeat for more; one read-out each). "
            "A bundled name, path or hf:// reference.",
        ),
    ] = None,
    memory: Annotated[
        list[str] | None,
        typer.Option(
            "--memory",
            metavar="DIR|LIST|none",
            help="detect: normal images (the training images) to fill a memory of ImageNet features from; "
            "its distance map is fused with the members' map as one more member. 'none' drops the memory "
            "a detector has. Default: keep what the detector has.",
        ),
    ] = None,
    memory_entries: MemoryEntries = None,
    memory_bits: MemoryBits = None,
    weight_bits: Annotated[
        int | None,
        typer.Option(
            "--weight-bits",
            metavar="8|4",
            help="the bits per weight the file stores its largest convolutions in (those int8 holds): 4 "
            "takes half their bytes, a little less exactly; the networks are rounded so before the statistics "
            "are learned. A detector whose memory reads its features through them needs --memory too. "
            "Default: as the checkpoint.",
        ),
    ] = None,
    precision: Annotated[
        str | None,
        typer.Option(
            "--precision",
            metavar="fp32|bf16|auto",
            help="detect: the read-out precision the threshold is learned at, stored with it; `indeed detect` "
            "then reads out at it unless given --precision. auto: bf16 where the hardware has it (GPUs, CPUs "
            "with AMX or AVX512-BF16), fp32 elsewhere. Default: the detector's own (fp32 if never calibrated).",
        ),
    ] = None,
    device: Device = "auto",
    json_out: Json = False,
    force: Force = False,
) -> None:
    """Add OOD statistics (denoise) or a detection threshold (detect) to a checkpoint's metadata."""
    if output.exists() and not force:
        raise CLIError(f"{output} exists (use --force to overwrite)")
    try:
        paths = [p for spec in data for p in list_images(spec)]
    except FileNotFoundError as e:
        raise CLIError(str(e)) from None
    if not paths:
        raise CLIError("no calibration images")
    src = resolve_weights(weights, channels)
    read_scales = parse_scales(scales) if scales else None
    memory_images: list[Path] | str | None = None
    if memory == ["none"]:
        memory_images = "none"
    elif memory:
        try:
            memory_images = [p for spec in memory for p in list_images(spec)]
        except FileNotFoundError as e:
            raise CLIError(str(e)) from None
        if not memory_images:
            raise CLIError("--memory: no images")
    try:
        task, key, facts = calibrate_checkpoint(
            src,
            output,
            paths,
            device,
            samples,
            seed,
            {"data": [str(d) for d in data]},
            scales=read_scales,
            quantile=quantile,
            ensemble=ensemble,
            members=member,
            memory=memory_images,
            memory_entries=memory_entries,
            memory_bits=memory_bits,
            weight_bits=weight_bits,
            precision=precision,
        )
    except ValueError as e:
        raise CLIError(str(e)) from None
    summary = {
        "weights": str(src),
        "output": str(output),
        "task": task,
        "threshold": facts["threshold"],
        "n": facts.get("n", facts.get("n_calibration")),
    }
    if json_out:
        emit_json({**summary, key: {k: v for k, v in facts.items() if k != "points"}})
    else:
        typer.echo(f"{key} threshold {facts['threshold']:.4g} from {summary['n']} images: {output}", err=True)
