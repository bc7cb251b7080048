"""`indeed denoise`: L + S of each image, same size, mode, alpha and bit depth."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ..io import is_stdio
from ..pipelines import denoise_folder
from .options import ALL_SHARED, RunOptions, shared_options
from .runner import CLIError, Reporter


@shared_options(*ALL_SHARED)
def denoise_cmd(
    inputs: Annotated[list[str], typer.Argument(help="Image files, folders or glob patterns; - reads standard input.")],
    output: Annotated[
        Path,
        typer.Option("--output", "-o", help="Output file (one input) or folder; - writes a PNG to standard output."),
    ],
    auto_adapt: Annotated[
        bool,
        typer.Option(
            "--auto-adapt",
            help="Run InDeedOAG (indeed adapt --mode oag) on images the OOD score flags as out of distribution.",
        ),
    ] = False,
    ood_threshold: Annotated[
        float | None, typer.Option("--ood-threshold", help="Override the checkpoint's OOD threshold.")
    ] = None,
    run: RunOptions = RunOptions(),
) -> None:
    """Denoise images with the InDeed posterior mean L + S (--json adds the OOD score)."""
    if is_stdio(output) and run.json_out:
        raise CLIError("--json and -o - both need standard output; write the image to a file")
    if is_stdio(output) and sys.stdout.isatty():
        raise CLIError("-o - writes a PNG to standard output, which is a terminal here; redirect or pipe it")
    report = Reporter(run.json_out, run.quiet)
    denoise_folder(
        inputs, output, ood=run.json_out, auto_adapt=auto_adapt, ood_threshold=ood_threshold, **run.folder_run(report)
    )
    report.finish()
