"""`indeed decompose`: L, S, N and the leaf posteriors of each image, as PNGs, npz and json."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..pipelines import decompose_folder
from ..pipelines.decompose import DECOMPOSE_OVERLAP
from .options import ALL_SHARED, RunOptions, shared_options
from .runner import Reporter


@shared_options(*ALL_SHARED, overlap=DECOMPOSE_OVERLAP)
def decompose_cmd(
    inputs: Annotated[list[str], typer.Argument(metavar="IMAGE", help="Image files, folders or glob patterns.")],
    output: Annotated[Path, typer.Option("--output", "-o", metavar="PATH", help="Output folder.")],
    with_panel: Annotated[
        bool, typer.Option("--panel", help="Also write <stem>_panel.png, all maps side by side.")
    ] = False,
    npz_precision: Annotated[
        str, typer.Option("--npz-precision", metavar="float32|float16", help="Precision of the arrays in <stem>.npz.")
    ] = "float32",
    npz_compress: Annotated[bool, typer.Option("--npz-compress", help="Compress <stem>.npz (zlib; slower).")] = False,
    run: RunOptions = RunOptions(),
) -> None:
    """Decompose images into low-rank L, sparse S and noise N with their posteriors."""
    report = Reporter(run.json_out, run.quiet)
    decompose_folder(inputs, output, with_panel=with_panel, npz_precision=npz_precision, npz_compress=npz_compress,
                     **run.folder_run(report))  # fmt: skip
    report.finish()
