"""`indeed models`: bundled and cached checkpoints with their metadata."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from ..model import list_checkpoints
from .options import Json


def models_cmd(json_out: Json = False) -> None:
    """List bundled checkpoints and indeed checkpoints in the Hugging Face cache."""
    rows = list_checkpoints()
    if json_out:
        for r in rows:
            typer.echo(json.dumps(r))
        return
    table = Table("name", "origin", "task", "channels", "rank", "steps", "val PSNR s25", "threshold", "MB", "path")
    for r in rows:
        t = r.get("training", {})
        val = t.get("validation", {}).get("psnr_s25")
        table.add_row(
            r["name"],
            r["origin"],
            str(r.get("task", r.get("error", "?"))),
            str(r.get("channels", "")),
            str(r.get("rank", "")),
            str(t.get("total_steps", t.get("steps", ""))),
            f"{val:.2f}" if val else "",
            _threshold(r),
            str(r["size_mb"]),
            r["path"],
        )
    Console().print(table)


def _threshold(row: dict) -> str:
    """OOD threshold of a denoiser, anomaly threshold of a detector ('' when not calibrated)."""
    for key, label in (("ood_threshold", "ood"), ("detect_threshold", "anomaly")):
        if row.get(key) is not None:
            return f"{label} {row[key]:.3g}"
    return ""
