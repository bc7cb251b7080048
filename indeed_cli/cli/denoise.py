"""`indeed denoise`: L + S of each image, same size, mode, alpha and bit depth."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..adaptation import default_group
from ..imageio import ImageError, check_output_format, is_stdio, read_image, write_image
from ..inference import decompose, denoise, n_tiles
from ..ood import ood_features, ood_report
from .common import (Compile, EXIT_FAILED, EXIT_WEIGHTS, Batch, CLIError, Device, Force, Json, ModelCache, Overlap,
                     OrderedWriter, Precision, Quiet, Recursive, Tile, Weights, emit_json, expand_inputs,
                     inference_options, plan_outputs, progress_bar, report_failure, report_skipped, SkipExisting)


def denoise_cmd(
    inputs: Annotated[list[str], typer.Argument(help="Image files, folders or glob patterns; - reads standard input.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output file (one input) or folder; - writes a "
                                         "PNG to standard output.")],
    auto_adapt: Annotated[bool, typer.Option("--auto-adapt", help="Run InDeedOAG (indeed adapt --mode oag) on images "
                                             "the OOD score flags as out of distribution.")] = False,
    ood_threshold: Annotated[Optional[float], typer.Option("--ood-threshold", help="Override the checkpoint's OOD threshold.")] = None,
    weights: Weights = None, device: Device = "auto", tile: Tile = 128, overlap: Overlap = 32,
    batch: Batch = None, precision: Precision = "fp32", json_out: Json = False, force: Force = False,
    quiet: Quiet = False, recursive: Recursive = False, compile_net: Compile = False,
    skip_existing: SkipExisting = False,
) -> None:
    """Denoise images with the InDeed posterior mean L + S (--json adds the OOD score)."""
    if is_stdio(output) and json_out:
        raise CLIError("--json and -o - both need standard output; write the image to a file")
    if is_stdio(output) and sys.stdout.isatty():
        raise CLIError("-o - writes a PNG to standard output, which is a terminal here; redirect or pipe it")
    paths = expand_inputs(inputs, recursive)
    paths, targets, skipped = plan_outputs(paths, output, ".png", force, skip_existing)
    report_skipped(skipped, json_out, quiet)
    opts = inference_options(tile, overlap, batch, precision)
    models = ModelCache(weights, device, compile=compile_net)
    need_stats = json_out or auto_adapt  # the OOD score needs the full decomposition
    failed = 0
    pending: list[dict] = []  # flagged images waiting for one batched OAG (docs/adapt.md)
    writer = OrderedWriter()

    def failure(src: Path, error: ImageError) -> None:
        nonlocal failed
        failed += 1
        report_failure(src, error, json_out)

    def finish(item: dict, out, adapted=None) -> None:
        def done(_, error: ImageError | None) -> None:
            if error:
                failure(item["src"], error)
            elif json_out:
                img = item["img"]
                emit_json({"image": str(item["src"]), "output": str(item["dst"]), "height": img.size[0],
                           "width": img.size[1], "channels": img.channels, "bit_depth": img.bit_depth,
                           "seconds": round(item["seconds"], 3), "weights": item["ckpt"].source, **item["ood"],
                           "adapted": None if adapted is None else {"best_step": adapted.best_step, "stop": adapted.stop}})
        writer.submit(lambda: write_image(item["dst"], out, like=item["img"]), done, out.nbytes)

    def adapt_pending() -> None:
        """OAG on the flagged images, those sharing a checkpoint adapted together."""
        from ..adaptation import AdaptConfig, adapt_images
        if not pending:
            return
        t0 = time.perf_counter()
        results, _ = adapt_images([(it["ckpt"], it["img"].data) for it in pending], AdaptConfig(precision=precision),
                                  tile)
        share = (time.perf_counter() - t0) / len(pending)
        for item, res in zip(pending, results):
            t1 = time.perf_counter()
            out = denoise(res.checkpoint, item["img"], opts)
            item["seconds"] += share + time.perf_counter() - t1
            finish(item, out, res)
        pending.clear()

    with writer:
        for src, dst in zip(paths, targets):
            try:
                img = read_image(src)
                check_output_format(dst, img)
            except ImageError as e:
                writer.then(lambda src=src, e=e: failure(src, e))  # reported in input order
                continue
            ckpt = models.get(img.channels)
            if auto_adapt and not ckpt.extra.get("ood"):
                raise CLIError(f"--auto-adapt needs OOD statistics, and {ckpt.source} has none "
                               "(add them with `indeed calibrate`)", EXIT_WEIGHTS)
            t0 = time.perf_counter()
            ood: dict = {}
            with progress_bar(n_tiles(*img.size, opts), src.name, quiet) as bar:
                if need_stats:
                    dec = decompose(ckpt, img, opts, progress=bar.update)
                    stats = ckpt.extra.get("ood")
                    if stats and ood_threshold is not None:
                        stats = {**stats, "threshold": ood_threshold}
                    ood = ood_report(ood_features(dec), stats)
                    out = dec.maps["L"] + dec.maps["S"]
                else:
                    out = denoise(ckpt, img, opts, progress=bar.update)
            item = {"src": src, "dst": dst, "img": img, "ckpt": ckpt, "ood": ood, "seconds": time.perf_counter() - t0}
            if auto_adapt and ood["ood"]:
                pending.append(item)  # written once adapted, in groups on a GPU
                if len(pending) >= default_group(models.device):
                    adapt_pending()
            else:
                finish(item, out)
        adapt_pending()
    if failed:
        raise typer.Exit(EXIT_FAILED)
