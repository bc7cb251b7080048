"""Adapt to files and folders, then denoise and decompose them with the adapted weights.

mode "ag" (InDeedAG): one adaptation on all inputs; mode "oag" (InDeedOAG): one per image, in
groups that run as one batched network (:mod:`indeed_cli.tasks.adaptation`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch.distributed as tdist

from ..inference import InferenceOptions, as_model_channels, decompose, denoise_with_stats
from ..io import OUTPUT_SUFFIXES, ImageError, atomic_save, write_image
from ..model import Checkpoint, save_checkpoint
from ..tasks.adaptation import (
    AG_STEPS,
    AdaptConfig,
    AdaptResult,
    ImageChoice,
    adapt,
    adapt_images,
    ag_image_result,
    default_group,
    oag_decomposition,
    oag_output,
    oag_readout,
)
from ..tasks.adaptation.config import AG_DEFAULTS, with_defaults
from .decompose import outputs_for, write_decomposition
from .denoise import change_rms
from .inputs import UsageError, check_targets, expand_inputs, input_names, require_folder, take_shard
from .runner import ModelCache, Outcome, Product, Progress, read_ahead, run_ordered, writer_threads
from .visualize import elbo_plane

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
    shard: tuple[int, int] | None = None,
    report: str | Path | None = None,
) -> list[Outcome]:
    """Adapt to ``inputs`` and write ``<name>.png`` (the denoised image) and, unless ``denoised_only``,
    the decomposition files of each into the folder ``output``.

    ``save_weights`` (mode "ag"): also write the adapted checkpoint.  ``progress`` hears of the
    shared adaptation before and after it runs.  Images that cannot be read are failed Outcomes,
    reported first.  ``shard`` (K, N): write the outputs of every N-th input from the K-th; mode
    "oag" adapts only those, mode "ag" still adapts on all inputs: under torchrun (a process group
    of N ranks) each rank computes its part of every batch and the gradients are averaged, as in
    training; otherwise each shard runs the whole adaptation, so that all shards write exactly
    what one run would.  ``report``: a PNG of every image's (l_rank, l_sparse) before and after
    adaptation over the training images' (the paper's Fig. 7; :func:`.visualize.elbo_plane`).
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
    if report and Path(report).suffix.lower() not in OUTPUT_SUFFIXES:  # else Pillow wrote a PNG under any name
        raise UsageError(f"--report {report}: the plot is an image; name it .png (or {', '.join(OUTPUT_SUFFIXES[1:])})")
    if save_weights and mode != "ag":
        raise UsageError("--save-weights goes with --mode ag (oag adapts a fresh copy per image)")
    output = Path(output)
    opts = options or InferenceOptions()
    progress = progress or Progress()
    every = expand_inputs(inputs, recursive)
    require_folder(output, "--output")
    plans = [
        {"denoised": output / f"{n}.png", **({} if denoised_only else outputs_for(output, n, False))}
        for n in input_names(inputs, every, recursive)
    ]
    first = shard is None or shard[0] == 0  # the shard that writes --save-weights
    extra = [Path(save_weights)] if save_weights else []
    check_targets([], [f for plan in plans for f in plan.values()] + extra, force=True)  # no two inputs clash
    mine, _ = take_shard(list(range(len(every))), shard)
    extra_mine = (extra if first else []) + ([Path(report)] if report else [])
    check_targets(every, [f for i in mine for f in plans[i].values()] + extra_mine, force)
    models = ModelCache(weights, device, job="adapt")

    readable, failures = {}, []
    order = list(range(len(every))) if mode == "ag" else mine  # ag adapts on every input, oag on its shard's
    # every image is read before the first adaptation, on the writer threads' share of the cores: one
    # by one, 96 PNGs of 512 x 512 took 1.2 s of OAG's 16 s on an NVIDIA H200 host
    # (docs/reports/2026-12-07-oag-cli-time.md)
    for i, (_, img) in zip(order, read_ahead([every[i] for i in order], len(order), writer_threads())):
        if not isinstance(img, ImageError):
            readable[i] = img
        elif i in mine:
            failures.append(Outcome(every[i], {"image": str(every[i])}, img))
    pool = [readable[i] for i in sorted(readable)]
    todo = [(every[i], readable[i], plans[i]) for i in mine if i in readable]
    progress.start(len(mine))
    steps = _steps(pool, todo, failures, models, mode, cfg, opts, save_weights if first else None, denoised_only,
                   progress)  # fmt: skip
    outcomes = run_ordered(steps, on_outcome, shard=shard, inputs=every)
    if report:
        _write_report(Path(report), todo, outcomes, models, opts, mode)
    return outcomes


def _write_report(path: Path, todo: list, outcomes: list[Outcome], models: ModelCache, opts, mode: str) -> None:
    """Fig. 7: each written image's ELBO terms with the starting weights and after adaptation."""
    done = {o.source: o.record for o in outcomes if o.ok}
    points, ood = [], None
    for src, img, _ in todo:
        if src not in done:
            continue
        base = models.get(img.channels)
        ood = ood or base.extra.get("ood")
        _, tiles = denoise_with_stats(base, img, opts)
        before = (float(tiles["l_rank"].mean()), float(tiles["l_sparse"].mean()))
        after = (done[src]["l_rank"], done[src]["l_sparse"])
        points.append((src.name, before, after))
    title = f"indeed adapt --mode {mode}: {len(points)} images in the plane of the paper's Fig. 7"
    atomic_save(elbo_plane(points, ood, title), path)


def _steps(
    pool: list,
    todo: list,
    failures: list[Outcome],
    models: ModelCache,
    mode: str,
    cfg: AdaptConfig,
    opts: InferenceOptions,
    save_weights,
    denoised_only: bool,
    progress: Progress,
) -> Iterator[Product | Outcome]:
    """``pool``: the images AG adapts on; ``todo``: (source, image, files) of the images to write."""
    yield from failures
    if not todo and mode == "oag":
        return
    shared = None
    if mode == "ag" and pool:
        base = models.get(pool[0].channels)
        t0 = time.perf_counter()
        planes = [as_model_channels(img.data, base.config.channels) for img in pool]
        steps = cfg.steps or AG_STEPS
        progress.note(f"adapting module {cfg.modules} on {len(pool)} images (at most {steps} steps)")
        with process_group_for(models.device):
            shared = adapt(base, [x for p in planes for x in p], cfg, opts.tile)
        # per input: the adapted weights if any of its planes was adapted on (decide="ood", the gate of
        # the recorrupted objective), its score, and whether the fallback (objective auto) adapted on it
        ends = np.cumsum([len(p) for p in planes])
        flags, scores = shared.adapted_images, shared.ood_scores
        fallback = shared.fallback.adapted_images if shared.fallback else [False] * len(flags)
        noise = shared.noise_scores or [None] * len(flags)  # --noise-check: each plane's noise-presence score
        decided = {
            id(img): (any(flags[e - len(p) : e]), _max_score(scores[e - len(p) : e]), any(fallback[e - len(p) : e]),
                      _max_score(noise[e - len(p) : e]))
            for img, p, e in zip(pool, planes, ends)
        }  # fmt: skip
        used = sum(a for a, _, _, _ in decided.values())
        progress.note(
            f"adapted module {cfg.modules} on {used} of {len(pool)} images in {time.perf_counter() - t0:.1f} s "
            f"(best step {shared.best_step}, stopped: {shared.stop})"
            + (
                f"; the recorrupted objective on {sum(f for _, _, f, _ in decided.values())} (best step "
                f"{shared.fallback.best_step}) for images that keep the plain output"
                if shared.fallback
                else ""
            )
        )
        if save_weights:
            ck = shared.checkpoint
            save_checkpoint(save_weights, ck.model, ck.training, ck.extra)
    chunk = 1 if shared else (cfg.group or default_group(models.device))
    rules = with_defaults(cfg, AG_DEFAULTS)  # ag: the per-image choice's bounds
    readout = opts if shared else oag_readout(opts, models.device)
    for c in range(0, len(todo), chunk):
        items = todo[c : c + chunk]
        t0 = time.perf_counter()
        choice = None
        if shared:
            img = items[0][1]
            adapted, score, fallback_used, noise_score = decided[id(img)]
            base = models.get(img.channels)
            # per image: the ELBO's adapted output or the plain one (the recorrupted objective's
            # output is kept where its gate admitted the image, as in OAG), or the fallback's
            res, choice = ag_image_result(
                base, shared, img, adapted, score, rules.min_change_ratio, rules.image_noise_bound, opts, fallback_used,
                noise_score,
            )  # fmt: skip
            results, together = [res], [used if res.best_step > 0 else 1]
        else:  # oag: each image adapted alone with its own channel count's checkpoint, in batched runs
            results, together = adapt_images(
                [(models.get(img.channels), img.data) for _, img, _ in items], cfg, opts.tile
            )
        seconds = (time.perf_counter() - t0) / len(items)  # oag: amortised over the images adapted together
        for (src, img, files), res, n_together in zip(items, results, together):
            base = models.get(img.channels) if mode == "oag" else None  # Eq. (noise-map blend)'s plain read-out
            yield _product(
                src, img, files, res, mode, cfg, readout, seconds, n_together, denoised_only, choice, base
            )  # fmt: skip


def _max_score(scores: Sequence[float | None]) -> float | None:
    """An input's OOD score: the largest of its planes' (None when not computed)."""
    known = [x for x in scores if x is not None]
    return round(max(known), 4) if known else None


@contextmanager
def process_group_for(device):
    """Under torchrun (WORLD_SIZE > 1), a torch.distributed process group for the duration of a
    shared adaptation, so that its ranks average their gradients; nothing otherwise."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or tdist.is_initialized():
        yield
        return
    tdist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        yield
    finally:
        tdist.destroy_process_group()


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
    choice: ImageChoice | None = None,
    base: Checkpoint | None = None,
) -> Product:
    """``choice``: AG's per-image choice, whose output is ``res``'s (None: not made); ``base``: OAG's starting
    checkpoint, whose read-out the recorrupted objective's is blended with (Eq. noise-map blend)."""
    weights = None
    if choice is not None and denoised_only:
        dec, out, tiles = None, choice.output, choice.stats
        nbytes = out.nbytes
    elif denoised_only:
        dec = None
        if base is not None:
            out, tiles, weights = oag_output(base, res, img, opts)
        else:
            out, tiles = denoise_with_stats(res.checkpoint, img, opts)
        nbytes = out.nbytes
    else:
        if base is not None:
            dec, weights = oag_decomposition(base, res, img, opts)
        else:
            dec = decompose(res.checkpoint, img, opts)
        out, tiles = dec.maps["L"] + dec.maps["S"], dec.tiles
        nbytes = out.nbytes + sum(v.nbytes for v in dec.maps.values())
    ran = bool(res.history)  # False: --decide ood left the image alone (no evaluation to report)
    adaptation = (res.checkpoint.training.get("adapted") or {}) if ran else {}  # how the weights were adapted
    record = {
        "image": str(src),
        "output": str(files["denoised"]),
        "mode": mode,
        "modules": cfg.modules,
        "channels": img.channels,
        "adapted": res.best_step > 0,  # weights other than the starting ones were kept
        # whose objective those weights minimised: "elbo" (the paper's) or "recorrupted"
        "objective": res.objective if res.best_step > 0 else None,
        # ag: Eq. (AG image choice), the adapted output's change over the plain model's removal; the
        # adapted output is kept where it is at least --min-change-ratio
        "change_ratio": None if choice is None or choice.ratio != choice.ratio else round(choice.ratio, 3),
        # ag: the adapted output's removal over the image's noise level; kept where at most --image-noise-bound
        "removed_over_noise": None if choice is None or choice.removed != choice.removed else round(choice.removed, 3),
        "ood_score": _max_score(res.ood_scores or []),
        # Eq. (noise presence): the detector's score (above 0: noise found; "stop": "no noise found" where it
        # found none and the image kept the plain result); None where it was not asked or for gray images
        "noise_score": _max_score(res.noise_scores or []),
        # Eq. (noise-map blend): the mean weight of the recorrupted objective's output against the plain one
        # (1: all of it); None where the output was not blended (ELBO, not adapted, gray, AG)
        "blend_weight": None if weights is None else round(float(weights.mean()), 3),
        "best_step": res.best_step,
        "stop": res.stop,
        # OAG: the ELBO's first change over its starting residual, which --first-change-ratio is compared with
        "first_change_ratio": (
            round(res.first_change_ratio, 3) if mode == "oag" and res.first_change_ratio is not None else None
        ),
        "loss_start": res.history[0]["loss"] if ran else None,
        "loss_best": min(h["loss"] for h in res.history) if ran else None,
        # the objective of the weights kept: AG keeps the latest no worse than the start, not the lowest
        "loss_kept": next(h["loss"] for h in res.history if h["step"] == res.best_step) if ran else None,
        # where a bound stopped OAG between two evaluations: the share of the way from the last one inside
        # to the one beyond at which the kept weights lie (Eq. stop at the bound); None: they are an evaluation's
        "stop_share": adaptation.get("stop_share"),
        # the noise level estimated from the image(s) that bounded the removed N (OAG's discrepancy rule)
        "noise_sigma": adaptation.get("noise_sigma"),
        "adapt_seconds": round(seconds, 3) if mode == "oag" else None,
        "adapted_together": together if mode == "oag" else None,
        # the adapted image's place in the plane of the paper's Fig. 7 (--report)
        "l_rank": float(tiles["l_rank"].mean()),
        "l_sparse": float(tiles["l_sparse"].mean()),
        # RMS of output - input in 8-bit grey levels (as `indeed denoise` reports it): under 1 where the
        # image kept the plain result and the model reads its noise as signal (gray camera noise, say)
        "change_rms": change_rms(img.data, out),
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
