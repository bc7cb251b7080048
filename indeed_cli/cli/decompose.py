"""`indeed decompose`: L, S, N and the leaf posteriors of each image, as PNGs, npz and json."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from ..imageio import ImageError, atomic_save, atomic_write_via, read_image, to_pil
from ..inference import decompose, n_tiles
from ..ood import ood_features, ood_report
from ..visualize import panel, viewable
from .common import (Compile, EXIT_FAILED, Batch, Device, Force, Json, ModelCache, OrderedWriter, Overlap, Precision, Quiet,
                     Recursive, Tile, Weights, skip_done, report_skipped, SkipExisting, require_folder, emit_json, expand_inputs,
                     inference_options, progress_bar, report_failure, stem)

PNG_MAPS = ("L", "S", "N", "mu_omega", "mu_lambda", "sigma_L", "sigma_S")


def outputs_for(out_dir: Path, stem: str, with_panel: bool) -> dict[str, Path]:
    files = {k: out_dir / f"{stem}_{k}.png" for k in PNG_MAPS}
    files["npz"] = out_dir / f"{stem}.npz"
    files["json"] = out_dir / f"{stem}.json"
    if with_panel:
        files["panel"] = out_dir / f"{stem}_panel.png"
    return files


def write_decomposition(src: Path, img, dec, files: dict[str, Path], with_panel: bool, source: str,
                        ood: dict | None = None) -> dict:
    """Write the PNG maps, npz and json of one decomposed image; returns the json record.

    ``ood`` is the checkpoint's OOD statistics (``extra["ood"]``), None when it has none.
    """
    arrays = dec.in_scale(img.scale)
    views = viewable({**dec.maps, "N": arrays["N"] / img.scale})
    for k in PNG_MAPS:
        atomic_save(to_pil(views[k]), files[k])
    # uncompressed: the float maps are noisy, zlib saved ~20% of the size for ~0.8 s per 512x512 image
    atomic_write_via(files["npz"], lambda t: np.savez(t, **arrays))
    record = {"image": str(src), "height": img.size[0], "width": img.size[1], "channels": img.channels,
              "scale": img.scale, **dec.stats(), **ood_report(ood_features(dec), ood), "loss_units": "per pixel (per element of Y)",
              "weights": source, "outputs": {k: str(v) for k, v in files.items()}}
    if with_panel and "panel" in files:
        atomic_save(panel(dec.Y, views, f"{src.name}  rank index n={record['rank_index']:.0f}"), files["panel"])
    atomic_write_via(files["json"], lambda t: Path(t).write_text(json.dumps(record, indent=2)))
    return record


def decompose_cmd(
    inputs: Annotated[list[str], typer.Argument(help="Image files, folders or glob patterns.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output folder.")],
    with_panel: Annotated[bool, typer.Option("--panel", help="Also write <stem>_panel.png, all maps side by side.")] = False,
    weights: Weights = None, device: Device = "auto", tile: Tile = 128, overlap: Overlap = 32,
    batch: Batch = None, precision: Precision = "fp32", json_out: Json = False, force: Force = False,
    quiet: Quiet = False, recursive: Recursive = False, compile_net: Compile = False,
    skip_existing: SkipExisting = False,
) -> None:
    """Decompose images into low-rank L, sparse S and noise N with their posteriors."""
    paths = expand_inputs(inputs, recursive)
    require_folder(output, "--output")
    plans = [outputs_for(output, stem(p), with_panel) for p in paths]
    paths, plans, skipped = skip_done(paths, plans, skip_existing, force)
    report_skipped(skipped, json_out, quiet)
    opts = inference_options(tile, overlap, batch, precision)
    models = ModelCache(weights, device, compile=compile_net)
    failed = 0

    def done(record, error, src) -> None:
        nonlocal failed
        if error:
            failed += 1
            report_failure(src, error, json_out)
        elif json_out:
            emit_json({k: v for k, v in record.items() if k != "rank_index_per_tile"})

    with OrderedWriter() as writer:  # files written while the next image is decomposed
        for src, files in zip(paths, plans):
            try:
                img = read_image(src)
                ckpt = models.get(img.channels)
                with progress_bar(n_tiles(*img.size, opts), src.name, quiet) as bar:
                    dec = decompose(ckpt, img, opts, progress=bar.update)
            except ImageError as e:
                writer.then(lambda src=src, e=e: done(None, e, src))
                continue
            writer.submit(lambda a=(src, img, dec, files, ckpt.source, ckpt.extra.get("ood")):
                          write_decomposition(a[0], a[1], a[2], a[3], with_panel, a[4], a[5]),
                          lambda r, e, src=src: done(r, e, src), sum(v.nbytes for v in dec.maps.values()))
    if failed:
        raise typer.Exit(EXIT_FAILED)
