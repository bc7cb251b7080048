"""`indeed detect`: pixel-wise anomaly maps from the posterior of S, a score and a decision per image."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..pipelines import detect_folder, parse_scales
from .options import ALL_SHARED, RunOptions, shared_options
from .runner import Reporter, warn


@shared_options(*ALL_SHARED)
def detect_cmd(
    inputs: Annotated[list[str], typer.Argument(help="Image files, folders or glob patterns.")],
    maps: Annotated[Path, typer.Option("--maps", help="Folder for <stem>_anomaly/_overlay/_mask.png and <stem>.npz.")],
    threshold: Annotated[
        float | None, typer.Option("--threshold", help="Override the checkpoint's learned threshold.")
    ] = None,
    scales: Annotated[
        str | None,
        typer.Option(
            "--scales",
            help="Read-out scales, e.g. 1,0.5,0.25 (maps averaged); default: those stored with the threshold.",
        ),
    ] = None,
    run: RunOptions = RunOptions(),
) -> None:
    """Detect anomalies (defects) pixel by pixel; one JSON line per image with --json."""
    read_scales = parse_scales(scales) if scales else None
    report = Reporter(run.json_out, run.quiet)
    outcomes = detect_folder(inputs, maps, threshold=threshold, scales=read_scales, **run.folder_run(report))
    if not run.quiet:
        done = [o for o in outcomes if not o.skipped]
        flagged = sum(bool(o.record.get("anomalous")) for o in done if o.ok)
        warn(f"{flagged} of {len(done) - report.failed} images flagged as anomalous")
    report.finish()
