"""`indeed detect`: pixel-wise anomaly maps from the posterior of S, a score and a decision per image."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..pipelines import Outcome, detect_folder, parse_scales
from .options import ALL_SHARED, RunOptions, shared_options
from .runner import Reporter


@shared_options(*ALL_SHARED)
def detect_cmd(
    inputs: Annotated[list[str], typer.Argument(metavar="IMAGE", help="Image files, folders or glob patterns.")],
    maps: Annotated[
        Path, typer.Option("--maps", metavar="DIR", help="Folder for <stem>_anomaly/_overlay/_mask.png and <stem>.npz.")
    ],
    threshold: Annotated[
        float | None,
        typer.Option(
            "--threshold",
            metavar="SCORE",
            help="Override the checkpoint's learned thresholds (images and pixels alike).",
        ),
    ] = None,
    scales: Annotated[
        str | None,
        typer.Option(
            "--scales",
            metavar="LIST",
            help="Read-out scales, e.g. 1,0.5,0.25 (maps averaged); default: those stored with the threshold.",
        ),
    ] = None,
    ensemble: Annotated[
        str | None,
        typer.Option(
            "--ensemble",
            metavar="N",
            help="Average the maps of N flips and rotations of each image (2, 4 or 8; N times the time); "
            "default: as many as the threshold was calibrated with (`indeed calibrate --ensemble`).",
        ),
    ] = None,
    run: RunOptions = RunOptions(),
) -> None:
    """Detect anomalies (defects) pixel by pixel; one JSON line per image with --json."""
    read_scales = parse_scales(scales) if scales else None
    report = Reporter(run.json_out, run.quiet)
    detect_folder(inputs, maps, threshold=threshold, scales=read_scales, ensemble=ensemble, **run.folder_run(report))
    report.finish(flag_summary(report.processed()))


def flag_summary(done: list[Outcome]) -> str:
    """How many images were flagged; when none was, the highest score and what to do about it."""
    flagged = sum(bool(o.record.get("anomalous")) for o in done)
    line = f"{flagged} of {len(done)} images flagged as anomalous"
    if done and not flagged:
        top = max(done, key=lambda o: o.record["score"])
        line += (
            f" (threshold {top.record['threshold']:.4g}, highest score {top.record['score']:.4g} for "
            f"{top.source.name}): --threshold sets another operating point, and a detector trained on "
            "your own normal images (indeed train --task detect) knows your surfaces"
        )
    return line
