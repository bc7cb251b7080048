"""`indeed models`: bundled and cached checkpoints with their metadata."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from ..model import list_checkpoints
from ..tasks.noise_presence import noise_presence_path, noise_texture_path


def models_cmd(
    json_out: Annotated[
        bool, typer.Option("--json", help="One JSON line per checkpoint, with its path and training facts.")
    ] = False,
) -> None:
    """List bundled checkpoints and indeed checkpoints in the Hugging Face cache; NAME is what --weights takes."""
    rows = list_checkpoints()
    if json_out:
        for r in rows:
            typer.echo(json.dumps(r))
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    table.add_column("name (--weights)", no_wrap=True)  # what users type: never cut
    for title in ("task", "ch", "default", "steps", "PSNR s25", "threshold", "MB"):
        table.add_column(title)
    for r in rows:
        t = r.get("training", {})
        val = t.get("validation", {}).get("psnr_s25")
        table.add_row(
            r["name"],
            _task(r),
            str(r.get("channels", "")),
            _default(r.get("default_for", [])),
            str(t.get("total_steps", t.get("steps", ""))),
            f"{val:.2f}" if val else "",
            _threshold(r),
            f"{r['size_mb']:.1f}",
        )
    Console().print(table)
    if noise_presence_path().is_file():  # not a checkpoint --weights takes: a note, not a row
        typer.echo(f"Also bundled: {noise_presence_path()}, the noise-presence detector `indeed adapt` asks", err=True)
    if noise_texture_path().is_file():
        typer.echo(f"Also bundled: {noise_texture_path()}, its second detector (and OAG's blend weights)", err=True)
    typer.echo("Paths and training facts: indeed models --json", err=True)


def _task(row: dict) -> str:
    """The task, with the number of members of a detector that has several (indeed calibrate --member)
    and "+ memory" where it holds a memory of normal features (indeed calibrate --memory)."""
    task = str(row.get("task", row.get("error", "?")))
    task = f"{task} ×{row['members']}" if row.get("members", 1) > 1 else task  # "detect ×2": two members
    return f"{task} + memory" if row.get("memory_entries") else task


def _default(jobs: list[str]) -> str:
    """Which jobs a bundled file is the default of: denoise, decompose, adapt, all (the three), detect."""
    return "all" if {"denoise", "decompose", "adapt"} <= set(jobs) else ", ".join(jobs)


def _threshold(row: dict) -> str:
    """OOD threshold of a denoiser, anomaly threshold of a detector ('' when not calibrated)."""
    for key, label in (("ood_threshold", "ood"), ("detect_threshold", "anomaly")):
        if row.get(key) is not None:
            return f"{label} {row[key]:.3g}"
    return ""
