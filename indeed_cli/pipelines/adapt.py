"""Adapt to files and folders, then denoise and decompose them with the adapted weights.

mode "ag" (InDeedAG): one adaptation on all inputs; mode "oag" (InDeedOAG): one per image, in
groups that run as one batched network (:mod:`indeed_cli.tasks.adaptation`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ..inference import InferenceOptions, as_model_channels, decompose, denoise
from ..io import ImageError, read_image, write_image
from ..model import Checkpoint, save_checkpoint
from ..tasks.adaptation import AG_STEPS, AdaptConfig, AdaptResult, adapt, adapt_images, default_group
from .decompose import outputs_for, write_decomposition
from .inputs import UsageError, check_targets, expand_inputs, input_names, require_folder
from .runner import ModelCache, Outcome, Product, Progress, run_ordered

MODES = ("ag", "oag")


def adapt_folder(
    inputs: Sequence[str | Path],
    output: str | Path,
    *,
    mode: str = "ag",
    config: AdaptConfig | None = None,
    save_weights: str | Path | None = None,
    denoised_only: bool = False,
    weights: str | Path | Checkpoint | None = None,
    device: str = "auto",
    options: InferenceOptions | None = None,
    recursive: bool = False,
    force: bool = False,
    on_outcome: Callable[[Outcome], None] | None = None,
    progress: Progress | None = None,
) -> list[Outcome]:
    """Adapt to ``inputs`` and write ``<name>.png`` (the denoised image) and, unless ``denoised_only``,
    the decomposition files of each into the folder ``output``.

    ``save_weights`` (mode "ag"): also write the adapted checkpoint.  ``progress`` hears of the
    shared adaptation before and after it runs.  Images that cannot be read are failed Outcomes,
    reported first.
    """
    if mode not in MODES:
        raise UsageError(f"--mode must be ag or oag, got {mode!r}")
    cfg = config or AdaptConfig()
    try:
        cfg.check()
    except ValueError as e:
        raise UsageError(str(e)) from None
    if cfg.modules not in ("S", "L", "LS"):
        raise UsageError(f"--modules must be S, L or LS, got {cfg.modules!r}")
    if save_weights and mode != "ag":
        raise UsageError("--save-weights goes with --mode ag (oag adapts a fresh copy per image)")
    output = Path(output)
    opts = options or InferenceOptions()
    progress = progress or Progress()
    paths = expand_inputs(inputs, recursive)
    require_folder(output, "--output")
    plans = [
        {"denoised": output / f"{n}.png", **({} if denoised_only else outputs_for(output, n, False))}
        for n in input_names(inputs, paths, recursive)
    ]
    extra = [Path(save_weights)] if save_weights else []
    check_targets(paths, [f for plan in plans for f in plan.values()] + extra, force)
    models = ModelCache(weights, device)

    loaded, failures = [], []
    for p, plan in zip(paths, plans):
        try:
            loaded.append((p, read_image(p), plan))
        except ImageError as e:
            failures.append(Outcome(p, {"image": str(p)}, e))
    progress.start(len(paths))
    steps = _steps(loaded, failures, models, mode, cfg, opts, save_weights, denoised_only, progress)
    return run_ordered(steps, on_outcome)


def _steps(
    loaded: list,
    failures: list[Outcome],
    models: ModelCache,
    mode: str,
    cfg: AdaptConfig,
    opts: InferenceOptions,
    save_weights,
    denoised_only: bool,
    progress: Progress,
) -> Iterator[Product | Outcome]:
    yield from failures
    if not loaded:
        return
    shared = None
    if mode == "ag":
        base = models.get(loaded[0][1].channels)
        t0 = time.perf_counter()
        images = [x for _, img, _ in loaded for x in as_model_channels(img.data, base.config.channels)]
        progress.note(f"adapting module {cfg.modules} on {len(loaded)} images (at most {cfg.steps or AG_STEPS} steps)")
        shared = adapt(base, images, cfg, opts.tile)
        progress.note(
            f"adapted module {cfg.modules} on {len(loaded)} images in {time.perf_counter() - t0:.1f} s "
            f"(best step {shared.best_step}, stopped: {shared.stop})"
        )
        if save_weights:
            ck = shared.checkpoint
            save_checkpoint(save_weights, ck.model, ck.training, ck.extra)
    chunk = 1 if shared else (cfg.group or default_group(models.device))
    for c in range(0, len(loaded), chunk):
        items = loaded[c : c + chunk]
        t0 = time.perf_counter()
        if shared:
            results, together = [shared], [len(loaded)]
        else:  # oag: each image adapted alone with its own channel count's checkpoint, in batched runs
            results, together = adapt_images(
                [(models.get(img.channels), img.data) for _, img, _ in items], cfg, opts.tile
            )
        seconds = (time.perf_counter() - t0) / len(items)  # oag: amortised over the images adapted together
        for (src, img, files), res, n_together in zip(items, results, together):
            yield _product(src, img, files, res, mode, cfg, opts, seconds, n_together, denoised_only)


def _product(
    src: Path,
    img,
    files: dict[str, Path],
    res: AdaptResult,
    mode: str,
    cfg: AdaptConfig,
    opts: InferenceOptions,
    seconds: float,
    together: int,
    denoised_only: bool,
) -> Product:
    if denoised_only:
        dec, out = None, denoise(res.checkpoint, img, opts)
        nbytes = out.nbytes
    else:
        dec = decompose(res.checkpoint, img, opts)
        out = dec.maps["L"] + dec.maps["S"]
        nbytes = out.nbytes + sum(v.nbytes for v in dec.maps.values())
    record = {
        "image": str(src),
        "output": str(files["denoised"]),
        "mode": mode,
        "modules": cfg.modules,
        "best_step": res.best_step,
        "stop": res.stop,
        "loss_start": res.history[0]["loss"],
        "loss_best": min(h["loss"] for h in res.history),
        "adapt_seconds": round(seconds, 3) if mode == "oag" else None,
        "adapted_together": together if mode == "oag" else None,
    }

    def write() -> dict:
        write_image(files["denoised"], out, like=img)
        if dec is None:
            return {}
        rec = write_decomposition(
            src,
            img,
            dec,
            {k: v for k, v in files.items() if k != "denoised"},
            False,
            res.checkpoint.source,
            res.checkpoint.extra.get("ood"),
        )
        return {k: rec[k] for k in ("rank_index", "l_rank", "l_sparse", "l_fid")}

    return Product(src, write, record, nbytes)
