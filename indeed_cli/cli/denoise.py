"""`indeed denoise`: L + S of each image, same size, mode, alpha and bit depth."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from ..imageio import ImageError, read_image, write_image
from ..inference import denoise, n_tiles
from .common import (EXIT_FAILED, Batch, Device, Force, Json, ModelCache, Overlap, Precision, Quiet,
                     Recursive, Tile, Weights, emit_json, expand_inputs, inference_options, plan_outputs,
                     progress_bar, report_failure)


def denoise_cmd(
    inputs: Annotated[list[str], typer.Argument(help="Image files, folders or glob patterns.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output file (one input) or folder.")],
    weights: Weights = None, device: Device = "auto", tile: Tile = 128, overlap: Overlap = 32,
    batch: Batch = None, precision: Precision = "fp32", json_out: Json = False, force: Force = False,
    quiet: Quiet = False, recursive: Recursive = False,
) -> None:
    """Denoise images with the InDeed posterior mean L + S."""
    paths = expand_inputs(inputs, recursive)
    targets = plan_outputs(paths, output, ".png", force)
    opts = inference_options(tile, overlap, batch, precision)
    models = ModelCache(weights, device)
    failed = 0
    for src, dst in zip(paths, targets):
        try:
            img = read_image(src)
            ckpt = models.get(img.channels)
            t0 = time.perf_counter()
            with progress_bar(n_tiles(*img.size, opts), src.name, quiet) as bar:
                out = denoise(ckpt, img, opts, progress=bar.update)
            seconds = time.perf_counter() - t0
            write_image(dst, out, like=img)
        except ImageError as e:
            failed += 1
            report_failure(src, e, json_out)
            continue
        if json_out:
            emit_json({"image": str(src), "output": str(dst), "height": img.size[0], "width": img.size[1],
                       "channels": img.channels, "bit_depth": img.bit_depth, "seconds": round(seconds, 3),
                       "weights": ckpt.source})
    if failed:
        raise typer.Exit(EXIT_FAILED)
