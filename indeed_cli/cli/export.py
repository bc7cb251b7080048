"""`indeed export`: a checkpoint's tile network as an ONNX file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..pipelines import export_onnx
from .options import Force, Json, Weights
from .runner import emit_json


def export_cmd(
    onnx: Annotated[Path, typer.Option("--onnx", metavar="FILE.onnx", help="Where to write the ONNX model.")],
    weights: Weights = None,
    task: Annotated[
        str, typer.Option("--task", metavar="denoise|detect", help="Without --weights: the bundled model of this task.")
    ] = "denoise",
    channels: Annotated[
        int,
        typer.Option("--channels", metavar="1|3", help="Without --weights: the bundled gray (1) or colour (3) model."),
    ] = 3,
    tile: Annotated[int, typer.Option("--tile", metavar="PIXELS", help="Tile size the graph takes.")] = 128,
    opset: Annotated[int, typer.Option("--opset", metavar="N", help="ONNX opset.")] = 17,
    json_out: Json = False,
    force: Force = False,
) -> None:
    """Export the tile network of a denoise or detect checkpoint to ONNX (needs the onnx extra)."""
    facts = export_onnx(weights, onnx, task=task, channels=channels, tile=tile, opset=opset, force=force)
    if json_out:
        emit_json({"onnx": str(onnx), **facts})
    else:
        typer.echo(
            f"indeed: wrote {onnx} ({facts['bytes'] / 1e6:.1f} MB; {facts['indeed.task']}, tile {tile}; "
            f"largest difference to PyTorch {facts['max_difference']:.1e})",
            err=True,
        )
