"""`indeed adapt`: InDeedAG (one adaptation per folder) and InDeedOAG (one per image), then inference."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..adaptation import AdaptConfig, adapt, adapt_images, as_model_channels, default_group
from ..checkpoint import save_checkpoint
from ..imageio import ImageError, read_image, write_image
from ..inference import decompose, denoise
from .common import (EXIT_FAILED, Batch, Device, Force, Json, ModelCache, OrderedWriter, Overlap, Precision, Quiet, Recursive,
                     Tile, Weights, CLIError, check_targets, require_folder, emit_json, expand_inputs, inference_options, report_failure, stem, warn)
from .decompose import outputs_for, write_decomposition


def adapt_cmd(
    inputs: Annotated[list[str], typer.Argument(help="Out-of-distribution images: files, folders or globs.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output folder: <stem>.png and the decomposition files.")],
    mode: Annotated[str, typer.Option("--mode", help="ag: adapt once on all inputs; oag: adapt on each image alone.")] = "ag",
    modules: Annotated[str, typer.Option("--modules", help="Module(s) to fine-tune: S, L or LS.")] = "S",
    steps: Annotated[Optional[int], typer.Option("--steps", min=1, help="Most optimisation steps, early stopping may "
                                                 "end sooner (default 20 for ag, 12 for oag).")] = None,
    lr: Annotated[Optional[float], typer.Option("--lr", help="Adam learning rate (default 1e-5 for ag, 3e-5 for oag).")] = None,
    patience: Annotated[int, typer.Option("--patience", min=1, help="Evaluations without improvement before stopping.")] = AdaptConfig.patience,
    max_change: Annotated[float, typer.Option("--max-change", help="Trust region: stop when L + S has moved this much (RMS, 8-bit units).")] = AdaptConfig.max_change,
    noise_precision: Annotated[str, typer.Option("--noise-precision", help="image: one noise precision per image; pixel: the paper's pixel-wise Lambda.")] = "image",
    save_weights: Annotated[Optional[Path], typer.Option("--save-weights", help="ag: write the adapted checkpoint here.")] = None,
    group: Annotated[Optional[int], typer.Option("--group", min=1, help="oag: images adapted at once, each with its own "
                                                 "weights (default 32 on a GPU, 1 on a CPU).")] = None,
    denoised_only: Annotated[bool, typer.Option("--denoised-only", help="Write only <stem>.png, not the decomposition "
                                                "files (writing those takes longer than OAG on a GPU).")] = False,
    weights: Weights = None, device: Device = "auto", tile: Tile = 128, overlap: Overlap = 32,
    batch: Batch = None, precision: Precision = "fp32", json_out: Json = False, force: Force = False,
    quiet: Quiet = False, recursive: Recursive = False,
) -> None:
    """Active generalization: fine-tune one module on the inputs with l_fid + l_sparse (S), then denoise and decompose."""
    if mode not in ("ag", "oag"):
        raise CLIError(f"--mode must be ag or oag, got {mode!r}")
    if modules not in ("S", "L", "LS"):
        raise CLIError(f"--modules must be S, L or LS, got {modules!r}")
    if save_weights and mode != "ag":
        raise CLIError("--save-weights goes with --mode ag (oag adapts a fresh copy per image)")
    paths = expand_inputs(inputs, recursive)
    require_folder(output, "--output")
    plans = [{"denoised": output / f"{stem(p)}.png", **({} if denoised_only else outputs_for(output, stem(p), False))}
             for p in paths]
    check_targets(paths, [f for plan in plans for f in plan.values()] + ([save_weights] if save_weights else []), force)
    opts = inference_options(tile, overlap, batch, precision)
    models = ModelCache(weights, device)
    cfg = AdaptConfig(modules=modules, steps=steps, lr=lr, patience=patience, max_change=max_change,
                      noise_precision=noise_precision, precision=precision, group=group)
    try:
        cfg.check()
    except ValueError as e:
        raise CLIError(str(e)) from None
    loaded, failed = [], 0
    for p in paths:
        try:
            loaded.append((p, read_image(p)))
        except ImageError as e:
            failed += 1
            report_failure(p, e, json_out)
    if not loaded:
        raise typer.Exit(EXIT_FAILED)
    base = models.get(loaded[0][1].channels)
    shared = None
    if mode == "ag":
        t0 = time.perf_counter()
        shared = adapt(base, [x for _, im in loaded for x in as_model_channels(im.data, base.config.channels)], cfg, tile)
        if not quiet:
            warn(f"adapted module {modules} on {len(loaded)} images in {time.perf_counter() - t0:.1f} s "
                 f"(best step {shared.best_step}, stopped: {shared.stop})")
        if save_weights:
            save_checkpoint(save_weights, shared.checkpoint.model, shared.checkpoint.training, shared.checkpoint.extra)
    chunk = 1 if shared else (group or default_group(models.device))
    plan_of = dict(zip(paths, plans))
    plans_loaded = [plan_of[p] for p, _ in loaded]  # images that failed to read have no place here

    def write(src, img, files, res, out, dec) -> dict:
        """The outputs of one image (on a writer thread); its decomposition json record."""
        write_image(files["denoised"], out, like=img)
        if dec is None:
            return {}
        return write_decomposition(src, img, dec, {k: v for k, v in files.items() if k != "denoised"}, False,
                                   res.checkpoint.source, res.checkpoint.extra.get("ood"))

    def done(record, error, src, files, res, seconds, together) -> None:
        nonlocal failed
        if error:
            failed += 1
            report_failure(src, error, json_out)
        elif json_out:
            emit_json({"image": str(src), "output": str(files["denoised"]), "mode": mode,
                       "modules": modules, "best_step": res.best_step, "stop": res.stop,
                       "loss_start": res.history[0]["loss"], "loss_best": min(h["loss"] for h in res.history),
                       "adapt_seconds": round(seconds, 3) if mode == "oag" else None,
                       "adapted_together": together if mode == "oag" else None,
                       **{k: record[k] for k in ("rank_index", "l_rank", "l_sparse", "l_fid") if k in record}})

    with OrderedWriter() as writer:
        for c in range(0, len(loaded), chunk):
            items = list(zip(loaded[c:c + chunk], plans_loaded[c:c + chunk]))
            t0 = time.perf_counter()
            if shared:
                results, together = [shared], [len(loaded)]
            else:  # oag: each image adapted alone with its own channel count's checkpoint, in batched runs
                results, together = adapt_images([(models.get(img.channels), img.data) for (_, img), _ in items], cfg,
                                                 tile)
            seconds = (time.perf_counter() - t0) / len(items)  # oag: amortised over the images adapted together
            for i, (((src, img), files), res) in enumerate(zip(items, results)):
                if denoised_only:
                    dec, out = None, denoise(res.checkpoint, img, opts)
                    nbytes = out.nbytes
                else:
                    dec = decompose(res.checkpoint, img, opts)
                    out = dec.maps["L"] + dec.maps["S"]
                    nbytes = out.nbytes + sum(v.nbytes for v in dec.maps.values())
                writer.submit(lambda a=(src, img, files, res, out, dec): write(*a),
                              lambda r, e, a=(src, files, res, seconds, together[i]): done(r, e, *a), nbytes)
    if failed:
        raise typer.Exit(EXIT_FAILED)
