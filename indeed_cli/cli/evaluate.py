"""`indeed evaluate`: PSNR/SSIM of `indeed denoise` on clean images with synthetic AWGN or on
noisy/clean pairs, or AUROC/AP of `indeed detect` against masks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from ..pipelines import evaluate_denoise, evaluate_detect
from .options import INFERENCE, RunOptions, shared_options
from .runner import CLIError, emit_json


@shared_options(*INFERENCE, "json_out")
def evaluate_cmd(
    clean: Annotated[
        list[str],
        typer.Argument(
            metavar="IMAGE",
            help="Clean images (files, folders, globs); with --task detect, images whose masks lie beside them.",
        ),
    ],
    task: Annotated[
        str,
        typer.Option(
            "--task", metavar="denoise|detect", help="denoise, or detect (pixel/image AUROC and AP against masks)."
        ),
    ] = "denoise",
    mask_suffix: Annotated[
        str,
        typer.Option(
            "--mask-suffix", metavar="SUFFIX", help="detect: the mask of X.jpg is X<suffix>; no mask = normal."
        ),
    ] = ".png",
    sigma: Annotated[
        list[float], typer.Option("--sigma", "-s", metavar="SIGMA", help="AWGN sigma in 8-bit units (repeatable).")
    ] = [25.0],
    clipped: Annotated[bool, typer.Option("--clipped8", help="Clip and quantise the noisy input to 8 bits.")] = False,
    noisy: Annotated[
        Path | None, typer.Option("--noisy", metavar="DIR", help="Paired mode: folder of real noisy images.")
    ] = None,
    pair: Annotated[
        str,
        typer.Option(
            "--pair", metavar="NOISY:CLEAN", help="Paired mode: stem substitution noisy:clean, e.g. _real:_mean."
        ),
    ] = "",
    limit: Annotated[int, typer.Option("--limit", metavar="N", help="Use only the first N images (0 = all).")] = 0,
    noise: Annotated[
        str,
        typer.Option(
            "--noise",
            metavar="awgn|camera:LEVEL[+mhc][+jpeg]",
            help="Synthetic noise: AWGN of each --sigma, or a camera pipeline's signal-dependent noise "
            "(LEVEL light, medium or heavy; +mhc: demosaiced across channels (Malvar-He-Cutler), correlated "
            "between channels like real sRGB noise; +jpeg: JPEG quality 90), scored against the noiseless "
            "camera image.",
        ),
    ] = "awgn",
    pixel_shuffle: Annotated[
        str,
        typer.Option(
            "--pixel-shuffle",
            metavar="N|auto",
            help="denoise: score the read-out of `indeed denoise --pixel-shuffle N|auto`.",
        ),
    ] = "1",
    ensemble: Annotated[
        str | None,
        typer.Option(
            "--ensemble",
            metavar="N",
            help="Score the read-out of `indeed denoise|detect --ensemble N` (detect default: the calibrated one).",
        ),
    ] = None,
    run: RunOptions = RunOptions(),
) -> None:
    """Score denoising (PSNR/SSIM) or anomaly detection (AUROC/AP), as a table or JSON lines."""
    opts = run.inference()
    on_row = emit_json if run.json_out else None
    common = {"weights": run.weights, "device": run.device, "options": opts, "on_row": on_row}
    if task == "detect":
        summary = evaluate_detect(clean, mask_suffix=mask_suffix, ensemble=ensemble, **common)
    elif task == "denoise":
        summary = evaluate_denoise(clean, sigmas=sigma, clipped8=clipped, noisy=noisy, pair=pair, limit=limit,
                                   noise=noise, pixel_shuffle=pixel_shuffle, ensemble=ensemble or "1",
                                   **common)  # fmt: skip
    else:
        raise CLIError(f"--task must be denoise or detect, got {task!r}")
    if run.json_out:
        for row in summary:
            emit_json(row)
    elif task == "detect":
        Console().print(detect_table(summary))
    else:
        Console().print(denoise_table(summary, clipped))


def denoise_table(summary: list[dict], clipped: bool) -> Table:
    t = Table(
        "sigma",
        "images",
        "input PSNR",
        "PSNR",
        "SSIM",
        title="indeed evaluate" + (" (clipped 8-bit)" if clipped else ""),
    )
    for s in summary:
        t.add_row(
            "real" if s["sigma"] is None else s["sigma"] if isinstance(s["sigma"], str) else f"{s['sigma']:g}",
            str(s["n"]),
            f"{s['psnr_in']:.2f}",
            f"{s['psnr']:.2f}",
            "n/a (pip install scikit-image)" if s["ssim"] is None else f"{s['ssim']:.4f}",
        )
    return t


def detect_table(summary: list[dict]) -> Table:
    t = Table(
        "group",
        "images",
        "pixel AUROC",
        "pixel AP",
        "image AUROC",
        "flagged anomalous",
        "flagged normal",
        title="indeed evaluate --task detect (flagged: at the checkpoint's threshold)",
    )
    for r in summary:
        counts = [
            f"{r[k][0]} of {r[k][1]}" if r.get(k, [0, 0])[1] else "-" for k in ("flagged_anomalous", "flagged_normal")
        ]
        t.add_row(
            r["group"], str(r["n"]), *(f"{r[k]:.4f}" for k in ("pixel_auroc", "pixel_ap", "image_auroc")), *counts
        )
    return t
